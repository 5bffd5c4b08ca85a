// Upstream failures: failover before the first byte, all-429, dead ports, garbage, timeouts,
// failures after streaming began, and client disconnects that must cancel the upstream work.
// Each scenario has its own providers so that one scenario's cooldowns cannot leak into another.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startEnv, postJson, postStream, RawConn, rawRequest, deadPort } from './lib/harness.mjs';
import { assertConforms } from './lib/conformance.mjs';
import { contentFor } from '../mock/engine.mjs';

const FIRST_BYTE_MS = 1000;
const IDLE_MS = 500;

// scenario name -> number of routes (each route has its own provider p-<name>-<i>, upstream
// model up-<name>-<i>); adapter "ollama" for names starting with "ollama-"
const SCENARIOS = {
    rl: 2, 'rl-all': 2, e500: 2, 'e500-stream': 2, garbage: 1, 'garbage-stream': 1,
    slow: 1, 'slow-stream': 1, reset: 1, 'reset-rst': 1, 'reset-sdk': 1, trunc: 1, 'ollama-trunc': 1, idle: 1,
    abort: 1, 'abort-raw': 1, hang: 1, spaced: 1,
    'diag-html': 1, 'diag-reset': 1, 'diag-stall': 1, 'diag-hang': 1,
    'rejects': 1, 'ollama-rejects': 1, 'raise-stream': 1, 'late-json': 1,
};

let env;
let client;
let dead2;

before(async () => {
    dead2 = await deadPort();
    env = await startEnv({
        timeouts: { first_byte_ms: FIRST_BYTE_MS, idle_ms: IDLE_MS, max_first_byte_ms: FIRST_BYTE_MS * 4 },
        configure(config, e) {
            const mock = `http://127.0.0.1:${e.mock.port}`;
            for (const [name, n] of Object.entries(SCENARIOS)) {
                const routes = [];
                for (let i = 1; i <= n; i++) {
                    const ollama = name.startsWith('ollama-');
                    config.providers.push({
                        id: `p-${name}-${i}`,
                        adapter: ollama ? 'ollama' : 'openai',
                        base_url: ollama ? mock : `${mock}/v1`,
                    });
                    // priority groups make the order fixed (equal routes would be weighted-random)
                    routes.push({ provider: `p-${name}-${i}`, model: `up-${name}-${i}`, priority: i - 1 });
                }
                config.models[name] = { routes };
            }
            config.providers.push({ id: 'dead-2', adapter: 'openai', base_url: `http://127.0.0.1:${dead2}/v1` });
            config.models['dead-only'] = { routes: [{ provider: 'dead-2', model: 'up-dead-only' }] };
            return config;
        },
    });
    client = new OpenAI({ baseURL: env.api, apiKey: 'any', maxRetries: 0, timeout: 15000 });
});

after(async () => {
    await env?.close();
});

const messages = [{ role: 'user', content: 'upstream trouble' }];
const chat = (model, extra = {}) => ({ model, messages, ...extra });

function script(model, action, extra = {}) {
    return env.mock.script({ model, action, ...extra });
}

async function seen(model) {
    return env.mock.requests((r) => r.body?.model === model);
}

function assertError(r, status, code) {
    assert.equal(r.status, status, `status (body: ${r.text?.slice(0, 300)})`);
    assertConforms('ErrorResponse', r.json, `${status} error`);
    assert.equal(r.json.error.code, code);
    assert.equal(r.json.error.request_id, r.headers.get('x-request-id'));
}

/** A stream that failed after it began: some chunks, an error event, then [DONE]. */
function assertStreamError(s, code) {
    assert.equal(s.status, 200, 'the stream had begun (200 sent)');
    assert.equal(s.error, null, `the gateway ends the HTTP response properly (got ${s.error})`);
    assert.equal(s.data.at(-1), '[DONE]', `stream ends with [DONE]; frames: ${s.data.join(' | ').slice(0, 600)}`);
    const errs = s.events.filter((e) => e && typeof e === 'object' && e.error);
    assert.equal(errs.length, 1, 'exactly one error event');
    const e = errs[0].error;
    assert.equal(s.events.at(-2), errs[0], 'the error event comes right before [DONE]');
    assert.equal(typeof e.message, 'string');
    assert.equal(e.type, 'api_error');
    assert.equal(e.code, code);
    assert.ok('param' in e);
    assert.ok(!s.events.some((ev) => ev?.choices?.[0]?.finish_reason), 'no finish_reason on a failed stream');
    return e;
}

