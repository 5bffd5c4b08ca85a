// Usage analytics and prices (issue 19): every figure of /api/v2/stats/* and
// /api/v2/usage/analytics checked against the raw events (read with the sqlite3 shell); a
// tenant admin sees only its tenant; /api/v2/usage/events pages newest first with a cursor
// and carries no prompt or answer; /api/v2/prices adds versions and never rewrites one.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { sqliteRows, adminCall, startEnv, postJson, postStream, journalDrained } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-usage-analytics-token-5e1a';
let env;
let dbPath;
const tenants = []; // { id, key, keyId, token }

before(async () => {
    env = await startEnv({
        configure: (c) => ({
            ...c,
            auth: { enabled: true },
            health: { probes: false },
            prices: [{ provider: 'mock-openai', input_per_1m_micros: 1000000, output_per_1m_micros: 2000000 }],
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
    dbPath = env.config.storage.path;
    for (const name of ['alpha', 'beta']) {
        const t = await admin('POST', 'tenants', { name });
        assert.equal(t.status, 201, t.text);
        const k = await admin('POST', 'keys', { tenant_id: t.json.id, name: `${name}-key` });
        assert.equal(k.status, 201, k.text);
        const tok = await admin('POST', 'admin-tokens', { tenant_id: t.json.id, name: `${name}-ops` });
        assert.equal(tok.status, 201, tok.text);
        tenants.push({ id: t.json.id, key: k.json.key, keyId: k.json.id, token: tok.json.token });
    }
    // traffic: alpha 6 requests (one fails), beta 3; streamed and not; chat and embeddings
    const [a, b] = tenants;
    const auth = (t) => ({ authorization: `Bearer ${t.key}` });
    for (let i = 0; i < 4; i++) {
        const r = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: `alpha ${i} `.repeat(i + 1) }] }, { headers: auth(a) });
        assert.equal(r.status, 200, r.text);
    }
    const s = await postStream(`${env.api}/chat/completions`, { model: 'chat', stream: true, messages: [{ role: 'user', content: 'alpha streams' }] }, { headers: auth(a) });
    assert.equal(s.status, 200);
    await fetch(`http://127.0.0.1:${env.mock.port}/__mock/script`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'up-chat', times: 10, action: { status: 500 } }) });
    const f = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: 'fails' }] }, { headers: auth(a) });
    assert.ok(f.status >= 500);
    await fetch(`http://127.0.0.1:${env.mock.port}/__mock/reset`, { method: 'POST' });
    for (let i = 0; i < 2; i++) {
        const r = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: `beta ${i}` }] }, { headers: auth(b) });
        assert.equal(r.status, 200, r.text);
    }
    const e = await postJson(`${env.api}/embeddings`, { model: 'embed', input: 'beta embeds' }, { headers: auth(b) });
    assert.equal(e.status, 200, e.text);
});

after(async () => {
    await env?.close();
});

function admin(method, p, body, token = ADMIN_TOKEN) {
    return adminCall(env.base, token, method, p, body);
}

const query = (sql) => sqliteRows(dbPath, sql);

const rawTotals = (where = '1') => query(`SELECT COUNT(*) AS requests, COALESCE(SUM(status IN ('failed','timed_out')),0) AS errors,
    COALESCE(SUM(input_tokens + cached_read_tokens + cache_write_tokens),0) AS tokens_in, COALESCE(SUM(output_tokens),0) AS tokens_out,
    COALESCE(SUM(cost_micros),0) AS cost_micros FROM usage_events WHERE ${where}`)[0];
const pick = (o) => ({ requests: o.requests, errors: o.errors, tokens_in: o.tokens_in, tokens_out: o.tokens_out, cost_micros: o.cost_micros });

