/* route_bench: the cost of one routing decision as the request path pays it: the
 * candidates pushed to Lua, policies/routing.lua run, the plan read back, for a
 * logical model with 1, 10, 100 and 1,000 routes (all usable, main pool, equal
 * weights: the policy has to order all of them). Built by CMake (target
 * route_bench); run from the repository root: build/route_bench. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "luavm.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int write_config(const char *path, int n)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "storage:\n  path: /tmp/route_bench.db\nproviders:\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "  - { id: p%d, adapter: openai, base_url: \"http://127.0.0.1:1/v1\" }\n", i);
    fprintf(f, "models:\n  m:\n    routes:\n");
    for (int i = 0; i < n; i++) fprintf(f, "      - { provider: p%d, model: up%d }\n", i, i);
    fclose(f);
    return 0;
}

static void run(int n)
{
    char path[] = "/tmp/route_bench_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    write_config(path, n);
    char err[512];
    mg_gen_t *g = NULL;
    if (mg_gen_load(path, 1, &g, err, sizeof(err)) != 0) {
        fprintf(stderr, "load: %s\n", err);
        unlink(path);
        return;
    }
    const mg_model_conf_t *m = mg_config_model(g->cfg, "m");
    mg_candidate_t *c = calloc((size_t)n, sizeof(*c));
    mg_plan_entry_t *entries = calloc((size_t)n, sizeof(*entries));
    for (int i = 0; i < n; i++) {
        c[i].provider = mg_config_provider(g->cfg, m->routes[i].provider);
        c[i].route = &m->routes[i];
        c[i].available = 1;
        c[i].headroom = 1;
        c[i].health = "healthy";
        c[i].breaker = c[i].route_breaker = "closed";
        c[i].success_rate = c[i].ttft_ms = c[i].load_kv_cache = -1;
    }
    int iters = n >= 1000 ? 200 : n >= 100 ? 2000 : 20000;
    double t0 = now_ns();
    for (int k = 0; k < iters; k++) {
        mg_lua_req_t info = {.request_id = "req-bench", .endpoint = "chat", .model = "m",
                             .max_tokens = 64, .priority = "P2", .allow_cloud = 1,
                             .local_first = 1, .random = (double)(k % 997) / 997.0};
        int rr = mg_gen_req_new(g, &info);
        mg_plan_t plan = {entries, 0, 0};
        if (mg_gen_route(g, rr, 1, c, n, &plan, err, sizeof(err)) != 0 || plan.n != n) {
            fprintf(stderr, "route: %s (plan %d of %d)\n", err, plan.n, n);
            break;
        }
        mg_gen_unref_value(g, rr);
    }
    double per = (now_ns() - t0) / iters;
    printf("%5d routes | %10.1f us per decision | %8.2f us per route\n", n, per / 1000, per / 1000 / n);
    free(c);
    free(entries);
    mg_gen_unref(g);
    unlink(path);
}

int main(void)
{
    int sizes[] = {1, 10, 100, 1000};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) run(sizes[i]);
    return 0;
}
