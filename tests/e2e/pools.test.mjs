// Provider pools (issue 3): 429 cooldown shifting traffic, the degradation chain (main ->
// fallback -> emergency at 10% RPM -> 503 openclaw_fallback), cooldown surviving a restart,
// exact RPM limits under a burst, pinning, local_only, smaller routes, weighted split, the
// circuit breakers (per provider and per provider+model route) and the admin read API.
//
// Every describe block starts its own mock engine and gateway with a config built for it, so
// cooldowns and breaker state never leak from one scenario into another. Providers share the
// mock; each route has its own upstream model name, which is how the mock's records tell the
// providers apart. Every wait is bounded.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import {
    REPO_ROOT, startMock, startGateway, deadPort, toYaml, postJson, postStream, waitFor, withTimeout, sleep, sqliteRows,
} from './lib/harness.mjs';
import { contentFor } from '../mock/engine.mjs';

const ADMIN_TOKEN = 'adm-pools-e2e-token-7f3a9c';
const messages = [{ role: 'user', content: 'pool me' }];

// ---------------------------------------------------------------------------
// one scenario: a mock, a config, a gateway (restartable on the same storage)
// ---------------------------------------------------------------------------

/**
 * Start a mock and a gateway. build(mockBase) returns { providers, models, routing?,
 * circuit_breaker?, upstream? }; mockBase is "http://127.0.0.1:PORT". Returns a scenario
 * object with helpers; close() stops everything. env: extra environment for the gateway.
 */
async function scenario(build, { env = {} } = {}) {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-pools-'));
    const sc = { dir, mock: null, gw: null };
    sc.close = async () => {
        if (sc.gw) await sc.gw.close().catch(() => {});
        if (sc.mock) await sc.mock.close().catch(() => {});
        if (!process.env.MOONGATE_E2E_KEEP) await fsp.rm(dir, { recursive: true, force: true }).catch(() => {});
    };
    try {
        sc.mock = await startMock();
        const b = build(sc.mock.base);
        const config = {
            server: { listen: '127.0.0.1:0', metrics_listen: '127.0.0.1:0' },
            storage: { path: path.join(dir, 'moongate.db') },
            auth: { enabled: false },
            lua: {
                policies: path.join(REPO_ROOT, 'policies'),
                adapters: path.join(REPO_ROOT, 'adapters'),
                lib: path.join(REPO_ROOT, 'lua'),
            },
            log: { level: 'info' },
            upstream: { max_retries: 3, ...(b.upstream ?? {}) },
            timeouts: { connect_ms: 1000, first_byte_ms: 5000, drain_ms: 2000 },
            routing: { queue_timeout_ms: 1000, ...(b.routing ?? {}) },
            circuit_breaker: b.circuit_breaker,
            health: { probes: false, ...(b.health ?? {}) },
            providers: b.providers,
            models: b.models,
        };
        sc.config = config;
        sc.configPath = path.join(dir, 'moongate.yaml');
        fs.writeFileSync(sc.configPath, toYaml(config));
        sc.env = { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN, ...env };
        sc.gw = await startGateway(sc.configPath, { env: sc.env });
        return Object.assign(sc, helpers(sc));
    } catch (err) {
        await sc.close();
        throw err;
    }
}

function helpers(sc) {
    return {
        /** POST /v1/chat/completions (non-stream unless extra.stream). */
        chat(model, extra = {}, headers = {}) {
            return postJson(`${sc.gw.base}/v1/chat/completions`, { model, messages, ...extra },
                { headers, timeoutMs: 8000 });
        },
        /** Requests the mock saw for one upstream model. */
        async seen(upModel) {
            return sc.mock.requests((r) => r.body?.model === upModel);
        },
        async count(upModel) {
            return (await sc.mock.requests((r) => r.body?.model === upModel)).length;
        },
        script(upModel, action, more = {}) {
            return sc.mock.script({ model: upModel, action, ...more });
        },
        /** GET an admin endpoint; token null = no Authorization header. */
        async admin(p, token = ADMIN_TOKEN) {
            const r = await fetch(`${sc.gw.base}${p}`, {
                headers: token === null ? {} : { authorization: `Bearer ${token}` },
                signal: AbortSignal.timeout(5000),
            });
            const text = await r.text();
            let json = null;
            try {
                json = JSON.parse(text);
            } catch {
                /* not JSON */
            }
            return { status: r.status, headers: r.headers, text, json };
        },
        async provider(id) {
            const r = await this.admin(`/api/v2/providers/${id}`);
            assert.equal(r.status, 200, `GET /api/v2/providers/${id}: ${r.text.slice(0, 300)}`);
            return r.json;
        },
        /** SIGTERM the gateway, wait for exit 0, start a new one on the same config/storage. */
        async restart() {
            sc.gw.term();
            const { code } = await sc.gw.waitExit(8000);
            assert.equal(code, 0, 'gateway exits 0 after SIGTERM');
            sc.gw = await startGateway(sc.configPath, { env: sc.env });
        },
    };
}

function mainProvider(base, id, more = {}) {
    return { id, adapter: 'openai', base_url: `${base}/v1`, pool: 'main', ...more };
}

function fallbackProvider(base, id, more = {}) {
    return { id, adapter: 'openai', base_url: `${base}/v1`, pool: 'fallback', ...more };
}

function assertOk(r, what = 'request') {
    assert.equal(r.status, 200, `${what}: ${r.status} ${r.text?.slice(0, 300)}`);
}

function assertUnavailable503(r, what = 'request') {
    assert.equal(r.status, 503, `${what}: expected 503, got ${r.status} ${r.text?.slice(0, 300)}`);
    assert.equal(r.json?.error?.code, 'MODEL_UNAVAILABLE', `${what}: error code`);
    const ra = r.headers.get('retry-after');
    assert.ok(ra && /^\d+$/.test(ra) && Number(ra) >= 1, `${what}: Retry-After header (${ra})`);
}

/** Run n async jobs with at most `width` at once; returns their results in order. */
async function pooled(n, width, job) {
    const out = new Array(n);
    let next = 0;
    const worker = async () => {
        while (next < n) {
            const i = next++;
            out[i] = await job(i);
        }
    };
    await Promise.all(Array.from({ length: Math.min(width, n) }, worker));
    return out;
}

// ---------------------------------------------------------------------------
// (1) a 429 storm on one provider
// ---------------------------------------------------------------------------

describe('429 storm on one main provider', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: ['a', 'b', 'c'].map((x) => mainProvider(m, `storm-${x}`)),
            models: {
                storm: { routes: ['a', 'b', 'c'].map((x) => ({ provider: `storm-${x}`, model: `up-storm-${x}` })) },
            },
        }));
        await sc.script('up-storm-a', { status: 429 });
    });
    after(() => sc?.close());

    test('after its first 429 no request reaches it during the cooldown; the others take all traffic', async () => {
        // until the weighted draw has sent a request to storm-a (bounded)
        let hitAt = -1;
        for (let i = 0; i < 40 && hitAt < 0; i++) {
            const r = await sc.chat('storm');
            assertOk(r, `request ${i} (a 429 on storm-a fails over)`);
            assert.notEqual(r.json.actual_model, 'up-storm-a');
            if ((await sc.count('up-storm-a')) > 0) hitAt = i;
        }
        assert.ok(hitAt >= 0, 'storm-a got a request within 40 requests');
        assert.equal(await sc.count('up-storm-a'), 1);
        await sc.gw.waitLog((l) => l.msg === 'cooldown' && l.provider === 'storm-a',
            { timeoutMs: 2000, what: 'cooldown log line for storm-a' });

        const before = { b: await sc.count('up-storm-b'), c: await sc.count('up-storm-c') };
        const rs = await pooled(30, 6, () => sc.chat('storm'));
        for (const [i, r] of rs.entries()) {
            assertOk(r, `storm request ${i}`);
            assert.equal(r.headers.get('x-sidecar-degraded'), null, 'the other main providers are no degradation');
            assert.equal(r.json.degraded, false);
        }
        assert.equal(await sc.count('up-storm-a'), 1, 'storm-a saw nothing more while cooling');
        const b = (await sc.count('up-storm-b')) - before.b;
        const c = (await sc.count('up-storm-c')) - before.c;
        // (how b and c share it is the adaptive router's business)
        assert.equal(b + c, 30, 'every request went to exactly one of the others, first try');

        const cd = await sc.admin('/api/v2/cooldowns');
        assert.equal(cd.status, 200);
        assert.deepEqual(cd.json.cooldowns.map((x) => x.provider_id), ['storm-a']);
        const pa = await sc.provider('storm-a');
        assert.equal(pa.status, 'cooldown');
        assert.ok(pa.cooldown_remaining_s > 20 && pa.cooldown_remaining_s <= 30,
            `first 429 cools 30 s (remaining ${pa.cooldown_remaining_s})`);
    });
});

