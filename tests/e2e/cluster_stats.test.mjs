// Cluster analytics (issue 24): with cluster.postgres the usage analytics of the admin API
// read the cluster's PostgreSQL, where every instance's events and roll-ups are (PG
// migrations 1 and 5), not the instance's own SQLite. Requests spread unevenly over three
// instances; then /stats/overview, /stats/daily, /stats/tokens, /stats/providers/{id},
// /usage/analytics and /usage/events give the same answer on every instance, whose totals
// are the requests made (and PostgreSQL's count of events). A tenant admin sees its tenant
// only, on PostgreSQL too; the event list's seq cursor pages through PostgreSQL's events.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import os from 'node:os';
import path from 'node:path';
import { REPO_ROOT, adminCall, buildConfig, deadPort, postJson, startMock, waitFor } from './lib/harness.mjs';
import { closeInstances, startInstances } from './lib/instances.mjs';
import { postgresAvailable, startPostgres } from './lib/postgres.mjs';

const ADMIN_TOKEN = 'adm-cluster-stats-e2e-83f1a2';
const N = 3;
// requests per instance and tenant: uneven on purpose (an instance alone never has them all)
const SPREAD = [{ alpha: 7, beta: 0 }, { alpha: 3, beta: 2 }, { alpha: 1, beta: 4 }];
const TOTAL = SPREAD.reduce((s, x) => s + x.alpha + x.beta, 0);
const ALPHA = SPREAD.reduce((s, x) => s + x.alpha, 0);

let pg;
let mock;
let dirs = [];
const gws = [];
const tenants = {}; // name -> { id, key, token }

const skip = postgresAvailable() ? false : 'PostgreSQL server binaries not installed (scripts/setup)';

function config(dir, i, dead) {
    const m = (model) => ({ tokenizer: 'estimate', routes: [{ provider: 'mock-openai', model }] });
    const lua = { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') };
    const c = buildConfig(dir, mock.port, dead, { lua });
    return {
        ...c,
        auth: { enabled: true },
        health: { probes: false },
        providers: c.providers.map((p) => (p.id.startsWith('mock-openai') ? { ...p, cost_per_1k_tokens: 1 } : p)),
        models: { chat: m('up-chat'), other: m('up-other') },
        cluster: { node_id: `node-${i}`, postgres: { url: '${CLUSTER_PG_URL}' } },
    };
}

const admin = (i, method, p, body, token = ADMIN_TOKEN) => adminCall(gws[i].base, token, method, p, body);

/** The same GET on every instance: the answers, each 200. */
async function everywhere(p, token) {
    const out = [];
    for (let i = 0; i < N; i++) {
        const r = await admin(i, 'GET', p, undefined, token);
        assert.equal(r.status, 200, `instance ${i}: ${p}: ${r.text}`);
        out.push(r.json);
    }
    return out;
}

function same(answers, what) {
    for (let i = 1; i < N; i++) assert.deepEqual(answers[i], answers[0], `${what}: instance ${i} answers as instance 0`);
    return answers[0];
}

const sum = (rows, k) => rows.reduce((s, r) => s + r[k], 0);

/** Every event of a listing, page by page through the seq cursor (bounded). */
async function allEvents(i, query, token) {
    const ids = [];
    let cursor = null;
    for (let page = 0; page < 50; page++) {
        const r = await admin(i, 'GET', `usage/events?limit=4${query}${cursor ? `&cursor=${cursor}` : ''}`, undefined, token);
        assert.equal(r.status, 200, r.text);
        ids.push(...r.json.data.map((e) => e.request_id));
        if (!r.json.has_more) return ids;
        cursor = r.json.next_cursor;
    }
    throw new Error('usage/events did not end within 50 pages');
}

before(async () => {
    if (skip) return;
    pg = await startPostgres();
    mock = await startMock();
    const dead = await deadPort();
    const up = await startInstances(N, 'cstats', (dir, i) => config(dir, i, dead), { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN, CLUSTER_PG_URL: pg.url } });
    dirs = up.dirs;
    gws.push(...up.gws);
    for (const g of gws) await g.waitLog((l) => /^postgres: connected/.test(l.msg ?? ''), { timeoutMs: 20000, what: 'connected' });
    // tenants, keys and tenant admins made on instance 0: the control plane is shared
    for (const name of ['alpha', 'beta']) {
        const t = await admin(0, 'POST', 'tenants', { name });
        assert.equal(t.status, 201, t.text);
        const k = await admin(0, 'POST', 'keys', { tenant_id: t.json.id });
        assert.equal(k.status, 201, k.text);
        const tok = await admin(0, 'POST', 'admin-tokens', { tenant_id: t.json.id, name: `${name}-ops` });
        assert.equal(tok.status, 201, tok.text);
        tenants[name] = { id: t.json.id, key: k.json.key, keyId: k.json.id, token: tok.json.token };
        for (let i = 1; i < N; i++) {
            let last;
            await waitFor(async () => (await admin(i, 'GET', `keys/${k.json.id}`)).status === 200
                && (last = await admin(i, 'GET', 'stats/overview', undefined, tok.json.token)).status === 200,
            { timeoutMs: 10000, what: `tenant ${name}, its key and its admin on instance ${i}` }).catch((e) => {
                throw new Error(`${e.message}: ${last?.status} ${last?.text}`);
            });
        }
    }
    const work = [];
    SPREAD.forEach((per, i) => {
        for (const [name, n] of Object.entries(per)) {
            for (let j = 0; j < n; j++) {
                const body = { model: j % 2 ? 'other' : 'chat', messages: [{ role: 'user', content: `${name} ${j} `.repeat(j + 1) }], max_tokens: 20 };
                work.push(postJson(`${gws[i].base}/v1/chat/completions`, body, { headers: { authorization: `Bearer ${tenants[name].key}` } }));
            }
        }
    });
    for (const r of await Promise.all(work)) assert.equal(r.status, 200, r.text);
    await waitFor(() => Number(pg.rows('SELECT count(*) AS n FROM usage_events')[0].n) === TOTAL,
        { timeoutMs: 15000, what: 'every event in PostgreSQL' });
});

