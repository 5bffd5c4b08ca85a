// Tenancy (issue: tenants, projects, customer keys): the admin API under /api/v2 (token,
// validation, masking, audit trail), the auth matrix on the inference path driven by the
// official openai SDK (401 / 403 / 429 with Retry-After, key and project levels), disable /
// enable / delete taking effect on the next request, rotation under concurrent traffic
// (never both keys valid, never neither), the open mode and the "no key yet" start, and a
// final scan proving that no customer key appears in clear anywhere after its creation: not
// in the gateway's log, not in the SQLite files, not in any other admin response.
//
// MOONGATE_ADMIN_TOKEN is the platform operator and sees every tenant; tenant admin tokens
// (POST /api/v2/admin-tokens) see and change only their own tenant's records.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startEnv, postJson, sleep, waitFor } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-tenancy-e2e-token-5d1c0b';
const messages = [{ role: 'user', content: 'who am i' }];

let env;
const secrets = new Map(); // clear key -> the admin response text that revealed it (once)
const adminTexts = []; // every admin response body, in order

before(async () => {
    env = await startEnv({
        // the chat provider has a price, so requests are metered against spend limits
        configure: (c) => ({
            ...c, auth: { enabled: true }, health: { probes: false },
            providers: c.providers.map((p) => (p.id === 'mock-openai' ? { ...p, cost_per_1k_tokens: 2 } : p)),
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
});

after(async () => {
    await env?.close();
});

/** One admin request; records the answer for the final secret scan. */
async function admin(method, p, body, { token = ADMIN_TOKEN } = {}) {
    const headers = { 'content-type': 'application/json' };
    if (token !== null) headers.authorization = `Bearer ${token}`;
    const r = await fetch(`${env.base}/api/v2/${p}`, {
        method,
        headers,
        body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
        signal: AbortSignal.timeout(10000),
    });
    const text = await r.text();
    let json = null;
    try {
        json = JSON.parse(text);
    } catch {
        /* not JSON */
    }
    adminTexts.push(text);
    if (json && typeof json.key === 'string') {
        assert.ok(!secrets.has(json.key), 'a key is revealed only once');
        secrets.set(json.key, text);
    }
    if (json && typeof json.token === 'string' && json.token.length > 40) {
        assert.ok(!secrets.has(json.token), 'a tenant admin token is revealed only once');
        secrets.set(json.token, text);
    }
    return { status: r.status, json, text, headers: r.headers };
}

/** Create a key (201 asserted) and return the admin JSON with its clear key. */
async function createKey(body) {
    const r = await admin('POST', 'keys', body);
    assert.equal(r.status, 201, r.text);
    return r.json;
}

function sdk(apiKey) {
    return new OpenAI({ baseURL: env.api, apiKey, maxRetries: 0, timeout: 10000 });
}

/** A chat call through the SDK: { status, code, headers, message } (status 200 on success). */
async function chat(apiKey, extra = {}, model = 'chat') {
    try {
        const { response } = await sdk(apiKey).chat.completions.create({ model, messages, ...extra }).withResponse();
        return { status: response.status, headers: response.headers };
    } catch (e) {
        if (!(e instanceof OpenAI.APIError)) throw e;
        return { status: e.status, code: e.code, headers: e.headers, message: e.message, error: e };
    }
}

let tenantA;
let tenantB;
let projectA;

describe('admin API: authentication, validation, masking, audit', () => {
    test('401 without a token and with a wrong one, for reads and writes; wrong tokens audited', async () => {
        for (const token of [null, 'wrong-token', `${ADMIN_TOKEN}x`]) {
            const w = await admin('POST', 'tenants', { name: 'never' }, { token });
            assert.equal(w.status, 401, w.text);
            assert.equal(w.json.error.code, 'AUTH_FAILED');
            const r = await admin('GET', 'keys', undefined, { token });
            assert.equal(r.status, 401);
        }
        // the refusals' audit rows are queued writes: read them once committed
        const refusedRows = async () => (await admin('GET', 'audit?limit=1000')).json.data.filter((a) => a.status === 401);
        await waitFor(async () => (await refusedRows()).length >= 4, { what: 'four audited refusals' });
        const refused = await refusedRows();
        assert.equal(refused.length, 4, 'each wrong token is audited (no token at all is not)');
        for (const a of refused) {
            assert.equal(a.action, 'admin.auth_failed');
            assert.equal(a.actor, 'unauthenticated');
            assert.ok(a.client_addr.startsWith('127.0.0.1'));
        }
        const tenants = await admin('GET', 'tenants');
        assert.ok(!tenants.json.data.some((t) => t.name === 'never'));
    });

    test('tenants and projects: 201, duplicates, unknown fields, wrong types, ranges, 404', async () => {
        const a = await admin('POST', 'tenants', { name: 'tenant-a' });
        assert.equal(a.status, 201, a.text);
        assert.ok(Number.isInteger(a.json.id));
        assert.equal(a.json.name, 'tenant-a');
        tenantA = a.json.id;
        const b = await admin('POST', 'tenants', { name: 'tenant-b' });
        assert.equal(b.status, 201);
        tenantB = b.json.id;

        const cases = [
            ['POST', 'tenants', { name: 'tenant-a' }, 400, /name/],
            ['POST', 'tenants', { name: 'x', color: 'blue' }, 400, /color/],
            ['POST', 'tenants', { name: 42 }, 400, /name/],
            ['POST', 'tenants', {}, 400, /name/],
            ['POST', 'tenants', '[1,2]', 400, /JSON object/],
            ['POST', 'projects', { tenant_id: 999999, name: 'p' }, 404, /tenant/],
            ['POST', 'projects', { tenant_id: tenantA, name: 'p', rpm_limit: -1 }, 400, /rpm_limit/],
            ['POST', 'projects', { tenant_id: tenantA, name: 'p', tpm_limit: 1.5 }, 400, /tpm_limit/],
            ['POST', 'projects', { tenant_id: 'one', name: 'p' }, 400, /tenant_id/],
            ['GET', 'tenants/999999', undefined, 404, /tenant/],
            ['GET', 'nothing-here', undefined, 404, /admin endpoint/],
        ];
        for (const [m, p, body, status, re] of cases) {
            const r = await admin(m, p, body);
            assert.equal(r.status, status, `${m} ${p} ${JSON.stringify(body)} -> ${r.text}`);
            assert.match(r.json.error.message, re, `${m} ${p}: ${r.json.error.message}`);
            assert.ok(r.json.error.request_id, 'error carries the request id');
        }

        const p = await admin('POST', 'projects', { tenant_id: tenantA, name: 'web', rpm_limit: 1000, max_concurrency: 50 });
        assert.equal(p.status, 201, p.text);
        assert.equal(p.json.tenant_id, tenantA);
        assert.equal(p.json.rpm_limit, 1000);
        projectA = p.json.id;
        const dup = await admin('POST', 'projects', { tenant_id: tenantA, name: 'web' });
        assert.equal(dup.status, 400);
        assert.match(dup.json.error.message, /name/);
        // the same name under another tenant is fine
        const other = await admin('POST', 'projects', { tenant_id: tenantB, name: 'web' });
        assert.equal(other.status, 201, other.text);
    });

    test('keys: shown in clear once, masked afterwards (prefix + last six), validated', async () => {
        const k = await createKey({
            tenant_id: tenantA, project_id: projectA, name: 'first', models: ['chat'], priorities: ['P1', 'P2'],
            rpm_limit: 100, labels: { team: 'web' },
        });
        assert.match(k.key, /^mg-[0-9A-Za-z]{40}$/);
        assert.equal(k.display, `mg-…${k.key.slice(-6)}`);
        assert.deepEqual(k.scopes, ['inference']);
        assert.deepEqual(k.models, ['chat']);
        assert.equal(k.status, 'active');

        const one = await admin('GET', `keys/${k.id}`);
        assert.equal(one.status, 200);
        assert.equal(one.json.key, undefined, 'no clear key after creation');
        assert.equal(one.json.digest, undefined, 'no digest either');
        assert.equal(one.json.display, k.display);
        assert.deepEqual(one.json.labels, { team: 'web' });
        const list = await admin('GET', `keys?tenant_id=${tenantA}`);
        assert.ok(list.json.data.some((x) => x.id === k.id));
        assert.ok(list.json.data.every((x) => x.key === undefined && x.tenant_id === tenantA));

        const cases = [
            [{ tenant_id: tenantA, bogus: 1 }, 400, /bogus/],
            [{ tenant_id: tenantA, name: 'first' }, 400, /name/],
            [{ tenant_id: tenantA, models: ['no-such-model'] }, 400, /models\[0\]/],
            [{ tenant_id: tenantA, models: 'chat' }, 400, /models/],
            [{ tenant_id: tenantA, scopes: ['root'] }, 400, /scopes\[0\]/],
            [{ tenant_id: tenantA, priorities: ['P9'] }, 400, /priorities\[0\]/],
            [{ tenant_id: tenantA, priorities: [] }, 400, /priorities/],
            [{ tenant_id: tenantA, max_concurrency: 1e9 }, 400, /max_concurrency/],
            [{ tenant_id: tenantA, expires_at: 1000 }, 400, /expires_at/],
            [{ tenant_id: tenantA, expires_at: 'tomorrow' }, 400, /expires_at/],
            [{ tenant_id: tenantA, enabled: 'yes' }, 400, /enabled/],
            [{ tenant_id: tenantA, labels: { a: 1 } }, 400, /labels/],
            [{ tenant_id: tenantB, project_id: projectA }, 400, /project_id/],
            [{ tenant_id: tenantA, project_id: 999999 }, 404, /project/],
            [{ tenant_id: 999999 }, 404, /tenant/],
            [{ name: 'x' }, 400, /tenant_id/],
        ];
        for (const [body, status, re] of cases) {
            const r = await admin('POST', 'keys', body);
            assert.equal(r.status, status, `${JSON.stringify(body)} -> ${r.text}`);
            assert.match(r.json.error.message, re, `${JSON.stringify(body)}: ${r.json.error.message}`);
        }
        const put = await admin('PUT', `keys/${k.id}`, { tenant_id: tenantB });
        assert.equal(put.status, 400);
        assert.match(put.json.error.message, /tenant_id/);
        const missing = await admin('PUT', 'keys/999999', { rpm_limit: 1 });
        assert.equal(missing.status, 404);
        const upd = await admin('PUT', `keys/${k.id}`, { rpm_limit: 7, expires_at: '2999-01-01T00:00:00Z' });
        assert.equal(upd.status, 200, upd.text);
        assert.equal(upd.json.rpm_limit, 7);
        assert.equal(upd.json.expires_at, Date.UTC(2999, 0, 1) / 1000);
        assert.equal(upd.json.key, undefined);
    });

    test('every authenticated admin request leaves an audit record matching its answer', async () => {
        const r = await admin('POST', 'tenants', { name: 'audited' });
        assert.equal(r.status, 201);
        const rid = r.headers.get('x-request-id');
        const bad = await admin('POST', 'tenants', { name: 'audited' });
        assert.equal(bad.status, 400);
        const audit = await admin('GET', 'audit?limit=50');
        const rec = audit.json.data.find((a) => a.request_id === rid);
        assert.ok(rec, `audit record for ${rid}`);
        assert.equal(rec.actor, 'admin');
        assert.equal(rec.action, 'tenant.create');
        assert.equal(rec.target, `tenant:${r.json.id}`);
        assert.equal(rec.status, 201);
        assert.match(rec.client_addr, /^127\.0\.0\.1:\d+$/);
        const badRec = audit.json.data.find((a) => a.request_id === bad.headers.get('x-request-id'));
        assert.ok(badRec && badRec.status === 400 && badRec.action === 'tenant.create');
        // the read endpoints answered on the loop (admin/front.c) are audited too
        const pools = await admin('GET', 'pools');
        assert.equal(pools.status, 200);
        // (a read's record is written after its answer went out: it may take a moment)
        const poolsRec = await waitFor(async () => {
            const after = await admin('GET', 'audit?limit=5');
            return after.json.data.find((a) => a.request_id === pools.headers.get('x-request-id'));
        }, { timeoutMs: 5000, what: 'the audit record of GET /api/v2/pools' });
        assert.ok(poolsRec.action === 'pools.read' && poolsRec.status === 200);
    });
});

describe('auth matrix on the inference path (openai SDK)', () => {
    test('401 AUTH_FAILED: no key, unknown key, expired key, disabled key, deleted key', async () => {
        const noKey = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages });
        assert.equal(noKey.status, 401);
        assert.equal(noKey.json.error.code, 'AUTH_FAILED');
        assert.equal(noKey.json.error.type, 'authentication_error');

        const unknown = await chat('mg-0000000000000000000000000000000000000000');
        assert.equal(unknown.status, 401);
        assert.ok(unknown.error instanceof OpenAI.AuthenticationError);
        assert.equal(unknown.code, 'AUTH_FAILED');

        const k = await createKey({ tenant_id: tenantA, name: 'lifecycle' });
        assert.equal((await chat(k.key)).status, 200);
        // x-api-key works as well as Authorization: Bearer
        const viaHeader = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages },
            { headers: { 'x-api-key': k.key } });
        assert.equal(viaHeader.status, 200, viaHeader.text);

        // expiry is checked on every request
        assert.equal((await admin('PUT', `keys/${k.id}`, { expires_at: 1000 })).status, 200);
        const expired = await chat(k.key);
        assert.equal(expired.status, 401);
        assert.equal(expired.code, 'AUTH_FAILED');
        assert.equal((await admin('PUT', `keys/${k.id}`, { expires_at: null })).status, 200);
        assert.equal((await chat(k.key)).status, 200);

        // disable and enable take effect on the next request
        const dis = await admin('POST', `keys/${k.id}/disable`);
        assert.equal(dis.status, 200, dis.text);
        assert.equal(dis.json.status, 'disabled');
        assert.equal((await chat(k.key)).status, 401);
        assert.equal((await admin('POST', `keys/${k.id}/enable`)).status, 200);
        assert.equal((await chat(k.key)).status, 200);

        // delete revokes for good
        const del = await admin('DELETE', `keys/${k.id}`);
        assert.equal(del.status, 200, del.text);
        assert.equal((await chat(k.key)).status, 401);
        assert.equal((await admin('POST', `keys/${k.id}/enable`)).status, 409);
        assert.equal((await admin('GET', `keys/${k.id}`)).json.status, 'revoked');
        const listed = await admin('GET', `keys?tenant_id=${tenantA}`);
        assert.ok(!listed.json.data.some((x) => x.id === k.id), 'revoked keys are hidden by default');
        const all = await admin('GET', `keys?tenant_id=${tenantA}&include_revoked=1`);
        assert.ok(all.json.data.some((x) => x.id === k.id));
    });

    test('403 PERMISSION_DENIED: scope, model allowlist, priority', async () => {
        const noScope = await createKey({ tenant_id: tenantA, scopes: ['models'] });
        const r1 = await chat(noScope.key);
        assert.equal(r1.status, 403);
        assert.ok(r1.error instanceof OpenAI.PermissionDeniedError);
        assert.equal(r1.code, 'PERMISSION_DENIED');

        const embedOnly = await createKey({ tenant_id: tenantA, models: ['embed'] });
        const r2 = await chat(embedOnly.key);
        assert.equal(r2.status, 403);
        assert.equal(r2.code, 'PERMISSION_DENIED');
        assert.match(r2.message, /model/);
        const emb = await sdk(embedOnly.key).embeddings.create({ model: 'embed', input: 'x' });
        assert.equal(emb.data.length, 1);

        const lowOnly = await createKey({ tenant_id: tenantA, priorities: ['P3', 'P4'] });
        const r3 = await chat(lowOnly.key, { priority: 'P0' });
        assert.equal(r3.status, 403);
        assert.match(r3.message, /priority/);
        assert.equal((await chat(lowOnly.key, { priority: 'P3' })).status, 200);
        // the default priority (P2) is not among them either
        assert.equal((await chat(lowOnly.key)).status, 403);
    });

    test('429 RATE_LIMITED with Retry-After when the key RPM is exhausted', async () => {
        const k = await createKey({ tenant_id: tenantA, rpm_limit: 2 });
        assert.equal((await chat(k.key)).status, 200);
        assert.equal((await chat(k.key)).status, 200);
        const r = await chat(k.key);
        assert.equal(r.status, 429);
        assert.ok(r.error instanceof OpenAI.RateLimitError);
        assert.equal(r.code, 'RATE_LIMITED');
        const ra = Number(r.headers.get('retry-after'));
        assert.ok(ra >= 1 && ra <= 60, `Retry-After ${ra}`);
        assert.ok(r.error.error?.retry_after_ms >= 1000, JSON.stringify(r.error.error));
    });

    test('a project limit refuses while the key has room, and rolls the key level back', async () => {
        const p = await admin('POST', 'projects', { tenant_id: tenantA, name: 'tight', rpm_limit: 1 });
        assert.equal(p.status, 201);
        const k = await createKey({ tenant_id: tenantA, project_id: p.json.id, rpm_limit: 2 });
        assert.equal((await chat(k.key)).status, 200);
        const refused = await chat(k.key);
        assert.equal(refused.status, 429);
        assert.equal(refused.code, 'RATE_LIMITED');
        assert.match(refused.message, /project/);
        assert.ok(Number(refused.headers.get('retry-after')) >= 1);
        // lift the project's limit: the refused request took nothing from the key, so the key
        // (rpm 2) admits exactly one more request in this minute
        assert.equal((await admin('PUT', `projects/${p.json.id}`, { rpm_limit: 0 })).status, 200);
        assert.equal((await chat(k.key)).status, 200);
        const keyLevel = await chat(k.key);
        assert.equal(keyLevel.status, 429);
        assert.match(keyLevel.message, /key/);
    });

    test('429 QUOTA_EXCEEDED when the estimated cost would pass the daily, then the monthly limit', async () => {
        // every answer costs its tokens x 2 per 1,000 (micros: tokens x 2,000), rounded up; a
        // request is admitted only when its estimated cost fits (ledger.test.mjs has the
        // arithmetic): a limit of 1 micro admits none
        const k = await createKey({ tenant_id: tenantA, daily_limit_micros: 1 });
        const r = await chat(k.key);
        assert.equal(r.status, 429);
        assert.equal(r.code, 'QUOTA_EXCEEDED');
        assert.match(r.message, /daily spend limit/);
        const ra = Number(r.headers.get('retry-after'));
        assert.ok(ra >= 1 && ra <= 86400, `Retry-After ${ra}`);
        // raising the limit lets it through; then the monthly one refuses
        assert.equal((await admin('PUT', `keys/${k.id}`, { daily_limit_micros: 100000000 })).status, 200);
        assert.equal((await chat(k.key)).status, 200);
        assert.equal((await admin('PUT', `keys/${k.id}`, { daily_limit_micros: 0, monthly_limit_micros: 1 })).status, 200);
        const m = await chat(k.key);
        assert.equal(m.status, 429);
        assert.match(m.message, /monthly spend limit/);
        // a project's monthly quota counts all its keys
        const p = await admin('POST', 'projects', { tenant_id: tenantA, name: 'metered', monthly_limit_micros: 1 });
        const k1 = await createKey({ tenant_id: tenantA, project_id: p.json.id });
        const q = await chat(k1.key);
        assert.equal(q.status, 429);
        assert.match(q.message, /project's monthly quota/);
    });

    test('the request log names the key id and the refusal reason, never the key', async () => {
        const k = await createKey({ tenant_id: tenantA, name: 'logged' });
        const ok = await sdk(k.key).chat.completions.create({ model: 'chat', messages }).withResponse();
        const rid = ok.response.headers.get('x-request-id');
        const line = await env.gw.waitLog((l) => l.msg === 'request' && l.request_id === rid);
        assert.equal(line.key_id, k.id);
        assert.equal(line.tenant_id, tenantA);
        const bad = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages },
            { headers: { authorization: 'Bearer mg-1111111111111111111111111111111111111111' } });
        const badLine = await env.gw.waitLog((l) => l.msg === 'request' && l.request_id === bad.json.error.request_id);
        assert.equal(badLine.auth_refused, 'unknown');
        assert.equal(badLine.status, 401);
    });
});