// ---------------------------------------------------------------------------
// (1b) the cooldown policy reads every header of the 429 (policies/cooldown.lua)
// ---------------------------------------------------------------------------

describe('a 429 cools its provider as long as its headers ask', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'hd-ms'), mainProvider(m, 'hd-reset'), fallbackProvider(m, 'hd-f')],
            models: {
                ms: { routes: [{ provider: 'hd-ms', model: 'up-hd-ms' }, { provider: 'hd-f', model: 'up-hd-f' }] },
                reset: { routes: [{ provider: 'hd-reset', model: 'up-hd-reset' }, { provider: 'hd-f', model: 'up-hd-f' }] },
            },
        }));
        // OpenAI's way of saying how long: milliseconds, and the reset of the used-up window
        await sc.script('up-hd-ms', { status: 429, headers: { 'retry-after-ms': '75000' } }, { times: 1 });
        await sc.script('up-hd-reset', {
            status: 429,
            headers: { 'X-RateLimit-Remaining-Requests': '0', 'X-RateLimit-Reset-Requests': '2m30s' },
        }, { times: 1 });
    });
    after(() => sc?.close());

    for (const [model, provider, want] of [['ms', 'hd-ms', 75], ['reset', 'hd-reset', 150]]) {
        test(`${provider}: the cooldown is ${want} s, not the 30 s of a first 429`, async () => {
            const r = await sc.chat(model);
            assertOk(r, 'the request that meets the 429 fails over');
            assert.equal(r.json.actual_model, 'up-hd-f');
            const p = await sc.provider(provider);
            assert.equal(p.status, 'cooldown');
            assert.ok(p.cooldown_remaining_s > want - 5 && p.cooldown_remaining_s <= want,
                `cooldown follows the headers: ${p.cooldown_remaining_s} s left of ${want}`);
        });
    }
});

// ---------------------------------------------------------------------------
// (2) all main providers cooling -> fallback
// ---------------------------------------------------------------------------

describe('all main providers cooling -> fallback pool', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'fb-m1'), mainProvider(m, 'fb-m2'), fallbackProvider(m, 'fb-f')],
            models: {
                fb: {
                    routes: [
                        { provider: 'fb-m1', model: 'up-fb-m1' },
                        { provider: 'fb-m2', model: 'up-fb-m2' },
                        { provider: 'fb-f', model: 'up-fb-f' },
                    ],
                },
            },
        }));
    });
    after(() => sc?.close());

    test('X-Sidecar-Pool: fallback starts in the fallback pool (not a degradation)', async () => {
        const r = await sc.chat('fb', {}, { 'X-Sidecar-Pool': 'fallback' });
        assertOk(r);
        assert.equal(r.json.actual_model, 'up-fb-f');
        assert.equal(r.headers.get('x-sidecar-degraded'), null);
        assert.equal(r.json.degraded, false);
        const bad = await sc.chat('fb', {}, { 'X-Sidecar-Pool': 'elsewhere' });
        assert.equal(bad.status, 400);
    });

    test('healthy main: served by main, not degraded', async () => {
        const r = await sc.chat('fb');
        assertOk(r);
        assert.match(r.json.actual_model, /^up-fb-m[12]$/);
        assert.equal(r.headers.get('x-sidecar-degraded'), null);
    });

    test('both main providers 429 -> fallback answers with X-Sidecar-Degraded: fallback', async () => {
        await sc.script('up-fb-m1', { status: 429 });
        await sc.script('up-fb-m2', { status: 429 });
        const m1 = await sc.count('up-fb-m1');
        const m2 = await sc.count('up-fb-m2');
        const r = await sc.chat('fb');
        assertOk(r, 'the request that discovers both 429s');
        assert.equal(r.json.actual_model, 'up-fb-f');
        assert.equal(r.headers.get('x-sidecar-degraded'), 'fallback');
        assert.equal(r.json.degraded, true);
        assert.equal((await sc.count('up-fb-m1')) - m1, 1);
        assert.equal((await sc.count('up-fb-m2')) - m2, 1);

        for (let i = 0; i < 5; i++) {
            const x = await sc.chat('fb');
            assertOk(x, `cooling request ${i}`);
            assert.equal(x.json.actual_model, 'up-fb-f');
            assert.equal(x.headers.get('x-sidecar-degraded'), 'fallback');
            assert.equal(x.json.degraded, true);
            assert.equal(x.json.choices[0].message.content, contentFor('up-fb-f'));
        }
        const s = await postStream(`${sc.gw.base}/v1/chat/completions`, { model: 'fb', messages, stream: true },
            { timeoutMs: 8000 });
        assert.equal(s.status, 200);
        assert.equal(s.headers.get('x-sidecar-degraded'), 'fallback');
        assert.equal(s.events[0].degraded, true, 'the first stream chunk says degraded: true');
        assert.equal(s.events[0].actual_model, 'up-fb-f');
        assert.equal(s.data.at(-1), '[DONE]');
        assert.equal((await sc.count('up-fb-m1')) - m1, 1, 'no request reached fb-m1 while it cools');
        assert.equal((await sc.count('up-fb-m2')) - m2, 1, 'no request reached fb-m2 while it cools');

        const pools = await sc.admin('/api/v2/pools');
        assert.equal(pools.json.main.cooldown, 2);
        assert.equal(pools.json.main.active, 0);
        assert.equal(pools.json.fallback.active, 1);
    });
});

// ---------------------------------------------------------------------------
// (2b) a plan that holds is kept, and asked for again when a route's state changes
// ---------------------------------------------------------------------------

