/* rotate: the provider keys re-encrypted through control_log; see rotate.h. */
#include "cluster/rotate.h"

#include <cjson/cJSON.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/control_sql.h"
#include "store/pg_schema.h"

static int cmd(PGconn *c, const char *sql, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok) snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

/* The provider row (JSON) with its key re-encrypted, into *out (malloc'd; NULL: nothing to
 * rotate, a configured provider or no key). 0 or -1. */
static int rotate_row(const char *pk, const char *row, const mg_secret_key_t *old_key,
                      const mg_secret_key_t *new_key, char **out, char *err, size_t errlen)
{
    *out = NULL;
    cJSON *j = cJSON_Parse(row);
    if (!j) {
        snprintf(err, errlen, "provider %s: its log row is not JSON", pk);
        return -1;
    }
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(j, "source");
    cJSON *key = cJSON_GetObjectItemCaseSensitive(j, "api_key");
    int rc = 0;
    if (cJSON_IsString(key) && key->valuestring[0] &&
        (!cJSON_IsString(src) || strcmp(src->valuestring, "db") == 0)) {
        char *fresh = NULL;
        int e = mg_secret_reencrypt(old_key, new_key, key->valuestring, &fresh);
        if (e != MG_SECRET_OK) {
            snprintf(err, errlen,
                     "provider %s: the stored key does not decrypt with the old key (%s)", pk,
                     mg_secret_strerror(e));
            rc = -1;
        } else if (!cJSON_ReplaceItemInObjectCaseSensitive(j, "api_key",
                                                           cJSON_CreateString(fresh)) ||
                   !(*out = cJSON_PrintUnformatted(j))) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
        }
        free(fresh);
    }
    cJSON_Delete(j);
    return rc;
}

static int append(PGconn *c, const char *pk, const char *row, const char *node, const char *at,
                  char *err, size_t errlen)
{
    const char *p[4] = {pk, row, node, at};
    PGresult *r = PQexecParams(c,
                               "INSERT INTO control_log(tbl, pk, op, row, node, at)"
                               " VALUES ('providers', $1, 'put', $2, $3, $4)",
                               4, NULL, p, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

/* Under the lock: each provider's last entry, rotated and appended. 0 or -1. */
static int rotate_all(PGconn *c, const char *node, const mg_secret_key_t *old_key,
                      const mg_secret_key_t *new_key, size_t *count, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, "SELECT DISTINCT ON (pk) pk, op, row FROM control_log"
                            " WHERE tbl = 'providers' ORDER BY pk, id DESC");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(c));
        PQclear(r);
        return -1;
    }
    char at[24];
    snprintf(at, sizeof(at), "%lld", (long long)time(NULL) * 1000);
    int rc = 0;
    for (int i = 0; rc == 0 && i < PQntuples(r); i++) {
        if (strcmp(PQgetvalue(r, i, 1), "put") != 0 || PQgetisnull(r, i, 2)) continue; /* gone */
        char *row = NULL;
        const char *pk = PQgetvalue(r, i, 0);
        rc = rotate_row(pk, PQgetvalue(r, i, 2), old_key, new_key, &row, err, errlen);
        if (rc == 0 && row) {
            rc = append(c, pk, row, node, at, err, errlen);
            if (rc == 0) (*count)++;
        }
        free(row);
    }
    PQclear(r);
    return rc;
}

int mg_cluster_rotate_providers(const char *url, const char *node, const mg_secret_key_t *old_key,
                                const mg_secret_key_t *new_key, size_t *count, char *err,
                                size_t errlen)
{
    *count = 0;
    const char *keys[] = {"dbname", "connect_timeout", "application_name", NULL};
    const char *vals[] = {url, "5", "moongate-rotate-encryption-key", NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        snprintf(err, errlen, "cannot connect to PostgreSQL (cluster.postgres.url)");
        PQfinish(c);
        return -1;
    }
    int rc =
        mg_pg_migrate(c, err, errlen) < 0 || cmd(c, "BEGIN", err, errlen) != 0 ||
                cmd(c, "SELECT pg_advisory_xact_lock(" MG_CONTROL_LOCK ")", err, errlen) != 0 ||
                rotate_all(c, node, old_key, new_key, count, err, errlen) != 0 ||
                cmd(c, "NOTIFY mg_control", err, errlen) != 0 || cmd(c, "COMMIT", err, errlen) != 0
            ? -1
            : 0;
    if (rc != 0) *count = 0; /* the transaction ends with the connection: nothing appended */
    PQfinish(c);
    return rc;
}
