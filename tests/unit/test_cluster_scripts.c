/* The shared limits' Lua scripts (core/cluster/limits.c) and the idempotency records'
 * format (core/cluster/idem.c), run against a real redis-server the test starts (loopback, a
 * free port, no persistence, killed at the end). Edge cases the e2e tests reach only by luck:
 * the RPM log's exact bound and its retry time, all or nothing across levels (a refusal at
 * the second leaves the first untouched), tokens too large for a TPM limit, the TPM window
 * corrected at release and never below 0, leases that expire, undo, spend holds (refused at
 * the limit counting what is held, expired holds returned, the charge at release, the local
 * figure as the floor), the reconciliation of a degraded minute, and the value formats of
 * idempotency records. */
#include "mgtest.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "cluster/idem.h"
#include "cluster/limits.h"

static redisContext *rc;
static pid_t server;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof(a);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(s, (struct sockaddr *)&a, &n) != 0)
        return -1;
    close(s);
    return ntohs(a.sin_port);
}

static int start_redis(void)
{
    int port = free_port();
    if (port <= 0) return -1;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    server = fork();
    if (server == 0) {
        int null = open("/dev/null", 1);
        if (null >= 0) dup2(null, 1);
        execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", "/tmp", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) { /* bounded: 100 x 50 ms */
        sleep_ms(50);
        rc = redisConnect("127.0.0.1", port);
        if (rc && !rc->err) {
            redisReply *r = redisCommand(rc, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS;
            freeReplyObject(r);
            if (ok) return 0;
        }
        if (rc) redisFree(rc);
        rc = NULL;
    }
    return -1;
}

static void stop_redis(void)
{
    if (rc) redisFree(rc);
    if (server > 0) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
    }
}

/* ---- running a script as limits.c sends it ---- */

typedef struct {
    const char *name; /* "k:1" */
    unsigned rpm;
    unsigned long long tpm;
    unsigned conc;
} lv_t;

typedef struct {
    const char *name;
    long long daily, monthly, local_day, local_month;
} sp_t;

#define DAY "2026-12-02"
#define MONTH "2026-12"

/* reserve (0), release (1) or renew (2): the KEYS and ARGV layout of limits.c's send_op */
static redisReply *run(int release, const lv_t *lv, int n, const sp_t *sp, int m, const char *lease,
                       long long tokens_or_at, long long ttl_or_delta, int undo, long long micros)
{
    const char *argv[96];
    size_t lens[96];
    char buf[96][96];
    int argc = 0, bi = 0;
#define ADD(s) (argv[argc] = (s), lens[argc] = strlen(argv[argc]), argc++)
#define FMT(...) (snprintf(buf[bi], sizeof(buf[bi]), __VA_ARGS__), ADD(buf[bi++]))
    ADD("EVAL");
    ADD(mg_shared_script(release));
    FMT("%d", n * 3 + m * 4);
    for (int i = 0; i < n; i++) {
        FMT("t:%s:r", lv[i].name);
        FMT("t:%s:t", lv[i].name);
        FMT("t:%s:c", lv[i].name);
    }
    for (int j = 0; j < m; j++) {
        FMT("t:s:%s:h", sp[j].name);
        FMT("t:s:%s:z", sp[j].name);
        FMT("t:s:%s:d:" DAY, sp[j].name);
        FMT("t:s:%s:m:" MONTH, sp[j].name);
    }
    ADD(lease);
    FMT("%lld", tokens_or_at);
    FMT("%lld", ttl_or_delta);
    if (release == 1) ADD(undo ? "1" : "0");
    FMT("%d", n);
    for (int i = 0; i < n; i++) {
        FMT("%u", lv[i].rpm);
        FMT("%llu", lv[i].tpm);
        FMT("%u", lv[i].conc);
    }
    FMT("%d", m);
    FMT("%lld", micros);
    if (!release)
        for (int j = 0; j < m; j++) {
            FMT("%lld", sp[j].daily);
            FMT("%lld", sp[j].monthly);
            FMT("%lld", sp[j].local_day);
            FMT("%lld", sp[j].local_month);
        }
#undef ADD
#undef FMT
    return redisCommandArgv(rc, argc, argv, lens);
}

static long long el(const redisReply *r, size_t i)
{
    return r && r->type == REDIS_REPLY_ARRAY && i < r->elements &&
                   r->element[i]->type == REDIS_REPLY_INTEGER
               ? r->element[i]->integer
               : -999;
}

