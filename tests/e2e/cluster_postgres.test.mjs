// Scale-out, the PostgreSQL half (issue 24): three moongate instances, each with its own SQLite,
// sharing one throw-away PostgreSQL (lib/postgres.mjs) through cluster.postgres. Started at
// once against an empty database: the advisory-locked migrations run once. Usage events from
// every instance land once each, with their hourly buckets; a PostgreSQL restart mid-run
// loses none (queued and retried); the prepaid wallet lives there: its balance equals the sum
// of its entries after concurrent requests on all three, and 100 concurrent requests against a
// balance for 50 never oversell.
//
// Prices: the mock provider costs 1 per 1,000 tokens (1,000 micros a token); the models count
// prompts as "estimate" (body bytes / 4), so an estimate is (floor(bytes / 4) + max_tokens) x
// 1,000 micros.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { REPO_ROOT, adminCall, buildConfig, deadPort, gatewayBin, postJson, startMock, waitFor } from './lib/harness.mjs';
import { closeInstances, startInstances } from './lib/instances.mjs';
import { postgresAvailable, startPostgres } from './lib/postgres.mjs';

const ADMIN_TOKEN = 'adm-cluster-pg-e2e-5c1d9e';
const SECRET = 'whsec-cluster-pg-e2e-0123456789';
const PER_TOKEN = 1000;
const N = 3;

let pg;
let mock;
let dirs = [];
const gws = [];
const keys = {}; // tenant name -> [the key, as used on instance 0, 1, 2]
const tenants = {}; // tenant name -> id (made once, on instance 0)

const skip = postgresAvailable() ? false : 'PostgreSQL server binaries not installed (scripts/setup)';

