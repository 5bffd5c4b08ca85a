/* Unit tests for core/conf/config.c: loading, defaults, ${ENV} expansion and every kind of
 * validation error, each with its exact "FILE:LINE: reason" message. */
#include "conf/config.h"
#include "mgtest.h"
#include "token/encoding.h"

#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#ifndef MG_SOURCE_DIR
#define MG_SOURCE_DIR "."
#endif

static char err_buf[1024];

/* Parses yaml as "t.yaml"; returns the config or NULL (error text in err_buf). */
static mg_config_t *parse(const char *yaml)
{
    mg_config_t *cfg = (mg_config_t *)1;
    int rc = mg_config_parse("t.yaml", yaml, strlen(yaml), &cfg, err_buf, sizeof err_buf);
    if (rc != 0 && cfg != NULL) {
        fprintf(stderr, "error return but out not NULL\n");
        return NULL;
    }
    if (rc == 0 && cfg == NULL) fprintf(stderr, "success return but out NULL\n");
    return cfg;
}

/* Parses yaml expecting success; prints the error otherwise. */
static mg_config_t *parse_ok(const char *yaml)
{
    mg_config_t *cfg = parse(yaml);
    if (!cfg) fprintf(stderr, "  unexpected error: %s\n", err_buf);
    return cfg;
}

/* Parses yaml expecting failure; returns the error message ("" if it loaded). */
static const char *parse_err(const char *yaml)
{
    mg_config_t *cfg = parse(yaml);
    if (cfg) {
        mg_config_free(cfg);
        return "(loaded without error)";
    }
    return err_buf;
}

/* clang-format off */
static const char *full_yaml =
    "# a full config\n"                                   /* 1 */
    "server:\n"                                           /* 2 */
    "  listen: 127.0.0.1:0\n"                             /* 3 */
    "  metrics_listen: \"[::1]:9300\"\n"                  /* 4 */
    "  max_body_bytes: 1048576\n"                         /* 5 */
    "  max_header_bytes: 8192\n"                          /* 6 */
    "storage:\n"                                          /* 7 */
    "  path: /tmp/mg.db\n"                                /* 8 */
    "auth:\n"                                             /* 9 */
    "  enabled: true\n"                                   /* 10 */
    "lua:\n"                                              /* 11 */
    "  policies: p\n"                                     /* 12 */
    "  adapters: a\n"                                     /* 13 */
    "  lib: l\n"                                          /* 14 */
    "log:\n"                                              /* 15 */
    "  level: debug\n"                                    /* 16 */
    "upstream:\n"                                         /* 17 */
    "  max_retries: 5\n"                                  /* 18 */
    "timeouts:\n"                                         /* 19 */
    "  connect_ms: 1\n"                                   /* 20 */
    "  first_byte_ms: 2\n"                                /* 21 */
    "  idle_ms: 3\n"                                      /* 22 */
    "  total_ms: 4\n"                                     /* 23 */
    "  header_read_ms: 5\n"                               /* 24 */
    "  keepalive_idle_ms: 6\n"                            /* 25 */
    "  drain_ms: 7\n"                                     /* 26 */
    "models:\n"                                           /* 27: before providers on purpose */
    "  general-chat:\n"                                   /* 28 */
    "    routes:\n"                                       /* 29 */
    "      - { provider: local-vllm, model: qwen3-8b }\n" /* 30 */
    "      - provider: cloud\n"                           /* 31 */
    "        model: gpt-4o-mini\n"                        /* 32 */
    "  embed:\n"                                          /* 33 */
    "    routes: [ { provider: cloud, model: text-embedding-3-small } ]\n" /* 34 */
    "providers:\n"                                        /* 35 */
    "  - id: local-vllm\n"                                /* 36 */
    "    adapter: openai\n"                               /* 37 */
    "    base_url: http://127.0.0.1:8001/v1/\n"           /* 38 */
    "    api_key: literal-key\n"                          /* 39 */
    "    pool: main\n"                                    /* 40 */
    "    rpm_limit: 600\n"                                /* 41 */
    "    tpm_limit: 0\n"                                  /* 42 */
    "    weight: 2.5\n"                                   /* 43 */
    "    local: true\n"                                   /* 44 */
    "  - id: cloud\n"                                     /* 45 */
    "    adapter: openai_v2\n"                            /* 46 */
    "    base_url: https://api.example.com/v1\n"          /* 47 */
    "    pool: fallback\n";                               /* 48 */
/* clang-format on */

static void test_full_config(void)
{
    mg_config_t *c = parse_ok(full_yaml);
    CHECK(c != NULL);
    if (!c) return;
    CHECK_STR(c->path, "t.yaml");
    CHECK_STR(c->listen, "127.0.0.1:0");
    CHECK_STR(c->metrics_listen, "[::1]:9300");
    CHECK_EQ_INT(c->max_body_bytes, 1048576);
    CHECK_EQ_INT(c->max_header_bytes, 8192);
    CHECK_STR(c->storage_path, "/tmp/mg.db");
    CHECK(c->auth_enabled);
    CHECK_STR(c->policies_dir, "p");
    CHECK_STR(c->adapters_dir, "a");
    CHECK_STR(c->lua_dir, "l");
    CHECK_STR(c->log_level, "debug");
    CHECK_EQ_INT(c->max_retries, 5);
    CHECK_EQ_INT(c->timeouts.connect_ms, 1);
    CHECK_EQ_INT(c->timeouts.first_byte_ms, 2);
    CHECK_EQ_INT(c->timeouts.idle_ms, 3);
    CHECK_EQ_INT(c->timeouts.total_ms, 4);
    CHECK_EQ_INT(c->timeouts.header_read_ms, 5);
    CHECK_EQ_INT(c->timeouts.keepalive_idle_ms, 6);
    CHECK_EQ_INT(c->timeouts.drain_ms, 7);

    CHECK_EQ_INT(c->n_providers, 2);
    const mg_provider_conf_t *p = mg_config_provider(c, "local-vllm");
    CHECK(p != NULL);
    if (p) {
        CHECK(p == &c->providers[0]);
        CHECK_STR(p->adapter, "openai");
        CHECK_STR(p->base_url, "http://127.0.0.1:8001/v1"); /* trailing '/' stripped */
        CHECK_STR(p->api_key, "literal-key");
        CHECK_STR(p->pool, "main");
        CHECK_EQ_INT(p->rpm_limit, 600);
        CHECK_EQ_INT(p->tpm_limit, 0);
        CHECK(p->weight == 2.5);
        CHECK(p->local);
        CHECK_EQ_INT(p->line, 36);
    }
    p = mg_config_provider(c, "cloud");
    CHECK(p != NULL);
    if (p) {
        CHECK_STR(p->adapter, "openai_v2");
        CHECK_STR(p->base_url, "https://api.example.com/v1");
        CHECK(p->api_key == NULL);
        CHECK_STR(p->pool, "fallback");
        CHECK_EQ_INT(p->rpm_limit, 0);
        CHECK(p->weight == 1.0);
        CHECK(!p->local);
        CHECK_EQ_INT(p->line, 45);
    }
    CHECK(mg_config_provider(c, "nope") == NULL);
    CHECK(mg_config_provider(NULL, "cloud") == NULL);

    CHECK_EQ_INT(c->n_models, 2);
    const mg_model_conf_t *m = mg_config_model(c, "general-chat");
    CHECK(m != NULL);
    if (m) {
        CHECK_EQ_INT(m->line, 28);
        CHECK_EQ_INT(m->n_routes, 2);
        CHECK_STR(m->routes[0].provider, "local-vllm");
        CHECK_STR(m->routes[0].model, "qwen3-8b");
        CHECK_EQ_INT(m->routes[0].line, 30);
        CHECK_STR(m->routes[1].provider, "cloud");
        CHECK_STR(m->routes[1].model, "gpt-4o-mini");
        CHECK_EQ_INT(m->routes[1].line, 31);
    }
    m = mg_config_model(c, "embed");
    CHECK(m != NULL);
    if (m) {
        CHECK_EQ_INT(m->n_routes, 1);
        CHECK_STR(m->routes[0].model, "text-embedding-3-small");
        CHECK_EQ_INT(m->routes[0].line, 34);
    }
    CHECK(mg_config_model(c, "missing") == NULL);
    mg_config_free(c);
}