describe('idempotency keys are scoped per tenant and application (project)', () => {
    test('keys of one project share them; another project or tenant never sees them', async () => {
        const p1 = await admin('POST', 'projects', { tenant_id: tenantA, name: 'idem-1' });
        const p2 = await admin('POST', 'projects', { tenant_id: tenantA, name: 'idem-2' });
        const [a1, a2, b1, other] = await Promise.all([
            createKey({ tenant_id: tenantA, project_id: p1.json.id }),
            createKey({ tenant_id: tenantA, project_id: p1.json.id }),
            createKey({ tenant_id: tenantA, project_id: p2.json.id }),
            createKey({ tenant_id: tenantB }),
        ]);
        const body = { model: 'chat', messages, idempotency_key: `idem-scope-${process.pid}` };
        const send = (k) => postJson(`${env.api}/chat/completions`, body, { headers: { authorization: `Bearer ${k.key}` } });
        const first = await send(a1);
        assert.equal(first.status, 200, first.text);
        const same = await send(a2);
        assert.equal(same.headers.get('idempotent-replayed'), 'true', 'another key of the same project replays');
        assert.equal(same.json.id, first.json.id);
        for (const k of [b1, other]) {
            const r = await send(k);
            assert.equal(r.status, 200);
            assert.equal(r.headers.get('idempotent-replayed'), null, 'another project or tenant runs anew');
            assert.notEqual(r.json.id, first.json.id);
        }
        const bad = await postJson(`${env.api}/chat/completions`, body, { headers: { authorization: 'Bearer mg-nope' } });
        assert.equal(bad.status, 401, 'an unknown key gets no stored answer');
    });
});

