// The Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) bridged to chat
// engines, driven by the official `openai` SDK against both adapters (OpenAI wire and
// Ollama's native API) on the mock engine: text, streams with finalResponse(), function tools
// round trip through previous_response_id and function_call_output, json_schema, reasoning
// summaries, store: false, another caller's ids, refused parameters, metering. Every Response
// and stream event is checked against the official OpenAPI document.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startEnv, postJson } from './lib/harness.mjs';
import fs from 'node:fs';
import { assertConforms, OPENAPI_PATH } from './lib/conformance.mjs';
import { contentFor } from '../mock/engine.mjs';

let env;
let client;

before(async () => {
    env = await startEnv();
    client = new OpenAI({ baseURL: env.api, apiKey: 'sk-client-anything', maxRetries: 0, timeout: 15000 });
});

after(async () => {
    await env?.close();
});

const ADAPTERS = [
    { name: 'openai', model: 'chat', upstream: 'up-chat', path: '/v1/chat/completions' },
    { name: 'ollama', model: 'ollama-chat', upstream: 'up-ollama-chat', path: '/api/chat' },
];

const WEATHER_TOOL = {
    type: 'function',
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    strict: true,
};

async function lastSeq() {
    const all = await env.mock.requests();
    return all.length ? all.at(-1).seq : 0;
}

/** The upstream requests for one upstream model after seq `since`. */
async function upstreamSince(upstream, since) {
    return env.mock.requests((r) => r.seq > since && r.body?.model === upstream);
}

/** Script the next request of `upstream` with `action`. */
function script(upstream, action) {
    return env.mock.script({ model: upstream, times: 1, action });
}

/** Each stream event type's own schema (ResponseStreamEvent is the union of them). */
const EVENT_SCHEMA = (() => {
    const schemas = JSON.parse(fs.readFileSync(OPENAPI_PATH, 'utf8')).components.schemas;
    const map = {};
    for (const alt of schemas.ResponseStreamEvent.anyOf) {
        const name = alt.$ref.split('/').pop();
        for (const t of schemas[name]?.properties?.type?.enum ?? []) map[t] = name;
    }
    return map;
})();

function assertEvent(ev) {
    assert.ok(EVENT_SCHEMA[ev.type], `${ev.type} is an event type of the API`);
    assertConforms(EVENT_SCHEMA[ev.type], ev, ev.type);
}

/** The events of a stream, every one checked against the schema and numbered in order. */
async function events(stream) {
    const all = [];
    for await (const ev of stream) {
        assertEvent(ev);
        all.push(ev);
    }
    all.forEach((ev, i) => assert.equal(ev.sequence_number, i, `sequence_number of ${ev.type}`));
    return all;
}

function types(evs) {
    return evs.map((e) => e.type);
}

