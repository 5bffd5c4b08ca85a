// Upstream streams that go wrong in their framing or their events (issue 16, items 1 and 8):
// an ollama stream whose one line is an error (the callback that frees the call while the
// parser still held that line), failover after an attempt that stopped its stream early or
// left an event half read, and malformed events in pass-through streams: they end the stream
// with the gateway's error event and count as the upstream's failure, never reach the client.
// Each scenario has its own providers, so that one scenario's breakers cannot touch another.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startEnv, postJson, postStream } from './lib/harness.mjs';
import { assertConforms } from './lib/conformance.mjs';
import { contentFor, contentPieces } from '../mock/engine.mjs';

// scenario -> the adapters of its routes, in failover order (provider p-<name>-<i>, upstream
// model up-<name>-<i>)
const SCENARIOS = {
    details: ['openai'],
    'nd-crash': ['ollama'],
    'nd-crash-split': ['ollama'],
    'nd-alive': ['ollama'],
    'garbage-then-ok': ['openai', 'openai'],
    'nd-error-then-sse': ['ollama', 'openai'],
    'half-then-ok': ['openai', 'openai'],
    'bad-mid': ['openai'],
    'bad-mid-raw': ['openai'],
    'bad-finish': ['openai'],
    'bad-first': ['openai', 'openai'],
    'odd-valid': ['openai'],
};

let env;
let client;

before(async () => {
    env = await startEnv({
        configure(config, e) {
            const mock = `http://127.0.0.1:${e.mock.port}`;
            for (const [name, adapters] of Object.entries(SCENARIOS)) {
                const routes = adapters.map((adapter, i) => {
                    config.providers.push({
                        id: `p-${name}-${i + 1}`,
                        adapter,
                        base_url: adapter === 'ollama' ? mock : `${mock}/v1`,
                    });
                    // priority groups make the order fixed (equal routes would be weighted-random)
                    return { provider: `p-${name}-${i + 1}`, model: `up-${name}-${i + 1}`, priority: i };
                });
                config.models[name] = { routes };
            }
            return config;
        },
    });
    client = new OpenAI({ baseURL: env.api, apiKey: 'any', maxRetries: 0, timeout: 15000 });
});

after(async () => {
    await env?.close();
});

const messages = [{ role: 'user', content: 'stream trouble' }];
const chat = (model, extra = {}) => ({ model, messages, ...extra });
const script = (model, action) => env.mock.script({ model, action });

/** The value of one sample of the Prometheus text (name with labels, exactly), or 0. */
async function metric(sample) {
    const text = await env.gw.metrics();
    for (const line of text.split('\n')) {
        const i = line.lastIndexOf(' ');
        if (!line.startsWith('#') && i > 0 && line.slice(0, i) === sample) return Number(line.slice(i + 1));
    }
    return 0;
}

async function assertAlive() {
    assert.equal(env.gw.exited, false, `the gateway died: ${env.gw.stderr.slice(-2000)}`);
    const h = await env.gw.getJson('/health');
    assert.equal(h.status, 200);
}

function text(chunks) {
    return chunks.map((c) => c.choices?.[0]?.delta?.content ?? '').join('');
}

/** A stream that ended with the gateway's error event: frames before it, then error, [DONE]. */
function assertErrorEnd(s, code = 'UPSTREAM_ERROR') {
    assert.equal(s.status, 200);
    assert.equal(s.error, null, `the response ended properly (got ${s.error})`);
    assert.equal(s.data.at(-1), '[DONE]', `frames: ${s.data.join(' | ').slice(0, 600)}`);
    const errs = s.events.filter((e) => e?.error);
    assert.equal(errs.length, 1, 'one error event');
    assert.equal(s.events.at(-2), errs[0], 'the error event right before [DONE]');
    assert.equal(errs[0].error.code, code);
    assert.equal(errs[0].error.type, 'api_error');
    assert.ok(!s.events.some((e) => e?.__unparsed), `every frame the client got is JSON: ${s.text.slice(0, 800)}`);
    return errs[0].error;
}

