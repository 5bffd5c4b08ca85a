/* Unit tests for core/route/upmodels.c, the background fetcher of the model_prefix providers'
 * lists, on a real loop against a small HTTP server in the same loop: the first fetch (the
 * adapter's path and the provider's key), the listing built from it, a failing upstream
 * keeping the last list (and being asked again), a hanging one stopped with its fetch in
 * flight (nothing calls back afterwards: run under ASan), a reload to another base_url
 * starting over, and models_refresh_seconds 0 dropping the lists. Every wait is bounded. */
#include "luavm_fixture.h"
#include "luavm/gens.h"
#include "route/upmodels.h"

#include <time.h>
#include <uv.h>

static uv_loop_t L;
static uv_tcp_t server;
static int port;

typedef enum { ANSWER_LIST, ANSWER_500, ANSWER_HOLD } answer_t;
static answer_t mode = ANSWER_LIST;
static const char *list_body =
    "{\"object\":\"list\",\"data\":[{\"id\":\"meta/a\"},{\"id\":\"x/b\"},"
    "{\"id\":\"meta/c\"}]}";
static int requests;         /* heads read */
static char last_head[2048]; /* the last one */

typedef struct conn_s {
    uv_tcp_t h;
    char buf[4096];
    size_t len;
} conn_t;

static void conn_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_written(uv_write_t *w, int status)
{
    uv_close((uv_handle_t *)w->handle, conn_closed);
    free(w);
}