describe('failover before the first byte', () => {
    test('429 on the first route -> answered by the second route', async () => {
        await script('up-rl-1', { status: 429, headers: { 'Retry-After': '1' } });
        const { data, response } = await client.chat.completions.create(chat('rl')).withResponse();
        assert.equal(data.actual_model, 'up-rl-2');
        assert.equal(data.choices[0].message.content, contentFor('up-rl-2'));
        assert.equal((await seen('up-rl-1')).length, 1);
        assert.equal((await seen('up-rl-2')).length, 1);
        const log = await env.gw.requestLog(response.headers.get('x-request-id'));
        assert.equal(log.provider, 'p-rl-2');
        assert.equal(log.status, 200);
        assert.equal(log.outcome, 'ok');
    });

    test('all routes 429 -> 503 MODEL_UNAVAILABLE with Retry-After', async () => {
        await script('up-rl-all-1', { status: 429, headers: { 'Retry-After': '2' } });
        await script('up-rl-all-2', { status: 429, headers: { 'Retry-After': '2' } });
        const r = await postJson(`${env.api}/chat/completions`, chat('rl-all'));
        assertError(r, 503, 'MODEL_UNAVAILABLE');
        const ra = r.headers.get('retry-after');
        assert.ok(ra && /^\d+$/.test(ra) && Number(ra) >= 1, `Retry-After header: ${ra}`);
        assert.equal((await seen('up-rl-all-1')).length, 1);
        assert.equal((await seen('up-rl-all-2')).length, 1);
        await assert.rejects(client.chat.completions.create(chat('rl-all')), (e) => {
            assert.equal(e.status, 503);
            assert.equal(e.code, 'MODEL_UNAVAILABLE');
            return true;
        });
    });

    test('500 on the first route -> failover (non-stream)', async () => {
        await script('up-e500-1', { status: 500 });
        const data = await client.chat.completions.create(chat('e500'));
        assert.equal(data.actual_model, 'up-e500-2');
        assert.equal((await seen('up-e500-1')).length, 1);
    });

    test('500 on the first route -> failover (stream)', async () => {
        await script('up-e500-stream-1', { status: 500 });
        const s = await postStream(`${env.api}/chat/completions`, chat('e500-stream', { stream: true }));
        assert.equal(s.status, 200);
        assert.equal(s.data.at(-1), '[DONE]');
        assert.equal(s.events[0].actual_model, 'up-e500-stream-2');
        const text = s.events.slice(0, -1).map((e) => e.choices?.[0]?.delta?.content ?? '').join('');
        assert.equal(text, contentFor('up-e500-stream-2'));
    });

    test('dead port on the first route -> the next route answers', async () => {
        const data = await client.chat.completions.create(chat('dead-first'));
        assert.equal(data.actual_model, 'up-after-dead');
        assert.equal(data.choices[0].message.content, contentFor('up-after-dead'));
    });

    test('dead port on the only route -> 502 MODEL_UNAVAILABLE', async () => {
        const r = await postJson(`${env.api}/chat/completions`, chat('dead-only'));
        assertError(r, 502, 'MODEL_UNAVAILABLE');
    });

    test('upstream garbage before the first byte -> 502 (non-stream)', async () => {
        await script('up-garbage-1', { garbage: true });
        const r = await postJson(`${env.api}/chat/completions`, chat('garbage'));
        assertError(r, 502, 'MODEL_UNAVAILABLE');
    });

    test('upstream garbage before the first byte -> 502 (stream)', async () => {
        await script('up-garbage-stream-1', { garbage: true });
        const r = await postJson(`${env.api}/chat/completions`, chat('garbage-stream', { stream: true }));
        assertError(r, 502, 'MODEL_UNAVAILABLE');
    });

    test('first-byte timeout -> 408 FIRST_TOKEN_TIMEOUT (stream)', async () => {
        await script('up-slow-stream-1', { delay_first_byte_ms: 3000 });
        const t0 = Date.now();
        const r = await postJson(`${env.api}/chat/completions`, chat('slow-stream', { stream: true }));
        const dt = Date.now() - t0;
        assertError(r, 408, 'FIRST_TOKEN_TIMEOUT');
        assert.ok(dt < 2900, `answered after ${dt} ms: the gateway waited for the upstream instead of first_byte_ms`);
    });

    test('a non-stream answer slower than first_byte_ms is not cut: its first byte is the answer', async () => {
        // (issue 18.1: engines send nothing until a whole answer is done; the inference and
        // total deadlines bound it, the first-token deadline is a stream's)
        await script('up-late-json-1', { delay_first_byte_ms: FIRST_BYTE_MS * 2 });
        const r = await postJson(`${env.api}/chat/completions`, chat('late-json'));
        assert.equal(r.status, 200, r.text);
        assert.equal((await seen('up-late-json-1')).length, 1, 'one generation, not a retry');
    });

    test('a request may ask for a longer first-token deadline, up to timeouts.max_first_byte_ms', async () => {
        await script('up-raise-stream-1', { delay_first_byte_ms: FIRST_BYTE_MS * 2 });
        const s = await postStream(`${env.api}/chat/completions`,
            chat('raise-stream', { stream: true, timeouts: { first_token_ms: FIRST_BYTE_MS * 3 } }));
        assert.equal(s.status, 200, s.text.slice(0, 300));
        assert.equal(s.data.at(-1), '[DONE]');
        assert.ok(!s.events.some((e) => e?.error), 'no error event');
    });

    test('a non-stream answer past the inference deadline -> 408 INFERENCE_TIMEOUT, a timeout', async () => {
        await script('up-slow-1', { delay_first_byte_ms: 3000 });
        const r = await postJson(`${env.api}/chat/completions`, chat('slow', { timeouts: { inference_ms: 1000 } }));
        assertError(r, 408, 'INFERENCE_TIMEOUT');
        assert.equal(r.json.error.type, 'timeout_error');
    });
});