describe('a failover plan is kept until a route cools down', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'kp-m'), fallbackProvider(m, 'kp-f')],
            models: {
                kp: { routes: [{ provider: 'kp-m', model: 'up-kp-m' }, { provider: 'kp-f', model: 'up-kp-f' }] },
            },
        }));
    });
    after(() => sc?.close());

    async function plans() {
        const text = await sc.gw.metrics();
        const count = (source) => Number(text.match(
            new RegExp(`^moongate_routing_plans_total\\{source="${source}"\\} (\\d+)$`, 'm'))?.[1]);
        return { policy: count('policy'), kept: count('kept') };
    }

    test('one route per pool: the policy decides once, later requests get its plan', async () => {
        const start = await plans();
        for (let i = 0; i < 5; i++) {
            const r = await sc.chat('kp');
            assertOk(r, `request ${i}`);
            assert.equal(r.json.actual_model, 'up-kp-m');
        }
        const now = await plans();
        assert.equal(now.policy - start.policy, 1, 'route() was asked once');
        assert.equal(now.kept - start.kept, 4, 'four requests got the kept plan');
    });

    test('a 429 cools the main route: the kept plan fails over, then the policy decides every time', async () => {
        await sc.script('up-kp-m', { status: 429 });
        const start = await plans();
        const r = await sc.chat('kp');
        assertOk(r, 'the request that meets the 429');
        assert.equal(r.json.actual_model, 'up-kp-f');
        assert.equal(r.headers.get('x-sidecar-degraded'), 'fallback');
        let now = await plans();
        // (the plan needs one entry per attempt: req.plan_limit = 1)
        assert.equal(now.kept - start.kept, 1, 'the first attempt used the kept plan');
        assert.equal(now.policy - start.policy, 1, 'the second attempt asked route() again');
        for (let i = 0; i < 3; i++) {
            const x = await sc.chat('kp');
            assertOk(x, `cooling request ${i}`);
            assert.equal(x.json.actual_model, 'up-kp-f');
            assert.equal(x.headers.get('x-sidecar-degraded'), 'fallback');
        }
        now = await plans();
        // the main route is cooling: a state the kept plan did not see; and the fallback plan
        // while main cools depends on how long it still cools, so it is never kept
        assert.equal(now.policy - start.policy, 4, 'each request while main cools asked route()');
        assert.equal(now.kept - start.kept, 1);
        assert.equal(await sc.count('up-kp-m'), 6, 'main saw nothing while cooling');
    });
});

// ---------------------------------------------------------------------------
// (3) fallback cooling too -> emergency at 10% RPM
// ---------------------------------------------------------------------------

describe('main and fallback cooling -> emergency channel at 10% RPM', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'em-m'), fallbackProvider(m, 'em-f', { rpm_limit: 20 })],
            models: {
                em: { routes: [{ provider: 'em-m', model: 'up-em-m' }, { provider: 'em-f', model: 'up-em-f' }] },
            },
        }));
        // em-m: always 429 and asks for 300 s (so em-f is the cooling route back soonest)
        await sc.script('up-em-m', { status: 429, headers: { 'Retry-After': '300' } });
        // em-f: one 429 (30 s cooldown), then fine
        await sc.script('up-em-f', { status: 429 }, { times: 1 });
    });
    after(() => sc?.close());

    test('both pools cooling: emergency answers (X-Sidecar-Degraded: emergency), 2 per 60 s, the third never reaches it', async () => {
        const first = await sc.chat('em');
        assertUnavailable503(first, 'the request that finds both 429ing');
        assert.equal(await sc.count('up-em-m'), 1);
        assert.equal(await sc.count('up-em-f'), 1);
        const cd = await sc.admin('/api/v2/cooldowns');
        assert.deepEqual(cd.json.cooldowns.map((x) => x.provider_id).sort(), ['em-f', 'em-m']);

        const answers = [];
        for (let i = 0; i < 3; i++) answers.push(await sc.chat('em'));
        const ok = answers.filter((r) => r.status === 200);
        const fAfter = (await sc.count('up-em-f')) - 1;
        assert.equal(await sc.count('up-em-m'), 1, 'em-m (cooling 300 s) never chosen');
        assertOk(answers[0], 'first emergency request');
        for (const r of ok) {
            assert.equal(r.headers.get('x-sidecar-degraded'), 'emergency');
            assert.equal(r.json.degraded, true);
            assert.equal(r.json.actual_model, 'up-em-f');
        }
        assert.ok(fAfter <= 2, `at most 2 emergency requests reach em-f in 60 s (saw ${fAfter})`);
        assertUnavailable503(answers[2], 'third emergency request (share used up)');
        // rpm_limit 20 x emergency_rpm_ratio 0.1 = 2 emergency requests per 60 s
        assert.equal(fAfter, 2, `the emergency share of rpm_limit 20 is 2 per 60 s; em-f got ${fAfter} ` +
            `(statuses ${answers.map((r) => r.status).join(',')}; the 429 that started the cooldown ` +
            'is counted against the emergency share?)');
        assertOk(answers[1], 'second emergency request');
        const pf = await sc.provider('em-f');
        assert.equal(pf.status, 'cooldown', 'successful emergency requests do not end the cooldown');
    });

    test('after a restart (cooldowns restored, RPM window empty): exactly 2 emergency requests reach it', async () => {
        await sc.restart();
        const cd = await sc.admin('/api/v2/cooldowns');
        assert.deepEqual(cd.json.cooldowns.map((x) => x.provider_id).sort(), ['em-f', 'em-m']);
        const f0 = await sc.count('up-em-f');
        const answers = [];
        for (let i = 0; i < 3; i++) answers.push(await sc.chat('em'));
        assert.deepEqual(answers.map((r) => r.status), [200, 200, 503]);
        for (const r of answers.slice(0, 2)) {
            assert.equal(r.headers.get('x-sidecar-degraded'), 'emergency');
            assert.equal(r.json.degraded, true);
            assert.equal(r.json.actual_model, 'up-em-f');
        }
        assertUnavailable503(answers[2], 'third emergency request');
        assert.equal((await sc.count('up-em-f')) - f0, 2, 'the third emergency request never reached em-f');
        assert.equal(await sc.count('up-em-m'), 1);
        assert.equal((await sc.provider('em-f')).current_rpm, 2);
    });
});

// ---------------------------------------------------------------------------
// (4) everything down -> 503 openclaw_fallback
// ---------------------------------------------------------------------------

describe('everything down -> 503 with X-Sidecar-Degraded: openclaw_fallback', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [
                mainProvider(m, 'down-m'), fallbackProvider(m, 'down-f'),
                mainProvider(m, 'em2-m'), fallbackProvider(m, 'em2-f'),
            ],
            models: {
                down: { routes: [{ provider: 'down-m', model: 'up-down-m' }, { provider: 'down-f', model: 'up-down-f' }] },
                em2: { routes: [{ provider: 'em2-m', model: 'up-em2-m' }, { provider: 'em2-f', model: 'up-em2-f' }] },
            },
            circuit_breaker: { consecutive_failures: 3, open_duration_seconds: 60 },
        }));
        await sc.script('up-down-m', { status: 500 });
        await sc.script('up-down-f', { status: 500 });
        await sc.script('up-em2-m', { status: 429, headers: { 'Retry-After': '300' } });
        await sc.script('up-em2-f', { status: 429 });
    });
    after(() => sc?.close());

    test('every breaker open (nothing available, nothing cooling) -> 503 openclaw_fallback, no upstream attempt', async () => {
        for (let i = 0; i < 3; i++) {
            const r = await sc.chat('down');
            assert.equal(r.status, 502, `request ${i} while both answer 500: ${r.text.slice(0, 200)}`);
        }
        assert.equal((await sc.provider('down-m')).breaker, 'open');
        assert.equal((await sc.provider('down-f')).breaker, 'open');
        const m = await sc.count('up-down-m');
        const f = await sc.count('up-down-f');
        for (let i = 0; i < 3; i++) {
            const r = await sc.chat('down');
            assertUnavailable503(r, `request ${i} with every breaker open`);
            assert.equal(r.headers.get('x-sidecar-degraded'), 'openclaw_fallback');
            assert.equal(typeof r.json.error.retry_after_ms, 'number');
        }
        assert.equal(await sc.count('up-down-m'), m, 'no request reached down-m');
        assert.equal(await sc.count('up-down-f'), f, 'no request reached down-f');
    });

    test('emergency attempt fails too -> 503 openclaw_fallback (ADR 3.7)', async () => {
        const first = await sc.chat('em2');
        assertUnavailable503(first, 'first request: both pools answer 429');
        const r = await sc.chat('em2');
        assertUnavailable503(r, 'the emergency attempt answered 429');
        assert.equal(await sc.count('up-em2-f'), 2, 'the emergency attempt reached em2-f');
        assert.equal(r.headers.get('x-sidecar-degraded'), 'openclaw_fallback',
            'ADR 3.7: emergency channel failed -> 503 + X-Sidecar-Degraded: openclaw_fallback');
    });
});

