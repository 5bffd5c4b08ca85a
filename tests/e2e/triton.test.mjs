// The Triton adapter (issue 20): Triton's generate extension (KServe v2) served through the
// gateway to the official openai v6 SDK. The mock engine speaks Triton's wire format
// (/v2/models/{model}/generate and generate_stream, {"error": text} errors).

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startEnv } from './lib/harness.mjs';
import { contentFor } from '../mock/engine.mjs';

const UP = 'ensemble';
let env;
let client;

before(async () => {
    env = await startEnv({
        configure(config, e) {
            config.providers = [
                { id: 'triton-local', adapter: 'triton', base_url: `http://127.0.0.1:${e.mock.port}`, local: true },
            ];
            config.models = { 'triton-chat': { routes: [{ provider: 'triton-local', model: UP }] } };
            return config;
        },
    });
    client = new OpenAI({ baseURL: env.api, apiKey: 'sk-triton-test', maxRetries: 0, timeout: 10000 });
});

after(async () => {
    await env?.close();
});

const user = (content) => [{ role: 'user', content }];
const generateRequests = (kind) => env.mock.requests((r) => r.path === `/v2/models/${UP}/${kind}`);

describe('triton adapter', () => {
    test('chat: the prompt and parameters reach /generate as Triton inputs; text_output is the answer', async () => {
        const before = (await generateRequests('generate')).length;
        const r = await client.chat.completions.create({ model: 'triton-chat',
            messages: [{ role: 'system', content: 'be brief' }, ...user('hello there')],
            max_tokens: 50, temperature: 0.2, seed: 7, stop: 'END' });
        assert.equal(r.choices[0].message.content, contentFor(UP));
        assert.equal(r.choices[0].finish_reason, 'stop');
        assert.equal(r.model, 'triton-chat');
        assert.ok(r.usage.total_tokens > 0, 'usage counted by the gateway');
        const seen = (await generateRequests('generate')).slice(before);
        assert.equal(seen.length, 1);
        const b = seen[0].body;
        assert.equal(b.text_input, 'system: be brief\nuser: hello there\nassistant:');
        assert.equal(b.max_tokens, 50);
        assert.equal(b.temperature, 0.2);
        assert.equal(b.random_seed, 7);
        assert.deepEqual(b.stop_words, ['END']);
        assert.equal(b.stream, false);
    });

    test('chat stream: generate_stream pieces become deltas; the stream ends without a marker and is complete', async () => {
        const stream = await client.chat.completions.create({ model: 'triton-chat', messages: user('hello'),
            stream: true, stream_options: { include_usage: true } });
        let text = '';
        const finishes = [];
        let usage = null;
        for await (const chunk of stream) {
            text += chunk.choices[0]?.delta?.content ?? '';
            if (chunk.choices[0]?.finish_reason) finishes.push(chunk.choices[0].finish_reason);
            if (chunk.usage) usage = chunk.usage;
        }
        assert.equal(text, contentFor(UP));
        assert.deepEqual(finishes, ['stop']);
        assert.ok(usage && usage.completion_tokens > 0);
        const last = (await generateRequests('generate_stream')).at(-1);
        assert.equal(last.body.text_input, 'hello', 'a lone user message is sent as it is');
        assert.equal(last.body.stream, true);
    });

    test('the vLLM backend\'s finish_reason and token counts are used', async () => {
        await env.mock.script({ model: UP, times: 2, action: { finish_reason: 'length', token_counts: true } });
        const r = await client.chat.completions.create({ model: 'triton-chat', messages: user('one two three') });
        assert.equal(r.choices[0].finish_reason, 'length');
        assert.equal(r.usage.prompt_tokens, 3);
        assert.equal(r.usage.completion_tokens, 5);
        const stream = await client.chat.completions.create({ model: 'triton-chat', messages: user('one two'),
            stream: true, stream_options: { include_usage: true } });
        const finishes = [];
        let usage = null;
        for await (const chunk of stream) {
            if (chunk.choices[0]?.finish_reason) finishes.push(chunk.choices[0].finish_reason);
            if (chunk.usage) usage = chunk.usage;
        }
        assert.deepEqual(finishes, ['length']);
        assert.equal(usage.prompt_tokens, 2);
    });

    test('completions: prompt sent as text_input', async () => {
        const r = await client.completions.create({ model: 'triton-chat', prompt: 'say hi', max_tokens: 20 });
        assert.equal(r.choices[0].text, contentFor(UP));
        assert.equal((await generateRequests('generate')).at(-1).body.text_input, 'say hi');
    });

    test('Triton\'s {"error": text} on a 400 reaches the client as a 400 with its text', async () => {
        await env.mock.script({ model: UP, times: 1,
            action: { status: 400, body: { error: 'input token count 9000 exceeds the model maximum 4096' } } });
        await assert.rejects(client.chat.completions.create({ model: 'triton-chat', messages: user('long') }), (err) => {
            assert.equal(err.status, 400);
            assert.match(err.message, /exceeds the model maximum/);
            return true;
        });
    });

    test('an error event mid-stream ends the client\'s stream with an error, not a clean close', async () => {
        await env.mock.script({ model: UP, times: 1, action: { error_after_chunks: 2, chunk_delay_ms: 10 } });
        const stream = await client.chat.completions.create({ model: 'triton-chat', messages: user('hello'), stream: true });
        let text = '';
        await assert.rejects((async () => {
            for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
        })(), /inference failed/);
        assert.ok(text.length > 0, 'the pieces before the error arrived');
    });

    test('what Triton cannot do is refused with 400, never dropped: tools, images, n > 1, embeddings', async () => {
        const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }];
        const cases = [
            [{ messages: user('x'), tools }, 'tools'],
            [{ messages: user([{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }]) }, 'messages[0].content[0].type'],
            [{ messages: user('x'), n: 2 }, 'n'],
        ];
        for (const [body, param] of cases) {
            await assert.rejects(client.chat.completions.create({ model: 'triton-chat', ...body }), (err) => {
                assert.equal(err.status, 400, param);
                assert.equal(err.param, param);
                return true;
            });
        }
        await assert.rejects(client.embeddings.create({ model: 'triton-chat', input: 'x' }), (err) => err.status === 400);
    });
});