describe('streams in other spellings', () => {
    test('JSON with spaces after colons and commas (Python json.dumps): usage folded into the finish chunk', async () => {
        const ev = (o) => `data: ${JSON.stringify(o).replace(/":/g, '": ').replace(/,"/g, ', "')}\n\n`;
        const base = { id: 'c-sp', object: 'chat.completion.chunk', created: 1, model: 'up-spaced-1' };
        const body = [
            ev({ ...base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] }),
            ev({ ...base, choices: [{ index: 0, delta: { content: 'Hi: "there"' }, finish_reason: null }] }),
            ev({ ...base, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }),
            ev({ ...base, choices: [], usage: { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 } }),
            'data: [DONE]\n\n',
        ].join('');
        assert.ok(body.includes('"finish_reason": "stop"') && body.includes('"usage": {'), body.slice(0, 400));
        await script('up-spaced-1', { body, headers: { 'Content-Type': 'text/event-stream' } });
        const s = await postStream(`${env.api}/chat/completions`, chat('spaced', { stream: true }));
        assert.equal(s.status, 200);
        assert.equal(s.data.at(-1), '[DONE]');
        const chunks = s.events.filter((e) => e && typeof e === 'object');
        assert.equal(chunks[0].request_id, s.headers.get('x-request-id'), 'metadata on the first chunk');
        assert.equal(chunks[1].choices[0].delta.content, 'Hi: "there"');
        const fin = chunks.find((e) => e.choices?.[0]?.finish_reason === 'stop');
        assert.ok(fin, 'the finish chunk reached the client');
        assert.deepEqual(fin.usage, { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 });
        assert.ok(fin.timing && typeof fin.timing.total_ms === 'number', 'timing on the finish chunk');
        assert.ok(!chunks.some((e) => Array.isArray(e.choices) && e.choices.length === 0),
            'the usage-only chunk is folded (the client did not ask for it)');
    });
});

