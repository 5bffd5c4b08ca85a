/* error: the gateway's error shape; see error.h. */
#include "net/error.h"

#include <stdio.h>
#include <string.h>

/* Every status not listed: invalid_request_error below 500 (the request was wrong),
 * api_error from 500 (the gateway or its providers failed). */
static const struct {
    int status;
    const char *type;
} types[] = {
    {401, "authentication_error"},
    {403, "permission_error"},
    {408, "timeout_error"}, /* a deadline passed: the queue's, the provider's, the client's */
    {429, "rate_limit_error"},
};

const char *mg_error_type(int status)
{
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (types[i].status == status) return types[i].type;
    return status >= 500 ? "api_error" : "invalid_request_error";
}

int mg_error_body(mg_buf_t *out, int status, const char *code, const char *message,
                  const char *request_id, int retry_after_ms)
{
    return mg_error_body_as(out, status, NULL, code, message, NULL, request_id, retry_after_ms);
}

int mg_error_body_as(mg_buf_t *out, int status, const char *type, const char *code,
                     const char *message, const char *param, const char *request_id,
                     int retry_after_ms)
{
    if (!type) type = mg_error_type(status);
    mg_buf_append_str(out, "{\"error\":{\"message\":");
    mg_json_print_string(message, strlen(message), out);
    mg_buf_append_str(out, ",\"type\":");
    mg_json_print_string(type, strlen(type), out);
    mg_buf_append_str(out, ",\"param\":");
    if (param) mg_json_print_string(param, strlen(param), out);
    else mg_buf_append_str(out, "null");
    mg_buf_append_str(out, ",\"code\":");
    mg_json_print_string(code, strlen(code), out);
    mg_buf_append_str(out, ",\"request_id\":");
    mg_json_print_string(request_id, strlen(request_id), out);
    if (retry_after_ms > 0) {
        mg_buf_append_str(out, ",\"retry_after_ms\":");
        mg_buf_append_int(out, retry_after_ms);
    }
    return mg_buf_append(out, "}}", 2);
}
