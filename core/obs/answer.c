/* answer: the gateway's own answers, accounted; see answer.h. */
#include "obs/answer.h"

#include "base/json.h"
#include "base/log.h"
#include "net/error.h"

void mg_answer_account(mg_metrics_t *m, const mg_http_req_t *req, mg_endpoint_t ep, int status,
                       const char *error_code)
{
    if (m) {
        uint64_t now = m->loop ? uv_now(m->loop) : req->start_ms;
        mg_metrics_request(m, ep, status, (double)(now - req->start_ms) / 1000.0);
    }
    mg_log_level_t lv = status >= 500 ? MG_LOG_WARN : MG_LOG_INFO;
    if (!mg_log_enabled(lv)) return;
    mg_logline_t l;
    mg_log_begin(&l, lv, "request");
    mg_http_log_ids(&l, req);
    mg_log_str(&l, "method", llhttp_method_name((llhttp_method_t)req->method));
    mg_log_str(&l, "path", req->path);
    mg_log_int(&l, "status", status);
    if (error_code) mg_log_str(&l, "error", error_code);
    mg_log_end(&l);
}

void mg_answer_json(mg_metrics_t *m, mg_http_req_t *req, mg_endpoint_t ep, int status,
                    const char *extra_headers, const char *body, size_t len)
{
    mg_answer_account(m, req, ep, status, NULL);
    mg_http_respond(req, status, "application/json", extra_headers, body, len);
}

void mg_answer_tree(mg_metrics_t *m, mg_http_req_t *req, mg_endpoint_t ep, int status, cJSON *obj)
{
    mg_buf_t text = {0};
    int rc = mg_json_print(obj, &text);
    cJSON_Delete(obj);
    if (rc != 0) mg_answer_error(m, req, ep, 500, "INTERNAL_ERROR", "out of memory", 0);
    else mg_answer_json(m, req, ep, status, NULL, text.data, text.len);
    mg_buf_free(&text);
}

void mg_answer_error(mg_metrics_t *m, mg_http_req_t *req, mg_endpoint_t ep, int status,
                     const char *code, const char *message, int retry_after_ms)
{
    mg_answer_account(m, req, ep, status, code);
    mg_error_respond(req, status, code, message, retry_after_ms, NULL);
}