describe('failures after the stream began', () => {
    test('mid-stream reset -> error event then [DONE]', async () => {
        await script('up-reset-1', { reset_after_chunks: 2, chunk_delay_ms: 100 });
        const s = await postStream(`${env.api}/chat/completions`, chat('reset', { stream: true }));
        const chunks = s.events.filter((e) => e?.choices);
        assert.ok(chunks.length >= 1, 'the chunks sent before the reset reached the client');
        assertStreamError(s, 'UPSTREAM_ERROR');
        const log = await env.gw.requestLog(s.headers.get('x-request-id'));
        assert.equal(log.outcome, 'error');
    });

    test('mid-stream TCP RST -> error event then [DONE]', async () => {
        await script('up-reset-rst-1', { reset_after_chunks: 2, chunk_delay_ms: 100, rst: true });
        const s = await postStream(`${env.api}/chat/completions`, chat('reset-rst', { stream: true }));
        assertStreamError(s, 'UPSTREAM_ERROR');
    });

    test('mid-stream reset -> the openai SDK iteration throws', async () => {
        await script('up-reset-sdk-1', { reset_after_chunks: 2, chunk_delay_ms: 100 });
        const stream = await client.chat.completions.create(chat('reset-sdk', { stream: true }));
        const got = [];
        await assert.rejects((async () => {
            for await (const c of stream) got.push(c);
        })(), (e) => {
            assert.ok(e instanceof OpenAI.APIError, `got ${e?.constructor?.name}`);
            return true;
        });
        assert.ok(got.length >= 1);
    });

    test('truncated stream (no final chunk, no [DONE]) -> error event, not a clean end', async () => {
        await script('up-trunc-1', { truncate_after_chunks: 2, chunk_delay_ms: 100 });
        const s = await postStream(`${env.api}/chat/completions`, chat('trunc', { stream: true }));
        assertStreamError(s, 'UPSTREAM_ERROR');
    });

    test('truncated ollama stream (no done:true) -> error event', async () => {
        await script('up-ollama-trunc-1', { truncate_after_chunks: 2, chunk_delay_ms: 100 });
        const s = await postStream(`${env.api}/chat/completions`, chat('ollama-trunc', { stream: true }));
        assertStreamError(s, 'UPSTREAM_ERROR');
    });

    test('idle timeout mid-stream -> error event UPSTREAM_TIMEOUT', async () => {
        await script('up-idle-1', { chunk_delay_ms: 2000, chunks: 3 });
        const t0 = Date.now();
        const s = await postStream(`${env.api}/chat/completions`, chat('idle', { stream: true }), { timeoutMs: 8000 });
        const dt = Date.now() - t0;
        assertStreamError(s, 'UPSTREAM_TIMEOUT');
        assert.ok(dt < 1900, `the stream ended after ${dt} ms: idle_ms (${IDLE_MS}) was not applied`);
    });
});

describe('client disconnects cancel the upstream work', () => {
    test('SDK abort mid-stream -> upstream closed early, log outcome cancelled', async () => {
        await script('up-abort-1', { chunk_delay_ms: 200, chunks: 50 });
        const ac = new AbortController();
        const stream = await client.chat.completions.create(chat('abort', { stream: true }), { signal: ac.signal });
        let rid = null;
        let n = 0;
        // the SDK ends the iteration quietly (or with an abort error) once aborted
        try {
            for await (const c of stream) {
                rid ??= c.request_id;
                if (++n === 3) ac.abort();
                assert.ok(n <= 3 + 2, 'the SDK stopped delivering chunks after the abort');
            }
        } catch (e) {
            if (!(e instanceof OpenAI.APIUserAbortError) && e?.name !== 'AbortError') throw e;
        }
        assert.ok(n >= 3 && n < 50, `got ${n} chunks`);
        assert.ok(rid, 'first chunk carried request_id');
        const rec = await env.mock.waitRequest((r) => r.body?.model === 'up-abort-1' && r.closed_early,
            { timeoutMs: 3000, what: 'the upstream connection to close after the client aborted' });
        assert.equal(rec.finished, false);
        const log = await env.gw.requestLog(rid, 3000);
        assert.equal(log.outcome, 'cancelled');
    });

    test('raw socket destroyed mid-stream -> upstream closed early, log outcome cancelled', async () => {
        await script('up-abort-raw-1', { chunk_delay_ms: 200, chunks: 50 });
        const c = await RawConn.open(env.gw.port);
        await c.write(rawRequest('POST', '/v1/chat/completions', { body: chat('abort-raw', { stream: true }) }));
        const text = await c.waitText(' says', 5000);
        const rid = /x-request-id:\s*(\S+)/i.exec(text)?.[1];
        c.destroy();
        await env.mock.waitRequest((r) => r.body?.model === 'up-abort-raw-1' && r.closed_early,
            { timeoutMs: 3000, what: 'the upstream connection to close after the client went away' });
        assert.ok(rid, 'X-Request-Id header seen');
        const log = await env.gw.requestLog(rid, 3000);
        assert.equal(log.outcome, 'cancelled');
    });

    test('client disconnect while waiting for a non-stream answer -> upstream closed early', async () => {
        await script('up-hang-1', { hang: true });
        const ac = new AbortController();
        const p = fetch(`${env.api}/chat/completions`, {
            method: 'POST', headers: { 'content-type': 'application/json' },
            body: JSON.stringify(chat('hang')), signal: ac.signal,
        });
        p.catch(() => {});
        await env.mock.waitRequest((r) => r.body?.model === 'up-hang-1', { timeoutMs: 3000 });
        ac.abort();
        await assert.rejects(p);
        const rec = await env.mock.waitRequest((r) => r.body?.model === 'up-hang-1' && r.closed_early,
            { timeoutMs: 3000, what: 'the upstream connection to close after the client went away' });
        assert.equal(rec.finished, false);
        const log = await env.gw.waitLog((l) => l.msg === 'request' && l.model === 'hang',
            { timeoutMs: 3000, what: 'request log line of the hang model' });
        assert.equal(log.outcome, 'cancelled');
    });

    test('no request left in flight afterwards', async () => {
        const s = await env.gw.getJson('/status');
        assert.equal(s.status, 200);
        assert.equal(s.json.in_flight, 0);
    });
});