static void check_defaults(const mg_config_t *c)
{
    CHECK_STR(c->listen, MG_DEFAULT_LISTEN);
    CHECK_STR(c->metrics_listen, MG_DEFAULT_METRICS_LISTEN);
    CHECK_EQ_INT(c->max_body_bytes, MG_DEFAULT_MAX_BODY_BYTES);
    CHECK_EQ_INT(c->max_header_bytes, 16384);
    CHECK_STR(c->storage_path, "data/moongate.db");
    CHECK_EQ_INT(c->health.retry_down_ms, 30000);
    CHECK(c->routing.panic_threshold == 0.5);
    CHECK(!c->auth_enabled);
    CHECK_STR(c->policies_dir, "policies");
    CHECK_STR(c->adapters_dir, "adapters");
    CHECK_STR(c->lua_dir, "lua");
    CHECK_STR(c->log_level, "info");
    CHECK_EQ_INT(c->max_retries, 3);
    CHECK_EQ_INT(c->timeouts.connect_ms, 5000);
    CHECK_EQ_INT(c->timeouts.first_byte_ms, 60000);
    CHECK_EQ_INT(c->timeouts.idle_ms, 30000);
    CHECK_EQ_INT(c->timeouts.total_ms, 600000);
    CHECK_EQ_INT(c->timeouts.header_read_ms, 10000);
    CHECK_EQ_INT(c->timeouts.keepalive_idle_ms, 75000);
    CHECK_EQ_INT(c->timeouts.drain_ms, 30000);
    CHECK_EQ_INT(c->request_read_ms, 60000);
    CHECK_EQ_INT(c->min_body_bytes_per_s, 1024);
    CHECK_EQ_INT(c->write_timeout_ms, 30000);
    CHECK_EQ_INT(c->max_connections, 0);
    CHECK_EQ_INT(c->reserved_connections, 16);
    CHECK_EQ_INT(c->n_providers, 0);
    CHECK_EQ_INT(c->n_models, 0);
}

static void test_defaults(void)
{
    static const char *const docs[] = {
        "",
        "# only a comment\n",
        "---\n",
        "server:\nstorage:\nauth:\nlua:\nlog:\nupstream:\ntimeouts:\nproviders:\nmodels:\n",
        "server: {}\nproviders: []\nmodels: {}\n",
    };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        mg_config_t *c = parse_ok(docs[i]);
        CHECK(c != NULL);
        if (c) check_defaults(c);
        mg_config_free(c);
    }
    /* Partial sections keep the other defaults. */
    mg_config_t *c = parse_ok("timeouts:\n  idle_ms: 99\nserver:\n  listen: localhost:8080\n");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->timeouts.idle_ms, 99);
        CHECK_EQ_INT(c->timeouts.connect_ms, 5000);
        CHECK_STR(c->listen, "localhost:8080");
        CHECK_STR(c->metrics_listen, MG_DEFAULT_METRICS_LISTEN);
    }
    mg_config_free(c);
    /* metrics_listen: null (or "") disables the metrics listener. */
    c = parse_ok("server:\n  metrics_listen: ~\n");
    CHECK(c && c->metrics_listen == NULL);
    mg_config_free(c);
    c = parse_ok("server:\n  metrics_listen: \"\"\n");
    CHECK(c && c->metrics_listen == NULL);
    mg_config_free(c);
    mg_config_free(NULL); /* allowed */
}

static void test_env_expansion(void)
{
    setenv("MGT_HOST", "10.0.0.7", 1);
    setenv("MGT_PORT", "8123", 1);
    setenv("MGT_KEY", "sk-test-123", 1);
    setenv("MGT_EMPTY", "", 1);
    setenv("MGT_RPM", "42", 1);
    setenv("MGT_TRUE", "true", 1);
    unsetenv("MGT_UNSET");
    mg_config_t *c = parse_ok("server:\n"
                              "  listen: ${MGT_HOST}:${MGT_PORT}\n"
                              "storage:\n"
                              "  path: \"/var/${MGT_HOST}/db-${MGT_PORT}.sqlite\"\n"
                              "providers:\n"
                              "  - id: a\n"
                              "    adapter: openai\n"
                              "    base_url: http://${MGT_HOST}:${MGT_PORT}/v1/\n"
                              "    api_key: ${MGT_KEY}\n"
                              "    rpm_limit: ${MGT_RPM}\n"
                              "    local: ${MGT_TRUE}\n"
                              "  - id: b\n"
                              "    adapter: openai\n"
                              "    base_url: http://h\n"
                              "    api_key: ${MGT_UNSET}\n"
                              "  - id: c\n"
                              "    adapter: openai\n"
                              "    base_url: http://h\n"
                              "    api_key: Bearer-${MGT_EMPTY}\n"
                              "  - id: d\n"
                              "    adapter: openai\n"
                              "    base_url: http://h\n"
                              "    api_key: \"pre-${MGT_KEY}-post $HOME $ {x}\"\n");
    CHECK(c != NULL);
    if (c) {
        CHECK_STR(c->listen, "10.0.0.7:8123");
        CHECK_STR(c->storage_path, "/var/10.0.0.7/db-8123.sqlite");
        CHECK_STR(c->providers[0].base_url, "http://10.0.0.7:8123/v1");
        CHECK_STR(c->providers[0].api_key, "sk-test-123");
        CHECK_EQ_INT(c->providers[0].rpm_limit, 42);
        CHECK(c->providers[0].local);
        CHECK(c->providers[1].api_key == NULL); /* undefined: no key */
        CHECK(c->providers[2].api_key == NULL); /* empty: no key */
        CHECK_STR(c->providers[3].api_key, "pre-sk-test-123-post $HOME $ {x}");
    }
    mg_config_free(c);

    /* Undefined variables are errors everywhere else, naming the variable and the line. */
    CHECK_STR(parse_err("server:\n  listen: ${MGT_UNSET}:80\n"),
              "t.yaml:2: undefined environment variable 'MGT_UNSET' in server.listen");
    CHECK_STR(
        parse_err("models:\n  m:\n    routes:\n      - {provider: a, model: \"${MGT_UNSET}\"}\n"),
        "t.yaml:4: undefined environment variable 'MGT_UNSET' in models.m.routes[0].model");
    CHECK_STR(parse_err("log:\n  level: ${MGT_LEVEL\n"), "t.yaml:2: unterminated ${ in log.level");
    CHECK_STR(parse_err("log:\n  level: ${1X}\n"),
              "t.yaml:2: invalid environment variable reference in log.level (expected ${NAME})");
    /* A defined but empty variable in a required string leaves it empty. */
    CHECK_STR(parse_err("storage:\n  path: ${MGT_EMPTY}\n"),
              "t.yaml:2: storage.path must not be empty");
}

/* The api_key's value (or the env var it names) never appears in an error. */
static void test_secret_not_in_errors(void)
{
    setenv("MGT_SECRET", "sk-super-secret", 1);
    const char *e = parse_err("providers:\n"
                              "  - id: a\n"
                              "    adapter: openai\n"
                              "    base_url: http://h\n"
                              "    api_key: sk-inline-secret-${MGT_SECRET\n");
    CHECK_STR(e, "t.yaml:5: unterminated ${ in providers[0].api_key");
    e = parse_err("providers:\n"
                  "  - id: a\n"
                  "    adapter: openai\n"
                  "    base_url: http://h\n"
                  "    api_key: [sk-inline-secret]\n");
    CHECK_STR(e, "t.yaml:5: providers[0].api_key must be a string");
    e = parse_err("providers:\n"
                  "  - id: a\n"
                  "    adapter: openai\n"
                  "    base_url: http://h\n"
                  "    api_key: sk-inline-secret-${MGT_SECRET}\n"
                  "    weight: 0\n");
    CHECK(strstr(e, "secret") == NULL);
    CHECK_STR(e, "t.yaml:6: providers[0].weight must be greater than 0 and at most 1e+06");
}

