// Anthropic Messages with tenancy on (issue 20): the official @anthropic-ai/sdk authenticates
// with x-api-key (its default) or Authorization (authToken), a missing or unknown key is a
// 401 authentication_error in Anthropic's shape (count_tokens too), and the key's calls are
// charged like chat completions.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { contentFor } from '../mock/engine.mjs';
import { postJson, startEnv, waitFor } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-messages-auth-e2e-7f3a';
let env;
let key;

before(async () => {
    env = await startEnv({
        configure: (c) => ({ ...c, auth: { enabled: true }, health: { probes: false } }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
    const hdr = { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } };
    const t = await postJson(`${env.base}/api/v2/tenants`, { name: 'anthropic-clients' }, hdr);
    const k = await postJson(`${env.base}/api/v2/keys`, { tenant_id: t.json.id }, hdr);
    assert.equal(k.status, 201, k.text);
    key = k.json.key;
});

after(async () => {
    await env?.close();
});

const ask = { model: 'chat', max_tokens: 16, messages: [{ role: 'user', content: 'hello' }] };

describe('/v1/messages with auth on', () => {
    test('x-api-key (the SDK\'s default) and Authorization: Bearer both authenticate', async () => {
        const viaApiKey = new Anthropic({ baseURL: env.base, apiKey: key, maxRetries: 0 });
        const a = await viaApiKey.messages.create(ask);
        assert.equal(a.content[0].text, contentFor('up-chat'));
        const viaBearer = new Anthropic({ baseURL: env.base, apiKey: null, authToken: key, maxRetries: 0 });
        const b = await viaBearer.messages.create(ask);
        assert.equal(b.type, 'message');
        const counted = await viaApiKey.messages.countTokens({ model: 'chat', messages: ask.messages });
        assert.ok(counted.input_tokens > 0);
        const up = (await env.mock.requests((r) => r.path === '/v1/chat/completions')).at(-1);
        assert.notEqual(up.headers['x-api-key'], key, 'the client key never reaches the upstream');
        assert.ok(!String(up.headers.authorization ?? '').includes(key));
    });

    test('a missing or unknown key is 401 authentication_error, for count_tokens too', async () => {
        const bad = new Anthropic({ baseURL: env.base, apiKey: 'mg-not-a-real-key', maxRetries: 0 });
        for (const call of [() => bad.messages.create(ask), () => bad.messages.countTokens({ model: 'chat', messages: ask.messages })]) {
            await assert.rejects(call(), (err) => {
                assert.ok(err instanceof Anthropic.AuthenticationError, String(err));
                assert.equal(err.error.type, 'error');
                assert.equal(err.error.error.type, 'authentication_error');
                assert.match(err.error.error.message, /^AUTH_FAILED: /);
                return true;
            });
        }
        const r = await fetch(`${env.base}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask) });
        assert.equal(r.status, 401);
        assert.equal((await r.json()).error.type, 'authentication_error');
    });

    test('the key\'s calls are logged with the key and their tokens', async () => {
        const c = new Anthropic({ baseURL: env.base, apiKey: key, maxRetries: 0 });
        await c.messages.create({ ...ask, messages: [{ role: 'user', content: 'count these four words' }] });
        const line = await waitFor(() => env.gw.logs.find((l) => l.msg === 'request' && l.path === '/v1/messages' && l.prompt_tokens === 4), { what: 'the request line' });
        assert.ok(line.key_id > 0);
        assert.equal(line.completion_tokens, 5);
    });
});