describe('analytics', () => {
    test('overview: today equals the raw events (platform: all; tenant admin: its own)', async () => {
        const all = await admin('GET', 'stats/overview');
        assert.equal(all.status, 200, all.text);
        const raw = rawTotals();
        assert.equal(raw.requests, 9);
        assert.ok(raw.cost_micros > 0);
        assert.deepEqual(pick(all.json.today), raw);
        assert.deepEqual(pick(all.json.this_month), raw);
        for (const t of tenants) {
            const mine = await admin('GET', 'stats/overview', undefined, t.token);
            assert.equal(mine.status, 200, mine.text);
            assert.deepEqual(pick(mine.json.today), rawTotals(`tenant_id = ${t.id}`), 'a tenant admin sees its own tenant only');
            // asking for the other tenant changes nothing
            const other = tenants.find((x) => x !== t);
            const forced = await admin('GET', `stats/overview?tenant_id=${other.id}`, undefined, t.token);
            assert.deepEqual(pick(forced.json.today), rawTotals(`tenant_id = ${t.id}`));
        }
    });

    test('daily and tokens series sum to the raw events', async () => {
        const d = await admin('GET', 'stats/daily?days=3');
        assert.equal(d.status, 200, d.text);
        assert.equal(d.json.data.length, 3, 'one entry per day, empty days included');
        const sum = (rows, k) => rows.reduce((a, r) => a + r[k], 0);
        const raw = rawTotals();
        for (const k of ['requests', 'errors', 'tokens_in', 'tokens_out', 'cost_micros']) assert.equal(sum(d.json.data, k), raw[k], `daily ${k}`);
        const h = await admin('GET', 'stats/tokens?bucket=hour');
        assert.equal(h.status, 200, h.text);
        assert.ok(h.json.data.length >= 24 && h.json.data.length <= 26);
        assert.equal(sum(h.json.data, 'tokens_in'), raw.tokens_in);
        assert.equal(sum(h.json.data, 'tokens_out'), raw.tokens_out);
        const bad = await admin('GET', 'stats/tokens?bucket=week');
        assert.equal(bad.status, 400);
        const badDays = await admin('GET', 'stats/daily?days=0');
        assert.equal(badDays.status, 400);
    });

    test('providers/{id}: totals and per model equal the raw events; unknown -> 404', async () => {
        const p = await admin('GET', 'stats/providers/mock-openai');
        assert.equal(p.status, 200, p.text);
        assert.deepEqual(pick(p.json.today), rawTotals("provider_id = 'mock-openai'"));
        const models = Object.fromEntries(p.json.models_last_30_days.map((m) => [m.model, m.requests]));
        const raw = Object.fromEntries(query("SELECT logical_model AS m, COUNT(*) AS n FROM usage_events WHERE provider_id = 'mock-openai' GROUP BY 1").map((r) => [r.m, r.n]));
        assert.deepEqual(models, raw);
        assert.equal((await admin('GET', 'stats/providers/nope')).status, 404);
    });

    test('usage/analytics by key and by model: counts, success rate, tokens, cost, percentiles, previous period', async () => {
        const r = await admin('GET', 'usage/analytics?group_by=key');
        assert.equal(r.status, 200, r.text);
        const raw = query(`SELECT key_id, COUNT(*) AS requests, SUM(status = 'succeeded') AS ok, SUM(cost_micros) AS cost,
            SUM(output_tokens) AS output, MAX(latency_ms) AS maxlat FROM usage_events GROUP BY key_id`);
        assert.equal(r.json.data.length, raw.length);
        for (const row of raw) {
            const g = r.json.data.find((x) => x.group === row.key_id);
            assert.ok(g, `group ${row.key_id}`);
            assert.equal(g.requests, row.requests);
            assert.equal(g.success_rate, row.ok / row.requests);
            assert.equal(g.cost_micros, row.cost);
            assert.equal(g.tokens_out, row.output);
            assert.ok(g.latency_ms.p50 <= g.latency_ms.p95 && g.latency_ms.p95 >= row.maxlat / 2, 'P95 bounds the slowest');
            assert.equal(g.previous.requests, 0, 'nothing in the previous period');
            assert.equal(g.change.requests, null);
        }
        const m = await admin('GET', 'usage/analytics?group_by=model');
        assert.deepEqual(m.json.data.map((g) => g.group).sort(), ['chat', 'embed']);
        // a tenant admin's groups are its own keys only
        const mine = await admin('GET', 'usage/analytics?group_by=key', undefined, tenants[1].token);
        assert.deepEqual(mine.json.data.map((g) => g.group), [tenants[1].keyId]);
        // the previous period: a window that starts an hour from now sees today's traffic as "previous"
        // (the window is made of the events' hours, so an hour's end during the test changes nothing)
        const { first, last } = query('SELECT MIN(at_ms / 3600000) * 3600 AS first, MAX(at_ms / 3600000) * 3600 AS last FROM usage_events')[0];
        const from = last + 3600;
        const later = await admin('GET', `usage/analytics?group_by=provider&from=${from}&to=${from + (last - first) + 3600}`);
        const prov = later.json.data.find((g) => g.group === 'mock-openai');
        assert.equal(prov.requests, 0, 'no traffic in the future window itself');
        assert.equal(prov.previous.requests, rawTotals("provider_id = 'mock-openai'").requests, 'the previous period has it');
        assert.equal(prov.previous.cost_micros, rawTotals("provider_id = 'mock-openai'").cost_micros);
        assert.equal(prov.change.requests, -1, 'a drop of 100 %');
        assert.equal((await admin('GET', 'usage/analytics?group_by=color')).status, 400);
    });

    test('usage/events: newest first, cursor pages cover every event once, filters, no prompt', async () => {
        const seen = [];
        let cursor = null;
        for (let i = 0; i < 10; i++) {
            const r = await admin('GET', `usage/events?limit=4${cursor ? `&cursor=${cursor}` : ''}`);
            assert.equal(r.status, 200, r.text);
            seen.push(...r.json.data.map((e) => e.request_id));
            if (!r.json.has_more) break;
            cursor = r.json.next_cursor;
        }
        const raw = query('SELECT request_id FROM usage_events ORDER BY seq DESC').map((r) => r.request_id);
        assert.deepEqual(seen, raw);
        const one = await admin('GET', 'usage/events?limit=1');
        assert.ok(!/alpha|beta|mock engine|says hello/.test(JSON.stringify(one.json.data)), 'no prompt or answer text');
        const failed = await admin('GET', 'usage/events?status=failed');
        assert.equal(failed.json.data.length, 1);
        assert.equal(failed.json.data[0].key_id, tenants[0].keyId);
        const byKey = await admin('GET', `usage/events?key_id=${tenants[1].keyId}`);
        assert.equal(byKey.json.data.length, 3);
        const mine = await admin('GET', 'usage/events', undefined, tenants[1].token);
        assert.ok(mine.json.data.every((e) => e.tenant_id === tenants[1].id) && mine.json.data.length === 3);
    });
});