static void test_type_errors(void)
{
    CHECK_STR(parse_err("server: 5\n"), "t.yaml:1: server must be a mapping");
    CHECK_STR(parse_err("server: [a]\n"), "t.yaml:1: server must be a mapping");
    CHECK_STR(parse_err("- a\n- b\n"), "t.yaml:1: the top level must be a mapping of sections");
    CHECK_STR(parse_err("server:\n  listen: [a, b]\n"), "t.yaml:2: server.listen must be a string");
    CHECK_STR(parse_err("server:\n  listen:\n"), "t.yaml:2: server.listen must be a string");
    CHECK_STR(parse_err("server:\n\n  max_body_bytes: lots\n"),
              "t.yaml:3: server.max_body_bytes must be an integer");
    CHECK_STR(parse_err("server:\n  max_body_bytes: 12.5\n"),
              "t.yaml:2: server.max_body_bytes must be an integer");
    CHECK_STR(parse_err("server:\n  max_body_bytes: 1023\n"),
              "t.yaml:2: server.max_body_bytes must be between 1024 and 1073741824");
    CHECK_STR(parse_err("server:\n  max_body_bytes: 1073741825\n"),
              "t.yaml:2: server.max_body_bytes must be between 1024 and 1073741824");
    CHECK_STR(parse_err("server:\n  max_header_bytes: 2000000\n"),
              "t.yaml:2: server.max_header_bytes must be between 1024 and 1048576");
    CHECK_STR(parse_err("server:\n  max_header_bytes: 99999999999999999999999\n"),
              "t.yaml:2: server.max_header_bytes must be an integer");
    CHECK_STR(parse_err("server:\n  request_read_ms: 0\n"),
              "t.yaml:2: server.request_read_ms must be between 1 and 86400000");
    CHECK_STR(parse_err("server:\n  min_body_bytes_per_s: -1\n"),
              "t.yaml:2: server.min_body_bytes_per_s must be between 0 and 1073741824");
    CHECK_STR(parse_err("server:\n  max_connections: many\n"),
              "t.yaml:2: server.max_connections must be an integer");
    CHECK_STR(parse_err("server:\n  reserved_connections: 10001\n"),
              "t.yaml:2: server.reserved_connections must be between 0 and 10000");
    mg_config_t *sc = parse_ok("server:\n  request_read_ms: 5000\n  min_body_bytes_per_s: 0\n"
                               "  write_timeout_ms: 0\n  max_connections: 100\n"
                               "  reserved_connections: 2\n");
    CHECK(sc != NULL);
    if (sc) {
        CHECK_EQ_INT(sc->request_read_ms, 5000);
        CHECK_EQ_INT(sc->min_body_bytes_per_s, 0);
        CHECK_EQ_INT(sc->write_timeout_ms, 0);
        CHECK_EQ_INT(sc->max_connections, 100);
        CHECK_EQ_INT(sc->reserved_connections, 2);
    }
    mg_config_free(sc);
    CHECK_STR(parse_err("storage:\n  path: {a: b}\n"), "t.yaml:2: storage.path must be a string");
    CHECK_STR(parse_err("storage:\n  path: \"\"\n"), "t.yaml:2: storage.path must not be empty");
    CHECK_STR(parse_err("auth:\n  enabled: maybe\n"),
              "t.yaml:2: auth.enabled must be true or false");
    CHECK_STR(parse_err("auth:\n  enabled:\n"), "t.yaml:2: auth.enabled must be true or false");
    CHECK_STR(parse_err("lua:\n  lib: [x]\n"), "t.yaml:2: lua.lib must be a string");
    CHECK_STR(parse_err("log:\n  level: verbose\n"),
              "t.yaml:2: log.level must be one of debug, info, warn, error (got 'verbose')");
    CHECK_STR(parse_err("upstream:\n  max_retries: 0\n"),
              "t.yaml:2: upstream.max_retries must be between 1 and 10");
    CHECK_STR(parse_err("upstream:\n  max_retries: 11\n"),
              "t.yaml:2: upstream.max_retries must be between 1 and 10");
    CHECK_STR(parse_err("timeouts:\n  connect_ms: 10\n  drain_ms: 0\n"),
              "t.yaml:3: timeouts.drain_ms must be between 1 and 86400000");
    CHECK_STR(parse_err("timeouts:\n  idle_ms: -5\n"),
              "t.yaml:2: timeouts.idle_ms must be between 1 and 86400000");
    CHECK_STR(parse_err("providers: {id: a}\n"), "t.yaml:1: providers must be a list");
    CHECK_STR(parse_err("providers:\n  - just-a-string\n"),
              "t.yaml:2: providers[0] must be a mapping");
    CHECK_STR(parse_err("models: [a]\n"),
              "t.yaml:1: models must be a mapping of model names to {routes: [...]}");

    /* Booleans accept YAML 1.1's spellings. */
    mg_config_t *c = parse_ok("auth:\n  enabled: yes\n");
    CHECK(c && c->auth_enabled);
    mg_config_free(c);
    c = parse_ok("auth:\n  enabled: \"False\"\n");
    CHECK(c && !c->auth_enabled);
    mg_config_free(c);
}

#define PROV(extra) "providers:\n  - id: p\n    adapter: openai\n    base_url: http://h/v1\n" extra

static void test_provider_errors(void)
{
    CHECK_STR(parse_err("providers:\n  - adapter: openai\n    base_url: http://h\n"),
              "t.yaml:2: providers[0] is missing required key 'id'");
    CHECK_STR(parse_err("providers:\n  - id: a\n    base_url: http://h\n"),
              "t.yaml:2: providers[0] is missing required key 'adapter'");
    CHECK_STR(parse_err("providers:\n  - id: a\n    adapter: openai\n"),
              "t.yaml:2: providers[0] is missing required key 'base_url'");
    CHECK_STR(parse_err("providers:\n  - id: a b\n    adapter: openai\n    base_url: http://h\n"),
              "t.yaml:2: providers[0].id 'a b' is invalid (letters, digits, '.', '_', '-'; at "
              "most 128)");
    CHECK_STR(parse_err("providers:\n  - id: a\n    adapter: ../x\n    base_url: http://h\n"),
              "t.yaml:3: providers[0].adapter '../x' is invalid (letters, digits, '_', '-')");
    CHECK_STR(parse_err("providers:\n  - id: a\n    adapter: openai\n    base_url: ftp://h\n"),
              "t.yaml:4: providers[0].base_url must start with http:// or https://");
    CHECK_STR(parse_err("providers:\n  - id: a\n    adapter: openai\n    base_url: https:///\n"),
              "t.yaml:4: providers[0].base_url has no host");
    CHECK_STR(
        parse_err("providers:\n  - id: a\n    adapter: openai\n    base_url: http://h/?x=1\n"),
        "t.yaml:4: providers[0].base_url must not contain spaces, control characters, '?' "
        "or '#'");
    CHECK_STR(parse_err(PROV("    pool: backup\n")),
              "t.yaml:5: providers[0].pool must be main or fallback (got 'backup')");
    CHECK_STR(parse_err(PROV("    rpm_limit: -1\n")),
              "t.yaml:5: providers[0].rpm_limit must be between 0 and 2147483647");
    CHECK_STR(parse_err(PROV("    tpm_limit: many\n")),
              "t.yaml:5: providers[0].tpm_limit must be an integer");
    CHECK_STR(parse_err(PROV("    weight: -2\n")),
              "t.yaml:5: providers[0].weight must be greater than 0 and at most 1e+06");
    CHECK_STR(parse_err(PROV("    weight: heavy\n")),
              "t.yaml:5: providers[0].weight must be a number");
    CHECK_STR(parse_err(PROV("    weight: .nan\n")),
              "t.yaml:5: providers[0].weight must be a number");
    CHECK_STR(parse_err(PROV("    local: 2\n")),
              "t.yaml:5: providers[0].local must be true or false");

    /* The second provider is reported with its own index and line. */
    CHECK_STR(parse_err(PROV("  - id: q\n    adapter: openai\n    base_url: http://h\n"
                             "    pool: other\n")),
              "t.yaml:8: providers[1].pool must be main or fallback (got 'other')");
}

