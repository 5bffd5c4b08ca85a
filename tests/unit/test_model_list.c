/* Unit tests for core/route/model_list.c: which upstream ids GET /v1/models lists, under which
 * name and owner: the prefix rule (an id the prefix cannot reach is left out; a longer prefix
 * of another provider claims its ids; a logical model is listed as such), dedup within and
 * across providers (the first owns it), disabled providers, names vs ids as owners, lookups,
 * and a list large enough to grow the index. */
#include "mgtest.h"
#include "route/model_list.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mg_provider_conf_t P[4];
static mg_model_conf_t M[1];
static mg_config_t C;

static void setup(void)
{
    memset(P, 0, sizeof(P));
    memset(M, 0, sizeof(M));
    memset(&C, 0, sizeof(C));
    P[0] = (mg_provider_conf_t){.id = "nim-a", .name = "NIM key A", .model_prefix = "meta/"};
    P[1] = (mg_provider_conf_t){.id = "nim-b", .name = "", .model_prefix = "meta/"};
    P[2] = (mg_provider_conf_t){.id = "llama", .model_prefix = "meta/llama-"};
    P[3] = (mg_provider_conf_t){.id = "plain"}; /* no prefix: its list (if any) is never shown */
    M[0] = (mg_model_conf_t){.name = "meta/logical"};
    C.providers = P;
    C.n_providers = 4;
    C.models = M;
    C.n_models = 1;
}

static void test_rule(void)
{
    setup();
    char *a[] = {"meta/x", "meta/llama-3", "nvidia/y", "meta/logical", "meta/x", "meta/z"};
    char *b[] = {"meta/z", "meta/w"};
    char *c[] = {"meta/llama-3", "meta/llama-4", "meta/q"};
    char *d[] = {"meta/plain"};
    mg_model_ids_t lists[4] = {{a, 6}, {b, 2}, {c, 3}, {d, 1}};
    mg_model_list_t l;
    CHECK_EQ_INT(mg_model_list_build(&C, lists, &l), 0);
    const char *want[] = {"meta/x", "meta/z", "meta/w", "meta/llama-3", "meta/llama-4"};
    const char *owner[] = {"NIM key A", "NIM key A", "nim-b", "llama", "llama"};
    CHECK_EQ_INT(l.n, 5);
    for (size_t i = 0; i < l.n && i < 5; i++) {
        CHECK_STR(l.items[i].id, want[i]);
        CHECK_STR(l.items[i].owned_by, owner[i]);
        CHECK(mg_model_list_find(&l, want[i]) == &l.items[i]);
    }
    /* nvidia/y: not under the prefix; meta/llama-3 from nim-a: the longer prefix's; meta/q
     * from llama: not under its prefix; meta/logical: a logical model; meta/plain: no prefix */
    const char *absent[] = {"nvidia/y", "meta/q", "meta/logical", "meta/plain", "", "meta/"};
    for (int i = 0; i < 6; i++) CHECK(mg_model_list_find(&l, absent[i]) == NULL);
    mg_model_list_free(&l);
    CHECK_EQ_INT(l.n, 0);
    CHECK(mg_model_list_find(&l, "meta/x") == NULL);
}

static void test_disabled_and_empty(void)
{
    setup();
    P[0].disabled = true;
    char *a[] = {"meta/x"};
    char *b[] = {"meta/x", "meta/y"};
    mg_model_ids_t lists[4] = {{a, 1}, {b, 2}, {NULL, 0}, {NULL, 0}};
    mg_model_list_t l;
    CHECK_EQ_INT(mg_model_list_build(&C, lists, &l), 0);
    CHECK_EQ_INT(l.n, 2);
    CHECK_STR(mg_model_list_find(&l, "meta/x")->owned_by,
              "nim-b"); /* the disabled one lists none */
    mg_model_list_free(&l);
    mg_model_ids_t none[4] = {{0}};
    CHECK_EQ_INT(mg_model_list_build(&C, none, &l), 0);
    CHECK_EQ_INT(l.n, 0);
    CHECK(mg_model_list_find(&l, "meta/x") == NULL);
    mg_model_list_free(&l);
}

/* "" serves every name no logical model and no other prefix takes (the Sidecar V1 provider). */
static void test_catch_all_and_many(void)
{
    setup();
    P[3].model_prefix = "";
    enum { N = 3000 };
    char **many = calloc(N, sizeof(*many));
    for (int i = 0; i < N; i++) {
        many[i] = malloc(24);
        /* 1500 names, the first 750 of them twice, and 750 under another prefix */
        if (i < N / 2) snprintf(many[i], 24, "m-%d", i);
        else if (i < 3 * N / 4) snprintf(many[i], 24, "m-%d", i - N / 2);
        else snprintf(many[i], 24, "meta/m-%d", i);
    }
    mg_model_ids_t lists[4] = {{NULL, 0}, {NULL, 0}, {NULL, 0}, {many, N}};
    mg_model_list_t l;
    CHECK_EQ_INT(mg_model_list_build(&C, lists, &l), 0);
    /* the meta/ ones belong to the meta/ providers' prefix: not reachable through "" */
    CHECK_EQ_INT(l.n, N / 2);
    CHECK(mg_model_list_find(&l, "m-0") != NULL);
    CHECK(mg_model_list_find(&l, "m-1499") != NULL);
    CHECK(mg_model_list_find(&l, "meta/m-2999") == NULL);
    CHECK_STR(l.items[N / 2 - 1].id, "m-1499");
    mg_model_list_free(&l);
    for (int i = 0; i < N; i++) free(many[i]);
    free(many);
}

int main(void)
{
    MG_RUN(test_rule);
    MG_RUN(test_disabled_and_empty);
    MG_RUN(test_catch_all_and_many);
    return mg_test_summary();
}