function config(dir, i, dead) {
    const m = (model) => ({ tokenizer: 'estimate', routes: [{ provider: 'mock-openai', model }] });
    const lua = { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') };
    const c = buildConfig(dir, mock.port, dead, { lua });
    return {
        ...c,
        auth: { enabled: true },
        health: { probes: false },
        billing: { webhook_secret: '${CLUSTER_TOPUP_SECRET}', webhook_tolerance_s: 300 },
        providers: c.providers.map((p) => (p.id.startsWith('mock-openai') ? { ...p, cost_per_1k_tokens: 1 } : p)),
        models: { chat: m('up-chat'), slow: m('up-slow'), nousage: m('up-nousage') },
        cluster: { node_id: `node-${i}`, postgres: { url: '${CLUSTER_PG_URL}' } },
    };
}

const admin = (i, method, p, body) => adminCall(gws[i].base, ADMIN_TOKEN, method, p, body);
const auth = (k) => ({ authorization: `Bearer ${k.key}` });
const chatBody = (extra = {}) => ({ model: 'chat', messages: [{ role: 'user', content: 'count my cost' }], max_tokens: 50, ...extra });
const estimate = (body) => (Math.floor(Buffer.byteLength(JSON.stringify(body)) / 4) + (body.max_tokens ?? 256)) * PER_TOKEN;

/** A tenant and a key made once, on instance 0, and used everywhere: the control plane is
 * shared (admin/control.h); keys[name] holds the same key for each instance. */
async function tenantEverywhere(name, billing) {
    const t = await admin(0, 'POST', 'tenants', { name });
    assert.equal(t.status, 201, t.text);
    tenants[name] = t.json.id;
    if (billing) assert.equal((await admin(0, 'PUT', `tenants/${t.json.id}/billing`, billing)).status, 200);
    const k = await admin(0, 'POST', 'keys', { tenant_id: t.json.id });
    assert.equal(k.status, 201, k.text);
    keys[name] = Array.from({ length: N }, () => k.json);
    const want = (await admin(0, 'GET', `tenants/${t.json.id}/billing`)).json;
    for (let i = 1; i < N; i++) {
        await waitFor(async () => (await admin(i, 'GET', `keys/${k.json.id}`)).status === 200
            && JSON.stringify((await admin(i, 'GET', `tenants/${t.json.id}/billing`)).json) === JSON.stringify(want),
        { timeoutMs: 10000, what: `tenant ${name} and its key on instance ${i}` });
    }
    return tenants[name];
}

async function webhook(i, body) {
    const text = JSON.stringify(body);
    const t = Math.floor(Date.now() / 1000);
    const mac = crypto.createHmac('sha256', SECRET).update(`${t}.${text}`).digest('hex');
    const r = await fetch(`${gws[i].base}/api/v2/webhooks/topup`, {
        method: 'POST', headers: { 'content-type': 'application/json', 'moongate-signature': `t=${t},v1=${mac}` }, body: text,
        signal: AbortSignal.timeout(10000),
    });
    const txt = await r.text();
    return { status: r.status, json: txt ? JSON.parse(txt) : null };
}

function topup(tenant, micros, id) {
    const r = pg.rows(`SELECT mg_wallet_topup('${id}', ${tenant}, ${micros}, 0, 'test') AS ok`);
    assert.equal(r[0].ok, true);
}

/** Every figure of the ledger agrees: the wallet row is the sum of its entries; replayed in
 * commit order, no reservation ever took more than was available. */
function checkLedger(tenant) {
    const [w] = pg.rows(`SELECT * FROM wallets WHERE tenant_id = ${tenant}`);
    const entries = pg.rows(`SELECT * FROM ledger_entries WHERE tenant_id = ${tenant} ORDER BY id`);
    assert.equal(Number(w.entries), entries.length);
    assert.equal(Number(w.balance_micros), entries.reduce((s, e) => s + Number(e.amount_micros), 0));
    assert.equal(Number(w.held_micros), entries.reduce((s, e) => s + Number(e.hold_micros), 0));
    let balance = 0;
    let held = 0;
    for (const e of entries) {
        balance += Number(e.amount_micros);
        held += Number(e.hold_micros);
        if (e.kind === 'reserve') assert.ok(balance - held >= 0, `entry ${e.id}: reserved beyond the balance`);
    }
    const open = pg.rows(`SELECT COALESCE(SUM(reserved_micros), 0) AS s FROM ledger_holds WHERE tenant_id = ${tenant}`
        + " AND state IN ('held','metering_failed')");
    assert.equal(Number(w.held_micros), Number(open[0].s), 'held = the open holds');
    return { w, entries };
}

before(async () => {
    if (skip) return;
    pg = await startPostgres();
    mock = await startMock();
    await mock.script({ model: 'up-slow', action: { delay_first_byte_ms: 1500 } });
    await mock.script({
        model: 'up-nousage',
        action: {
            body: {
                id: 'chatcmpl-nousage', object: 'chat.completion', created: 1, model: 'up-nousage',
                choices: [{ index: 0, message: { role: 'assistant', content: 'hi', refusal: null }, logprobs: null, finish_reason: 'stop' }],
            },
        },
    });
    const dead = await deadPort();
    // all at once, against an empty database: the migrations' advisory lock is what keeps
    // three instances from creating the same tables together
    const up = await startInstances(N, 'cluster', (dir, i) => config(dir, i, dead), { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN, CLUSTER_PG_URL: pg.url, CLUSTER_TOPUP_SECRET: SECRET } });
    dirs = up.dirs;
    gws.push(...up.gws);
});

after(async () => {
    await closeInstances(gws, dirs);
    await mock?.close().catch(() => {});
    await pg?.close();
});