static void answer(conn_t *c)
{
    requests++;
    snprintf(last_head, sizeof(last_head), "%.*s", (int)c->len, c->buf);
    if (mode == ANSWER_HOLD) return; /* never answers; closed when the client leaves */
    static char out[4096];
    const char *body = mode == ANSWER_LIST ? list_body : "{\"error\":\"down\"}";
    snprintf(out, sizeof(out),
             "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
             "Connection: close\r\n\r\n%s",
             mode == ANSWER_LIST ? "200 OK" : "500 Internal Server Error", strlen(body), body);
    uv_write_t *w = malloc(sizeof(*w));
    uv_buf_t b = uv_buf_init(out, (unsigned)strlen(out));
    uv_write(w, (uv_stream_t *)&c->h, &b, 1, on_written);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    *buf = uv_buf_init(c->buf + c->len, (unsigned)(sizeof(c->buf) - 1 - c->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    if (n < 0) {
        uv_read_stop(s);
        if (!uv_is_closing((uv_handle_t *)s)) uv_close((uv_handle_t *)s, conn_closed);
        return;
    }
    size_t before = c->len;
    c->len += (size_t)n;
    c->buf[c->len] = '\0';
    if (!strstr(c->buf + (before > 3 ? before - 3 : 0), "\r\n\r\n")) return;
    uv_read_stop(s);
    answer(c);
}

static void on_connection(uv_stream_t *srv, int status)
{
    conn_t *c = calloc(1, sizeof(*c));
    uv_tcp_init(&L, &c->h);
    c->h.data = c;
    if (uv_accept(srv, (uv_stream_t *)&c->h) == 0)
        uv_read_start((uv_stream_t *)&c->h, on_alloc, on_read);
    else uv_close((uv_handle_t *)&c->h, conn_closed);
}

static void server_start(void)
{
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", 0, &a);
    uv_tcp_init(&L, &server);
    uv_tcp_bind(&server, (const struct sockaddr *)&a, 0);
    uv_listen((uv_stream_t *)&server, 16, on_connection);
    struct sockaddr_in got;
    int len = sizeof(got);
    uv_tcp_getsockname(&server, (struct sockaddr *)&got, &len);
    port = ntohs(got.sin_port);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uv_timer_t ticker;
static void on_tick(uv_timer_t *t) {}

/* Run the loop until cond() or ms passed; returns cond(). */
static int run_until(int (*cond)(void), int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    while (!cond() && now_ms() < end) uv_run(&L, UV_RUN_ONCE);
    return cond();
}

static mg_gens_t gens;
static mg_upmodels_t *UM;
static int seen_requests;

static int listed_two(void)
{
    return mg_upmodels_list(UM)->n == 2; /* meta/a and meta/c: x/b is not under meta/ */
}
static int asked_twice_more(void)
{
    return requests >= seen_requests + 2;
}
static int asked_once_more(void)
{
    return requests >= seen_requests + 1;
}
static int listed_none(void)
{
    return mg_upmodels_list(UM)->n == 0;
}

/* A generation whose provider "nim" (openai, prefix meta/) is at base. */
static mg_gen_t *gen_at(const char *base, unsigned id)
{
    char yaml[4096];
    snprintf(yaml, sizeof(yaml),
             "server:\n  listen: 127.0.0.1:0\n"
             "lua:\n  policies: %s/policies\n  adapters: %s/adapters\n  lib: %s/lua\n"
             "health: { probes: false, probe_timeout_ms: 300 }\n"
             "protocols: { models_refresh_seconds: 1 }\n"
             "providers:\n"
             "  - { id: nim, name: NIM key, adapter: openai, base_url: %s, api_key: nvapi-k,\n"
             "      model_prefix: meta/ }\n"
             "  - { id: plain, adapter: openai, base_url: %s }\n"
             "models:\n  m: { routes: [ { provider: plain, model: up } ] }\n",
             root, root, root, base, base);
    write_text("moongate.yaml", yaml);
    mg_gen_t *g = NULL;
    if (mg_gen_load(cfg_path, id, &g, err, sizeof(err)) != 0) fprintf(stderr, "load: %s\n", err);
    return g;
}

static void test_fetch_fail_hold_stop(void)
{
    char base[128];
    snprintf(base, sizeof(base), "http://127.0.0.1:%d/v1", port);
    gens.current = gen_at(base, 1);
    CHECK(gens.current != NULL);
    if (!gens.current) return;
    mg_upstream_t *up = mg_upstream_new(&L);
    mg_upmodels_deps_t d = {&L, &gens, up};
    UM = mg_upmodels_start(&d);
    CHECK(listed_none()); /* nothing before the first answer */
    CHECK(run_until(listed_two, 5000));
    const mg_model_list_t *l = mg_upmodels_list(UM);
    if (l->n == 2) {
        CHECK_STR(l->items[0].id, "meta/a");
        CHECK_STR(l->items[1].id, "meta/c");
        CHECK_STR(l->items[0].owned_by, "NIM key");
    }
    CHECK(strncmp(last_head, "GET /v1/models HTTP/1.1\r\n", 25) == 0);
    CHECK(strstr(last_head, "Authorization: Bearer nvapi-k\r\n") != NULL);
    CHECK_EQ_INT(requests, 1); /* the plain provider is not asked */

    /* failing: asked again (each second here), the last list kept */
    mode = ANSWER_500;
    seen_requests = requests;
    CHECK(run_until(asked_twice_more, 8000));
    CHECK_EQ_INT(mg_upmodels_list(UM)->n, 2);

    /* a reload to another base_url (no server there): the list starts over */
    mg_gen_t *moved = gen_at("http://127.0.0.1:1/v1", 2);
    mg_gen_t *old = gens.current;
    gens.current = moved;
    CHECK(run_until(listed_none, 3000));
    gens.current = old;
    mg_gen_unref(moved);

    /* back: listed again; then off (refresh 0): the lists go at once */
    mode = ANSWER_LIST;
    CHECK(run_until(listed_two, 5000));
    gens.current->cfg->protocols.models_refresh_s = 0;
    CHECK(listed_none());
    gens.current->cfg->protocols.models_refresh_s = 1;
    CHECK(run_until(listed_two, 5000));

    /* hanging: stopped with the fetch in flight */
    mode = ANSWER_HOLD;
    seen_requests = requests;
    CHECK(run_until(asked_once_more, 5000));
    CHECK_EQ_INT(mg_upmodels_list(UM)->n, 2); /* answered from the cache meanwhile */
    CHECK(mg_upstream_active(up) == 1);
    mg_upmodels_stop(UM);
    UM = NULL;
    CHECK(mg_upstream_active(up) == 0);
    CHECK_EQ_INT(mg_upmodels_list(NULL)->n, 0);
    mg_upstream_close(up);
    for (int i = 0; i < 50; i++) uv_run(&L, UV_RUN_NOWAIT);
    mg_gen_unref(gens.current);
    gens.current = NULL;
}

static void close_walk(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h))
        uv_close(h,
                 h == (uv_handle_t *)&server || h == (uv_handle_t *)&ticker ? NULL : conn_closed);
}

int main(void)
{
    tree_new();
    uv_loop_init(&L);
    uv_timer_init(&L, &ticker);
    uv_timer_start(&ticker, on_tick, 5, 5); /* the loop never blocks for long */
    server_start();
    MG_RUN(test_fetch_fail_hold_stop);
    uv_walk(&L, close_walk, NULL);
    for (int i = 0; i < 100 && uv_loop_alive(&L); i++) uv_run(&L, UV_RUN_NOWAIT);
    uv_loop_close(&L);
    tree_remove();
    luavm_fixture_used();
    return mg_test_summary();
}