static void test_unknown_keys(void)
{
    CHECK_STR(parse_err("server:\n  listen: 127.0.0.1:1\n  foo: 1\n"),
              "t.yaml:3: unknown key 'foo' in server");
    CHECK_STR(parse_err("log:\n  level: info\nserevr:\n  listen: x\n"),
              "t.yaml:3: unknown key 'serevr' at top level");
    CHECK_STR(parse_err("timeouts:\n  conect_ms: 5\n"),
              "t.yaml:2: unknown key 'conect_ms' in timeouts");
    CHECK_STR(parse_err(PROV("    api-key: sk-should-not-matter\n")),
              "t.yaml:5: unknown key 'api-key' in providers[0]");
    CHECK_STR(parse_err(PROV("models:\n  m:\n    routes: [{provider: p, model: x}]\n"
                             "    fallback: yes\n")),
              "t.yaml:8: unknown key 'fallback' in models.m");
    CHECK_STR(parse_err(PROV("models:\n  m:\n    routes:\n      - provider: p\n        model: x\n"
                             "        weight: 2\n")),
              "t.yaml:10: unknown key 'weight' in models.m.routes[0]");
    CHECK_STR(parse_err("storage: {path: a, size: 3}\n"),
              "t.yaml:1: unknown key 'size' in storage");
    CHECK_STR(parse_err("server:\n  [a]: b\n"), "t.yaml:2: keys must be strings in server");
}

static void test_duplicate_keys(void)
{
    CHECK_STR(parse_err("server:\n  listen: 127.0.0.1:1\n  listen: 127.0.0.1:2\n"),
              "t.yaml:3: duplicate key 'listen' in server");
    CHECK_STR(parse_err("log:\n  level: info\nauth: {}\nlog:\n  level: warn\n"),
              "t.yaml:4: duplicate key 'log' at top level");
    CHECK_STR(parse_err(PROV("models:\n  m:\n    routes: [{provider: p, model: x}]\n"
                             "  n:\n    routes: [{provider: p, model: x}]\n"
                             "  m:\n    routes: [{provider: p, model: y}]\n")),
              "t.yaml:10: duplicate key 'm' in models");
    CHECK_STR(parse_err(PROV("    weight: 1\n    weight: 2\n")),
              "t.yaml:6: duplicate key 'weight' in providers[0]");
}

static void test_duplicate_provider_ids(void)
{
    CHECK_STR(parse_err("providers:\n"
                        "  - id: a\n"
                        "    adapter: openai\n"
                        "    base_url: http://h\n"
                        "  - id: b\n"
                        "    adapter: openai\n"
                        "    base_url: http://h\n"
                        "  - {id: a, adapter: ollama, base_url: http://h2}\n"),
              "t.yaml:8: duplicate provider id 'a' (first defined at line 2)");
}

static void test_routes(void)
{
    CHECK_STR(parse_err(PROV("models:\n"
                             "  chat:\n"
                             "    routes:\n"
                             "      - { provider: p, model: m1 }\n"
                             "      - { provider: ghost, model: m2 }\n")),
              "t.yaml:9: models.chat.routes[1]: unknown provider 'ghost'");
    /* No providers at all: any route is to an unknown provider. */
    CHECK_STR(parse_err("models:\n  chat:\n    routes:\n      - provider: p\n        model: x\n"),
              "t.yaml:4: models.chat.routes[0]: unknown provider 'p'");
    CHECK_STR(parse_err(PROV("models:\n  chat:\n    routes: []\n")),
              "t.yaml:7: models.chat.routes must have at least one route");
    CHECK_STR(parse_err(PROV("models:\n  chat:\n    routes:\n")),
              "t.yaml:7: models.chat.routes must be a list");
    CHECK_STR(parse_err(PROV("models:\n  chat: {}\n")),
              "t.yaml:6: models.chat is missing required key 'routes'");
    CHECK_STR(parse_err(PROV("models:\n  chat:\n")),
              "t.yaml:6: models.chat must be a mapping with routes");
    CHECK_STR(parse_err(PROV("models:\n  chat:\n    routes:\n      - { provider: p }\n")),
              "t.yaml:8: models.chat.routes[0] is missing required key 'model'");
    CHECK_STR(parse_err(PROV("models:\n  chat:\n    routes:\n      - p\n")),
              "t.yaml:8: models.chat.routes[0] must be a mapping with provider and model");
    CHECK_STR(parse_err(PROV("models:\n  \"a b\":\n    routes: [{provider: p, model: x}]\n")),
              "t.yaml:6: model name 'a b' is invalid (no spaces or control characters, at most "
              "256)");

    /* Flow style throughout, and block sequences of flow mappings. */
    mg_config_t *c = parse_ok("providers: [ {id: a, adapter: openai, base_url: 'http://a'},\n"
                              "             {id: b, adapter: ollama, base_url: 'http://b'} ]\n"
                              "models:\n"
                              "  x:\n"
                              "    routes:\n"
                              "      - { provider: a, model: b }\n"
                              "      - { provider: b, model: \"llama3:8b\" }\n"
                              "  y: { routes: [ { provider: b, model: c } ] }\n");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->n_providers, 2);
        CHECK_EQ_INT(c->providers[1].line, 2);
        const mg_model_conf_t *m = mg_config_model(c, "x");
        CHECK(m && m->n_routes == 2);
        if (m && m->n_routes == 2) {
            CHECK_STR(m->routes[0].provider, "a");
            CHECK_STR(m->routes[0].model, "b");
            CHECK_EQ_INT(m->routes[0].line, 6);
            CHECK_STR(m->routes[1].model, "llama3:8b");
            CHECK_EQ_INT(m->routes[1].line, 7);
        }
        m = mg_config_model(c, "y");
        CHECK(m && m->n_routes == 1 && m->line == 8);
    }
    mg_config_free(c);
}

/* mg_config_link_routes: each route's provider found at its hint, also after providers
 * are added (the array moves); a wrong or unset hint still finds it by id. */
static void test_route_provider_hints(void)
{
    mg_config_t *c = parse_ok("providers: [ {id: a, adapter: openai, base_url: 'http://a'},\n"
                              "             {id: b, adapter: openai, base_url: 'http://b'},\n"
                              "             {id: c, adapter: openai, base_url: 'http://c'} ]\n"
                              "models:\n"
                              "  x: { routes: [ {provider: c, model: m},\n"
                              "                 {provider: a, model: m} ] }\n"
                              "  y: { routes: [ {provider: b, model: m} ] }\n");
    CHECK(c != NULL);
    if (!c) return;
    mg_config_link_routes(c);
    mg_route_conf_t *x = c->models[0].routes, *y = c->models[1].routes;
    CHECK(x[0].provider_hint == 2 && x[1].provider_hint == 0 && y[0].provider_hint == 1);
    CHECK(x[0].linked == &c->providers[2] && y[0].linked == &c->providers[1]);
    CHECK(mg_config_route_provider(c, &x[0]) == &c->providers[2]);
    mg_provider_conf_t d = {.id = "d", .adapter = "openai", .base_url = "http://d"};
    CHECK_EQ_INT(mg_config_add_provider(c, &d, err_buf, sizeof err_buf), 0);
    CHECK(mg_config_route_provider(c, &x[0]) == &c->providers[2]);
    CHECK(mg_config_route_provider(c, &y[0]) == &c->providers[1]);
    x[1].provider_hint = 3; /* stale: provider d is there now */
    CHECK(mg_config_route_provider(c, &x[1]) == &c->providers[0]);
    x[1].provider_hint = 99;
    CHECK(mg_config_route_provider(c, &x[1]) == &c->providers[0]);
    mg_route_conf_t ghost = {.provider = "ghost", .model = "m"};
    CHECK(mg_config_route_provider(c, &ghost) == NULL);
    mg_config_free(c);
}

