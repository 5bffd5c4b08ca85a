/* rowgroup: journal records gathered for one multi-row INSERT; see rowgroup.h. */
#include "store/rowgroup.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void mg_rowgroup_init(mg_rowgroup_t *g, int nparams)
{
    g->nparams = nparams;
    mg_rowgroup_clear(g);
}

void mg_rowgroup_clear(mg_rowgroup_t *g)
{
    g->rows = 0;
    g->text_used = 0;
}

int mg_rowgroup_add(mg_rowgroup_t *g, int n, const mg_store_val_t *v)
{
    if (n != g->nparams || g->rows == MG_ROWGROUP_ROWS) return 0;
    size_t start = g->text_used; /* a row that does not fit leaves the arena as it was */
    mg_store_val_t *row = g->vals[g->rows];
    for (int i = 0; i < n; i++) {
        row[i] = v[i];
        if (v[i].kind != MG_STORE_TEXT || !v[i].s) continue;
        size_t len = strlen(v[i].s) + 1;
        if (len > MG_ROWGROUP_TEXT - g->text_used) {
            g->text_used = start;
            return 0;
        }
        char *copy = g->text + g->text_used;
        memcpy(copy, v[i].s, len);
        g->text_used += len;
        row[i].s = copy;
    }
    g->rows++;
    return 1;
}

/* The position just past the VALUES keyword that begins sql's last clause, or NULL. */
static const char *values_clause(const char *sql)
{
    const char *found = NULL;
    for (const char *p = sql; (p = strcasestr(p, "VALUES")) != NULL; p += 6)
        if (p > sql && isspace((unsigned char)p[-1])) found = p + 6;
    return found;
}

/* Whether p is exactly "(?1, ?2, ..., ?n)" (any spaces), then the end. */
static int is_param_tuple(const char *p, int n)
{
    while (isspace((unsigned char)*p)) p++;
    if (*p++ != '(') return 0;
    for (int k = 1; k <= n; k++) {
        while (isspace((unsigned char)*p)) p++;
        if (*p++ != '?') return 0;
        char *end;
        long got = strtol(p, &end, 10);
        if (end == p || got != k) return 0;
        p = end;
        while (isspace((unsigned char)*p)) p++;
        if (*p++ != (k < n ? ',' : ')')) return 0;
    }
    while (isspace((unsigned char)*p)) p++;
    return *p == 0;
}

char *mg_rowgroup_sql(const char *sql, int nparams, int rows)
{
    const char *tail = values_clause(sql);
    if (nparams <= 0 || rows <= 0 || !tail || !is_param_tuple(tail, nparams)) return NULL;
    size_t head = (size_t)(tail - sql);
    size_t tuple = 2 + 2 * (size_t)nparams; /* "(" "?," per value, the last ',' is ')', "," */
    size_t cap = head + 1 + (size_t)rows * tuple + 1;
    char *out = malloc(cap);
    if (!out) return NULL;
    memcpy(out, sql, head);
    size_t o = head;
    out[o++] = ' ';
    for (int r = 0; r < rows; r++) {
        if (r) out[o++] = ',';
        out[o++] = '(';
        for (int i = 0; i < nparams; i++) {
            out[o++] = '?';
            out[o++] = i + 1 < nparams ? ',' : ')';
        }
    }
    out[o] = 0;
    return out;
}
