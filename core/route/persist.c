/* persist: provider cooldowns, health and open breakers, stored and restored; see persist.h. */
#include "route/persist.h"

#include <stdio.h>
#include <stdlib.h>
#include "base/clock.h"
#include "base/crypto.h"
#include "base/log.h"

void mg_persist_cooldown(mg_store_t *st, const mg_provider_state_t *ps, int consecutive,
                         double seconds, int status, uint64_t now_ms)
{
    uint64_t until = mg_cooldown_until_unix_ms(&ps->cooldown, now_ms, mg_unix_ms());
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_WARN, "cooldown");
    mg_log_str(&l, "provider", ps->id);
    mg_log_int(&l, "status", status);
    mg_log_int(&l, "consecutive", consecutive);
    mg_log_double(&l, "seconds", seconds);
    mg_log_end(&l);
    if (!st) return;
    char id[40], n[16], secs[32], until_s[32], summary[64];
    mg_request_id(id);
    snprintf(n, sizeof(n), "%d", consecutive);
    snprintf(secs, sizeof(secs), "%d", (int)(seconds + 0.5));
    snprintf(until_s, sizeof(until_s), "%llu", (unsigned long long)until);
    snprintf(summary, sizeof(summary), "HTTP %d", status);
    const char *ev[5] = {id, ps->id, n, secs, summary};
    mg_store_write(
        st,
        "INSERT INTO cooldown_events(id, provider_id, consecutive_count, cooldown_seconds,"
        " response_summary) VALUES (?1, ?2, ?3, ?4, ?5)",
        5, ev);
    const char *row[3] = {ps->id, until_s, n};
    mg_store_write(st,
                   "INSERT INTO provider_state(provider_id, cooldown_until_ms, consecutive_429)"
                   " VALUES (?1, ?2, ?3) ON CONFLICT(provider_id) DO UPDATE SET"
                   " cooldown_until_ms = excluded.cooldown_until_ms,"
                   " consecutive_429 = excluded.consecutive_429, updated_at = datetime('now')",
                   3, row);
}

void mg_persist_cooldown_cleared(mg_store_t *st, const mg_provider_state_t *ps)
{
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "cooldown cleared");
    mg_log_str(&l, "provider", ps->id);
    mg_log_end(&l);
    if (!st) return;
    const char *row[1] = {ps->id};
    mg_store_write(st,
                   "INSERT INTO provider_state(provider_id, cooldown_until_ms, consecutive_429)"
                   " VALUES (?1, 0, 0) ON CONFLICT(provider_id) DO UPDATE SET"
                   " cooldown_until_ms = 0, consecutive_429 = 0, observing = 0,"
                   " updated_at = datetime('now')",
                   1, row);
}

void mg_persist_health(mg_store_t *st, const mg_provider_state_t *ps)
{
    const char *state = mg_health_state_name(ps->health.state);
    mg_logline_t l;
    mg_log_begin(&l, ps->health.state == MG_HEALTH_HEALTHY ? MG_LOG_INFO : MG_LOG_WARN, "health");
    mg_log_str(&l, "provider", ps->id);
    mg_log_str(&l, "state", state);
    mg_log_int(&l, "consecutive_failures", ps->health.consecutive_failures);
    mg_log_end(&l);
    if (!st) return;
    char fails[16];
    snprintf(fails, sizeof(fails), "%d", ps->health.consecutive_failures);
    const char *p[3] = {ps->id, state, fails};
    mg_store_write(st,
                   "INSERT INTO provider_health(provider_id, state, consecutive_failures)"
                   " VALUES (?1, ?2, ?3) ON CONFLICT(provider_id) DO UPDATE SET"
                   " state = excluded.state, consecutive_failures = excluded.consecutive_failures,"
                   " last_check_at = datetime('now')",
                   3, p);
}

