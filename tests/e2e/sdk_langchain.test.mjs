// LangChain JS (@langchain/openai's ChatOpenAI and OpenAIEmbeddings) against the gateway, on
// both adapters: the calls of sdk_openai.test.mjs as a LangChain user writes them. LangChain
// retries what it judges retryable (it retried the old encode 502 seven times): the faults
// here must reach it as what they are, once.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ChatOpenAI, OpenAIEmbeddings } from '@langchain/openai';
import { AIMessage, HumanMessage, ToolMessage } from '@langchain/core/messages';
import { z } from 'zod';
import {
    ADAPTERS, IMAGE_URL, PNG_DATA_URL, SLOW_ANSWER_MS, TOOL_ARGS, TOOLS_JSON, contentFor, embeddingFor,
    refusedRequests, scriptChat, startSdkEnv, upstream400, upstreamChats, waitUpstreamClosed,
} from './lib/sdk.mjs';

let env;

before(async () => {
    env = await startSdkEnv();
});

after(async () => {
    await env?.close();
});

const lcTools = (...names) => names.map((name) => ({ type: 'function', function: { name, ...TOOLS_JSON[name] } }));
const rejection = (p) => Promise.resolve(p).then(() => null, (e) => e);

for (const adapter of Object.keys(ADAPTERS)) {
    const { chat, up, embed } = ADAPTERS[adapter];
    const llm = (opts = {}) => new ChatOpenAI({ model: chat, apiKey: 'sk-sdk-test', maxRetries: 3,
        configuration: { baseURL: env.api }, ...opts });

    describe(`LangChain ChatOpenAI on the ${adapter} adapter`, () => {
        test('text: invoke, with usage_metadata', async () => {
            const m = await llm().invoke('hello');
            assert.equal(m.content, contentFor(up));
            assert.ok(m.usage_metadata.total_tokens > 0);
            assert.equal(m.response_metadata.finish_reason, 'stop');
        });

        test('a stream with usage: the chunks concatenate, usage once', async () => {
            let full;
            let withUsage = 0;
            for await (const chunk of await llm({ streamUsage: true }).stream('hello')) {
                full = full ? full.concat(chunk) : chunk;
                if (chunk.usage_metadata?.output_tokens > 0) withUsage++;
            }
            assert.equal(full.content, contentFor(up));
            assert.equal(withUsage, 1, 'usage once');
            assert.ok(full.usage_metadata.total_tokens > 0);
        });

        test('tools: a named tool_choice gets that tool called', async () => {
            await scriptChat(env, adapter, { tool_calls: 'first', arguments: TOOL_ARGS });
            const m = await llm().bindTools(lcTools('weather', 'clock'), { tool_choice: 'clock' }).invoke('time?');
            assert.deepEqual(m.tool_calls.map((c) => [c.name, c.args]), [['clock', TOOL_ARGS.clock]]);
        });

        test('tools: tool_choice none answers in text', async () => {
            await scriptChat(env, adapter, { tool_calls: 'first', arguments: TOOL_ARGS });
            const m = await llm().bindTools(lcTools('weather'), { tool_choice: 'none' }).invoke('weather?');
            assert.equal(m.tool_calls.length, 0);
            assert.equal(m.content, contentFor(up));
        });

        test('tools: parallel calls', async () => {
            await scriptChat(env, adapter, { tool_calls: 'all', arguments: TOOL_ARGS });
            const m = await llm().bindTools(lcTools('weather', 'clock')).invoke('both');
            assert.deepEqual(m.tool_calls.map((c) => [c.name, c.args]),
                [['weather', TOOL_ARGS.weather], ['clock', TOOL_ARGS.clock]]);
        });

        test('tools: streamed deltas assemble into the calls', async () => {
            await scriptChat(env, adapter, { tool_calls: 'all', arguments: TOOL_ARGS });
            let full;
            for await (const chunk of await llm().bindTools(lcTools('weather', 'clock')).stream('both'))
                full = full ? full.concat(chunk) : chunk;
            assert.deepEqual(full.tool_calls.map((c) => [c.name, c.args]),
                [['weather', TOOL_ARGS.weather], ['clock', TOOL_ARGS.clock]]);
        });

        test('tools: a round trip (call, ToolMessage, answer)', async () => {
            await scriptChat(env, adapter, { tool_calls: 'first', arguments: TOOL_ARGS }, 2);
            const model = llm().bindTools(lcTools('weather'));
            const messages = [new HumanMessage('weather in Paris?')];
            const call = await model.invoke(messages);
            assert.ok(call instanceof AIMessage);
            messages.push(call, new ToolMessage({ tool_call_id: call.tool_calls[0].id, content: '22C' }));
            const answer = await model.invoke(messages);
            assert.equal(answer.content, contentFor(up));
            const sent = (await upstreamChats(env, adapter)).at(-1).body.messages;
            assert.equal(sent.at(-1).role, 'tool');
            assert.equal(sent.at(-1).content, '22C');
        });

        test('structured output: withStructuredOutput(zod, jsonSchema)', async () => {
            const out = await llm().withStructuredOutput(z.object({ name: z.string(), age: z.number() }),
                { name: 'person', method: 'jsonSchema' }).invoke('who?');
            assert.deepEqual(out, { name: 'mock', age: 1 });
        });

        test('embeddings: embedQuery and embedDocuments', async () => {
            const e = new OpenAIEmbeddings({ model: embed, apiKey: 'sk-sdk-test', configuration: { baseURL: env.api } });
            assert.deepEqual(await e.embedQuery('alpha'), embeddingFor('alpha'));
            assert.deepEqual(await e.embedDocuments(['beta', 'gamma']), [embeddingFor('beta'), embeddingFor('gamma')]);
        });

        test('images: a data URL is served', async () => {
            const m = await llm().invoke([new HumanMessage({ content: [
                { type: 'text', text: 'what is this?' }, { type: 'image_url', image_url: { url: PNG_DATA_URL } }] })]);
            assert.equal(m.content, contentFor(up));
        });

        test(adapter === 'openai' ? 'images: an https URL is forwarded'
            : 'encode refusal: an https image is a 400 naming the param, not retried', async () => {
            const before = await refusedRequests(env, chat);
            const call = rejection(llm().invoke([new HumanMessage({ content: [
                { type: 'text', text: 'what is this?' }, { type: 'image_url', image_url: { url: IMAGE_URL } }] })]));
            if (adapter === 'openai') {
                assert.equal(await call, null);
                return;
            }
            const err = await call;
            assert.equal(err?.status, 400, String(err));
            assert.equal(err.param, 'messages[0].content[1].image_url.url');
            assert.equal(err.code, 'INVALID_REQUEST');
            assert.equal(await refusedRequests(env, chat, before + 1) - before, 1, 'one request: not retried');
        });

        test('abort mid-stream: the upstream request is closed too', async () => {
            await scriptChat(env, adapter, { chunks: 30, chunk_delay_ms: 100 });
            const ac = new AbortController();
            let seen = 0;
            const err = await rejection((async () => {
                for await (const chunk of await llm().stream('long', { signal: ac.signal })) {
                    if (chunk.content) seen++;
                    if (seen === 2) ac.abort();
                }
            })());
            assert.ok(seen >= 2 && seen < 30, `${seen} pieces (${err})`);
            await waitUpstreamClosed(env, adapter);
        });

        test('fault: a whole answer slower than the first-byte timeout arrives, once', async () => {
            await scriptChat(env, adapter, { delay_first_byte_ms: SLOW_ANSWER_MS });
            const before = (await upstreamChats(env, adapter)).length;
            const m = await llm().invoke('slow');
            assert.equal(m.content, contentFor(up));
            assert.equal((await upstreamChats(env, adapter)).length - before, 1);
        });

        test('fault: the upstream\'s own 400 keeps its code, not retried', async () => {
            await scriptChat(env, adapter, upstream400(adapter)); // a retry would succeed
            const before = (await upstreamChats(env, adapter)).length;
            const err = await rejection(llm().invoke('too long'));
            assert.ok(err, 'the 400 reaches the caller');
            if (adapter === 'openai') {
                // LangChain recognises the upstream's own code and says what it means
                assert.equal(err.name, 'ContextOverflowError', String(err));
                assert.match(err.message, /maximum context length/);
            } else {
                assert.equal(err.status, 400, String(err));
                assert.match(err.message, /context length exceeded/);
            }
            assert.equal((await upstreamChats(env, adapter)).length - before, 1, 'not retried');
        });

        test('fault: a garbage stream line is an API error, not a SyntaxError', async () => {
            await scriptChat(env, adapter, { garbage_after_chunks: 2 });
            let text = '';
            const err = await rejection((async () => {
                for await (const chunk of await llm({ maxRetries: 0 }).stream('garbage')) text += chunk.content;
            })());
            assert.ok(err, 'the stream ends with an error');
            assert.ok(!(err instanceof SyntaxError), `${err?.constructor?.name}: ${err}`);
            assert.match(String(err?.message), /invalid|upstream|stream/i);
            assert.ok(text.length > 0, 'the chunks before it arrived');
        });

        test('fault: EOF after the finish chunk, without [DONE], is a complete answer', async () => {
            await scriptChat(env, adapter, { no_done: true });
            let full;
            for await (const chunk of await llm().stream('eof')) full = full ? full.concat(chunk) : chunk;
            assert.equal(full.content, contentFor(up));
        });
    });
}
