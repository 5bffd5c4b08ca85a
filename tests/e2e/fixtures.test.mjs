// Recorded upstream answers (tests/fixtures, see its README) replayed by the mock engine byte
// for byte (action `fixture`) and sent through the gateway (issue 20): OpenAI-wire answers to
// the OpenAI entry (pass-through) and to the Anthropic entry (translation), an Anthropic stream
// to the OpenAI entry, vLLM's /metrics read as engine load, Triton's TensorRT-LLM generate and
// generate_stream through the triton adapter. Two client streams are compared exactly with
// golden transcripts (tests/fixtures/golden, ids and timestamps normalised; the Lua-built
// chunks' members sorted); UPDATE_GOLDEN=1
// rewrites them (review the diff before committing one).

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { postJson, postStream, startEnv, waitFor } from './lib/harness.mjs';

const FIXTURES = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../fixtures');
const ADMIN_TOKEN = 'adm-fixtures-e2e-41c9';
const AV = { headers: { 'anthropic-version': '2023-06-01' } };
const TOOLS = [
    { name: 'get_weather', description: 'weather', input_schema: { type: 'object', properties: { location: { type: 'string' } } } },
    { name: 'get_time', description: 'time', input_schema: { type: 'object', properties: { tzname: { type: 'string' } } } },
];
let env;
let openai;
let anthropic;

before(async () => {
    env = await startEnv({
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
        configure(c, e) {
            const m = `http://127.0.0.1:${e.mock.port}`;
            c.health = { probes: true, probe_interval_ms: 300, probe_timeout_ms: 2000, load_interval_ms: 300 };
            c.providers.push(
                { id: 'mock-anthropic', adapter: 'anthropic', base_url: m, api_key: 'sk-ant-upstream' },
                { id: 'vllm-fx', adapter: 'openai', base_url: `${m}/v1`, engine: 'vllm', local: true },
                { id: 'triton-fx', adapter: 'triton', base_url: m, local: true },
            );
            c.models['fx-openai'] = { routes: [{ provider: 'mock-openai', model: 'up-fx' }] };
            // one route per failing replay: a route's breaker opens after consecutive failures
            for (const k of ['a', 'b', 'c']) c.models[`fx-err-${k}`] = { routes: [{ provider: 'mock-openai', model: `up-err-${k}` }] };
            c.models['fx-claude'] = { routes: [{ provider: 'mock-anthropic', model: 'claude-up' }] };
            c.models['fx-vllm'] = { routes: [{ provider: 'vllm-fx', model: 'up-vllm' }] };
            c.models['fx-triton'] = { routes: [{ provider: 'triton-fx', model: 'ensemble' }] };
            return c;
        },
    });
    openai = new OpenAI({ baseURL: env.api, apiKey: 'sk-x', maxRetries: 0, timeout: 15000 });
    anthropic = new Anthropic({ baseURL: env.base, apiKey: 'sk-x', maxRetries: 0, timeout: 15000 });
});

after(async () => {
    await env?.close();
});

const fixture = (name) => fs.readFileSync(path.join(FIXTURES, name), 'utf8');
const fixtureJson = (name) => JSON.parse(fixture(name));
/** The data payloads of a fixture stream, parsed (the [DONE] marker as the string). */
const fixtureEvents = (name) => fixture(name).split('\n\n').filter((f) => f.startsWith('data: '))
    .map((f) => f.slice(6)).map((d) => (d === '[DONE]' ? d : JSON.parse(d)));
const user = (content) => [{ role: 'user', content }];
const replay = (model, name, extra = {}) => env.mock.script({ model, times: 1, action: { fixture: name, ...extra } });

/** Ids, timestamps and timings of the gateway's own making, made constant. */
function normalise(text) {
    return text
        .replace(/req-[0-9a-f]{8,}/g, 'req-ID')
        .replace(/"created":\d+/g, '"created":0')
        .replace(/"timing":\{[^}]*\}/g, '"timing":{}');
}

/** Every data payload's JSON with its members sorted (the Lua adapters build objects from
 * tables, whose member order is not fixed; JSON gives it no meaning). */
function sortedMembers(text) {
    const sort = (v) => (Array.isArray(v) ? v.map(sort) : v && typeof v === 'object'
        ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sort(v[k])])) : v);
    return text.replace(/^data: (\{.*\})$/gm, (_, d) => `data: ${JSON.stringify(sort(JSON.parse(d)))}`);
}

