/* mgtest: the smallest test harness that does the job. Each test file defines
 * test functions, lists them in main() with MG_RUN, and returns mg_test_summary().
 * A failed CHECK prints file:line and the expression and marks the test failed;
 * the test goes on so one run shows every failure. A test that ran no CHECK at all fails
 * too: it proved nothing. */
#ifndef MG_TEST_H
#define MG_TEST_H

#include <stdio.h>
#include <string.h>

static int mg_test_failures_ = 0;
static int mg_test_checks_ = 0;
static int mg_test_current_failed_ = 0;
static int mg_test_passed_ = 0;
static int mg_test_failed_ = 0;

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        mg_test_checks_++;                                                                         \
        if (!(expr)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #expr);               \
            mg_test_failures_++;                                                                   \
            mg_test_current_failed_ = 1;                                                           \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        mg_test_checks_++;                                                                         \
        if (a_ != b_) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", __FILE__, __LINE__,  \
                    #a, #b, a_, b_);                                                               \
            mg_test_failures_++;                                                                   \
            mg_test_current_failed_ = 1;                                                           \
        }                                                                                          \
    } while (0)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        mg_test_checks_++;                                                                         \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (\"%s\" != \"%s\")\n", __FILE__,        \
                    __LINE__, #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)");                     \
            mg_test_failures_++;                                                                   \
            mg_test_current_failed_ = 1;                                                           \
        }                                                                                          \
    } while (0)

#define MG_RUN(fn)                                                                                 \
    do {                                                                                           \
        mg_test_current_failed_ = 0;                                                               \
        int checks_before_ = mg_test_checks_;                                                      \
        fn();                                                                                      \
        if (mg_test_checks_ == checks_before_) {                                                   \
            fprintf(stderr, "%s: ran no check\n", #fn);                                            \
            mg_test_current_failed_ = 1;                                                           \
        }                                                                                          \
        if (mg_test_current_failed_) {                                                             \
            mg_test_failed_++;                                                                     \
            fprintf(stderr, "FAIL %s\n", #fn);                                                     \
        } else {                                                                                   \
            mg_test_passed_++;                                                                     \
            fprintf(stderr, "ok   %s\n", #fn);                                                     \
        }                                                                                          \
    } while (0)

static inline int mg_test_summary(void)
{
    fprintf(stderr, "%d passed, %d failed\n", mg_test_passed_, mg_test_failed_);
    return mg_test_failed_ ? 1 : 0;
}

#endif
