/* limits: see limits.h. */
#include "cluster/limits.h"

#include <hiredis/hiredis.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/clock.h"
#include "base/log.h"
#include "cluster/backlog.h"

/* KEYS: three per level (NAME:r, NAME:t, NAME:c), then four per spend level (s:NAME:h,
 * s:NAME:z, s:NAME:d:DAY, s:NAME:m:MONTH). ARGV: lease, tokens, lease ttl ms, n, then rpm,
 * tpm, conc per level, then m (spend levels), the estimate in micros, and daily limit,
 * monthly limit, local day and month figures per spend level. Every level is checked before
 * anything is written: a refusal leaves Redis as it was (expired holds aside). Answers {1,
 * second} when reserved, {0, level, limit, retry_ms} when refused ({0, n + j, 4 or 5, held}
 * at a spend level), {-1, level, 2, 0} when the tokens can never fit. */
static const char RESERVE_LUA[] =
    "local t = redis.call('TIME')\n"
    "local sec = tonumber(t[1])\n"
    "local now = sec * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local lease, tokens, ttl, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), "
    "tonumber(ARGV[4])\n"
    "for i = 0, n - 1 do\n"
    "  local rpm, tpm, conc = tonumber(ARGV[5+i*3]), tonumber(ARGV[6+i*3]), "
    "tonumber(ARGV[7+i*3])\n"
    "  local kr, kt, kc = KEYS[1+i*3], KEYS[2+i*3], KEYS[3+i*3]\n"
    "  if rpm > 0 then\n"
    "    redis.call('ZREMRANGEBYSCORE', kr, '-inf', now - 60000)\n"
    "    local c = redis.call('ZCARD', kr)\n"
    "    if c >= rpm then\n"
    "      local e = redis.call('ZRANGE', kr, c - rpm, c - rpm, 'WITHSCORES')\n"
    "      return {0, i, 1, tonumber(e[2]) + 60000 - now}\n"
    "    end\n"
    "  end\n"
    "  if tpm > 0 then\n"
    "    if tokens > tpm then return {-1, i, 2, 0} end\n"
    "    local h = redis.call('HGETALL', kt)\n"
    "    local sum, secs = 0, {}\n"
    "    for j = 1, #h, 2 do\n"
    "      local s = tonumber(h[j])\n"
    "      if s <= sec - 60 then redis.call('HDEL', kt, h[j])\n"
    "      else sum = sum + tonumber(h[j+1]); secs[#secs+1] = s end\n"
    "    end\n"
    "    if sum + tokens > tpm then\n"
    "      table.sort(secs)\n"
    "      local left = sum\n"
    "      for _, s in ipairs(secs) do\n"
    "        left = left - tonumber(redis.call('HGET', kt, s))\n"
    "        if left + tokens <= tpm then return {0, i, 2, (s + 60 - sec) * 1000} end\n"
    "      end\n"
    "      return {0, i, 2, 60000}\n"
    "    end\n"
    "  end\n"
    "  if conc > 0 then\n"
    "    redis.call('ZREMRANGEBYSCORE', kc, '-inf', now)\n"
    "    if redis.call('ZCARD', kc) >= conc then return {0, i, 3, 0} end\n"
    "  end\n"
    "end\n"
    "local sb, kb = 5 + n * 3, n * 3\n"
    "local m, est = tonumber(ARGV[sb] or '0'), tonumber(ARGV[sb + 1] or '0')\n"
    "local heal = {}\n"
    "for j = 0, m - 1 do\n"
    "  local kh, kz, kd, km = KEYS[kb+1+j*4], KEYS[kb+2+j*4], KEYS[kb+3+j*4], KEYS[kb+4+j*4]\n"
    "  local dl, ml = tonumber(ARGV[sb+2+j*4]), tonumber(ARGV[sb+3+j*4])\n"
    "  local ld, lm = tonumber(ARGV[sb+4+j*4]), tonumber(ARGV[sb+5+j*4])\n"
    "  for _, l in ipairs(redis.call('ZRANGEBYSCORE', kz, '-inf', now)) do\n"
    "    local a = tonumber(redis.call('HGET', kh, l) or '0')\n"
    "    redis.call('HDEL', kh, l)\n"
    "    if a > 0 then redis.call('HINCRBY', kh, '_sum', -a) end\n"
    "  end\n"
    "  redis.call('ZREMRANGEBYSCORE', kz, '-inf', now)\n"
    "  local held = tonumber(redis.call('HGET', kh, '_sum') or '0')\n"
    "  local rd = tonumber(redis.call('GET', kd) or '0')\n"
    "  local rm = tonumber(redis.call('GET', km) or '0')\n"
    "  local sd, sm = math.max(rd, ld), math.max(rm, lm)\n"
    "  heal[j + 1] = {rd < ld, rm < lm, ld, lm}\n"
    "  if dl > 0 and (sd >= dl or sd + held + est > dl) then return {0, n + j, 4, held} end\n"
    "  if ml > 0 and (sm >= ml or sm + held + est > ml) then return {0, n + j, 5, held} end\n"
    "end\n"
    "for i = 0, n - 1 do\n"
    "  local rpm, tpm, conc = tonumber(ARGV[5+i*3]), tonumber(ARGV[6+i*3]), "
    "tonumber(ARGV[7+i*3])\n"
    "  local kr, kt, kc = KEYS[1+i*3], KEYS[2+i*3], KEYS[3+i*3]\n"
    "  if rpm > 0 then\n"
    "    redis.call('ZADD', kr, now, lease)\n"
    "    redis.call('PEXPIRE', kr, 61000)\n"
    "  end\n"
    "  if tpm > 0 then\n"
    "    redis.call('HINCRBY', kt, sec, tokens)\n"
    "    redis.call('EXPIRE', kt, 62)\n"
    "  end\n"
    "  if conc > 0 then\n"
    "    redis.call('ZADD', kc, now + ttl, lease)\n"
    "    if redis.call('PTTL', kc) < ttl + 1000 then redis.call('PEXPIRE', kc, ttl + 1000) end\n"
    "  end\n"
    "end\n"
    "for j = 0, m - 1 do\n"
    "  local kh, kz, kd, km = KEYS[kb+1+j*4], KEYS[kb+2+j*4], KEYS[kb+3+j*4], KEYS[kb+4+j*4]\n"
    "  if est > 0 then\n"
    "    redis.call('HSET', kh, lease, est)\n"
    "    redis.call('HINCRBY', kh, '_sum', est)\n"
    "    redis.call('ZADD', kz, now + ttl, lease)\n"
    "    for _, k in ipairs({kh, kz}) do\n"
    "      if redis.call('PTTL', k) < ttl + 1000 then redis.call('PEXPIRE', k, ttl + 1000) end\n"
    "    end\n"
    "  end\n"
    "  local h = heal[j + 1]\n"
    "  if h[1] then redis.call('SET', kd, h[3], 'EX', 90000) end\n"
    "  if h[2] then redis.call('SET', km, h[4], 'EX', 2764800) end\n"
    "end\n"
    "return {1, sec}\n";

