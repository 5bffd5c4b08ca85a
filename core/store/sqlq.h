/* sqlq: a SELECT's WHERE clause built from the filters actually given.
 *
 * A query written once with every filter optional, "(?1 IS NULL OR col = ?1)", is one plan
 * for all cases, and that plan can use no index and no rowid range: SQLite scans the whole
 * table. Built term by term, the statement holds only the filters given, as plain
 * "col = ?N", "seq < ?N" terms the planner can seek on.
 *
 * Terms are SQL text from the code; values are only ever bound parameters (?N, numbered in
 * order), never pasted into the text. A builder that ran out of room is marked overflowed
 * and must not be run (mg_sqlq_ok). */
#ifndef MG_STORE_SQLQ_H
#define MG_STORE_SQLQ_H

#include <stddef.h>

#define MG_SQLQ_TEXT 2048
#define MG_SQLQ_PARAMS 16

typedef struct {
    char sql[MG_SQLQ_TEXT];
    size_t len;
    const char *params[MG_SQLQ_PARAMS]; /* borrowed: they must outlive the query's run */
    int nparams;
    int terms;    /* terms in the WHERE clause so far */
    int overflow; /* the text or the parameters did not fit */
} mg_sqlq_t;

/* Start with head, e.g. "SELECT a, b FROM t". */
void mg_sqlq_init(mg_sqlq_t *q, const char *head);
/* AND term to the WHERE clause. Each '?' in term becomes the next parameter, bound to
 * value (a term with no '?' takes value NULL). */
void mg_sqlq_and(mg_sqlq_t *q, const char *term, const char *value);
/* Text after the WHERE clause (ORDER BY, LIMIT), its '?' bound to value as in mg_sqlq_and. */
void mg_sqlq_tail(mg_sqlq_t *q, const char *text, const char *value);
/* 1 when the statement is whole and may be run. */
int mg_sqlq_ok(const mg_sqlq_t *q);

#endif
