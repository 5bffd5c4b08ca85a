/* fulllog: the time-limited full logging window (see fulllog.h). */
#include "obs/fulllog.h"

#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"

static void on_expired(uv_timer_t *t)
{
    mg_fulllog_t *f = t->data;
    if (!f->on) return;
    mg_fulllog_disable(f, "expired");
    if (f->on_expired) f->on_expired(f->on_expired_ud, f);
}

int mg_fulllog_init(mg_fulllog_t *f, uv_loop_t *loop)
{
    memset(f, 0, sizeof(*f));
    f->loop = loop;
    if (uv_timer_init(loop, &f->timer) != 0) return -1;
    f->timer.data = f;
    uv_unref((uv_handle_t *)&f->timer); /* an open window never keeps the loop alive */
    return 0;
}

void mg_fulllog_close(mg_fulllog_t *f)
{
    if (!f->loop) return;
    uv_timer_stop(&f->timer);
    uv_close((uv_handle_t *)&f->timer, NULL);
    f->loop = NULL;
    f->on = 0;
}

int mg_fulllog_enable(mg_fulllog_t *f, int seconds, const char *reason, const char *actor)
{
    if (seconds < 1 || seconds > MG_FULLLOG_MAX_S) return -1;
    f->on = 1;
    f->until_ms = uv_now(f->loop) + (uint64_t)seconds * 1000;
    f->started_unix_ms = (int64_t)mg_unix_ms();
    f->until_unix_ms = f->started_unix_ms + (int64_t)seconds * 1000;
    snprintf(f->reason, sizeof(f->reason), "%s", reason ? reason : "");
    snprintf(f->actor, sizeof(f->actor), "%s", actor ? actor : "");
    f->windows_total++;
    uv_timer_start(&f->timer, on_expired, (uint64_t)seconds * 1000, 0);
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_WARN, "full logging on");
    mg_log_int(&l, "duration_seconds", seconds);
    mg_log_int(&l, "until_ms", f->until_unix_ms);
    mg_log_str(&l, "reason", f->reason);
    mg_log_str(&l, "actor", f->actor);
    mg_log_end(&l);
    return 0;
}

void mg_fulllog_disable(mg_fulllog_t *f, const char *why)
{
    if (!f->on) return;
    f->on = 0;
    uv_timer_stop(&f->timer);
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_WARN, "full logging off");
    mg_log_str(&l, "why", why);
    mg_log_end(&l);
}

int mg_fulllog_on(const mg_fulllog_t *f)
{
    return f && f->on && uv_now(f->loop) < f->until_ms;
}

cJSON *mg_fulllog_view(const mg_fulllog_t *f)
{
    cJSON *o = cJSON_CreateObject();
    int on = mg_fulllog_on(f);
    cJSON_AddStringToObject(o, "mode", on ? "full" : "metadata_only");
    cJSON_AddNumberToObject(o, "max_duration_seconds", MG_FULLLOG_MAX_S);
    if (!on) return o;
    uint64_t now = uv_now(f->loop);
    cJSON_AddNumberToObject(o, "started_ms", (double)f->started_unix_ms);
    cJSON_AddNumberToObject(o, "until_ms", (double)f->until_unix_ms);
    cJSON_AddNumberToObject(o, "remaining_seconds", (double)((f->until_ms - now + 999) / 1000));
    cJSON_AddStringToObject(o, "reason", f->reason);
    cJSON_AddStringToObject(o, "actor", f->actor);
    return o;
}
