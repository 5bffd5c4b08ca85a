// The OpenAI-compatible surface driven by the official `openai` npm client: chat (stream and
// not), completions, embeddings, models, errors, the Ollama adapter, request sanitizing and
// credentials. Every object the gateway returns is checked against the official OpenAPI document.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startEnv, postJson, postStream, TEST_KEY } from './lib/harness.mjs';
import { assertConforms } from './lib/conformance.mjs';
import { contentFor, embeddingFor } from '../mock/engine.mjs';

const EXTENSIONS = ['priority', 'session_id', 'idempotency_key', 'timeouts', 'routing', 'context_policy',
    'max_output_tokens', 'metadata'];

let env;
let client;

before(async () => {
    env = await startEnv({
        configure(c, e) {
            // an upstream that refuses stream_options, and one that reads metadata as its own
            c.providers.push({ id: 'mock-plain', adapter: 'openai', base_url: `http://127.0.0.1:${e.mock.port}/v1`,
                stream_usage: false, forward: ['metadata'] });
            c.models.plain = { routes: [{ provider: 'mock-plain', model: 'up-plain' }] };
            return c;
        },
    });
    client = new OpenAI({ baseURL: env.api, apiKey: 'sk-client-anything', maxRetries: 0, timeout: 15000 });
});

after(async () => {
    await env?.close();
});

const messages = [{ role: 'user', content: 'hello there gateway' }];

/** The mock's records of requests for one upstream model (optionally only after seq `since`). */
async function upstreamRequests(model, since = 0) {
    return env.mock.requests((r) => r.seq > since && r.body && typeof r.body === 'object' && r.body.model === model);
}

async function lastSeq() {
    const all = await env.mock.requests();
    return all.length ? all.at(-1).seq : 0;
}

function assertTiming(t, what) {
    assert.ok(t && typeof t === 'object', `${what}: timing object present`);
    for (const k of ['queue_ms', 'first_token_ms', 'total_ms']) {
        assert.equal(typeof t[k], 'number', `${what}: timing.${k} is a number (got ${JSON.stringify(t)})`);
        assert.ok(t[k] >= 0, `${what}: timing.${k} >= 0`);
    }
}

/** Collect every chunk of an SDK stream. */
async function collect(stream) {
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    return chunks;
}

