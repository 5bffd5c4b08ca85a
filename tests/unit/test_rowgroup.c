/* Unit tests for core/store/rowgroup.c: the multi-row form of a one-row INSERT is made only
 * from a VALUES list of ?1..?N in order and runs in SQLite with the rows' values in order; a
 * group copies its rows' text (the source may change or go), refuses a row of another width,
 * a row past its last and text past its arena, and takes them again once cleared. */
#include "mgtest.h"
#include "store_fixture.h"
#include "store/rowgroup.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#define TEXT(x) ((mg_store_val_t){MG_STORE_TEXT, 0, (x), 0})
#define INT(x) ((mg_store_val_t){MG_STORE_INT, (x), NULL, 0})
#define NUL ((mg_store_val_t){MG_STORE_NULL, 0, NULL, 0})

static void test_sql_form(void)
{
    char *sql = mg_rowgroup_sql("INSERT OR IGNORE INTO t(a, b) VALUES (?1, ?2)", 2, 3);
    CHECK_STR(sql, "INSERT OR IGNORE INTO t(a, b) VALUES (?,?),(?,?),(?,?)");
    free(sql);
    sql = mg_rowgroup_sql("insert into t(a) values(\n ?1 )  ", 1, 2);
    CHECK_STR(sql, "insert into t(a) values (?),(?)");
    free(sql);
    /* what has no such form: refused, never guessed at */
    CHECK(mg_rowgroup_sql("INSERT INTO t(a, b) VALUES (?2, ?1)", 2, 4) == NULL);
    CHECK(mg_rowgroup_sql("INSERT INTO t(a, b) VALUES (?1, 5)", 2, 4) == NULL);
    CHECK(mg_rowgroup_sql("INSERT INTO t(a) VALUES (?1) ON CONFLICT DO NOTHING", 1, 4) == NULL);
    CHECK(mg_rowgroup_sql("INSERT INTO t(a, b) VALUES (?1, ?2)", 3, 4) == NULL);
    CHECK(mg_rowgroup_sql("INSERT INTO t(a, b) VALUES (?1, ?2), (?3, ?4)", 2, 4) == NULL);
    CHECK(mg_rowgroup_sql("INSERT INTO t(a) SELECT ?1", 1, 4) == NULL);
    CHECK(mg_rowgroup_sql("UPDATE t SET a = ?1", 1, 4) == NULL);
    CHECK(mg_rowgroup_sql("INSERT INTO t(a) VALUES (?1)", 1, 0) == NULL);
}

/* The statement a drain runs: the group's rows bound in order land as those rows. */
static void test_sql_runs(void)
{
    sqlite3 *db = NULL;
    CHECK_EQ_INT(sqlite3_open(":memory:", &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, "CREATE TABLE t(k TEXT UNIQUE, n INTEGER, x TEXT)", 0, 0, 0),
                 SQLITE_OK);
    char *sql = mg_rowgroup_sql("INSERT OR IGNORE INTO t(k, n, x) VALUES (?1, ?2, ?3)", 3, 4);
    sqlite3_stmt *st = NULL;
    CHECK(sql && sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK);
    CHECK_EQ_INT(sqlite3_bind_parameter_count(st), 12);
    const char *keys[4] = {"k0", "k1", "k2", "k3"};
    for (int r = 0; r < 4; r++) {
        sqlite3_bind_text(st, r * 3 + 1, keys[r], -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, r * 3 + 2, 10 + r);
        if (r != 2) sqlite3_bind_text(st, r * 3 + 3, "x", -1, SQLITE_STATIC);
    }
    CHECK_EQ_INT(sqlite3_step(st), SQLITE_DONE);
    CHECK_EQ_INT(sqlite3_changes(db), 4);
    CHECK_EQ_INT(mgt_sql_int(db, "SELECT COUNT(*) FROM t"), 4);
    CHECK_EQ_INT(mgt_sql_int(db, "SELECT n FROM t WHERE k = 'k3'"), 13);
    CHECK_EQ_INT(mgt_sql_int(db, "SELECT COUNT(*) FROM t WHERE x IS NULL AND k = 'k2'"), 1);
    /* the same rows again: all ignored, which a drain sees as fewer changes than rows */
    sqlite3_reset(st);
    CHECK_EQ_INT(sqlite3_step(st), SQLITE_DONE);
    CHECK_EQ_INT(sqlite3_changes(db), 0);
    sqlite3_finalize(st);
    free(sql);
    sqlite3_close(db);
}

