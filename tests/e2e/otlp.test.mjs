// Traces over OTLP/HTTP JSON (issue 22): one span per request with the GenAI semantic
// conventions' attributes, in the client's trace (traceparent), POSTed in batches to
// observability.otlp.endpoint with its headers; a collector that fails is retried with
// backoff; a full queue drops and counts. The collector is a node http server in the test.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import OpenAI from 'openai';
import { startEnv, waitFor, postJson } from './lib/harness.mjs';

const CLIENT_TRACE = '0af7651916cd43dd8448eb211c80319c';
const CLIENT_SPAN = 'b7ad6b7169203331';
const OTLP_TOKEN = 'otlp-collector-token-42';

/** A collector on 127.0.0.1: every POST's path, headers and parsed body; `fail` answers the
 * next that many with 503. */
async function startCollector() {
    const c = { posts: [], fail: 0, failed: 0 };
    c.server = http.createServer((req, res) => {
        let body = '';
        req.on('data', (d) => (body += d));
        req.on('end', () => {
            if (c.fail > 0) {
                c.fail--;
                c.failed++;
                res.writeHead(503).end('busy');
                return;
            }
            c.posts.push({ path: req.url, headers: req.headers, body: JSON.parse(body) });
            res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
        });
    });
    await new Promise((r) => c.server.listen(0, '127.0.0.1', r));
    c.port = c.server.address().port;
    c.spans = () => c.posts.flatMap((p) => p.body.resourceSpans.flatMap((rs) => rs.scopeSpans.flatMap((ss) => ss.spans)));
    c.span = (requestId, what = 'span') => waitFor(() => c.spans().find((s) => attrs(s)['moongate.request_id'] === requestId),
        { timeoutMs: 8000, what });
    c.close = () => new Promise((r) => c.server.close(r));
    return c;
}

/** A span's attributes as a plain object (intValue as a number). */
function attrs(span) {
    const o = {};
    for (const a of span.attributes) {
        const v = a.value;
        o[a.key] = v.stringValue ?? (v.intValue !== undefined ? Number(v.intValue) : v.boolValue ?? v.doubleValue);
    }
    return o;
}

async function metric(env, name) {
    const t = await (await fetch(`http://127.0.0.1:${env.gw.metricsPort}/metrics`)).text();
    const line = t.split('\n').find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`) && l.includes(name));
    return line ? Number(line.split(' ').at(-1)) : NaN;
}

function otlpConf(port, extra = {}) {
    return { otlp: { endpoint: `http://127.0.0.1:${port}`, headers: { authorization: `Bearer ${OTLP_TOKEN}` },
        interval_ms: 100, ...extra } };
}