static void test_listen(void)
{
    static const char *const good[] = {"127.0.0.1:0",          "0.0.0.0:65535", "localhost:8080",
                                       "[::1]:9190",           "[::]:0",        "my-host.lan:1",
                                       "[::ffff:127.0.0.1]:80"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char yaml[128];
        snprintf(yaml, sizeof yaml, "server:\n  listen: \"%s\"\n", good[i]);
        mg_config_t *c = parse_ok(yaml);
        CHECK(c != NULL);
        if (c) CHECK_STR(c->listen, good[i]);
        mg_config_free(c);
    }
    static const char *const bad[] = {
        "127.0.0.1", "127.0.0.1:", ":9190",  "127.0.0.1:65536", "host:80x", "::1:80",  "[::1]80",
        "[]:80",     "[::1]:",     "a b:80", "h:123456",        "[zz]:80",  "[1.2]:80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char yaml[128], want[256];
        snprintf(yaml, sizeof yaml, "# c\nserver:\n  listen: \"%s\"\n", bad[i]);
        snprintf(want, sizeof want,
                 "t.yaml:3: server.listen: invalid address '%s' (expected host:port, port "
                 "0-65535, IPv6 as [addr]:port)",
                 bad[i]);
        CHECK_STR(parse_err(yaml), want);
    }
    CHECK_STR(parse_err("server:\n  metrics_listen: nope\n"),
              "t.yaml:2: server.metrics_listen: invalid address 'nope' (expected host:port, port "
              "0-65535, IPv6 as [addr]:port)");
    CHECK_STR(parse_err("server:\n  listen: 127.0.0.1:7000\n  metrics_listen: 127.0.0.1:7000\n"),
              "t.yaml:3: server.metrics_listen must differ from server.listen");
    /* Both on port 0 is fine: each gets its own free port. */
    mg_config_t *c = parse_ok("server:\n  listen: 127.0.0.1:0\n  metrics_listen: 127.0.0.1:0\n");
    CHECK(c != NULL);
    mg_config_free(c);
}

static void test_yaml_syntax(void)
{
    CHECK_STR(parse_err("server:\n  listen: a: b\n"),
              "t.yaml:2: YAML syntax error: mapping values are not allowed in this context");
    CHECK_STR(parse_err("log:\n  level: info\nmodels: [a, b\n"),
              "t.yaml:4: YAML syntax error: did not find expected ',' or ']' (while parsing a "
              "flow sequence at line 3)");
    CHECK_STR(parse_err("server:\n  listen: *nothing\n"),
              "t.yaml:2: YAML syntax error: found undefined alias");
    CHECK_STR(parse_err("server:\n  listen: \"\xff\"\n"),
              "t.yaml:2: YAML error: invalid leading UTF-8 octet");
    CHECK_STR(parse_err("log: {level: info}\n---\nlog: {level: warn}\n"),
              "t.yaml:3: only one YAML document is allowed");
    /* A NUL in a double-quoted scalar cannot become a C string. */
    CHECK_STR(parse_err("storage:\n  path: \"a\\0b\"\n"),
              "t.yaml:2: storage.path contains a NUL character");
}

/* Aliases are shared nodes; a small file must not expand into a huge config. */
static void test_alias_budget(void)
{
    static char yaml[32768];
    size_t n = (size_t)snprintf(yaml, sizeof yaml,
                                "providers: [{id: p, adapter: a, base_url: 'http://h'}]\n"
                                "models:\n  m0:\n    routes: &r [");
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(yaml + n, sizeof yaml - n, "%s{provider: p, model: x}", i ? "," : "");
    n += (size_t)snprintf(yaml + n, sizeof yaml - n, "]\n");
    for (int i = 1; i < 300; i++)
        n += (size_t)snprintf(yaml + n, sizeof yaml - n, "  m%d: {routes: *r}\n", i);
    CHECK(n < sizeof yaml);
    const char *e = parse_err(yaml);
    CHECK(strstr(e, "configuration expands too much (aliases?)") != NULL);

    /* Modest alias use is fine. */
    mg_config_t *c = parse_ok("providers: [{id: p, adapter: a, base_url: 'http://h'}]\n"
                              "models:\n  a: {routes: &r [{provider: p, model: x}]}\n"
                              "  b: {routes: *r}\n");
    CHECK(c && c->n_models == 2 && c->models[1].n_routes == 1);
    mg_config_free(c);
}

static void test_load_file(void)
{
    char path[] = "/tmp/mg_test_config_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const char *yaml = "log:\n  level: warn\nupstream:\n  max_retries: 99\n";
    CHECK(write(fd, yaml, strlen(yaml)) == (ssize_t)strlen(yaml));
    close(fd);
    mg_config_t *c = (mg_config_t *)1;
    char err[512], want[600];
    CHECK_EQ_INT(mg_config_load(path, &c, err, sizeof err), -1);
    CHECK(c == NULL);
    snprintf(want, sizeof want, "%s:4: upstream.max_retries must be between 1 and 10", path);
    CHECK_STR(err, want);

    fd = open(path, O_WRONLY | O_TRUNC);
    yaml = "log:\n  level: warn\n";
    CHECK(fd >= 0 && write(fd, yaml, strlen(yaml)) == (ssize_t)strlen(yaml));
    close(fd);
    CHECK_EQ_INT(mg_config_load(path, &c, err, sizeof err), 0);
    if (c) {
        CHECK_STR(c->path, path);
        CHECK_STR(c->log_level, "warn");
    }
    mg_config_free(c);

    /* Over 4 MiB is refused before parsing; exactly 4 MiB of comments is fine. */
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        for (int i = 0; i < 4 * 1024 * 1024 / 8; i++) fputs("# 45678\n", f);
        fclose(f);
        CHECK_EQ_INT(mg_config_load(path, &c, err, sizeof err), 0);
        mg_config_free(c);
        f = fopen(path, "ab");
        fputs("\n", f);
        fclose(f);
        CHECK_EQ_INT(mg_config_load(path, &c, err, sizeof err), -1);
        snprintf(want, sizeof want, "%s: file too large (more than 4194304 bytes)", path);
        CHECK_STR(err, want);
    }
    unlink(path);

    CHECK_EQ_INT(mg_config_load("/nonexistent/mg.yaml", &c, err, sizeof err), -1);
    CHECK_STR(err, "/nonexistent/mg.yaml: cannot open: No such file or directory");
    /* A NULL or tiny error buffer is tolerated. */
    CHECK_EQ_INT(mg_config_load("/nonexistent/mg.yaml", &c, NULL, 0), -1);
    CHECK_EQ_INT(mg_config_parse("x", "server: 1", 9, &c, err, 4), -1);
    CHECK_STR(err, "x:1");
}

/* context: defaults, every key, bad values with file and line; models' window and reserve. */
static void test_context_section(void)
{
    mg_config_t *c = parse_ok("server:\n  listen: 127.0.0.1:1\n");
    if (c) {
        CHECK(c->context.safety_margin_ratio > 0.079 && c->context.safety_margin_ratio < 0.081);
        CHECK_STR(c->context.default_policy, "summary_and_recent");
        CHECK_EQ_INT(c->context.max_session_messages, 200);
        CHECK_EQ_INT(c->context.session_idle_ttl_minutes, 60);
        CHECK(!c->context.enable_prompt_persistence && !c->context.busy_reject);
        CHECK(c->context.summarizer_model == NULL);
        mg_config_free(c);
    }
    c = parse_ok("context:\n  safety_margin_ratio: 0\n  default_policy: none\n"
                 "  max_session_messages: 10\n  session_idle_ttl_minutes: 5\n"
                 "  session_ttl_minutes: 50\n  enable_prompt_persistence: true\n"
                 "  memory_budget_bytes: 8192\n  busy: reject\n  append_on_failure: user_turn\n"
                 "  platform_rules: be kind\n  summarizer_model: s\n  summary_timeout_ms: 500\n"
                 "  summary_max_tokens: 64\n  summary_prompt: fold it\n");
    if (c) {
        CHECK(c->context.safety_margin_ratio == 0);
        CHECK_STR(c->context.default_policy, "none");
        CHECK_EQ_INT(c->context.max_session_messages, 10);
        CHECK_EQ_INT(c->context.session_ttl_minutes, 50);
        CHECK(c->context.enable_prompt_persistence && c->context.busy_reject);
        CHECK(c->context.append_user_on_failure);
        CHECK_EQ_INT((int)c->context.memory_budget_bytes, 8192);
        CHECK_STR(c->context.platform_rules, "be kind");
        CHECK_STR(c->context.summarizer_model, "s");
        CHECK_STR(c->context.summary_prompt, "fold it");
        CHECK_EQ_INT(c->context.summary_timeout_ms, 500);
        CHECK_EQ_INT(c->context.summary_max_tokens, 64);
        mg_config_free(c);
    }
    CHECK_STR(
        parse_err("context:\n  default_policy: magic\n"),
        "t.yaml:2: context.default_policy must be one of summary_and_recent, recent_only, none");
    CHECK_STR(parse_err("context:\n  safety_margin_ratio: 0.95\n"),
              "t.yaml:2: context.safety_margin_ratio must be at least 0 and at most 0.9");
    CHECK_STR(parse_err("context:\n  colour: red\n"), "t.yaml:2: unknown key 'colour' in context");
    /* the other small sections, read by the same loader */
    CHECK_STR(parse_err("protocols:\n  ping_interval_ms: 50\n"),
              "t.yaml:1: protocols.ping_interval_ms must be 0 (off) or 100..3600000 milliseconds");
    CHECK_STR(parse_err("protocols:\n  forward_headers: {anthropic: [x-api-key]}\n"),
              "t.yaml:2: protocols.forward_headers: credentials and framing headers "
              "(authorization, x-api-key, cookie, host, content-length) are never forwarded");
    CHECK(strstr(parse_err("protocols:\n  models_refresh_seconds: -1\n"),
                 "protocols.models_refresh_seconds") != NULL);
    CHECK_STR(parse_err("protocols:\n  forward_headers: {a: [x], a: [y]}\n"),
              "t.yaml:2: duplicate key 'a' in protocols.forward_headers");
    CHECK_STR(parse_err("billing:\n  webhook_tolerance_s: 0\n"),
              "t.yaml:2: billing.webhook_tolerance_s must be between 1 and 86400");
    CHECK_STR(
        parse_err("billing:\n  webhook_secret: ${MG_TEST_UNSET_SECRET_VAR}\n"),
        "t.yaml:2: undefined environment variable 'MG_TEST_UNSET_SECRET_VAR' in billing.webhook_secret");
    CHECK_STR(parse_err("dashboard:\n  max_streams: 0\n"),
              "t.yaml:2: dashboard.max_streams must be between 1 and 256");
    CHECK_STR(parse_err("context: 3\n"), "t.yaml:1: context must be a mapping");
    c = parse_ok(
        "providers:\n  - {id: p, adapter: openai, base_url: http://127.0.0.1:1/v1}\n"
        "models:\n  m:\n    context_window: 4096\n    max_output_tokens: 256\n"
        "    routes: [{provider: p, model: x}, {provider: p, model: y, context_window: 2048}]\n");
    if (c) {
        CHECK_EQ_INT(c->models[0].routes[0].context_window, 0);
        CHECK_EQ_INT(c->models[0].routes[1].context_window, 2048);
        CHECK_EQ_INT(c->models[0].context_window, 4096);
        CHECK_EQ_INT(c->models[0].max_output_tokens, 256);
        mg_config_free(c);
    }
}

