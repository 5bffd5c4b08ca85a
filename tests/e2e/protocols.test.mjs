// The protocols section (issue 20): keep-alive pings on client streams while the upstream is
// silent, in the client's own protocol (an SSE comment for OpenAI-wire and Responses clients,
// Anthropic's event: ping for Messages clients), and the configurable allowlist of client
// headers handed to an adapter (protocols.forward_headers). The mock stalls between frames
// (chunk_delay_ms) far longer than the ping interval; nothing here asserts on timing beyond
// "a ping came between two frames that were 600 ms apart with a 100 ms interval".

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { contentFor } from '../mock/engine.mjs';
import { gatewayBin, postStream, startEnv, toYaml } from './lib/harness.mjs';

const STALL = { chunks: 3, chunk_delay_ms: 600 };
let env;

before(async () => {
    env = await startEnv({
        configure: (c, e) => {
            c.protocols = {
                ping_interval_ms: 100,
                forward_headers: { anthropic: ['anthropic-*', 'X-Trace-Id'] },
            };
            c.providers.push({ id: 'mock-anthropic', adapter: 'anthropic', base_url: `http://127.0.0.1:${e.mock.port}`,
                api_key: 'sk-ant-upstream-key' });
            c.models['claude-native'] = { routes: [{ provider: 'mock-anthropic', model: 'claude-up' }] };
            c.models['claude-chat'] = { routes: [{ provider: 'mock-openai', model: 'up-claude' }] };
            return c;
        },
    });
});

after(async () => {
    await env?.close();
});

/** The raw SSE text split at frame boundaries. */
const frames = (text) => text.split('\n\n').filter((f) => f.length);

describe('pings while the upstream is silent', () => {
    test('OpenAI wire: ": ping" comments between stalled chunks; the SDK reads the stream intact', async () => {
        await env.mock.script({ model: 'up-chat', times: 2, action: STALL });
        const r = await postStream(`${env.api}/chat/completions`, { model: 'chat', stream: true,
            messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(r.status, 200);
        const f = frames(r.text);
        const first = f.findIndex((x) => x.startsWith('data: {'));
        const pingsAfter = f.slice(first).filter((x) => x === ': ping').length;
        assert.ok(pingsAfter >= 1, `pings between the stalled chunks: ${JSON.stringify(f)}`);
        assert.equal(f.at(-1), 'data: [DONE]');

        const client = new OpenAI({ baseURL: env.api, apiKey: 'sk-x', maxRetries: 0, timeout: 15000 });
        let text = '';
        for await (const chunk of await client.chat.completions.create({ model: 'chat', stream: true,
            messages: [{ role: 'user', content: 'hi' }] })) text += chunk.choices[0]?.delta?.content ?? '';
        assert.equal(text, contentFor('up-chat', 3));
    });

    test('Responses: the same comments, the event sequence unchanged for the SDK', async () => {
        await env.mock.script({ model: 'up-chat', times: 1, action: STALL });
        const client = new OpenAI({ baseURL: env.api, apiKey: 'sk-x', maxRetries: 0, timeout: 15000 });
        const raw = await postStream(`${env.api}/responses`, { model: 'chat', stream: true, input: 'hi', store: false });
        assert.ok(frames(raw.text).includes(': ping'), 'a ping on the Responses stream');
        await env.mock.script({ model: 'up-chat', times: 1, action: STALL });
        const final = await client.responses.stream({ model: 'chat', input: 'hi', store: false }).finalResponse();
        assert.equal(final.output_text, contentFor('up-chat', 3));
    });

    test('Anthropic Messages: event: ping during the silence; the SDK\'s finalMessage is whole', async () => {
        await env.mock.script({ model: 'up-claude', times: 2, action: STALL });
        const r = await postStream(`${env.base}/v1/messages`, { model: 'claude-chat', max_tokens: 64, stream: true,
            messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'anthropic-version': '2023-06-01' } });
        const f = frames(r.text);
        const firstDelta = f.findIndex((x) => x.startsWith('event: content_block_delta'));
        assert.ok(firstDelta > 0, JSON.stringify(f));
        const pings = f.slice(firstDelta).filter((x) => x.startsWith('event: ping\ndata: {"type": "ping"}'));
        assert.ok(pings.length >= 1, `pings after the first delta: ${JSON.stringify(f)}`);
        assert.ok(!f.includes(': ping'), 'no OpenAI-style comment on an Anthropic stream');

        const client = new Anthropic({ baseURL: env.base, apiKey: 'sk-client', maxRetries: 0, timeout: 15000 });
        const msg = await client.messages.stream({ model: 'claude-chat', max_tokens: 64,
            messages: [{ role: 'user', content: 'hi' }] }).finalMessage();
        assert.equal(msg.content[0].text, contentFor('up-claude', 3));
    });

    test('a stream that never stalls gets no ping', async () => {
        const r = await postStream(`${env.api}/chat/completions`, { model: 'chat', stream: true,
            messages: [{ role: 'user', content: 'hi' }] });
        assert.ok(!frames(r.text).includes(': ping'), r.text);
    });
});

describe('protocols.forward_headers', () => {
    test('the adapter gets the allowlisted client headers (prefix and name), no others', async () => {
        const client = new Anthropic({ baseURL: env.base, apiKey: 'sk-client', maxRetries: 0, timeout: 15000 });
        await client.messages.create({ model: 'claude-native', max_tokens: 32, messages: [{ role: 'user', content: 'hi' }] },
            { headers: { 'anthropic-beta': 'b1', 'anthropic-custom-flag': 'on', 'x-trace-id': 't-42', 'x-other': 'no' } });
        const up = (await env.mock.requests((r) => r.path === '/v1/messages' && r.body?.model === 'claude-up')).at(-1);
        assert.equal(up.headers['anthropic-beta'], 'b1');
        assert.equal(up.headers['anthropic-custom-flag'], 'on');
        assert.equal(up.headers['x-trace-id'], 't-42');
        assert.equal(up.headers['x-other'], undefined);
        assert.equal(up.headers['x-api-key'], 'sk-ant-upstream-key', 'the client\'s key never goes upstream');
    });

    test('--check refuses credentials on the list and a bad ping interval', () => {
        const dir = fs.mkdtempSync(path.join(env.dir, 'check-'));
        const check = (protocols) => {
            const cfg = toYaml({ ...env.config, protocols });
            const p = path.join(dir, 'c.yaml');
            fs.writeFileSync(p, cfg);
            try {
                execFileSync(gatewayBin(), ['--check', '-c', p], { stdio: 'pipe' });
                return { ok: true, out: '' };
            } catch (err) {
                return { ok: false, out: String(err.stdout) + String(err.stderr) };
            }
        };
        const key = check({ forward_headers: { anthropic: ['x-api-key'] } });
        assert.equal(key.ok, false);
        assert.match(key.out, /never forwarded/);
        const ping = check({ ping_interval_ms: 5 });
        assert.equal(ping.ok, false);
        assert.match(ping.out, /ping_interval_ms/);
        assert.equal(check({ ping_interval_ms: 0 }).ok, true);
    });
});