// ---------------------------------------------------------------------------
// a provider down by passive health comes back without probes (issue 16, item 4)
// ---------------------------------------------------------------------------

describe('down by passive health: panic, trials and restart', { timeout: 30000 }, () => {
    // 500s take a provider down after 10 in a row (health), never open a breaker here (its
    // limits are out of reach), and probes are off: nothing but real traffic can bring it back
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'solo'), mainProvider(m, 'pair-a'), mainProvider(m, 'pair-b')],
            models: {
                solo: { routes: [{ provider: 'solo', model: 'up-solo' }] },
                pair: { routes: [{ provider: 'pair-a', model: 'up-pair-a' }, { provider: 'pair-b', model: 'up-pair-b' }] },
            },
            circuit_breaker: { consecutive_failures: 1000, min_requests: 1000000 },
            health: { retry_down_ms: 1500 },
        }));
    });
    after(() => sc?.close());

    async function takeDown(model, upModel, provider) {
        await sc.script(upModel, { status: 500 }, { times: 10 });
        for (let i = 0; i < 10; i++) await sc.chat(`${model}:${provider}`); // pinned: all to it
        const p = await sc.provider(provider);
        assert.equal(p.health, 'down', JSON.stringify(p));
        assert.ok(['consecutive_failures', 'success_rate'].includes(p.down_reason), p.down_reason);
        assert.equal(typeof p.next_trial_in_ms, 'number');
        return p;
    }

    test('the only route of a model is down: the panic rule still sends to it, and it comes back', async () => {
        assert.equal((await takeDown('solo', 'up-solo', 'solo')).down_reason, 'consecutive_failures');
        const st = await sc.admin('/status');
        const solo = st.json.providers.find((p) => p.id === 'solo');
        assert.equal(solo.health, 'down', 'the state shows in /status');
        assert.equal(solo.down_reason, 'consecutive_failures');
        // the engine answers again: a model is never refused while an engine might answer
        const r = await sc.chat('solo');
        assertOk(r, 'a request to a model whose only route is down');
        assert.equal((await sc.provider('solo')).health, 'degraded', 'one success: serving again');
        for (let i = 0; i < 2; i++) assertOk(await sc.chat('solo'));
        assert.equal((await sc.provider('solo')).health, 'healthy');
        const metrics = await sc.gw.metrics();
        assert.match(metrics, /^moongate_routing_panic_total [1-9]/m);
    });

    test('a down route beside a healthy one gets one trial request per retry_down_ms, then its traffic back', async () => {
        // pair-b serves while pair-a is down (1 of 2 healthy: no panic at the 0.5 default)
        await takeDown('pair', 'up-pair-a', 'pair-a');
        const before = await sc.count('up-pair-a');
        for (let i = 0; i < 5; i++) {
            const r = await sc.chat('pair');
            assertOk(r);
            assert.equal(r.json.actual_model, 'up-pair-b', 'no trial due yet: the healthy route');
        }
        assert.equal(await sc.count('up-pair-a'), before, 'nothing reached the down provider');
        await sleep(1600);
        const trial = await sc.chat('pair');
        assertOk(trial);
        assert.equal(trial.json.actual_model, 'up-pair-a', 'the due trial goes first');
        await sc.gw.waitLog((l) => l.msg === 'health_trial' && l.provider === 'pair-a');
        assert.equal((await sc.provider('pair-a')).health, 'degraded');
        const metrics = await sc.gw.metrics();
        assert.match(metrics, /^moongate_provider_health_trials_total\{provider_id="pair-a"\} 1$/m);
    });

    test('a failed trial keeps it down, and the next one waits its period again', async () => {
        await takeDown('pair', 'up-pair-a', 'pair-a');
        await sleep(1600);
        await sc.script('up-pair-a', { status: 500 }, { times: 1 });
        const r = await sc.chat('pair');
        assertOk(r, 'the trial failed, the healthy route answered');
        assert.equal(r.json.actual_model, 'up-pair-b');
        assert.equal((await sc.provider('pair-a')).health, 'down');
        const n = await sc.count('up-pair-a');
        for (let i = 0; i < 3; i++) assert.equal((await sc.chat('pair')).json.actual_model, 'up-pair-b');
        assert.equal(await sc.count('up-pair-a'), n, 'one trial per period');
    });

    test('down survives a restart for a provider that never had a cooldown row', async () => {
        assert.equal((await sc.provider('pair-a')).health, 'down');
        await sc.restart();
        const p = await sc.provider('pair-a');
        assert.equal(p.health, 'down', 'restored from provider_health alone');
        assert.equal(p.down_reason, 'restored');
        assert.ok(p.next_trial_in_ms > 0 && p.next_trial_in_ms <= 1500, `next trial in ${p.next_trial_in_ms}`);
    });
});

// ---------------------------------------------------------------------------
// (5) restart during a cooldown
// ---------------------------------------------------------------------------

describe('restart during a cooldown', { timeout: 25000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'rs-a'), mainProvider(m, 'rs-b')],
            models: {
                rs: {
                    routes: [
                        { provider: 'rs-a', model: 'up-rs-a' },
                        { provider: 'rs-b', model: 'up-rs-b', priority: 1 },
                    ],
                },
            },
        }));
        await sc.script('up-rs-a', { status: 429, headers: { 'Retry-After': '120' } }, { times: 1 });
    });
    after(() => sc?.close());

    test('SIGTERM and a new gateway on the same storage: the provider is still cooling', async () => {
        const r = await sc.chat('rs');
        assertOk(r);
        assert.equal(r.json.actual_model, 'up-rs-b', 'rs-a answered 429, rs-b took over');
        assert.equal(await sc.count('up-rs-a'), 1);
        const pid1 = sc.gw.pid;
        await sc.restart();
        assert.notEqual(sc.gw.pid, pid1);

        const cd = await sc.admin('/api/v2/cooldowns');
        assert.equal(cd.status, 200);
        assert.equal(cd.json.total, 1, `cooldowns after restart: ${cd.text}`);
        const row = cd.json.cooldowns[0];
        assert.equal(row.provider_id, 'rs-a');
        assert.equal(row.pool, 'main');
        assert.ok(row.remaining_seconds > 90 && row.remaining_seconds <= 120,
            `remaining ${row.remaining_seconds} s of the 120 s Retry-After`);
        assert.ok(Math.abs(row.cooldown_until_ms - (Date.now() + row.remaining_seconds * 1000)) < 3000,
            'cooldown_until_ms is a unix time in ms');
        assert.equal(row.consecutive_429, 1);
        assert.equal((await sc.provider('rs-a')).status, 'cooldown');

        // rs-a would answer now (its 429 rule is used up); it must still get nothing
        for (let i = 0; i < 10; i++) {
            const x = await sc.chat('rs');
            assertOk(x, `request ${i} after restart`);
            assert.equal(x.json.actual_model, 'up-rs-b');
        }
        assert.equal(await sc.count('up-rs-a'), 1, 'no request reached rs-a after the restart');
    });
});

// ---------------------------------------------------------------------------
// (5b) an open breaker survives kill -9 (issue 23: the state trials of bench/trials.mjs)
// ---------------------------------------------------------------------------

