// Triton's load in routing (issue 20): two Triton servers (two mocks, each with its metrics
// port on a listener of its own, as tritonserver's --metrics-port), `engine: triton` with
// `metrics_url` on that port. The gateway reads the TensorRT-LLM batch manager's requests,
// the queue and the KV-cache blocks as the engine's load (the admin API shows them), the
// default policy sends the traffic to the idle server and follows when the load moves, and
// the answers come back through the official openai SDK, whole and streamed. Bounded: 40
// requests per phase.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startEnv, startMock, waitFor } from './lib/harness.mjs';
import { contentFor } from '../mock/engine.mjs';

const ADMIN_TOKEN = 'adm-triton-load-e2e-5c2d';
let env;
let first;
let second;
let client;

before(async () => {
    first = await startMock({ tritonMetrics: true });
    second = await startMock({ tritonMetrics: true });
    assert.ok(first.metricsPort && second.metricsPort && first.metricsPort !== first.port);
    env = await startEnv({
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
        configure(config) {
            config.health = { probes: true, probe_interval_ms: 300, probe_timeout_ms: 2000, load_interval_ms: 300 };
            const triton = (id, m) => ({ id, adapter: 'triton', base_url: `http://127.0.0.1:${m.port}`, engine: 'triton',
                metrics_url: `http://127.0.0.1:${m.metricsPort}/metrics`, local: true });
            config.providers = [triton('triton-a', first), triton('triton-b', second)];
            config.models = { chat: { routes: [{ provider: 'triton-a', model: 'ens-a' }, { provider: 'triton-b', model: 'ens-b' }] } };
            return config;
        },
    });
    client = new OpenAI({ baseURL: env.api, apiKey: 'sk-triton-load', maxRetries: 0, timeout: 10000 });
});

after(async () => {
    await env?.close();
    await first?.close();
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
        const r = await client.chat.completions.create({ model: 'chat', messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(r.choices[0].message.content, contentFor(r.actual_model), 'the Triton answer, through the SDK');
        count[r.actual_model] = (count[r.actual_model] ?? 0) + 1;
    }
    return count;
}

test('Triton\'s metrics port is read as the load; the idle server gets the traffic, and it follows the load', async () => {
    await setLoad(first, { running: 8, waiting: 20, kv_cache: 0.97 });
    await setLoad(second, { running: 0, waiting: 0, kv_cache: 0 });
    await waitFor(async () => (await providerLoad('triton-a'))?.waiting === 20 && (await providerLoad('triton-b'))?.running === 0,
        { timeoutMs: 10000, intervalMs: 100, what: 'both Triton loads read' });
    const a = await providerLoad('triton-a');
    assert.equal(a.running, 8, 'nv_trt_llm_request_metrics{request_type="scheduled"}');
    assert.ok(Math.abs(a.kv_cache - 0.97) < 0.01, `KV-cache blocks used / max: ${JSON.stringify(a)}`);
    const one = await servedBy(40);
    assert.ok((one['ens-b'] ?? 0) >= 36, `idle server b served ${JSON.stringify(one)}`);

    await setLoad(first, { running: 0, waiting: 0, kv_cache: 0 });
    await setLoad(second, { running: 8, waiting: 20, kv_cache: 0.97 });
    await waitFor(async () => (await providerLoad('triton-b'))?.waiting === 20 && (await providerLoad('triton-a'))?.waiting === 0,
        { timeoutMs: 10000, intervalMs: 100, what: 'the moved loads read' });
    const two = await servedBy(40);
    assert.ok((two['ens-a'] ?? 0) >= 36, `idle server a served ${JSON.stringify(two)}`);

    // the load came from the metrics port: the inference port's /metrics was never asked
    for (const m of [first, second]) assert.equal((await m.requests((r) => r.path === '/metrics')).length, 0);
    // and the traffic went to Triton's generate endpoint of the route's model
    assert.ok((await second.requests((r) => r.path === '/v2/models/ens-b/generate')).length >= 36);
});

test('a stream from the Triton server the load picks, through the SDK', async () => {
    await setLoad(first, { running: 0, waiting: 0, kv_cache: 0 });
    await setLoad(second, { running: 16, waiting: 40, kv_cache: 0.99 });
    await waitFor(async () => (await providerLoad('triton-b'))?.waiting === 40 && (await providerLoad('triton-a'))?.running === 0,
        { timeoutMs: 10000, intervalMs: 100, what: 'loads read' });
    const stream = await client.chat.completions.create({ model: 'chat', messages: [{ role: 'user', content: 'hello' }],
        stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage = null;
    for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? '';
        if (chunk.usage) usage = chunk.usage;
    }
    assert.ok(text === contentFor('ens-a') || text === contentFor('ens-b'), text);
    assert.ok(usage && usage.completion_tokens > 0);
    const streamed = await first.requests((r) => r.path === '/v2/models/ens-a/generate_stream');
    assert.equal(streamed.length, 1, 'the idle server a served the stream');
});
