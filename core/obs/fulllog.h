/* fulllog: the edge PRD's `full` logging mode (3.9.2): for a limited time the request log
 * also carries each request's prompt and answer, secrets masked (base/redact.h). Off by
 * default (`metadata_only`: a prompt_hash, never the text).
 *
 * Switched on by the admin API (POST /api/v2/logging/full, admin/front.c) for at most
 * MG_FULLLOG_MAX_S seconds; it ends by itself on a uv timer on the loop, or earlier by
 * DELETE. The state lives in memory only: a restart always comes back in metadata_only.
 * Loop thread only. */
#ifndef MG_FULLLOG_H
#define MG_FULLLOG_H

#include <stdint.h>
#include <uv.h>
#include <cjson/cJSON.h>

#define MG_FULLLOG_MAX_S 3600            /* the longest window one call may open */
#define MG_FULLLOG_FIELD_MAX (64 * 1024) /* bytes of a prompt or an answer logged; past: cut */

typedef struct mg_fulllog_s {
    uv_loop_t *loop;
    uv_timer_t timer;
    int on;
    uint64_t until_ms;       /* loop time (uv_now) it ends at */
    int64_t started_unix_ms; /* wall clock, for GET and the dashboard */
    int64_t until_unix_ms;
    char reason[160];
    char actor[48];
    uint64_t windows_total; /* windows opened since start-up */
    void (*on_expired)(void *ud,
                       const struct mg_fulllog_s *f); /* the window ended by itself (audit) */
    void *on_expired_ud;
} mg_fulllog_t;

/* 0, or -1 when the timer cannot be made. */
int mg_fulllog_init(mg_fulllog_t *f, uv_loop_t *loop);
/* Close the timer (before the loop ends). */
void mg_fulllog_close(mg_fulllog_t *f);

/* Open (or replace) a window of seconds (1..MG_FULLLOG_MAX_S) for reason, by actor: 0, or
 * -1 when seconds is out of range. Logs "full logging on" at warn level. */
int mg_fulllog_enable(mg_fulllog_t *f, int seconds, const char *reason, const char *actor);
/* Close the window now (why: "disabled", "expired"); nothing when it is off. Logs
 * "full logging off". */
void mg_fulllog_disable(mg_fulllog_t *f, const char *why);
/* 1 while a window is open (NULL: 0). The deadline is checked too, so a late timer never
 * lets a request past it be logged in full. */
int mg_fulllog_on(const mg_fulllog_t *f);
/* {mode: "full"|"metadata_only", until_ms?, remaining_seconds?, reason?, actor?,
 *  started_ms?, max_duration_seconds}: a new tree (the caller owns it). */
cJSON *mg_fulllog_view(const mg_fulllog_t *f);

#endif