after(async () => {
    await closeInstances(gws, dirs);
    await mock?.close().catch(() => {});
    await pg?.close();
});

describe('cluster analytics read PostgreSQL', { skip }, () => {
    test('migration 5 ran once: the histograms and the new columns are there, kept by the trigger', () => {
        const versions = pg.rows('SELECT version FROM mg_schema ORDER BY version').map((r) => r.version);
        assert.deepEqual(versions, versions.map((_, i) => i + 1)); // each once, 5 among them
        assert.ok(versions.includes(5));
        const [h] = pg.rows("SELECT COALESCE(SUM(n), 0) AS n FROM usage_hist WHERE kind = 'latency'");
        assert.equal(Number(h.n), TOTAL, 'one latency bin per event');
        const bins = pg.rows('SELECT latency_ms, latency_bin FROM usage_events');
        for (const b of bins) {
            const ms = Number(b.latency_ms);
            const want = ms <= 0 ? 0 : Math.min(24, Math.floor(Math.log2(ms)) + 1);
            assert.equal(b.latency_bin, want, `the bin of ${ms} ms`);
        }
    });

    test('overview, daily, tokens and providers/{id}: the same on every instance, the requests made', async () => {
        const [pgCount] = pg.rows('SELECT count(*) AS n, SUM(cost_micros) AS c FROM usage_events');
        assert.equal(Number(pgCount.n), TOTAL);
        const o = same(await everywhere('stats/overview'), 'overview');
        assert.equal(o.today.requests, TOTAL);
        assert.equal(o.this_month.requests, TOTAL);
        assert.equal(o.today.cost_micros, Number(pgCount.c));
        const d = same(await everywhere('stats/daily?days=3'), 'daily');
        assert.equal(d.data.length, 3);
        assert.equal(sum(d.data, 'requests'), TOTAL);
        assert.equal(d.data[2].requests, TOTAL, 'all of them today');
        const now = Math.floor(Date.now() / 1000);
        const range = `from=${now - 6 * 3600}&to=${now + 3600}`;
        const t = same(await everywhere(`stats/tokens?bucket=hour&${range}`), 'tokens');
        assert.equal(sum(t.data, 'requests'), TOTAL);
        const [tok] = pg.rows('SELECT SUM(output_tokens) AS o FROM usage_events');
        assert.equal(sum(t.data, 'tokens_out'), Number(tok.o));
        const p = same(await everywhere('stats/providers/mock-openai'), 'providers/mock-openai');
        assert.equal(p.today.requests, TOTAL);
        assert.equal(sum(p.models_last_30_days, 'requests'), TOTAL);
        assert.deepEqual(p.models_last_30_days.map((m) => m.model).sort(), ['chat', 'other']);
    });

    test('usage/analytics: the same groups on every instance, percentiles from the histograms', async () => {
        const now = Math.floor(Date.now() / 1000);
        const range = `from=${now - 6 * 3600}&to=${now + 3600}`;
        for (const by of ['model', 'provider', 'key', 'project']) {
            const a = same(await everywhere(`usage/analytics?group_by=${by}&${range}`), `analytics by ${by}`);
            assert.equal(sum(a.data, 'requests'), TOTAL, `by ${by}`);
            for (const g of a.data) {
                assert.ok(g.latency_ms.p50 !== null && g.latency_ms.p95 >= g.latency_ms.p50, JSON.stringify(g.latency_ms));
                assert.equal(g.missing_usage, 0);
            }
        }
        const byKey = same(await everywhere(`usage/analytics?group_by=key&${range}`), 'analytics by key');
        assert.deepEqual(byKey.data.map((g) => [g.group, g.requests]).sort((x, y) => x[0] - y[0]),
            [[tenants.alpha.keyId, ALPHA], [tenants.beta.keyId, TOTAL - ALPHA]].sort((x, y) => x[0] - y[0]));
    });

    test('usage/events: every instance pages through all the cluster\'s events, each once', async () => {
        const want = pg.rows('SELECT request_id FROM usage_events ORDER BY seq DESC').map((r) => r.request_id);
        assert.equal(want.length, TOTAL);
        for (let i = 0; i < N; i++) assert.deepEqual(await allEvents(i, ''), want, `instance ${i}: newest first, each once`);
        const now = Math.floor(Date.now() / 1000);
        const ranged = await allEvents(1, `&from=${now - 3600}&to=${now + 60}`);
        assert.deepEqual(ranged, want, 'a time range finds them all');
        const one = await admin(2, 'GET', `usage/events?request_id=${want[3]}`);
        assert.equal(one.status, 200, one.text);
        assert.deepEqual(one.json.data.map((e) => e.request_id), [want[3]]);
        assert.equal(one.json.data[0].object, 'usage.event');
    });

    test('a tenant admin sees its own tenant only, on every instance', async () => {
        const a = tenants.alpha;
        const o = same(await everywhere('stats/overview', a.token), 'alpha overview');
        assert.equal(o.today.requests, ALPHA);
        const d = same(await everywhere('stats/daily?days=1', a.token), 'alpha daily');
        assert.equal(d.data[0].requests, ALPHA);
        const an = same(await everywhere('usage/analytics?group_by=key', a.token), 'alpha analytics');
        assert.deepEqual(an.data.map((g) => g.group), [a.keyId]);
        const want = pg.rows(`SELECT request_id FROM usage_events WHERE tenant_id = ${a.id} ORDER BY seq DESC`).map((r) => r.request_id);
        assert.equal(want.length, ALPHA);
        for (let i = 0; i < N; i++) assert.deepEqual(await allEvents(i, '', a.token), want, `instance ${i}: alpha's events`);
        // asking for another tenant's figures does not widen the view
        const other = await admin(0, 'GET', `stats/overview?tenant_id=${tenants.beta.id}`, undefined, a.token);
        if (other.status === 200) assert.equal(other.json.today.requests, ALPHA);
        else assert.ok(other.status === 403 || other.status === 404, other.text);
    });

    test('PostgreSQL away: 503 with a clear code, in bounded time, not the local figures', async () => {
        await pg.stop();
        try {
            const t0 = Date.now();
            const r = await admin(1, 'GET', 'stats/overview');
            assert.equal(r.status, 503, r.text);
            assert.equal(r.json.error.code, 'RESOURCE_EXHAUSTED');
            assert.ok(!r.text.includes(pg.url), 'the url is a secret');
            const e = await admin(2, 'GET', 'usage/events');
            assert.equal(e.status, 503, e.text);
            assert.ok(Date.now() - t0 < 9000, 'answered within the connect timeouts');
        } finally {
            await pg.start();
        }
    });
});
