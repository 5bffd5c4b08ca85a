// The Vercel AI SDK (ai v7) against the gateway, through both of its OpenAI-wire providers
// (@ai-sdk/openai's chat models and @ai-sdk/openai-compatible) and on both adapters: the
// calls of sdk_openai.test.mjs as a Vercel user writes them.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { APICallError, Output, embed, embedMany, generateText, jsonSchema, stepCountIs, streamText, tool } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { z } from 'zod';
import {
    ADAPTERS, IMAGE_URL, PNG_DATA_URL, SLOW_ANSWER_MS, TOOL_ARGS, TOOLS_JSON, contentFor, embeddingFor,
    refusedRequests, scriptChat, startSdkEnv, upstream400, upstreamChats, waitUpstreamClosed,
} from './lib/sdk.mjs';

let env;
let providers;

before(async () => {
    env = await startSdkEnv();
    const openai = createOpenAI({ baseURL: env.api, apiKey: 'sk-sdk-test' });
    const compatible = createOpenAICompatible({ name: 'moongate', baseURL: env.api, apiKey: 'sk-sdk-test',
        includeUsage: true, supportsStructuredOutputs: true });
    providers = {
        '@ai-sdk/openai': { chat: (m) => openai.chat(m), embedding: (m) => openai.embedding(m) },
        '@ai-sdk/openai-compatible': { chat: (m) => compatible.chatModel(m), embedding: (m) => compatible.embeddingModel(m) },
    };
});

after(async () => {
    await env?.close();
});

const sdkTools = (...names) => Object.fromEntries(names.map((n) => [n,
    tool({ description: TOOLS_JSON[n].description, inputSchema: jsonSchema(TOOLS_JSON[n].parameters) })]));

/** The rejection of p (null when it resolved). */
const rejection = (p) => Promise.resolve(p).then(() => null, (e) => e);

