/* rowgroup: journal records gathered for one multi-row INSERT (the journal's drain, store.c).
 *
 * A record's values live only during its read's callback (store/journal.h); a group copies
 * up to MG_ROWGROUP_ROWS of them, their text into its own arena, so that one statement of
 * that many VALUES tuples inserts them all: SQLite's work per statement (its cursors opened,
 * the program's start and end, the reset) is then paid once per group instead of once per
 * row (bench/README.md). Writer thread only. */
#ifndef MG_ROWGROUP_H
#define MG_ROWGROUP_H

#include <stddef.h>

#include "store/journal.h"
#include "store/store.h"

#define MG_ROWGROUP_ROWS 16
#define MG_ROWGROUP_TEXT (64u * 1024u) /* the rows' text together; a larger row goes alone */

typedef struct mg_rowgroup_s {
    int nparams; /* values per row: every row of a group has this many */
    int rows;    /* rows held */
    size_t text_used;
    mg_store_val_t vals[MG_ROWGROUP_ROWS][MG_JOURNAL_VALS_MAX];
    char text[MG_ROWGROUP_TEXT];
} mg_rowgroup_t;

/* Empty, for rows of nparams values. */
void mg_rowgroup_init(mg_rowgroup_t *g, int nparams);
/* Copy one row in. 1 when held; 0 when it does not fit (the group is full, or the text
 * would overflow the arena: insert the rows held first, then try again) or never will (its
 * count of values is not nparams, or its text alone exceeds the arena: insert it alone). */
int mg_rowgroup_add(mg_rowgroup_t *g, int n, const mg_store_val_t *v);
void mg_rowgroup_clear(mg_rowgroup_t *g);

/* The statement that inserts `rows` rows at once, made from sql, a one-row INSERT whose last
 * clause is its VALUES list of parameters (`... VALUES (?1, ..., ?N)`, N = nparams, in
 * order): the same head, then `rows` tuples of N anonymous parameters, numbered 1 to
 * rows * N in order. A malloc'd string, or NULL when sql is not of that form. */
char *mg_rowgroup_sql(const char *sql, int nparams, int rows);

#endif