describe('OTLP export', () => {
    let env;
    let collector;
    let client;

    before(async () => {
        collector = await startCollector();
        env = await startEnv({
            configure: (c) => ({ ...c, health: { probes: false }, observability: otlpConf(collector.port, { max_retries: 5 }) }),
        });
        client = new OpenAI({ baseURL: env.api, apiKey: 'sk-otlp-test', maxRetries: 0, timeout: 10000 });
    });

    after(async () => {
        await env?.close();
        await collector?.close();
    });

    test('one span per request: the client trace, the GenAI attributes, the configured headers', async () => {
        const { data, response } = await client.chat.completions.create(
            { model: 'chat', messages: [{ role: 'user', content: 'trace me' }] },
            { headers: { traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` } }).withResponse();
        const requestId = response.headers.get('x-request-id');
        const gatewaySpan = response.headers.get('traceparent').split('-')[2];
        const span = await collector.span(requestId);
        assert.equal(span.traceId, CLIENT_TRACE);
        assert.equal(span.parentSpanId, CLIENT_SPAN);
        assert.equal(span.spanId, gatewaySpan);
        assert.equal(span.kind, 2);
        assert.equal(span.name, 'chat chat');
        assert.equal(span.status.code, 1);
        assert.ok(BigInt(span.endTimeUnixNano) >= BigInt(span.startTimeUnixNano));
        assert.ok(Math.abs(Number(BigInt(span.endTimeUnixNano) / 1000000n) - Date.now()) < 60000);
        const a = attrs(span);
        assert.equal(a['gen_ai.operation.name'], 'chat');
        assert.equal(a['gen_ai.system'], 'openai');
        assert.equal(a['gen_ai.request.model'], 'chat');
        assert.equal(a['gen_ai.response.model'], 'up-chat', 'the model the upstream ran');
        assert.equal(a['gen_ai.usage.input_tokens'], data.usage.prompt_tokens);
        assert.equal(a['gen_ai.usage.output_tokens'], data.usage.completion_tokens);
        assert.equal(a['http.response.status_code'], 200);
        assert.equal(a['moongate.provider'], 'mock-openai');
        assert.equal(a['moongate.stream'], false);
        const post = collector.posts.find((p) => p.body.resourceSpans[0].scopeSpans[0].spans.includes(span));
        assert.equal(post.path, '/v1/traces');
        assert.equal(post.headers.authorization, `Bearer ${OTLP_TOKEN}`);
        assert.match(post.headers['content-type'], /^application\/json/);
        const res = attrs(post.body.resourceSpans[0].resource);
        assert.equal(res['service.name'], 'moongate');
        assert.ok(!env.gw.stdoutText().includes(OTLP_TOKEN), 'the header value is never logged');
    });

    test('a stream, a trace the gateway starts, and an error', async () => {
        const { data: stream, response } = await client.chat.completions.create(
            { model: 'chat', messages: [{ role: 'user', content: 'stream me' }], stream: true,
                stream_options: { include_usage: true } }).withResponse();
        let usage;
        for await (const ch of stream) if (ch.usage) usage = ch.usage;
        const requestId = response.headers.get('x-request-id');
        const span = await collector.span(requestId);
        assert.equal(span.parentSpanId, undefined, 'no parent: the trace is the gateway\'s');
        assert.equal(span.traceId, response.headers.get('traceparent').split('-')[1]);
        const a = attrs(span);
        assert.equal(a['moongate.stream'], true);
        assert.equal(a['gen_ai.usage.output_tokens'], usage.completion_tokens);
        assert.ok(a['moongate.time_to_first_token_ms'] >= 0);

        const emb = await client.embeddings.create({ model: 'embed', input: 'vector me' }).withResponse();
        const eSpan = await collector.span(emb.response.headers.get('x-request-id'), 'the embeddings span');
        assert.equal(eSpan.name, 'embeddings embed');
        assert.equal(attrs(eSpan)['gen_ai.operation.name'], 'embeddings');
        assert.equal(attrs(eSpan)['gen_ai.response.model'], 'up-embed');

        const bad = await postJson(`${env.api}/chat/completions`, { model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] });
        assert.ok(bad.status >= 400);
        const es = await collector.span(bad.headers.get('x-request-id'), 'the error span');
        assert.equal(es.status.code, 2);
        assert.equal(attrs(es)['error.type'], bad.json.error.code);
        assert.equal(attrs(es)['http.response.status_code'], bad.status);
    });

    test('a failing collector: retried with backoff until it takes the batch', async () => {
        const failuresBefore = await metric(env, 'moongate_otlp_export_failures_total');
        collector.fail = 2;
        const { response } = await client.chat.completions.create(
            { model: 'chat', messages: [{ role: 'user', content: 'retry me' }] }).withResponse();
        const t0 = Date.now();
        const span = await collector.span(response.headers.get('x-request-id'), 'the span after retries');
        assert.ok(span);
        assert.equal(collector.failed, 2);
        assert.ok(Date.now() - t0 >= 1000, 'backoff: 0.5 s then 1 s');
        assert.equal(await metric(env, 'moongate_otlp_export_failures_total'), failuresBefore + 2);
        assert.ok(await metric(env, 'moongate_otlp_spans_exported_total') >= 4);
    });
});

describe('OTLP export: a bounded queue', () => {
    let env;
    let collector;

    before(async () => {
        collector = await startCollector();
        env = await startEnv({
            configure: (c) => ({ ...c, health: { probes: false },
                observability: otlpConf(collector.port, { interval_ms: 60000, max_batch: 100, max_queue: 2 }) }),
        });
    });

    after(async () => {
        await env?.close();
        await collector?.close();
    });

    test('past max_queue the new spans are dropped and counted; the rest go at shutdown', async () => {
        for (let i = 0; i < 5; i++) {
            const r = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: `q${i}` }] });
            assert.equal(r.status, 200, r.text);
        }
        await waitFor(async () => (await metric(env, 'moongate_otlp_spans_dropped_total{reason="queue_full"}')) === 3,
            { what: '3 dropped' });
        assert.equal(await metric(env, 'moongate_otlp_queue_spans'), 2);
        assert.equal(collector.spans().length, 0, 'nothing sent before the interval');
        await env.gw.close();
        env.gw = null;
        assert.equal(collector.spans().length, 2, 'the queued spans flushed on the way out');
    });
});
