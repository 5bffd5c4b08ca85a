/* pg_schema: the numbered migrations of the shared PostgreSQL (store/pg.h) and their runner.
 *
 * mg_pg_migrate takes a session-level pg_advisory_lock (one key for moongate), reads the
 * version from mg_schema, applies each newer migration in its own transaction with its
 * version row, and unlocks: instances starting at once migrate one after the other, the
 * first does the work and the others find it done. Append new migrations at the end. */
#ifndef MG_STORE_PG_SCHEMA_H
#define MG_STORE_PG_SCHEMA_H

#include <libpq-fe.h>
#include <stddef.h>

/* Migrate c to the latest version. Returns the version (>= 1), or -1 with err set. */
int mg_pg_migrate(PGconn *c, char *err, size_t errlen);
int mg_pg_schema_latest(void);

#endif