/* the script's verdict: 1 reserved, 0 refused, -1 too large, -999 an error */
static long long reserve(const lv_t *lv, int n, const sp_t *sp, int m, const char *lease,
                         long long tokens, long long ttl, long long est, long long out[4])
{
    redisReply *r = run(0, lv, n, sp, m, lease, tokens, ttl, 0, est);
    if (r && r->type == REDIS_REPLY_ERROR) fprintf(stderr, "script error: %s\n", r->str);
    for (int i = 0; i < 4; i++) out[i] = el(r, (size_t)i);
    freeReplyObject(r);
    return out[0];
}

static void release(const lv_t *lv, int n, const sp_t *sp, int m, const char *lease, long long at,
                    long long delta, int undo, long long cost)
{
    freeReplyObject(run(1, lv, n, sp, m, lease, at, delta, undo, cost));
}

/* how many of the lease's concurrency leases and spend holds were renewed, -999 an error */
static long long renew(const lv_t *lv, int n, const sp_t *sp, int m, const char *lease,
                       long long ttl)
{
    redisReply *r = run(2, lv, n, sp, m, lease, 0, ttl, 0, 0);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -999;
    if (r && r->type == REDIS_REPLY_ERROR) fprintf(stderr, "script error: %s\n", r->str);
    freeReplyObject(r);
    return v;
}

static long long num(const char *fmt, const char *key)
{
    redisReply *r = redisCommand(rc, fmt, key);
    long long v = r && r->type == REDIS_REPLY_INTEGER  ? r->integer
                  : r && r->type == REDIS_REPLY_STRING ? atoll(r->str)
                                                       : 0;
    freeReplyObject(r);
    return v;
}

static long long hsum(const char *key) /* every field of a TPM hash */
{
    redisReply *r = redisCommand(rc, "HVALS %s", key);
    long long s = 0;
    for (size_t i = 0; r && i < r->elements; i++) s += atoll(r->element[i]->str);
    freeReplyObject(r);
    return s;
}

/* ---- the tests ---- */

static void test_rpm_exact_bound_and_retry(void)
{
    lv_t k = {"k:1", 3, 0, 0};
    long long a[4];
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "a", 1, 1000, 0, a), 1);
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "b", 1, 1000, 0, a), 1);
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "c", 1, 1000, 0, a), 1);
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "d", 1, 1000, 0, a), 0);
    CHECK_EQ_INT(a[1], 0);                /* level 0 */
    CHECK_EQ_INT(a[2], 1);                /* rpm */
    CHECK(a[3] > 59000 && a[3] <= 60000); /* the oldest admission leaves in ~60 s */
    CHECK_EQ_INT(num("ZCARD %s", "t:k:1:r"), 3);
    /* undo: a request never sent gives its admission back */
    release(&k, 1, NULL, 0, "c", 0, 0, 1, 0);
    CHECK_EQ_INT(num("ZCARD %s", "t:k:1:r"), 2);
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "e", 1, 1000, 0, a), 1);
}

static void test_all_or_nothing(void)
{
    lv_t lv[2] = {{"k:2", 100, 1000, 5}, {"p:2", 1, 0, 0}};
    long long a[4];
    CHECK_EQ_INT(reserve(lv, 2, NULL, 0, "x1", 10, 1000, 0, a), 1);
    CHECK_EQ_INT(reserve(lv, 2, NULL, 0, "x2", 10, 1000, 0, a), 0);
    CHECK_EQ_INT(a[1], 1); /* the project refused */
    /* the key's level kept only the first: no admission, tokens or lease of the second */
    CHECK_EQ_INT(num("ZCARD %s", "t:k:2:r"), 1);
    CHECK_EQ_INT(hsum("t:k:2:t"), 10);
    CHECK_EQ_INT(num("ZCARD %s", "t:k:2:c"), 1);
}