describe('kill -9 while a route breaker is open', { timeout: 25000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'bk-a')],
            models: { bk: { routes: [{ provider: 'bk-a', model: 'up-bk-a' }] } },
            circuit_breaker: { consecutive_failures: 3, open_duration_seconds: 2 },
        }));
    });
    after(() => sc?.close());

    const routeBreaker = async (id, model) =>
        (await sc.provider(id)).routes.find((r) => r.model === model)?.breaker;

    test('the breaker is open after the restart, for what was left of its period, then probes and closes', async () => {
        await sc.script('up-bk-a', { status: 500 }, { times: 3 });
        for (let i = 0; i < 3; i++) assert.equal((await sc.chat('bk')).status, 502);
        assert.equal(await routeBreaker('bk-a', 'up-bk-a'), 'open');
        const opened = Date.now();
        // the opening is written by the store's writer after the answer: what must survive
        // the kill is the committed state, so the kill waits for its row (a kill in the same
        // millisecond may beat the commit, as it may any write's)
        await waitFor(() => sqliteRows(path.join(sc.dir, 'moongate.db'),
            "SELECT 1 FROM breaker_state WHERE provider_id = 'bk-a' AND model = 'up-bk-a'").length === 1,
        { timeoutMs: 5000, what: 'the open breaker committed' });
        sc.gw.child.kill('SIGKILL');
        await sc.gw.waitExit(5000);
        sc.gw = await startGateway(sc.configPath, { env: sc.env });
        assert.equal(await routeBreaker('bk-a', 'up-bk-a'), 'open', 'restored open');
        const r = await sc.chat('bk');
        assert.equal(r.status, 503, `refused while open: ${r.status} ${r.text.slice(0, 200)}`);
        assert.equal(await sc.count('up-bk-a'), 3, 'nothing reached the open route after the restart');
        // the period (2 s from the opening) ends: half open, one probe, success closes it
        await sleep(Math.max(0, opened + 2300 - Date.now()));
        assertOk(await sc.chat('bk'), 'the probe after the open period');
        assert.equal(await routeBreaker('bk-a', 'up-bk-a'), 'closed');
        // the close is written by the store's writer after the answer (asynchronously), as
        // the opening was; a kill in the same instant may beat its commit, so give it one
        await sleep(500);
        sc.gw.child.kill('SIGKILL');
        await sc.gw.waitExit(5000);
        sc.gw = await startGateway(sc.configPath, { env: sc.env });
        assert.equal(await routeBreaker('bk-a', 'up-bk-a'), 'closed', 'a closed breaker stays closed');
    });
});

// ---------------------------------------------------------------------------
// (6) RPM never exceeded under a burst
// ---------------------------------------------------------------------------

describe('RPM limit under a concurrent burst', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'rpm-p', { rpm_limit: 10 })],
            models: { rpm: { routes: [{ provider: 'rpm-p', model: 'up-rpm' }] } },
            routing: { queue_timeout_ms: 1500 },
        }));
        await sc.script('up-rpm', { delay_first_byte_ms: 150 });
    });
    after(() => sc?.close());

    test('rpm_limit 10, 30 concurrent requests -> exactly 10 reach it, 20 get 503 + Retry-After, none hangs', async () => {
        const t0 = Date.now();
        const rs = await withTimeout(Promise.all(Array.from({ length: 30 }, () => sc.chat('rpm'))),
            8000, '30 concurrent requests');
        const dt = Date.now() - t0;
        const ok = rs.filter((r) => r.status === 200);
        const limited = rs.filter((r) => r.status === 503);
        assert.equal(ok.length, 10, `statuses: ${rs.map((r) => r.status).join(',')}`);
        assert.equal(limited.length, 20);
        for (const r of limited) {
            assertUnavailable503(r, 'rate-limited request');
            assert.ok(Number(r.headers.get('retry-after')) <= 61, 'Retry-After within the 60 s window');
        }
        assert.equal(await sc.count('up-rpm'), 10, 'the provider saw exactly rpm_limit requests');
        assert.ok(dt < 5000, `the burst was answered in ${dt} ms (nobody waited past the queue timeout)`);
        const p = await sc.provider('rpm-p');
        assert.equal(p.current_rpm, 10);
        assert.equal(p.rpm_limit, 10);
        // still limited afterwards
        const again = await sc.chat('rpm');
        assertUnavailable503(again, 'one more request in the same minute');
        assert.equal(await sc.count('up-rpm'), 10);
    });
});

describe('the plan reaches past providers the rate limits refuse (req.plan_limit)', { timeout: 20000 }, () => {
    // 16 providers whose tpm_limit fits one request in flight, and no rpm_limit: every route
    // keeps a headroom of 1, so the weighted order cannot put the refused ones last. The plan
    // must be long enough to get past every provider the core would pass over: cut at the
    // attempts left instead, the last requests would draw only full providers most of the
    // time (the 16th: 455 plans in 560 at 3 entries) and wait for a token past the queue
    // timeout.
    const N = 16;
    let sc;
    before(async () => {
        const ids = Array.from({ length: N }, (_, i) => `tpm-${i}`);
        sc = await scenario((m) => ({
            providers: ids.map((id) => mainProvider(m, id, { tpm_limit: 1000 })),
            models: { tpm: { routes: ids.map((id, i) => ({ provider: id, model: `up-tpm-${i}` })) } },
            routing: { queue_timeout_ms: 1000 },
        }));
        for (let i = 0; i < N; i++) await sc.script(`up-tpm-${i}`, { delay_first_byte_ms: 400 });
    });
    after(() => sc?.close());

    test('16 concurrent requests, each reserving most of a provider\'s TPM: all 16 served, one per provider', async () => {
        // ~900 tokens reserved each (max_tokens + the prompt's estimate): a second one on the
        // same provider would exceed its 1,000 while the first is in flight
        const rs = await withTimeout(Promise.all(Array.from({ length: N }, () => sc.chat('tpm', { max_tokens: 900 }))),
            8000, `${N} concurrent requests`);
        assert.deepEqual(rs.map((r) => r.status), Array(N).fill(200),
            rs.map((r) => `${r.status} ${r.text?.slice(0, 120)}`).join(' | '));
        for (let i = 0; i < N; i++) assert.equal(await sc.count(`up-tpm-${i}`), 1, `provider tpm-${i} served one`);
    });
});

describe('a cut plan is asked again when an entry fails without an attempt', { timeout: 20000 }, () => {
    // max_retries 1: req.plan_limit is 1, so the plan holds one of the two routes, almost
    // always the Ollama one (weight 1000 to 1). The Ollama adapter cannot encode an image
    // given by URL: that entry is passed over without an attempt, and the core must ask
    // again (the limit is 2 now) rather than fail with the OpenAI route untried.
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [
                mainProvider(m, 'enc-ollama', { adapter: 'ollama', base_url: m, weight: 1000 }),
                mainProvider(m, 'enc-openai', { weight: 1 }),
            ],
            models: {
                enc: { routes: [{ provider: 'enc-ollama', model: 'up-enc-ollama' },
                                { provider: 'enc-openai', model: 'up-enc-openai' }] },
            },
            upstream: { max_retries: 1 },
        }));
    });
    after(() => sc?.close());

    test('an image by URL: the Ollama route cannot encode it, the OpenAI route serves it', async () => {
        const content = [{ type: 'text', text: 'what is this?' },
            { type: 'image_url', image_url: { url: 'https://example.invalid/cat.png' } }];
        for (let i = 0; i < 5; i++) {
            const r = await postJson(`${sc.gw.base}/v1/chat/completions`,
                { model: 'enc', messages: [{ role: 'user', content }] }, { timeoutMs: 8000 });
            assertOk(r, `request ${i}`);
        }
        assert.equal(await sc.count('up-enc-openai'), 5);
        assert.equal(await sc.count('up-enc-ollama'), 0);
    });
});

// ---------------------------------------------------------------------------
// (7) pinning never falls back
// ---------------------------------------------------------------------------