describe('prices', () => {
    test('GET lists the versions; POST adds one that is in force from its effective_at; the old stays', async () => {
        const l = await admin('GET', 'prices');
        assert.equal(l.status, 200, l.text);
        assert.equal(l.json.data.length, 1);
        assert.equal(l.json.data[0].in_force, true);
        const old = l.json.data[0].version;
        const p = await admin('POST', 'prices', { provider: 'mock-openai', model: 'up-chat', input_per_1m_micros: 5000000,
            output_per_1m_micros: 5000000, effective_at: Math.floor(Date.now() / 1000) - 1 });
        assert.equal(p.status, 201, p.text);
        assert.match(p.json.version, /^db-\d+$/);
        const r = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: 'priced anew' }] },
            { headers: { authorization: `Bearer ${tenants[0].key}` } });
        assert.equal(r.status, 200);
        await journalDrained(env.gw);
        const e = query(`SELECT * FROM usage_events WHERE request_id = '${r.headers.get('x-request-id')}'`)[0];
        assert.equal(e.price_version, p.json.version);
        assert.equal(e.cost_micros, Math.ceil((e.input_tokens + e.output_tokens) * 5));
        const embed = await postJson(`${env.api}/embeddings`, { model: 'embed', input: 'still the old price' },
            { headers: { authorization: `Bearer ${tenants[0].key}` } });
        await journalDrained(env.gw);
        const ee = query(`SELECT * FROM usage_events WHERE request_id = '${embed.headers.get('x-request-id')}'`)[0];
        assert.equal(ee.price_version, old, 'another model keeps the provider-wide version');
        const after = await admin('GET', 'prices');
        assert.equal(after.json.data.length, 2);
        assert.ok(after.json.data.some((x) => x.version === old), 'the old version is still listed, unchanged');
        assert.equal(query('SELECT COUNT(*) AS n FROM prices')[0].n, 1);
    });

    test('bad prices: 400 naming the field; tenant admins cannot post', async () => {
        const cases = [
            {},
            { provider: 'mock-openai', input_per_1m_micros: -1, output_per_1m_micros: 1 },
            { provider: 'mock-openai', input_per_1m_micros: 1.5, output_per_1m_micros: 1 },
            { provider: 'nope', input_per_1m_micros: 1, output_per_1m_micros: 1 },
            { provider: 'mock-openai', input_per_1m_micros: 1, output_per_1m_micros: 1, color: 'red' },
            { provider: 'mock-openai', input_per_1m_micros: 1, output_per_1m_micros: 1, effective_at: 'yesterday' },
        ];
        for (const c of cases) {
            const r = await admin('POST', 'prices', c);
            assert.equal(r.status, 400, `${JSON.stringify(c)}: ${r.text}`);
            assert.equal(r.json.error.code, 'INVALID_REQUEST');
        }
        const t = await admin('POST', 'prices', { provider: 'mock-openai', input_per_1m_micros: 1, output_per_1m_micros: 1 }, tenants[0].token);
        assert.equal(t.status, 403);
        assert.equal((await admin('GET', 'prices', undefined, tenants[0].token)).status, 200);
    });
});
