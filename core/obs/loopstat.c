/* loopstat: busy time per loop iteration; see loopstat.h. */
#include "obs/loopstat.h"

static void on_prepare(uv_prepare_t *h)
{
    mg_loopstat_t *ls = h->data;
    uint64_t now = uv_hrtime();
    uint64_t idle = uv_metrics_idle_time(h->loop);
    if (ls->last_ns) {
        uint64_t spent = now - ls->last_ns, waited = idle - ls->last_idle_ns;
        mg_metrics_loop_busy(ls->metrics, spent > waited ? spent - waited : 0);
    }
    ls->last_ns = now;
    ls->last_idle_ns = idle;
}

int mg_loopstat_start(mg_loopstat_t *ls, uv_loop_t *loop, mg_metrics_t *m)
{
    ls->metrics = NULL; /* until started: mg_loopstat_stop has nothing to close */
    ls->last_ns = ls->last_idle_ns = 0;
    int rc = uv_loop_configure(loop, UV_METRICS_IDLE_TIME);
    if (rc == 0) rc = uv_prepare_init(loop, &ls->prepare);
    if (rc != 0) return rc;
    ls->metrics = m;
    ls->prepare.data = ls;
    uv_prepare_start(&ls->prepare, on_prepare);
    /* measuring never keeps the loop alive */
    uv_unref((uv_handle_t *)&ls->prepare);
    return 0;
}

void mg_loopstat_stop(mg_loopstat_t *ls)
{
    if (!ls->metrics) return;
    uv_prepare_stop(&ls->prepare);
    uv_close((uv_handle_t *)&ls->prepare, NULL);
    ls->metrics = NULL;
}
