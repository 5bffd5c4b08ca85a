// Open mode and the default application (issue 23): a request that names no application
// counts against auth.default_application, one that names another counts against that one.
// (With auth on, the key's application rules: admin.test.mjs.)

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, postJson } from './lib/harness.mjs';

let env;

before(async () => {
    env = await startEnv({
        configure: (c) => ({
            ...c,
            auth: { enabled: false, default_application: 'fallback-app' },
            applications: { 'fallback-app': { allowed_models: ['embed'] }, 'chat-app': { allowed_models: ['chat'] } },
        }),
    });
});

after(async () => {
    await env?.close();
});

const chat = (metadata) => postJson(`${env.api}/chat/completions`,
    { model: 'chat', messages: [{ role: 'user', content: 'who limits me' }], metadata });

test('no application named: the default one applies', async () => {
    const r = await chat(undefined);
    assert.equal(r.status, 403, r.text);
    assert.match(r.json.error.message, /application may not use that model/);
});

test('an application named in open mode applies instead', async () => {
    assert.equal((await chat({ application: 'chat-app' })).status, 200);
});
