// The local engines' own signals in routing (issue 20): two vLLM engines (two mocks), one
// reporting a queue on /metrics, the other idle; the default policy sends the traffic to the
// idle one, and follows when the load moves. Bounded: 40 requests per phase.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, startMock, waitFor } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-engine-load-e2e-7f31';
let env;
let second;

before(async () => {
    second = await startMock();
    env = await startEnv({
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
        configure(config, e) {
            config.health = { probes: true, probe_interval_ms: 300, probe_timeout_ms: 2000, load_interval_ms: 300 };
            config.providers = [
                { id: 'vllm-a', adapter: 'openai', base_url: `http://127.0.0.1:${e.mock.port}/v1`, engine: 'vllm', local: true },
                { id: 'vllm-b', adapter: 'openai', base_url: `http://127.0.0.1:${second.port}/v1`, engine: 'vllm', local: true },
            ];
            config.models = { chat: { routes: [{ provider: 'vllm-a', model: 'up-a' }, { provider: 'vllm-b', model: 'up-b' }] } };
            return config;
        },
    });
});

after(async () => {
    await env?.close();
    await second?.close();
});

async function setLoad(mock, load) {
    const r = await fetch(`${mock.base}/__mock/load`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify(load), signal: AbortSignal.timeout(5000) });
    assert.equal(r.status, 200);
}

async function providerLoad(id) {
    const r = await fetch(`${env.base}/api/v2/providers/${id}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
        signal: AbortSignal.timeout(5000) });
    return (await r.json()).load;
}

async function servedBy(n) {
    const count = {};
    for (let i = 0; i < n; i++) {
        const r = await fetch(`${env.api}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ model: 'chat', messages: [{ role: 'user', content: 'hi' }] }), signal: AbortSignal.timeout(10000) });
        const j = await r.json();
        assert.equal(r.status, 200, JSON.stringify(j));
        count[j.actual_model] = (count[j.actual_model] ?? 0) + 1;
    }
    return count;
}

test('the idle engine gets the traffic; when the load moves, the traffic follows', async () => {
    await setLoad(env.mock, { running: 8, waiting: 20, kv_cache: 0.97 });
    await setLoad(second, { running: 0, waiting: 0, kv_cache: 0 });
    await waitFor(async () => (await providerLoad('vllm-a'))?.waiting === 20 && (await providerLoad('vllm-b'))?.running === 0,
        { timeoutMs: 10000, intervalMs: 100, what: 'both loads read' });
    const first = await servedBy(40);
    // shares 1/(1+8+40)/2 and 1: the idle engine serves ~99%
    assert.ok((first['up-b'] ?? 0) >= 36, `idle engine b served ${JSON.stringify(first)}`);

    await setLoad(env.mock, { running: 0, waiting: 0, kv_cache: 0 });
    await setLoad(second, { running: 8, waiting: 20, kv_cache: 0.97 });
    await waitFor(async () => (await providerLoad('vllm-b'))?.waiting === 20 && (await providerLoad('vllm-a'))?.waiting === 0,
        { timeoutMs: 10000, intervalMs: 100, what: 'the moved loads read' });
    const then = await servedBy(40);
    assert.ok((then['up-a'] ?? 0) >= 36, `idle engine a served ${JSON.stringify(then)}`);
});
