/* headers: the response headers of an upstream error answer, captured for the cooldown
 * policy (policies/cooldown.lua's on_response reads them: retry-after, retry-after-ms,
 * x-ratelimit-reset-requests, ...).
 *
 * Both upstream clients (h1client, curl) feed the header lines of a response whose status is
 * 400 or more into one mg_headers_t; a successful answer's headers are not copied. The block
 * is "name\0value\0" pairs in the order received, names lower-cased, values without their
 * surrounding blanks, at most MG_HEADERS_MAX bytes (the pairs that do not fit are dropped
 * whole). */
#ifndef MG_HEADERS_H
#define MG_HEADERS_H

#include <stddef.h>

#define MG_HEADERS_MAX 8192

typedef struct mg_headers_s {
    char *data; /* owned (malloc), NULL until the first pair */
    size_t len, cap;
    size_t pair_start; /* where the pair being fed starts */
    int in_value;      /* the name of that pair is complete */
    int dropped;       /* that pair did not fit: the rest of it is ignored */
} mg_headers_t;

/* Forget every pair (a new response starts); keeps the buffer. */
void mg_headers_reset(mg_headers_t *h);
/* Feed a piece of the current header's name, then of its value (llhttp hands them over in
 * pieces); mg_headers_end_value() completes the pair. Out of memory or room: the pair is
 * dropped. */
void mg_headers_name(mg_headers_t *h, const char *at, size_t len);
void mg_headers_value(mg_headers_t *h, const char *at, size_t len);
void mg_headers_end_value(mg_headers_t *h);
/* Feed one whole header line "Name: value\r\n" (curl's header callback); a line without a
 * colon is ignored. */
void mg_headers_line(mg_headers_t *h, const char *line, size_t len);
/* Hand the block over: *len its length; the caller frees the result (NULL: no pairs). h is
 * empty afterwards. */
char *mg_headers_take(mg_headers_t *h, size_t *len);
void mg_headers_free(mg_headers_t *h);

/* Walk a block: *pos starts at 0; returns 1 with *name and *value of the next pair, 0 at the
 * end. */
int mg_headers_next(const char *block, size_t len, size_t *pos, const char **name,
                    const char **value);
/* The value of the first pair named `name` (lower case), or NULL. */
const char *mg_headers_find(const char *block, size_t len, const char *name);

#endif