describe('tenant admin tokens: a tenant sees and changes only its own', () => {
    let tokA;
    let tokB;
    let keyB;
    let projectB;
    before(async () => {
        const a = await admin('POST', 'admin-tokens', { tenant_id: tenantA, name: 'ops-a' });
        assert.equal(a.status, 201, a.text);
        assert.match(a.json.token, /^mgt-[0-9A-Za-z]{40}$/);
        tokA = a.json.token;
        const b = await admin('POST', 'admin-tokens', { tenant_id: tenantB, name: 'ops-b' });
        tokB = b.json.token;
        keyB = await createKey({ tenant_id: tenantB, name: 'b-secret' });
        const p = await admin('POST', 'projects', { tenant_id: tenantB, name: 'b-only' });
        projectB = p.json.id;
    });
    const asA = (m, p, body) => admin(m, p, body, { token: tokA });

    test('listed masked; only the platform admin manages them', async () => {
        const list = await admin('GET', 'admin-tokens');
        assert.equal(list.status, 200);
        assert.ok(list.json.data.every((t) => !t.token.includes(tokA.slice(4)) && /^mgt-…/.test(t.token)));
        assert.equal((await asA('GET', 'admin-tokens')).status, 403);
        assert.equal((await asA('POST', 'admin-tokens', { tenant_id: tenantA })).status, 403);
        assert.equal((await admin('POST', 'admin-tokens', { tenant_id: 999999 })).status, 404);
    });

    test('reads: its tenant, projects, keys and usage only; another tenant\'s records are 404', async () => {
        const t = await asA('GET', 'tenants');
        assert.deepEqual(t.json.data.map((x) => x.id), [tenantA]);
        assert.equal((await asA('GET', `tenants/${tenantB}`)).status, 404);
        for (const p of ['keys', `keys?tenant_id=${tenantB}`, 'projects', `projects?tenant_id=${tenantB}`, 'usage', `usage?tenant_id=${tenantB}`]) {
            const r = await asA('GET', p);
            assert.equal(r.status, 200, `${p}: ${r.text}`);
            assert.ok(r.json.data.length > 0 || p.startsWith('usage'), p);
            assert.ok(r.json.data.every((x) => x.tenant_id === tenantA), `${p} shows only tenant A`);
        }
        const all = await admin('GET', 'usage');
        assert.ok(all.json.data.some((x) => x.tenant_id === tenantA), 'tenant A has metered spend');
        assert.equal((await asA('GET', `keys/${keyB.id}`)).status, 404);
        assert.equal((await asA('GET', `projects/${projectB}`)).status, 404);
    });

    test('writes: never into another tenant; B\'s key keeps working', async () => {
        const denied = [
            ['PUT', `keys/${keyB.id}`, { rpm_limit: 1 }, 404],
            ['POST', `keys/${keyB.id}/disable`, undefined, 404],
            ['POST', `keys/${keyB.id}/rotate`, undefined, 404],
            ['DELETE', `keys/${keyB.id}`, undefined, 404],
            ['PUT', `projects/${projectB}`, { rpm_limit: 1 }, 404],
            ['POST', 'keys', { tenant_id: tenantB }, 403],
            ['POST', 'projects', { tenant_id: tenantB, name: 'sneaky' }, 403],
            ['POST', 'keys', { tenant_id: tenantA, project_id: projectB }, 404],
            ['POST', 'tenants', { name: 'mine' }, 403],
        ];
        for (const [m, p, body, status] of denied) {
            const r = await asA(m, p, body);
            assert.equal(r.status, status, `${m} ${p}: ${r.text}`);
            assert.ok(!r.text.includes('b-secret'), 'nothing of B leaks');
        }
        assert.equal((await chat(keyB.key)).status, 200, 'B\'s key untouched');
        const own = await asA('POST', 'keys', { tenant_id: tenantA, name: 'made-by-a' });
        assert.equal(own.status, 201, own.text);
        assert.equal((await chat(own.json.key)).status, 200);
        assert.equal((await asA('POST', `keys/${own.json.id}/disable`)).status, 200);
        assert.equal((await chat(own.json.key)).status, 401);
    });

    test('platform endpoints are 403; the audit names the tenant admin; revoke ends it', async () => {
        for (const p of ['providers', 'pools', 'cooldowns', 'config', 'audit']) {
            const r = await asA('GET', p);
            assert.equal(r.status, 403, `${p}: ${r.text}`);
            assert.equal(r.json.error.code, 'PERMISSION_DENIED');
        }
        const audit = await admin('GET', 'audit?limit=200');
        assert.ok(audit.json.data.some((x) => /^tenant-admin:\d+$/.test(x.actor) && x.action === 'key.create'));
        const bad = await admin('GET', 'keys', undefined, { token: `mgt-${'0'.repeat(40)}` });
        assert.equal(bad.status, 401);
        const list = await admin('GET', 'admin-tokens');
        const idA = list.json.data.find((t) => t.name === 'ops-a').id;
        assert.equal((await admin('DELETE', `admin-tokens/${idA}`)).status, 200);
        assert.equal((await asA('GET', 'keys')).status, 401);
        assert.equal((await admin('GET', 'keys', undefined, { token: tokB })).status, 200, 'B unaffected');
    });
});