for (const a of ADAPTERS) {
    describe(`responses over the ${a.name} adapter`, () => {
        test('text: a string input, instructions, the Response shape, usage, metering', async () => {
            const since = await lastSeq();
            const r = await client.responses.create({
                model: a.model, input: 'hello there gateway', instructions: 'be brief', max_output_tokens: 50,
            });
            assertConforms('Response', r, 'response');
            assert.match(r.id, /^resp_/);
            assert.equal(r.object, 'response');
            assert.equal(r.status, 'completed');
            assert.equal(r.model, a.model);
            assert.equal(r.instructions, 'be brief');
            assert.equal(r.output.length, 1);
            const msg = r.output[0];
            assert.equal(msg.type, 'message');
            assert.match(msg.id, /^msg_/);
            assert.equal(msg.role, 'assistant');
            assert.equal(msg.content[0].type, 'output_text');
            assert.equal(msg.content[0].text, contentFor(a.upstream));
            assert.equal(r.output_text, contentFor(a.upstream), 'the SDK\'s output_text');
            assert.equal(r.usage.input_tokens, 5, 'prompt words: "be brief" + "hello there gateway"');
            assert.equal(r.usage.output_tokens, 5);
            assert.equal(r.usage.total_tokens, 10);
            assert.equal(r.usage.input_tokens_details.cached_tokens, 0);
            assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
            const [up] = await upstreamSince(a.upstream, since);
            assert.ok(up, 'the engine was asked');
            assert.equal(up.path, a.path);
            const msgs = up.body.messages;
            assert.deepEqual(msgs.map((m) => m.role), ['system', 'user']);
            assert.equal(msgs[0].content, 'be brief');
            assert.equal(msgs[1].content, 'hello there gateway');
            if (a.name === 'openai') assert.equal(up.body.max_tokens, 50);
            else assert.equal(up.body.options?.num_predict, 50);
            const log = await env.gw.requestLog(r.request_id);
            assert.equal(log.path, '/v1/responses');
            assert.equal(log.prompt_tokens, 5, 'metered like any call');
            assert.equal(log.completion_tokens, 5);
            assert.equal(log.tokens_estimated, false);
        });

        test('stream: the event sequence, one id throughout, finalResponse', async () => {
            const stream = client.responses.stream({ model: a.model, input: 'stream me please' });
            const evs = await events(stream);
            const final = await stream.finalResponse();
            assertConforms('Response', final, 'final response');
            const t = types(evs);
            assert.deepEqual(t.slice(0, 5), ['response.created', 'response.in_progress',
                'response.output_item.added', 'response.content_part.added', 'response.output_text.delta']);
            assert.deepEqual(t.slice(-4), ['response.output_text.done', 'response.content_part.done',
                'response.output_item.done', 'response.completed']);
            const created = evs[0].response, completed = evs.at(-1).response;
            assert.equal(created.id, completed.id, 'response.created and response.completed carry the same id');
            assert.equal(created.status, 'in_progress');
            assert.equal(completed.status, 'completed');
            const deltas = evs.filter((e) => e.type === 'response.output_text.delta');
            assert.equal(deltas.length, 5, 'one delta per engine chunk');
            const text = deltas.map((d) => d.delta).join('');
            assert.equal(text, contentFor(a.upstream));
            assert.equal(evs.find((e) => e.type === 'response.output_text.done').text, text);
            assert.equal(final.id, created.id);
            assert.equal(final.output_text, text);
            assert.equal(completed.usage.output_tokens, 5);
            assert.equal(completed.usage.total_tokens, completed.usage.input_tokens + 5);
            const itemId = evs[2].item.id;
            for (const e of evs.filter((x) => 'item_id' in x)) assert.equal(e.item_id, itemId);
            // the stored copy is the one the stream completed
            const got = await client.responses.retrieve(final.id);
            assert.equal(got.id, final.id);
            assert.equal(got.output[0].content[0].text, text);
        });

        test('function tools: a call streamed, its output sent back through previous_response_id', async () => {
            const args = { city: 'Paris' };
            await script(a.upstream, { chunks: 0, tool_calls: [{ name: 'get_weather', arguments: args }] });
            const since = await lastSeq();
            const stream = client.responses.stream({
                model: a.model, input: 'what is the weather in Paris', tools: [WEATHER_TOOL], tool_choice: 'auto',
            });
            const evs = await events(stream);
            const first = await stream.finalResponse();
            const [up] = await upstreamSince(a.upstream, since);
            assert.equal(up.body.tools[0].function.name, 'get_weather', 'tools in the chat shape');
            assert.deepEqual(up.body.tools[0].function.parameters, WEATHER_TOOL.parameters);
            if (a.name === 'openai') assert.equal(up.body.tool_choice, 'auto');
            const t = types(evs);
            const added = t.indexOf('response.output_item.added');
            const firstDelta = t.indexOf('response.function_call_arguments.delta');
            assert.ok(added >= 0 && firstDelta > added, 'output_item.added before any delta');
            const done = evs.find((e) => e.type === 'response.function_call_arguments.done');
            assert.deepEqual(JSON.parse(done.arguments), args, 'the full arguments in .done, never {}');
            assert.equal(done.name, 'get_weather');
            const deltas = evs.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta);
            assert.equal(deltas.join(''), done.arguments, 'the deltas add up to .done');
            if (a.name === 'openai') assert.equal(deltas.length, 3, 'the engine\'s deltas as they came');
            const call = first.output.find((o) => o.type === 'function_call');
            assert.ok(call, 'a function_call item');
            assert.match(call.id, /^fc_/);
            assert.equal(call.name, 'get_weather');
            assert.deepEqual(JSON.parse(call.arguments), args);
            assert.ok(call.call_id);
            assert.equal(evs.at(-1).type, 'response.completed');

            // the round trip: the tool's output, with the conversation from the stored response
            const since2 = await lastSeq();
            const second = await client.responses.create({
                model: a.model,
                previous_response_id: first.id,
                input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"temp_c":21}' }],
                tools: [WEATHER_TOOL],
            });
            assert.equal(second.status, 'completed');
            assert.equal(second.previous_response_id, first.id);
            const [up2] = await upstreamSince(a.upstream, since2);
            const msgs = up2.body.messages;
            assert.deepEqual(msgs.map((m) => m.role), ['user', 'assistant', 'tool']);
            assert.equal(msgs[0].content, 'what is the weather in Paris');
            const tc = msgs[1].tool_calls[0];
            assert.equal(tc.function.name, 'get_weather');
            if (a.name === 'openai') {
                assert.equal(tc.id, call.call_id);
                assert.deepEqual(JSON.parse(tc.function.arguments), args);
                assert.equal(msgs[2].tool_call_id, call.call_id);
                assert.equal(msgs[2].content, '{"temp_c":21}');
            } else {
                assert.deepEqual(tc.function.arguments, args, 'Ollama takes the arguments as an object');
                assert.equal(msgs[2].content, '{"temp_c":21}');
            }
        });

        test('function tools without a stream: the call item and the input items sent back', async () => {
            await script(a.upstream, { chunks: 0, tool_calls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }] });
            const r = await client.responses.create({ model: a.model, input: 'weather in Oslo?', tools: [WEATHER_TOOL] });
            assertConforms('Response', r, 'tool call response');
            const call = r.output.find((o) => o.type === 'function_call');
            assert.deepEqual(JSON.parse(call.arguments), { city: 'Oslo' });
            assert.equal(call.status, 'completed');
            // the whole conversation as items, without previous_response_id
            const since = await lastSeq();
            const r2 = await client.responses.create({
                model: a.model, store: false,
                input: [
                    { role: 'user', content: [{ type: 'input_text', text: 'weather in Oslo?' }] },
                    { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
                    { type: 'function_call_output', call_id: call.call_id, output: 'sunny' },
                ],
            });
            assert.equal(r2.status, 'completed');
            const [up] = await upstreamSince(a.upstream, since);
            assert.deepEqual(up.body.messages.map((m) => m.role), ['user', 'assistant', 'tool']);
            // the agents' way: the previous output items sent back as they came
            const since2 = await lastSeq();
            const r3 = await client.responses.create({
                model: a.model, store: false,
                input: [{ role: 'user', content: 'weather in Oslo?' }, ...r.output,
                    { type: 'function_call_output', call_id: call.call_id, output: 'sunny' }],
            });
            assert.equal(r3.status, 'completed');
            const [up2] = await upstreamSince(a.upstream, since2);
            assert.deepEqual(up2.body.messages.map((m) => m.role), ['user', 'assistant', 'tool']);
            assert.equal(up2.body.messages[1].tool_calls[0].function.name, 'get_weather');
        });

        test('text.format json_schema reaches the engine', async () => {
            const schema = { type: 'object', properties: { answer: { type: 'string' } }, required: ['answer'], additionalProperties: false };
            const since = await lastSeq();
            const r = await client.responses.create({
                model: a.model, input: 'answer in JSON',
                text: { format: { type: 'json_schema', name: 'answer', schema, strict: true } },
            });
            assert.equal(r.text.format.type, 'json_schema');
            const [up] = await upstreamSince(a.upstream, since);
            if (a.name === 'openai') {
                assert.equal(up.body.response_format.type, 'json_schema');
                assert.equal(up.body.response_format.json_schema.name, 'answer');
                assert.deepEqual(up.body.response_format.json_schema.schema, schema);
                assert.equal(up.body.response_format.json_schema.strict, true);
            } else {
                assert.deepEqual(up.body.format, schema, 'Ollama: format = the schema');
            }
        });

        test('store: false keeps nothing; previous_response_id of it is not found', async () => {
            const r = await client.responses.create({ model: a.model, input: 'do not keep this', store: false });
            assert.equal(r.store, false);
            await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404);
            await assert.rejects(
                client.responses.create({ model: a.model, input: 'more', previous_response_id: r.id }),
                (e) => e.status === 404 && e.error?.param === 'previous_response_id');
        });
    });
}