/* The shipped example must always load. */
static void test_example_file(void)
{
    unsetenv("OPENAI_API_KEY");
    mg_config_t *c = NULL;
    char err[512] = "";
    int rc = mg_config_load(MG_SOURCE_DIR "/config/moongate.example.yaml", &c, err, sizeof err);
    if (rc) fprintf(stderr, "  example: %s\n", err);
    CHECK_EQ_INT(rc, 0);
    if (!c) return;
    CHECK_EQ_INT(c->n_providers, 3);
    CHECK_EQ_INT(c->n_models, 2);
    const mg_provider_conf_t *cloud = NULL;
    for (size_t i = 0; i < c->n_providers; i++)
        if (!strcmp(c->providers[i].pool, "fallback")) cloud = &c->providers[i];
    CHECK(cloud != NULL && cloud->api_key == NULL);
    mg_config_free(c);

    setenv("OPENAI_API_KEY", "sk-example", 1);
    CHECK_EQ_INT(mg_config_load(MG_SOURCE_DIR "/config/moongate.example.yaml", &c, err, sizeof err),
                 0);
    if (c) {
        for (size_t i = 0; i < c->n_providers; i++)
            if (!strcmp(c->providers[i].pool, "fallback"))
                CHECK_STR(c->providers[i].api_key, "sk-example");
    }
    mg_config_free(c);
    unsetenv("OPENAI_API_KEY");
}

/* The sections pools, scheduling and tenancy added: values, defaults and errors. */
static void test_operational_sections(void)
{
    mg_config_t *c =
        parse_ok("providers:\n"
                 "  - { id: p, adapter: openai, base_url: http://h/v1, engine: vllm,\n"
                 "      model_prefix: \"nv/\", name: \"NIM key 2\" }\n"
                 "models:\n"
                 "  m:\n"
                 "    max_concurrency: 2\n"
                 "    kv_cache_per_token_bytes: 131072\n"
                 "    routes: [ { provider: p, model: x, smaller: true, priority: 3 } ]\n"
                 "scheduler:\n"
                 "  max_running_tasks: 4\n"
                 "  overflow_status: 503\n"
                 "  priority_weights: [9, 8, 7, 6, 5]\n"
                 "  vram_bytes: 24000000000\n"
                 "routing: { local_first: false, queue_timeout_ms: 1500 }\n"
                 "circuit_breaker: { consecutive_failures: 5 }\n"
                 "health: { probes: false }\n"
                 "protocols: { models_refresh_seconds: 30 }\n"
                 "tasks: { retention_seconds: 120 }\n"
                 "idempotency: { ttl_seconds: 60 }\n"
                 "applications:\n"
                 "  sec: { max_running_tasks: 2, allowed_priorities: [P0, P1],\n"
                 "         allowed_models: [m1, m2],\n"
                 "         data_policy: { allow_cloud: false } }\n"
                 "users: { default_max_running_tasks: 1 }\n");
    CHECK(c != NULL);
    if (c) {
        CHECK_STR(c->providers[0].engine, "vllm");
        CHECK_STR(c->providers[0].model_prefix, "nv/");
        CHECK_STR(c->providers[0].name, "NIM key 2");
        CHECK_EQ_INT(c->protocols.models_refresh_s, 30);
        CHECK_EQ_INT(c->models[0].max_concurrency, 2);
        CHECK_EQ_INT(c->models[0].kv_cache_per_token_bytes, 131072);
        CHECK(c->models[0].routes[0].smaller);
        CHECK_EQ_INT(c->models[0].routes[0].priority, 3);
        CHECK_EQ_INT(c->scheduler.max_running_tasks, 4);
        CHECK_EQ_INT(c->scheduler.overflow_status, 503);
        CHECK_EQ_INT(c->scheduler.weights[0], 9);
        CHECK_EQ_INT(c->scheduler.weights[4], 5);
        CHECK(c->scheduler.vram_bytes == 24000000000LL);
        CHECK(!c->routing.local_first);
        CHECK_EQ_INT(c->routing.queue_timeout_ms, 1500);
        CHECK_EQ_INT(c->breaker.consecutive_failures, 5);
        CHECK(!c->health.probes);
        CHECK_EQ_INT(c->tasks_retention_seconds, 120);
        CHECK_EQ_INT(c->idempotency_ttl_seconds, 60);
        const mg_app_conf_t *a = mg_config_app(c, "sec");
        CHECK(a != NULL);
        if (a) {
            CHECK_EQ_INT(a->max_running_tasks, 2);
            CHECK_EQ_INT(a->allowed_priorities, 0x3);
            CHECK(a->has_data_policy && !a->allow_cloud);
            CHECK(mg_app_allows_model(a, "m2") && !mg_app_allows_model(a, "m3"));
        }
        CHECK_EQ_INT(c->user_max_running_tasks, 1);
        mg_config_free(c);
    }
    c = parse_ok("");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->scheduler.max_running_tasks, 256);
        CHECK_EQ_INT(c->scheduler.weights[2], 25);
        CHECK_EQ_INT(c->timeouts.queue_ms, 30000);
        CHECK_EQ_INT(c->idempotency_ttl_seconds, 600);
        CHECK(c->routing.local_first);
        mg_config_free(c);
    }
    CHECK(strstr(parse_err("scheduler:\n  overflow_status: 500\n"), "429 or 503") != NULL);
    CHECK(strstr(parse_err("scheduler:\n  priority_weights: [1]\n"), "5 integers") != NULL);
    CHECK(strstr(parse_err("applications:\n  a: { allowed_priorities: [P9] }\n"), "P0..P4") !=
          NULL);
    CHECK(strstr(parse_err("applications:\n  a: { allowed_models: m1 }\n"),
                 "list of model names") != NULL);
    CHECK(strstr(parse_err(
                     "providers:\n  - { id: p, adapter: openai, base_url: http://h, engine: x }\n"),
                 "engine") != NULL);
}