describe('cluster.postgres', { skip }, () => {
    test('three instances started at once migrate once, under the advisory lock', async () => {
        for (const g of gws) await g.waitLog((l) => /^postgres: connected/.test(l.msg ?? ''), { timeoutMs: 20000, what: 'connected' });
        const versions = pg.rows('SELECT version FROM mg_schema ORDER BY version').map((r) => r.version);
        assert.deepEqual(versions, [1, 2, 3, 4, 5, 6]);
        for (const g of gws) {
            assert.ok(!g.logs.some((l) => /migrations failed/.test(l.msg ?? '')), 'no instance saw a migration fail');
            assert.ok(!g.stdoutText().includes(pg.url), 'the url is a secret: never logged');
        }
    });

    test('usage events from every instance land once each, with their hourly buckets', async () => {
        const t = await tenantEverywhere('metered');
        const ids = [];
        const work = [];
        for (let i = 0; i < 30; i++) {
            const g = i % N;
            work.push(postJson(`${gws[g].base}/v1/chat/completions`, chatBody(), { headers: auth(keys.metered[g]) }));
        }
        for (const r of await Promise.all(work)) {
            assert.equal(r.status, 200, r.text);
            ids.push(r.headers.get('x-request-id'));
        }
        assert.equal(new Set(ids).size, 30);
        await waitFor(() => pg.rows(`SELECT 1 FROM usage_events WHERE tenant_id = ${t}`).length >= 30, { timeoutMs: 10000, what: 'the events in PostgreSQL' });
        const rows = pg.rows(`SELECT request_id, node_id FROM usage_events WHERE tenant_id = ${t}`);
        assert.deepEqual(rows.map((r) => r.request_id).sort(), [...ids].sort(), 'each event once');
        assert.deepEqual([...new Set(rows.map((r) => r.node_id))].sort(), ['node-0', 'node-1', 'node-2']);
        const [h] = pg.rows(`SELECT SUM(requests) AS n, SUM(cost_micros) AS c FROM usage_hourly WHERE tenant_id = ${t}`);
        assert.equal(Number(h.n), 30);
        const [e] = pg.rows(`SELECT SUM(cost_micros) AS c FROM usage_events WHERE tenant_id = ${t}`);
        assert.equal(Number(h.c), Number(e.c));
        // the analytics read the cluster's events there, not the instance's own (e2e/cluster_stats)
        const listed = await admin(0, 'GET', `usage/events?tenant_id=${t}&limit=100`);
        assert.equal(listed.status, 200, listed.text);
        assert.deepEqual(listed.json.data.map((e) => e.request_id).sort(), [...ids].sort());
    });

    test('a signed top-up on one instance is the wallet every instance reads; a redelivery on another adds nothing', async () => {
        const t = await tenantEverywhere('funded', { mode: 'prepaid' });
        const first = await webhook(0, { id: `evt_funded_${t}`, tenant_id: t, amount_micros: 777000 });
        assert.equal(first.status, 200, JSON.stringify(first.json));
        assert.equal(first.json.duplicate, false);
        const again = await webhook(1, { id: `evt_funded_${t}`, tenant_id: t, amount_micros: 777000 });
        assert.equal(again.status, 200);
        assert.equal(again.json.duplicate, true);
        assert.equal((await webhook(2, { id: `evt_funded_${t}`, tenant_id: t, amount_micros: 1 })).status, 409);
        for (let i = 0; i < N; i++) {
            const w = await admin(i, 'GET', `tenants/${t}/wallet`);
            assert.equal(w.status, 200, w.text);
            assert.equal(w.json.balance_micros, 777000);
            assert.equal(w.json.available_micros, 777000);
            assert.equal(w.json.billing_mode, 'prepaid');
        }
        const r = await postJson(`${gws[2].base}/v1/chat/completions`, chatBody(), { headers: auth(keys.funded[2]) });
        assert.equal(r.status, 200, r.text);
        await waitFor(async () => (await admin(1, 'GET', `tenants/${t}/wallet`)).json.entries === 3, { what: 'reserve and settle seen from another instance' });
        checkLedger(t);
    });

    test('100 concurrent requests on three instances against a balance for 50: 50 served, never oversold', async () => {
        // no upstream usage and require_upstream_usage: every granted hold stays held, so what
        // is granted does not depend on how fast the others settle
        const t = await tenantEverywhere('scarce', { mode: 'prepaid', require_upstream_usage: true });
        const body = chatBody({ model: 'nousage' });
        const need = estimate(body);
        topup(t, 50 * need, `evt_scarce_${t}`);
        const work = [];
        for (let i = 0; i < 100; i++) {
            const g = i % N;
            work.push(postJson(`${gws[g].base}/v1/chat/completions`, body, { headers: auth(keys.scarce[g]), timeoutMs: 30000 }));
        }
        const done = await Promise.all(work);
        const ok = done.filter((r) => r.status === 200).length;
        const poor = done.filter((r) => r.status === 402);
        assert.equal(ok + poor.length, 100, done.filter((r) => r.status !== 200 && r.status !== 402).map((r) => r.text).join('\n'));
        for (const r of poor) assert.equal(r.json.error.code, 'INSUFFICIENT_BALANCE');
        assert.equal(ok, 50, 'exactly what the balance covers');
        await waitFor(() => pg.rows(`SELECT 1 FROM ledger_holds WHERE tenant_id = ${t} AND state = 'held'`).length === 0,
            { timeoutMs: 10000, what: 'every hold ended' });
        const { w } = checkLedger(t);
        assert.equal(Number(w.held_micros), 50 * need);
        assert.equal(Number(w.balance_micros), 50 * need);
        assert.equal(pg.rows(`SELECT 1 FROM ledger_holds WHERE tenant_id = ${t} AND state = 'metering_failed'`).length, 50);
    });

    test('the admin API reads and changes the cluster\'s books on every instance: ledger, holds, release, adjust', async () => {
        const t = tenants.scarce;
        // the ledger's pages through instance 1 are PostgreSQL's entries, newest first
        const seen = [];
        let cursor = null;
        for (let page = 0; page < 50; page++) { // bounded: 101 entries in pages of 7
            const r = await admin(1, 'GET', `tenants/${t}/ledger?limit=7${cursor ? `&cursor=${cursor}` : ''}`);
            assert.equal(r.status, 200, r.text);
            seen.push(...r.json.data);
            cursor = r.json.next_cursor;
            if (!r.json.has_more) break;
        }
        const rows = pg.rows(`SELECT id, kind, amount_micros, hold_micros FROM ledger_entries WHERE tenant_id = ${t} ORDER BY id DESC`);
        assert.deepEqual(seen.map((e) => [e.id, e.kind, e.amount_micros, e.hold_micros]),
            rows.map((e) => [Number(e.id), e.kind, Number(e.amount_micros), Number(e.hold_micros)]));
        // the holds through instance 2
        const failed = await admin(2, 'GET', `tenants/${t}/holds?state=metering_failed`);
        assert.equal(failed.status, 200, failed.text);
        assert.equal(failed.json.total, 50);
        // a release with its reason on instance 0: the hold and its entry in PostgreSQL
        const rid = failed.json.data[0].request_id;
        const before = (await admin(2, 'GET', `tenants/${t}/wallet`)).json;
        const rel = await admin(0, 'POST', `tenants/${t}/release`, { request_id: rid, reason: 'engine lost its usage' });
        assert.equal(rel.status, 200, rel.text);
        assert.equal(rel.json.state, 'released_unmetered');
        assert.equal(rel.json.reason, 'engine lost its usage');
        const [entry] = pg.rows(`SELECT kind, hold_micros, reason, actor FROM ledger_entries WHERE request_id = '${rid}' AND kind = 'release'`);
        assert.equal(entry.reason, 'engine lost its usage');
        assert.equal(Number(entry.hold_micros), -failed.json.data[0].reserved_micros);
        assert.equal((await admin(1, 'POST', `tenants/${t}/release`, { request_id: rid, reason: 'again' })).status, 409);
        assert.equal((await admin(1, 'POST', `tenants/${t}/release`, { request_id: 'no-such-request', reason: 'x' })).status, 404);
        // an adjustment on instance 1; both changes seen in the wallet on instance 2
        const adj = await admin(1, 'POST', `tenants/${t}/adjust`, { amount_micros: 12345, reason: 'goodwill' });
        assert.equal(adj.status, 201, adj.text);
        assert.equal(adj.json.kind, 'adjustment');
        assert.equal(adj.json.amount_micros, 12345);
        const after_ = (await admin(2, 'GET', `tenants/${t}/wallet`)).json;
        assert.equal(after_.balance_micros, before.balance_micros + 12345);
        assert.equal(after_.held_micros, before.held_micros - failed.json.data[0].reserved_micros);
        checkLedger(t);
        // `moongate check-ledger` on a cluster config checks the books in PostgreSQL
        const check = () => spawnSync(gatewayBin(), ['check-ledger', '-c', gws[0].configPath],
            { encoding: 'utf8', timeout: 30000, env: { ...process.env, CLUSTER_PG_URL: pg.url, CLUSTER_TOPUP_SECRET: SECRET } });
        const ok = check();
        assert.equal(ok.status, 0, ok.stdout + ok.stderr);
        const wallets = Number(pg.rows('SELECT COUNT(*) AS n FROM wallets')[0].n);
        const entries = Number(pg.rows('SELECT COUNT(*) AS n FROM ledger_entries')[0].n);
        assert.match(ok.stdout, new RegExp(`^ledger: consistent: ${wallets} wallet\\(s\\), ${entries} entries$`, 'm'));
        assert.ok(!(ok.stdout + ok.stderr).includes(pg.url), 'the url is never printed');
        // a wallet row tampered with in PostgreSQL is found (then put back)
        pg.exec(`UPDATE wallets SET balance_micros = balance_micros + 1 WHERE tenant_id = ${t}`);
        try {
            const bad = check();
            assert.equal(bad.status, 1, bad.stdout + bad.stderr);
            assert.match(bad.stdout, new RegExp(`wallet balance/held differ from the sums of its entries: tenant ${t}:`));
        } finally {
            pg.exec(`UPDATE wallets SET balance_micros = balance_micros - 1 WHERE tenant_id = ${t}`);
        }
    });

    test('reservations racing on a locked wallet row: the balance for one grants one', async () => {
        // The test holds the wallet row (FOR UPDATE) while a reservation from each instance
        // arrives: each must wait for the row and then see what the others took. A reservation
        // that read the wallet without locking it would see the same balance as the others and
        // all three would be granted.
        const t = await tenantEverywhere('racing', { mode: 'prepaid', require_upstream_usage: true });
        const body = chatBody({ model: 'nousage' });
        topup(t, estimate(body), `evt_racing_${t}`);
        const holder = pg.hold(`BEGIN; SELECT 1 FROM wallets WHERE tenant_id = ${t} FOR UPDATE; SELECT pg_sleep(1.5); COMMIT;`);
        await waitFor(() => pg.rows("SELECT 1 FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1.5)%' AND pid <> pg_backend_pid()").length === 1,
            { what: 'the row held' });
        const done = await Promise.all(gws.map((g, i) => postJson(`${g.base}/v1/chat/completions`, body, { headers: auth(keys.racing[i]), timeoutMs: 30000 })));
        await holder;
        assert.deepEqual(done.map((r) => r.status).sort(), [200, 402, 402], done.map((r) => r.text).join('\n'));
        const { w } = checkLedger(t);
        assert.equal(Number(w.held_micros), estimate(body));
    });

    test('the balance equals the sum of the entries after concurrent settlements on every instance', async () => {
        const t = await tenantEverywhere('busy', { mode: 'prepaid' });
        topup(t, 50000000, `evt_busy_${t}`);
        const work = [];
        for (let i = 0; i < 30; i++) {
            const g = i % N;
            const b = chatBody({ messages: [{ role: 'user', content: `request number ${i}` }] });
            work.push(postJson(`${gws[g].base}/v1/chat/completions`, b, { headers: auth(keys.busy[g]) }));
        }
        for (const r of await Promise.all(work)) assert.equal(r.status, 200, r.text);
        await waitFor(() => pg.rows(`SELECT 1 FROM ledger_holds WHERE tenant_id = ${t} AND state = 'settled'`).length === 30,
            { timeoutMs: 10000, what: 'every hold settled' });
        const { w, entries } = checkLedger(t);
        assert.equal(Number(w.held_micros), 0);
        assert.equal(entries.filter((e) => e.kind === 'settle').length, 30);
        assert.ok(Number(w.balance_micros) < 50000000);
    });

    test('a PostgreSQL restart mid-run loses no usage event and no settlement', async () => {
        const t = await tenantEverywhere('restart', { mode: 'prepaid' });
        const free = tenants.metered;
        topup(t, 50000000, `evt_restart_${t}`);
        // in flight across the restart: reserved before it, settled after it
        const slow = [];
        for (let i = 0; i < 6; i++) {
            const g = i % N;
            slow.push(postJson(`${gws[g].base}/v1/chat/completions`, chatBody({ model: 'slow' }), { headers: auth(keys.restart[g]), timeoutMs: 30000 }));
        }
        await waitFor(() => pg.rows(`SELECT 1 FROM ledger_holds WHERE tenant_id = ${t} AND state = 'held'`).length === 6,
            { timeoutMs: 10000, what: 'the slow requests reserved' });
        pg.stop();
        // served while PostgreSQL is down: their events wait in each instance's queue
        const during = [];
        for (let i = 0; i < 12; i++) {
            const g = i % N;
            during.push(postJson(`${gws[g].base}/v1/chat/completions`, chatBody(), { headers: auth(keys.metered[g]) }));
        }
        const answered = await Promise.all(during);
        for (const r of answered) assert.equal(r.status, 200, r.text);
        const slowDone = await Promise.all(slow);
        for (const r of slowDone) assert.equal(r.status, 200, r.text);
        // a prepaid request meanwhile is refused clearly (the wallet cannot be read), not hung
        const refused = await postJson(`${gws[0].base}/v1/chat/completions`, chatBody(), { headers: auth(keys.restart[0]) });
        assert.equal(refused.status, 503, refused.text);
        pg.start();
        const want = [...answered, ...slowDone].map((r) => r.headers.get('x-request-id'));
        const list = want.map((id) => `'${id}'`).join(',');
        await waitFor(() => pg.rows(`SELECT 1 FROM usage_events WHERE request_id IN (${list})`).length === want.length,
            { timeoutMs: 20000, intervalMs: 200, what: 'the queued events written after the restart' });
        await waitFor(() => pg.rows(`SELECT 1 FROM ledger_holds WHERE tenant_id = ${t} AND state = 'settled'`).length === 6,
            { timeoutMs: 20000, intervalMs: 200, what: 'the settlements written after the restart' });
        const dup = pg.rows('SELECT request_id FROM usage_events GROUP BY request_id HAVING COUNT(*) > 1');
        assert.deepEqual(dup, []);
        const [h] = pg.rows(`SELECT SUM(requests) AS n FROM usage_hourly WHERE tenant_id = ${free}`);
        const [e] = pg.rows(`SELECT COUNT(*) AS n FROM usage_events WHERE tenant_id = ${free}`);
        assert.equal(Number(h.n), Number(e.n), 'the buckets count each event once');
        checkLedger(t);
        // and the instances serve prepaid requests again
        await waitFor(async () => (await postJson(`${gws[1].base}/v1/chat/completions`, chatBody(), { headers: auth(keys.restart[1]) })).status === 200,
            { timeoutMs: 15000, intervalMs: 200, what: 'prepaid served again' });
    });
});