describe('chat completions (openai SDK)', () => {
    test('non-stream: OpenAI object plus request_id, logical_model, actual_model, timing, X-Request-Id', async () => {
        const since = await lastSeq();
        const { data, response } = await client.chat.completions.create({ model: 'chat', messages }).withResponse();
        assertConforms('CreateChatCompletionResponse', data, 'chat completion');
        const rid = response.headers.get('x-request-id');
        assert.ok(rid, 'X-Request-Id header present');
        assert.equal(data.request_id, rid, 'body request_id equals X-Request-Id');
        assert.equal(data.logical_model, 'chat');
        assert.equal(data.actual_model, 'up-chat');
        assert.equal(data.model, 'chat', '`model` is the name the client sent (the upstream\'s is actual_model)');
        assert.match(data.node_id, /^.+:\d+$/, 'node_id: cluster.node_id, by default host name and port');
        assertTiming(data.timing, 'chat');
        assert.equal(data.object, 'chat.completion');
        assert.equal(data.choices[0].message.role, 'assistant');
        assert.equal(data.choices[0].message.content, contentFor('up-chat'));
        assert.equal(data.choices[0].finish_reason, 'stop');
        assert.equal(data.usage.prompt_tokens, 3);
        assert.equal(data.usage.completion_tokens, 5);

        const seen = await upstreamRequests('up-chat', since);
        assert.equal(seen.length, 1, 'exactly one upstream request');
        assert.equal(seen[0].path, '/v1/chat/completions');

        const log = await env.gw.requestLog(rid);
        assert.equal(log.status, 200);
        assert.equal(log.model, 'chat');
        assert.equal(log.provider, 'mock-openai');
        assert.equal(log.actual_model, 'up-chat');
        assert.equal(log.node_id, data.node_id, 'every log line says which instance');
        assert.equal(log.stream, false);
        assert.equal(log.outcome, 'ok');
        assert.equal(log.method, 'POST');
        assert.equal(log.path, '/v1/chat/completions');
        assert.equal(log.prompt_tokens, 3);
        assert.equal(log.completion_tokens, 5);
        assert.equal(typeof log.duration_ms, 'number');
    });

    test('stream: metadata on the role chunk, usage + timing on the finish chunk, no usage-only chunk', async () => {
        const since = await lastSeq();
        const { data: stream, response } = await client.chat.completions
            .create({ model: 'chat', messages, stream: true }).withResponse();
        assert.match(response.headers.get('content-type') ?? '', /text\/event-stream/);
        const rid = response.headers.get('x-request-id');
        assert.ok(rid, 'X-Request-Id header present on a stream');
        const chunks = await collect(stream);
        assert.ok(chunks.length >= 3, `got ${chunks.length} chunks`);
        chunks.forEach((c, i) => assertConforms('CreateChatCompletionStreamResponse', c, `chunk ${i}`));

        const first = chunks[0];
        assert.equal(first.choices[0]?.delta?.role, 'assistant', 'first chunk carries delta.role');
        assert.equal(first.request_id, rid);
        assert.equal(first.logical_model, 'chat');
        assert.equal(first.actual_model, 'up-chat');
        assert.equal(typeof first.node_id, 'string');

        assert.ok(chunks.every((c) => c.choices.length > 0), 'no usage-only chunk when include_usage was not asked');
        const fin = chunks.filter((c) => c.choices[0]?.finish_reason);
        assert.equal(fin.length, 1, 'exactly one chunk has finish_reason');
        assert.equal(fin[0], chunks.at(-1), 'the finish chunk is the last chunk');
        assert.equal(fin[0].choices[0].finish_reason, 'stop');
        assert.equal(fin[0].usage?.prompt_tokens, 3, 'finish chunk carries usage');
        assert.equal(fin[0].usage?.completion_tokens, 5);
        assertTiming(fin[0].timing, 'finish chunk');
        const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
        assert.equal(text, contentFor('up-chat'));
        assert.ok(chunks.every((c) => c.model === 'chat'), 'every chunk names the model as the client did');

        const seen = await upstreamRequests('up-chat', since);
        assert.equal(seen.length, 1);
        assert.equal(seen[0].body.stream, true);
        assert.equal(seen[0].body.stream_options?.include_usage, true, 'the gateway asks the upstream for usage');

        const log = await env.gw.requestLog(rid);
        assert.equal(log.stream, true);
        assert.equal(log.outcome, 'ok');
        assert.equal(log.completion_tokens, 5);
        assert.equal(typeof log.first_token_ms, 'number');
    });

    test('stream with include_usage: the usage-only chunk (choices: []) is forwarded last', async () => {
        const chunks = await collect(await client.chat.completions.create({
            model: 'chat', messages, stream: true, stream_options: { include_usage: true },
        }));
        chunks.forEach((c, i) => assertConforms('CreateChatCompletionStreamResponse', c, `chunk ${i}`));
        const last = chunks.at(-1);
        assert.deepEqual(last.choices, [], 'last chunk is the usage-only chunk');
        assert.equal(last.usage?.prompt_tokens, 3);
        assert.equal(last.usage?.completion_tokens, 5);
        assert.equal(last.usage?.total_tokens, 8);
        assert.equal(chunks.filter((c) => c.choices.length === 0).length, 1);
        // once: the finish chunk carries no usage when the client asked for the usage chunk
        const finish = chunks.find((c) => c.choices[0]?.finish_reason);
        assert.ok(finish, 'a finish chunk');
        assert.ok(!finish.usage, `usage is not repeated on the finish chunk: ${JSON.stringify(finish)}`);
        assert.ok(finish.timing, 'the finish chunk still carries timing');
    });

    test('stream on the wire: text/event-stream frames, each JSON, ending with data: [DONE]', async () => {
        const s = await postStream(`${env.api}/chat/completions`, { model: 'chat', messages, stream: true });
        assert.equal(s.status, 200);
        assert.equal(s.error, null, `stream transfer failed: ${s.error}`);
        assert.ok(s.headers.get('x-request-id'));
        assert.equal(s.data.at(-1), '[DONE]');
        assert.equal(s.data.filter((d) => d === '[DONE]').length, 1);
        for (const ev of s.events.slice(0, -1)) {
            assert.ok(!ev.__unparsed, `frame is JSON: ${ev.__unparsed}`);
            assert.equal(ev.object, 'chat.completion.chunk');
        }
    });
});

