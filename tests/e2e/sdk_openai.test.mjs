// The official openai v6 SDK against the gateway, on both adapters (issue 18, the SDK suite):
// what a new user's first calls do, and the faults that used to make it retry, hide or throw
// on a complete answer. The same calls go through the Vercel AI SDK (sdk_vercel) and
// LangChain (sdk_langchain).

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import {
    ADAPTERS, IMAGE_URL, PNG_DATA_URL, SLOW_ANSWER_MS, TOOL_ARGS, TOOLS_JSON, contentFor, embeddingFor,
    refusedRequests, scriptChat, startSdkEnv, upstream400, upstreamChats, waitUpstreamClosed,
} from './lib/sdk.mjs';
import { waitFor } from './lib/harness.mjs';

let env;
let client;

before(async () => {
    env = await startSdkEnv();
    client = new OpenAI({ baseURL: env.api, apiKey: 'sk-sdk-test', maxRetries: 2, timeout: 10000 });
});

after(async () => {
    await env?.close();
});

const tools = (...names) => names.map((name) => ({ type: 'function', function: { name, ...TOOLS_JSON[name] } }));
const user = (content) => [{ role: 'user', content }];

for (const adapter of Object.keys(ADAPTERS)) {
    const { chat: model, up, embed } = ADAPTERS[adapter];

    describe(`openai v6 SDK on the ${adapter} adapter`, () => {
        test('text: the answer, usage, and the name the client sent', async () => {
            const r = await client.chat.completions.create({ model, messages: user('hello') });
            assert.equal(r.choices[0].message.content, contentFor(up));
            assert.equal(r.choices[0].finish_reason, 'stop');
            assert.equal(r.model, model);
            assert.ok(r.usage.total_tokens > 0);
        });

        test('a stream with usage: deltas, then one usage chunk with no choices', async () => {
            const stream = await client.chat.completions.create({ model, messages: user('hello'), stream: true,
                stream_options: { include_usage: true } });
            let text = '';
            const usages = [];
            for await (const chunk of stream) {
                text += chunk.choices[0]?.delta?.content ?? '';
                if (chunk.usage) usages.push(chunk);
            }
            assert.equal(text, contentFor(up));
            assert.equal(usages.length, 1, 'usage once');
            assert.deepEqual(usages[0].choices, []);
            assert.ok(usages[0].usage.completion_tokens > 0);
        });

        test('.stream().finalChatCompletion()', async () => {
            const final = await client.chat.completions.stream({ model, messages: user('hello'),
                stream_options: { include_usage: true } }).finalChatCompletion();
            assert.equal(final.choices[0].message.content, contentFor(up));
            assert.ok(final.usage.total_tokens > 0);
        });

        test('tools: a named tool_choice gets that tool called, not the first', async () => {
            await scriptChat(env, adapter, { tool_calls: 'first', arguments: TOOL_ARGS });
            const r = await client.chat.completions.create({ model, messages: user('time?'),
                tools: tools('weather', 'clock'), tool_choice: { type: 'function', function: { name: 'clock' } } });
            const calls = r.choices[0].message.tool_calls;
            assert.equal(calls.length, 1);
            assert.equal(calls[0].function.name, 'clock');
            assert.deepEqual(JSON.parse(calls[0].function.arguments), TOOL_ARGS.clock);
            assert.equal(r.choices[0].finish_reason, 'tool_calls');
        });

        test('tools: tool_choice none answers in text', async () => {
            await scriptChat(env, adapter, { tool_calls: 'first', arguments: TOOL_ARGS });
            const r = await client.chat.completions.create({ model, messages: user('weather?'),
                tools: tools('weather'), tool_choice: 'none' });
            assert.equal(r.choices[0].message.tool_calls ?? undefined, undefined);
            assert.equal(r.choices[0].message.content, contentFor(up));
        });

        test('tools: parallel calls, each with its id and arguments', async () => {
            await scriptChat(env, adapter, { tool_calls: 'all', arguments: TOOL_ARGS });
            const r = await client.chat.completions.create({ model, messages: user('both'), tools: tools('weather', 'clock') });
            const calls = r.choices[0].message.tool_calls;
            assert.deepEqual(calls.map((c) => c.function.name), ['weather', 'clock']);
            assert.equal(new Set(calls.map((c) => c.id)).size, 2);
            assert.deepEqual(calls.map((c) => JSON.parse(c.function.arguments)), [TOOL_ARGS.weather, TOOL_ARGS.clock]);
        });

        test('tools: streamed deltas assemble into the calls', async () => {
            await scriptChat(env, adapter, { tool_calls: 'all', arguments: TOOL_ARGS });
            const final = await client.chat.completions.stream({ model, messages: user('both'),
                tools: tools('weather', 'clock') }).finalChatCompletion();
            const calls = final.choices[0].message.tool_calls;
            assert.deepEqual(calls.map((c) => c.function.name), ['weather', 'clock']);
            assert.deepEqual(JSON.parse(calls[1].function.arguments), TOOL_ARGS.clock);
            assert.equal(final.choices[0].finish_reason, 'tool_calls');
        });

        test('tools: a round trip (call, result, answer)', async () => {
            await scriptChat(env, adapter, { tool_calls: 'first', arguments: TOOL_ARGS }, 2);
            const messages = user('weather in Paris?');
            const first = await client.chat.completions.create({ model, messages, tools: tools('weather') });
            const call = first.choices[0].message.tool_calls[0];
            messages.push(first.choices[0].message, { role: 'tool', tool_call_id: call.id, content: '22C' });
            const second = await client.chat.completions.create({ model, messages, tools: tools('weather') });
            assert.equal(second.choices[0].message.content, contentFor(up));
            const sent = (await upstreamChats(env, adapter)).at(-1).body.messages;
            assert.equal(sent.at(-1).role, 'tool');
            assert.equal(sent.at(-1).content, '22C');
        });

        test('structured output: json_schema through the zod helper, parsed', async () => {
            const Person = z.object({ name: z.string(), age: z.number() });
            const r = await client.chat.completions.parse({ model, messages: user('who?'),
                response_format: zodResponseFormat(Person, 'person') });
            assert.deepEqual(r.choices[0].message.parsed, { name: 'mock', age: 1 });
        });

        test('embeddings: base64 (the SDK default) and float', async () => {
            const b64 = await client.embeddings.create({ model: embed, input: ['alpha', 'beta'] });
            assert.deepEqual(b64.data.map((d) => d.embedding), [embeddingFor('alpha'), embeddingFor('beta')]);
            const flt = await client.embeddings.create({ model: embed, input: 'gamma', encoding_format: 'float' });
            assert.deepEqual(flt.data[0].embedding, embeddingFor('gamma'));
        });

        test('images: a data URL is served', async () => {
            const r = await client.chat.completions.create({ model, messages: user([
                { type: 'text', text: 'what is this?' }, { type: 'image_url', image_url: { url: PNG_DATA_URL } }]) });
            assert.equal(r.choices[0].message.content, contentFor(up));
        });

        test(adapter === 'openai' ? 'images: an https URL is forwarded'
            : 'encode refusal: an https image is a 400 naming the param, not retried', async () => {
            const messages = user([{ type: 'text', text: 'what is this?' }, { type: 'image_url', image_url: { url: IMAGE_URL } }]);
            if (adapter === 'openai') {
                const r = await client.chat.completions.create({ model, messages });
                assert.equal(r.choices[0].message.content, contentFor(up));
                return;
            }
            const before = await refusedRequests(env, model);
            const err = await client.chat.completions.create({ model, messages }).then(() => null, (e) => e);
            assert.ok(err instanceof OpenAI.BadRequestError, String(err));
            assert.equal(err.code, 'INVALID_REQUEST');
            assert.equal(err.param, 'messages[0].content[1].image_url.url');
            assert.match(err.message, /cannot fetch image URLs/);
            assert.equal(await refusedRequests(env, model, before + 1) - before, 1, 'one request: a 400 is not retried');
        });

        test('abort mid-stream: the upstream request is closed too', async () => {
            await scriptChat(env, adapter, { chunks: 30, chunk_delay_ms: 100 });
            const ac = new AbortController();
            const stream = await client.chat.completions.create({ model, messages: user('long'), stream: true },
                { signal: ac.signal });
            let seen = 0;
            for await (const chunk of stream) { // the SDK ends an aborted stream's loop quietly
                if (chunk.choices[0]?.delta?.content) seen++;
                if (seen === 2) ac.abort();
            }
            assert.ok(seen >= 2 && seen < 30, `${seen} content chunks before the abort ended it`);
            await waitUpstreamClosed(env, adapter);
        });

        test('abort before the first byte: APIUserAbortError, the upstream request closed', async () => {
            await scriptChat(env, adapter, { delay_first_byte_ms: 3000 });
            const ac = new AbortController();
            const call = client.chat.completions.create({ model, messages: user('wait'), stream: true },
                { signal: ac.signal }).then(() => null, (e) => e);
            await waitFor(async () => (await upstreamChats(env, adapter)).some((r) => r.body?.messages?.some(
                (m) => m.content === 'wait') && !r.ended_at), { timeoutMs: 3000, what: 'the request upstream' });
            ac.abort();
            const err = await call;
            assert.ok(err instanceof OpenAI.APIUserAbortError, String(err));
            await waitUpstreamClosed(env, adapter);
        });

        test('fault: a whole answer slower than the first-byte timeout arrives, once', async () => {
            await scriptChat(env, adapter, { delay_first_byte_ms: SLOW_ANSWER_MS });
            const before = (await upstreamChats(env, adapter)).length;
            const r = await client.chat.completions.create({ model, messages: user('slow') });
            assert.equal(r.choices[0].message.content, contentFor(up));
            assert.equal((await upstreamChats(env, adapter)).length - before, 1, 'one upstream generation');
        });

        test('fault: the upstream\'s own 400 keeps its code and param', async () => {
            await scriptChat(env, adapter, upstream400(adapter));
            const err = await client.chat.completions.create({ model, messages: user('too long') }).then(() => null, (e) => e);
            assert.ok(err instanceof OpenAI.BadRequestError, String(err));
            if (adapter === 'openai') {
                assert.equal(err.code, 'context_length_exceeded');
                assert.equal(err.param, 'messages');
                assert.match(err.message, /maximum context length/);
            } else {
                assert.match(err.message, /context length exceeded/);
            }
            assert.ok(err.error.request_id, 'the gateway request_id added');
        });

        test('fault: a garbage stream line is an APIError, not a SyntaxError', async () => {
            await scriptChat(env, adapter, { garbage_after_chunks: 2 });
            const stream = await client.chat.completions.create({ model, messages: user('garbage'), stream: true });
            let text = '';
            const err = await (async () => {
                for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
            })().then(() => null, (e) => e);
            assert.ok(err instanceof OpenAI.APIError, `${err?.constructor?.name}: ${err}`);
            assert.ok(!(err instanceof SyntaxError));
            assert.ok(text.length > 0, 'the chunks before it arrived');
        });

        test('fault: EOF after the finish chunk, without [DONE], is a complete answer', async () => {
            await scriptChat(env, adapter, { no_done: true });
            const final = await client.chat.completions.stream({ model, messages: user('eof'),
                stream_options: { include_usage: true } }).finalChatCompletion();
            assert.equal(final.choices[0].message.content, contentFor(up));
            assert.equal(final.choices[0].finish_reason, 'stop');
        });
    });
}

