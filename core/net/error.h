/* error: the one error shape every answer of the gateway uses, on the OpenAI surface:
 *
 *   {"error":{"message":"...","type":"...","param":null,"code":"...","request_id":"..."
 *             [,"retry_after_ms":N]}}
 *
 * (`message`, `type`, `param` and `code` always present, as the OpenAI OpenAPI schema
 * requires), with `Retry-After` in whole seconds when retry_after_ms > 0. The type comes
 * from the status through one table (mg_error_type). The same body is the error event that
 * ends a stream whose first byte already reached the client. An answer that is only this
 * error is written by mg_error_respond (net/http.h). */
#ifndef MG_NET_ERROR_H
#define MG_NET_ERROR_H

#include "base/json.h"

/* The OpenAI error type of an HTTP status. */
const char *mg_error_type(int status);

/* The error body into out (appended; message JSON-escaped here). 0, or -1 when out of
 * memory. */
int mg_error_body(mg_buf_t *out, int status, const char *code, const char *message,
                  const char *request_id, int retry_after_ms);

/* The same with the type and param given (an upstream's error passed on): type NULL = from
 * the status, param NULL = null. */
int mg_error_body_as(mg_buf_t *out, int status, const char *type, const char *code,
                     const char *message, const char *param, const char *request_id,
                     int retry_after_ms);

#endif
