/* Unit tests for core/store/sqlq.c: the WHERE clause holds exactly the terms given, each '?'
 * numbered and bound in order, values never in the text, and a builder out of room refuses
 * to run. */
#include "store/sqlq.h"
#include "mgtest.h"

#include <string.h>

static void test_no_terms(void)
{
    mg_sqlq_t q;
    mg_sqlq_init(&q, "SELECT a FROM t");
    mg_sqlq_tail(&q, " ORDER BY a LIMIT ?", "5");
    CHECK(mg_sqlq_ok(&q));
    CHECK_STR(q.sql, "SELECT a FROM t ORDER BY a LIMIT ?1");
    CHECK_EQ_INT(q.nparams, 1);
    CHECK_STR(q.params[0], "5");
}

static void test_terms_numbered_in_order(void)
{
    mg_sqlq_t q;
    mg_sqlq_init(&q, "SELECT a FROM t");
    mg_sqlq_and(&q, "x = ?", "1");
    mg_sqlq_and(&q, "y IS NULL", NULL);
    mg_sqlq_and(&q, "z = ?", "it's; DROP TABLE t");
    mg_sqlq_and(&q, "(u = ? OR v = ?)", "w");
    mg_sqlq_tail(&q, " LIMIT ?", "2");
    CHECK(mg_sqlq_ok(&q));
    CHECK_STR(
        q.sql,
        "SELECT a FROM t WHERE x = ?1 AND y IS NULL AND z = ?2 AND (u = ?3 OR v = ?4) LIMIT ?5");
    CHECK_EQ_INT(q.nparams, 5);
    CHECK_STR(q.params[0], "1");
    CHECK_STR(q.params[1], "it's; DROP TABLE t");
    CHECK_STR(q.params[2], "w");
    CHECK_STR(q.params[3], "w");
    CHECK_STR(q.params[4], "2");
    CHECK(strstr(q.sql, "DROP") == NULL);
}

static void test_overflow_refuses(void)
{
    mg_sqlq_t q;
    mg_sqlq_init(&q, "SELECT a FROM t");
    for (int i = 0; i <= MG_SQLQ_PARAMS; i++) mg_sqlq_and(&q, "x = ?", "1");
    CHECK(!mg_sqlq_ok(&q));
    CHECK(q.nparams <= MG_SQLQ_PARAMS);

    char big[MG_SQLQ_TEXT];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    mg_sqlq_init(&q, "SELECT a FROM t");
    mg_sqlq_and(&q, big, NULL);
    CHECK(!mg_sqlq_ok(&q));
    CHECK(strlen(q.sql) < MG_SQLQ_TEXT);

    /* a '?' without a value is never run with an unbound NULL */
    mg_sqlq_init(&q, "SELECT a FROM t");
    mg_sqlq_and(&q, "x = ?", NULL);
    CHECK(!mg_sqlq_ok(&q));
}

int main(void)
{
    MG_RUN(test_no_terms);
    MG_RUN(test_terms_numbered_in_order);
    MG_RUN(test_overflow_refuses);
    return mg_test_summary();
}