describe('reasoning on the ollama adapter', () => {
    const { chat: model, up } = ADAPTERS.ollama;
    const thinking = 'The user greets; greet back.';

    test('reasoning_effort reaches Ollama as think; thinking comes back as reasoning_content', async () => {
        await scriptChat(env, 'ollama', { thinking });
        const r = await client.chat.completions.create({ model, messages: user('hello'), reasoning_effort: 'low' });
        assert.equal(r.choices[0].message.reasoning_content, thinking);
        assert.equal(r.choices[0].message.content, contentFor(up));
        assert.equal((await upstreamChats(env, 'ollama')).at(-1).body.think, true);
    });

    test('a stream sends the thinking as it arrives, before the answer', async () => {
        await scriptChat(env, 'ollama', { thinking });
        const stream = await client.chat.completions.create({ model, messages: user('hello'), stream: true,
            reasoning_effort: 'medium' });
        const order = [];
        let reasoning = '';
        let text = '';
        for await (const chunk of stream) {
            const d = chunk.choices[0]?.delta ?? {};
            if (d.reasoning_content) { reasoning += d.reasoning_content; order.push('r'); }
            if (d.content) { text += d.content; order.push('c'); }
        }
        assert.equal(reasoning, thinking);
        assert.equal(text, contentFor(up));
        assert.equal(order.indexOf('c'), order.lastIndexOf('r') + 1, `reasoning first: ${order.join('')}`);
        assert.ok(order.filter((o) => o === 'r').length >= 2, 'in pieces, as it arrived');
    });
});

test('models.retrieve: the logical model, and 404 for an unknown one', async () => {
    const m = await client.models.retrieve(ADAPTERS.ollama.chat);
    assert.equal(m.id, ADAPTERS.ollama.chat);
    assert.equal(m.object, 'model');
    const err = await client.models.retrieve('no-such-model').then(() => null, (e) => e);
    assert.ok(err instanceof OpenAI.NotFoundError, String(err));
});
