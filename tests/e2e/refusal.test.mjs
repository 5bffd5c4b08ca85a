// Encode refusals (issue 18.2): a request an adapter cannot send is the client's error when it
// is the client's input. "Not for this route" tries the next route and, when no route takes
// the request, answers 400 INVALID_REQUEST with the adapter's reason and the offending param;
// "invalid request" answers that at once. Never a 5xx, never Retry-After or a degradation
// header, and the upstream sees nothing.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, postJson } from './lib/harness.mjs';

let env;

before(async () => {
    env = await startEnv({
        extraModels: {
            // the Ollama route first, an OpenAI-wire route behind it
            'ollama-then-openai': {
                routes: [{ provider: 'mock-ollama', model: 'up-refuse-ollama' },
                    { provider: 'mock-openai-b', model: 'up-refuse-openai', priority: 1 }],
            },
        },
    });
});

after(async () => {
    await env?.close();
});

const chat = (model, messages, extra = {}) =>
    postJson(`${env.api}/chat/completions`, { model, messages, ...extra });

async function upstreamCount(model) {
    return (await env.mock.requests((r) => r.body?.model === model)).length;
}

function assertRefused(r, param, reason) {
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.code, 'INVALID_REQUEST');
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(r.json.error.param, param);
    assert.match(r.json.error.message, reason);
    assert.ok(r.json.error.request_id, 'the gateway request_id is added');
    assert.equal(r.headers.get('retry-after'), null, 'a retry cannot help');
    assert.equal(r.headers.get('x-sidecar-degraded'), null, 'not the end of a degradation chain');
}

const imageByUrl = [{ type: 'text', text: 'what is this?' },
    { type: 'image_url', image_url: { url: 'https://example.invalid/cat.png' } }];

describe('the Ollama adapter alone', () => {
    test('an https image_url: 400 with the reason and the param, nothing sent upstream', async () => {
        for (const stream of [false, true]) {
            const r = await chat('ollama-chat', [{ role: 'user', content: 'hi' },
                { role: 'user', content: imageByUrl }], { stream });
            assertRefused(r, 'messages[1].content[1].image_url.url', /Ollama cannot fetch image URLs/);
        }
        assert.equal(await upstreamCount('up-ollama-chat'), 0);
    });

    test('input_audio and file parts: 400 naming the part', async () => {
        for (const part of [{ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } },
            { type: 'file', file: { file_id: 'file-1' } }]) {
            const r = await chat('ollama-chat', [{ role: 'user', content: [part] }]);
            assertRefused(r, 'messages[0].content[0].type', new RegExp(part.type));
        }
    });

    test('a token-array embedding input: 400 param input', async () => {
        const r = await postJson(`${env.api}/embeddings`, { model: 'ollama-embed', input: [[1, 2, 3]] });
        assertRefused(r, 'input', /token arrays/);
        assert.equal(await upstreamCount('up-ollama-embed'), 0);
    });

    test('a token prompt on /v1/completions: 400 param prompt', async () => {
        const r = await postJson(`${env.api}/completions`, { model: 'ollama-chat', prompt: [1, 2, 3] });
        assertRefused(r, 'prompt', /token arrays/);
    });
});

describe('an Ollama route with an OpenAI-wire route behind it', () => {
    test('not for this route: the next route serves the image by URL', async () => {
        const r = await chat('ollama-then-openai', [{ role: 'user', content: imageByUrl }]);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.actual_model, 'up-refuse-openai');
        assert.equal(await upstreamCount('up-refuse-ollama'), 0);
    });

    test('the route that could serve it failing upstream decides: its 502, not the refusal', async () => {
        await env.mock.script({ model: 'up-refuse-openai', times: 3, action: { status: 500 } });
        const r = await chat('ollama-then-openai', [{ role: 'user', content: imageByUrl }]);
        assert.equal(r.status, 502, r.text);
        assert.equal(r.json.error.code, 'MODEL_UNAVAILABLE');
        await env.mock.reset();
    });

    test('invalid JSON in an earlier tool call: 400 at once, no route tried', async () => {
        const before = await upstreamCount('up-refuse-openai');
        const r = await chat('ollama-then-openai', [
            { role: 'user', content: 'weather?' },
            { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
                function: { name: 'weather', arguments: '{"city": "Paris"' } }] },
            { role: 'tool', tool_call_id: 'call_1', content: '22C' }]);
        assertRefused(r, 'messages[1].tool_calls[0].function.arguments', /not valid JSON/);
        assert.equal(await upstreamCount('up-refuse-openai'), before, 'the OpenAI route is not tried');
        assert.equal(await upstreamCount('up-refuse-ollama'), 0);
    });

    test('the request log says the request was refused, not failed upstream', async () => {
        const r = await chat('ollama-chat', [{ role: 'user', content: imageByUrl }]);
        assert.equal(r.status, 400);
        const line = await env.gw.requestLog(r.headers.get('x-request-id'));
        assert.equal(line.status, 400);
        assert.equal(line.error, 'INVALID_REQUEST');
        assert.equal(line.fail_reason, 'refused');
        assert.equal(line.attempts, 0);
    });
});