describe('the stream parser outlives no callback (issue 16.1)', () => {
    test('ollama stream, 200 x-ndjson, one error line without its newline -> a clean 502; the gateway lives', async () => {
        await script('up-nd-crash-1', {
            status: 200, headers: { 'Content-Type': 'application/x-ndjson' },
            body: '{"error":"model runner crashed"}',
        });
        const r = await postJson(`${env.api}/chat/completions`, chat('nd-crash', { stream: true }));
        assert.equal(r.status, 502, r.text);
        assertConforms('ErrorResponse', r.json, '502 error');
        assert.equal(r.json.error.code, 'MODEL_UNAVAILABLE');
        await assertAlive();
        const log = await env.gw.requestLog(r.headers.get('x-request-id'));
        assert.equal(log.outcome, 'error');
        assert.equal(log.provider, 'p-nd-crash-1');
    });

    test('the error line held across two reads -> a clean 502; the gateway lives', async () => {
        await script('up-nd-crash-split-1', {
            status: 200, headers: { 'Content-Type': 'application/x-ndjson' },
            body: ['{"error":"model ', 'runner crashed"}\n'], chunk_delay_ms: 50,
        });
        const r = await postJson(`${env.api}/chat/completions`, chat('nd-crash-split', { stream: true }));
        assert.equal(r.status, 502, r.text);
        assert.equal(r.json.error.code, 'MODEL_UNAVAILABLE');
        await assertAlive();
    });

    test('ollama streams still work afterwards', async () => {
        const s = await postStream(`${env.api}/chat/completions`, chat('nd-alive', { stream: true }));
        assert.equal(s.status, 200);
        assert.equal(s.data.at(-1), '[DONE]');
        assert.equal(text(s.events.slice(0, -1)), contentFor('up-nd-alive-1'));
    });
});

describe('each attempt frames its own stream', () => {
    test('a garbage first event fails over, and the next provider\'s stream is forwarded', async () => {
        await script('up-garbage-then-ok-1', { garbage: true });
        const s = await postStream(`${env.api}/chat/completions`, chat('garbage-then-ok', { stream: true }));
        assert.equal(s.status, 200, s.text);
        assert.equal(s.data.at(-1), '[DONE]');
        assert.equal(s.events[0].actual_model, 'up-garbage-then-ok-2');
        assert.equal(text(s.events.slice(0, -1)), contentFor('up-garbage-then-ok-2'));
    });

    test('an ollama error line fails over to an openai provider: its SSE is not read as NDJSON', async () => {
        await script('up-nd-error-then-sse-1', {
            status: 200, headers: { 'Content-Type': 'application/x-ndjson' },
            body: '{"error":"model runner crashed"}\n',
        });
        const stream = await client.chat.completions.create(chat('nd-error-then-sse', { stream: true }));
        const got = [];
        for await (const c of stream) got.push(c);
        assert.equal(got[0].actual_model, 'up-nd-error-then-sse-2');
        assert.equal(text(got), contentFor('up-nd-error-then-sse-2'));
    });

    test('an attempt that ended inside an event leaves nothing for the next one', async () => {
        await script('up-half-then-ok-1', {
            status: 200, headers: { 'Content-Type': 'text/event-stream' },
            body: 'data: {"id":"half","choices":[',
        });
        const s = await postStream(`${env.api}/chat/completions`, chat('half-then-ok', { stream: true }));
        assert.equal(s.status, 200, s.text);
        assert.equal(s.data.at(-1), '[DONE]');
        assert.equal(s.events[0].actual_model, 'up-half-then-ok-2');
        assert.equal(text(s.events.slice(0, -1)), contentFor('up-half-then-ok-2'));
        assert.ok(!s.text.includes('"id":"half"'), 'no byte of the first attempt reached the client');
    });
});

// The event, between valid chunks of an OpenAI-wire stream.
const BAD = 'data: {"id":"x","choices":[...]],,NOT JSON}\n\n';