void mg_persist_breaker(mg_store_t *st, const char *provider, const char *model,
                        const mg_breaker_t *b, mg_breaker_state_t was, uint64_t was_until,
                        uint64_t now_ms)
{
    if (!st) return;
    if (b->state == MG_BREAKER_OPEN && (was != MG_BREAKER_OPEN || b->open_until_ms != was_until)) {
        uint64_t left = b->open_until_ms > now_ms ? b->open_until_ms - now_ms : 0;
        char until[32];
        snprintf(until, sizeof(until), "%llu", (unsigned long long)(mg_unix_ms() + left));
        const char *row[3] = {provider, model, until};
        mg_store_write(st,
                       "INSERT INTO breaker_state(provider_id, model, open_until_ms)"
                       " VALUES (?1, ?2, ?3) ON CONFLICT(provider_id, model) DO UPDATE SET"
                       " open_until_ms = excluded.open_until_ms, updated_at = datetime('now')",
                       3, row);
    } else if (b->state == MG_BREAKER_CLOSED && was != MG_BREAKER_CLOSED) {
        const char *key[2] = {provider, model};
        mg_store_write(st, "DELETE FROM breaker_state WHERE provider_id = ?1 AND model = ?2", 2,
                       key);
    }
}

typedef struct {
    mg_pool_t *pool;
    uint64_t now_ms, unix_ms;
} restore_t;

static void restore_row(void *ud, int ncols, const char *const *cols)
{
    restore_t *r = ud;
    if (ncols < 4 || !cols[0]) return;
    mg_provider_state_t *ps = mg_pool_get(r->pool, cols[0]);
    if (!ps) return;
    mg_pool_changed(ps);
    if (cols[1] || cols[2]) { /* a provider_state row */
        uint64_t until = cols[1] ? strtoull(cols[1], NULL, 10) : 0;
        mg_cooldown_restore(&ps->cooldown, r->now_ms, r->unix_ms, until,
                            cols[2] ? atoi(cols[2]) : 0, 0);
    }
    int state = cols[3] ? mg_health_state_from_name(cols[3]) : -1;
    if (state >= 0) mg_health_restore(&ps->health, (mg_health_state_t)state, r->now_ms);
}

/* One breaker_state row: the breaker stays open for what was left of its period (an ended
 * period: half open, its next request a probe). */
static void restore_breaker_row(void *ud, int ncols, const char *const *cols)
{
    restore_t *r = ud;
    if (ncols < 3 || !cols[0] || !cols[1] || !cols[2]) return;
    mg_provider_state_t *ps = mg_pool_get(r->pool, cols[0]);
    mg_route_state_t *rs = cols[1][0] ? mg_pool_route(r->pool, cols[0], cols[1]) : NULL;
    if (!ps || (cols[1][0] && !rs)) return; /* gone from the config meanwhile */
    uint64_t until = strtoull(cols[2], NULL, 10);
    uint64_t left = until > r->unix_ms ? until - r->unix_ms : 0;
    mg_breaker_restore_open(rs ? &rs->breaker : &ps->breaker, r->now_ms, left);
    if (rs) rs->version++;
    mg_pool_changed(ps);
}

void mg_persist_restore(mg_store_t *st, mg_pool_t *pool, uint64_t now_ms)
{
    if (!st) return;
    char err[256];
    restore_t r = {pool, now_ms, mg_unix_ms()};
    if (mg_store_query(st,
                       /* every provider with either row: a health row alone counts too */
                       "SELECT i.id, s.cooldown_until_ms, s.consecutive_429, h.state FROM"
                       " (SELECT provider_id AS id FROM provider_state"
                       "  UNION SELECT provider_id FROM provider_health) i"
                       " LEFT JOIN provider_state s ON s.provider_id = i.id"
                       " LEFT JOIN provider_health h ON h.provider_id = i.id",
                       0, NULL, restore_row, &r, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "cannot restore provider state: %s", err);
    if (mg_store_query(st, "SELECT provider_id, model, open_until_ms FROM breaker_state", 0, NULL,
                       restore_breaker_row, &r, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "cannot restore circuit breakers: %s", err);
}
