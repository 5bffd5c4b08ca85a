/* wallet: the prepaid ledger of a tenant — reservations, settlements, releases and the
 * ledger check — as writes of the store's writer thread.
 *
 * The data (store migration 13): a tenant's wallet row (balance_micros, held_micros), its
 * immutable ledger entries, one hold per request, one top-up row per payment event. Every
 * figure is in micro-units of the currency. The meaning of the figures:
 *   balance = the sum of the entries' amount_micros: top-ups and adjustments in, settled
 *             costs out (a settlement may take the balance below zero by what the request
 *             cost beyond its estimate);
 *   held    = the sum of the entries' hold_micros: a reserve entry holds the request's
 *             estimate, its settle or release entry gives the same amount back;
 *   available = balance - held: what a new reservation may take.
 * The triggers of migration 13 make these sums hold by construction (a wallet row changes
 * only with an entry, in the same statement); mg_wallet_check() verifies them from the rows.
 *
 * The request path (loop thread): mg_wallet_reserve() before the upstream, then exactly one
 * of mg_wallet_settle(), mg_wallet_release() or mg_wallet_metering_failed(). Each is one
 * statement in the writer's transaction (group commit), so the loop never waits on the disk:
 * the callback comes later, on the loop thread (store.h). A reservation succeeds only when
 * the wallet's available amount covers the estimate (and is at least one micro-unit: a
 * wallet at zero admits nothing); ending a hold is conditional on its state, so a second
 * settlement or release of the same request changes nothing (and the ledger's unique index
 * on a request's end refuses it even if tried another way).
 *
 * A hold in state metering_failed (the upstream gave no usage and the tenant requires it)
 * stays held until an administrator releases it with a reason (admin/billing.c): the
 * release entry then carries the reason and the actor, and the hold becomes
 * released_unmetered. Holds a killed process left `held` are marked metering_failed at the
 * next start (mg_wallet_recover): whether their upstream ran is unknown, so they are not
 * guessed at either way. */
#ifndef MG_WALLET_H
#define MG_WALLET_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "store/pg.h"
#include "store/store.h"

/* The outcome of a reservation: rc 0 and granted 1 (held), rc 0 and granted 0 (the wallet
 * does not cover it: answer 402), or rc < 0 (the store failed; nothing is held):
 * MG_STORE_EFULL when the disk is full (the reservation never waits for the disk). */
typedef void (*mg_wallet_reserved_fn)(void *ud, int rc, int granted);

/* Reserve `micros` (>= 0) of tenant's wallet for request_id, at now_ms (unix ms). cb is
 * called once (later, on the loop thread). Returns 0, or -1 when the write could not be
 * queued, MG_STORE_EFULL when the disk is full (cb is never called either way). */
int mg_wallet_reserve(mg_store_t *st, int64_t tenant_id, const char *request_id, int64_t micros,
                      uint64_t now_ms, mg_wallet_reserved_fn cb, void *ud);

/* End request_id's hold: settled with the actual cost (charged_micros >= 0), released (the
 * request cost nothing: it failed before any work), or left held as metering_failed. Each
 * changes a hold in state `held` only. done (may be NULL) gets the write's outcome and
 * whether it changed a hold (rows 1) or found none held (rows 0). 0, or -1 (not queued,
 * done is never called). */
int mg_wallet_settle(mg_store_t *st, const char *request_id, int64_t charged_micros,
                     uint64_t now_ms, mg_store_rows_fn done, void *ud);
int mg_wallet_release(mg_store_t *st, const char *request_id, uint64_t now_ms,
                      mg_store_rows_fn done, void *ud);
int mg_wallet_metering_failed(mg_store_t *st, const char *request_id, uint64_t now_ms,
                              mg_store_rows_fn done, void *ud);

/* At start-up, before requests: holds still `held` belong to requests of a process that
 * ended without settling them; they become metering_failed (failure "process ended"), to be
 * released by an administrator. Queued for the writer (fire and forget); 0 or -1. */
int mg_wallet_recover(mg_store_t *st, uint64_t now_ms);

/* Verify the whole ledger from the rows (blocking: the CLI, tests, workers): every wallet's
 * balance and held equal the sums of its entries, every entry's tenant has a wallet, every
 * request has at most one reserve and at most one settle-or-release that gives back exactly
 * what was reserved, every hold's state agrees with its entries, every top-up has its one
 * entry. Each problem found is printed to out (may be NULL), one line each. Returns the
 * number of problems (0: the ledger is consistent), or -1 with err set when the store could
 * not be read. *wallets and *entries (may be NULL) get the rows checked. */
long mg_wallet_check(mg_store_t *st, FILE *out, long *wallets, long *entries, char *err,
                     size_t errlen);
/* The same rules over the cluster's books in PostgreSQL (cluster.postgres: the wallets live
 * there), through blocking queries of their own (the CLI's). */
long mg_wallet_check_pg(mg_pg_t *pg, FILE *out, long *wallets, long *entries, char *err,
                        size_t errlen);

#endif