function golden(name, actual, { anyMemberOrder = false } = {}) {
    const file = path.join(FIXTURES, 'golden', name);
    const got = normalise(anyMemberOrder ? sortedMembers(actual) : actual);
    if (process.env.UPDATE_GOLDEN) fs.writeFileSync(file, got);
    assert.equal(got, fs.readFileSync(file, 'utf8'), `client transcript differs from tests/fixtures/golden/${name}`);
}

describe('OpenAI-wire fixtures through the OpenAI entry (pass-through)', () => {
    test('chat.json: the answer\'s choices and usage (with its details) unchanged', async () => {
        const rec = fixtureJson('openai/chat.json');
        await replay('up-fx', 'openai/chat.json');
        const r = await openai.chat.completions.create({ model: 'fx-openai', messages: user('why is the sky blue?') });
        assert.deepEqual(r.choices, rec.choices);
        assert.deepEqual(r.usage, rec.usage);
        assert.equal(r.system_fingerprint, rec.system_fingerprint);
    });

    test('chat_cached_usage.json: cached_tokens and reasoning_tokens reach the client as sent', async () => {
        await replay('up-fx', 'openai/chat_cached_usage.json');
        const r = await openai.chat.completions.create({ model: 'fx-openai', messages: user('capital of France?') });
        assert.equal(r.usage.prompt_tokens_details.cached_tokens, 1920);
        assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 256);
        assert.equal(r.usage.prompt_tokens, 2048);
        assert.equal(r.usage.completion_tokens, 300);
    });

    test('chat_stream.sse: every delta, the finish and the usage chunk; [DONE] last', async () => {
        const rec = fixtureEvents('openai/chat_stream.sse');
        await replay('up-fx', 'openai/chat_stream.sse');
        const r = await postStream(`${env.api}/chat/completions`, { model: 'fx-openai', stream: true,
            stream_options: { include_usage: true }, messages: user('hi') });
        assert.equal(r.status, 200);
        assert.equal(r.events.at(-1), '[DONE]');
        const chunks = r.events.filter((e) => e !== '[DONE]');
        assert.deepEqual(chunks.map((c) => c.choices), rec.filter((e) => e !== '[DONE]').map((c) => c.choices));
        assert.deepEqual(chunks.at(-1).usage, rec.at(-2).usage);
    });

    test('chat_stream_tools.sse: the interleaved argument pieces arrive in order; the SDK rebuilds both calls', async () => {
        const rec = fixtureEvents('openai/chat_stream_tools.sse').filter((e) => e !== '[DONE]');
        await replay('up-fx', 'openai/chat_stream_tools.sse');
        const stream = await openai.chat.completions.create({ model: 'fx-openai', stream: true, messages: user('weather and time'),
            tools: TOOLS.map((t) => ({ type: 'function', function: { name: t.name, parameters: t.input_schema } })) });
        const deltas = [];
        const calls = [];
        let finish = null;
        for await (const c of stream) {
            for (const tc of c.choices[0]?.delta?.tool_calls ?? []) {
                deltas.push(tc);
                calls[tc.index] ??= { id: tc.id, name: tc.function?.name, arguments: '' };
                calls[tc.index].arguments += tc.function?.arguments ?? '';
            }
            finish = c.choices[0]?.finish_reason ?? finish;
        }
        assert.deepEqual(deltas, rec.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []));
        assert.equal(finish, 'tool_calls');
        assert.deepEqual(calls.map((c) => [c.id, c.name, JSON.parse(c.arguments)]), [
            ['call_Wx3pQ0weather', 'get_weather', { location: 'Paris, FR', unit: 'celsius' }],
            ['call_Tz8kR1time', 'get_time', { tzname: 'Europe/Paris' }],
        ]);
    });

    test('chat_stream_error.sse: the text before it, then the error: the SDK\'s stream throws', async () => {
        await replay('up-err-a', 'openai/chat_stream_error.sse');
        let text = '';
        await assert.rejects((async () => {
            const stream = await openai.chat.completions.create({ model: 'fx-err-a', stream: true, messages: user('story') });
            for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
        })(), /server had an error/);
        assert.equal(text, 'Once upon a');
    });
});

