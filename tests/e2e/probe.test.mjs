// Active probes (issue 3): engine load read from the engine itself (vLLM /metrics, llama.cpp
// /slots after /metrics turns out not to be llama.cpp's, Ollama /api/ps), shown by the admin
// API; and the health probe (GET {base_url}/models) taking a provider that answers HTML out of
// the healthy state and bringing it back once it answers JSON again.
//
// One mock plays every engine (its load is set with POST /__mock/load). Probes run every
// 300 ms here; every wait is bounded.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, waitFor, TEST_KEY, TEST_KEY_ENV } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-probe-e2e-token-41c2';

const MODELS_OK = { path: '/bad/v1/models', method: 'GET', action: { status: 200, body: { object: 'list', data: [] } } };

let env;

before(async () => {
    env = await startEnv({
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
        configure(config, e) {
            const m = `http://127.0.0.1:${e.mock.port}`;
            config.health = { probes: true, probe_interval_ms: 300, probe_timeout_ms: 2000, load_interval_ms: 300 };
            config.circuit_breaker = { open_duration_seconds: 1 };
            config.providers = [
                { id: 'vllm-local', adapter: 'openai', base_url: `${m}/v1`, api_key: `\${${TEST_KEY_ENV}}`, engine: 'vllm' },
                { id: 'llama-local', adapter: 'openai', base_url: `${m}/v1`, engine: 'llamacpp' },
                { id: 'ollama-local', adapter: 'openai', base_url: `${m}/v1`, engine: 'ollama' },
                { id: 'html-prov', adapter: 'openai', base_url: `${m}/bad/v1` },
                // the anthropic adapter's probe carries the key its own way (probe_key_header)
                { id: 'claude-prov', adapter: 'anthropic', base_url: `${m}/claude`, api_key: `\${${TEST_KEY_ENV}}` },
            ];
            config.models = {
                chat: { routes: [{ provider: 'vllm-local', model: 'up-chat' }] },
                'html-chat': { routes: [{ provider: 'html-prov', model: 'up-html' }] },
            };
            return config;
        },
    });
    // html-prov's path answers a proper model list until the health test scripts HTML
    await env.mock.script(MODELS_OK);
});

after(async () => {
    await env?.close();
});

async function provider(id) {
    const r = await fetch(`${env.base}/api/v2/providers/${id}`, {
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
        signal: AbortSignal.timeout(5000),
    });
    const text = await r.text();
    assert.equal(r.status, 200, `GET /api/v2/providers/${id}: ${text.slice(0, 300)}`);
    return JSON.parse(text);
}

async function setLoad(load) {
    const r = await fetch(`${env.mock.base}/__mock/load`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(load),
        signal: AbortSignal.timeout(5000),
    });
    assert.equal(r.status, 200);
}

/** Wait until provider id's load satisfies pred; returns the provider object. */
function waitLoad(id, pred, what) {
    let last;
    return waitFor(async () => {
        last = await provider(id);
        return last.load && pred(last.load) ? last : null;
    }, { timeoutMs: 10000, intervalMs: 100, what: `${id} ${what}` }).catch((err) => {
        throw new Error(`${err.message}; last seen: ${JSON.stringify(last?.load)}`);
    });
}

