/* Unit tests for core/api/throttle.c: the address without its port, ten failures a minute and
 * then a wait that ends with the minute, one address never slowing another, a full table
 * making room. */
#include "api/throttle.h"
#include "mgtest.h"

#include <stdio.h>
#include <string.h>

static mg_throttle_t T;

static void test_addr(void)
{
    char a[64];
    mg_throttle_addr("127.0.0.1:54321", a, sizeof(a));
    CHECK_STR(a, "127.0.0.1");
    mg_throttle_addr("[::1]:443", a, sizeof(a));
    CHECK_STR(a, "::1");
    mg_throttle_addr("", a, sizeof(a));
    CHECK_STR(a, "");
}

static void test_limit_and_window(void)
{
    memset(&T, 0, sizeof(T));
    for (int i = 0; i < MG_THROTTLE_MAX; i++) {
        CHECK_EQ_INT(mg_throttle_wait_ms(&T, "10.0.0.1", 1000 + i), 0);
        mg_throttle_fail(&T, "10.0.0.1", 1000 + i);
    }
    CHECK_EQ_INT(mg_throttle_wait_ms(&T, "10.0.0.1", 2000), MG_THROTTLE_WINDOW_MS - 1000);
    CHECK_EQ_INT(mg_throttle_wait_ms(&T, "10.0.0.2", 2000), 0); /* another address */
    CHECK_EQ_INT(mg_throttle_wait_ms(&T, "10.0.0.1", 1000 + MG_THROTTLE_WINDOW_MS), 0);
    mg_throttle_fail(&T, "10.0.0.1", 1000 + MG_THROTTLE_WINDOW_MS); /* a new window */
    CHECK_EQ_INT(mg_throttle_wait_ms(&T, "10.0.0.1", 1001 + MG_THROTTLE_WINDOW_MS), 0);
}

static void test_full_table(void)
{
    memset(&T, 0, sizeof(T));
    char a[32];
    for (int i = 0; i < MG_THROTTLE_SLOTS + 5; i++) {
        snprintf(a, sizeof(a), "10.1.0.%d", i);
        mg_throttle_fail(&T, a, (uint64_t)i);
    }
    int used = 0;
    for (int i = 0; i < MG_THROTTLE_SLOTS; i++) used += T.slots[i].addr[0] != '\0';
    CHECK_EQ_INT(used, MG_THROTTLE_SLOTS);
    for (int i = 0; i < MG_THROTTLE_MAX; i++) mg_throttle_fail(&T, "10.9.9.9", 100);
    CHECK(mg_throttle_wait_ms(&T, "10.9.9.9", 100) > 0); /* counted though the table was full */
}

int main(void)
{
    MG_RUN(test_addr);
    MG_RUN(test_limit_and_window);
    MG_RUN(test_full_table);
    return mg_test_summary();
}