describe('OpenAI-wire fixtures through the Anthropic entry (translation)', () => {
    test('chat.json: one text block, end_turn, usage in Anthropic\'s terms', async () => {
        await replay('up-fx', 'openai/chat.json');
        const m = await anthropic.messages.create({ model: 'fx-openai', max_tokens: 100, messages: user('why is the sky blue?') });
        assert.deepEqual(m.content, [{ type: 'text', text: fixtureJson('openai/chat.json').choices[0].message.content }]);
        assert.equal(m.stop_reason, 'end_turn');
        assert.equal(m.stop_sequence, null);
        assert.deepEqual(m.usage, { input_tokens: 14, output_tokens: 15, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 });
    });

    test('chat_cached_usage.json: cache reads kept apart from input_tokens; reasoning inside output_tokens', async () => {
        await replay('up-fx', 'openai/chat_cached_usage.json');
        const m = await anthropic.messages.create({ model: 'fx-openai', max_tokens: 400, messages: user('capital of France?') });
        // OpenAI's prompt_tokens include the cached ones; Anthropic's input_tokens do not
        assert.deepEqual(m.usage, { input_tokens: 2048 - 1920, output_tokens: 300, cache_creation_input_tokens: 0,
            cache_read_input_tokens: 1920 });
        assert.equal(m.content[0].text, 'Paris is the capital of France.');
    });

    test('chat_stream.sse: text deltas in one block; the SDK\'s finalMessage', async () => {
        await replay('up-fx', 'openai/chat_stream.sse');
        const m = await anthropic.messages.stream({ model: 'fx-openai', max_tokens: 100, messages: user('hi') }, AV).finalMessage();
        assert.deepEqual(m.content, [{ type: 'text', text: 'Hello! How can I help?' }]);
        assert.equal(m.stop_reason, 'end_turn');
        assert.equal(m.usage.output_tokens, 7);
    });

    test('chat_stream_tools.sse: two tool_use blocks, never overlapping, each whole (golden transcript)', async () => {
        await replay('up-fx', 'openai/chat_stream_tools.sse');
        const r = await postStream(`${env.base}/v1/messages`, { model: 'fx-openai', max_tokens: 200, stream: true, tools: TOOLS,
            messages: user('weather and time') }, AV);
        assert.equal(r.status, 200);
        golden('anthropic_over_openai_tools.sse', r.text);
        // blocks strictly one after another: no event for a block outside its start..stop
        let open = null;
        for (const e of r.events) {
            if (e.type === 'content_block_start') { assert.equal(open, null); open = e.index; }
            if (e.type === 'content_block_delta') assert.equal(e.index, open);
            if (e.type === 'content_block_stop') { assert.equal(e.index, open); open = null; }
        }
        await replay('up-fx', 'openai/chat_stream_tools.sse');
        const m = await anthropic.messages.stream({ model: 'fx-openai', max_tokens: 200, tools: TOOLS,
            messages: user('weather and time') }, AV).finalMessage();
        assert.deepEqual(m.content, [
            { type: 'tool_use', id: 'call_Wx3pQ0weather', name: 'get_weather', input: { location: 'Paris, FR', unit: 'celsius' } },
            { type: 'tool_use', id: 'call_Tz8kR1time', name: 'get_time', input: { tzname: 'Europe/Paris' } },
        ]);
        assert.equal(m.stop_reason, 'tool_use');
        assert.equal(m.usage.output_tokens, 48);
    });

    test('chat_stream_error.sse: an Anthropic error event ends the stream, no message_stop', async () => {
        await replay('up-err-b', 'openai/chat_stream_error.sse');
        const r = await postStream(`${env.base}/v1/messages`, { model: 'fx-err-b', max_tokens: 100, stream: true,
            messages: user('story') }, AV);
        const last = r.events.at(-1);
        assert.equal(last.type, 'error', r.text);
        assert.equal(last.error.type, 'api_error');
        assert.match(last.error.message, /server had an error/);
        assert.ok(!r.events.some((e) => e.type === 'message_stop' || e.type === 'message_delta'));
        const text = r.events.filter((e) => e.delta?.type === 'text_delta').map((e) => e.delta.text).join('');
        assert.equal(text, 'Once upon a');
        await replay('up-err-c', 'openai/chat_stream_error.sse');
        await assert.rejects(anthropic.messages.stream({ model: 'fx-err-c', max_tokens: 100, messages: user('story') }, AV)
            .finalMessage(), /server had an error/);
    });
});