// What the client and the log are told when every route failed: what the provider did, not a
// guess (issue 16, item 10).
describe('diagnostics when every route failed', () => {
    async function failed(model, action) {
        await script(`up-${model}-1`, action);
        const r = await postJson(`${env.api}/chat/completions`, chat(model), { timeoutMs: 15000 });
        const line = await env.gw.requestLog(r.headers.get('x-request-id'));
        return { r, line };
    }

    test('a 500 HTML answer says the provider answered HTTP 500', async () => {
        const { r, line } = await failed('diag-html', { status: 500, body: '<html><body>oops</body></html>' });
        assertError(r, 502, 'MODEL_UNAVAILABLE');
        assert.match(r.json.error.message, /HTTP 500/);
        assert.doesNotMatch(r.json.error.message, /could not be reached|no provider could/);
        assert.equal(line.fail_reason, 'http_5xx');
        assert.equal(line.upstream_status, 500);
    });

    test('a reset says the connection broke', async () => {
        const { r, line } = await failed('diag-reset', { reset: true, rst: true });
        assertError(r, 502, 'MODEL_UNAVAILABLE');
        assert.match(r.json.error.message, /broke/);
        assert.equal(line.fail_reason, 'connection_broken');
    });

    test('a mid-body stall says the provider stopped sending', async () => {
        const { r, line } = await failed('diag-stall',
            { status: 200, body: ['{"id":"x","object":', '"chat.completion"}'], chunk_delay_ms: IDLE_MS * 4 });
        assertError(r, 502, 'MODEL_UNAVAILABLE');
        assert.match(r.json.error.message, /stopped sending/);
        assert.equal(line.fail_reason, 'stalled');
        assert.equal(line.upstream_status, 200);
    });

    test('an upstream that never answers is a timeout, not an invalid request', async () => {
        await script('up-diag-hang-1', { hang: true });
        const s = await postStream(`${env.api}/chat/completions`, chat('diag-hang', { stream: true }));
        const r = { status: s.status, json: JSON.parse(s.text), headers: s.headers };
        const line = await env.gw.requestLog(s.headers.get('x-request-id'));
        assertError(r, 408, 'FIRST_TOKEN_TIMEOUT');
        assert.equal(r.json.error.type, 'timeout_error');
        assert.equal(line.fail_reason, 'first_byte_timeout');
    });
});

// An upstream 4xx is the client's error, passed on as the upstream wrote it (issue 18.5).
describe('upstream 4xx errors keep their code, param and message', () => {
    test('OpenAI wire: 400 context_length_exceeded reaches the SDK as it was sent', async () => {
        const upstream = {
            message: "This model's maximum context length is 8192 tokens.",
            type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded',
        };
        await script('up-rejects-1', { status: 400, body: { error: upstream } });
        await assert.rejects(client.chat.completions.create(chat('rejects')), (e) => {
            assert.ok(e instanceof OpenAI.BadRequestError, `got ${e?.constructor?.name}`);
            assert.equal(e.code, 'context_length_exceeded');
            assert.equal(e.param, 'messages');
            assert.equal(e.type, 'invalid_request_error');
            assert.equal(e.error.message, upstream.message);
            assert.equal(e.error.request_id, e.headers.get('x-request-id'));
            return true;
        });
        assert.equal((await seen('up-rejects-1')).length, 1, 'a client error is not retried elsewhere');
    });

    test("Ollama's {\"error\": text} keeps its status and text", async () => {
        await script('up-ollama-rejects-1', { status: 404, body: { error: 'model "up-ollama-rejects-1" not found, try pulling it first' } });
        const r = await postJson(`${env.api}/chat/completions`, chat('ollama-rejects'));
        assertError(r, 404, 'INVALID_REQUEST');
        assert.match(r.json.error.message, /not found, try pulling it first/);
        assert.equal(r.json.error.param, null);
    });
});