describe('malformed events in pass-through streams (issue 16.8)', () => {
    test('the openai SDK gets the chunks before it and then a clean APIError; counted as the upstream\'s failure', async () => {
        const failures = await metric('moongate_provider_failures_total{provider_id="p-bad-mid-1"}');
        const streamErrors = await metric('moongate_stream_errors_total');
        // lead (role) chunk + 2 content chunks, then the broken event, then the rest of the stream
        await script('up-bad-mid-1', { inject_frame: BAD, inject_after_frames: 3, chunk_delay_ms: 30 });
        const stream = await client.chat.completions.create(chat('bad-mid', { stream: true }));
        const got = [];
        let err = null;
        try {
            for await (const c of stream) got.push(c);
        } catch (e) {
            err = e;
        }
        assert.ok(err, `the iteration must not end as a success (got ${got.length} chunks)`);
        assert.ok(err instanceof OpenAI.APIError, `an APIError, not a parse crash: ${err?.constructor?.name}: ${err?.message}`);
        assert.match(err.message, /invalid stream event/);
        assert.equal(text(got), contentPieces('up-bad-mid-1').slice(0, 2).join(''), 'the two chunks before it');
        assert.ok(!got.some((c) => c.choices?.[0]?.finish_reason), 'no finish_reason: not a truncated success');
        const rid = got[0].request_id;
        const log = await env.gw.requestLog(rid);
        assert.equal(log.outcome, 'error');
        assert.equal(log.error, 'UPSTREAM_ERROR');
        assert.equal(log.provider, 'p-bad-mid-1');
        const warn = await env.gw.waitLog((l) => l.request_id === rid && /not JSON/.test(l.msg ?? ''),
            { what: 'the warning that names the provider' });
        assert.match(warn.msg, /p-bad-mid-1/);
        assert.equal(await metric('moongate_provider_failures_total{provider_id="p-bad-mid-1"}'), failures + 1);
        assert.equal(await metric('moongate_stream_errors_total'), streamErrors + 1);
    });

    test('on the wire: the broken bytes never reach the client; error event, then [DONE]', async () => {
        await script('up-bad-mid-raw-1', { inject_frame: BAD, inject_after_frames: 2, chunk_delay_ms: 30 });
        const s = await postStream(`${env.api}/chat/completions`, chat('bad-mid-raw', { stream: true }));
        assert.ok(!s.text.includes('NOT JSON'), s.text.slice(0, 800));
        const e = assertErrorEnd(s);
        assert.equal(e.request_id, s.headers.get('x-request-id'));
        const chunks = s.events.filter((c) => c?.choices);
        assert.equal(text(chunks), contentPieces('up-bad-mid-raw-1')[0]);
        for (const c of chunks) assertConforms('CreateChatCompletionStreamResponse', c);
    });

    test('a broken chunk with the keys the gateway acts on (finish_reason, usage) is caught too', async () => {
        const broken = 'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
            + '"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3},}\n\n';
        await script('up-bad-finish-1', { inject_frame: broken, inject_after_frames: 3, chunk_delay_ms: 30 });
        const s = await postStream(`${env.api}/chat/completions`,
            chat('bad-finish', { stream: true, stream_options: { include_usage: true } }));
        assert.ok(!s.text.includes('"total_tokens":3}'), s.text.slice(0, 800));
        assertErrorEnd(s);
    });

    test('a broken first event, before any byte reached the client, is garbage: failover', async () => {
        await script('up-bad-first-1', { inject_frame: BAD, inject_after_frames: 0 });
        const s = await postStream(`${env.api}/chat/completions`, chat('bad-first', { stream: true }));
        assert.equal(s.status, 200, s.text);
        assert.equal(s.data.at(-1), '[DONE]');
        assert.equal(s.events[0].actual_model, 'up-bad-first-2');
        assert.equal(text(s.events.slice(0, -1)), contentFor('up-bad-first-2'));
        const log = await env.gw.requestLog(s.headers.get('x-request-id'));
        assert.equal(log.outcome, 'ok');
        assert.equal(log.provider, 'p-bad-first-2');
    });

    test('valid events in unusual spellings pass unchanged (escapes, non-ASCII, exponents, spacing)', async () => {
        const base = { id: 'c-odd', object: 'chat.completion.chunk', created: 1, model: 'up-odd-valid-1' };
        const content = 'caf\u00e9 \u{1F600} "q" \\ \t \u2028 end';
        const ev = (o, spaced) => {
            let j = JSON.stringify(o);
            if (spaced) j = j.replace(/":/g, '" : ').replace(/,"/g, ' ,\t"');
            return `data: ${j}\n\n`;
        };
        const mid = ev({ ...base, choices: [{ index: 0, delta: { content }, logprobs: null, finish_reason: null }] }, true);
        const escaped = 'data: {"id":"c-odd","object":"chat.completion.chunk","created":1e0,"model":"up-odd-valid-1",'
            + '"choices":[{"index":0,"delta":{"content":"\\u00e9\\ud83d\\ude00\\/\\n"},"logprobs":null,"finish_reason":null}]}\n\n';
        const body = [
            ev({ ...base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] }),
            mid,
            escaped,
            ev({ ...base, choices: [{ index: 0, delta: {}, logprobs: null, finish_reason: 'stop' }] }),
            'data: [DONE]\n\n',
        ].join('');
        await script('up-odd-valid-1', { body, headers: { 'Content-Type': 'text/event-stream' } });
        const s = await postStream(`${env.api}/chat/completions`, chat('odd-valid', { stream: true }));
        assert.equal(s.status, 200);
        assert.equal(s.data.at(-1), '[DONE]', s.text.slice(0, 800));
        assert.ok(!s.events.some((e) => e?.error), s.text.slice(0, 800));
        // byte for byte but for "model", the name the client sent
        const asClientNamed = (e) => e.replace('"up-odd-valid-1"', '"odd-valid"');
        assert.ok(s.text.includes(asClientNamed(mid)), 'the spaced chunk is forwarded byte for byte');
        assert.ok(s.text.includes(asClientNamed(escaped)), 'the escaped chunk is forwarded byte for byte');
        assert.equal(text(s.events.slice(0, -1)), `${content}\u00e9\u{1F600}/\n`);
    });
});