describe('rotation', () => {
    test('under concurrent requests: never both keys valid, never neither', async () => {
        const k = await createKey({ tenant_id: tenantA, name: 'rotating' });
        const oldKey = k.key;
        let newKey = null;
        let stop = false;
        const oldClient = sdk(oldKey);
        let newClient = null;
        // each worker alternates old and new key, one request at a time, so its own results
        // are in the order the gateway decided them
        async function worker() {
            const seq = [];
            let i = 0;
            while (!stop) {
                const useNew = i++ % 2 === 1;
                if (useNew && !newKey) continue; // not known to the client yet: nothing to try
                const client = useNew ? (newClient ??= sdk(newKey)) : oldClient;
                try {
                    await client.chat.completions.create({ model: 'chat', messages });
                    seq.push({ which: useNew ? 'new' : 'old', ok: true });
                } catch (e) {
                    assert.equal(e.status, 401, `unexpected ${e.status} ${e.message}`);
                    seq.push({ which: useNew ? 'new' : 'old', ok: false });
                }
            }
            return seq;
        }
        const workers = Array.from({ length: 6 }, () => worker());
        await sleep(300);
        const rot = await admin('POST', `keys/${k.id}/rotate`);
        assert.equal(rot.status, 200, rot.text);
        assert.equal(rot.json.replaces, k.id);
        assert.notEqual(rot.json.id, k.id);
        assert.equal(rot.json.name, 'rotating', 'the policy is copied');
        newKey = rot.json.key;
        await sleep(300);
        stop = true;
        const seqs = await Promise.all(workers);
        let oldOk = 0;
        let newOk = 0;
        for (const seq of seqs) {
            const lastOldOk = seq.findLastIndex((r) => r.which === 'old' && r.ok);
            const firstNewOk = seq.findIndex((r) => r.which === 'new' && r.ok);
            const firstOldBad = seq.findIndex((r) => r.which === 'old' && !r.ok);
            // once the old key was refused (the rotation happened) the new key must work
            const lastNewBad = seq.findLastIndex((r) => r.which === 'new' && !r.ok);
            if (firstNewOk >= 0 && lastOldOk >= 0) assert.ok(firstNewOk > lastOldOk, 'never both valid');
            if (firstOldBad >= 0 && lastNewBad >= 0) assert.ok(lastNewBad < firstOldBad, 'never neither valid');
            oldOk += seq.filter((r) => r.which === 'old' && r.ok).length;
            newOk += seq.filter((r) => r.which === 'new' && r.ok).length;
        }
        assert.ok(oldOk > 0 && newOk > 0, `both phases observed (old ok ${oldOk}, new ok ${newOk})`);
        const old = await admin('GET', `keys/${k.id}`);
        assert.equal(old.json.status, 'revoked');
        assert.equal(old.json.replaced_by, rot.json.id);
        // rotating the revoked key again is a conflict
        assert.equal((await admin('POST', `keys/${k.id}/rotate`)).status, 409);
    });
});

