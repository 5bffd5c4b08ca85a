/* Unit tests for core/base/trace.c: traceparent parsing by the W3C rules, new traces and
 * spans, formatting. */
#include "base/trace.h"
#include "mgtest.h"

#include <string.h>

static const char *const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
static const char *const SPAN = "00f067aa0ba902b7";

static void test_parse_valid(void)
{
    mg_trace_t t;
    CHECK_EQ_INT(mg_trace_parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &t), 0);
    CHECK_STR(t.trace_id, TRACE);
    CHECK_STR(t.parent_id, SPAN);
    CHECK_STR(t.flags, "01");
    /* surrounding blanks (OWS) and a later version's extra fields are accepted */
    CHECK_EQ_INT(mg_trace_parse(" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00\t", &t),
                 0);
    CHECK_STR(t.flags, "00");
    CHECK_EQ_INT(mg_trace_parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz", &t),
                 0);
}

static void test_parse_invalid(void)
{
    const char *bad[] = {
        NULL,
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",      /* no flags */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   /* upper case */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* version ff */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   /* zero trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   /* zero span id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", /* 00 with more */
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  /* later: no '-' */
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* separator */
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",   /* not hex */
        "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0z",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        mg_trace_t t;
        CHECK_EQ_INT(mg_trace_parse(bad[i], &t), -1);
    }
}

static int hex_only(const char *s, size_t n)
{
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

static void test_start_and_children(void)
{
    mg_trace_t t;
    char tp[MG_TRACEPARENT_LEN + 1], child[MG_TRACEPARENT_LEN + 1], span[MG_SPAN_ID_HEX + 1];
    /* the client's trace: kept, the gateway's span a new one */
    CHECK_EQ_INT(mg_trace_start(&t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), 0);
    CHECK_STR(t.trace_id, TRACE);
    CHECK_STR(t.parent_id, SPAN);
    CHECK(hex_only(t.span_id, MG_SPAN_ID_HEX));
    CHECK(strcmp(t.span_id, SPAN) != 0);
    mg_trace_format(&t, tp);
    CHECK(strncmp(tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-", 36) == 0);
    CHECK(strcmp(tp + 36 + MG_SPAN_ID_HEX, "-01") == 0);
    CHECK(strncmp(tp + 36, t.span_id, MG_SPAN_ID_HEX) == 0);
    mg_trace_t back;
    CHECK_EQ_INT(mg_trace_parse(tp, &back), 0); /* what we send is valid */
    /* two children: same trace, spans of their own */
    CHECK_EQ_INT(mg_trace_child(&t, child, span), 0);
    CHECK_EQ_INT(mg_trace_parse(child, &back), 0);
    CHECK_STR(back.trace_id, TRACE);
    CHECK_STR(back.parent_id, span);
    CHECK(strcmp(span, t.span_id) != 0);
    char child2[MG_TRACEPARENT_LEN + 1];
    CHECK_EQ_INT(mg_trace_child(&t, child2, NULL), 0);
    CHECK(strcmp(child, child2) != 0);
    /* no header, or an invalid one: a new trace, sampled, no parent */
    CHECK_EQ_INT(mg_trace_start(&t, NULL), 0);
    CHECK(hex_only(t.trace_id, MG_TRACE_ID_HEX));
    CHECK_STR(t.parent_id, "");
    CHECK_STR(t.flags, "01");
    char first[MG_TRACE_ID_HEX + 1];
    memcpy(first, t.trace_id, sizeof(first));
    CHECK_EQ_INT(mg_trace_start(&t, "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), 0);
    CHECK(strcmp(t.trace_id, first) != 0);
    CHECK(strcmp(t.trace_id, TRACE) != 0);
    /* an empty trace formats as "" and has no children */
    mg_trace_t empty;
    memset(&empty, 0, sizeof(empty));
    mg_trace_format(&empty, tp);
    CHECK_STR(tp, "");
    CHECK_EQ_INT(mg_trace_child(&empty, child, NULL), -1);
}

int main(void)
{
    MG_RUN(test_parse_valid);
    MG_RUN(test_parse_invalid);
    MG_RUN(test_start_and_children);
    return mg_test_summary();
}