describe('"model" in answers is the name the client sent', () => {
    test('a pinned provider ("chat:mock-openai"): the whole name, stream and not', async () => {
        const data = await client.chat.completions.create({ model: 'chat:mock-openai', messages });
        assert.equal(data.model, 'chat:mock-openai');
        assert.equal(data.actual_model, 'up-chat');
        const stream = await client.chat.completions.create({ model: 'chat:mock-openai', messages, stream: true,
            stream_options: { include_usage: true } });
        const chunks = await collect(stream);
        assert.ok(chunks.length > 3);
        assert.deepEqual([...new Set(chunks.map((c) => c.model))], ['chat:mock-openai'],
            'role, content, finish and usage chunks alike');
    });

    test('embeddings', async () => {
        const r = await client.embeddings.create({ model: 'embed', input: 'x' });
        assert.equal(r.model, 'embed');
    });
});

describe('completions, embeddings, models', () => {
    test('completions non-stream', async () => {
        const { data, response } = await client.completions.create({ model: 'chat', prompt: 'say hi' }).withResponse();
        assertConforms('CreateCompletionResponse', data, 'completion');
        assert.equal(data.object, 'text_completion');
        assert.equal(data.choices[0].text, contentFor('up-chat'));
        assert.equal(data.request_id, response.headers.get('x-request-id'));
        assert.equal(data.logical_model, 'chat');
        assertTiming(data.timing, 'completion');
        const seen = (await env.mock.requests()).at(-1);
        assert.equal(seen.path, '/v1/completions');
        assert.equal(seen.body.prompt, 'say hi');
    });

    test('completions stream ends with [DONE] and carries the text', async () => {
        const s = await postStream(`${env.api}/completions`, { model: 'chat', prompt: 'say hi', stream: true });
        assert.equal(s.status, 200);
        assert.equal(s.data.at(-1), '[DONE]');
        const text = s.events.slice(0, -1).map((e) => e.choices?.[0]?.text ?? '').join('');
        assert.equal(text, contentFor('up-chat'));
        const fin = s.events.find((e) => e.choices?.[0]?.finish_reason);
        assert.ok(fin, 'a chunk has finish_reason');
        assertConforms('CreateCompletionResponse', fin, 'finishing completion chunk');
    });

    test('embeddings with encoding_format float', async () => {
        const { data, response } = await client.embeddings.create({
            model: 'embed', input: ['alpha', 'beta'], encoding_format: 'float',
        }).withResponse();
        assertConforms('CreateEmbeddingResponse', data, 'embeddings');
        assert.equal(data.data.length, 2);
        assert.deepEqual(data.data[0].embedding, embeddingFor('alpha'));
        assert.deepEqual(data.data[1].embedding, embeddingFor('beta'));
        assert.ok(response.headers.get('x-request-id'));
        const seen = (await env.mock.requests()).at(-1);
        assert.equal(seen.path, '/v1/embeddings');
        assert.equal(seen.body.model, 'up-embed');
    });

    test('embeddings with the SDK default (base64) decode to the same vectors', async () => {
        const data = await client.embeddings.create({ model: 'embed', input: 'gamma' });
        assert.deepEqual(Array.from(data.data[0].embedding), embeddingFor('gamma'));
    });

    test('models list: every logical model, OpenAI shape', async () => {
        const r = await env.gw.getJson('/v1/models');
        assert.equal(r.status, 200);
        assertConforms('ListModelsResponse', r.json, 'models list');
        const ids = r.json.data.map((m) => m.id).sort();
        assert.deepEqual(ids, Object.keys(env.config.models).sort());
        for (const m of r.json.data) {
            assert.equal(m.object, 'model');
            assert.equal(m.owned_by, 'moongate');
            assert.ok(Number.isInteger(m.created));
        }
        const viaSdk = [];
        for await (const m of client.models.list()) viaSdk.push(m.id);
        assert.deepEqual(viaSdk.sort(), ids);
    });

    test('models.retrieve: each logical model, OpenAI shape; an unknown one is 404 MODEL_NOT_FOUND', async () => {
        for (const id of Object.keys(env.config.models)) {
            const m = await client.models.retrieve(id);
            assert.equal(m.id, id);
            assert.equal(m.object, 'model');
            assert.equal(m.owned_by, 'moongate');
            assertConforms('Model', JSON.parse(JSON.stringify(m)), `model ${id}`);
        }
        for (const id of ['no-such-model', 'org/no-such-model']) {
            await assert.rejects(client.models.retrieve(id), (e) => {
                assert.ok(e instanceof OpenAI.NotFoundError, `got ${e?.constructor?.name}: ${e?.message}`);
                assert.equal(e.code, 'MODEL_NOT_FOUND');
                return true;
            });
        }
        const bad = await env.gw.getJson('/v1/models/%zz');
        assert.equal(bad.status, 404);
    });
});