describe('Anthropic fixtures through the OpenAI entry', () => {
    test('stream_tools_thinking.sse: reasoning, its signature, text and both calls as chunks (golden transcript)', async () => {
        await replay('claude-up', 'anthropic/stream_tools_thinking.sse');
        const r = await postStream(`${env.api}/chat/completions`, { model: 'fx-claude', stream: true,
            stream_options: { include_usage: true }, messages: user('weather in SF and Paris') });
        assert.equal(r.status, 200);
        golden('openai_over_anthropic_tools_thinking.sse', r.text, { anyMemberOrder: true });
        assert.equal(r.events.at(-1), '[DONE]');
    });

    test('message_tools_thinking.json: the SDK sees the text, both calls and Anthropic\'s cache counts folded in', async () => {
        await replay('claude-up', 'anthropic/message_tools_thinking.json');
        const r = await openai.chat.completions.create({ model: 'fx-claude', messages: user('weather in SF and Paris') });
        const msg = r.choices[0].message;
        assert.equal(msg.content, 'Let me check both.');
        assert.deepEqual(msg.tool_calls.map((t) => [t.id, t.function.name, JSON.parse(t.function.arguments)]), [
            ['toolu_01A09q90qw90lq917835lq9', 'get_weather', { location: 'San Francisco, CA', unit: 'celsius' }],
            ['toolu_01B18r81rx81mr826946mr8', 'get_weather', { location: 'Paris' }],
        ]);
        assert.equal(r.choices[0].finish_reason, 'tool_calls');
        // OpenAI's prompt_tokens include the cache reads and writes (100 + 20 + 300)
        assert.equal(r.usage.prompt_tokens, 420);
        assert.equal(r.usage.prompt_tokens_details.cached_tokens, 300);
    });
});

describe('vLLM /metrics fixture as engine load', () => {
    test('vllm/metrics.txt: running, waiting and the KV-cache fraction read off the recorded page', async () => {
        await env.mock.script({ path: '/metrics', method: 'GET', times: 100000, action: { fixture: 'vllm/metrics.txt' } });
        let load;
        await waitFor(async () => {
            const r = await fetch(`${env.base}/api/v2/providers/vllm-fx`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
                signal: AbortSignal.timeout(5000) });
            load = (await r.json()).load;
            return load?.running === 6;
        }, { timeoutMs: 15000, intervalMs: 100, what: 'the fixture\'s load read' });
        assert.equal(load.running, 6);
        assert.equal(load.waiting, 3);
        assert.equal(load.kv_cache, 0.4125);
    });
});

describe('Triton TensorRT-LLM fixtures through the triton adapter', () => {
    test('generate_trtllm.json: text_output is the answer; the extra outputs do not leak', async () => {
        await replay('ensemble', 'triton/generate_trtllm.json');
        const r = await openai.chat.completions.create({ model: 'fx-triton', messages: user('what is ML?') });
        assert.equal(r.choices[0].message.content, 'Machine learning is a branch of AI.');
        assert.equal(r.choices[0].finish_reason, 'stop');
        assert.equal(r.object, 'chat.completion');
        assert.ok(r.usage.completion_tokens > 0, 'counted by the gateway (TensorRT-LLM sends no counts)');
        assert.ok(!('output_log_probs' in r) && !('sequence_id' in r));
    });

    test('generate_stream_trtllm.sse: each piece a delta; the stream ends without a marker and is complete', async () => {
        await replay('ensemble', 'triton/generate_stream_trtllm.sse');
        const r = await postStream(`${env.api}/chat/completions`, { model: 'fx-triton', stream: true,
            stream_options: { include_usage: true }, messages: user('what is ML?') });
        assert.equal(r.status, 200);
        const chunks = r.events.filter((e) => e !== '[DONE]');
        const text = chunks.map((c) => c.choices?.[0]?.delta?.content ?? '').join('');
        assert.equal(text, fixtureEvents('triton/generate_stream_trtllm.sse').map((e) => e.text_output).join(''));
        assert.deepEqual(chunks.map((c) => c.choices?.[0]?.finish_reason).filter(Boolean), ['stop']);
        assert.ok(chunks.some((c) => c.usage?.completion_tokens > 0));
        assert.equal(r.events.at(-1), '[DONE]');
    });

    test('generate_stream_error.sse: the pieces before it, then the error through the Anthropic entry', async () => {
        await replay('ensemble', 'triton/generate_stream_error.sse');
        const r = await postStream(`${env.base}/v1/messages`, { model: 'fx-triton', max_tokens: 100, stream: true,
            messages: user('long') }, AV);
        assert.equal(r.events.at(-1).type, 'error', r.text);
        assert.match(r.events.at(-1).error.message, /Input length exceeds max_input_len/);
        const text = r.events.filter((e) => e.delta?.type === 'text_delta').map((e) => e.delta.text).join('');
        assert.equal(text, 'Machine learning');
    });
});

test('a non-stream Anthropic message over an OpenAI-wire fixture, raw: only Anthropic members', async () => {
    await replay('up-fx', 'openai/chat.json');
    const r = await postJson(`${env.base}/v1/messages`, { model: 'fx-openai', max_tokens: 50, messages: user('hi') }, AV);
    assert.equal(r.status, 200);
    assert.deepEqual(Object.keys(r.json).sort(), ['content', 'id', 'model', 'role', 'stop_reason', 'stop_sequence', 'type', 'usage']);
});
