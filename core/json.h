/* json: a growable byte buffer and a fast serializer for cJSON trees.
 *
 * cJSON's own printer formats every number with sprintf and checks it with
 * sscanf, which made number printing the largest single cost of a proxied
 * request. This printer writes integers directly and uses "%.15g" (falling back
 * to "%.17g" only when needed to round-trip) for the rest. */
#ifndef MG_JSON_H
#define MG_JSON_H

#include <stddef.h>
#include <cjson/cJSON.h>

typedef struct mg_buf_s {
    char *data; /* owned (malloc); NUL-terminated when len > 0 */
    size_t len, cap;
} mg_buf_t;

/* Append n bytes; 0 or -1 when out of memory (the buffer is unchanged then). */
int mg_buf_append(mg_buf_t *b, const void *data, size_t n);
int mg_buf_append_str(mg_buf_t *b, const char *s);
void mg_buf_free(mg_buf_t *b);

/* Append the compact JSON text of v; 0 or -1 (out of memory). */
int mg_json_print(const cJSON *v, mg_buf_t *out);
/* Append s as a JSON string literal (with quotes). */
int mg_json_print_string(const char *s, size_t n, mg_buf_t *out);
/* Append a number the way mg_json_print does. */
int mg_json_print_number(double d, mg_buf_t *out);

#endif