describe('identify comes first: nothing is looked at for a caller who is not known', () => {
    test('an unknown model with no key or a wrong key is 401, not 404', async () => {
        for (const headers of [{}, { authorization: 'Bearer mg-0000000000000000000000000000000000000000' }]) {
            const r = await postJson(`${env.api}/chat/completions`,
                { model: 'no-such-model-anywhere', messages }, { headers });
            assert.equal(r.status, 401, r.text);
            assert.equal(r.json.error.code, 'AUTH_FAILED');
            assert.doesNotMatch(r.text, /no-such-model-anywhere/, 'the answer says nothing of the model');
        }
    });

    test("an unauthenticated request naming a user spends none of that user's minute", async () => {
        const k = await createKey({ tenant_id: tenantA, name: 'identify-first-user' });
        let r = await admin('PUT', 'quotas', { users: { default_requests_per_minute: 2 } });
        assert.equal(r.status, 200, r.text);
        try {
            const asUser = (headers) => postJson(`${env.api}/chat/completions`,
                { model: 'chat', messages, metadata: { user_id: 'u-identify-first' } }, { headers });
            for (let i = 0; i < 3; i++) assert.equal((await asUser({})).status, 401);
            const key = { authorization: `Bearer ${k.key}` };
            assert.equal((await asUser(key)).status, 200, 'the first of the minute');
            assert.equal((await asUser(key)).status, 200, 'the second of the minute');
            const third = await asUser(key);
            assert.equal(third.status, 429, 'the limit still counts the known caller');
            assert.equal(third.json.error.code, 'RATE_LIMITED');
        } finally {
            r = await admin('PUT', 'quotas', { users: { default_requests_per_minute: null } });
            assert.equal(r.status, 200, r.text);
        }
    });

    test('an unauthenticated request with an idempotency key stores nothing', async () => {
        const body = { model: 'chat', messages, idempotency_key: 'identify-first-idem-1' };
        const first = await postJson(`${env.api}/chat/completions`, body);
        assert.equal(first.status, 401, first.text);
        const again = await postJson(`${env.api}/chat/completions`, body);
        assert.equal(again.status, 401, again.text);
        assert.equal(again.headers.get('idempotent-replayed'), null, 'no stored 401 is replayed');
        assert.notEqual(again.json.error.request_id, first.json.error.request_id);
    });
});

