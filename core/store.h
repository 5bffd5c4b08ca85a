/* store: the embedded SQLite database (WAL mode) and its numbered migrations.
 *
 * Opened once at start-up, before the loop runs. Later writes go through the
 * store's own writer thread so the loop thread never waits on the disk. */
#ifndef MG_STORE_H
#define MG_STORE_H

#include <stddef.h>

typedef struct mg_store_s mg_store_t;

/* Open (creating the file and its directory when missing) and migrate to the
 * latest schema. Returns 0 and *out, or -1 with the reason in err. */
int mg_store_open(const char *path, mg_store_t **out, char *err, size_t errlen);
/* Schema version after migrations. */
int mg_store_schema_version(const mg_store_t *s);
void mg_store_close(mg_store_t *s);

#endif