describe('pinning never falls back to another provider', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'pin-1'), mainProvider(m, 'pin-2'), fallbackProvider(m, 'pin-3')],
            models: {
                pin: {
                    routes: [
                        { provider: 'pin-1', model: 'up-pin-1' },
                        { provider: 'pin-2', model: 'up-pin-2' },
                        { provider: 'pin-3', model: 'up-pin-3' },
                    ],
                },
            },
        }));
    });
    after(() => sc?.close());

    const others = async () => (await sc.count('up-pin-2')) + (await sc.count('up-pin-3'));

    test('model "pin:pin-2" and X-Sidecar-Provider reach exactly that provider', async () => {
        for (let i = 0; i < 4; i++) {
            const r = await sc.chat('pin:pin-2');
            assertOk(r);
            assert.equal(r.json.actual_model, 'up-pin-2');
            assert.equal(r.json.logical_model, 'pin');
            const h = await sc.chat('pin', {}, { 'X-Sidecar-Provider': 'pin-3' });
            assertOk(h);
            assert.equal(h.json.actual_model, 'up-pin-3');
            assert.equal(h.headers.get('x-sidecar-degraded'), null, 'a pinned fallback provider is not a degradation');
        }
    });

    test('pinned provider answers 500 -> error, the others see nothing', async () => {
        await sc.script('up-pin-1', { status: 500 }, { times: 1 });
        const before = await others();
        const r = await sc.chat('pin:pin-1');
        assert.equal(r.status, 502, `pinned 500: ${r.text.slice(0, 200)}`);
        assert.equal(r.json.error.code, 'MODEL_UNAVAILABLE');
        assert.equal(await sc.count('up-pin-1'), 1);
        assert.equal(await others(), before, 'no other provider was tried');
    });

    test('pinned provider answers 429 -> 503, the others see nothing; while it cools -> 503, still nothing', async () => {
        await sc.script('up-pin-1', { status: 429 });
        const before = await others();
        const r = await sc.chat('pin', {}, { 'X-Sidecar-Provider': 'pin-1' });
        assertUnavailable503(r, 'pinned 429');
        assert.equal(await sc.count('up-pin-1'), 2);
        for (let i = 0; i < 3; i++) {
            const x = await sc.chat('pin:pin-1', { stream: i === 1 });
            assertUnavailable503(x, `pinned request ${i} while pin-1 cools`);
        }
        assert.equal(await sc.count('up-pin-1'), 2, 'pin-1 is cooling: not tried');
        assert.equal(await others(), before, 'no other provider was tried');
        // unpinned requests still work (through the others)
        assertOk(await sc.chat('pin'));
    });

    test('unknown provider in "model:provider" -> 404 MODEL_NOT_FOUND; unknown X-Sidecar-Provider -> 503, nobody tried', async () => {
        const before = await sc.mock.requests();
        const r = await sc.chat('pin:no-such-provider');
        assert.equal(r.status, 404);
        assert.equal(r.json.error.code, 'MODEL_NOT_FOUND');
        const h = await sc.chat('pin', {}, { 'X-Sidecar-Provider': 'no-such-provider' });
        assert.equal(h.status, 503, `unknown pinned provider by header: ${h.text.slice(0, 200)}`);
        assert.equal(h.json.error.code, 'MODEL_UNAVAILABLE');
        assert.equal((await sc.mock.requests()).length, before.length, 'no upstream request');
    });
});

// ---------------------------------------------------------------------------
// (8) local_only
// ---------------------------------------------------------------------------

describe('routing.local_only never reaches a cloud provider', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [
                mainProvider(m, 'lo-local', { local: true, rpm_limit: 10 }),
                mainProvider(m, 'lo-cloud', { local: false }),
                fallbackProvider(m, 'lo-cloud-fb', { local: false }),
            ],
            models: {
                lo: {
                    routes: [
                        { provider: 'lo-cloud', model: 'up-lo-cloud' },
                        { provider: 'lo-local', model: 'up-lo-local' },
                        { provider: 'lo-cloud-fb', model: 'up-lo-cloud-fb' },
                    ],
                },
            },
        }));
    });
    after(() => sc?.close());

    const cloud = async () => (await sc.count('up-lo-cloud')) + (await sc.count('up-lo-cloud-fb'));

    test('local healthy: local_only and local_first both pick the local provider', async () => {
        const r = await sc.chat('lo', { routing: { local_only: true } });
        assertOk(r);
        assert.equal(r.json.actual_model, 'up-lo-local');
        const plain = await sc.chat('lo');
        assertOk(plain);
        assert.equal(plain.json.actual_model, 'up-lo-local', 'local_first puts the local route first');
        assert.equal(await cloud(), 0);
        // the extension never goes upstream
        const seen = await sc.seen('up-lo-local');
        assert.ok(seen.every((x) => !('routing' in x.body)));
    });

    test('local cooling: local_only -> 503 and no cloud request; without it -> cloud, degraded "cloud"', async () => {
        await sc.script('up-lo-local', { status: 429, headers: { 'Retry-After': '300' } });
        const r = await sc.chat('lo', { routing: { local_only: true } });
        assertUnavailable503(r, 'local_only request that meets the 429');
        for (let i = 0; i < 4; i++) {
            const x = await sc.chat('lo', { routing: { local_only: true }, stream: i % 2 === 1 });
            assertUnavailable503(x, `local_only request ${i} while the local provider cools`);
        }
        assert.equal(await cloud(), 0, 'no request ever reached a cloud provider');
        assert.equal((await sc.provider('lo-local')).status, 'cooldown');

        const c = await sc.chat('lo');
        assertOk(c, 'without local_only');
        assert.equal(c.json.actual_model, 'up-lo-cloud');
        assert.equal(c.headers.get('x-sidecar-degraded'), 'cloud');
        assert.equal(c.json.degraded, true);
    });

    test('routing.local_only must be a boolean', async () => {
        const r = await sc.chat('lo', { routing: { local_only: 'yes' } });
        assert.equal(r.status, 400);
        assert.equal(r.json.error.code, 'INVALID_REQUEST');
    });
});

// ---------------------------------------------------------------------------
// (9) smaller routes
// ---------------------------------------------------------------------------

describe('smaller route only with allow_smaller_model', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'sm-full'), mainProvider(m, 'sm-small')],
            models: {
                sm: {
                    routes: [
                        { provider: 'sm-small', model: 'up-sm-small', smaller: true },
                        { provider: 'sm-full', model: 'up-sm-full' },
                    ],
                },
            },
        }));
    });
    after(() => sc?.close());

    test('full route healthy: served by it even when smaller is allowed, not degraded', async () => {
        for (const allow of [false, true]) {
            const r = await sc.chat('sm', { routing: { allow_smaller_model: allow } });
            assertOk(r);
            assert.equal(r.json.actual_model, 'up-sm-full');
            assert.equal(r.headers.get('x-sidecar-degraded'), null);
        }
        assert.equal(await sc.count('up-sm-small'), 0);
    });

    test('full route down: without the flag the smaller model is never used; with it -> smaller, degraded', async () => {
        await sc.script('up-sm-full', { status: 500 });
        for (let i = 0; i < 4; i++) {
            const r = await sc.chat('sm');
            assert.ok(r.status >= 500, `request ${i} without allow_smaller_model: ${r.status}`);
        }
        assert.equal(await sc.count('up-sm-small'), 0, 'the smaller route got nothing without the flag');
        const r = await sc.chat('sm', { routing: { allow_smaller_model: true } });
        assertOk(r);
        assert.equal(r.json.actual_model, 'up-sm-small');
        assert.equal(r.headers.get('x-sidecar-degraded'), 'smaller');
        assert.equal(r.json.degraded, true);
        const s = await postStream(`${sc.gw.base}/v1/chat/completions`,
            { model: 'sm', messages, stream: true, routing: { allow_smaller_model: true } }, { timeoutMs: 8000 });
        assert.equal(s.status, 200);
        assert.equal(s.headers.get('x-sidecar-degraded'), 'smaller');
        assert.equal(s.events[0].degraded, true);
        assert.equal(s.events[0].actual_model, 'up-sm-small');
    });
});