/* The store's write queue and durability, and the idempotency memory cap. */
static void test_storage_and_idempotency_caps(void)
{
    mg_config_t *c = parse_ok("");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->storage_queue_max, 4096);
        CHECK(!c->storage_synchronous_full);
        CHECK_EQ_INT(c->idempotency_max_entries, 10000);
        mg_config_free(c);
    }
    c = parse_ok("storage: { path: /tmp/x.db, queue_max: 8, synchronous: FULL }\n"
                 "idempotency: { max_entries: 3 }\n");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->storage_queue_max, 8);
        CHECK(c->storage_synchronous_full);
        CHECK_EQ_INT(c->idempotency_max_entries, 3);
        mg_config_free(c);
    }
    c = parse_ok("storage: { synchronous: normal }\n");
    CHECK(c && !c->storage_synchronous_full);
    mg_config_free(c);
    CHECK_STR(parse_err("storage:\n  synchronous: off\n"),
              "t.yaml:2: storage.synchronous must be normal or full (got 'off')");
    CHECK_STR(parse_err("storage:\n  queue_max: 0\n"),
              "t.yaml:2: storage.queue_max must be between 1 and 1000000");
    CHECK_STR(parse_err("idempotency:\n  max_entries: 0\n"),
              "t.yaml:2: idempotency.max_entries must be between 1 and 10000000");
}

/* The store's housekeeping and the log file. */
static void test_storage_upkeep_and_log_file(void)
{
    mg_config_t *c = parse_ok("");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->storage_checkpoint_minutes, 60);
        CHECK_EQ_INT(c->storage_integrity_hours, 24);
        CHECK_EQ_INT(c->storage_journal_mib, 4);
        CHECK(c->storage_backup_dir == NULL);
        CHECK(c->log_file == NULL);
        mg_config_free(c);
    }
    c = parse_ok("storage:\n  checkpoint_minutes: 0\n  integrity_check_hours: 6\n"
                 "  usage_journal_mib: 16\n"
                 "  backup: { dir: /var/backups/mg, every_hours: 12, keep_days: 30 }\n"
                 "log: { file: /var/log/moongate/moongate.log }\n");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->storage_checkpoint_minutes, 0);
        CHECK_EQ_INT(c->storage_integrity_hours, 6);
        CHECK_EQ_INT(c->storage_journal_mib, 16);
        CHECK_STR(c->storage_backup_dir, "/var/backups/mg");
        CHECK_EQ_INT(c->storage_backup_every_hours, 12);
        CHECK_EQ_INT(c->storage_backup_keep_days, 30);
        CHECK_STR(c->log_file, "/var/log/moongate/moongate.log");
        mg_config_free(c);
    }
    CHECK(strstr(parse_err("storage:\n  backup: { every_hours: 1 }\n"),
                 "storage.backup is missing required key 'dir'") != NULL);
    CHECK(strstr(parse_err("storage:\n  backup: { dir: /x, keep_days: 0 }\n"), "keep_days") !=
          NULL);
    CHECK(strstr(parse_err("storage:\n  backup: { dir: /x, wat: 1 }\n"), "wat") != NULL);
    CHECK(strstr(parse_err("storage:\n  usage_journal_mib: 0\n"), "usage_journal_mib") != NULL);
}

/* Memory admission's degrade knobs: scheduler.min_output_tokens, routing.allow_smaller_model,
 * and a smaller route's own memory figures (only a smaller route may have them). */
static void test_memory_degrade_knobs(void)
{
    mg_config_t *c = parse_ok("");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->scheduler.min_output_tokens, 256);
        CHECK(!c->routing.allow_smaller_model);
        mg_config_free(c);
    }
    c = parse_ok("providers:\n"
                 "  - { id: p, adapter: openai, base_url: http://h/v1 }\n"
                 "models:\n"
                 "  m:\n"
                 "    kv_cache_per_token_bytes: 1000\n"
                 "    routes:\n"
                 "      - { provider: p, model: big }\n"
                 "      - { provider: p, model: small, smaller: true, weight_bytes: 5000,\n"
                 "          kv_cache_per_token_bytes: 200 }\n"
                 "scheduler: { min_output_tokens: 0 }\n"
                 "routing: { allow_smaller_model: true }\n");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->scheduler.min_output_tokens, 0);
        CHECK(c->routing.allow_smaller_model);
        CHECK_EQ_INT(c->models[0].routes[0].kv_cache_per_token_bytes, 0);
        CHECK_EQ_INT(c->models[0].routes[1].weight_bytes, 5000);
        CHECK_EQ_INT(c->models[0].routes[1].kv_cache_per_token_bytes, 200);
        mg_config_free(c);
    }
    CHECK(strstr(parse_err("providers:\n  - { id: p, adapter: openai, base_url: http://h/v1 }\n"
                           "models:\n  m:\n    routes: [ { provider: p, model: x,\n"
                           "      kv_cache_per_token_bytes: 5 } ]\n"),
                 "smaller: true") != NULL);
    CHECK(strstr(parse_err("scheduler: { min_output_tokens: -1 }\n"), "min_output_tokens") != NULL);
    CHECK(strstr(parse_err("routing: { allow_smaller_model: 3 }\n"), "allow_smaller_model") !=
          NULL);
}

/* models.<name>.tokenizer: named, "estimate", or by the first route's upstream family. */
static void test_model_tokenizer(void)
{
    const char *yaml = "providers:\n  - {id: p, adapter: openai, base_url: http://127.0.0.1:1/v1}\n"
                       "models:\n"
                       "  a: {routes: [{provider: p, model: gpt-4o-mini}]}\n"
                       "  b: {routes: [{provider: p, model: gpt-4-turbo}]}\n"
                       "  c: {routes: [{provider: p, model: qwen3-8b}]}\n"
                       "  d: {tokenizer: cl100k_base, routes: [{provider: p, model: qwen3-8b}]}\n"
                       "  e: {tokenizer: estimate, routes: [{provider: p, model: gpt-5}]}\n"
                       "  f: {routes: [{provider: p, model: openai/o3-mini}]}\n"
                       "tokenizer: {data_dir: /srv/tok}\n";
    mg_config_t *cfg = parse_ok(yaml);
    CHECK(cfg != NULL);
    if (!cfg) return;
    CHECK_EQ_INT(mg_config_model(cfg, "a")->tokenizer, 1 + MG_ENC_O200K);
    CHECK_EQ_INT(mg_config_model(cfg, "b")->tokenizer, 1 + MG_ENC_CL100K);
    CHECK_EQ_INT(mg_config_model(cfg, "c")->tokenizer, 0);
    CHECK_EQ_INT(mg_config_model(cfg, "d")->tokenizer, 1 + MG_ENC_CL100K);
    CHECK_EQ_INT(mg_config_model(cfg, "e")->tokenizer, 0);
    CHECK_EQ_INT(mg_config_model(cfg, "f")->tokenizer, 1 + MG_ENC_O200K);
    CHECK_STR(cfg->tokenizer_data_dir, "/srv/tok");
    mg_config_free(cfg);
    const char *bad = "providers:\n  - {id: p, adapter: openai, base_url: http://127.0.0.1:1/v1}\n"
                      "models:\n  a: {tokenizer: p50k_base, routes: [{provider: p, model: x}]}\n";
    CHECK(strstr(parse_err(bad), "none of o200k_base, cl100k_base, estimate") != NULL);
}

/* health.retry_down_ms and routing.panic_threshold: 0 switches each off; out of range is
 * refused with the key named. */
static void test_down_trials_and_panic(void)
{
    mg_config_t *c = parse_ok("health: {retry_down_ms: 0}\nrouting: {panic_threshold: 0}\n");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(c->health.retry_down_ms, 0);
        CHECK(c->routing.panic_threshold == 0);
        mg_config_free(c);
    }
    c = parse_ok("routing: {panic_threshold: 0.25}\n");
    CHECK(c && c->routing.panic_threshold == 0.25);
    mg_config_free(c);
    CHECK(strstr(parse_err("routing: {panic_threshold: 1.5}\n"), "panic_threshold") != NULL);
    CHECK(strstr(parse_err("health: {retry_down_ms: -1}\n"), "retry_down_ms") != NULL);
}

