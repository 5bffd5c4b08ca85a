// The dashboard's endpoints (issue 22) over plain HTTP: GET / redirects, the page and its
// vendored files (the npm packages' own bytes, with their licences), the sign-in that gives an
// HttpOnly SameSite=Strict cookie with an expiry, the admin API with that cookie (CSRF token
// required for writes), the SSE stream (snapshots, request events, Last-Event-ID, the stream
// cap, sign-out ending it), a tenant admin seeing only its tenant, and dashboard.enabled: false.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { REPO_ROOT, RawConn, gatewayBin, rawRequest, startEnv, postJson } from './lib/harness.mjs';
import { openStream, signIn, withSession } from './lib/dashboard.mjs';

const ADMIN_TOKEN = 'adm-dashboard-e2e-token-41c9';
const messages = [{ role: 'user', content: 'dashboard' }];

let env;

before(async () => {
    env = await startEnv({
        configure: (c) => ({
            ...c, auth: { enabled: true }, health: { probes: false },
            dashboard: { stream_interval_ms: 250, max_streams: 3, session_ttl_s: 600 },
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
});

after(async () => {
    await env?.close();
});

function bearer(method, p, body) {
    return withSession(env.base, method, p, { body, headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
}

function chat(key, model = 'chat') {
    return postJson(`${env.api}/chat/completions`, { model, messages }, { headers: { authorization: `Bearer ${key}` } });
}

describe('the page', () => {
    test('GET / redirects to /api/dashboard, which is the page with a strict CSP', async () => {
        const r = await fetch(`${env.base}/`, { redirect: 'manual', signal: AbortSignal.timeout(5000) });
        assert.equal(r.status, 302);
        assert.equal(r.headers.get('location'), '/api/dashboard');
        const page = await fetch(`${env.base}/api/dashboard`, { signal: AbortSignal.timeout(5000) });
        assert.equal(page.status, 200);
        assert.match(page.headers.get('content-type'), /^text\/html/);
        const csp = page.headers.get('content-security-policy');
        assert.match(csp, /default-src 'self'/);
        assert.match(csp, /frame-ancestors 'none'/);
        assert.doesNotMatch(csp, /https?:/, 'no other origin is allowed');
        const html = await page.text();
        assert.match(html, /type="password"/);
        assert.ok(!/<script(?![^>]*\ssrc=)[^>]*>/.test(html), 'no inline script');
        assert.ok(!/(src|href)="(https?:)?\/\//.test(html), 'nothing is loaded from elsewhere (no CDN)');
        for (const m of html.matchAll(/(?:src|href)="(\/api\/dashboard\/[^"]+)"/g)) {
            const r = await fetch(`${env.base}${m[1]}`, { signal: AbortSignal.timeout(5000) });
            assert.equal(r.status, 200, m[1]);
        }
    });

    test('the vendored files are the npm packages\' bytes, with their licences, and conditional GET works', async () => {
        const pairs = [
            ['vendor/alpine.min.js', 'tests/node_modules/alpinejs/dist/cdn.min.js'],
            ['vendor/chart.umd.min.js', 'tests/node_modules/chart.js/dist/chart.umd.min.js'],
        ];
        for (const [served, npm] of pairs) {
            const r = await fetch(`${env.base}/api/dashboard/${served}`, { signal: AbortSignal.timeout(5000) });
            assert.equal(r.status, 200, served);
            assert.match(r.headers.get('content-type'), /^text\/javascript/);
            assert.ok(Buffer.from(await r.arrayBuffer()).equals(fs.readFileSync(path.join(REPO_ROOT, npm))), `${served} = ${npm}`);
            const again = await fetch(`${env.base}/api/dashboard/${served}`,
                { headers: { 'if-none-match': r.headers.get('etag') }, signal: AbortSignal.timeout(5000) });
            assert.equal(again.status, 304);
        }
        for (const lic of ['LICENSE.alpinejs.txt', 'LICENSE.chart.js.md', 'LICENSE.vue-reactivity.txt', 'VERSIONS.txt']) {
            const r = await fetch(`${env.base}/api/dashboard/vendor/${lic}`, { signal: AbortSignal.timeout(5000) });
            assert.equal(r.status, 200, lic);
            assert.match(await r.text(), /MIT/);
        }
        const check = spawnSync(process.execPath, [path.join(REPO_ROOT, 'scripts/webui-vendor.mjs'), '--check'], { encoding: 'utf8' });
        assert.equal(check.status, 0, `webui/vendor matches tests/node_modules: ${check.stderr}`);
        const missing = await fetch(`${env.base}/api/dashboard/../../etc/passwd`, { signal: AbortSignal.timeout(5000) });
        assert.equal(missing.status, 404);
        const post = await fetch(`${env.base}/api/dashboard/app.js`, { method: 'POST', signal: AbortSignal.timeout(5000) });
        assert.equal(post.status, 405);
    });
});

describe('sign-in, cookie, CSRF, sign-out', () => {
    test('a wrong token is 401 and sets no cookie; a non-JSON body is 415', async () => {
        for (const token of ['nope', `${ADMIN_TOKEN}x`, 'mgt-not-a-real-token-aaaaaaaaaaaaaaaaaaaaaaa']) {
            const r = await signIn(env.base, token);
            assert.equal(r.status, 401, r.text);
            assert.equal(r.setCookie, null);
        }
        const form = await fetch(`${env.base}/api/dashboard/login`, {
            method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' },
            body: `token=${ADMIN_TOKEN}`, signal: AbortSignal.timeout(5000),
        });
        assert.equal(form.status, 415);
        const empty = await withSession(env.base, 'POST', '/api/dashboard/login', { body: {} });
        assert.equal(empty.status, 400);
    });

    test('the admin token gives an HttpOnly, SameSite=Strict cookie with an expiry and a CSRF token', async () => {
        const r = await signIn(env.base, ADMIN_TOKEN);
        assert.equal(r.status, 200, r.text);
        assert.match(r.setCookie, /^mg_session=[0-9a-f]{64};/);
        assert.match(r.setCookie, /; HttpOnly/);
        assert.match(r.setCookie, /; SameSite=Strict/);
        assert.match(r.setCookie, /; Max-Age=600/);
        assert.match(r.setCookie, /; Path=\/;/);
        assert.equal(r.json.role, 'platform');
        assert.match(r.json.csrf_token, /^[0-9a-f]{64}$/);
        assert.ok(r.json.expires_at > Date.now() / 1000 + 500 && r.json.expires_at < Date.now() / 1000 + 700);
        assert.ok(!r.text.includes(ADMIN_TOKEN), 'the token is not echoed');
        const s = await withSession(env.base, 'GET', '/api/dashboard/session', { cookie: r.cookie });
        assert.equal(s.status, 200);
        assert.equal(s.json.csrf_token, r.json.csrf_token);
        const none = await withSession(env.base, 'GET', '/api/dashboard/session');
        assert.equal(none.status, 401);
        const forged = await withSession(env.base, 'GET', '/api/dashboard/session', { cookie: `mg_session=${'0'.repeat(64)}` });
        assert.equal(forged.status, 401);
    });

    test('the cookie reaches the admin API; a write without the CSRF token, or a wrong one, is 403', async () => {
        const { cookie, json } = await signIn(env.base, ADMIN_TOKEN);
        const read = await withSession(env.base, 'GET', '/api/v2/pools', { cookie });
        assert.equal(read.status, 200, read.text);
        assert.ok(read.json.main);
        const noCsrf = await withSession(env.base, 'POST', '/api/v2/tenants', { cookie, body: { name: 'csrf-none' } });
        assert.equal(noCsrf.status, 403);
        assert.equal(noCsrf.json.error.code, 'CSRF_FAILED');
        const wrong = await withSession(env.base, 'POST', '/api/v2/tenants', { cookie, csrf: 'f'.repeat(64), body: { name: 'csrf-wrong' } });
        assert.equal(wrong.status, 403);
        const del = await withSession(env.base, 'DELETE', '/api/v2/keys/1', { cookie });
        assert.equal(del.status, 403);
        const ok = await withSession(env.base, 'POST', '/api/v2/tenants', { cookie, csrf: json.csrf_token, body: { name: 'csrf-ok' } });
        assert.equal(ok.status, 201, ok.text);
        const tenants = await bearer('GET', '/api/v2/tenants');
        const names = tenants.json.data.map((t) => t.name);
        assert.ok(names.includes('csrf-ok') && !names.includes('csrf-none') && !names.includes('csrf-wrong'));
        // no cookie, no bearer: the admin API's own 401
        assert.equal((await withSession(env.base, 'GET', '/api/v2/pools')).status, 401);
    });

    test('sign-out needs the CSRF token, ends the session, clears the cookie and ends its streams', async () => {
        const { cookie, json } = await signIn(env.base, ADMIN_TOKEN);
        const st = await openStream(env.base, cookie);
        assert.equal(st.status, 200);
        await st.waitFor((e) => e.event === 'snapshot', { what: 'a first snapshot' });
        const refused = await withSession(env.base, 'POST', '/api/dashboard/logout', { cookie });
        assert.equal(refused.status, 403);
        const out = await withSession(env.base, 'POST', '/api/dashboard/logout', { cookie, csrf: json.csrf_token });
        assert.equal(out.status, 204);
        assert.match(out.headers.get('set-cookie'), /^mg_session=; .*Max-Age=0/);
        await st.waitFor((e) => e.event === 'signed_out', { what: 'signed_out' });
        await st.waitEnd();
        assert.equal((await withSession(env.base, 'GET', '/api/dashboard/session', { cookie })).status, 401);
        assert.equal((await withSession(env.base, 'GET', '/api/v2/pools', { cookie })).status, 401);
        assert.equal((await openStream(env.base, cookie)).status, 401);
    });
});

describe('the stream', () => {
    let key;
    let tenantA;
    let tenantB;
    let keyB;

    before(async () => {
        const a = await bearer('POST', '/api/v2/tenants', { name: 'stream-a' });
        const b = await bearer('POST', '/api/v2/tenants', { name: 'stream-b' });
        tenantA = a.json.id;
        tenantB = b.json.id;
        key = (await bearer('POST', '/api/v2/keys', { tenant_id: tenantA, name: 'a-key' })).json.key;
        keyB = (await bearer('POST', '/api/v2/keys', { tenant_id: tenantB, name: 'b-key' })).json.key;
        assert.ok(key && keyB);
    });

    test('text/event-stream with retry:, a snapshot of providers, pools and the queue, request events as traffic flows', async () => {
        const { cookie } = await signIn(env.base, ADMIN_TOKEN);
        const st = await openStream(env.base, cookie);
        try {
            assert.equal(st.status, 200);
            assert.match(st.headers.get('content-type'), /^text\/event-stream/);
            const first = await st.waitFor((e) => e.retry !== null || e.event === 'snapshot', { what: 'retry' });
            assert.equal(first.retry, 3000);
            const snap = await st.waitFor((e) => e.event === 'snapshot');
            const s = snap.data;
            assert.equal(s.scope, 'platform');
            assert.ok(Math.abs(s.server_time_ms - Date.now()) < 60000);
            const ids = s.providers.map((p) => p.id).sort();
            assert.deepEqual(ids, ['dead', 'mock-ollama', 'mock-openai', 'mock-openai-b']);
            for (const p of s.providers) assert.ok(!('api_key' in p), 'no key in the stream, masked or not');
            assert.ok(!JSON.stringify(s).includes('sk-e2e-secret'), 'the provider key never appears');
            assert.equal(s.pools.main.total, 4);
            assert.deepEqual(Object.keys(s.scheduler.queued_by_priority), ['P0', 'P1', 'P2', 'P3', 'P4']);
            const before = s.providers.find((p) => p.id === 'mock-openai').requests_total;
            const from = st.events.length;
            const r = await chat(key);
            assert.equal(r.status, 200, r.text);
            const rid = r.headers.get('x-request-id');
            const ev = await st.waitFor((e) => e.event === 'request' && e.data.request_id === rid, { from, what: 'the request event' });
            assert.equal(ev.data.model, 'chat');
            assert.equal(ev.data.provider, 'mock-openai');
            assert.equal(ev.data.status, 200);
            assert.equal(ev.data.tenant_id, tenantA);
            assert.equal(ev.id, String(ev.data.seq));
            assert.ok(!JSON.stringify(ev.data).includes('dashboard'), 'no prompt text in the event');
            const moved = await st.waitFor((e) => e.event === 'snapshot' &&
                e.data.providers.find((p) => p.id === 'mock-openai').requests_total > before, { from, what: 'a snapshot with the request counted' });
            assert.ok(moved);
        } finally {
            st.close();
        }
    });

    test('Last-Event-ID resumes after that request: the earlier ones are not sent again', async () => {
        const { cookie } = await signIn(env.base, ADMIN_TOKEN);
        const r1 = await chat(key);
        const r2 = await chat(key);
        const id1 = r1.headers.get('x-request-id');
        const id2 = r2.headers.get('x-request-id');
        const st = await openStream(env.base, cookie);
        const e1 = await st.waitFor((e) => e.event === 'request' && e.data.request_id === id1, { what: 'r1 replayed to a new stream' });
        await st.waitFor((e) => e.event === 'request' && e.data.request_id === id2);
        st.close();
        const resumed = await openStream(env.base, cookie, { lastEventId: e1.id });
        try {
            await resumed.waitFor((e) => e.event === 'request' && e.data.request_id === id2, { what: 'r2 after Last-Event-ID' });
            await resumed.waitFor((e) => e.event === 'snapshot');
            assert.ok(!resumed.events.some((e) => e.event === 'request' && Number(e.id) <= Number(e1.id)),
                'nothing at or before Last-Event-ID');
        } finally {
            resumed.close();
        }
    });

    test('server-side filters: ?model=, ?provider=, ?errors=1 pick the request events sent', async () => {
        const { cookie } = await signIn(env.base, ADMIN_TOKEN);
        const byModel = await openStream(`${env.base}`, cookie, { query: 'model=ollama-chat' });
        const errors = await openStream(`${env.base}`, cookie, { query: 'errors=1&provider=mock-openai' });
        try {
            const ok = await chat(key, 'ollama-chat');
            const plain = await chat(key);
            const bad = await postJson(`${env.api}/chat/completions`, { model: 'no-such-model', messages }, { headers: { authorization: `Bearer ${key}` } });
            assert.equal(ok.status, 200);
            assert.equal(plain.status, 200);
            assert.equal(bad.status, 404);
            await env.mock.script({ model: 'up-chat', action: { status: 500 }, times: 1 });
            const failed = await chat(key);
            assert.ok(failed.status >= 500, `a 500 upstream fails the request (${failed.status})`);
            await byModel.waitFor((e) => e.event === 'request' && e.data.request_id === ok.headers.get('x-request-id'), { what: 'the ollama-chat request' });
            const last = await errors.waitFor((e) => e.event === 'request' && e.data.request_id === failed.headers.get('x-request-id'), { what: 'the failed request' });
            // the model-filtered stream has looked at every request up to the last one
            await byModel.waitFor((e) => e.event === 'snapshot' && Number(e.id) >= last.data.seq, { what: 'a snapshot past the last request' });
            const m = byModel.events.filter((e) => e.event === 'request');
            assert.ok(m.length >= 1 && m.every((e) => e.data.model === 'ollama-chat'), 'only ollama-chat');
            const x = errors.events.filter((e) => e.event === 'request');
            assert.ok(x.every((e) => e.data.status >= 400 && e.data.provider === 'mock-openai'), 'only mock-openai errors');
            assert.ok(!x.some((e) => e.data.request_id === plain.headers.get('x-request-id')));
        } finally {
            byModel.close();
            errors.close();
        }
    });

    test('at most dashboard.max_streams at once: the next one is 503, a closed one frees its place', async () => {
        const { cookie } = await signIn(env.base, ADMIN_TOKEN);
        const open = [];
        try {
            for (let i = 0; i < 3; i++) {
                const s = await openStream(env.base, cookie);
                assert.equal(s.status, 200, `stream ${i}`);
                await s.waitFor((e) => e.event === 'snapshot');
                open.push(s);
            }
            const extra = await openStream(env.base, cookie);
            assert.equal(extra.status, 503, extra.text);
            assert.match(extra.text, /STREAMS_FULL/);
            open.pop().close();
            let again;
            for (let i = 0; i < 40; i++) { // bounded: the gateway notices the close on its next read
                again = await openStream(env.base, cookie);
                if (again.status === 200) break;
                await new Promise((r) => setTimeout(r, 50));
            }
            assert.equal(again.status, 200);
            open.push(again);
        } finally {
            for (const s of open) s.close();
        }
    });

    test('a 429 shows in the next snapshot with the cooldown\'s end; history lists it; clearing it is one DELETE', async () => {
        const { cookie, json } = await signIn(env.base, ADMIN_TOKEN);
        const st = await openStream(env.base, cookie);
        try {
            await st.waitFor((e) => e.event === 'snapshot');
            await env.mock.script({ model: 'up-chat', action: { status: 429 }, times: 1 });
            const from = st.events.length;
            const r = await chat(key);
            assert.ok(r.status >= 400, `the 429 reaches the client as an error (${r.status})`);
            const cooling = await st.waitFor((e) => e.event === 'snapshot' &&
                e.data.providers.find((p) => p.id === 'mock-openai').cooldown_until_ms !== null, { from, what: 'a snapshot with the cooldown' });
            const p = cooling.data.providers.find((x) => x.id === 'mock-openai');
            assert.equal(p.status, 'cooldown');
            assert.ok(p.cooldown_until_ms > cooling.data.server_time_ms, 'it ends in the future');
            assert.ok(p.cooldowns_total >= 1);
            assert.equal(cooling.data.pools.main.cooldown, 1);
            const hist = await withSession(env.base, 'GET', '/api/v2/cooldowns/history?provider_id=mock-openai', { cookie });
            assert.equal(hist.status, 200, hist.text);
            assert.equal(hist.json.data[0].provider_id, 'mock-openai');
            assert.equal(hist.json.data[0].response_summary, 'HTTP 429');
            assert.ok(hist.json.data[0].cooldown_seconds > 0);
            const noCsrf = await withSession(env.base, 'DELETE', '/api/v2/cooldowns/mock-openai', { cookie });
            assert.equal(noCsrf.status, 403);
            const missing = await withSession(env.base, 'DELETE', '/api/v2/cooldowns/no-such', { cookie, csrf: json.csrf_token });
            assert.equal(missing.status, 404);
            const from2 = st.events.length;
            const clear = await withSession(env.base, 'DELETE', '/api/v2/cooldowns/mock-openai', { cookie, csrf: json.csrf_token });
            assert.equal(clear.status, 200, clear.text);
            assert.equal(clear.json.was_cooling, true);
            assert.equal(clear.json.status, 'active');
            await st.waitFor((e) => e.event === 'snapshot' &&
                e.data.providers.find((x) => x.id === 'mock-openai').status === 'active', { from: from2, what: 'the provider active again' });
            assert.equal((await chat(key)).status, 200, 'it serves again at once');
            const audit = await bearer('GET', '/api/v2/audit?limit=20');
            assert.ok(audit.json.data.some((x) => x.action === 'cooldown.clear' && x.target === 'provider:mock-openai'));
        } finally {
            st.close();
        }
    });

    test('the tasks page\'s calls: /v1/tasks with a platform session lists every task; cancelling needs the CSRF token', async () => {
        const { cookie, json } = await signIn(env.base, ADMIN_TOKEN);
        await env.mock.script({ model: 'up-chat', action: { delay_first_byte_ms: 20000 }, times: 1 });
        const sub = await postJson(`${env.api}/tasks`, { model: 'chat', messages }, { headers: { authorization: `Bearer ${key}` } });
        assert.equal(sub.status, 202, sub.text);
        const id = sub.json.task_id ?? sub.json.id;
        const list = await withSession(env.base, 'GET', '/v1/tasks', { cookie });
        assert.equal(list.status, 200, list.text);
        assert.ok(list.json.data.some((t) => t.task_id === id), 'the key\'s task is listed for the operator');
        const refused = await withSession(env.base, 'DELETE', `/v1/tasks/${id}`, { cookie });
        assert.equal(refused.status, 403);
        const cancel = await withSession(env.base, 'DELETE', `/v1/tasks/${id}`, { cookie, csrf: json.csrf_token });
        assert.ok(cancel.status < 300, `${cancel.status} ${cancel.text}`);
        const after = await withSession(env.base, 'GET', `/v1/tasks/${id}`, { cookie });
        assert.equal(after.status, 200, after.text);
        assert.match(after.json.status, /CANCEL/);
        // no session, no key: 401 as before
        assert.equal((await withSession(env.base, 'GET', '/v1/tasks')).status, 401);
    });

    test('a tenant admin signs in to its tenant: its keys only, no provider state, its requests only', async () => {
        const tok = await bearer('POST', '/api/v2/admin-tokens', { tenant_id: tenantA, name: 'dash-a' });
        assert.equal(tok.status, 201, tok.text);
        const r = await signIn(env.base, tok.json.token);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.role, 'tenant_admin');
        assert.equal(r.json.tenant_id, tenantA);
        const keys = await withSession(env.base, 'GET', '/api/v2/keys', { cookie: r.cookie });
        assert.equal(keys.status, 200, keys.text);
        assert.ok(keys.json.data.length >= 1);
        assert.ok(keys.json.data.every((k) => k.tenant_id === tenantA), 'only its own keys');
        const providers = await withSession(env.base, 'GET', '/api/v2/providers', { cookie: r.cookie });
        assert.equal(providers.status, 403);
        const other = await withSession(env.base, 'POST', '/api/v2/keys', { cookie: r.cookie, csrf: r.json.csrf_token, body: { tenant_id: tenantB } });
        assert.equal(other.status, 403);
        const clear = await withSession(env.base, 'DELETE', '/api/v2/cooldowns/mock-openai', { cookie: r.cookie, csrf: r.json.csrf_token });
        assert.equal(clear.status, 403, 'provider state is the platform\'s');
        assert.equal((await withSession(env.base, 'GET', '/api/v2/cooldowns/history', { cookie: r.cookie })).status, 403);
        assert.equal((await withSession(env.base, 'GET', '/v1/tasks', { cookie: r.cookie })).status, 401, 'tasks are the platform\'s');
        const st = await openStream(env.base, r.cookie);
        try {
            const snap = await st.waitFor((e) => e.event === 'snapshot');
            assert.equal(snap.data.scope, 'tenant');
            assert.equal(snap.data.tenant_id, tenantA);
            assert.ok(!('providers' in snap.data) && !('pools' in snap.data));
            const from = st.events.length;
            const rb = await chat(keyB);
            const ra = await chat(key);
            const ida = ra.headers.get('x-request-id');
            await st.waitFor((e) => e.event === 'request' && e.data.request_id === ida, { from, what: 'tenant A request' });
            const seen = st.events.filter((e) => e.event === 'request');
            assert.ok(seen.length >= 1);
            assert.ok(seen.every((e) => e.data.tenant_id === tenantA), 'only tenant A\'s requests');
            assert.ok(!seen.some((e) => e.data.request_id === rb.headers.get('x-request-id')));
        } finally {
            st.close();
        }
        // revoking the token ends what the session may do at once
        const revoke = await bearer('DELETE', `/api/v2/admin-tokens/${tok.json.id}`);
        assert.equal(revoke.status, 200, revoke.text);
        assert.equal((await withSession(env.base, 'GET', '/api/v2/keys', { cookie: r.cookie })).status, 401);
        assert.equal((await signIn(env.base, tok.json.token)).status, 401);
    });
});

describe('a dashboard that stops reading', { timeout: 90000 }, () => {
    let slow;
    before(async () => {
        // 150 more providers make each snapshot some 120 KB, so a client that reads nothing
        // fills the loopback buffers within seconds of traffic
        const extra = Array.from({ length: 150 }, (_, i) => ({ id: `pad-${String(i).padStart(2, '0')}-${'x'.repeat(40)}`, adapter: 'openai', base_url: 'http://127.0.0.1:9/v1' }));
        slow = await startEnv({
            extraProviders: extra,
            server: { write_timeout_ms: 1500 },
            configure: (c) => ({ ...c, health: { probes: false }, dashboard: { stream_interval_ms: 250, max_streams: 1 } }),
            env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
        });
    });
    after(async () => {
        await slow?.close();
    });

    test('is dropped (its place frees) while every proxied request is served', async () => {
        const { cookie } = await signIn(slow.base, ADMIN_TOKEN);
        const conn = await RawConn.open(slow.gw.port);
        await conn.write(rawRequest('GET', '/api/dashboard/stream', { headers: { cookie } }));
        await conn.waitText('event: snapshot');
        conn.socket.pause(); // never reads again
        const busy = await openStream(slow.base, cookie);
        assert.equal(busy.status, 503, 'max_streams is 1: the slow one holds it');
        let served = 0;
        let freed = null;
        const deadline = Date.now() + 45000;
        // bounded in count and time: traffic keeps every snapshot new (4 a second, ~120 KB each)
        for (let i = 0; i < 3000 && !freed && Date.now() < deadline; i++) {
            const r = await postJson(`${slow.api}/chat/completions`, { model: 'chat', messages });
            assert.equal(r.status, 200, `request ${i} served while a dashboard stalls`);
            served++;
            await new Promise((res) => setTimeout(res, 20));
            if (i % 10 === 9) {
                const s = await openStream(slow.base, cookie);
                if (s.status === 200) freed = s;
            }
        }
        assert.ok(freed, `the stalled stream was dropped within ${served} requests`);
        await freed.waitFor((e) => e.event === 'snapshot');
        freed.close();
        conn.destroy();
        assert.ok(await conn.waitClose(100) || conn.closed || true);
    });
});

describe('an installed tree', { timeout: 60000 }, () => {
    test('the binary serves the files of <prefix>/share/moongate/webui, and dashboard.dir wins over both', async () => {
        const prefix = fs.mkdtempSync(path.join(env.dir, 'inst-'));
        const inst = spawnSync('cmake', ['--install', path.dirname(gatewayBin()), '--prefix', prefix], { encoding: 'utf8' });
        assert.equal(inst.status, 0, inst.stderr);
        const page = path.join(prefix, 'share/moongate/webui/index.html');
        fs.writeFileSync(page, fs.readFileSync(page, 'utf8').replace('<title>', '<title>installed copy · '));
        const own = path.join(prefix, 'own-webui');
        fs.mkdirSync(own);
        fs.writeFileSync(path.join(own, 'index.html'), '<!doctype html><title>operator copy</title>');
        const prev = process.env.MOONGATE_BIN;
        process.env.MOONGATE_BIN = path.join(prefix, 'bin/moongate');
        let a;
        let b;
        try {
            a = await startEnv({ env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
            b = await startEnv({ configure: (c) => ({ ...c, dashboard: { dir: own } }), env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
            const ta = await (await fetch(`${a.base}/api/dashboard`, { signal: AbortSignal.timeout(5000) })).text();
            assert.match(ta, /<title>installed copy · moongate dashboard/);
            const tb = await (await fetch(`${b.base}/api/dashboard`, { signal: AbortSignal.timeout(5000) })).text();
            assert.match(tb, /operator copy/);
            assert.equal((await fetch(`${b.base}/api/dashboard/app.js`, { signal: AbortSignal.timeout(5000) })).status, 404);
        } finally {
            if (prev === undefined) delete process.env.MOONGATE_BIN;
            else process.env.MOONGATE_BIN = prev;
            await a?.close();
            await b?.close();
        }
    });

    test('a dashboard.dir without index.html: the gateway serves, the page answers 503 and says why', async () => {
        const empty = fs.mkdtempSync(path.join(env.dir, 'empty-'));
        const e = await startEnv({ configure: (c) => ({ ...c, dashboard: { dir: empty } }), env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
        try {
            const r = await fetch(`${e.base}/api/dashboard`, { signal: AbortSignal.timeout(5000) });
            assert.equal(r.status, 503);
            assert.match(await r.text(), /DASHBOARD_UNAVAILABLE/);
            await e.gw.waitLog((l) => l.level === 'warn' && /WebUI files are missing/.test(l.msg), { what: 'the warning' });
            assert.equal((await fetch(`${e.base}/health`, { signal: AbortSignal.timeout(5000) })).status, 200);
        } finally {
            await e.close();
        }
    });
});

describe('dashboard.enabled: false', () => {
    let off;
    before(async () => {
        off = await startEnv({
            configure: (c) => ({ ...c, dashboard: { enabled: false } }),
            env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
        });
    });
    after(async () => {
        await off?.close();
    });

    test('/ and /api/dashboard answer 404, sign-in is impossible, the Bearer admin API is unchanged', async () => {
        assert.equal((await fetch(`${off.base}/`, { redirect: 'manual', signal: AbortSignal.timeout(5000) })).status, 404);
        assert.equal((await fetch(`${off.base}/api/dashboard`, { signal: AbortSignal.timeout(5000) })).status, 404);
        assert.equal((await signIn(off.base, ADMIN_TOKEN)).status, 404);
        const r = await withSession(off.base, 'GET', '/api/v2/pools', { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
        assert.equal(r.status, 200);
    });
});

describe('guessing the token', () => {
    let g;
    before(async () => {
        g = await startEnv({ env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
    });
    after(async () => {
        await g?.close();
    });

    test('ten failed sign-ins from one address within a minute: the next attempts are 429 with Retry-After', async () => {
        for (let i = 0; i < 10; i++) assert.equal((await signIn(g.base, `guess-${i}`)).status, 401, `guess ${i}`);
        const r = await fetch(`${g.base}/api/dashboard/login`, {
            method: 'POST', headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ token: ADMIN_TOKEN }), signal: AbortSignal.timeout(5000),
        });
        assert.equal(r.status, 429, 'even the right token waits: the address is guessing');
        assert.ok(Number(r.headers.get('retry-after')) > 0);
        assert.equal(r.headers.get('set-cookie'), null);
        // one count for every door to the admin token: the Bearer admin API waits too
        assert.equal((await bearerOn(g, 'GET', '/api/v2/pools')).status, 429, 'the admin API shares the count');
        // while the inference path does not
        assert.equal((await postJson(`${g.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: 'x' }] })).status, 200);
    });
});

function bearerOn(e, method, p) {
    return withSession(e.base, method, p, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
}

describe('config', () => {
    test('moongate --check refuses a bad dashboard section with the file and line', () => {
        const dir = fs.mkdtempSync(path.join(env.dir, 'chk-'));
        const cases = [
            ['dashboard:\n  max_streams: 0\n', /:2: dashboard.max_streams must be between 1 and 256/],
            ['dashboard:\n  enabled: maybe\n', /:2: dashboard.enabled must be true or false/],
            ['dashboard:\n  colour: blue\n', /:2: unknown key 'colour' in dashboard/],
            ['dashboard: 3\n', /:1: dashboard must be a mapping/],
        ];
        for (const [yaml, want] of cases) {
            const f = path.join(dir, 'bad.yaml');
            fs.writeFileSync(f, yaml);
            const r = spawnSync(gatewayBin(), ['--check', '-c', f], { encoding: 'utf8' });
            assert.equal(r.error, undefined, 'the gateway binary runs');
            assert.notEqual(r.status, 0, yaml);
            assert.match(r.stderr + r.stdout, want, yaml);
        }
    });
});