// ---------------------------------------------------------------------------
// (10) weighted split
// ---------------------------------------------------------------------------

describe('weighted split in the main pool', { timeout: 30000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'w-1', { weight: 1 }), mainProvider(m, 'w-3', { weight: 3 })],
            models: {
                w: { routes: [{ provider: 'w-1', model: 'up-w-1' }, { provider: 'w-3', model: 'up-w-3' }] },
            },
        }));
    });
    after(() => sc?.close());

    test('weights 1 and 3, 200 requests -> about 25% / 75%', async () => {
        const N = 200;
        const rs = await pooled(N, 8, () => sc.chat('w'));
        for (const r of rs) assertOk(r);
        const a = await sc.count('up-w-1');
        const b = await sc.count('up-w-3');
        assert.equal(a + b, N, 'one upstream request per client request');
        // binomial(200, 0.25): mean 50, sd 6.1; +-4 sd
        assert.ok(a >= 25 && a <= 75, `weight-1 provider got ${a} of ${N} (expected about 50), weight-3 got ${b}`);
    });
});

// ---------------------------------------------------------------------------
// (11) circuit breaker
// ---------------------------------------------------------------------------

describe('circuit breaker on connect failures', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        const dead = await deadPort();
        sc = await scenario((m) => ({
            providers: [
                { id: 'br-dead', adapter: 'openai', base_url: `http://127.0.0.1:${dead}/v1` },
                mainProvider(m, 'br-ok'),
            ],
            models: {
                br: {
                    routes: [
                        { provider: 'br-dead', model: 'up-br-dead' },
                        { provider: 'br-ok', model: 'up-br-ok', priority: 1 },
                    ],
                },
            },
            circuit_breaker: { consecutive_failures: 3, open_duration_seconds: 3, half_open_max_requests: 1 },
        }));
    });
    after(() => sc?.close());

    async function attemptsOf(r) {
        const log = await sc.gw.requestLog(r.headers.get('x-request-id'), 3000);
        return log.attempts;
    }

    test('3 connect failures open it; no attempts while open; one probe when half open', async () => {
        assert.equal((await sc.provider('br-dead')).breaker, 'closed');
        for (let i = 0; i < 3; i++) {
            const r = await sc.chat('br');
            assertOk(r, `request ${i}`);
            assert.equal(r.json.actual_model, 'up-br-ok');
            assert.equal(await attemptsOf(r), 2, 'dead route tried, then the next one');
        }
        let p = await sc.provider('br-dead');
        assert.equal(p.breaker, 'open');
        assert.equal(p.requests_total, 3);
        const list = await sc.admin('/api/v2/providers');
        assert.equal(list.json.providers.find((x) => x.id === 'br-dead').breaker, 'open');
        assert.equal(list.json.providers.find((x) => x.id === 'br-ok').breaker, 'closed');

        for (let i = 0; i < 5; i++) {
            const r = await sc.chat('br');
            assertOk(r, `request ${i} while open`);
            assert.equal(await attemptsOf(r), 1, 'the open route is skipped');
        }
        p = await sc.provider('br-dead');
        assert.equal(p.requests_total, 3, 'no attempt on br-dead while its breaker is open');

        await waitFor(async () => (await sc.provider('br-dead')).breaker === 'half_open',
            { timeoutMs: 6000, intervalMs: 100, what: 'breaker half_open after open_duration_seconds' });
        const probe = await sc.chat('br');
        assertOk(probe, 'the half-open probe fails over');
        assert.equal(await attemptsOf(probe), 2);
        p = await sc.provider('br-dead');
        assert.equal(p.requests_total, 4, 'exactly one probe');
        assert.equal(p.breaker, 'open', 'a failed probe opens it again');
        const after1 = await sc.chat('br');
        assert.equal(await attemptsOf(after1), 1);
    });
});

// ---------------------------------------------------------------------------
// (11b) circuit breaker per route: one model failing keeps the provider's others
// ---------------------------------------------------------------------------

describe('circuit breaker per provider+model route', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [mainProvider(m, 'rb-p'), mainProvider(m, 'rb-q')],
            models: {
                // model A on rb-p, with rb-q behind it; model B on rb-p alone
                'rb-a': {
                    routes: [
                        { provider: 'rb-p', model: 'up-rb-a' },
                        { provider: 'rb-q', model: 'up-rb-a-q', priority: 1 },
                    ],
                },
                'rb-b': { routes: [{ provider: 'rb-p', model: 'up-rb-b' }] },
            },
            circuit_breaker: { consecutive_failures: 3, open_duration_seconds: 2, half_open_max_requests: 1 },
        }));
        // a 503 (not a 429: that would cool the whole provider down) for the first 3 requests
        await sc.script('up-rb-a', { status: 503 }, { times: 3 });
    });
    after(() => sc?.close());

    async function attemptsOf(r) {
        return (await sc.gw.requestLog(r.headers.get('x-request-id'), 3000)).attempts;
    }

    function route(p, model) {
        return p.routes.find((x) => x.model === model);
    }

    test('model A failing 3 times opens only the (rb-p, A) route; model B on rb-p still served', async () => {
        for (let i = 0; i < 3; i++) {
            const r = await sc.chat('rb-a');
            assertOk(r, `request ${i}: A on rb-p answers 503, rb-q serves`);
            assert.equal(r.json.actual_model, 'up-rb-a-q');
            assert.equal(await attemptsOf(r), 2);
        }
        let p = await sc.provider('rb-p');
        assert.equal(p.breaker, 'closed', 'the provider as a whole still serves (model B)');
        assert.equal(route(p, 'up-rb-a').breaker, 'open');
        assert.equal(route(p, 'up-rb-b').breaker, 'closed');
        assert.equal(route(p, 'up-rb-b').consecutive_failures, 0);
        assert.equal((await sc.provider('rb-q')).routes[0].breaker, 'closed');
        const metrics = await sc.gw.metrics();
        assert.match(metrics, /^moongate_route_breaker_open\{provider_id="rb-p",model="up-rb-a"\} 1$/m);
        assert.match(metrics, /^moongate_route_breaker_open\{provider_id="rb-p",model="up-rb-b"\} 0$/m);
        assert.match(metrics, /^moongate_provider_breaker_open\{provider_id="rb-p"\} 0$/m);

        // A skips rb-p while its route is open; B keeps going to rb-p
        const seenA = await sc.count('up-rb-a');
        for (let i = 0; i < 3; i++) {
            const a = await sc.chat('rb-a');
            assertOk(a, `A ${i} while its route is open`);
            assert.equal(a.json.actual_model, 'up-rb-a-q');
            assert.equal(await attemptsOf(a), 1, 'the open route is not tried');
            const b = await sc.chat('rb-b');
            assertOk(b, `B ${i} on the same provider`);
            assert.equal(b.json.actual_model, 'up-rb-b');
            assert.equal(b.headers.get('x-sidecar-degraded'), null);
        }
        assert.equal(await sc.count('up-rb-a'), seenA, 'no request reached model A on rb-p while open');

        // half open after open_duration_seconds: one probe, which now succeeds and closes it
        await waitFor(async () => route(await sc.provider('rb-p'), 'up-rb-a').breaker === 'half_open',
            { timeoutMs: 6000, intervalMs: 100, what: 'route breaker half_open' });
        const probe = await sc.chat('rb-a');
        assertOk(probe, 'the probe');
        assert.equal(probe.json.actual_model, 'up-rb-a');
        p = await sc.provider('rb-p');
        assert.equal(route(p, 'up-rb-a').breaker, 'closed');
        assert.equal(await sc.count('up-rb-a'), seenA + 1, 'exactly one probe');
    });
});

