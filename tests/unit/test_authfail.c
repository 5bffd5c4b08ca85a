/* authfail: ten failures a window per address, then refused until the window ends; other
 * addresses unaffected; the table never grows past its slots. */
#include <stdio.h>

#include "admin/authfail.h"
#include "mgtest.h"

static mg_authfail_t t;

static void test_addr(void)
{
    char out[64];
    mg_authfail_addr("10.1.2.3:5678", out, sizeof(out));
    CHECK_STR(out, "10.1.2.3");
    mg_authfail_addr("[::1]:80", out, sizeof(out));
    CHECK_STR(out, "[::1]");
    mg_authfail_addr("", out, sizeof(out));
    CHECK_STR(out, "");
}

static void test_limit_and_window(void)
{
    uint64_t retry = 0;
    for (int i = 0; i < MG_AUTHFAIL_MAX; i++) {
        CHECK(!mg_authfail_blocked(&t, "1.1.1.1", 1000 + (uint64_t)i, &retry));
        mg_authfail_count(&t, "1.1.1.1", 1000 + (uint64_t)i);
    }
    CHECK(mg_authfail_blocked(&t, "1.1.1.1", 2000, &retry));
    CHECK_EQ_INT(retry, MG_AUTHFAIL_WINDOW_MS - 1000);
    CHECK(!mg_authfail_blocked(&t, "2.2.2.2", 2000, &retry)); /* another address */
    CHECK(!mg_authfail_blocked(&t, "1.1.1.1", 1000 + MG_AUTHFAIL_WINDOW_MS, &retry));
    mg_authfail_count(&t, "1.1.1.1", 1000 + MG_AUTHFAIL_WINDOW_MS); /* a new window */
    CHECK(!mg_authfail_blocked(&t, "1.1.1.1", 1001 + MG_AUTHFAIL_WINDOW_MS, &retry));
}

static void test_table_is_bounded(void)
{
    char addr[32];
    for (int i = 0; i < 3 * MG_AUTHFAIL_SLOTS; i++) {
        snprintf(addr, sizeof(addr), "10.0.%d.%d", i / 256, i % 256);
        mg_authfail_count(&t, addr, 5000 + (uint64_t)i);
    }
    int used = 0;
    for (int i = 0; i < MG_AUTHFAIL_SLOTS; i++) used += t.slots[i].addr[0] != 0;
    CHECK_EQ_INT(used, MG_AUTHFAIL_SLOTS);
    /* the newest addresses are the ones kept */
    snprintf(addr, sizeof(addr), "10.0.%d.%d", (3 * MG_AUTHFAIL_SLOTS - 1) / 256,
             (3 * MG_AUTHFAIL_SLOTS - 1) % 256);
    int found = 0;
    for (int i = 0; i < MG_AUTHFAIL_SLOTS; i++) found += !strcmp(t.slots[i].addr, addr);
    CHECK_EQ_INT(found, 1);
}

int main(void)
{
    MG_RUN(test_addr);
    MG_RUN(test_limit_and_window);
    MG_RUN(test_table_is_bounded);
    return mg_test_summary();
}