static void test_tpm(void)
{
    lv_t k = {"k:3", 0, 100, 0};
    long long a[4];
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "big", 101, 1000, 0, a), -1); /* never fits */
    CHECK_EQ_INT(a[2], 2);
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "t1", 60, 1000, 0, a), 1);
    long long at = a[1];
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "t2", 50, 1000, 0, a), 0);
    CHECK_EQ_INT(a[2], 2);
    CHECK(a[3] > 0 && a[3] <= 60000);
    /* the answer used 20 of the 60 estimated: corrected, the second fits now */
    release(&k, 1, NULL, 0, "t1", at, -40, 0, 0);
    CHECK_EQ_INT(hsum("t:k:3:t"), 20);
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "t2", 50, 1000, 0, a), 1);
    /* a correction past zero stops at zero */
    release(&k, 1, NULL, 0, "t2", a[1], -1000, 0, 0);
    CHECK(hsum("t:k:3:t") >= 0);
}

static void test_leases_expire(void)
{
    lv_t k = {"k:4", 0, 0, 1};
    long long a[4];
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "l1", 1, 150, 0, a), 1);
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "l2", 1, 150, 0, a), 0);
    CHECK_EQ_INT(a[2], 3);
    sleep_ms(200); /* l1's instance died: its lease ends by itself */
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "l2", 1, 150, 0, a), 1);
    release(&k, 1, NULL, 0, "l2", 0, 0, 0, 0);
    CHECK_EQ_INT(num("ZCARD %s", "t:k:4:c"), 0);
    CHECK(num("PTTL %s", "t:k:4:c") != -1); /* every key expires */
}

/* A running request's lease outlives its TTL while renewed; unrenewed it expires, and once
 * another request took its place a late renewal does not bring it back. */
static void test_leases_renewed(void)
{
    lv_t k = {"k:5", 0, 0, 1};
    sp_t sp = {"k:5", 1000, 0, 0, 0};
    long long a[4];
    CHECK_EQ_INT(reserve(&k, 1, &sp, 1, "r1", 1, 300, 10, a), 1);
    for (int i = 0; i < 4; i++) {
        sleep_ms(150);
        CHECK_EQ_INT(renew(&k, 1, &sp, 1, "r1", 300), 2); /* the lease and the spend hold */
    }
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "r2", 1, 300, 0, a), 0); /* 600 ms on: still held */
    CHECK_EQ_INT(a[2], 3);
    CHECK(num("PTTL %s", "t:k:5:c") > 0);
    sleep_ms(400); /* no renewal (the instance died): it ends */
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "r2", 1, 300, 0, a), 1);
    CHECK_EQ_INT(renew(&k, 1, NULL, 0, "r1", 300), 0);
    CHECK_EQ_INT(num("ZCARD %s", "t:k:5:c"), 1);
    CHECK_EQ_INT(renew(&k, 1, NULL, 0, "r2", 300), 1);
    release(&k, 1, NULL, 0, "r2", 0, 0, 0, 0);
    CHECK_EQ_INT(num("ZCARD %s", "t:k:5:c"), 0);
}

static void test_spend_holds_and_charges(void)
{
    sp_t s = {"k:5", 1000, 0, 0, 0};
    long long a[4];
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "s1", 0, 5000, 400, a), 1);
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "s2", 0, 5000, 400, a), 1);
    /* 800 held: a third estimate of 400 would pass 1000 */
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "s3", 0, 5000, 400, a), 0);
    CHECK_EQ_INT(a[1], 0); /* spend level 0 (n + 0, n = 0) */
    CHECK_EQ_INT(a[2], 4); /* daily */
    CHECK_EQ_INT(a[3], 800);
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "s3", 0, 5000, 200, a), 1); /* 200 fits exactly */
    /* s1 cost 100: the hold goes, the day and month are charged */
    release(NULL, 0, &s, 1, "s1", 0, 0, 0, 100);
    CHECK_EQ_INT(num("GET %s", "t:s:k:5:d:" DAY), 100);
    CHECK_EQ_INT(num("GET %s", "t:s:k:5:m:" MONTH), 100);
    CHECK_EQ_INT(num("HGET %s _sum", "t:s:k:5:h"), 600);
    CHECK(num("TTL %s", "t:s:k:5:d:" DAY) > 86400);
    release(NULL, 0, &s, 1, "s2", 0, 0, 0, 0);
    release(NULL, 0, &s, 1, "s3", 0, 0, 0, 0);
    CHECK_EQ_INT(num("HGET %s _sum", "t:s:k:5:h"), 0);
    /* spent 100: 900 fit, 901 do not */
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "s4", 0, 5000, 901, a), 0);
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "s4", 0, 5000, 900, a), 1);
    release(NULL, 0, &s, 1, "s4", 0, 0, 0, 900);
    /* at the limit: refused even with nothing to hold */
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "s5", 0, 5000, 0, a), 0);
}

