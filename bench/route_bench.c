/* route_bench: the cost of one routing decision as the request path pays it, for a logical
 * model with 1, 10, 100 and 1,000 routes (all usable, main pool, equal weights: the policy has
 * to order all of them), in two cases:
 *   no samples    no route has health samples yet: rule 7's weighted order only;
 *   steady state  every route has enough samples for rule 8 (the adaptive order), with
 *                 varied success rates and TTFTs, and varied RPM headroom (every provider
 *                 has an rpm_limit and has used some of it: rule 7 weighs by headroom);
 *                 before each decision one route's TTFT and headroom move (a request was
 *                 reserved and one finished since the last decision), as on a gateway
 *                 under load: 19 requests in 20 pay for rule 8.
 * and two ways:
 *   kept          as the gateway decides: the plan route() gave is kept and its steps run
 *                 again in C with each request's numbers (luavm/keep.h), the step functions
 *                 asked again only for the routes whose facts moved; a route whose facts move
 *                 gets a new description serial, and every route its keep slot, as
 *                 route/facts.c gives them;
 *   policy        route() itself every time (plan.fresh): the candidates handed to Lua,
 *                 policies/routing.lua run, the plan read back.
 * Built by CMake (target route_bench); run from the repository root: build/route_bench
 * (build/route_bench 100: only the 100-route rows; build/route_bench 100 steady: only the
 * steady-state ones; a third argument, kept or policy, only that way). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "luavm/keep.h"
#include "luavm/luavm.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* CPU time: others share the box */
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

/* Varied health samples for every route: success rates from 0.90 to 1.0 (a few 5-point
 * steps), TTFTs from 80 ms to about 1.5 s (many 10% steps), enough of both for rule 8;
 * RPM headroom from 0.70 to 1.0. */
static void set_samples(mg_candidate_t *c, int n)
{
    for (int i = 0; i < n; i++) {
        c[i].avail_samples = 20 + i % 7;
        c[i].ttft_samples = 10 + i % 5;
        c[i].success_rate = 1.0 - 0.01 * (double)((i * 7) % 11);
        c[i].ttft_ms = 80.0 + (double)((i * 37) % 97) * 15.0;
        c[i].headroom = 1.0 - 0.01 * (double)((i * 11) % 31);
    }
}

/* What happened since the last decision: a request finished on one route (its mean
 * TTFT moved a little) and one was reserved on another (its headroom moved). */
static uint64_t serials;

static void one_sample_moved(mg_candidate_t *c, int n, int k)
{
    mg_candidate_t *r = &c[(k * 13) % n];
    r->ttft_ms += k % 2 ? 1.5 : -1.0;
    r->serial = ++serials;
    r = &c[(k * 7 + 3) % n];
    r->headroom += k % 2 ? 0.0001 : -0.0001;
    r->serial = ++serials;
}

/* The box is shared: the best of a few rounds is the figure that repeats. */
#define ROUNDS 5

/* The plan's length as the gateway asks for it: one entry for the next attempt, when no
 * candidate is passed over (req.plan_limit in lua/README.md). */
#define PLAN_LIMIT 1

/* Run iters decisions from draw *k on; the mean ns per decision, or -1 on an error. */
static double time_decisions(mg_gen_t *g, mg_candidate_t *c, int n, int steady, int fresh,
                             int iters, int *k, mg_plan_entry_t *entries)
{
    char err[512];
    double t0 = now_ns();
    for (int end = *k + iters; *k < end; ++*k) {
        mg_lua_req_t info = {.request_id = "req-bench",
                             .endpoint = "chat",
                             .model = "m",
                             .max_tokens = 64,
                             .priority = "P2",
                             .allow_cloud = 1,
                             .local_first = 1,
                             .random = (double)(*k % 997) / 997.0};
        if (steady) one_sample_moved(c, n, *k);
        int rr = -1; /* (made when route() is called, as on the request path) */
        mg_plan_t plan = {
            .entries = entries, .limit = PLAN_LIMIT < n ? PLAN_LIMIT : 0, .fresh = fresh};
        int want = n < PLAN_LIMIT ? n : PLAN_LIMIT;
        if (mg_gen_route(g, &info, &rr, 1, c, n, &plan, err, sizeof(err)) != 0 || plan.n != want) {
            fprintf(stderr, "route: %s (plan %d of %d)\n", err, plan.n, want);
            return -1;
        }
        mg_gen_req_release(g, rr);
    }
    return (now_ns() - t0) / iters;
}

static void run(int n, int steady, int fresh)
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
        c[i].serial = ++serials;
        c[i].keep_slot = mg_keep_slot(g->keep, c[i].route) + 1; /* as route/facts.c says it */
    }
    if (steady) set_samples(c, n);
    int iters = n >= 1000 ? 200 : n >= 100 ? 2000 : 20000;
    double per = 0;
    for (int round = 0, k = 0; round < ROUNDS; round++) {
        double t = time_decisions(g, c, n, steady, fresh, iters, &k, entries);
        if (t < 0) break;
        if (round == 0 || t < per) per = t;
    }
    printf("%-12s | %-6s | %5d routes | %10.1f us per decision | %8.2f us per route\n",
           steady ? "steady state" : "no samples", fresh ? "policy" : "kept", n, per / 1000,
           per / 1000 / n);
    free(c);
    free(entries);
    mg_gen_unref(g);
    unlink(path);
}

/* route_bench [ROUTES [steady|fresh [kept|policy]]]: every size, or only ROUTES routes (any
 * number), in both cases or only one, both ways or only one (for a profiler). */
int main(int argc, char **argv)
{
    int sizes[] = {1, 10, 100, 1000};
    int only = argc > 1 ? atoi(argv[1]) : 0;
    const char *mode = argc > 2 ? argv[2] : "";
    const char *way = argc > 3 ? argv[3] : "";
    for (int fresh = 0; fresh <= 1; fresh++) {
        if ((fresh && strcmp(way, "kept") == 0) || (!fresh && strcmp(way, "policy") == 0)) continue;
        for (int steady = 0; steady <= 1; steady++) {
            if ((steady && strcmp(mode, "fresh") == 0) || (!steady && strcmp(mode, "steady") == 0))
                continue;
            if (only > 0) run(only, steady, fresh);
            else
                for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
                    run(sizes[i], steady, fresh);
        }
    }
    return 0;
}