for (const providerName of ['@ai-sdk/openai', '@ai-sdk/openai-compatible']) {
    for (const adapter of Object.keys(ADAPTERS)) {
        const { chat, up, embed: embedModel } = ADAPTERS[adapter];
        const model = () => providers[providerName].chat(chat);

        describe(`${providerName} on the ${adapter} adapter`, () => {
            test('text: generateText with its usage', async () => {
                const r = await generateText({ model: model(), prompt: 'hello' });
                assert.equal(r.text, contentFor(up));
                assert.equal(r.finishReason, 'stop');
                assert.ok(r.usage.outputTokens > 0 && r.usage.inputTokens > 0, JSON.stringify(r.usage));
            });

            test('a stream with usage: streamText', async () => {
                const r = streamText({ model: model(), prompt: 'hello' });
                let text = '';
                for await (const t of r.textStream) text += t;
                assert.equal(text, contentFor(up));
                const usage = await r.usage;
                assert.ok(usage.outputTokens > 0, JSON.stringify(usage));
                assert.equal(await r.finishReason, 'stop');
            });

            test('tools: a named toolChoice gets that tool called (no ToolChoiceViolationError)', async () => {
                await scriptChat(env, adapter, { tool_calls: 'first', arguments: TOOL_ARGS });
                const r = await generateText({ model: model(), prompt: 'time?', tools: sdkTools('weather', 'clock'),
                    toolChoice: { type: 'tool', toolName: 'clock' } });
                assert.deepEqual(r.toolCalls.map((c) => [c.toolName, c.input]), [['clock', TOOL_ARGS.clock]]);
                assert.equal(r.finishReason, 'tool-calls');
            });

            test('tools: toolChoice none answers in text', async () => {
                await scriptChat(env, adapter, { tool_calls: 'first', arguments: TOOL_ARGS });
                const r = await generateText({ model: model(), prompt: 'weather?', tools: sdkTools('weather'),
                    toolChoice: 'none' });
                assert.equal(r.toolCalls.length, 0);
                assert.equal(r.text, contentFor(up));
            });

            test('tools: parallel calls', async () => {
                await scriptChat(env, adapter, { tool_calls: 'all', arguments: TOOL_ARGS });
                const r = await generateText({ model: model(), prompt: 'both', tools: sdkTools('weather', 'clock') });
                assert.deepEqual(r.toolCalls.map((c) => c.toolName), ['weather', 'clock']);
                assert.deepEqual(r.toolCalls.map((c) => c.input), [TOOL_ARGS.weather, TOOL_ARGS.clock]);
                assert.equal(new Set(r.toolCalls.map((c) => c.toolCallId)).size, 2);
            });

            test('tools: streamed deltas assemble into the calls', async () => {
                await scriptChat(env, adapter, { tool_calls: 'all', arguments: TOOL_ARGS });
                const r = streamText({ model: model(), prompt: 'both', tools: sdkTools('weather', 'clock') });
                const parts = [];
                for await (const p of r.fullStream) parts.push(p);
                const calls = parts.filter((p) => p.type === 'tool-call');
                assert.deepEqual(calls.map((c) => [c.toolName, c.input]), [['weather', TOOL_ARGS.weather], ['clock', TOOL_ARGS.clock]]);
                assert.ok(!parts.some((p) => p.type === 'error'), JSON.stringify(parts.find((p) => p.type === 'error')));
            });

            test('tools: a round trip, the SDK running the tool and answering', async () => {
                await scriptChat(env, adapter, { tool_calls: 'first', arguments: TOOL_ARGS }, 2);
                const weather = tool({ description: 'weather', inputSchema: z.object({ city: z.string() }),
                    execute: async ({ city }) => `22C in ${city}` });
                const r = await generateText({ model: model(), prompt: 'weather in Paris?', tools: { weather },
                    stopWhen: stepCountIs(3) });
                assert.equal(r.text, contentFor(up));
                assert.equal(r.steps.length, 2);
                const sent = (await upstreamChats(env, adapter)).at(-1).body.messages;
                assert.equal(sent.at(-1).role, 'tool');
                assert.match(JSON.stringify(sent.at(-1).content), /22C in Paris/);
            });

            test('structured output: Output.object with a zod schema', async () => {
                const r = await generateText({ model: model(), prompt: 'who?',
                    output: Output.object({ schema: z.object({ name: z.string(), age: z.number() }) }) });
                assert.deepEqual(r.output, { name: 'mock', age: 1 });
            });

            test('embeddings: embed and embedMany', async () => {
                const e = providers[providerName].embedding(embedModel);
                const one = await embed({ model: e, value: 'alpha' });
                assert.deepEqual(one.embedding, embeddingFor('alpha'));
                const many = await embedMany({ model: e, values: ['beta', 'gamma'] });
                assert.deepEqual(many.embeddings, [embeddingFor('beta'), embeddingFor('gamma')]);
            });

            test('images: bytes are served (as a data URL)', async () => {
                const r = await generateText({ model: model(), messages: [{ role: 'user', content: [
                    { type: 'text', text: 'what is this?' },
                    { type: 'image', image: PNG_DATA_URL.split(',')[1], mediaType: 'image/png' }] }] });
                assert.equal(r.text, contentFor(up));
            });

            // (@ai-sdk/openai-compatible downloads an image URL itself, and refuses one on
            // 127.0.0.1: what reaches the gateway from it is the data URL above)
            if (providerName === '@ai-sdk/openai') test(adapter === 'openai' ? 'images: new URL(...) is forwarded'
                : 'encode refusal: new URL(...) is a 400 naming the param, not retried', async () => {
                const before = await refusedRequests(env, chat);
                const call = rejection(generateText({ model: model(), maxRetries: 2, messages: [{ role: 'user', content: [
                    { type: 'text', text: 'what is this?' }, { type: 'image', image: new URL(IMAGE_URL) }] }] }));
                if (adapter === 'openai') {
                    assert.equal(await call, null);
                    return;
                }
                const err = await call;
                assert.ok(APICallError.isInstance(err), String(err));
                assert.equal(err.statusCode, 400);
                assert.equal(err.isRetryable, false);
                assert.equal(JSON.parse(err.responseBody).error.param, 'messages[0].content[1].image_url.url');
                assert.equal(await refusedRequests(env, chat, before + 1) - before, 1, 'one request');
            });

            test('abort mid-stream: the upstream request is closed too', async () => {
                await scriptChat(env, adapter, { chunks: 30, chunk_delay_ms: 100 });
                const ac = new AbortController();
                const r = streamText({ model: model(), prompt: 'long', abortSignal: ac.signal });
                let seen = 0;
                const err = await rejection((async () => {
                    for await (const t of r.textStream) {
                        if (t) seen++;
                        if (seen === 2) ac.abort();
                    }
                })());
                assert.ok(seen >= 2 && seen < 30, `${seen} pieces (${err})`);
                await waitUpstreamClosed(env, adapter);
            });

            test('fault: a whole answer slower than the first-byte timeout arrives, once', async () => {
                await scriptChat(env, adapter, { delay_first_byte_ms: SLOW_ANSWER_MS });
                const before = (await upstreamChats(env, adapter)).length;
                const r = await generateText({ model: model(), prompt: 'slow' });
                assert.equal(r.text, contentFor(up));
                assert.equal((await upstreamChats(env, adapter)).length - before, 1);
            });

            test('fault: the upstream\'s own 400 keeps its code, not retried', async () => {
                await scriptChat(env, adapter, upstream400(adapter));
                const err = await rejection(generateText({ model: model(), prompt: 'too long' }));
                assert.ok(APICallError.isInstance(err), String(err));
                assert.equal(err.statusCode, 400);
                assert.equal(err.isRetryable, false);
                const body = JSON.parse(err.responseBody).error;
                if (adapter === 'openai') {
                    assert.equal(body.code, 'context_length_exceeded');
                    assert.equal(body.param, 'messages');
                }
                assert.ok(body.request_id);
            });

            test('fault: a garbage stream line is an error part, after the text before it', async () => {
                await scriptChat(env, adapter, { garbage_after_chunks: 2 });
                const r = streamText({ model: model(), prompt: 'garbage', onError: () => {} });
                const parts = [];
                for await (const p of r.fullStream) parts.push(p);
                const text = parts.filter((p) => p.type === 'text-delta').map((p) => p.text).join('');
                assert.ok(text.length > 0, 'the text before it arrived');
                assert.ok(parts.some((p) => p.type === 'error'), `an error part: ${parts.map((p) => p.type).join(',')}`);
            });

            if (adapter === 'ollama' && providerName === '@ai-sdk/openai-compatible')
                test('reasoning: Ollama\'s thinking is the reasoning text, streamed and whole', async () => {
                    const thinking = 'Think first, then answer.';
                    await scriptChat(env, adapter, { thinking }, 2);
                    const r = await generateText({ model: model(), prompt: 'hello' });
                    assert.equal(r.reasoningText, thinking);
                    assert.equal(r.text, contentFor(up));
                    const s = streamText({ model: model(), prompt: 'hello' });
                    const parts = [];
                    for await (const p of s.fullStream) parts.push(p);
                    const reasoning = parts.filter((p) => p.type === 'reasoning-delta').map((p) => p.text).join('');
                    assert.equal(reasoning, thinking);
                    assert.equal(await s.text, contentFor(up));
                });

            test('fault: EOF after the finish chunk, without [DONE], is a complete answer', async () => {
                await scriptChat(env, adapter, { no_done: true });
                const r = streamText({ model: model(), prompt: 'eof' });
                const parts = [];
                for await (const p of r.fullStream) parts.push(p);
                assert.ok(!parts.some((p) => p.type === 'error'), 'no error part');
                assert.equal(await r.text, contentFor(up));
                assert.equal(await r.finishReason, 'stop');
            });
        });
    }
}