describe('errors through the SDK', () => {
    test('unknown model -> 404 NotFoundError, code MODEL_NOT_FOUND', async () => {
        await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages }), (e) => {
            assert.ok(e instanceof OpenAI.NotFoundError, `got ${e?.constructor?.name}: ${e?.message}`);
            assert.equal(e.status, 404);
            assert.equal(e.code, 'MODEL_NOT_FOUND');
            assert.equal(typeof e.error?.message, 'string');
            assert.ok(e.requestID, 'X-Request-Id on errors');
            assert.equal(e.error?.request_id, e.requestID);
            return true;
        });
    });

    test('missing messages -> 400 BadRequestError, code INVALID_REQUEST', async () => {
        await assert.rejects(client.chat.completions.create({ model: 'chat' }), (e) => {
            assert.ok(e instanceof OpenAI.BadRequestError, `got ${e?.constructor?.name}: ${e?.message}`);
            assert.equal(e.code, 'INVALID_REQUEST');
            return true;
        });
    });

    test('malformed JSON -> 400 with an OpenAI error body', async () => {
        const r = await postJson(`${env.api}/chat/completions`, '{"model": "chat", "messages": [');
        assert.equal(r.status, 400);
        assertConforms('ErrorResponse', r.json, 'error body');
        assert.equal(r.json.error.code, 'INVALID_REQUEST');
        assert.equal(r.json.error.type, 'invalid_request_error');
        assert.equal(r.json.error.request_id, r.headers.get('x-request-id'));
    });

    test('unknown model error body conforms', async () => {
        const r = await postJson(`${env.api}/chat/completions`, { model: 'no-such-model', messages });
        assert.equal(r.status, 404);
        assertConforms('ErrorResponse', r.json, 'error body');
    });
});

describe('ollama adapter', () => {
    test('chat non-stream goes to /api/chat with stream:false and comes back in OpenAI shape', async () => {
        const since = await lastSeq();
        const data = await client.chat.completions.create({ model: 'ollama-chat', messages });
        assertConforms('CreateChatCompletionResponse', data, 'ollama chat completion');
        assert.equal(data.choices[0].message.content, contentFor('up-ollama-chat'));
        assert.equal(data.choices[0].finish_reason, 'stop');
        assert.equal(data.usage?.prompt_tokens, 3);
        assert.equal(data.usage?.completion_tokens, 5);
        assert.equal(data.logical_model, 'ollama-chat');
        assert.equal(data.actual_model, 'up-ollama-chat');
        assert.equal(data.model, 'ollama-chat', 'the name the client sent');
        const [seen] = await upstreamRequests('up-ollama-chat', since);
        assert.ok(seen, 'the mock saw the request');
        assert.equal(seen.path, '/api/chat');
        assert.equal(seen.body.stream, false);
        assert.deepEqual(seen.body.messages, messages);
    });

    test('chat stream: NDJSON upstream becomes chat.completion.chunk frames', async () => {
        const since = await lastSeq();
        const { data: stream, response } = await client.chat.completions
            .create({ model: 'ollama-chat', messages, stream: true }).withResponse();
        const chunks = await collect(stream);
        chunks.forEach((c, i) => assertConforms('CreateChatCompletionStreamResponse', c, `ollama chunk ${i}`));
        assert.equal(chunks[0].choices[0]?.delta?.role, 'assistant');
        assert.equal(chunks[0].request_id, response.headers.get('x-request-id'));
        assert.equal(chunks[0].logical_model, 'ollama-chat');
        assert.ok(chunks.every((c) => c.model === 'ollama-chat'), 'every chunk names the client\'s model');
        const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
        assert.equal(text, contentFor('up-ollama-chat'));
        const fin = chunks.filter((c) => c.choices[0]?.finish_reason);
        assert.equal(fin.length, 1);
        assert.equal(fin[0].choices[0].finish_reason, 'stop');
        assert.equal(fin[0].usage?.prompt_tokens, 3, 'usage from prompt_eval_count');
        assert.equal(fin[0].usage?.completion_tokens, 5, 'usage from eval_count');
        assertTiming(fin[0].timing, 'ollama finish chunk');
        const [seen] = await upstreamRequests('up-ollama-chat', since);
        assert.equal(seen.path, '/api/chat');
        assert.notEqual(seen.body.stream, false, 'the upstream is asked to stream');
    });

    test('embeddings through /api/embed', async () => {
        const since = await lastSeq();
        const data = await client.embeddings.create({ model: 'ollama-embed', input: ['one', 'two'], encoding_format: 'float' });
        assertConforms('CreateEmbeddingResponse', data, 'ollama embeddings');
        assert.deepEqual(data.data.map((d) => d.embedding), [embeddingFor('one'), embeddingFor('two')]);
        assert.deepEqual(data.data.map((d) => d.index), [0, 1]);
        const [seen] = await upstreamRequests('up-ollama-embed', since);
        assert.equal(seen.path, '/api/embed');
        assert.deepEqual(seen.body.input, ['one', 'two']);
    });

    test('embeddings with the SDK default (base64) through the ollama adapter', async () => {
        const data = await client.embeddings.create({ model: 'ollama-embed', input: 'three' });
        assert.deepEqual(Array.from(data.data[0].embedding), embeddingFor('three'));
    });
});

