// Anthropic Messages in (issue 20): the official @anthropic-ai/sdk against POST /v1/messages,
// served by an OpenAI-wire route (translated to chat completions and back), an Ollama route,
// and an Anthropic route (adapters/anthropic.lua against the mock's Messages API): text,
// system prompts, streams (the full event sequence, finalMessage), tool calls round trip with
// streamed input_json_delta and parallel calls, images, stop reasons, thinking signatures
// byte for byte, anthropic-* headers forwarded, errors in Anthropic's shape, count_tokens,
// metering, and a client that aborts mid-stream.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { contentFor } from '../mock/engine.mjs';
import { startEnv, TEST_KEY, waitFor } from './lib/harness.mjs';

const require = createRequire(import.meta.url);
const { get_encoding } = require('tiktoken');

let env;
let client;

const SIGNATURE = 'EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxDYzKIXd+/A==sig+/with=odd"chars\\and\u00e9';

before(async () => {
    env = await startEnv({
        configure: (c, e) => {
            c.providers.push({ id: 'mock-anthropic', adapter: 'anthropic', base_url: `http://127.0.0.1:${e.mock.port}`,
                api_key: 'sk-ant-upstream-key' });
            c.models['claude-chat'] = { tokenizer: 'o200k_base', routes: [{ provider: 'mock-openai', model: 'up-claude' }] };
            c.models['claude-native'] = { routes: [{ provider: 'mock-anthropic', model: 'claude-up' }] };
            // failures scripted on providers of their own: their breakers open, the others' do not
            c.providers.push({ id: 'mock-openai-err', adapter: 'openai', base_url: `http://127.0.0.1:${e.mock.port}/v1` });
            c.providers.push({ id: 'mock-anthropic-err', adapter: 'anthropic', base_url: `http://127.0.0.1:${e.mock.port}` });
            c.models['claude-err'] = { routes: [{ provider: 'mock-openai-err', model: 'up-err' }] };
            c.models['claude-native-err'] = { routes: [{ provider: 'mock-anthropic-err', model: 'claude-up-err' }] };
            c.providers.push({ id: 'mock-anthropic-rl', adapter: 'anthropic', base_url: `http://127.0.0.1:${e.mock.port}` });
            c.models['claude-native-rl'] = { routes: [{ provider: 'mock-anthropic-rl', model: 'claude-up-rl' }] };
            return c;
        },
    });
    client = new Anthropic({ baseURL: env.base, apiKey: 'sk-client', maxRetries: 0, timeout: 15000 });
});

after(async () => {
    await env?.close();
});

/** The last request the mock saw on `path` for upstream model `model`. */
async function lastUpstream(path, model) {
    const all = await env.mock.requests((r) => r.path === path && r.body?.model === model);
    assert.ok(all.length > 0, `the mock saw no ${path} request for ${model}`);
    return all[all.length - 1];
}

/** POST /v1/messages with fetch; the SSE events as [{event, data}]. */
async function rawStream(body, headers = {}) {
    const r = await fetch(`${env.base}/v1/messages`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-api-key': 'sk-client', 'anthropic-version': '2023-06-01', ...headers },
        body: JSON.stringify({ ...body, stream: true }),
        signal: AbortSignal.timeout(15000),
    });
    const text = await r.text();
    const events = [];
    for (const block of text.split('\n\n')) {
        if (!block.trim()) continue;
        const ev = {};
        for (const line of block.split('\n')) {
            if (line.startsWith('event: ')) ev.event = line.slice(7);
            else if (line.startsWith('data: ')) ev.data = JSON.parse(line.slice(6));
        }
        events.push(ev);
    }
    return { status: r.status, headers: r.headers, events, text };
}

/** Every event's data.type equals its event name; blocks never overlap; indices from 0. */
function assertWellFormed(events, { ended = true } = {}) {
    for (const e of events) assert.equal(e.data.type, e.event);
    assert.equal(events[0].event, 'message_start');
    let open = -1;
    let next = 0;
    for (const e of events) {
        if (e.event === 'content_block_start') {
            assert.equal(open, -1, 'a block starts while another is open');
            assert.equal(e.data.index, next++);
            open = e.data.index;
        } else if (e.event === 'content_block_delta') {
            assert.equal(e.data.index, open, 'a delta outside its open block');
        } else if (e.event === 'content_block_stop') {
            assert.equal(e.data.index, open);
            open = -1;
        }
    }
    if (ended) {
        assert.equal(open, -1);
        assert.deepEqual(events.slice(-2).map((e) => e.event), ['message_delta', 'message_stop']);
    }
}

