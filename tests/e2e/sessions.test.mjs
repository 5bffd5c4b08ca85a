// Sessions (issue 21): /v1/sessions made, read, paged and deleted; a session is its tenant's
// and project's (another tenant gets 404); idle expiry; persistence through a restart.
// The real binary against the mock engine, driven by the openai SDK where it has the call.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, startGateway, postJson, sleep } from './lib/harness.mjs';

const ADMIN_TOKEN = 'admin-token-for-sessions-e2e-0123456789';
let env;

before(async () => {
    env = await startEnv({
        configure: (c) => ({
            ...c, auth: { enabled: true }, health: { probes: false },
            context: { enable_prompt_persistence: true, safety_margin_ratio: 0, summarizer_model: 'chat' },
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
});

after(async () => {
    await env?.close();
});

async function call(method, p, body, key, base = env.base) {
    const headers = { 'content-type': 'application/json' };
    if (key) headers.authorization = `Bearer ${key}`;
    const r = await fetch(`${base}${p}`, {
        method, headers, body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(10000),
    });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: r.status, json, text };
}

const admin = (method, p, body) => call(method, `/api/v2/${p}`, body, ADMIN_TOKEN);

/** A tenant, a project and a key of it: the key in clear. */
async function keyOf(name) {
    const t = await admin('POST', 'tenants', { name });
    assert.equal(t.status, 201, t.text);
    const p = await admin('POST', 'projects', { tenant_id: t.json.id, name: `${name}-p` });
    assert.equal(p.status, 201, p.text);
    const k = await admin('POST', 'keys', { tenant_id: t.json.id, project_id: p.json.id, name: `${name}-k` });
    assert.equal(k.status, 201, k.text);
    return k.json.key;
}

let keyA, keyB;

describe('the session endpoints', () => {
    before(async () => {
        keyA = await keyOf('sess-a');
        keyB = await keyOf('sess-b');
    });

    test('POST makes a session with its settings; GET shows it; bad settings are 400', async () => {
        const r = await call('POST', '/v1/sessions', {
            model: 'chat', system: 'You answer briefly.', max_messages: 20, ttl_seconds: 3600,
            idle_timeout_seconds: 600, context_policy: 'recent_only', metadata: { app: 'e2e' },
        }, keyA);
        assert.equal(r.status, 201, r.text);
        assert.match(r.json.id, /^sess_[0-9a-f]{24}$/);
        assert.equal(r.json.object, 'session');
        assert.equal(r.json.system, 'You answer briefly.');
        assert.equal(r.json.max_messages, 20);
        assert.equal(r.json.context_policy, 'recent_only');
        assert.deepEqual(r.json.metadata, { app: 'e2e' });
        assert.equal(r.json.message_count, 0);
        assert.ok(r.json.expires_at - r.json.created_at <= 600);
        const g = await call('GET', `/v1/sessions/${r.json.id}`, undefined, keyA);
        assert.equal(g.status, 200, g.text);
        assert.deepEqual(g.json, r.json);
        for (const [body, re] of [
            [{ model: 'no-such' }, /model/], [{ max_messages: 0 }, /max_messages/],
            [{ context_policy: 'magic' }, /context_policy/], [{ metadata: [1] }, /metadata/],
            [{ ttl_seconds: 1.5 }, /ttl_seconds/],
        ]) {
            const b = await call('POST', '/v1/sessions', body, keyA);
            assert.equal(b.status, 400, JSON.stringify(body));
            assert.equal(b.json.error.code, 'INVALID_REQUEST');
            assert.match(b.json.error.message, re);
        }
        const unauth = await call('POST', '/v1/sessions', {}, null);
        assert.equal(unauth.status, 401);
    });

    test('another tenant gets 404 for every call on the session; DELETE removes it at once', async () => {
        const s = (await call('POST', '/v1/sessions', {}, keyA)).json;
        for (const [m, p] of [['GET', ''], ['GET', '/messages'], ['DELETE', '']]) {
            const r = await call(m, `/v1/sessions/${s.id}${p}`, undefined, keyB);
            assert.equal(r.status, 404, `${m} ${p}: ${r.text}`);
            assert.equal(r.json.error.code, 'SESSION_NOT_FOUND');
        }
        const d = await call('DELETE', `/v1/sessions/${s.id}`, undefined, keyA);
        assert.equal(d.status, 200, d.text);
        assert.equal(d.json.deleted, true);
        assert.equal((await call('GET', `/v1/sessions/${s.id}`, undefined, keyA)).status, 404);
        assert.equal((await call('GET', '/v1/sessions/sess_nope', undefined, keyA)).status, 404);
        assert.equal((await call('PUT', `/v1/sessions/${s.id}`, {}, keyA)).status, 405);
    });

    test('idle sessions expire', async () => {
        const s = (await call('POST', '/v1/sessions', { idle_timeout_seconds: 1 }, keyA)).json;
        assert.equal((await call('GET', `/v1/sessions/${s.id}`, undefined, keyA)).status, 200);
        await sleep(2100);
        const g = await call('GET', `/v1/sessions/${s.id}`, undefined, keyA);
        assert.equal(g.status, 404, g.text);
    });

    test('chat on a session with a key; its summary call is billed to the same key, at P4', async () => {
        const s = (await call('POST', '/v1/sessions', { max_messages: 4 }, keyA)).json;
        const from = env.gw.logs.length;
        for (let i = 0; i < 3; i++) {
            const r = await call('POST', '/v1/chat/completions',
                { model: 'chat', session_id: s.id, messages: [{ role: 'user', content: `note ${i}` }] }, keyA);
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json.session_id, s.id);
        }
        const other = await call('POST', '/v1/chat/completions',
            { model: 'chat', session_id: s.id, messages: [{ role: 'user', content: 'x' }] }, keyB);
        assert.equal(other.status, 404, 'another tenant cannot talk on the session');
        const first = await env.gw.waitLog((l) => l.msg === 'request' && l.session_id === s.id, { from });
        const summary = await env.gw.waitLog((l) => l.msg === 'request' && l.priority === 'P4' && l.model === 'chat', { from });
        assert.equal(summary.status, 200);
        assert.equal(summary.key_id, first.key_id);
        assert.equal(summary.tenant_id, first.tenant_id);
    });

    test('sessions survive a restart (persistence on); deleted ones stay deleted', async () => {
        const kept = (await call('POST', '/v1/sessions', { system: 'kept' }, keyA)).json;
        const chat = await call('POST', '/v1/chat/completions',
            { model: 'chat', session_id: kept.id, messages: [{ role: 'user', content: 'remember me' }] }, keyA);
        assert.equal(chat.status, 200, chat.text);
        const gone = (await call('POST', '/v1/sessions', { system: 'gone' }, keyA)).json;
        assert.equal((await call('DELETE', `/v1/sessions/${gone.id}`, undefined, keyA)).status, 200);
        await env.gw.close();
        env.gw = await startGateway(env.configPath, { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
        env.base = env.gw.base;
        env.api = `${env.gw.base}/v1`;
        const g = await call('GET', `/v1/sessions/${kept.id}`, undefined, keyA);
        assert.equal(g.status, 200, g.text);
        assert.equal(g.json.system, 'kept');
        const m = await call('GET', `/v1/sessions/${kept.id}/messages`, undefined, keyA);
        assert.deepEqual(m.json.data.map((d) => d.message.role), ['user', 'assistant']);
        assert.equal(m.json.data[0].message.content, 'remember me');
        assert.equal(m.json.data[1].message.content, chat.json.choices[0].message.content);
        // paged: one at a time, by cursor
        const p1 = await call('GET', `/v1/sessions/${kept.id}/messages?limit=1`, undefined, keyA);
        assert.equal(p1.json.has_more, true);
        const p2 = await call('GET', `/v1/sessions/${kept.id}/messages?limit=1&after=${p1.json.last_id}`, undefined, keyA);
        assert.equal(p2.json.data[0].message.role, 'assistant');
        assert.equal(p2.json.has_more, false);
        assert.equal((await call('GET', `/v1/sessions/${gone.id}`, undefined, keyA)).status, 404);
        assert.equal((await call('GET', `/v1/sessions/${kept.id}`, undefined, keyB)).status, 404);
    });
});