describe('a key belongs to its application: the body cannot choose another', () => {
    test("the key's application's models apply whatever metadata.application says; a key without one is not limited by the body", async () => {
        const app = await admin('POST', 'applications', { name: 'locked-app', allowed_models: ['embed'] });
        assert.equal(app.status, 201, app.text);
        const bad = await admin('POST', 'keys', { tenant_id: tenantA, application: 'no-such-app' });
        assert.equal(bad.status, 400);
        assert.match(bad.json.error.message, /application/);
        const locked = await createKey({ tenant_id: tenantA, name: 'locked', application: 'locked-app' });
        assert.equal(locked.application, 'locked-app');
        assert.equal((await admin('GET', `keys/${locked.id}`)).json.application, 'locked-app');
        for (const metadata of [undefined, { application: 'some-other-app' }, { application: 'locked-app' }]) {
            const r = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages, metadata },
                { headers: { authorization: `Bearer ${locked.key}` } });
            assert.equal(r.status, 403, `${JSON.stringify(metadata)}: ${r.text}`);
            assert.match(r.json.error.message, /application may not use that model/);
        }
        const emb = await sdk(locked.key).embeddings.create({ model: 'embed', input: 'x' });
        assert.equal(emb.data.length, 1, 'what the application allows still works');
        const free = await createKey({ tenant_id: tenantA, name: 'free' });
        const r = await postJson(`${env.api}/chat/completions`,
            { model: 'chat', messages, metadata: { application: 'locked-app' } },
            { headers: { authorization: `Bearer ${free.key}` } });
        assert.equal(r.status, 200, 'with auth on, the body names no application: ' + r.text);
        assert.equal((await admin('DELETE', 'applications/locked-app')).status, 200);
    });
});