describe('text through an OpenAI-wire route', () => {
    test('create: the Message shape, system as a string, model and usage', async () => {
        const msg = await client.messages.create({
            model: 'claude-chat', max_tokens: 100, system: 'be brief',
            messages: [{ role: 'user', content: 'hello there' }],
        });
        assert.equal(msg.type, 'message');
        assert.equal(msg.role, 'assistant');
        assert.match(msg.id, /^msg_/);
        assert.equal(msg.model, 'claude-chat');
        assert.deepEqual(msg.content, [{ type: 'text', text: contentFor('up-claude') }]);
        assert.equal(msg.stop_reason, 'end_turn');
        assert.equal(msg.stop_sequence, null);
        assert.equal(msg.usage.input_tokens, 4); // the mock's words: "be brief" + "hello there"
        assert.equal(msg.usage.output_tokens, 5);
        assert.ok(!('request_id' in msg) && !('logical_model' in msg), 'only Anthropic fields in the body');
        const up = await lastUpstream('/v1/chat/completions', 'up-claude');
        assert.deepEqual(up.body.messages, [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello there' }]);
        assert.equal(up.body.max_tokens, 100);
    });

    test('system as blocks, stop_sequences, sampling parameters reach the engine', async () => {
        await client.messages.create({
            model: 'claude-chat', max_tokens: 50, temperature: 0.2, top_p: 0.9,
            system: [{ type: 'text', text: 'first' }, { type: 'text', text: 'second', cache_control: { type: 'ephemeral' } }],
            stop_sequences: ['END'],
            messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }],
        });
        const up = await lastUpstream('/v1/chat/completions', 'up-claude');
        assert.deepEqual(up.body.messages[0], { role: 'system', content: 'first\nsecond' });
        assert.deepEqual(up.body.stop, ['END']);
        assert.equal(up.body.temperature, 0.2);
        assert.equal(up.body.top_p, 0.9);
    });

    test('stream: the event sequence, and messages.stream().finalMessage()', async () => {
        const { status, headers, events } = await rawStream({ model: 'claude-chat', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(status, 200);
        assert.match(headers.get('content-type'), /text\/event-stream/);
        assert.ok(headers.get('x-request-id'));
        assertWellFormed(events);
        assert.deepEqual(events.map((e) => e.event), [
            'message_start', 'ping', 'content_block_start', ...Array(5).fill('content_block_delta'), 'content_block_stop',
            'message_delta', 'message_stop',
        ]);
        assert.deepEqual(events[2].data.content_block, { type: 'text', text: '' });
        assert.equal(events.filter((e) => e.event === 'content_block_delta').map((e) => e.data.delta.text).join(''), contentFor('up-claude'));
        const md = events.at(-2).data;
        assert.equal(md.delta.stop_reason, 'end_turn');
        assert.equal(md.usage.output_tokens, 5);

        const stream = client.messages.stream({ model: 'claude-chat', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] });
        let text = '';
        stream.on('text', (t) => (text += t));
        const final = await stream.finalMessage();
        assert.equal(text, contentFor('up-claude'));
        assert.equal(final.content.length, 1);
        assert.equal(final.content[0].type, 'text');
        assert.equal(final.content[0].text, contentFor('up-claude'));
        assert.equal(final.stop_reason, 'end_turn');
        assert.equal(final.usage.output_tokens, 5);
        assert.equal(final.usage.input_tokens, 1);
    });

    test('stop reasons: max_tokens, stop_sequence with the matched string', async () => {
        const short = await client.messages.create({ model: 'claude-chat', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(short.stop_reason, 'max_tokens');
        assert.equal(short.content[0].text, contentFor('up-claude', 2));

        await env.mock.script({ model: 'up-claude', times: 2, action: { stop_reason: 'END' } });
        const seq = await client.messages.create({ model: 'claude-chat', max_tokens: 50, stop_sequences: ['END'], messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(seq.stop_reason, 'stop_sequence');
        assert.equal(seq.stop_sequence, 'END');
        const final = await client.messages.stream({ model: 'claude-chat', max_tokens: 50, stop_sequences: ['END'], messages: [{ role: 'user', content: 'hi' }] }).finalMessage();
        assert.equal(final.stop_reason, 'stop_sequence');
        assert.equal(final.stop_sequence, 'END');
    });
});

describe('tools through an OpenAI-wire route', () => {
    const tools = [
        { name: 'get_weather', description: 'weather of a city', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
        { name: 'get_time', input_schema: { type: 'object', properties: { tz: { type: 'string' } } } },
    ];
    const calls = [
        { name: 'get_weather', arguments: '{"city":"Paris","unit":"celsius"}' },
        { name: 'get_time', arguments: '{"tz":"Europe/Paris"}' },
    ];

    test('tool definitions and tool_choice reach the engine as function tools', async () => {
        await client.messages.create({
            model: 'claude-chat', max_tokens: 50, tools, tool_choice: { type: 'any', disable_parallel_tool_use: true },
            messages: [{ role: 'user', content: 'weather?' }],
        });
        const up = await lastUpstream('/v1/chat/completions', 'up-claude');
        assert.deepEqual(up.body.tools[0], { type: 'function', function: { name: 'get_weather', description: 'weather of a city', parameters: tools[0].input_schema } });
        assert.equal(up.body.tool_choice, 'required');
        assert.equal(up.body.parallel_tool_calls, false);
        await client.messages.create({ model: 'claude-chat', max_tokens: 50, tools, tool_choice: { type: 'tool', name: 'get_time' }, messages: [{ role: 'user', content: 'x' }] });
        assert.deepEqual((await lastUpstream('/v1/chat/completions', 'up-claude')).body.tool_choice, { type: 'function', function: { name: 'get_time' } });
    });

    test('parallel tool calls streamed: a tool_use block each, input_json_delta per argument delta', async () => {
        await env.mock.script({ model: 'up-claude', times: 1, action: { tool_calls: calls, empty_tool_calls: true } });
        const { events } = await rawStream({ model: 'claude-chat', max_tokens: 100, tools, messages: [{ role: 'user', content: 'weather and time?' }] });
        assertWellFormed(events);
        const starts = events.filter((e) => e.event === 'content_block_start');
        assert.equal(starts.length, 2, 'every tool call, not only the first');
        assert.deepEqual(starts.map((e) => [e.data.content_block.type, e.data.content_block.name]), [['tool_use', 'get_weather'], ['tool_use', 'get_time']]);
        assert.ok(starts.every((e) => /^call_mock_/.test(e.data.content_block.id)));
        for (const [i, c] of calls.entries()) {
            const deltas = events.filter((e) => e.event === 'content_block_delta' && e.data.index === i);
            assert.ok(deltas.length >= 2, 'the arguments arrive as they stream');
            assert.ok(deltas.every((e) => e.data.delta.type === 'input_json_delta' && e.data.delta.partial_json.length > 0), 'no empty deltas');
            assert.equal(deltas.map((e) => e.data.delta.partial_json).join(''), c.arguments);
        }
        assert.equal(events.at(-2).data.delta.stop_reason, 'tool_use');
    });

    test('the round trip: finalMessage tool_use inputs, then tool_result blocks as tool messages', async () => {
        await env.mock.script({ model: 'up-claude', times: 1, action: { tool_calls: calls } });
        const first = await client.messages.stream({ model: 'claude-chat', max_tokens: 100, tools, messages: [{ role: 'user', content: 'weather and time?' }] }).finalMessage();
        assert.equal(first.stop_reason, 'tool_use');
        assert.deepEqual(first.content.map((b) => [b.type, b.name, b.input]), [
            ['tool_use', 'get_weather', { city: 'Paris', unit: 'celsius' }],
            ['tool_use', 'get_time', { tz: 'Europe/Paris' }],
        ]);
        const second = await client.messages.create({
            model: 'claude-chat', max_tokens: 100, tools,
            messages: [
                { role: 'user', content: 'weather and time?' },
                { role: 'assistant', content: first.content },
                { role: 'user', content: [
                    { type: 'tool_result', tool_use_id: first.content[0].id, content: '18 C' },
                    { type: 'tool_result', tool_use_id: first.content[1].id, content: [{ type: 'text', text: '14:00' }], is_error: true },
                    { type: 'text', text: 'thanks' },
                ] },
            ],
        });
        assert.equal(second.stop_reason, 'end_turn');
        const up = await lastUpstream('/v1/chat/completions', 'up-claude');
        const m = up.body.messages;
        assert.equal(m[1].role, 'assistant');
        assert.equal(m[1].content, null);
        assert.deepEqual(m[1].tool_calls.map((t) => [t.id, t.function.name, JSON.parse(t.function.arguments)]), [
            [first.content[0].id, 'get_weather', { city: 'Paris', unit: 'celsius' }],
            [first.content[1].id, 'get_time', { tz: 'Europe/Paris' }],
        ]);
        assert.deepEqual(m.slice(2), [
            { role: 'tool', tool_call_id: first.content[0].id, content: '18 C' },
            { role: 'tool', tool_call_id: first.content[1].id, content: 'Error: 14:00' },
            { role: 'user', content: 'thanks' },
        ]);
    });

    test('non-stream tool calls and reasoning as thinking', async () => {
        await env.mock.script({ model: 'up-claude', times: 1, action: { tool_calls: calls.slice(0, 1), reasoning: 'let me think' } });
        const msg = await client.messages.create({ model: 'claude-chat', max_tokens: 100, tools, messages: [{ role: 'user', content: 'w?' }] });
        assert.deepEqual(msg.content, [
            { type: 'thinking', thinking: 'let me think', signature: '' },
            { type: 'tool_use', id: msg.content[1].id, name: 'get_weather', input: { city: 'Paris', unit: 'celsius' } },
        ]);
        assert.equal(msg.stop_reason, 'tool_use');
    });
});

describe('images', () => {
    const png = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';

    test('base64 and url images reach an OpenAI-wire engine as image_url parts', async () => {
        await client.messages.create({
            model: 'claude-chat', max_tokens: 10,
            messages: [{ role: 'user', content: [
                { type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } },
                { type: 'image', source: { type: 'url', url: 'https://example.com/cat.jpg' } },
                { type: 'text', text: 'what is this?' },
            ] }],
        });
        const up = await lastUpstream('/v1/chat/completions', 'up-claude');
        assert.deepEqual(up.body.messages[0].content, [
            { type: 'image_url', image_url: { url: `data:image/png;base64,${png}` } },
            { type: 'image_url', image_url: { url: 'https://example.com/cat.jpg' } },
            { type: 'text', text: 'what is this?' },
        ]);
    });

    test('Ollama gets base64 images; an image URL it cannot fetch is a 400 with the reason, never dropped', async () => {
        await client.messages.create({
            model: 'ollama-chat', max_tokens: 10,
            messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } }, { type: 'text', text: 'see' }] }],
        });
        const up = await lastUpstream('/api/chat', 'up-ollama-chat');
        assert.deepEqual(up.body.messages[0].images, [png]);
        const before = (await env.mock.requests((r) => r.path === '/api/chat')).length;
        await assert.rejects(
            client.messages.create({
                model: 'ollama-chat', max_tokens: 10,
                messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'https://example.com/cat.jpg' } }] }],
            }),
            (err) => {
                assert.ok(err instanceof Anthropic.BadRequestError, String(err));
                assert.equal(err.status, 400);
                assert.equal(err.error.type, 'error');
                assert.equal(err.error.error.type, 'invalid_request_error');
                assert.match(err.error.error.message, /Ollama cannot fetch image URLs/);
                return true;
            });
        assert.equal((await env.mock.requests((r) => r.path === '/api/chat')).length, before, 'nothing was sent');
    });
});

