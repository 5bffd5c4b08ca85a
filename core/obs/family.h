/* family: one Prometheus metric family with labels, its series kept in a bounded table.
 *
 * A family is described by a static definition (name, help, type, label names, histogram
 * bounds, how many series it may hold) and holds its series in one array allocated at the
 * first observation (mg_family_free frees it). Label values are copied (cut at
 * MG_LABEL_MAX - 1 bytes); a NULL value is "_none". Cardinality is bounded: once the table
 * is full, every new combination of values is counted in one series whose labels are all
 * "_other", so a client sending a new model name on every request cannot grow the scrape.
 * Loop thread only. */
#ifndef MG_FAMILY_H
#define MG_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "base/json.h"

#define MG_FAMILY_LABELS 5 /* label names a family may have */
#define MG_FAMILY_LE 16    /* histogram bounds a family may have (+Inf apart) */
#define MG_LABEL_MAX 64    /* bytes of a label value kept, NUL included */

typedef enum { MG_FAMILY_COUNTER, MG_FAMILY_GAUGE, MG_FAMILY_HISTOGRAM } mg_family_type_t;

typedef struct mg_family_def_s {
    const char *name; /* the metric name (histograms: without _bucket/_sum/_count) */
    const char *help;
    mg_family_type_t type;
    int n_labels;
    const char *labels[MG_FAMILY_LABELS];
    const double *le; /* histogram: ascending upper bounds, n_le of them */
    int n_le;
    int max_series; /* >= 2; the last slot is the "_other" series */
} mg_family_def_t;

typedef struct mg_series_s {
    uint32_t hash;
    char values[MG_FAMILY_LABELS][MG_LABEL_MAX];
    double value;                   /* counter, gauge; histogram: the sum */
    uint64_t count;                 /* histogram: observations */
    uint64_t buckets[MG_FAMILY_LE]; /* histogram: cumulative counts, per bound */
} mg_series_t;

typedef struct mg_family_s {
    const mg_family_def_t *def; /* borrowed (static); set by mg_family_bind */
    mg_series_t *series;        /* owned: def->max_series of them, NULL until first use */
    int n;                      /* series in use (the "_other" one not counted) */
    int other;                  /* 1 once the "_other" series took a value */
} mg_family_t;

/* Tie f to its definition (once; later calls do nothing). */
void mg_family_bind(mg_family_t *f, const mg_family_def_t *def);
/* The series of these label values (def->n_labels of them), made when new; the "_other"
 * series when the table is full; NULL when out of memory or unbound. */
mg_series_t *mg_family_series(mg_family_t *f, const char *const *values);
void mg_family_add(mg_family_t *f, const char *const *values, double by);
void mg_family_set(mg_family_t *f, const char *const *values, double v);
void mg_family_observe(mg_family_t *f, const char *const *values, double v);
/* Forget every series (gauges recomputed before each scrape). */
void mg_family_clear(mg_family_t *f);
/* HELP, TYPE and every series in the text format, appended to out. 0 or -1 (memory). */
int mg_family_render(const mg_family_t *f, mg_buf_t *out);
void mg_family_free(mg_family_t *f);

/* src as a label value (backslash, double quote and newline escaped) into dst. */
void mg_label_escape(char *dst, size_t size, const char *src);

#endif