/* KEYS as above. ARGV: lease, second, token delta, undo (0/1), n, then rpm, tpm, conc, then
 * m (spend levels) and the actual cost in micros. */
static const char RELEASE_LUA[] =
    "local lease, at, delta, undo, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1', "
    "tonumber(ARGV[5])\n"
    "for i = 0, n - 1 do\n"
    "  local rpm, tpm, conc = tonumber(ARGV[6+i*3]), tonumber(ARGV[7+i*3]), "
    "tonumber(ARGV[8+i*3])\n"
    "  if conc > 0 then redis.call('ZREM', KEYS[3+i*3], lease) end\n"
    "  if undo and rpm > 0 then redis.call('ZREM', KEYS[1+i*3], lease) end\n"
    "  if tpm > 0 and delta ~= 0 and redis.call('HEXISTS', KEYS[2+i*3], at) == 1 then\n"
    "    if redis.call('HINCRBY', KEYS[2+i*3], at, delta) < 0 then\n"
    "      redis.call('HSET', KEYS[2+i*3], at, 0)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local sb, kb = 6 + n * 3, n * 3\n"
    "local m, cost = tonumber(ARGV[sb] or '0'), tonumber(ARGV[sb + 1] or '0')\n"
    "for j = 0, m - 1 do\n"
    "  local kh, kz, kd, km = KEYS[kb+1+j*4], KEYS[kb+2+j*4], KEYS[kb+3+j*4], KEYS[kb+4+j*4]\n"
    "  local a = tonumber(redis.call('HGET', kh, lease) or '0')\n"
    "  if a > 0 then\n"
    "    redis.call('HDEL', kh, lease)\n"
    "    redis.call('HINCRBY', kh, '_sum', -a)\n"
    "  end\n"
    "  redis.call('ZREM', kz, lease)\n"
    "  if cost > 0 then\n"
    "    redis.call('INCRBY', kd, cost)\n"
    "    redis.call('EXPIRE', kd, 90000)\n"
    "    redis.call('INCRBY', km, cost)\n"
    "    redis.call('EXPIRE', km, 2764800)\n"
    "  end\n"
    "end\n"
    "return 1\n";