// Stream details the SDKs depend on (issue 18.9): choices' finish chunks in the upstream's
// order, and a complete answer that ends without [DONE] ends cleanly.
describe('stream details', () => {
    const frame = (o) => `data: ${JSON.stringify(o)}\n\n`;
    const chunk = (index, delta, finish = null, model = 'up-details-1') => ({
        id: 'chatcmpl-d', object: 'chat.completion.chunk', created: 1, model,
        choices: [{ index, delta, logprobs: null, finish_reason: finish }],
    });
    const usage = { id: 'chatcmpl-d', object: 'chat.completion.chunk', created: 1, model: 'up-details-1',
        choices: [], usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 } };
    const sse = { 'Content-Type': 'text/event-stream' };

    test('n: 2 keeps the upstream order of the choices and their finish chunks', async () => {
        await env.mock.script({ model: 'up-details-1', times: 1, action: { status: 200, headers: sse, chunk_delay_ms: 5, body: [
            frame(chunk(0, { role: 'assistant', content: '' })), frame(chunk(1, { role: 'assistant', content: '' })),
            frame(chunk(0, { content: 'a' })), frame(chunk(0, {}, 'stop')),
            frame(chunk(1, { content: 'b' })), frame(chunk(1, {}, 'stop')), frame(usage), 'data: [DONE]\n\n'] } });
        const s = await postStream(`${env.api}/chat/completions`,
            { model: 'details', messages: [{ role: 'user', content: 'two' }], stream: true, n: 2 });
        assert.equal(s.status, 200);
        const order = s.events.filter((e) => e?.choices?.length)
            .map((e) => `${e.choices[0].index}:${e.choices[0].finish_reason ?? e.choices[0].delta?.content ?? ''}`);
        assert.deepEqual(order, ['0:', '1:', '0:a', '0:stop', '1:b', '1:stop']);
        assert.ok(!s.events.some((e) => e?.error), 'no error event');
    });

    test('a finish for every choice and then EOF without [DONE] ends cleanly', async () => {
        await env.mock.script({ model: 'up-details-1', times: 1, action: { status: 200, headers: sse, chunk_delay_ms: 5, body: [
            frame(chunk(0, { role: 'assistant', content: 'done' })), frame(chunk(0, {}, 'stop')), frame(usage)] } });
        const s = await postStream(`${env.api}/chat/completions`,
            { model: 'details', messages: [{ role: 'user', content: 'eof' }], stream: true });
        assert.equal(s.status, 200);
        assert.equal(s.data.at(-1), '[DONE]');
        assert.ok(!s.events.some((e) => e?.error), `no error event: ${s.text.slice(-300)}`);
        const line = await env.gw.requestLog(s.headers.get('x-request-id'));
        assert.equal(line.outcome, 'ok');
    });

    test('without any finish_reason, EOF is still a truncated stream', async () => {
        await env.mock.script({ model: 'up-details-1', times: 1, action: { status: 200, headers: sse, chunk_delay_ms: 5, body: [
            frame(chunk(0, { role: 'assistant', content: 'cut' })), frame(chunk(0, { content: ' short' }))] } });
        const s = await postStream(`${env.api}/chat/completions`,
            { model: 'details', messages: [{ role: 'user', content: 'cut' }], stream: true });
        assert.ok(s.events.some((e) => e?.error), 'an error event ends it');
    });
});
