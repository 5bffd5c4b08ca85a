/* calib: bytes per token learned per route, for models without a known tokenizer.
 *
 * A route (provider id, upstream model) whose model has no loaded encoding is estimated from
 * the request body's bytes. Each answer whose upstream reported its prompt tokens teaches the
 * route how many body bytes its tokens take: an exponentially weighted moving average
 * (weight 1/n for the first MG_CALIB_WARMUP samples, so the first answer already sets it,
 * then MG_CALIB_ALPHA), each sample clamped to [MG_CALIB_MIN_BPT, MG_CALIB_MAX_BPT] so one odd
 * answer (an empty prompt, a huge image part) cannot drag it far. An unknown route reads
 * MG_CALIB_DEFAULT_BPT (the former constant, bytes / 4). The table is bounded
 * (MG_CALIB_ROUTES): a route past it is not learned and reads the default.
 *
 * Pure (no I/O); one thread (the loop's). Persisting and reloading the values is the
 * caller's (pipeline/calib.c: the store's token_calibration table). */
#ifndef MG_TOKEN_CALIB_H
#define MG_TOKEN_CALIB_H

#include <stddef.h>
#include <stdint.h>

#define MG_CALIB_ROUTES 256
#define MG_CALIB_DEFAULT_BPT 4.0
#define MG_CALIB_MIN_BPT 1.0
#define MG_CALIB_MAX_BPT 8.0
#define MG_CALIB_ALPHA 0.1
#define MG_CALIB_WARMUP 10
#define MG_CALIB_NAME_MAX 128

typedef struct mg_calib_route_s {
    char provider[MG_CALIB_NAME_MAX], model[MG_CALIB_NAME_MAX];
    double bpt;        /* learned bytes per token */
    uint64_t samples;  /* answers learned from (loaded ones included) */
    uint64_t saved_ms; /* when the caller last persisted it (its own bookkeeping) */
} mg_calib_route_t;

typedef struct mg_calib_s {
    mg_calib_route_t *routes; /* owned; MG_CALIB_ROUTES of them once the first is added */
    int n;
} mg_calib_t;

void mg_calib_init(mg_calib_t *c);
void mg_calib_free(mg_calib_t *c);

/* The route's entry, or NULL when it has none. */
mg_calib_route_t *mg_calib_find(const mg_calib_t *c, const char *provider, const char *model);
/* Bytes per token for the route: learned, or MG_CALIB_DEFAULT_BPT. */
double mg_calib_bpt(const mg_calib_t *c, const char *provider, const char *model);
/* Tokens of `bytes` at bpt bytes per token, rounded up (0 bytes: 0). */
int64_t mg_calib_tokens(double bpt, size_t bytes);

/* Learn from one answer: `bytes` of body whose upstream reported `tokens` prompt tokens.
 * *error (may be NULL) gets the relative error of the estimate made before this sample,
 * (estimate - tokens) / tokens. Returns the route's entry, or NULL when the sample is
 * unusable (no bytes or tokens, no name) or the table is full (then *error is untouched). */
mg_calib_route_t *mg_calib_observe(mg_calib_t *c, const char *provider, const char *model,
                                   size_t bytes, int64_t tokens, double *error);

/* Set a route's value (start-up: from the store); bpt is clamped. The entry, or NULL (full,
 * no name, out of memory). */
mg_calib_route_t *mg_calib_set(mg_calib_t *c, const char *provider, const char *model, double bpt,
                               uint64_t samples);

#endif
