// Limits shared through Redis (issue 24): three moongate instances (each its own SQLite, keys
// numbered alike) share one real redis-server and one mock engine. A key's RPM limit hit from
// all three admits exactly the limit, not three times it; a provider's RPM likewise; a key's
// concurrency cap holds across instances, the leases of running requests are renewed past
// their TTL, and those of an instance killed with SIGKILL return once it passes; with Redis stopped (SIGSTOP) each instance does what its
// cluster.redis.degraded says (local, fail_closed, fail_open), within timeout_ms, shown in
// /status and the metrics; Redis back: shared again, and what the degraded instances let
// through is given back to the shared windows (reconciled).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { REPO_ROOT, adminCall, buildConfig, deadPort, startMock, waitFor } from './lib/harness.mjs';
import { closeInstances, startInstances } from './lib/instances.mjs';
import { startRedis } from './lib/redis.mjs';

const ADMIN_TOKEN = 'adm-cluster-limits-e2e-77a1';
const N = 3;
const MODES = ['local', 'fail_closed', 'fail_open']; // instance i's cluster.redis.degraded
const TIMEOUT_MS = 100;
const TOTAL_MS = 4000; // the requests' total deadline: a lease lives that long + 2 s at most
const LEASE_TTL_MS = 1500; // cluster.redis.lease_ttl_ms: renewed every 500 ms while running

let redis;
let mock;
const dirs = [];
const gws = [];

function config(dir, i, dead) {
    const lua = { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') };
    const c = buildConfig(dir, mock.port, dead, { lua, timeouts: { total_ms: TOTAL_MS } });
    const m = `http://127.0.0.1:${mock.port}/v1`;
    return {
        ...c,
        auth: { enabled: true },
        health: { probes: false },
        providers: [...c.providers, { id: 'mock-limited', adapter: 'openai', base_url: m, rpm_limit: 9 },
            { id: 'mock-cool', adapter: 'openai', base_url: m },
            // spend: every token costs 2 per 1,000 (the estimate and the charge alike)
            { id: 'mock-priced', adapter: 'openai', base_url: m, cost_per_1k_tokens: 2 },
            { id: 'mock-brk', adapter: 'openai', base_url: m }],
        // three failures in a row open a breaker for 2 s (the defaults but the duration)
        circuit_breaker: { consecutive_failures: 3, open_duration_seconds: 2 },
        models: {
            chat: { tokenizer: 'estimate', routes: [{ provider: 'mock-openai', model: 'up-chat' }] },
            slow: { tokenizer: 'estimate', routes: [{ provider: 'mock-openai', model: 'up-slow' }] },
            priced: { tokenizer: 'estimate', routes: [{ provider: 'mock-priced', model: 'up-priced' }] },
            brk: {
                tokenizer: 'estimate',
                routes: [{ provider: 'mock-brk', model: 'up-brk' }, { provider: 'mock-openai-b', model: 'up-brk-b', priority: 1 }],
            },
            limited: { tokenizer: 'estimate', routes: [{ provider: 'mock-limited', model: 'up-limited' }] },
            cool: {
                tokenizer: 'estimate',
                routes: [{ provider: 'mock-cool', model: 'up-cool' }, { provider: 'mock-openai-b', model: 'up-cool-b', priority: 1 }],
            },
        },
        cluster: {
            node_id: `node-${i}`,
            // expected_instances: in local mode node-0 enforces half of each limit
            redis: {
                url: redis.url, timeout_ms: TIMEOUT_MS, degraded: MODES[i], lease_ttl_ms: LEASE_TTL_MS,
                ...(i === 0 ? { expected_instances: 2 } : {}),
            },
        },
    };
}

const admin = (i, method, p, body) => adminCall(gws[i].base, ADMIN_TOKEN, method, p, body);

/** The same tenant and key (same ids) on every instance; the secrets differ. */
async function keyEverywhere(name, limits) {
    const secrets = [];
    let id;
    for (let i = 0; i < N; i++) {
        const t = await admin(i, 'POST', 'tenants', { name });
        assert.equal(t.status, 201, t.text);
        const k = await admin(i, 'POST', 'keys', { tenant_id: t.json.id, ...limits });
        assert.equal(k.status, 201, k.text);
        if (id === undefined) id = k.json.id;
        assert.equal(k.json.id, id, 'the instances number keys alike');
        secrets.push(k.json.key);
    }
    return { id, secrets };
}

async function chat(i, secret, model = 'chat', timeoutMs = 10000) {
    const t0 = performance.now();
    const r = await fetch(`${gws[i].base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${secret}` },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 }),
        signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: r.status, json, ms: performance.now() - t0 };
}