// ---------------------------------------------------------------------------
// (12) admin read API
// ---------------------------------------------------------------------------

const SECRET = 'sk-live-pools-e2e-VERYSECRET-0123456789abcdef';

describe('admin read API', { timeout: 20000 }, () => {
    let sc;
    before(async () => {
        sc = await scenario((m) => ({
            providers: [
                mainProvider(m, 'ad-main', { api_key: SECRET, rpm_limit: 60, tpm_limit: 100000, weight: 2, local: true }),
                fallbackProvider(m, 'ad-fb', { local: true }),
            ],
            models: {
                ad: { routes: [{ provider: 'ad-main', model: 'up-ad-main' }, { provider: 'ad-fb', model: 'up-ad-fb' }] },
            },
        }));
    });
    after(() => sc?.close());

    const endpoints = ['/api/v2/pools', '/api/v2/cooldowns', '/api/v2/providers', '/api/v2/providers/ad-main',
        '/api/v2/providers?pool=main', '/api/v2/providers?status=cooldown'];

    test('401 without a token, with a wrong token, and with a non-Bearer header', async () => {
        for (const p of endpoints) {
            for (const token of [null, 'wrong-token', '']) {
                const r = await sc.admin(p, token);
                assert.equal(r.status, 401, `${p} with token ${JSON.stringify(token)}`);
                assert.equal(r.json.error.code, 'AUTH_FAILED');
                assert.ok(!r.text.includes(ADMIN_TOKEN));
            }
            const raw = await fetch(`${sc.gw.base}${p}`, {
                headers: { authorization: ADMIN_TOKEN }, signal: AbortSignal.timeout(5000),
            });
            assert.equal(raw.status, 401, `${p} with the token but no "Bearer "`);
            await raw.arrayBuffer();
        }
    });

    test('shapes of pools, providers, provider, cooldowns; api_key masked everywhere', async () => {
        assertOk(await sc.chat('ad'));
        const mock = await sc.seen('up-ad-main');
        assert.equal(mock[0].headers.authorization, `Bearer ${SECRET}`, 'the real key goes upstream');

        const pools = await sc.admin('/api/v2/pools');
        assert.equal(pools.status, 200);
        for (const k of ['main', 'fallback']) {
            for (const f of ['total', 'active', 'cooldown', 'disabled', 'total_rpm_capacity', 'current_load_rpm'])
                assert.equal(typeof pools.json[k][f], 'number', `pools.${k}.${f}`);
        }
        assert.equal(pools.json.main.total, 1);
        assert.equal(pools.json.main.total_rpm_capacity, 60);
        assert.equal(pools.json.main.current_load_rpm, 1);
        assert.equal(pools.json.fallback.total, 1);

        const list = await sc.admin('/api/v2/providers');
        assert.equal(list.status, 200);
        assert.equal(list.json.total, 2);
        assert.deepEqual(list.json.providers.map((p) => p.id), ['ad-main', 'ad-fb']);
        const one = await sc.provider('ad-main');
        for (const [f, t] of Object.entries({
            id: 'string', name: 'string', endpoint_url: 'string', api_key: 'string', adapter: 'string',
            pool: 'string', status: 'string', rpm_limit: 'number', tpm_limit: 'number', weight: 'number',
            local: 'boolean', health: 'string', breaker: 'string', current_rpm: 'number', in_flight: 'number',
            success_rate_5m: 'number', consecutive_failures: 'number', cooldown_remaining_s: 'number',
            consecutive_429: 'number', requests_total: 'number',
        })) assert.equal(typeof one[f], t, `provider.${f}: ${JSON.stringify(one[f])}`);
        assert.equal(one.pool, 'main');
        assert.equal(one.status, 'active');
        assert.equal(one.rpm_limit, 60);
        assert.equal(one.tpm_limit, 100000);
        assert.equal(one.weight, 2);
        assert.equal(one.local, true);
        assert.equal(one.breaker, 'closed');
        assert.equal(one.health, 'healthy');
        assert.equal(one.current_rpm, 1);
        assert.notEqual(one.api_key, SECRET);
        assert.ok(one.api_key.includes('*') && one.api_key.endsWith(SECRET.slice(-4)), `masked: ${one.api_key}`);
        assert.equal(one.api_key, `${SECRET.slice(0, 6)}*****-${SECRET.slice(-4)}`, 'first 6 + last 4, as the ADR shows keys');
        const fb = await sc.provider('ad-fb');
        assert.equal(fb.api_key, null);
        assert.equal(fb.tpm_limit, null);

        const onlyFb = await sc.admin('/api/v2/providers?pool=fallback');
        assert.deepEqual(onlyFb.json.providers.map((p) => p.id), ['ad-fb']);
        assert.equal(onlyFb.json.total, 1);
        assert.equal((await sc.admin('/api/v2/providers?status=cooldown')).json.total, 0);
        assert.equal((await sc.admin('/api/v2/cooldowns')).json.total, 0);

        // a cooldown shows up in cooldowns, ?status=cooldown and pools
        await sc.script('up-ad-main', { status: 429 }, { times: 1 });
        const r = await sc.chat('ad');
        assertOk(r);
        assert.equal(r.headers.get('x-sidecar-degraded'), 'fallback');
        const cd = await sc.admin('/api/v2/cooldowns');
        assert.equal(cd.json.total, 1);
        const row = cd.json.cooldowns[0];
        for (const [f, t] of Object.entries({
            provider_id: 'string', pool: 'string', remaining_seconds: 'number', cooldown_until_ms: 'number',
            consecutive_429: 'number', cooldowns_total: 'number',
        })) assert.equal(typeof row[f], t, `cooldown.${f}`);
        assert.equal(row.provider_id, 'ad-main');
        assert.ok(row.remaining_seconds > 0 && row.remaining_seconds <= 30);
        const cooling = await sc.admin('/api/v2/providers?status=cooldown');
        assert.deepEqual(cooling.json.providers.map((p) => p.id), ['ad-main']);
        const pools2 = await sc.admin('/api/v2/pools');
        assert.equal(pools2.json.main.cooldown, 1);
        assert.equal(pools2.json.main.active, 0);

        const missing = await sc.admin('/api/v2/providers/nope');
        assert.equal(missing.status, 404);
        const unknown = await sc.admin('/api/v2/nothing-here');
        assert.equal(unknown.status, 404);

        // the full key never appears in any admin answer (nor in the gateway's log)
        for (const p of [...endpoints, '/api/v2/providers?pool=fallback', '/api/v2/providers/ad-fb']) {
            const x = await sc.admin(p);
            assert.equal(x.status, 200, p);
            assert.ok(!x.text.includes(SECRET), `${p} shows the full api_key`);
            assert.ok(!x.text.includes(SECRET.slice(0, 20)), `${p} shows most of the api_key`);
        }
        assert.ok(!sc.gw.stdoutText().includes(SECRET), 'the log never shows the api_key');
    });

    test('read-only: POST to pools is refused', async () => {
        const r = await fetch(`${sc.gw.base}/api/v2/pools`, {
            method: 'POST', headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
            body: '{}', signal: AbortSignal.timeout(5000),
        });
        assert.equal(r.status, 405);
        await r.arrayBuffer();
    });

    test('admin API disabled when MOONGATE_ADMIN_TOKEN is unset', async () => {
        const gw2 = await startGateway(sc.configPath, { env: { MOONGATE_ADMIN_TOKEN: '', SIDECAR_ADMIN_TOKEN: '' } });
        try {
            const r = await fetch(`${gw2.base}/api/v2/pools`, {
                headers: { authorization: 'Bearer ' }, signal: AbortSignal.timeout(5000),
            });
            assert.equal(r.status, 401);
            await r.arrayBuffer();
        } finally {
            await gw2.close();
        }
    });
});