static void test_spend_expired_hold_returns(void)
{
    sp_t s = {"p:6", 0, 500, 0, 0};
    long long a[4];
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "h1", 0, 150, 500, a), 1);
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "h2", 0, 150, 1, a), 0);
    CHECK_EQ_INT(a[2], 5); /* monthly */
    sleep_ms(200);         /* h1's instance died */
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "h2", 0, 150, 500, a), 1);
    CHECK_EQ_INT(num("HGET %s _sum", "t:s:p:6:h"), 500);
    /* the late release of the dead hold changes nothing but its own charge */
    release(NULL, 0, &s, 1, "h1", 0, 0, 0, 0);
    CHECK_EQ_INT(num("HGET %s _sum", "t:s:p:6:h"), 500);
}

static void test_spend_local_floor(void)
{
    /* Redis lost the figures; this instance knows it charged 700 today: that counts, and is
       written back */
    sp_t s = {"t:7", 1000, 0, 700, 700};
    long long a[4];
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "f1", 0, 5000, 400, a), 0);
    CHECK_EQ_INT(reserve(NULL, 0, &s, 1, "f1", 0, 5000, 300, a), 1);
    CHECK_EQ_INT(num("GET %s", "t:s:t:7:d:" DAY), 700);
    CHECK_EQ_INT(num("GET %s", "t:s:t:7:m:" MONTH), 700);
}

static void test_spend_and_rates_all_or_nothing(void)
{
    lv_t k = {"k:8", 10, 0, 2};
    sp_t s = {"k:8", 100, 0, 0, 0};
    long long a[4];
    CHECK_EQ_INT(reserve(&k, 1, &s, 1, "r1", 1, 5000, 80, a), 1);
    CHECK_EQ_INT(reserve(&k, 1, &s, 1, "r2", 1, 5000, 80, a), 0);
    CHECK_EQ_INT(a[1], 1);                       /* spend level 0 after one rate level */
    CHECK_EQ_INT(num("ZCARD %s", "t:k:8:r"), 1); /* the refusal took no admission */
    CHECK_EQ_INT(num("ZCARD %s", "t:k:8:c"), 1);
}

/* the reconcile script, as limits.c's reconcile_once sends it: buckets then spend entries */
static long long reconcile(const char *tag, const char *const *names, const long long (*b)[5],
                           int nb, const char *spend, long long micros)
{
    const char *argv[64];
    size_t lens[64];
    char buf[64][96];
    int argc = 0, bi = 0;
#define ADD(s) (argv[argc] = (s), lens[argc] = strlen(argv[argc]), argc++)
#define FMT(...) (snprintf(buf[bi], sizeof(buf[bi]), __VA_ARGS__), ADD(buf[bi++]))
    ADD("EVAL");
    ADD(mg_shared_reconcile_script());
    FMT("%d", nb * 2 + (spend ? 2 : 0));
    for (int i = 0; i < nb; i++) {
        FMT("t:%s:r", names[i]);
        FMT("t:%s:t", names[i]);
    }
    if (spend) {
        FMT("t:s:%s:d:" DAY, spend);
        FMT("t:s:%s:m:" MONTH, spend);
    }
    ADD(tag);
    FMT("%d", nb);
    for (int i = 0; i < nb; i++)
        for (int k = 0; k < 5; k++) FMT("%lld", b[i][k]);
    FMT("%d", spend ? 1 : 0);
    if (spend) FMT("%lld", micros);
#undef ADD
#undef FMT
    redisReply *r = redisCommandArgv(rc, argc, argv, lens);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -999;
    if (r && r->type == REDIS_REPLY_ERROR) fprintf(stderr, "script error: %s\n", r->str);
    freeReplyObject(r);
    return v;
}

/* What went on without Redis joins the windows: the admissions count against the RPM limit
 * at their age (one older than the window is not added), the tokens against the TPM, the
 * micros against the spend periods; a second run (another tag) adds, never replaces. */
