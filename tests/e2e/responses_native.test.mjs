// The Responses API passed through to providers that speak it natively (issue 20): a route
// whose adapter is `openai_responses` (M.entry_wire = "responses") gets the client's own
// /v1/responses body at <base_url>/responses, and its answer, JSON or SSE, goes back as the
// upstream wrote it with only the model name put back to the client's. Driven by the
// official `openai` SDK against the mock engine's /v1/responses (generated answers and the
// recorded-shape fixtures under tests/fixtures/openai/): unknown fields and
// previous_response_id reach the upstream, events arrive unchanged, usage (cached and
// reasoning included) is metered (admin usage events API), a 429 or an early
// response.failed fails over to the next route, mixed native/chat routes, an error event
// mid-stream ends the stream.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { adminCall, journalDrained, startEnv } from './lib/harness.mjs';
import { contentFor } from '../mock/engine.mjs';

const ADMIN_TOKEN = 'adm-responses-native-7c2e';
const FIXTURES = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../fixtures/openai');

let env;
let client;

before(async () => {
    env = await startEnv({
        configure: (c, e) => {
            const m = `http://127.0.0.1:${e.mock.port}/v1`;
            const native = (id) => ({ id, adapter: 'openai_responses', base_url: m });
            c.providers.push(native('native-a'), native('native-429'), native('native-fail'),
                native('native-backup'), native('native-mixed'));
            Object.assign(c.models, {
                native: { routes: [{ provider: 'native-a', model: 'up-native' }] },
                'native-fx': { routes: [{ provider: 'native-a', model: 'up-native-fx' }] },
                'native-429': { routes: [
                    { provider: 'native-429', model: 'up-native-429' },
                    { provider: 'native-backup', model: 'up-native-backup', priority: 1 },
                ] },
                'native-early': { routes: [
                    { provider: 'native-fail', model: 'up-native-early' },
                    { provider: 'native-backup', model: 'up-native-backup2', priority: 1 },
                ] },
                'native-then-chat': { routes: [
                    { provider: 'native-mixed', model: 'up-mixed-native' },
                    { provider: 'mock-openai', model: 'up-mixed-chat', priority: 1 },
                ] },
            });
            c.health = { probes: false };
            return c;
        },
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
    client = new OpenAI({ baseURL: env.api, apiKey: 'sk-client-anything', maxRetries: 0, timeout: 15000 });
});

after(async () => {
    await env?.close();
});

async function lastSeq() {
    const all = await env.mock.requests();
    return all.length ? all.at(-1).seq : 0;
}

function script(upstream, action, times = 1) {
    return env.mock.script({ model: upstream, times, action });
}

async function upstreamSince(since) {
    return env.mock.requests((r) => r.seq > since);
}

/** The usage event of one request, through the admin API. */
async function usageEvent(requestId) {
    await journalDrained(env.gw);
    const r = await adminCall(env.base, ADMIN_TOKEN, 'GET', `usage/events?request_id=${encodeURIComponent(requestId)}`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.data.length, 1, `one usage event for ${requestId}`);
    return r.json.data[0];
}

/** The SSE events of a fixture as JSON objects. */
function fixtureEvents(name) {
    return fs.readFileSync(path.join(FIXTURES, name), 'utf8').split('\n\n').filter((f) => f.trim())
        .map((f) => JSON.parse(f.split('\n').find((l) => l.startsWith('data: ')).slice(6)));
}

/** The fixture's events as the client must see them: only response.model renamed. */
function renamed(evs, model) {
    return evs.map((e) => (e.response?.model ? { ...e, response: { ...e.response, model } } : e));
}

async function collect(stream) {
    const all = [];
    for await (const ev of stream) all.push(ev);
    return all;
}

describe('responses passed through to a native provider', () => {
    test('create: the client\'s body reaches <base_url>/responses untouched but the model; the answer is the upstream\'s', async () => {
        const since = await lastSeq();
        const body = {
            model: 'native',
            input: [{ role: 'user', content: [{ type: 'input_text', text: 'hello native world' }] }],
            instructions: 'be brief',
            store: false,
            reasoning: { effort: 'low', summary: 'auto' },
            tools: [{ type: 'web_search' }, { type: 'function', name: 'f', parameters: { type: 'object', properties: {} }, strict: true }],
            previous_response_id: 'resp_upstream_owned_0001',
            include: ['reasoning.encrypted_content'],
            a_future_parameter: { nested: [1, 'two', null] },
            metadata: { trace: 't-1' },
            max_output_tokens: 64,
            priority: 'P1', // the gateway's own extension: never sent upstream
        };
        const { data: r, response } = await client.responses.create(body).withResponse();
        const [up, ...more] = await upstreamSince(since);
        assert.equal(more.length, 0, 'one upstream request');
        assert.equal(up.path, '/v1/responses');
        const { priority, ...sent } = body;
        assert.deepEqual(up.body, { ...sent, model: 'up-native' }, 'byte-for-byte equivalent but the model');
        assert.equal(r.id, `resp_mock_${up.seq}`, 'the upstream\'s id: it owns the chain');
        assert.equal(r.model, 'native', 'the client\'s model name');
        assert.equal(r.previous_response_id, 'resp_upstream_owned_0001', 'an id the gateway never made: forwarded, not 404');
        assert.equal(r.store, false);
        assert.equal(r.output_text, contentFor('up-native'));
        assert.equal(r.request_id, undefined, 'nothing of the gateway\'s in the body');
        const e = await usageEvent(response.headers.get('x-request-id'));
        assert.equal(e.endpoint, 'responses', 'the surface the client called');
        assert.equal(e.status, 'succeeded');
        assert.equal(e.input_tokens, r.usage.input_tokens);
        assert.equal(e.output_tokens, r.usage.output_tokens);
        assert.equal(e.input_estimated, false, 'the upstream\'s counts');
        // the gateway keeps nothing of a native answer: GET is the upstream's business
        const got = await fetch(`${env.api}/responses/${r.id}`, { headers: { authorization: 'Bearer sk-client-anything' } });
        assert.equal(got.status, 404);
        // a 64-bit integer (which JSON.parse would round) goes upstream exactly as written
        const s2 = await lastSeq();
        const raw = await fetch(`${env.api}/responses`, { method: 'POST', headers: { 'content-type': 'application/json' },
            body: '{"model":"native","input":"seeded","x_seed":12345678901234567}' });
        assert.equal(raw.status, 200, await raw.text());
        const [up2] = await upstreamSince(s2);
        assert.match(up2.raw, /"x_seed":12345678901234567\b/);
    });

    test('create: a recorded Response is forwarded as it is, cached and reasoning tokens metered', async () => {
        await script('up-native-fx', { fixture: 'openai/responses.json' });
        const { data: r, response } = await client.responses.create({ model: 'native-fx', input: 'hi' }).withResponse();
        const want = JSON.parse(fs.readFileSync(path.join(FIXTURES, 'responses.json'), 'utf8'));
        assert.deepEqual(r, { ...want, model: 'native-fx', output_text: 'The moongate is open.' });
        const e = await usageEvent(response.headers.get('x-request-id'));
        assert.equal(e.input_tokens, 2048 - 1920, 'uncached input');
        assert.equal(e.cached_read_tokens, 1920);
        assert.equal(e.output_tokens, 300);
        assert.equal(e.reasoning_tokens, 256);
    });

    test('stream: the recorded events arrive unchanged but response.model; usage metered', async () => {
        await script('up-native-fx', { fixture: 'openai/responses_stream.sse' });
        const { data: stream, response } = await client.responses
            .create({ model: 'native-fx', input: 'hi', stream: true, some_new_flag: true }).withResponse();
        const got = await collect(stream);
        assert.deepEqual(got, renamed(fixtureEvents('responses_stream.sse'), 'native-fx'));
        const e = await usageEvent(response.headers.get('x-request-id'));
        assert.equal(e.stream, true);
        assert.equal(e.status, 'succeeded');
        assert.equal(e.input_tokens, 128);
        assert.equal(e.cached_read_tokens, 1920);
        assert.equal(e.output_tokens, 300);
        assert.equal(e.reasoning_tokens, 256);
    });

    test('stream: a recorded error event mid-stream arrives as the upstream sent it and ends the stream', async () => {
        await script('up-native-fx', { fixture: 'openai/responses_stream_error.sse' });
        const { data: stream, response } = await client.responses
            .create({ model: 'native-fx', input: 'hi', stream: true }).withResponse();
        const got = await collect(stream);
        assert.deepEqual(got, renamed(fixtureEvents('responses_stream_error.sse'), 'native-fx'), 'no second error of the gateway\'s');
        const e = await usageEvent(response.headers.get('x-request-id'));
        assert.equal(e.status, 'failed');
    });

    test('responses.stream: the official event order, the client\'s model, finalResponse', async () => {
        const stream = client.responses.stream({ model: 'native', input: 'stream natively please' });
        const evs = await collect(stream);
        const final = await stream.finalResponse();
        assert.deepEqual(evs.map((e) => e.type), [
            'response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added',
            ...Array(5).fill('response.output_text.delta'), 'response.output_text.done', 'response.content_part.done',
            'response.output_item.done', 'response.completed',
        ]);
        evs.forEach((e, i) => assert.equal(e.sequence_number, i));
        for (const e of evs.filter((x) => x.response)) assert.equal(e.response.model, 'native');
        assert.equal(final.output_text, contentFor('up-native'));
        assert.match(final.id, /^resp_mock_/);
    });

    test('an upstream 429 before the stream fails over to the next route', async () => {
        const since = await lastSeq();
        await script('up-native-429', { status: 429, headers: { 'retry-after': '1' } });
        const stream = client.responses.stream({ model: 'native-429', input: 'fail over' });
        const evs = await collect(stream);
        const final = await stream.finalResponse();
        assert.equal(final.output_text, contentFor('up-native-backup'));
        assert.equal(final.model, 'native-429');
        assert.equal(evs[0].type, 'response.created');
        const ups = await upstreamSince(since);
        assert.deepEqual(ups.map((u) => [u.body.model, u.path]),
            [['up-native-429', '/v1/responses'], ['up-native-backup', '/v1/responses']]);
    });

    test('response.failed right after response.created fails over: the client sees one clean stream', async () => {
        const since = await lastSeq();
        await script('up-native-early', { fail_early: true });
        const evs = await collect(await client.responses.create({ model: 'native-early', input: 'early', stream: true }));
        assert.equal(evs.filter((e) => e.type === 'response.created').length, 1, 'the failed attempt\'s opening was held back');
        assert.equal(evs.at(-1).type, 'response.completed');
        assert.equal(evs.at(-1).response.output[0].content[0].text, contentFor('up-native-backup2'));
        const ups = await upstreamSince(since);
        assert.deepEqual(ups.map((u) => u.body.model), ['up-native-early', 'up-native-backup2']);
    });

    test('an error event mid-stream is forwarded and ends the stream; the event says failed', async () => {
        await script('up-native', { error_after_chunks: 2 });
        const { data: stream, response } = await client.responses
            .create({ model: 'native', input: 'break please', stream: true }).withResponse();
        const evs = await collect(stream);
        assert.deepEqual(evs.map((e) => e.type), ['response.created', 'response.in_progress', 'response.output_item.added',
            'response.content_part.added', 'response.output_text.delta', 'response.output_text.delta', 'error']);
        assert.equal(evs.at(-1).code, 'server_error');
        assert.equal(evs.at(-1).message, 'mock: the stream failed');
        const e = await usageEvent(response.headers.get('x-request-id'));
        assert.equal(e.status, 'failed');
        assert.equal(e.error_code, 'UPSTREAM_ERROR');
    });

    test('mixed routes: the native route fails, the chat route gets the bridged body', async () => {
        const since = await lastSeq();
        await script('up-mixed-native', { status: 503 });
        const r = await client.responses.create({ model: 'native-then-chat', input: 'mixed routes', instructions: 'sys' });
        assert.equal(r.output_text, contentFor('up-mixed-chat'));
        assert.equal(r.model, 'native-then-chat');
        const ups = await upstreamSince(since);
        assert.deepEqual(ups.map((u) => u.path), ['/v1/responses', '/v1/chat/completions']);
        assert.deepEqual(ups[1].body.messages, [{ role: 'system', content: 'sys' }, { role: 'user', content: 'mixed routes' }]);
        // the gateway keeps the bridged answer: a follow-up continues it on the chat route only
        const since2 = await lastSeq();
        const r2 = await client.responses.create({ model: 'native-then-chat', input: 'and then', previous_response_id: r.id });
        assert.equal(r2.previous_response_id, r.id);
        const ups2 = await upstreamSince(since2);
        assert.deepEqual(ups2.map((u) => u.path), ['/v1/chat/completions'], 'a gateway id is not sent to a native upstream');
        assert.equal(ups2[0].body.messages.length, 3, 'history replayed');
    });

    test('mixed routes: an id the gateway does not hold is the native route\'s; the bridge never runs without its history', async () => {
        const since = await lastSeq();
        await script('up-mixed-native', { status: 503 });
        const err = await client.responses.create({ model: 'native-then-chat', input: 'x', previous_response_id: 'resp_unknown_here' })
            .catch((e) => e);
        assert.ok(err instanceof OpenAI.APIError, String(err));
        const ups = await upstreamSince(since);
        assert.deepEqual(ups.map((u) => u.path), ['/v1/responses'], 'the chat route was not asked');
        // a chat-only model still answers 404 for an unknown id, as before
        const e404 = await client.responses.create({ model: 'chat', input: 'x', previous_response_id: 'resp_unknown_here' })
            .catch((e) => e);
        assert.equal(e404.status, 404);
    });

    test('a request the bridge cannot translate is refused on a chat-only model and served natively', async () => {
        const tools = [{ type: 'web_search' }];
        const refused = await client.responses.create({ model: 'chat', input: 'x', tools }).catch((e) => e);
        assert.equal(refused.status, 400);
        const r = await client.responses.create({ model: 'native', input: 'search natively', tools });
        assert.deepEqual(r.tools, tools, 'the upstream got the built-in tool');
    });
});