/* cluster: urls from the environment, never shown in errors; node_id defaults to host:port. */
static void test_cluster_section(void)
{
    mg_config_t *cfg = parse_ok("server:\n  listen: 127.0.0.1:8123\n");
    CHECK(cfg != NULL);
    if (cfg) {
        CHECK(cfg->cluster.redis.url == NULL && cfg->cluster.postgres.url == NULL);
        const char *colon = strrchr(cfg->cluster.node_id, ':');
        CHECK(colon && !strcmp(colon, ":8123") && colon > cfg->cluster.node_id);
        mg_config_free(cfg);
    }
    setenv("MGT_REDIS_URL", "redis://:hunter2@127.0.0.1:6390/1", 1);
    cfg = parse_ok("cluster:\n  node_id: edge-1\n  redis:\n    url: ${MGT_REDIS_URL}\n"
                   "    timeout_ms: 20\n  postgres:\n    url: postgres://u@127.0.0.1/db\n"
                   "    pool_size: 3\n");
    CHECK(cfg != NULL);
    if (cfg) {
        CHECK_STR(cfg->cluster.node_id, "edge-1");
        CHECK_STR(cfg->cluster.redis.url, "redis://:hunter2@127.0.0.1:6390/1");
        CHECK_STR(cfg->cluster.redis.key_prefix, "moongate:");
        CHECK(cfg->cluster.redis.timeout_ms == 20 && cfg->cluster.redis.pool_size == 2);
        CHECK(cfg->cluster.redis.degraded == MG_DEGRADED_LOCAL);
        CHECK(cfg->cluster.redis.expected_instances == 1);
        CHECK(cfg->cluster.redis.lease_ttl_ms == 15000);
        CHECK(cfg->cluster.redis.health_samples); /* shared by default */
        CHECK_STR(cfg->cluster.postgres.url, "postgres://u@127.0.0.1/db");
        CHECK(cfg->cluster.postgres.pool_size == 3);
        mg_config_free(cfg);
    }
    setenv("MGT_REDIS_URL", "http://:hunter2@127.0.0.1/", 1);
    const char *e = parse_err("cluster:\n  redis:\n    url: ${MGT_REDIS_URL}\n");
    CHECK_STR(e, "t.yaml:2: cluster.redis.url must start with redis:// or unix:");
    CHECK(strstr(e, "hunter2") == NULL);
    unsetenv("MGT_REDIS_URL");
    CHECK_STR(parse_err("cluster:\n  redis: {timeout_ms: 5}\n"),
              "t.yaml:2: cluster.redis is missing required key 'url'");
    CHECK_STR(parse_err("cluster:\n  postgres: {url: mysql://x}\n"),
              "t.yaml:2: cluster.postgres.url must be a postgres:// or postgresql:// URL or "
              "key=value connection string");
    CHECK_STR(parse_err("cluster:\n  node_id: \"a b\"\n"),
              "t.yaml:1: cluster.node_id must be 1-128 letters, digits or . _ : - characters");
    cfg = parse_ok("cluster:\n  redis: {url: \"redis://x\", degraded: fail_closed}\n");
    CHECK(cfg && cfg->cluster.redis.degraded == MG_DEGRADED_FAIL_CLOSED);
    if (cfg) mg_config_free(cfg);
    cfg = parse_ok("cluster:\n  redis: {url: \"redis://x\", degraded: fail_open, "
                   "expected_instances: 3, lease_ttl_ms: 3000}\n");
    CHECK(cfg && cfg->cluster.redis.degraded == MG_DEGRADED_FAIL_OPEN);
    CHECK(cfg && cfg->cluster.redis.expected_instances == 3);
    CHECK(cfg && cfg->cluster.redis.lease_ttl_ms == 3000);
    if (cfg) mg_config_free(cfg);
    CHECK(strstr(parse_err("cluster:\n  redis: {url: \"redis://x\", lease_ttl_ms: 999}\n"),
                 "lease_ttl_ms") != NULL);
    cfg = parse_ok("cluster:\n  redis: {url: \"redis://x\", health_samples: false}\n");
    CHECK(cfg && !cfg->cluster.redis.health_samples);
    if (cfg) mg_config_free(cfg);
    CHECK_STR(parse_err("cluster:\n  redis: {url: \"redis://x\", degraded: maybe}\n"),
              "t.yaml:2: cluster.redis.degraded must be local, fail_closed or fail_open");
    CHECK_STR(parse_err("cluster:\n  redis: {url: \"redis://x\", size: 2}\n"),
              "t.yaml:2: unknown key 'size' in cluster.redis");
}

/* observability.otlp: defaults, headers from the environment (never in errors), bounds. */
static void test_observability_section(void)
{
    mg_config_t *cfg = parse_ok("server:\n  listen: 127.0.0.1:8123\n");
    CHECK(cfg != NULL);
    if (cfg) {
        CHECK(cfg->observability.otlp.endpoint == NULL);
        CHECK(cfg->observability.otlp.interval_ms == 1000 &&
              cfg->observability.otlp.max_queue == 4096);
        mg_config_free(cfg);
    }
    setenv("MGT_OTLP_TOKEN", "tok-hunter2", 1);
    cfg = parse_ok("observability:\n  otlp:\n    endpoint: http://127.0.0.1:4318\n"
                   "    headers:\n      authorization: Bearer ${MGT_OTLP_TOKEN}\n"
                   "      x-tenant: edge\n    interval_ms: 200\n    max_queue: 10\n");
    CHECK(cfg != NULL);
    if (cfg) {
        const mg_otlp_conf_t *o = &cfg->observability.otlp;
        CHECK_STR(o->endpoint, "http://127.0.0.1:4318");
        CHECK(o->n_headers == 2);
        if (o->n_headers == 2) {
            CHECK_STR(o->header_names[0], "authorization");
            CHECK_STR(o->header_values[0], "Bearer tok-hunter2");
            CHECK_STR(o->header_values[1], "edge");
        }
        CHECK(o->interval_ms == 200 && o->max_queue == 10 && o->max_batch == 512);
        CHECK_STR(o->service_name, "moongate");
        mg_config_free(cfg);
    }
    const char *e = parse_err("observability:\n  otlp:\n    endpoint: http://x\n    headers:\n"
                              "      \"bad name\": ${MGT_OTLP_TOKEN}\n");
    CHECK(strstr(e, "is not a header name") != NULL && strstr(e, "hunter2") == NULL);
    unsetenv("MGT_OTLP_TOKEN");
    CHECK_STR(parse_err("observability:\n  otlp: {endpoint: \"grpc://x:4317\"}\n"),
              "t.yaml:2: observability.otlp.endpoint must start with http:// or https://");
    CHECK_STR(parse_err("observability:\n  otlp: {interval_ms: 100}\n"),
              "t.yaml:2: observability.otlp is missing required key 'endpoint'");
    CHECK(strstr(parse_err("observability:\n  otlp: {endpoint: \"http://x\", interval_ms: 10}\n"),
                 "interval_ms") != NULL);
    CHECK_STR(parse_err("observability:\n  tracing: true\n"),
              "t.yaml:2: unknown key 'tracing' in observability");
}

int main(void)
{
    MG_RUN(test_down_trials_and_panic);
    MG_RUN(test_storage_and_idempotency_caps);
    MG_RUN(test_storage_upkeep_and_log_file);
    MG_RUN(test_model_tokenizer);
    MG_RUN(test_full_config);
    MG_RUN(test_defaults);
    MG_RUN(test_env_expansion);
    MG_RUN(test_secret_not_in_errors);
    MG_RUN(test_type_errors);
    MG_RUN(test_provider_errors);
    MG_RUN(test_unknown_keys);
    MG_RUN(test_duplicate_keys);
    MG_RUN(test_duplicate_provider_ids);
    MG_RUN(test_routes);
    MG_RUN(test_route_provider_hints);
    MG_RUN(test_listen);
    MG_RUN(test_yaml_syntax);
    MG_RUN(test_alias_budget);
    MG_RUN(test_load_file);
    MG_RUN(test_example_file);
    MG_RUN(test_context_section);
    MG_RUN(test_operational_sections);
    MG_RUN(test_memory_degrade_knobs);
    MG_RUN(test_cluster_section);
    MG_RUN(test_observability_section);
    return mg_test_summary();
}