test('engine load: vLLM /metrics, llama.cpp /slots, Ollama /api/ps, followed as it changes', async () => {
    await setLoad({ running: 3, waiting: 5, kv_cache: 0.42 });
    const v = await waitLoad('vllm-local', (l) => l.running === 3 && l.waiting === 5, 'load 3/5');
    assert.ok(Math.abs(v.load.kv_cache - 0.42) < 1e-9, `kv_cache: ${JSON.stringify(v.load)}`);
    assert.equal(v.health, 'healthy');
    // the mock's /metrics is vLLM's, not llama.cpp's: the llama.cpp probe falls back to /slots
    const l = await waitLoad('llama-local', (x) => x.running === 3, 'running 3');
    assert.equal(l.load.waiting, 0, '/slots shows no queue');
    assert.equal(l.load.kv_cache, undefined, 'no KV-cache figure from /slots');
    const o = await waitLoad('ollama-local', (x) => x.running === 3, '3 models loaded');
    assert.equal(o.load.waiting, 0, 'Ollama exposes no queue');

    await setLoad({ running: 1, waiting: 0, kv_cache: 0.05 });
    const v2 = await waitLoad('vllm-local', (x) => x.running === 1 && x.waiting === 0, 'load 1/0');
    assert.ok(Math.abs(v2.load.kv_cache - 0.05) < 1e-9);
    await waitLoad('llama-local', (x) => x.running === 1, 'running 1');
    await waitLoad('ollama-local', (x) => x.running === 1, '1 model loaded');

    const seen = await env.mock.requests((r) => r.method === 'GET');
    const paths = new Set(seen.map((r) => r.path));
    for (const p of ['/metrics', '/slots', '/api/ps', '/v1/models']) assert.ok(paths.has(p), `probed ${p}`);
    assert.ok(!paths.has('/v1/metrics'), 'load probes use the origin, not base_url');
    const probe = seen.find((r) => r.path === '/v1/models' && r.headers.authorization);
    assert.ok(probe, 'the health probe of a provider with a key carries it');
    assert.equal(probe.headers.authorization, `Bearer ${TEST_KEY}`);
    const claude = await waitFor(async () => (await env.mock.requests((r) => r.path === '/claude/v1/models'))[0],
        { what: 'the anthropic provider probed' });
    assert.equal(claude.headers['x-api-key'], TEST_KEY, 'its key in x-api-key');
    assert.equal(claude.headers['anthropic-version'], '2023-06-01');
    assert.equal(claude.headers.authorization, undefined, 'and not as a bearer token');
    // a provider without an engine gets no load probe
    assert.equal((await provider('html-prov')).load, undefined);
});

test('health probe: HTML answers take the provider down, JSON brings it back', async () => {
    assert.equal((await provider('html-prov')).health, 'healthy');
    await env.mock.reset();
    await env.mock.script({
        path: '/bad/v1/models',
        method: 'GET',
        action: {
            status: 200,
            headers: { 'Content-Type': 'text/html; charset=utf-8' },
            body: '<!DOCTYPE html><html><head><title>Sign in</title></head><body>Please log in</body></html>',
        },
    });
    let last;
    const sick = await waitFor(async () => {
        last = await provider('html-prov');
        return last.health === 'degraded' || last.health === 'down' ? last : null;
    }, { timeoutMs: 15000, intervalMs: 100, what: 'html-prov degraded' }).catch((err) => {
        throw new Error(`${err.message}; last seen: ${JSON.stringify(last)}`);
    });
    assert.ok(sick.consecutive_failures >= 5, `failures counted: ${sick.consecutive_failures}`);
    assert.notEqual(sick.breaker, 'closed', 'probe failures reach the circuit breaker');
    const probes = await env.mock.requests((r) => r.path === '/bad/v1/models');
    assert.ok(probes.length >= 5, `probes seen: ${probes.length}`);
    assert.ok(env.gw.logs.some((j) => j.msg === 'health' && j.provider === 'html-prov' && j.state !== 'healthy'),
        'the change is logged');
    // the other providers stay healthy meanwhile
    assert.equal((await provider('vllm-local')).health, 'healthy');

    // the same path now answers a proper model list
    await env.mock.reset();
    await env.mock.script(MODELS_OK);
    const well = await waitFor(async () => {
        last = await provider('html-prov');
        return last.health === 'healthy' && last.breaker === 'closed' ? last : null;
    }, { timeoutMs: 40000, intervalMs: 200, what: 'html-prov healthy again' }).catch((err) => {
        throw new Error(`${err.message}; last seen: ${JSON.stringify(last)}`);
    });
    assert.equal(well.consecutive_failures, 0);
    assert.ok(env.gw.logs.some((j) => j.msg === 'health' && j.provider === 'html-prov' && j.state === 'healthy'),
        'the recovery is logged');
});