describe('async tasks belong to the key that submitted them', () => {
    test('a key sees, lists and cancels its own tasks; another key gets 404; the operator sees all', async () => {
        const a = await createKey({ tenant_id: tenantA, name: 'tasks-a' });
        const b = await createKey({ tenant_id: tenantA, name: 'tasks-b' });
        const as = (key) => ({ authorization: `Bearer ${key}` });
        const get = async (p, headers) => {
            const r = await fetch(`${env.api}/${p}`, { headers, signal: AbortSignal.timeout(5000) });
            return { status: r.status, json: await r.json().catch(() => null) };
        };
        await env.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 600 } });
        const sub = await postJson(`${env.api}/tasks`, { model: 'chat', messages }, { headers: as(a.key) });
        assert.equal(sub.status, 202, sub.text);
        const id = sub.json.task_id;
        assert.equal((await get(`tasks/${id}`, as(a.key))).status, 200, 'its own, in flight');
        assert.equal((await get(`tasks/${id}`, as(b.key))).status, 404, "another key's is not there");
        const del = await fetch(`${env.api}/tasks/${id}`, { method: 'DELETE', headers: as(b.key) });
        assert.equal(del.status, 404, 'nor can it be cancelled by another key');
        assert.equal((await get(`tasks/${id}`, {})).status, 401);
        assert.ok((await get('tasks', as(a.key))).json.data.some((t) => t.task_id === id));
        assert.ok(!(await get('tasks', as(b.key))).json.data.some((t) => t.task_id === id));
        assert.equal((await get(`tasks/${id}`, { authorization: `Bearer ${ADMIN_TOKEN}` })).status, 200);
        await waitFor(async () => (await get(`tasks/${id}`, as(a.key))).json?.status === 'SUCCEEDED',
            { timeoutMs: 5000, what: 'the task to finish' });
        assert.equal((await get(`tasks/${id}`, as(b.key))).status, 404, 'finished: still not another key\'s');
        const mine = await postJson(`${env.api}/tasks`, { model: 'chat', messages }, { headers: as(b.key) });
        const cancel = await fetch(`${env.api}/tasks/${mine.json.task_id}`, { method: 'DELETE', headers: as(b.key) });
        assert.ok([200, 409].includes(cancel.status), `its own task can be cancelled: ${cancel.status}`);
    });
});

describe('no customer key in clear after its creation', () => {
    test('gateway log, SQLite files and every other admin response are clean', async () => {
        assert.ok(secrets.size >= 5, `${secrets.size} keys created`);
        await env.gw.close(); // SQLite checkpoints and closes its files
        const log = env.gw.rawLines.join('\n') + env.gw.stderr;
        const files = fs.readdirSync(env.dir).filter((f) => f.startsWith('moongate.db'));
        assert.ok(files.length >= 1, 'the database exists');
        const blobs = files.map((f) => [f, fs.readFileSync(path.join(env.dir, f)).toString('latin1')]);
        for (const [key, revealedBy] of secrets) {
            const random = key.slice(3); // without the "mg-" prefix
            assert.ok(!log.includes(random), 'key not in the gateway log');
            for (const [f, blob] of blobs) assert.ok(!blob.includes(random), `key not in ${f}`);
            const others = adminTexts.filter((t) => t !== revealedBy && t.includes(random));
            assert.equal(others.length, 0, 'key not in any other admin response');
        }
        assert.ok(!log.includes(ADMIN_TOKEN), 'admin token not in the log');
        // the audit trail kept the admin work
        assert.ok(blobs.some(([, b]) => b.includes('key.rotate')), 'audit rows written');
    });
});

