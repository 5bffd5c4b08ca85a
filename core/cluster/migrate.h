/* migrate: `moongate migrate-store --from sqlite:PATH --to postgres:URL [--force]`, which moves
 * a single node's installation into a cluster's PostgreSQL.
 *
 * In one PostgreSQL transaction holding the control log's lock (admin/control.h): the
 * store's control plane (every row of every control table) is appended to control_log, so an
 * instance started on an empty SQLite with that PostgreSQL catches up and serves it; its
 * usage events are copied into usage_events (ON CONFLICT DO NOTHING: a rerun adds nothing;
 * the hourly buckets follow from the table's trigger); the prepaid wallets of tenants that
 * have none in PostgreSQL yet are copied with their entries, holds and top-ups (a rerun finds
 * them and copies nothing; the balances stay the sums of their entries). A control_log that
 * already has entries is refused (another installation is there) unless force: then the
 * rows are appended on top and win (upserts by primary key). The source store is migrated
 * to this build's schema first (as the gateway would at start). Without force, the source's
 * control_state is set to the last id appended: the same store may then run as a cluster
 * member without applying its own rows again. */
#ifndef MG_CLUSTER_MIGRATE_H
#define MG_CLUSTER_MIGRATE_H

/* argv after "migrate-store"; the exit status (0 done, 1 failed or refused, 2 usage). */
int mg_migrate_store_main(int argc, char **argv);

#endif
