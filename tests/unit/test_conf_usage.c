/* Unit tests for core/conf/usage.c: the usage: and prices: sections (defaults, values, every
 * refusal naming its field and line), the JSON validator the admin API shares, and a file
 * entry's version staying the same across loads. */
#include "mgtest.h"
#include "conf/config.h"

#include <stdio.h>
#include <string.h>

static char err[1024];

static mg_config_t *load(const char *yaml)
{
    mg_config_t *c = NULL;
    if (mg_config_parse("t.yaml", yaml, strlen(yaml), &c, err, sizeof err) != 0) return NULL;
    return c;
}

static const char *load_err(const char *yaml)
{
    mg_config_t *c = load(yaml);
    if (c) {
        mg_config_free(c);
        return "(loaded)";
    }
    return err;
}

static void test_usage_section(void)
{
    mg_config_t *c = load("providers: []\n");
    CHECK(c != NULL);
    if (c) {
        CHECK(c->usage.enabled);
        CHECK_EQ_INT(c->usage.retention_days, 90);
        CHECK_EQ_INT(c->usage.prune_batch, 1000);
        CHECK_EQ_INT(c->n_prices, 0);
        mg_config_free(c);
    }
    c = load(
        "usage:\n  enabled: false\n  retention_days: 7\n  prune_batch: 50\n  prune_interval_s: 3\n");
    CHECK(c != NULL);
    if (c) {
        CHECK(!c->usage.enabled);
        CHECK_EQ_INT(c->usage.retention_days, 7);
        CHECK_EQ_INT(c->usage.prune_batch, 50);
        CHECK_EQ_INT(c->usage.prune_interval_s, 3);
        mg_config_free(c);
    }
    CHECK(strstr(load_err("usage: { retention_days: 0 }\n"), "usage.retention_days") != NULL);
    CHECK(strstr(load_err("usage: { enabled: 1 }\n"), "usage.enabled") != NULL);
    CHECK(strstr(load_err("usage: { colour: 1 }\n"), "unknown field 'colour'") != NULL);
    CHECK(strstr(load_err("usage: [1]\n"), "usage must be a mapping") != NULL);
}

static void test_prices_section(void)
{
    const char *y =
        "prices:\n"
        "  - provider: a\n"
        "    model: m\n"
        "    input_per_1m_micros: 2500000\n"
        "    output_per_1m_micros: 10000000\n"
        "    cached_input_per_1m_micros: 1250000\n"
        "    effective_at: 2026-01-01T00:00:00Z\n"
        "  - { provider: a, input_per_1m_micros: 1, output_per_1m_micros: 2, effective_at: 100 }\n";
    mg_config_t *c = load(y), *again = load(y);
    CHECK(c != NULL && again != NULL);
    if (c && again) {
        CHECK_EQ_INT(c->n_prices, 2);
        const mg_price_t *p = &c->prices[0];
        CHECK_STR(p->provider, "a");
        CHECK_STR(p->model, "m");
        CHECK_EQ_INT(p->input_micros, 2500000);
        CHECK_EQ_INT(p->cached_input_micros, 1250000);
        CHECK_EQ_INT(p->cache_write_micros, 2500000); /* defaults to the input price */
        CHECK_EQ_INT(p->effective_at, 1767225600);
        CHECK_STR(c->prices[1].model, "*");
        CHECK_EQ_INT(c->prices[1].effective_at, 100);
        CHECK(strncmp(p->version, "cfg-", 4) == 0 && strlen(p->version) == 12);
        CHECK_STR(again->prices[0].version, p->version); /* stable across loads */
        CHECK(strcmp(c->prices[0].version, c->prices[1].version) != 0);
    }
    mg_config_free(c);
    mg_config_free(again);
    const char *e =
        load_err("prices:\n  - { provider: a, input_per_1m_micros: 1, output_per_1m_micros: 1 }\n"
                 "  - { provider: a, input_per_1m_micros: -5, output_per_1m_micros: 1 }\n");
    CHECK(strstr(e, "t.yaml:3:") != NULL && strstr(e, "prices[1]") &&
          strstr(e, "input_per_1m_micros"));
    CHECK(strstr(load_err("prices:\n  - { input_per_1m_micros: 1, output_per_1m_micros: 1 }\n"),
                 "price.provider") != NULL);
    CHECK(strstr(load_err("prices:\n  - { provider: a, output_per_1m_micros: 1 }\n"), "required") !=
          NULL);
    CHECK(
        strstr(
            load_err(
                "prices:\n  - { provider: a, input_per_1m_micros: 1, output_per_1m_micros: 1, effective_at: soon }\n"),
            "effective_at") != NULL);
    CHECK(
        strstr(
            load_err(
                "prices:\n  - { provider: a, input_per_1m_micros: '1', output_per_1m_micros: 1 }\n"),
            "input_per_1m_micros") != NULL); /* a quoted number is a string */
    CHECK(strstr(load_err("prices: { provider: a }\n"), "list") != NULL);
}

static void test_price_json(void)
{
    cJSON *o = cJSON_Parse("{\"provider\":\"p\",\"model\":\"m\",\"input_per_1m_micros\":3,"
                           "\"output_per_1m_micros\":4,\"cache_write_per_1m_micros\":5}");
    mg_price_t p;
    char why[256];
    CHECK(mg_price_from_json(o, &p, why, sizeof why) == 0);
    cJSON *back = mg_price_to_json(&p);
    CHECK_EQ_INT(cJSON_GetObjectItem(back, "cache_write_per_1m_micros")->valuedouble, 5);
    CHECK_EQ_INT(cJSON_GetObjectItem(back, "cached_input_per_1m_micros")->valuedouble, 3);
    CHECK_STR(cJSON_GetObjectItem(back, "version")->valuestring, p.version);
    cJSON_Delete(back);
    mg_price_clear(&p);
    cJSON_Delete(o);
    o = cJSON_Parse("{\"provider\":\"p\",\"input_per_1m_micros\":1e13,\"output_per_1m_micros\":1}");
    CHECK(mg_price_from_json(o, &p, why, sizeof why) != 0 && strstr(why, "input_per_1m_micros"));
    cJSON_Delete(o);
    CHECK(mg_price_from_json(NULL, &p, why, sizeof why) != 0);
}

int main(void)
{
    MG_RUN(test_usage_section);
    MG_RUN(test_prices_section);
    MG_RUN(test_price_json);
    return mg_test_summary();
}
