/* schema: the numbered migrations of the embedded SQLite store and their runner.
 *
 * Each migration runs in its own transaction and records itself in schema_migrations, so a
 * crash mid-way never leaves a half-applied version behind. Past migrations stay as
 * written; a new one is appended at the end of the list. */
#ifndef MG_STORE_SCHEMA_H
#define MG_STORE_SCHEMA_H

#include <sqlite3.h>
#include <stddef.h>

/* Run sql (one or more statements); on failure -1 with SQLite's message in err. */
int mg_sqlite_exec(sqlite3 *db, const char *sql, char *err, size_t errlen);

/* Migrate db to the latest version. Returns that version, or -1 with err set (also when the
 * database is newer than this binary). */
int mg_schema_migrate(sqlite3 *db, char *err, size_t errlen);

#endif