describe('auth enabled with no key yet', () => {
    let env2;
    before(async () => {
        env2 = await startEnv({ configure: (c) => ({ ...c, auth: { enabled: true } }) });
    });
    after(async () => {
        await env2?.close();
    });

    test('every inference request is 401 and the log says how to create the first key', async () => {
        const r = await postJson(`${env2.api}/chat/completions`, { model: 'chat', messages });
        assert.equal(r.status, 401);
        assert.equal(r.json.error.code, 'AUTH_FAILED');
        const c = new OpenAI({ baseURL: env2.api, apiKey: 'mg-anything', maxRetries: 0, timeout: 10000 });
        await assert.rejects(c.chat.completions.create({ model: 'chat', messages }), OpenAI.AuthenticationError);
        const line = env2.gw.logs.find((l) => l.msg === 'auth' && l.mode === 'keys');
        assert.ok(line, 'auth status logged at start-up');
        assert.equal(line.keys, 0);
        assert.match(line.detail, /POST .*\/api\/v2\/tenants/);
        assert.match(line.detail, /\/api\/v2\/keys/);
    });
});

describe('a key\'s max_queued caps its tasks waiting in the scheduler', () => {
    let env3;
    before(async () => {
        env3 = await startEnv({
            configure: (c) => ({
                ...c,
                auth: { enabled: true },
                scheduler: { max_running_tasks: 1, reserved_realtime_slots: 0 },
            }),
            env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
        });
    });
    after(async () => {
        await env3?.close();
    });

    test('one running, one queued, the next is refused with 429 QUEUE_FULL', async () => {
        const hdr = { authorization: `Bearer ${ADMIN_TOKEN}` };
        const t = await postJson(`${env3.base}/api/v2/tenants`, { name: 'q' }, { headers: hdr });
        const k = await postJson(`${env3.base}/api/v2/keys`, { tenant_id: t.json.id, max_queued: 1 }, { headers: hdr });
        assert.equal(k.status, 201, k.text);
        await env3.mock.script({ model: 'up-chat', times: 2, action: { delay_first_byte_ms: 700 } });
        const h = { headers: { authorization: `Bearer ${k.json.key}` } };
        const url = `${env3.api}/chat/completions`;
        // P1: a full single slot is backpressure level 3, which still admits P0-P1
        const body = { model: 'chat', messages, priority: 'P1' };
        const first = postJson(url, body, h);
        await sleep(100); // the first one holds the only slot
        const second = postJson(url, body, h);
        await sleep(100); // the second one waits in the queue
        const third = await postJson(url, body, h);
        assert.equal(third.status, 429, third.text);
        assert.equal(third.json.error.code, 'QUEUE_FULL');
        // the cap is the key's: another key of the tenant still queues
        const other = await postJson(`${env3.base}/api/v2/keys`, { tenant_id: t.json.id }, { headers: hdr });
        const queued = await postJson(url, body, { headers: { authorization: `Bearer ${other.json.key}` } });
        assert.equal(queued.status, 200, queued.text);
        assert.equal((await first).status, 200);
        assert.equal((await second).status, 200);
    });
});

describe('failed admin sign-ins are limited per address', () => {
    let env4;
    before(async () => {
        env4 = await startEnv({ env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
    });
    after(async () => {
        await env4?.close();
    });

    const get = (token) => fetch(`${env4.base}/api/v2/tenants`, {
        headers: token ? { authorization: `Bearer ${token}` } : {}, signal: AbortSignal.timeout(5000),
    }).then(async (r) => ({ status: r.status, headers: r.headers, json: await r.json() }));

    test('ten wrong tokens a minute, then 429 with Retry-After even for the right one; all audited', async () => {
        assert.equal((await get(ADMIN_TOKEN)).status, 200);
        for (let i = 0; i < 3; i++) assert.equal((await get(null)).status, 401); // no token: no guess
        for (let i = 0; i < 10; i++) {
            const r = await get(`wrong-${i}`);
            assert.equal(r.status, 401);
            assert.equal(r.json.error.code, 'AUTH_FAILED');
        }
        const blocked = await get(ADMIN_TOKEN);
        assert.equal(blocked.status, 429);
        assert.equal(blocked.json.error.code, 'RATE_LIMITED');
        const retry = Number(blocked.headers.get('retry-after'));
        assert.ok(retry >= 1 && retry <= 60, `Retry-After ${retry}`);
        assert.equal((await get('wrong-again')).status, 429, 'a blocked address is not even checked');
        // the audit, read from the database (the API is closed to this address for now)
        const { execFileSync } = await import('node:child_process');
        const db = env4.config.storage.path;
        await waitFor(() => Number(execFileSync('sqlite3', [db,
            "SELECT COUNT(*) FROM audit_logs WHERE action = 'admin.auth_failed' AND actor = 'unauthenticated' AND status = 401"],
        { encoding: 'utf8' }).trim()) === 10, { what: 'ten audited failures' });
        // the inference path is not affected
        const chat = await postJson(`${env4.api}/chat/completions`, { model: 'chat', messages });
        assert.equal(chat.status, 200);
    });
});
