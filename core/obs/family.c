/* family: a labelled metric family in a bounded table; see family.h. */
#include "obs/family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char OTHER[] = "_other";
static const char NONE[] = "_none";

void mg_family_bind(mg_family_t *f, const mg_family_def_t *def)
{
    if (!f->def) f->def = def;
}

/* FNV-1a over the values, each with its NUL: one comparison rejects most series. */
static uint32_t values_hash(int n, const char *const *values)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) {
        const char *v = values[i] ? values[i] : NONE;
        for (size_t k = 0; k < MG_LABEL_MAX - 1 && v[k]; k++)
            h = (h ^ (unsigned char)v[k]) * 16777619u;
        h = (h ^ 0xffu) * 16777619u;
    }
    return h;
}

static int same_values(const mg_series_t *s, int n, const char *const *values)
{
    for (int i = 0; i < n; i++) {
        const char *v = values[i] ? values[i] : NONE;
        if (strncmp(s->values[i], v, MG_LABEL_MAX - 1) != 0) return 0;
    }
    return 1;
}

static void set_values(mg_series_t *s, int n, const char *const *values, uint32_t hash)
{
    s->hash = hash;
    for (int i = 0; i < n; i++)
        snprintf(s->values[i], MG_LABEL_MAX, "%s", values ? (values[i] ? values[i] : NONE) : OTHER);
}

mg_series_t *mg_family_series(mg_family_t *f, const char *const *values)
{
    const mg_family_def_t *d = f->def;
    if (!d || d->max_series < 2) return NULL;
    if (!f->series) {
        f->series = calloc((size_t)d->max_series, sizeof(mg_series_t));
        if (!f->series) return NULL;
    }
    uint32_t h = values_hash(d->n_labels, values);
    for (int i = 0; i < f->n; i++)
        if (f->series[i].hash == h && same_values(&f->series[i], d->n_labels, values))
            return &f->series[i];
    if (f->n < d->max_series - 1) {
        mg_series_t *s = &f->series[f->n++];
        set_values(s, d->n_labels, values, h);
        return s;
    }
    mg_series_t *o = &f->series[d->max_series - 1];
    if (!f->other) {
        set_values(o, d->n_labels, NULL, 0);
        f->other = 1;
    }
    return o;
}

void mg_family_add(mg_family_t *f, const char *const *values, double by)
{
    mg_series_t *s = mg_family_series(f, values);
    if (s) s->value += by;
}

void mg_family_set(mg_family_t *f, const char *const *values, double v)
{
    mg_series_t *s = mg_family_series(f, values);
    if (s) s->value = v;
}

void mg_family_observe(mg_family_t *f, const char *const *values, double v)
{
    mg_series_t *s = mg_family_series(f, values);
    if (!s) return;
    const mg_family_def_t *d = f->def;
    /* cumulative as rendered: every bucket whose bound holds v, from the top down */
    for (int i = d->n_le - 1; i >= 0 && v <= d->le[i]; i--) s->buckets[i]++;
    s->value += v;
    s->count++;
}

void mg_family_clear(mg_family_t *f)
{
    if (f->series && f->def) memset(f->series, 0, (size_t)f->def->max_series * sizeof(mg_series_t));
    f->n = 0;
    f->other = 0;
}

void mg_family_free(mg_family_t *f)
{
    free(f->series);
    f->series = NULL;
    f->n = 0;
    f->other = 0;
}

void mg_label_escape(char *dst, size_t size, const char *src)
{
    size_t n = 0;
    for (; *src && n + 3 < size; src++) {
        if (*src == '\\' || *src == '"' || *src == '\n') dst[n++] = '\\';
        dst[n++] = *src == '\n' ? 'n' : *src;
    }
    dst[n] = '\0';
}

/* name{labels,extra} value\n; extra (a last label, "le=..." of a bucket) may be NULL. */
static int sample(mg_buf_t *out, const mg_family_def_t *d, const char *suffix, const mg_series_t *s,
                  const char *extra, const char *value)
{
    char line[1024];
    int n = snprintf(line, sizeof(line), "%s%s", d->name, suffix);
    if (d->n_labels || extra) {
        n += snprintf(line + n, sizeof(line) - (size_t)n, "{");
        for (int i = 0; i < d->n_labels && n < (int)sizeof(line); i++) {
            char esc[2 * MG_LABEL_MAX];
            mg_label_escape(esc, sizeof(esc), s->values[i]);
            n += snprintf(line + n, sizeof(line) - (size_t)n, "%s%s=\"%s\"", i ? "," : "",
                          d->labels[i], esc);
        }
        if (extra && n < (int)sizeof(line))
            n +=
                snprintf(line + n, sizeof(line) - (size_t)n, "%s%s", d->n_labels ? "," : "", extra);
        if (n < (int)sizeof(line)) n += snprintf(line + n, sizeof(line) - (size_t)n, "}");
    }
    if (n < (int)sizeof(line)) n += snprintf(line + n, sizeof(line) - (size_t)n, " %s\n", value);
    if (n >= (int)sizeof(line)) return 0; /* cannot happen with MG_LABEL_MAX values */
    return mg_buf_append(out, line, (size_t)n);
}

static int render_series(mg_buf_t *out, const mg_family_def_t *d, const mg_series_t *s)
{
    char v[48];
    if (d->type != MG_FAMILY_HISTOGRAM) {
        snprintf(v, sizeof(v), "%.15g", s->value);
        return sample(out, d, "", s, NULL, v);
    }
    int rc = 0;
    char le[48];
    for (int i = 0; i < d->n_le; i++) {
        snprintf(le, sizeof(le), "le=\"%.15g\"", d->le[i]); /* 67108864, not 6.71089e+07 */
        snprintf(v, sizeof(v), "%llu", (unsigned long long)s->buckets[i]);
        rc |= sample(out, d, "_bucket", s, le, v);
    }
    snprintf(v, sizeof(v), "%llu", (unsigned long long)s->count);
    rc |= sample(out, d, "_bucket", s, "le=\"+Inf\"", v);
    rc |= sample(out, d, "_count", s, NULL, v);
    snprintf(v, sizeof(v), "%.9g", s->value);
    rc |= sample(out, d, "_sum", s, NULL, v);
    return rc;
}

int mg_family_render(const mg_family_t *f, mg_buf_t *out)
{
    const mg_family_def_t *d = f->def;
    if (!d) return 0;
    static const char *const types[] = {"counter", "gauge", "histogram"};
    char head[768];
    snprintf(head, sizeof(head), "# HELP %s %s\n# TYPE %s %s\n", d->name, d->help, d->name,
             types[d->type]);
    int rc = mg_buf_append_str(out, head);
    for (int i = 0; i < f->n; i++) rc |= render_series(out, d, &f->series[i]);
    if (f->other) rc |= render_series(out, d, &f->series[d->max_series - 1]);
    return rc ? -1 : 0;
}