/* KEYS as above; ARGV as the reserve script's (lease, unused, lease ttl ms, n, rpm, tpm, conc
 * per level, m). Each concurrency lease and spend hold of `lease` still in its set is moved
 * to now + ttl (one that already expired and was taken out stays out: its request was counted
 * dead, and the others may have used its place). Answers how many were renewed. */
static const char RENEW_LUA[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local lease, ttl, n = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "local renewed = 0\n"
    "local function keep(k, also)\n"
    "  if not redis.call('ZSCORE', k, lease) then return end\n"
    "  redis.call('ZADD', k, now + ttl, lease)\n"
    "  renewed = renewed + 1\n"
    "  for _, key in ipairs({k, also}) do\n"
    "    if redis.call('PTTL', key) < ttl + 1000 then redis.call('PEXPIRE', key, ttl + 1000) end\n"
    "  end\n"
    "end\n"
    "for i = 0, n - 1 do\n"
    "  if tonumber(ARGV[7+i*3]) > 0 then keep(KEYS[3+i*3], KEYS[3+i*3]) end\n"
    "end\n"
    "local m, kb = tonumber(ARGV[5 + n * 3] or '0'), n * 3\n"
    "for j = 0, m - 1 do keep(KEYS[kb+2+j*4], KEYS[kb+1+j*4]) end\n"
    "return renewed\n";

/* KEYS: two per bucket (NAME:r, NAME:t), then two per spend entry (s:NAME:d:DAY,
 * s:NAME:m:MONTH). ARGV: a tag unique to this run of the script, the bucket count, then
 * per bucket its age in ms, admissions, tokens, and whether the level has an RPM and a TPM
 * window ('1'/'0'); then the spend count and the micros of each. Admissions still inside
 * the 60 s window go into the RPM log at their time (Redis' now minus their age) and their
 * tokens into that second's TPM bucket; the micros are added to both periods. Answers the
 * admissions added. */
static const char RECONCILE_LUA[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local tag, nb = ARGV[1], tonumber(ARGV[2])\n"
    "local added = 0\n"
    "for i = 0, nb - 1 do\n"
    "  local age, count, tokens = tonumber(ARGV[3+i*5]), tonumber(ARGV[4+i*5]), "
    "tonumber(ARGV[5+i*5])\n"
    "  local at, kr, kt = now - age, KEYS[1+i*2], KEYS[2+i*2]\n"
    "  if age < 60000 then\n"
    "    if ARGV[6+i*5] == '1' then\n"
    "      for k = 1, count do redis.call('ZADD', kr, at, tag .. ':' .. i .. ':' .. k) end\n"
    "      redis.call('PEXPIRE', kr, 61000)\n"
    "      added = added + count\n"
    "    end\n"
    "    if ARGV[7+i*5] == '1' and tokens > 0 then\n"
    "      redis.call('HINCRBY', kt, math.floor(at / 1000), tokens)\n"
    "      redis.call('EXPIRE', kt, 62)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local sb, kb = 3 + nb * 5, nb * 2\n"
    "for j = 0, tonumber(ARGV[sb]) - 1 do\n"
    "  local m = tonumber(ARGV[sb+1+j])\n"
    "  redis.call('INCRBY', KEYS[kb+1+j*2], m)\n"
    "  redis.call('EXPIRE', KEYS[kb+1+j*2], 90000)\n"
    "  redis.call('INCRBY', KEYS[kb+2+j*2], m)\n"
    "  redis.call('EXPIRE', KEYS[kb+2+j*2], 2764800)\n"
    "end\n"
    "return added\n";

enum { OP_RESERVE, OP_RELEASE, OP_RENEW };
static const char *const scripts[3] = {RESERVE_LUA, RELEASE_LUA, RENEW_LUA};

/* Buckets and spend entries given back per script run (bounded arguments). */
#define RECONCILE_BUCKETS 64
#define RECONCILE_SPEND 16

struct mg_shared_s {
    mg_redis_t *r; /* borrowed */
    char prefix[80];
    char sha[3][41]; /* per OP_ */
    mg_shared_stats_t stats;
    int degraded_now;      /* the last request went on without Redis (logged once per change) */
    mg_backlog_t *backlog; /* owned: what went on without Redis, to be given back */
    char run[20];          /* this process' tag in the members it gives back */
    unsigned long long reconcile_runs;
};

/* One script run in flight: what it needs to be sent again as EVAL after NOSCRIPT. */
typedef struct op_s {
    mg_shared_t *s;
    int kind; /* OP_: release and renew are fire and forget */
    mg_shared_level_t lv[MG_SHARED_MAX_LEVELS];
    size_t n;
    char lease[MG_SHARED_LEASE_MAX];
    uint64_t tokens, ttl_ms, at_s;
    int64_t delta;
    int undo;
    mg_shared_spend_t spend; /* spend.n == 0: none */
    int evaled;              /* sent as EVAL already: no second retry */
    uint64_t sent_ns;
    mg_shared_cb cb;
    void *ud;
} op_t;

static void sha1_hex(const char *text, char out[41])
{
    unsigned char d[20];
    unsigned int n = 0;
    EVP_Digest(text, strlen(text), d, &n, EVP_sha1(), NULL);
    for (int i = 0; i < 20; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void on_loaded(void *ud, redisReply *reply)
{
    (void)ud;
    if (reply && reply->type == REDIS_REPLY_ERROR)
        mg_log_msg(MG_LOG_WARN, NULL, "cluster redis: SCRIPT LOAD refused: %.200s", reply->str);
}

static void load_scripts(void *ud)
{
    mg_shared_t *s = ud;
    for (int i = 0; i < 3; i++) {
        const char *argv[3] = {"SCRIPT", "LOAD", scripts[i]};
        size_t lens[3] = {6, 4, strlen(scripts[i])};
        mg_redis_command(s->r, on_loaded, s, 3, argv, lens);
    }
}

mg_shared_t *mg_shared_new(mg_redis_t *r, const char *prefix)
{
    if (!r) return NULL;
    mg_shared_t *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->r = r;
    snprintf(s->prefix, sizeof(s->prefix), "%s", prefix ? prefix : "moongate:");
    s->backlog = calloc(1, sizeof(*s->backlog));
    if (!s->backlog) {
        free(s);
        return NULL;
    }
    snprintf(s->run, sizeof(s->run), "b%llx", (unsigned long long)(uv_hrtime() ^ mg_unix_ms()));
    for (int i = 0; i < 3; i++) sha1_hex(scripts[i], s->sha[i]);
    mg_redis_on_connect(r, load_scripts, s);
    return s;
}

void mg_shared_free(mg_shared_t *s)
{
    if (!s) return;
    free(s->backlog);
    free(s);
}

mg_redis_t *mg_shared_redis(const mg_shared_t *s)
{
    return s ? s->r : NULL;
}

static void on_reply(void *ud, redisReply *reply);

/* EVALSHA (or EVAL) of the op's script with its keys and arguments. 0 or -1. */
static int send_op(op_t *op)
{
    mg_shared_t *s = op->s;
    enum {
        NKEYS = 3 * MG_SHARED_MAX_LEVELS + 4 * MG_SHARED_MAX_SPEND,
        NNUMS = 5 + 3 * MG_SHARED_MAX_LEVELS + 2 + 4 * MG_SHARED_MAX_SPEND,
        MAXARGS = 3 + NKEYS + 1 + NNUMS
    };
    char keys[NKEYS][sizeof(s->prefix) + MG_SHARED_NAME_MAX + 24];
    char nums[NNUMS][24];
    const mg_shared_spend_t *sp = &op->spend;
    const char *argv[MAXARGS];
    size_t lens[MAXARGS];
    int argc = 0, ni = 0;
#define ARG(str) (argv[argc] = (str), lens[argc] = strlen(argv[argc]), argc++)
#define NUM(fmt, v) (snprintf(nums[ni], sizeof(nums[ni]), fmt, v), ARG(nums[ni++]))
    const char *script = scripts[op->kind];
    int release = op->kind == OP_RELEASE;
    if (op->evaled) {
        argv[argc] = "EVAL", lens[argc++] = 4;
        argv[argc] = script, lens[argc++] = strlen(script);
    } else {
        argv[argc] = "EVALSHA", lens[argc++] = 7;
        ARG(s->sha[op->kind]);
    }
    NUM("%zu", op->n * 3 + sp->n * 4);
    static const char suffix[3] = {'r', 't', 'c'};
    int ki = 0;
    for (size_t i = 0; i < op->n; i++)
        for (int k = 0; k < 3; k++) {
            snprintf(keys[ki], sizeof(keys[0]), "%s%s:%c", s->prefix, op->lv[i].name, suffix[k]);
            ARG(keys[ki++]);
        }
    for (size_t j = 0; j < sp->n; j++) {
        const char *nm = sp->lv[j].name;
        snprintf(keys[ki], sizeof(keys[0]), "%ss:%s:h", s->prefix, nm);
        ARG(keys[ki++]);
        snprintf(keys[ki], sizeof(keys[0]), "%ss:%s:z", s->prefix, nm);
        ARG(keys[ki++]);
        snprintf(keys[ki], sizeof(keys[0]), "%ss:%s:d:%s", s->prefix, nm, sp->day);
        ARG(keys[ki++]);
        snprintf(keys[ki], sizeof(keys[0]), "%ss:%s:m:%s", s->prefix, nm, sp->month);
        ARG(keys[ki++]);
    }
    ARG(op->lease);
    if (release) {
        NUM("%llu", (unsigned long long)op->at_s);
        NUM("%lld", (long long)op->delta);
        ARG(op->undo ? "1" : "0");
    } else {
        NUM("%llu", (unsigned long long)op->tokens);
        NUM("%llu", (unsigned long long)op->ttl_ms);
    }
    NUM("%zu", op->n);
    for (size_t i = 0; i < op->n; i++) {
        NUM("%u", op->lv[i].rpm);
        NUM("%llu", (unsigned long long)op->lv[i].tpm);
        NUM("%u", op->lv[i].conc);
    }
    NUM("%zu", sp->n);
    NUM("%lld", (long long)(sp->micros > 0 ? sp->micros : 0));
    if (op->kind == OP_RESERVE)
        for (size_t j = 0; j < sp->n; j++) {
            NUM("%lld", (long long)sp->lv[j].daily);
            NUM("%lld", (long long)sp->lv[j].monthly);
            NUM("%lld", (long long)sp->lv[j].local_day);
            NUM("%lld", (long long)sp->lv[j].local_month);
        }
#undef ARG
#undef NUM
    return mg_redis_command(s->r, on_reply, op, argc, argv, lens);
}

static long long int_at(const redisReply *r, size_t i)
{
    return i < r->elements && r->element[i]->type == REDIS_REPLY_INTEGER ? r->element[i]->integer
                                                                         : 0;
}

/* The reserve script's reply as an answer. */
static void read_answer(mg_shared_t *s, const redisReply *reply, mg_shared_answer_t *a)
{
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 2) {
        if (reply && reply->type == REDIS_REPLY_ERROR)
            mg_log_msg(MG_LOG_WARN, NULL, "cluster redis: the limits script failed: %.200s",
                       reply->str);
        s->stats.unavailable++;
        return;
    }
    if (s->degraded_now) {
        s->degraded_now = 0;
        mg_log_msg(MG_LOG_INFO, NULL, "cluster limits shared through redis again");
    }
    long long kind = int_at(reply, 0);
    if (kind == 1) {
        a->rc = MG_SHARED_OK;
        a->at_s = (uint64_t)int_at(reply, 1);
        s->stats.reserved++;
        return;
    }
    a->rc = kind == 0 ? MG_SHARED_REFUSED : MG_SHARED_TOO_LARGE;
    a->level = (int)int_at(reply, 1);
    a->limit = (int)int_at(reply, 2);
    long long wait = int_at(reply, 3);
    if (a->limit >= 4) a->held_micros = wait; /* a spend level: what is held there */
    else a->retry_after_ms = wait > 0 ? (uint64_t)wait : 0;
    s->stats.refused++;
}

static void on_reply(void *ud, redisReply *reply)
{
    op_t *op = ud;
    mg_shared_t *s = op->s;
    if (reply && reply->type == REDIS_REPLY_ERROR && !op->evaled &&
        strncmp(reply->str, "NOSCRIPT", 8) == 0) {
        s->stats.noscript++;
        op->evaled = 1;
        if (send_op(op) == 0) return; /* the same op, answered later */
        reply = NULL;
    }
    if (op->kind != OP_RESERVE) {
        if (reply && reply->type != REDIS_REPLY_ERROR) {
            if (op->kind == OP_RELEASE) s->stats.released++;
            else s->stats.renewed += reply->type == REDIS_REPLY_INTEGER ? reply->integer : 0;
        }
        free(op);
        return;
    }
    mg_shared_answer_t a = {.rc = MG_SHARED_UNAVAILABLE, .level = -1};
    read_answer(s, reply, &a);
    if (a.rc != MG_SHARED_UNAVAILABLE) {
        s->stats.rtt_ms_sum += (double)(uv_hrtime() - op->sent_ns) / 1e6;
        s->stats.rtt_n++;
    }
    mg_shared_cb cb = op->cb;
    void *cud = op->ud;
    free(op);
    cb(cud, &a);
}

static op_t *op_new(mg_shared_t *s, const mg_shared_level_t *lv, size_t n, const char *lease,
                    const mg_shared_spend_t *spend)
{
    size_t m = spend ? spend->n : 0;
    if (!s || n + m == 0 || n > MG_SHARED_MAX_LEVELS || m > MG_SHARED_MAX_SPEND) return NULL;
    op_t *op = calloc(1, sizeof(*op));
    if (!op) return NULL;
    op->s = s;
    op->n = n;
    if (n) memcpy(op->lv, lv, n * sizeof(*lv));
    if (m) op->spend = *spend;
    snprintf(op->lease, sizeof(op->lease), "%s", lease);
    return op;
}

int mg_shared_reserve(mg_shared_t *s, const mg_shared_level_t *lv, size_t n, const char *lease,
                      uint64_t tokens, uint64_t lease_ttl_ms, const mg_shared_spend_t *spend,
                      mg_shared_cb cb, void *ud)
{
    mg_shared_reconcile(s); /* sent first: Redis runs it before this reservation */
    op_t *op = op_new(s, lv, n, lease, spend);
    if (!op) return -1;
    op->tokens = tokens;
    op->ttl_ms = lease_ttl_ms;
    op->cb = cb;
    op->ud = ud;
    op->sent_ns = uv_hrtime();
    if (send_op(op) != 0) {
        free(op);
        s->stats.unavailable++;
        return -1;
    }
    return 0;
}

void mg_shared_release(mg_shared_t *s, const mg_shared_level_t *lv, size_t n, const char *lease,
                       uint64_t at_s, int64_t token_delta, int undo, const mg_shared_spend_t *spend)
{
    op_t *op = op_new(s, lv, n, lease, spend);
    if (!op) return;
    op->kind = OP_RELEASE;
    op->at_s = at_s;
    op->delta = token_delta;
    op->undo = undo;
    if (send_op(op) != 0) free(op); /* the leases expire by themselves */
}

void mg_shared_renew(mg_shared_t *s, const mg_shared_level_t *lv, size_t n, const char *lease,
                     uint64_t lease_ttl_ms, const mg_shared_spend_t *spend)
{
    op_t *op = op_new(s, lv, n, lease, spend);
    if (!op) return;
    op->kind = OP_RENEW;
    op->ttl_ms = lease_ttl_ms;
    if (send_op(op) != 0) free(op); /* the next tick tries again, within the lease's time */
}

const char *mg_shared_script(int which)
{
    return which >= 0 && which < 3 ? scripts[which] : NULL;
}

void mg_shared_note_degraded(mg_shared_t *s, int mode)
{
    if (!s || mode < 0 || mode > 2) return;
    s->stats.degraded[mode]++;
    if (s->degraded_now) return;
    s->degraded_now = 1;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_WARN, "cluster limits degraded");
    mg_log_str(&l, "component", "redis");
    mg_log_str(&l, "mode", mg_cluster_degraded_name((mg_cluster_degraded_t)mode));
    mg_log_end(&l);
}

void mg_shared_stats(const mg_shared_t *s, mg_shared_stats_t *out)
{
    if (s) *out = s->stats;
    else memset(out, 0, sizeof(*out));
}

/* ------------------------------------------------------------------------ */
/* Reconciliation: what went on without Redis, given back                    */
/* ------------------------------------------------------------------------ */

void mg_shared_note_local(mg_shared_t *s, const mg_shared_level_t *lv, size_t n, uint64_t tokens)
{
    if (s && n) mg_backlog_admit(s->backlog, lv, n, tokens, mg_unix_ms());
}

void mg_shared_note_local_spend(mg_shared_t *s, const mg_shared_spend_t *spend)
{
    if (s && spend && spend->n) mg_backlog_spend(s->backlog, spend);
}

/* One script run in flight: what it gives back, counted when Redis answers. */
typedef struct given_s {
    mg_shared_t *s;
    unsigned long long admissions;
    int64_t micros;
} given_t;

static void on_reconciled(void *ud, redisReply *reply)
{
    given_t *g = ud;
    mg_shared_stats_t *st = &g->s->stats;
    if (reply && reply->type == REDIS_REPLY_INTEGER) {
        st->reconciled += (unsigned long long)reply->integer;
        st->reconciled_micros += (unsigned long long)g->micros;
    } else { /* lost, or applied without our knowing: never sent twice (no double count) */
        if (reply && reply->type == REDIS_REPLY_ERROR)
            mg_log_msg(MG_LOG_WARN, NULL, "cluster redis: the reconcile script failed: %.200s",
                       reply->str);
        st->reconcile_lost += g->admissions;
    }
    free(g);
}

/* The arguments of one run: up to RECONCILE_BUCKETS buckets and RECONCILE_SPEND entries. */
#define RECONCILE_KEYS (2 * (RECONCILE_BUCKETS + RECONCILE_SPEND))
#define RECONCILE_NUMS (3 + 5 * RECONCILE_BUCKETS + 1 + RECONCILE_SPEND)
typedef struct reconcile_args_s {
    mg_backlog_bucket_t b[RECONCILE_BUCKETS];
    mg_backlog_spend_t sp[RECONCILE_SPEND];
    char keys[RECONCILE_KEYS][80 + MG_SHARED_NAME_MAX + 24];
    char nums[RECONCILE_NUMS][32];
    const char *argv[2 + RECONCILE_KEYS + RECONCILE_NUMS];
    size_t lens[2 + RECONCILE_KEYS + RECONCILE_NUMS];
} reconcile_args_t;

/* Send one run with what the backlog still holds (taken out of it). 0 or -1. */
static int reconcile_once(mg_shared_t *s, reconcile_args_t *a, uint64_t now_ms)
{
    size_t nb = mg_backlog_take(s->backlog, a->b, RECONCILE_BUCKETS);
    size_t ns = mg_backlog_take_spend(s->backlog, a->sp, RECONCILE_SPEND);
    given_t *g = calloc(1, sizeof(*g));
    if (!g) return -1;
    g->s = s;
    int argc = 0, ki = 0, ni = 0;
#define ARG(str) (a->argv[argc] = (str), a->lens[argc] = strlen(a->argv[argc]), argc++)
#define NUM(fmt, v) (snprintf(a->nums[ni], sizeof(a->nums[ni]), fmt, v), ARG(a->nums[ni++]))
#define KEY(...) (snprintf(a->keys[ki], sizeof(a->keys[ki]), __VA_ARGS__), ARG(a->keys[ki++]))
    ARG("EVAL");
    ARG(RECONCILE_LUA);
    NUM("%zu", 2 * (nb + ns));
    for (size_t i = 0; i < nb; i++) {
        KEY("%s%s:r", s->prefix, a->b[i].name);
        KEY("%s%s:t", s->prefix, a->b[i].name);
    }
    for (size_t j = 0; j < ns; j++) {
        KEY("%ss:%s:d:%s", s->prefix, a->sp[j].name, a->sp[j].day);
        KEY("%ss:%s:m:%s", s->prefix, a->sp[j].name, a->sp[j].month);
    }
    snprintf(a->nums[ni], sizeof(a->nums[ni]), "%s:%llu", s->run, ++s->reconcile_runs);
    ARG(a->nums[ni++]);
    NUM("%zu", nb);
    for (size_t i = 0; i < nb; i++) {
        const mg_backlog_bucket_t *b = &a->b[i];
        NUM("%llu", (unsigned long long)(now_ms > b->last_ms ? now_ms - b->last_ms : 0));
        NUM("%u", b->count);
        NUM("%llu", (unsigned long long)b->tokens);
        ARG(b->rpm ? "1" : "0");
        ARG(b->tpm ? "1" : "0");
        if (b->rpm) g->admissions += b->count;
    }
    NUM("%zu", ns);
    for (size_t j = 0; j < ns; j++) {
        NUM("%lld", (long long)a->sp[j].micros);
        g->micros += a->sp[j].micros;
    }
#undef KEY
#undef NUM
#undef ARG
    if (mg_redis_command(s->r, on_reconciled, g, argc, a->argv, a->lens) != 0) {
        s->stats.reconcile_lost += g->admissions;
        free(g);
        return -1;
    }
    return 0;
}

void mg_shared_reconcile(mg_shared_t *s)
{
    if (!s || !mg_backlog_pending(s->backlog) || !mg_redis_up(s->r)) return;
    uint64_t now = mg_unix_ms();
    mg_backlog_age(s->backlog, now);
    reconcile_args_t *a = malloc(sizeof(*a));
    if (!a) return;
    while (mg_backlog_pending(s->backlog))
        if (reconcile_once(s, a, now) != 0) break;
    free(a);
    s->stats.backlog_dropped = s->backlog->dropped;
}

const char *mg_shared_reconcile_script(void)
{
    return RECONCILE_LUA;
}