static void test_reconcile(void)
{
    const char *names[3] = {"k:9", "k:9", "p:9"};
    const long long b[3][5] = {
        {1500, 3, 30, 1, 1},  /* 1.5 s ago: 3 admissions, 30 tokens, RPM and TPM */
        {61000, 5, 50, 1, 1}, /* out of the window: nothing */
        {200, 2, 20, 0, 1},   /* a level with a TPM window only: tokens, no admissions */
    };
    CHECK_EQ_INT(reconcile("run1", names, b, 3, "k:9", 700), 3);
    CHECK_EQ_INT(num("ZCARD %s", "t:k:9:r"), 3);
    CHECK_EQ_INT(hsum("t:k:9:t"), 30);
    CHECK_EQ_INT(num("ZCARD %s", "t:p:9:r"), 0);
    CHECK_EQ_INT(hsum("t:p:9:t"), 20);
    CHECK_EQ_INT(num("GET %s", "t:s:k:9:d:" DAY), 700);
    CHECK_EQ_INT(num("GET %s", "t:s:k:9:m:" MONTH), 700);
    CHECK(num("TTL %s", "t:s:k:9:d:" DAY) > 0);
    /* the reserve script sees them: a limit of 4 a minute leaves room for one */
    lv_t k = {"k:9", 4, 0, 0};
    long long a[4];
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "after1", 1, 1000, 0, a), 1);
    CHECK_EQ_INT(reserve(&k, 1, NULL, 0, "after2", 1, 1000, 0, a), 0);
    /* a second instance's run adds its own (distinct members, summed micros) */
    CHECK_EQ_INT(reconcile("run2", names, b, 1, "k:9", 300), 3);
    CHECK_EQ_INT(num("ZCARD %s", "t:k:9:r"), 7);
    CHECK_EQ_INT(num("GET %s", "t:s:k:9:d:" DAY), 1000);
}

static void test_idem_values(void)
{
    mg_cidem_answer_t a;
    memset(&a, 0, sizeof(a));
    CHECK_EQ_INT(mg_cidem_parse("P\nnode-1", 8, &a), 0);
    CHECK_EQ_INT(a.rc, MG_CIDEM_RUNNING);
    CHECK_STR(a.node, "node-1");
    const char done[] = "D\n200\n1\n1796240152000\ndata: {}\n\ndata: [DONE]\n\n";
    CHECK_EQ_INT(mg_cidem_parse(done, sizeof(done) - 1, &a), 0);
    CHECK_EQ_INT(a.rc, MG_CIDEM_DONE);
    CHECK_EQ_INT(a.status, 200);
    CHECK_EQ_INT(a.stream, 1);
    CHECK_EQ_INT(a.expires_ms, 1796240152000LL);
    CHECK_EQ_INT(a.len, strlen("data: {}\n\ndata: [DONE]\n\n"));
    CHECK(memcmp(a.body, "data: {}", 8) == 0);
    const char empty[] = "D\n500\n0\n1\n"; /* an empty body is an answer */
    CHECK_EQ_INT(mg_cidem_parse(empty, sizeof(empty) - 1, &a), 0);
    CHECK_EQ_INT(a.len, 0);
    /* not ours */
    CHECK_EQ_INT(mg_cidem_parse("X\n", 2, &a), -1);
    CHECK_EQ_INT(mg_cidem_parse("D\n200\n0\n", 9, &a), -1);
    CHECK_EQ_INT(mg_cidem_parse("D\n99\n0\n1\n", 10, &a), -1);
    CHECK_EQ_INT(mg_cidem_parse("D\n2x0\n0\n1\n", 11, &a), -1);
    CHECK_EQ_INT(mg_cidem_parse("P", 1, &a), -1);
}

int main(void)
{
    if (start_redis() != 0) {
        fprintf(stderr, "cannot start redis-server (scripts/setup installs it)\n");
        stop_redis();
        return 1;
    }
    MG_RUN(test_rpm_exact_bound_and_retry);
    MG_RUN(test_all_or_nothing);
    MG_RUN(test_tpm);
    MG_RUN(test_leases_expire);
    MG_RUN(test_leases_renewed);
    MG_RUN(test_spend_holds_and_charges);
    MG_RUN(test_spend_expired_hold_returns);
    MG_RUN(test_spend_local_floor);
    MG_RUN(test_spend_and_rates_all_or_nothing);
    MG_RUN(test_reconcile);
    MG_RUN(test_idem_values);
    stop_redis();
    return mg_test_summary();
}