describe('errors in Anthropic\'s shape', () => {
    test('an unknown model is 404 not_found_error, with request-id', async () => {
        await assert.rejects(client.messages.create({ model: 'no-such-model', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
            (err) => {
                assert.ok(err instanceof Anthropic.NotFoundError, String(err));
                assert.equal(err.error.error.type, 'not_found_error');
                assert.match(err.error.error.message, /^MODEL_NOT_FOUND: /);
                assert.ok(err.requestID || err.headers?.get?.('x-request-id'));
                return true;
            });
    });

    test('a request without max_tokens, a document block, a server tool: 400 invalid_request_error', async () => {
        const bad = [
            { model: 'claude-chat', messages: [{ role: 'user', content: 'x' }] },
            { model: 'claude-chat', max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'x' } }] }] },
            { model: 'claude-chat', max_tokens: 5, tools: [{ type: 'web_search_20250305', name: 'web_search' }], messages: [{ role: 'user', content: 'x' }] },
        ];
        for (const body of bad) {
            const r = await fetch(`${env.base}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
            assert.equal(r.status, 400);
            const j = await r.json();
            assert.equal(j.type, 'error');
            assert.equal(j.error.type, 'invalid_request_error');
            assert.match(j.error.message, /^INVALID_REQUEST: /);
        }
    });

    test('the router\'s own errors under /v1/messages use the same shape', async () => {
        const get = await fetch(`${env.base}/v1/messages`);
        assert.equal(get.status, 405);
        assert.equal((await get.json()).error.type, 'invalid_request_error');
        const none = await fetch(`${env.base}/v1/messages/batches`, { method: 'POST', body: '{}' });
        assert.equal(none.status, 404);
        const j = await none.json();
        assert.equal(j.type, 'error');
        assert.equal(j.error.type, 'not_found_error');
        assert.ok(none.headers.get('request-id'));
    });

    test('an engine that fails mid-stream ends the stream with an error event, not message_stop', async () => {
        await env.mock.script({ model: 'up-err', times: 1, action: { chunks: 5, chunk_delay_ms: 60, reset_after_chunks: 2 } });
        const { events, text } = await rawStream({ model: 'claude-err', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] });
        assertWellFormed(events, { ended: false });
        const last = events.at(-1);
        assert.equal(last.event, 'error');
        assert.equal(last.data.type, 'error');
        assert.equal(last.data.error.type, 'api_error');
        assert.ok(!events.some((e) => e.event === 'message_stop'));
        await assert.rejects(async () => {
            await env.mock.script({ model: 'up-err', times: 1, action: { chunks: 5, chunk_delay_ms: 60, reset_after_chunks: 2 } });
            await client.messages.stream({ model: 'claude-err', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] }).finalMessage();
        });
    });

    test('an unavailable provider is overloaded_error', async () => {
        await env.mock.script({ model: 'up-err', times: 8, action: { status: 503 } });
        await assert.rejects(client.messages.create({ model: 'claude-err', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
            (err) => {
                assert.ok(err.status >= 500, String(err));
                assert.equal(err.error.error.type, 'overloaded_error');
                return true;
            });
    });
});

describe('count_tokens', () => {
    test('the canonical request counted with the model\'s encoding', async () => {
        const enc = get_encoding('o200k_base');
        const n = (s) => enc.encode(s).length;
        const r = await client.messages.countTokens({
            model: 'claude-chat', system: 'You are terse.',
            messages: [{ role: 'user', content: 'How many tokens is this sentence?' }, { role: 'assistant', content: 'Some.' }],
        });
        assert.equal(r.input_tokens, 3 + (3 + n('You are terse.')) + (3 + n('How many tokens is this sentence?')) + (3 + n('Some.')));
        enc.free();
        await assert.rejects(client.messages.countTokens({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }),
            (err) => err instanceof Anthropic.NotFoundError);
    });
});

describe('the rest of the surface', () => {
    test('GET /v1/models in Anthropic\'s list shape for an Anthropic client', async () => {
        const ids = [];
        for await (const m of client.models.list()) {
            assert.equal(m.type, 'model');
            assert.match(m.created_at, /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/);
            ids.push(m.id);
        }
        assert.ok(ids.includes('claude-chat') && ids.includes('claude-native'));
        const oa = await (await fetch(`${env.api}/models`)).json();
        assert.equal(oa.object, 'list'); // the OpenAI shape for everyone else
    });

    test('request-id on answers and errors; an Idempotency-Key runs once and replays the Message', async () => {
        const { data, response } = await client.messages.create({ model: 'claude-chat', max_tokens: 9, messages: [{ role: 'user', content: 'once' }] }).withResponse();
        assert.equal(response.headers.get('request-id'), response.headers.get('x-request-id'));
        assert.match(data.id, /^msg_/);
        const key = `idem-messages-${Date.now()}`;
        const before = (await env.mock.requests((r) => r.body?.model === 'up-claude')).length;
        const a = await client.messages.create({ model: 'claude-chat', max_tokens: 9, messages: [{ role: 'user', content: 'idem' }] }, { headers: { 'Idempotency-Key': key } });
        const b = await client.messages.create({ model: 'claude-chat', max_tokens: 9, messages: [{ role: 'user', content: 'idem' }] }, { headers: { 'Idempotency-Key': key } });
        assert.equal(a.type, 'message');
        assert.deepEqual(b, a);
        assert.equal((await env.mock.requests((r) => r.body?.model === 'up-claude')).length, before + 1);
    });
});

describe('metering and abort', () => {
    test('the call\'s tokens are counted and the endpoint is "messages" in the metrics', async () => {
        await client.messages.create({ model: 'claude-chat', max_tokens: 100, messages: [{ role: 'user', content: 'meter me please' }] });
        const line = await waitFor(() => env.gw.logs.find((l) => l.msg === 'request' && l.path === '/v1/messages' && l.prompt_tokens === 3));
        assert.equal(line.completion_tokens, 5);
        assert.equal(line.tokens_estimated, false);
        assert.match(await env.gw.metrics(), /endpoint="messages"/);
    });

    test('a client that aborts mid-stream cancels the upstream transfer', async () => {
        await env.mock.script({ model: 'up-claude', times: 1, action: { chunks: 40, chunk_delay_ms: 100 } });
        const ac = new AbortController();
        const stream = client.messages.stream({ model: 'claude-chat', max_tokens: 100, messages: [{ role: 'user', content: 'long' }] }, { signal: ac.signal });
        let deltas = 0;
        stream.on('text', () => {
            if (++deltas === 2) ac.abort();
        });
        await assert.rejects(stream.finalMessage(), (err) => err instanceof Anthropic.APIUserAbortError || err.name === 'AbortError' || /abort/i.test(String(err)));
        const rec = await waitFor(async () => (await env.mock.requests((r) => r.body?.model === 'up-claude' && r.closed_early)).at(-1), { timeoutMs: 5000 });
        assert.ok(rec.closed_early);
    });
});

describe('an Anthropic route (adapters/anthropic.lua)', () => {
    test('create: the client\'s body and anthropic-* headers reach the upstream, x-api-key is the provider\'s', async () => {
        const msg = await client.messages.create({
            model: 'claude-native', max_tokens: 64, system: [{ type: 'text', text: 'sys', cache_control: { type: 'ephemeral' } }],
            messages: [{ role: 'user', content: 'hello' }], metadata: { user_id: 'u-1' },
        }, { headers: { 'anthropic-beta': 'prompt-caching-2024-07-31,tools-2024-05-16', 'anthropic-version': '2023-06-01' } });
        assert.equal(msg.content[0].text, contentFor('claude-up'));
        assert.equal(msg.model, 'claude-native');
        assert.equal(msg.stop_reason, 'end_turn');
        const up = await lastUpstream('/v1/messages', 'claude-up');
        assert.equal(up.headers['x-api-key'], 'sk-ant-upstream-key');
        assert.equal(up.headers['anthropic-beta'], 'prompt-caching-2024-07-31,tools-2024-05-16');
        assert.equal(up.headers['anthropic-version'], '2023-06-01');
        assert.ok(!up.headers.authorization);
        assert.deepEqual(up.body.system, [{ type: 'text', text: 'sys', cache_control: { type: 'ephemeral' } }]);
        assert.deepEqual(up.body.metadata, { user_id: 'u-1' });
        assert.equal(up.body.max_tokens, 64);
    });

    test('thinking with its signature, byte for byte, stream and not; the next turn sends it back as it was', async () => {
        const thinking = { thinking: 'step one, step two', signature: SIGNATURE };
        await env.mock.script({ model: 'claude-up', times: 2, action: { thinking, cache: { read: 7, write: 2 } } });
        const msg = await client.messages.create({ model: 'claude-native', max_tokens: 64, thinking: { type: 'enabled', budget_tokens: 1024 }, messages: [{ role: 'user', content: 'think' }] });
        assert.deepEqual(msg.content[0], { type: 'thinking', ...thinking });
        assert.equal(msg.usage.cache_read_input_tokens, 7);
        assert.equal(msg.usage.cache_creation_input_tokens, 2);
        assert.equal(msg.usage.input_tokens, 1);
        const final = await client.messages.stream({ model: 'claude-native', max_tokens: 64, thinking: { type: 'enabled', budget_tokens: 1024 }, messages: [{ role: 'user', content: 'think' }] }).finalMessage();
        assert.equal(final.content[0].type, 'thinking');
        assert.equal(final.content[0].signature, SIGNATURE);
        assert.equal(final.content[0].thinking, thinking.thinking);
        assert.equal(final.content[1].text, contentFor('claude-up'));
        assert.equal(final.usage.cache_read_input_tokens, 7);
        await client.messages.create({ model: 'claude-native', max_tokens: 64, thinking: { type: 'enabled', budget_tokens: 1024 },
            messages: [{ role: 'user', content: 'think' }, { role: 'assistant', content: final.content }, { role: 'user', content: 'more' }] });
        const up = await lastUpstream('/v1/messages', 'claude-up');
        assert.equal(up.body.messages[1].content[0].signature, SIGNATURE);
        assert.deepEqual(up.body.thinking, { type: 'enabled', budget_tokens: 1024 });
    });

    test('what chat routes cannot take (a document, a server tool, mcp_servers) reaches an Anthropic route as sent', async () => {
        const doc = { type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'the text' }, citations: { enabled: true } };
        const tool = { type: 'web_search_20250305', name: 'web_search', max_uses: 2 };
        const msg = await client.messages.create({ model: 'claude-native', max_tokens: 32, tools: [tool],
            messages: [{ role: 'user', content: [doc, { type: 'text', text: 'summarise' }] }] });
        assert.equal(msg.content[0].text, contentFor('claude-up'));
        const up = await lastUpstream('/v1/messages', 'claude-up');
        assert.deepEqual(up.body.messages[0].content[0], doc);
        assert.deepEqual(up.body.tools, [tool]);
        // the same request on a chat route is a 400 that says why, and nothing is sent
        const before = (await env.mock.requests((r) => r.path === '/v1/chat/completions')).length;
        await assert.rejects(client.messages.create({ model: 'claude-chat', max_tokens: 32, tools: [tool],
            messages: [{ role: 'user', content: [doc, { type: 'text', text: 'summarise' }] }] }),
        (err) => err.status === 400 && /'document' block/.test(err.error.error.message));
        assert.equal((await env.mock.requests((r) => r.path === '/v1/chat/completions')).length, before);
    });

    test('an overloaded_error event mid-stream reaches the client as an overloaded_error event', async () => {
        const ev = (type, obj) => `event: ${type}\ndata: ${JSON.stringify({ type, ...obj })}\n\n`;
        await env.mock.script({ model: 'claude-up', times: 1, action: { chunk_delay_ms: 60, body: [
            ev('message_start', { message: { id: 'm', type: 'message', role: 'assistant', model: 'claude-up', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 3, output_tokens: 1 } } }),
            ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }) + ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hel' } }),
            ev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } }),
        ] } });
        const { events } = await rawStream({ model: 'claude-native', max_tokens: 32, messages: [{ role: 'user', content: 'x' }] });
        assertWellFormed(events, { ended: false });
        assert.equal(events.filter((e) => e.event === 'content_block_delta').map((e) => e.data.delta.text).join(''), 'Hel');
        const last = events.at(-1);
        assert.equal(last.event, 'error');
        assert.equal(last.data.error.type, 'overloaded_error');
        assert.match(last.data.error.message, /Overloaded/);
    });

    test('pass-through: what Anthropic answers reaches the client as it is (server tool blocks, citations), model renamed', async () => {
        const content = [
            { type: 'server_tool_use', id: 'srvtoolu_1', name: 'web_search', input: { query: 'moon' } },
            { type: 'web_search_tool_result', tool_use_id: 'srvtoolu_1', content: [{ type: 'web_search_result', url: 'https://e.x', title: 'Moon', encrypted_content: 'Eq+/=', page_age: null }] },
            { type: 'text', text: 'The moon.', citations: [{ type: 'web_search_result_location', url: 'https://e.x', title: 'Moon', encrypted_index: 'Eo8', cited_text: 'moon' }] },
        ];
        const usage = { input_tokens: 11, output_tokens: 7, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, server_tool_use: { web_search_requests: 1 } };
        await env.mock.script({ model: 'claude-up', times: 1, action: { body: { id: 'msg_up', type: 'message', role: 'assistant', model: 'claude-up', content, stop_reason: 'end_turn', stop_sequence: null, usage } } });
        const msg = await client.messages.create({ model: 'claude-native', max_tokens: 32, messages: [{ role: 'user', content: 'moon?' }] });
        assert.deepEqual(msg.content, content);
        assert.deepEqual(msg.usage, usage);
        assert.equal(msg.model, 'claude-native');
        assert.equal(msg.id, 'msg_up');

        const ev = (type, obj) => `event: ${type}\ndata: ${JSON.stringify({ type, ...obj })}\n\n`;
        await env.mock.script({ model: 'claude-up', times: 1, action: { body: [
            ev('message_start', { message: { id: 'msg_s', type: 'message', role: 'assistant', model: 'claude-up', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 11, cache_read_input_tokens: 4, output_tokens: 1 } } }) + ev('ping', {}),
            ev('content_block_start', { index: 0, content_block: content[1] }) + ev('content_block_stop', { index: 0 }),
            ev('content_block_start', { index: 1, content_block: { type: 'text', text: '' } }) + ev('content_block_delta', { index: 1, delta: { type: 'citations_delta', citation: content[2].citations[0] } }),
            ev('content_block_delta', { index: 1, delta: { type: 'text_delta', text: 'The moon.' } }) + ev('content_block_stop', { index: 1 }),
            ev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 9 } }) + ev('message_stop', {}),
        ] } });
        const final = await client.messages.stream({ model: 'claude-native', max_tokens: 32, messages: [{ role: 'user', content: 'moon?' }] }).finalMessage();
        assert.deepEqual(final.content[0], content[1]);
        assert.equal(final.content[1].text, 'The moon.');
        assert.deepEqual(final.content[1].citations, content[2].citations);
        assert.equal(final.model, 'claude-native');
        assert.equal(final.usage.output_tokens, 9);
        const line = await waitFor(() => env.gw.logs.find((l) => l.msg === 'request' && l.path === '/v1/messages' && l.provider === 'mock-anthropic' && l.completion_tokens === 9));
        assert.equal(line.prompt_tokens, 15); // input + cache reads
        assert.equal(line.tokens_estimated, false);
    });

    test('streamed tool_use through the adapter and back', async () => {
        await env.mock.script({ model: 'claude-up', times: 1, action: { tool_calls: [{ name: 'a', input: { x: 1 } }, { name: 'b', input: { y: 'two' } }] } });
        const { events } = await rawStream({ model: 'claude-native', max_tokens: 64, tools: [{ name: 'a', input_schema: { type: 'object' } }, { name: 'b', input_schema: { type: 'object' } }], messages: [{ role: 'user', content: 'go' }] });
        assertWellFormed(events);
        const starts = events.filter((e) => e.event === 'content_block_start').map((e) => e.data.content_block);
        assert.deepEqual(starts.map((b) => [b.type, b.name]), [['text', undefined], ['tool_use', 'a'], ['tool_use', 'b']].slice(starts.length === 3 ? 0 : 1));
        const json = (i) => events.filter((e) => e.event === 'content_block_delta' && e.data.index === i && e.data.delta.type === 'input_json_delta').map((e) => e.data.delta.partial_json).join('');
        const firstTool = starts.findIndex((b) => b.type === 'tool_use');
        assert.deepEqual(JSON.parse(json(firstTool)), { x: 1 });
        assert.deepEqual(JSON.parse(json(firstTool + 1)), { y: 'two' });
        assert.equal(events.at(-2).data.delta.stop_reason, 'tool_use');
    });

    test('stop_sequence and max_tokens come back as they were', async () => {
        await env.mock.script({ model: 'claude-up', times: 1, action: { stop_sequence: '###' } });
        const s = await client.messages.create({ model: 'claude-native', max_tokens: 64, stop_sequences: ['###'], messages: [{ role: 'user', content: 'x' }] });
        assert.equal(s.stop_reason, 'stop_sequence');
        assert.equal(s.stop_sequence, '###');
        const m = await client.messages.stream({ model: 'claude-native', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }).finalMessage();
        assert.equal(m.stop_reason, 'max_tokens');
    });

    test('an upstream 529 overloaded_error is the gateway\'s overloaded_error', async () => {
        await env.mock.script({ model: 'claude-up-err', times: 8, action: { status: 529 } });
        await assert.rejects(client.messages.create({ model: 'claude-native-err', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
            (err) => err.error?.error?.type === 'overloaded_error');
    });

    test('an upstream 429 with retry-after cools the provider for as long as it asked', async () => {
        await env.mock.script({ model: 'claude-up-rl', times: 1, action: { status: 429, headers: {
            'retry-after': '150', 'anthropic-ratelimit-requests-remaining': '0',
            'anthropic-ratelimit-requests-reset': '2030-01-01T00:00:00Z' } } });
        await assert.rejects(client.messages.create({ model: 'claude-native-rl', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
            (err) => err.status === 429 || err.status === 503);
        const line = await waitFor(() => env.gw.logs.find((l) => l.msg === 'cooldown' && l.provider === 'mock-anthropic-rl'));
        assert.equal(line.status, 429);
        assert.equal(line.seconds, 150);
    });

    test('chat completions through the Anthropic adapter (openai SDK): text, stream, tools', async () => {
        const oa = new OpenAI({ baseURL: env.api, apiKey: 'sk-client', maxRetries: 0 });
        const r = await oa.chat.completions.create({ model: 'claude-native', messages: [{ role: 'system', content: 'sys' }, { role: 'user', content: 'hi' }] });
        assert.equal(r.choices[0].message.content, contentFor('claude-up'));
        assert.equal(r.choices[0].finish_reason, 'stop');
        let up = await lastUpstream('/v1/messages', 'claude-up');
        assert.equal(up.body.system, 'sys');
        assert.deepEqual(up.body.messages, [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }]);
        assert.equal(up.body.max_tokens, 4096);

        await env.mock.script({ model: 'claude-up', times: 1, action: { tool_calls: [{ name: 'f', input: { q: 'z' } }] } });
        const stream = await oa.chat.completions.create({ model: 'claude-native', stream: true, messages: [{ role: 'user', content: 'call f' }], tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] });
        let args = '';
        let name = '';
        let finish = null;
        for await (const ch of stream) {
            for (const tc of ch.choices[0]?.delta?.tool_calls ?? []) {
                if (tc.function?.name) name = tc.function.name;
                args += tc.function?.arguments ?? '';
            }
            finish = ch.choices[0]?.finish_reason ?? finish;
        }
        assert.equal(name, 'f');
        assert.deepEqual(JSON.parse(args), { q: 'z' });
        assert.equal(finish, 'tool_calls');
        up = await lastUpstream('/v1/messages', 'claude-up');
        assert.deepEqual(up.body.tools, [{ name: 'f', input_schema: { type: 'object' } }]);

        await assert.rejects(oa.chat.completions.create({ model: 'claude-native', n: 2, messages: [{ role: 'user', content: 'x' }] }),
            (err) => err.status === 400 && /n > 1/.test(err.message));
    });
});