const status = async (i) => (await fetch(`${gws[i].base}/status`)).json();
const metrics = async (i) => (await fetch(`http://127.0.0.1:${gws[i].metricsPort}/metrics`)).text();
const redisCli = (...args) => execFileSync('redis-cli', ['-p', String(redis.port), ...args], { encoding: 'utf8' }).trim();

before(async () => {
    redis = await startRedis();
    mock = await startMock();
    await mock.script({ model: 'up-slow', action: { delay_first_byte_ms: 30000 } });
    await mock.script({ model: 'up-priced', action: { delay_first_byte_ms: 400 } });
    const dead = await deadPort();
    const up = await startInstances(N, 'limits', (dir, i) => config(dir, i, dead), { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
    dirs.push(...up.dirs);
    gws.push(...up.gws);
    for (let i = 0; i < N; i++)
        await waitFor(async () => (await status(i)).cluster.redis.state === 'up', { what: `node-${i} redis up` });
});

after(async () => {
    await closeInstances(gws, dirs);
    await mock?.close().catch(() => {});
    await redis?.stop();
});

describe('limits shared through redis', () => {
    test('a key\'s RPM hit from three instances under skewed load: exactly the limit admitted', async () => {
        const LIMIT = 12;
        const k = await keyEverywhere('rpm-tenant', { rpm_limit: LIMIT });
        const share = [30, 20, 10]; // uneven: half of the load on one instance
        const jobs = [];
        for (let i = 0; i < N; i++) for (let j = 0; j < share[i]; j++) jobs.push(chat(i, k.secrets[i]));
        const rs = await Promise.all(jobs);
        const ok = rs.filter((r) => r.status === 200).length;
        const limited = rs.filter((r) => r.status === 429);
        console.log(`key rpm ${LIMIT}: ${ok} admitted of ${rs.length} sent from ${N} instances (${share.join('/')})`);
        assert.equal(ok, LIMIT, 'exactly the limit across instances, not N times it');
        assert.equal(limited.length, rs.length - LIMIT);
        for (const r of limited) {
            assert.equal(r.json.error.code, 'RATE_LIMITED');
            assert.match(r.json.error.message, /key's rpm limit/);
        }
        assert.equal(Number(redisCli('ZCARD', `moongate:k:${k.id}:r`)), LIMIT, 'the shared log holds the admissions');
        // every instance asked Redis (the limit is not one instance's local count); one whose
        // requests all came after the others had taken the limit reserved none, refused all
        for (let i = 0; i < N; i++) {
            const sl = (await status(i)).cluster.redis.shared_limits;
            assert.equal(sl.reserved + sl.refused, share[i], `node-${i}: every request decided by the script`);
        }
    });

    test('a provider\'s RPM across instances: its limit is the bound; its refusals roll back the key\'s', async () => {
        const k = await keyEverywhere('prov-tenant', { rpm_limit: 1000 });
        const jobs = [];
        for (let i = 0; i < N; i++) for (let j = 0; j < 8; j++) jobs.push(chat(i, k.secrets[i], 'limited'));
        const rs = await Promise.all(jobs);
        const ok = rs.filter((r) => r.status === 200).length;
        console.log(`provider rpm 9: ${ok} admitted of ${rs.length}; others: ${[...new Set(rs.filter((r) => r.status !== 200).map((r) => `${r.status} ${r.json?.error?.code}`))]}`);
        assert.equal(ok, 9);
        for (const r of rs.filter((x) => x.status !== 200)) assert.equal(r.status, 503);
        // all or nothing: the requests the provider's window refused left the key's log alone
        assert.equal(Number(redisCli('ZCARD', `moongate:k:${k.id}:r`)), 9);
        assert.equal(Number(redisCli('ZCARD', 'moongate:v:mock-limited:r')), 9);
    });

    test('a key\'s TPM: the estimate reserved, corrected to the usage at the end; too large refused', async () => {
        const k = await keyEverywhere('tpm-tenant', { tpm_limit: 100000 });
        const rs = await Promise.all([0, 1, 2, 0, 1, 2].map((i) => chat(i, k.secrets[i])));
        assert.deepEqual(rs.map((r) => r.status), [200, 200, 200, 200, 200, 200]);
        const used = rs.reduce((n, r) => n + r.json.usage.total_tokens, 0);
        const counted = () => redisCli('HVALS', `moongate:k:${k.id}:t`).split('\n').filter(Boolean).reduce((n, v) => n + Number(v), 0);
        await waitFor(() => counted() === used, { what: `the window holds the usage (${used} tokens)` });
        const small = await keyEverywhere('tpm-small', { tpm_limit: 5 });
        const r = await chat(1, small.secrets[1]);
        assert.equal(r.status, 429);
        assert.match(r.json.error.message, /exceed the key's tpm_limit/);
    });

    test('a key\'s daily spend limit across instances: the estimate held, the cost charged, never overspent', async () => {
        const day = new Date().toISOString().slice(0, 10);
        const spentIn = (id) => Number(redisCli('GET', `moongate:s:k:${id}:d:${day}`) || 0);
        const heldIn = (id) => Number(redisCli('HGET', `moongate:s:k:${id}:h`, '_sum') || 0);
        // one request: what it holds while it runs (the estimate) and what it is charged
        const probe = await keyEverywhere('spend-probe', { daily_limit_micros: 1e12 });
        const one = chat(0, probe.secrets[0], 'priced');
        let est = 0;
        await waitFor(() => (est = heldIn(probe.id)) > 0, { what: 'the estimate held in redis' });
        assert.equal((await one).status, 200);
        await waitFor(() => spentIn(probe.id) > 0 && heldIn(probe.id) === 0, { what: 'the cost charged, the hold gone' });
        const cost = spentIn(probe.id);
        assert.ok(cost > 0 && cost <= est, `cost ${cost} within the estimate ${est}`);
        // a limit for 10.5 estimates; bursts of 30 (10 per instance) until it refuses every one
        const LIMIT = Math.floor(10.5 * est);
        const k = await keyEverywhere('spend-tenant', { daily_limit_micros: LIMIT });
        const admitted = [];
        for (let burst = 0; burst < 40; burst++) {
            const rs = await Promise.all(Array.from({ length: 30 }, (_, j) => chat(j % N, k.secrets[j % N], 'priced')));
            const ok = rs.filter((r) => r.status === 200).length;
            admitted.push(ok);
            for (const r of rs.filter((x) => x.status !== 200)) {
                assert.equal(r.status, 429);
                assert.equal(r.json.error.code, 'QUOTA_EXCEEDED');
            }
            if (ok === 0) break;
        }
        const total = admitted.reduce((a, b) => a + b, 0);
        await waitFor(() => heldIn(k.id) === 0, { what: 'every hold gone' });
        const spent = spentIn(k.id);
        console.log(`daily spend limit ${LIMIT} micros (estimate ${est}, cost ${cost} a request), bursts of 30 from ${N} instances: `
            + `admitted ${admitted.join('+')} = ${total}, spent ${spent} (${(100 * spent / LIMIT).toFixed(1)}% of the limit)`);
        assert.equal(admitted[0], 10, 'the first burst: exactly the estimates that fit, across instances');
        assert.equal(spent, total * cost, 'every admitted request charged once');
        assert.ok(spent <= LIMIT, 'never overspent');
        assert.ok(LIMIT - spent < est, 'the budget used up to less than one estimate');
        const last = await chat(1, k.secrets[1], 'priced');
        assert.equal(last.status, 429);
        assert.match(last.json.error.message, /daily spend limit/);
    });

    test('added latency: one round trip per request on loopback', async () => {
        const k = await keyEverywhere('lat-tenant', { rpm_limit: 100000, max_concurrency: 100 });
        const free = await keyEverywhere('lat-free', {}); // no limits: no round trip
        const time = async (secret) => {
            const t = [];
            for (let j = 0; j < 40; j++) t.push((await chat(0, secret)).ms);
            t.sort((a, b) => a - b);
            return t[Math.floor(t.length / 2)];
        };
        await time(free.secrets[0]); // warm
        const plain = await time(free.secrets[0]);
        const shared = await time(k.secrets[0]);
        const st = (await status(0)).cluster.redis.shared_limits;
        console.log(`median request: ${plain.toFixed(2)} ms without shared limits, ${shared.toFixed(2)} ms with; `
            + `script round trip avg ${st.rtt_ms_avg.toFixed(3)} ms`);
        assert.ok(st.rtt_ms_avg > 0 && st.rtt_ms_avg < TIMEOUT_MS);
    });

    test('scripts flushed (a restarted Redis): NOSCRIPT, then EVAL, the request admitted', async () => {
        const k = await keyEverywhere('noscript-tenant', { rpm_limit: 5 });
        const before_ = (await status(1)).cluster.redis.shared_limits.noscript;
        assert.equal(redisCli('SCRIPT', 'FLUSH'), 'OK');
        const r = await chat(1, k.secrets[1]);
        assert.equal(r.status, 200);
        const st = (await status(1)).cluster.redis.shared_limits;
        assert.equal(st.noscript, before_ + 1);
        assert.equal(Number(redisCli('ZCARD', `moongate:k:${k.id}:r`)), 1);
    });

    test('redis stopped: each instance in its degraded mode, within timeout_ms; back: shared', async () => {
        const k = await keyEverywhere('degraded-tenant', { rpm_limit: 4 });
        redis.pause();
        try {
            // a client that leaves while its request waits for Redis: the call ends cleanly
            const gone = await chat(0, k.secrets[0], 'chat', 30).then(() => 'answered', () => 'aborted');
            assert.equal(gone, 'aborted');
            await new Promise((r) => setTimeout(r, TIMEOUT_MS * 2));
            // fail_closed: 503 with a clear code, no longer than timeout_ms on Redis
            const closed = await chat(1, k.secrets[1]);
            assert.equal(closed.status, 503);
            assert.equal(closed.json.error.code, 'CLUSTER_UNAVAILABLE');
            assert.ok(closed.ms < TIMEOUT_MS + 900, `answered in ${closed.ms} ms`);
            // fail_open: admitted beyond the key's limit
            const open = [];
            for (let j = 0; j < 4; j++) open.push(await chat(2, k.secrets[2]));
            assert.deepEqual(open.map((r) => r.status), [200, 200, 200, 200]);
            // local: this instance's own limiter, its share of the key's 4 a minute (2 instances)
            const local = [];
            for (let j = 0; j < 4; j++) local.push(await chat(0, k.secrets[0]));
            assert.deepEqual(local.map((r) => r.status), [200, 200, 429, 429]);
            for (const r of [...open, ...local]) assert.ok(r.ms < TIMEOUT_MS + 900, `answered in ${r.ms} ms`);
            for (let i = 0; i < N; i++) {
                const st = (await status(i)).cluster.redis;
                assert.equal(st.state, 'degraded');
                assert.equal(st.degraded_mode, MODES[i]);
                assert.equal(st.limits, MODES[i]);
                assert.ok(st.shared_limits.degraded[MODES[i]] >= 1);
                const m = await metrics(i);
                assert.match(m, new RegExp(`^moongate_cluster_limits_degraded_total\\{mode="${MODES[i]}"\\} [1-9]`, 'm'));
                assert.match(m, /^moongate_cluster_degraded\{component="redis"\} 1$/m);
                await gws[i].waitLog((l) => l.msg === 'cluster limits degraded' && l.mode === MODES[i], { timeoutMs: 2000 });
            }
        } finally {
            redis.resume();
        }
        for (let i = 0; i < N; i++)
            await waitFor(async () => (await status(i)).cluster.redis.limits === 'shared', { timeoutMs: 5000, what: `node-${i} shared again` });
        // reconciled: what fail_open (4) and local (2) let through joins the shared minute, so
        // Redis does not admit the key's 4 again on top of them. Without it the log holds at
        // most the limit (the scripts sent before the outage was noticed, each checked).
        // Each instance counts its own give-back once Redis answered it; the log alone is not the
        // sign (scripts sent into the paused server run on resume and fill it before the give-back).
        const given = [];
        await waitFor(async () => {
            for (let i = 0; i < N; i++) given[i] = (await status(i)).cluster.redis.shared_limits.reconciled;
            return given[0].admissions >= 2 && given[2].admissions >= 4;
        }, { timeoutMs: 3000, what: 'the degraded admissions given back' }).catch((err) => {
            throw new Error(`${err.message}; reconciled: ${JSON.stringify(given)}`);
        });
        assert.ok(Number(redisCli('ZCARD', `moongate:k:${k.id}:r`)) >= 6);
        assert.equal(given[1].admissions, 0, 'fail_closed let nothing through');
        assert.deepEqual(given.map((g) => g.lost), [0, 0, 0]);
        for (let i = 0; i < N; i++) assert.equal((await chat(i, k.secrets[i])).status, 429, `node-${i}: the minute is spent`);
        assert.match(await metrics(2), /^moongate_cluster_limits_reconciled_total [4-9]/m);
    });

    test('a 429 seen by one instance cools the provider on the others within 100 ms', async () => {
        const k = await keyEverywhere('cool-tenant', {});
        const avail = async (i) => (await status(i)).providers.find((p) => p.id === 'mock-cool').cooldown_remaining_ms === 0;
        for (let i = 0; i < N; i++) assert.equal(await avail(i), true);
        await mock.script({ model: 'up-cool', times: 1, action: { status: 429, headers: { 'retry-after': '20' } } });
        const t0 = performance.now();
        const watch = [1, 2].map(async (i) => {
            for (;;) { // bounded by the waitFor below
                if (!(await avail(i))) return performance.now() - t0;
                if (performance.now() - t0 > 3000) return Infinity;
            }
        });
        const r = await chat(0, k.secrets[0], 'cool');
        assert.equal(r.status, 200, 'node-0 failed over to the second route');
        const seen = await Promise.all(watch);
        console.log(`429 on node-0: cooling on node-1 after ${seen[0].toFixed(1)} ms, node-2 after ${seen[1].toFixed(1)} ms (from the request's start)`);
        for (const ms of seen) assert.ok(ms < 100, `cooled after ${ms} ms`);
        assert.equal(await avail(0), false);
        for (const i of [1, 2]) {
            const line = await gws[i].waitLog((l) => l.msg === 'cooldown heard' && l.provider === 'mock-cool', { timeoutMs: 1000 });
            assert.equal(line.from_node, 'node-0');
            assert.ok(line.cooldown_s >= 20);
        }
        // the others send nothing to it now: straight to the second route
        const sentTo = async (model) => (await mock.requests()).filter((x) => x.body?.model === model).length;
        const [cool0, b0] = [await sentTo('up-cool'), await sentTo('up-cool-b')];
        assert.equal(cool0, 1);
        for (const i of [1, 2]) assert.equal((await chat(i, k.secrets[i], 'cool')).status, 200);
        assert.equal(await sentTo('up-cool'), cool0, 'no request to the cooling provider');
        assert.equal(await sentTo('up-cool-b'), b0 + 2);
    });

    test('a breaker one instance opens opens on the others; its close closes them', async () => {
        const k = await keyEverywhere('brk-tenant', {});
        const routeBreaker = async (i) => {
            const r = await admin(i, 'GET', 'providers/mock-brk');
            assert.equal(r.status, 200, r.text);
            return r.json.routes.find((x) => x.model === 'up-brk')?.breaker;
        };
        for (let i = 0; i < N; i++) assert.equal(await routeBreaker(i), 'closed');
        await mock.script({ model: 'up-brk', times: 3, action: { status: 503 } });
        for (let j = 0; j < 3; j++) assert.equal((await chat(0, k.secrets[0], 'brk')).status, 200, 'failed over');
        assert.equal(await routeBreaker(0), 'open');
        const t0 = performance.now();
        for (const i of [1, 2]) await waitFor(async () => (await routeBreaker(i)) === 'open', { timeoutMs: 1000, intervalMs: 5, what: `node-${i} breaker open` });
        const heard = performance.now() - t0;
        for (const i of [1, 2]) {
            const line = await gws[i].waitLog((l) => l.msg === 'breaker heard' && l.provider === 'mock-brk' && l.state === 'open', { timeoutMs: 1000 });
            assert.equal(line.from_node, 'node-0');
        }
        const sentTo = async (model) => (await mock.requests()).filter((x) => x.body?.model === model).length;
        const before_ = await sentTo('up-brk');
        for (const i of [1, 2]) assert.equal((await chat(i, k.secrets[i], 'brk')).status, 200);
        assert.equal(await sentTo('up-brk'), before_, 'the others send nothing to the open route');
        // its period over, node-0's probe succeeds: every instance closes, without a probe of its own
        await new Promise((r) => setTimeout(r, 2100));
        assert.equal(await routeBreaker(1), 'half_open');
        assert.equal((await chat(0, k.secrets[0], 'brk')).status, 200);
        assert.equal(await routeBreaker(0), 'closed');
        for (const i of [1, 2]) await waitFor(async () => (await routeBreaker(i)) === 'closed', { timeoutMs: 1000, intervalMs: 5, what: `node-${i} breaker closed` });
        assert.equal(await sentTo('up-brk'), before_ + 1, 'one probe in the cluster');
        console.log(`breaker opened on node-0: open on the others within ${heard.toFixed(1)} ms of its status read`);
    });

    test('a key\'s concurrency cap across instances; running requests keep their leases; a killed instance\'s return after their TTL', async () => {
        const k = await keyEverywhere('conc-tenant', { max_concurrency: 2 });
        // two slow requests on instance 2 hold both leases
        const held = [chat(2, k.secrets[2], 'slow', 60000).catch(() => null), chat(2, k.secrets[2], 'slow', 60000).catch(() => null)];
        await waitFor(async () => Number(redisCli('ZCARD', `moongate:k:${k.id}:c`)) === 2, { what: 'two leases held' });
        const other = await chat(0, k.secrets[0]);
        assert.equal(other.status, 429, 'the cap holds on another instance');
        assert.match(other.json.error.message, /key's concurrency limit/);
        // past the leases' TTL the requests still run: their instance renewed them
        await new Promise((r) => setTimeout(r, LEASE_TTL_MS + 500));
        assert.equal(Number(redisCli('ZCARD', `moongate:k:${k.id}:c`)), 2, 'both leases renewed');
        assert.equal((await chat(1, k.secrets[1])).status, 429, 'the cap still holds past the TTL');
        assert.ok((await status(2)).cluster.redis.shared_limits.renewed >= 4, 'renewed by its instance');
        const killedAt = performance.now();
        gws[2].child.kill('SIGKILL');
        await Promise.all(held);
        const right = await chat(1, k.secrets[1]);
        assert.equal(right.status, 429, 'a dead instance\'s leases still count until they expire');
        await waitFor(async () => (await chat(0, k.secrets[0])).status === 200,
            { timeoutMs: TOTAL_MS + 6000, intervalMs: 200, what: 'the leases expired' });
        const back = performance.now() - killedAt;
        console.log(`leases of the killed instance returned ${Math.round(back)} ms after SIGKILL (lease ttl ${LEASE_TTL_MS} ms)`);
        assert.ok(back <= LEASE_TTL_MS + 1500, 'within the lease TTL, not the requests\' deadline');
        await waitFor(async () => Number(redisCli('ZCARD', `moongate:k:${k.id}:c`)) === 0, { what: 'no lease left once the request ended' });
    });
});