describe('responses: retrieve, delete, reasoning, errors', () => {
    test('GET and DELETE /v1/responses/{id}', async () => {
        const r = await client.responses.create({ model: 'chat', input: 'keep this one', metadata: { k: 'v' } });
        const got = await client.responses.retrieve(r.id);
        assertConforms('Response', got, 'retrieved');
        assert.equal(got.id, r.id);
        assert.deepEqual(got.metadata, { k: 'v' });
        assert.equal(got.output[0].content[0].text, r.output[0].content[0].text);
        await assert.rejects(client.responses.cancel(r.id),
            (e) => e.status === 400 && /background/.test(e.message), 'only background ones can be cancelled');
        await assert.rejects(client.responses.cancel('resp_nope'), (e) => e.status === 404);
        const del = await client.responses.delete(r.id).asResponse();
        assert.equal(del.status, 200);
        assert.deepEqual(await del.json(), { id: r.id, object: 'response', deleted: true });
        await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404);
        await assert.rejects(client.responses.delete(r.id), (e) => e.status === 404);
        await assert.rejects(
            client.responses.create({ model: 'chat', input: 'again', previous_response_id: r.id }),
            (e) => e.status === 404);
    });

    test('GET /v1/responses/{id}/input_items: the input as items, paged, newest first by default', async () => {
        const r = await client.responses.create({
            model: 'chat', instructions: 'not an item',
            input: [
                { role: 'user', content: 'first' },
                { role: 'assistant', content: 'second' },
                { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'third' }] },
            ],
        });
        const asc = [];
        for await (const item of client.responses.inputItems.list(r.id, { order: 'asc' })) asc.push(item);
        assert.equal(asc.length, 3);
        assert.deepEqual(asc.map((i) => i.type), ['message', 'message', 'message']);
        assert.deepEqual(asc.map((i) => i.content[0].text), ['first', 'second', 'third']);
        assert.deepEqual(asc.map((i) => i.content[0].type), ['input_text', 'output_text', 'input_text']);
        for (const i of asc) assert.ok(typeof i.id === 'string' && i.id.length > 0);
        const raw = await fetch(`${env.api}/responses/${r.id}/input_items?order=asc`,
            { headers: { authorization: 'Bearer sk-client-anything' } });
        assertConforms('ResponseItemList', await raw.json(), 'input_items page');
        const page = await client.responses.inputItems.list(r.id, { limit: 2 });
        assert.deepEqual(page.data.map((i) => i.content[0].text), ['third', 'second']);
        assert.equal(page.has_more, true);
        const next = await page.getNextPage();
        assert.deepEqual(next.data.map((i) => i.content[0].text), ['first']);
        assert.equal(next.has_more, false);
        const s = await client.responses.create({ model: 'chat', input: 'just a string' });
        const one = await client.responses.inputItems.list(s.id);
        assert.equal(one.data.length, 1);
        assert.equal(one.data[0].role, 'user');
        assert.equal(one.data[0].content[0].text, 'just a string');
        const bad = await fetch(`${env.api}/responses/${r.id}/input_items?limit=0`,
            { headers: { authorization: 'Bearer sk-client-anything' } });
        assert.equal(bad.status, 400);
        await assert.rejects(client.responses.inputItems.list('resp_nope'), (e) => e.status === 404);
    });

    test('another credential cannot see a stored response', async () => {
        const r = await client.responses.create({ model: 'chat', input: 'mine only' });
        const other = new OpenAI({ baseURL: env.api, apiKey: 'sk-someone-else', maxRetries: 0, timeout: 15000 });
        await assert.rejects(other.responses.retrieve(r.id), (e) => e.status === 404);
        await assert.rejects(other.responses.inputItems.list(r.id), (e) => e.status === 404);
        await assert.rejects(
            other.responses.create({ model: 'chat', input: 'x', previous_response_id: r.id }),
            (e) => e.status === 404);
        assert.equal((await client.responses.retrieve(r.id)).id, r.id);
    });

    test('a chain of three turns replays every earlier turn, instructions not carried over', async () => {
        const r1 = await client.responses.create({ model: 'chat', input: 'turn one', instructions: 'first rules' });
        const r2 = await client.responses.create({ model: 'chat', input: 'turn two', previous_response_id: r1.id });
        const since = await lastSeq();
        await client.responses.create({ model: 'chat', input: 'turn three', instructions: 'third rules', previous_response_id: r2.id });
        const [up] = await upstreamSince('up-chat', since);
        const m = up.body.messages;
        assert.deepEqual(m.map((x) => x.role), ['system', 'user', 'assistant', 'user', 'assistant', 'user']);
        assert.equal(m[0].content, 'third rules');
        assert.deepEqual([m[1].content, m[3].content, m[5].content], ['turn one', 'turn two', 'turn three']);
        assert.equal(m[2].content, contentFor('up-chat'));
    });

    test('reasoning_content becomes a reasoning item with its summary, streamed and not', async () => {
        await script('up-chat', { reasoning: 'think first, then answer' });
        const r = await client.responses.create({ model: 'chat', input: 'why?' });
        assertConforms('Response', r, 'reasoning response');
        assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
        assert.match(r.output[0].id, /^rs_/);
        assert.equal(r.output[0].summary[0].text, 'think first, then answer');
        await script('up-chat', { reasoning: 'think first, then answer' });
        const stream = client.responses.stream({ model: 'chat', input: 'why?' });
        const evs = await events(stream);
        const t = types(evs);
        assert.deepEqual(t.slice(2, 5), ['response.output_item.added', 'response.reasoning_summary_part.added',
            'response.reasoning_summary_text.delta']);
        const sdone = evs.find((e) => e.type === 'response.reasoning_summary_text.done');
        assert.equal(sdone.text, 'think first, then answer');
        assert.ok(t.indexOf('response.reasoning_summary_part.done') < t.indexOf('response.content_part.added'),
            'the reasoning item closes before the message opens');
        const final = await stream.finalResponse();
        assert.deepEqual(final.output.map((o) => o.type), ['reasoning', 'message']);
    });

    test('the engine\'s token limit: status incomplete, response.incomplete ends the stream', async () => {
        for (const model of ['chat', 'ollama-chat']) {
            const r = await client.responses.create({ model, input: 'a long answer', max_output_tokens: 2 });
            assertConforms('Response', r, `${model} incomplete`);
            assert.equal(r.status, 'incomplete');
            assert.equal(r.incomplete_details.reason, 'max_output_tokens');
            assert.equal(r.output[0].status, 'incomplete');
            const stream = client.responses.stream({ model, input: 'a long answer', max_output_tokens: 2 });
            const evs = await events(stream);
            assert.equal(evs.at(-1).type, 'response.incomplete');
            assert.equal(evs.at(-1).response.id, evs[0].response.id);
            assert.equal(evs.at(-1).response.usage.output_tokens, 2);
            assert.equal((await stream.finalResponse()).status, 'incomplete');
        }
    });

    test('a parameter the bridge cannot honour is refused with 400 and its param', async () => {
        const cases = [
            [{ tools: [{ type: 'web_search' }] }, 'tools[0]'],
            [{ background: true }, 'background'],
            [{ truncation: 'auto' }, 'truncation'],
            [{ include: ['reasoning.encrypted_content'] }, 'include'],
            [{ conversation: 'conv_1' }, 'conversation'],
            [{ no_such_param: 1 }, 'no_such_param'],
            [{ input: [{ type: 'item_reference', id: 'x' }] }, 'input[0]'],
            [{ input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'f' }] }] }, 'input[0].content[0]'],
            [{ text: { format: { type: 'json_schema' } } }, 'text.format'],
        ];
        for (const [extra, param] of cases) {
            const r = await postJson(`${env.api}/responses`, { model: 'chat', input: 'x', ...extra });
            assert.equal(r.status, 400, JSON.stringify(extra));
            assertConforms('ErrorResponse', r.json, JSON.stringify(extra));
            assert.equal(r.json.error.param, param, JSON.stringify(extra));
            assert.equal(r.json.error.type, 'invalid_request_error');
        }
        await assert.rejects(client.responses.create({ model: 'no-such-model', input: 'x' }), (e) => e.status === 404);
        const empty = await postJson(`${env.api}/responses`, { model: 'chat', input: [] });
        assert.equal(empty.status, 400);
    });

    test('a stream that breaks mid-way ends with response.failed, never a clean completion', async () => {
        await script('up-chat', { reset_after_chunks: 2, chunk_delay_ms: 100 });
        const stream = client.responses.stream({ model: 'chat', input: 'break please' });
        const seen = [];
        for await (const ev of stream) seen.push(ev);
        const last = seen.at(-1);
        assert.equal(last.type, 'response.failed');
        assertEvent(last);
        assert.equal(last.response.status, 'failed');
        assert.equal(last.response.id, seen[0].response.id);
        assert.ok(!seen.some((e) => e.type === 'response.completed'));
        assert.match(last.response.error.message, /UPSTREAM_ERROR/);
    });

    test('an idempotency key runs the request once: the replay is the same Response', async () => {
        const since = await lastSeq();
        const body = { model: 'chat', input: 'only once please' };
        const headers = { 'Idempotency-Key': 'resp-idem-1', authorization: 'Bearer sk-client-anything' };
        const first = await postJson(`${env.api}/responses`, body, { headers });
        const second = await postJson(`${env.api}/responses`, body, { headers });
        assert.equal(first.status, 200, first.text);
        assert.equal(second.json.id, first.json.id);
        assert.equal(second.headers.get('idempotent-replayed'), 'true');
        assert.equal((await upstreamSince('up-chat', since)).length, 1, 'the engine was asked once');
        assert.equal((await client.responses.retrieve(first.json.id)).id, first.json.id);
    });

    test('metrics count the endpoint as responses', async () => {
        const text = await env.gw.metrics();
        assert.match(text, /endpoint="responses"/);
    });
});