describe('request sanitizing and credentials', () => {
    const ext = () => ({
        priority: 'P1',
        idempotency_key: `e2e-${process.pid}-${Date.now()}-${Math.random()}`,
        timeouts: { queue_ms: 5000, first_token_ms: 10000, inference_ms: 60000 },
        routing: { local_only: false, allow_smaller_model: true },
        context_policy: 'summary_and_recent',
        max_output_tokens: 3,
        metadata: { application: 'e2e', user_id: 'u-1' },
    });
    // the extensions with a fresh session's id (an unknown one is 404 SESSION_NOT_FOUND; an
    // empty session adds no history, so the messages reach the upstream as sent)
    const withSession = async () => {
        const r = await fetch(`${env.api}/sessions`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
        return { ...ext(), session_id: (await r.json()).id };
    };

    test('openai wire: extensions stripped, max_output_tokens -> max_tokens, upstream model substituted', async () => {
        const since = await lastSeq();
        const data = await client.chat.completions.create({ model: 'chat', messages, temperature: 0.5, ...(await withSession()) });
        assert.equal(data.choices[0].message.content, contentFor('up-chat', 3));
        assert.equal(data.choices[0].finish_reason, 'length');
        const [seen] = await upstreamRequests('up-chat', since);
        assert.ok(seen, 'the mock saw the request with model = upstream name');
        for (const k of EXTENSIONS) assert.ok(!(k in seen.body), `extension ${k} must not reach the upstream`);
        assert.equal(seen.body.max_tokens, 3);
        assert.equal(seen.body.temperature, 0.5, 'standard fields pass through');
        assert.deepEqual(seen.body.messages, messages);
    });

    test('openai wire, plain body: every member passes through in order, model substituted, also past 32 members', async () => {
        for (const extra of [3, 40]) { // the fast path keeps up to 32 members; more are scanned again
            const since = await lastSeq();
            const body = { model: 'chat', messages };
            for (let i = 0; i < extra; i++) body[`x_${i}`] = i % 2 ? { n: i, s: `v${i}` } : [i, `w${i}`];
            body.stream = true;
            const s = await postStream(`${env.api}/chat/completions`, body);
            assert.equal(s.status, 200);
            assert.equal(s.data.at(-1), '[DONE]');
            const [seen] = await upstreamRequests('up-chat', since);
            assert.ok(seen, `the mock saw the request (${extra} extra members)`);
            const want = ['messages', ...Array.from({ length: extra }, (_, i) => `x_${i}`), 'stream', 'model', 'stream_options'];
            assert.deepEqual(Object.keys(seen.body), want);
            for (let i = 0; i < extra; i++) assert.deepEqual(seen.body[`x_${i}`], body[`x_${i}`]);
            assert.deepEqual(seen.body.stream_options, { include_usage: true });
        }
    });

    test('openai wire: a client max_tokens wins over max_output_tokens', async () => {
        const since = await lastSeq();
        await client.chat.completions.create({ model: 'chat', messages, ...(await withSession()), max_tokens: 4 });
        const [seen] = await upstreamRequests('up-chat', since);
        assert.equal(seen.body.max_tokens, 4);
        assert.ok(!('max_output_tokens' in seen.body));
    });

    test('openai wire stream: extensions stripped too', async () => {
        const since = await lastSeq();
        await collect(await client.chat.completions.create({ model: 'chat', messages, stream: true, ...(await withSession()) }));
        const [seen] = await upstreamRequests('up-chat', since);
        for (const k of EXTENSIONS) assert.ok(!(k in seen.body), `extension ${k} must not reach the upstream`);
        assert.equal(seen.body.max_tokens, 3);
    });

    test('ollama wire: extensions stripped, max_output_tokens -> options.num_predict', async () => {
        const since = await lastSeq();
        const data = await client.chat.completions.create({ model: 'ollama-chat', messages, ...(await withSession()) });
        assert.equal(data.choices[0].message.content, contentFor('up-ollama-chat', 3));
        assert.equal(data.choices[0].finish_reason, 'length');
        const [seen] = await upstreamRequests('up-ollama-chat', since);
        for (const k of EXTENSIONS) assert.ok(!(k in seen.body), `extension ${k} must not reach the upstream`);
        assert.equal(seen.body.options?.num_predict, 3);
    });

    test('Authorization: the provider key for the keyed provider, nothing for the others', async () => {
        const since = await lastSeq();
        await client.chat.completions.create({ model: 'chat', messages });
        await client.chat.completions.create({ model: 'ollama-chat', messages });
        await client.chat.completions.create({ model: 'dead-first', messages }); // served by mock-openai-b
        const keyed = await upstreamRequests('up-chat', since);
        assert.equal(keyed[0].headers.authorization, `Bearer ${TEST_KEY}`);
        const ollama = await upstreamRequests('up-ollama-chat', since);
        assert.equal(ollama[0].headers.authorization, undefined, 'no Authorization to the keyless ollama provider');
        const b = await upstreamRequests('up-after-dead', since);
        assert.equal(b.length, 1);
        assert.equal(b[0].headers.authorization, undefined, 'no Authorization to the keyless provider');
        const all = await env.mock.requests();
        for (const r of all) {
            assert.ok(!JSON.stringify(r.headers).includes('sk-client-anything'),
                'the client key never reaches an upstream');
        }
    });

    test('the provider key never appears in the gateway logs', async () => {
        // let the last request lines be written
        await env.gw.waitLog((l) => l.msg === 'request' && l.model === 'dead-first', { timeoutMs: 5000 });
        const out = env.gw.stdoutText();
        assert.ok(!out.includes(TEST_KEY), 'key found in stdout');
        assert.ok(!env.gw.stderr.includes(TEST_KEY), 'key found in stderr');
        assert.deepEqual(env.gw.nonJsonLines(), [], 'every stdout line is a JSON object');
    });
});

// Extensions that collide with real parameters, and providers that refuse stream_options
// (issue 18.8 and 18.9).
describe('what each upstream gets', () => {
    test('stream_usage: false sends no stream_options; the stream still ends with [DONE]', async () => {
        const since = await lastSeq();
        const s = await postStream(`${env.api}/chat/completions`,
            { model: 'plain', messages, stream: true, stream_options: { include_usage: true } });
        assert.equal(s.status, 200);
        assert.equal(s.data.at(-1), '[DONE]');
        const [seen] = await upstreamRequests('up-plain', since);
        assert.ok(!('stream_options' in seen.body), `no stream_options upstream: ${JSON.stringify(seen.body)}`);
    });

    test('metadata reaches a provider with forward: [metadata], and no other', async () => {
        const metadata = { application: 'none-configured', note: 'kept' };
        let since = await lastSeq();
        assert.equal((await postJson(`${env.api}/chat/completions`, { model: 'plain', messages, metadata })).status, 200);
        const [plain] = await upstreamRequests('up-plain', since);
        assert.deepEqual(plain.body.metadata, metadata);
        since = await lastSeq();
        assert.equal((await postJson(`${env.api}/chat/completions`, { model: 'chat', messages, metadata })).status, 200);
        const [chat] = await upstreamRequests('up-chat', since);
        assert.ok(!('metadata' in chat.body), 'a provider that does not ask for it never sees it');
    });
});
