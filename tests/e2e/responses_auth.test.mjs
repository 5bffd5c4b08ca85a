// Stored Responses with auth on: a response belongs to its tenant and project. Another key
// of the same tenant and project sees it; another tenant's key, or a key of another project,
// finds nothing (404) for GET,
// DELETE and previous_response_id; an unauthenticated caller gets 401. Responses are in the
// store: they survive a restart of the gateway.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { adminCall, startEnv, startGateway } from './lib/harness.mjs';
import { contentFor } from '../mock/engine.mjs';

const ADMIN_TOKEN = 'admin-token-responses-0123456789';
let env;

before(async () => {
    env = await startEnv({
        configure: (c) => ({ ...c, auth: { enabled: true }, health: { probes: false } }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
});

after(async () => {
    await env?.close();
});

async function admin(method, p, body) {
    const r = await adminCall(env.base, ADMIN_TOKEN, method, p, body);
    assert.ok(r.status < 300, `${method} ${p}: ${r.status} ${r.text}`);
    return r.json;
}

const clientOf = (key) => new OpenAI({ baseURL: env.api, apiKey: key, maxRetries: 0, timeout: 15000 });

test('a response is its tenant\'s: another tenant finds nothing, the same tenant does', async () => {
    const a = await admin('POST', 'tenants', { name: 'resp-a' });
    const b = await admin('POST', 'tenants', { name: 'resp-b' });
    const a1 = clientOf((await admin('POST', 'keys', { tenant_id: a.id, name: 'a1' })).key);
    const a2 = clientOf((await admin('POST', 'keys', { tenant_id: a.id, name: 'a2' })).key);
    const b1 = clientOf((await admin('POST', 'keys', { tenant_id: b.id, name: 'b1' })).key);

    const r = await a1.responses.create({ model: 'chat', input: 'tenant a speaking' });
    assert.equal(r.output_text, contentFor('up-chat'));
    assert.equal((await a2.responses.retrieve(r.id)).id, r.id, 'another key of the same tenant');
    await assert.rejects(b1.responses.retrieve(r.id), (e) => e.status === 404);
    await assert.rejects(b1.responses.delete(r.id), (e) => e.status === 404);
    await assert.rejects(b1.responses.create({ model: 'chat', input: 'x', previous_response_id: r.id }),
        (e) => e.status === 404 && e.error?.param === 'previous_response_id');
    await assert.rejects(clientOf('sk-not-a-key').responses.retrieve(r.id), (e) => e.status === 401);
    // a project of the same tenant is another owner too
    const proj = await admin('POST', 'projects', { tenant_id: a.id, name: 'resp-a-p1' });
    const ap = clientOf((await admin('POST', 'keys', { tenant_id: a.id, project_id: proj.id, name: 'ap' })).key);
    await assert.rejects(ap.responses.retrieve(r.id), (e) => e.status === 404);
    const inProject = await ap.responses.create({ model: 'chat', input: 'project speaking' });
    assert.equal((await ap.responses.retrieve(inProject.id)).id, inProject.id);
    await assert.rejects(a1.responses.retrieve(inProject.id), (e) => e.status === 404);
    const follow = await a2.responses.create({ model: 'chat', input: 'and again', previous_response_id: r.id });
    assert.equal(follow.previous_response_id, r.id);

    // the store keeps them: a restart of the gateway still finds both
    await env.gw.close();
    env.gw = await startGateway(env.configPath, { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
    env.base = env.gw.base;
    env.api = `${env.gw.base}/v1`;
    const again = clientOf((await admin('POST', 'keys', { tenant_id: a.id, name: 'a3' })).key);
    const got = await again.responses.retrieve(follow.id);
    assert.equal(got.id, follow.id);
    assert.equal(got.output[0].content[0].text, follow.output_text);
    const chained = await again.responses.create({ model: 'chat', input: 'third', previous_response_id: follow.id });
    assert.equal(chained.status, 'completed');
    const del = await again.responses.delete(r.id).asResponse();
    assert.equal(del.status, 200);
    await assert.rejects(again.responses.retrieve(r.id), (e) => e.status === 404);
});