static void test_group_copies_and_bounds(void)
{
    static mg_rowgroup_t g; /* about 100 KiB: not on the stack */
    mg_rowgroup_init(&g, 3);
    char key[16] = "first";
    mg_store_val_t row[3] = {TEXT(key), INT(7), NUL};
    CHECK_EQ_INT(mg_rowgroup_add(&g, 3, row), 1);
    strcpy(key, "changed"); /* the ring's bytes are gone after the read's call */
    CHECK_STR(g.vals[0][0].s, "first");
    CHECK(g.vals[0][0].s != key);
    CHECK_EQ_INT(g.vals[0][1].i, 7);
    CHECK_EQ_INT(g.vals[0][2].kind, MG_STORE_NULL);
    /* another width: never in this group */
    mg_store_val_t narrow[2] = {TEXT("a"), INT(1)};
    CHECK_EQ_INT(mg_rowgroup_add(&g, 2, narrow), 0);
    /* full after MG_ROWGROUP_ROWS */
    for (int r = 1; r < MG_ROWGROUP_ROWS; r++) CHECK_EQ_INT(mg_rowgroup_add(&g, 3, row), 1);
    CHECK_EQ_INT(g.rows, MG_ROWGROUP_ROWS);
    CHECK_EQ_INT(mg_rowgroup_add(&g, 3, row), 0);
    mg_rowgroup_clear(&g);
    CHECK_EQ_INT(g.rows, 0);
    CHECK_EQ_INT(mg_rowgroup_add(&g, 3, row), 1);
    /* text: past what is left of the arena refused, past the whole arena never fits */
    size_t half = MG_ROWGROUP_TEXT / 2;
    char *big = malloc(half + 1), *huge = malloc(MG_ROWGROUP_TEXT + 1);
    if (!big || !huge) {
        free(big);
        free(huge);
        CHECK(0);
        return;
    }
    memset(big, 'b', half);
    big[half] = 0;
    memset(huge, 'h', MG_ROWGROUP_TEXT);
    huge[MG_ROWGROUP_TEXT] = 0;
    mg_store_val_t with_big[3] = {TEXT(big), INT(1), NUL};
    mg_store_val_t with_huge[3] = {TEXT(huge), INT(1), NUL};
    mg_rowgroup_clear(&g);
    CHECK_EQ_INT(mg_rowgroup_add(&g, 3, with_big), 1);
    CHECK_EQ_INT(mg_rowgroup_add(&g, 3, with_big), 0); /* two halves and their NULs: over */
    mg_rowgroup_clear(&g);
    mg_store_val_t almost[3] = {TEXT(big + 1), INT(1), NUL};
    CHECK_EQ_INT(mg_rowgroup_add(&g, 3, almost), 1);
    CHECK_STR(g.vals[0][0].s, big + 1);
    CHECK_EQ_INT(mg_rowgroup_add(&g, 3, almost), 1); /* exactly the arena */
    CHECK_EQ_INT(g.text_used, MG_ROWGROUP_TEXT);
    CHECK_EQ_INT(mg_rowgroup_add(&g, 3, row), 0);
    mg_rowgroup_clear(&g);
    CHECK_EQ_INT(mg_rowgroup_add(&g, 3, with_huge), 0); /* never: it goes alone */
    CHECK_EQ_INT(g.rows, 0);
    free(big);
    free(huge);
}

int main(void)
{
    MG_RUN(test_sql_form);
    MG_RUN(test_sql_runs);
    MG_RUN(test_group_copies_and_bounds);
    return mg_test_summary();
}
