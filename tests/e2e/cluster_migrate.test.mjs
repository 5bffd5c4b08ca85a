// `moongate migrate-store --from sqlite:PATH --to postgres:URL` (issue 24): a single node with a
// tenant, a project, a key, a prepaid wallet and usage is moved into a throw-away PostgreSQL;
// a second run is refused (the target is not empty), a --force run adds no usage event and no
// ledger entry twice; then an instance started on an empty SQLite with that PostgreSQL
// catches up from control_log and serves the migrated key, with the migrated wallet.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { adminCall, buildConfig, deadPort, gatewayBin, postJson, startGateway, startMock, toYaml, waitFor } from './lib/harness.mjs';
import { postgresAvailable, startPostgres } from './lib/postgres.mjs';

const ADMIN_TOKEN = 'adm-cluster-migrate-e2e-31f0';
const skip = postgresAvailable() ? false : 'PostgreSQL server binaries not installed (scripts/setup)';

let pg;
let mock;
let dead;
const dirs = [];
let single;
let member;
const made = {};

async function start(cluster) {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-e2e-migrate-'));
    dirs.push(dir);
    const c = { ...buildConfig(dir, mock.port, dead), auth: { enabled: true }, health: { probes: false } };
    if (cluster) c.cluster = { node_id: 'joined', postgres: { url: '${CLUSTER_PG_URL}' } };
    const p = path.join(dir, 'moongate.yaml');
    await fsp.writeFile(p, toYaml(c));
    const gw = await startGateway(p, { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN, CLUSTER_PG_URL: pg.url } });
    return { gw, db: path.join(dir, 'moongate.db') };
}

const admin = (g, method, p, body) => adminCall(g.gw.base, ADMIN_TOKEN, method, p, body);
const chat = (g, key) => postJson(`${g.gw.base}/v1/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: 'migrated' }], max_tokens: 8 },
    { headers: { authorization: `Bearer ${key}` } });
const migrate = (...extra) => spawnSync(gatewayBin(), ['migrate-store', '--from', `sqlite:${single.db}`, '--to', `postgres:${pg.url}`, ...extra],
    { encoding: 'utf8', timeout: 60000 });

before(async () => {
    if (skip) return;
    pg = await startPostgres();
    mock = await startMock();
    dead = await deadPort();
});

after(async () => {
    await single?.gw.close().catch(() => {});
    await member?.gw.close().catch(() => {});
    await mock?.close().catch(() => {});
    await pg?.close();
    if (!process.env.MOONGATE_E2E_KEEP) for (const d of dirs) await fsp.rm(d, { recursive: true, force: true }).catch(() => {});
});

describe('migrate-store', { skip }, () => {
    test('a single node with data is moved; a second run is refused, a forced one doubles nothing', async () => {
        single = await start(false);
        const t = await admin(single, 'POST', 'tenants', { name: 'moving' });
        assert.equal(t.status, 201, t.text);
        const p = await admin(single, 'POST', 'projects', { tenant_id: t.json.id, name: 'p' });
        assert.equal(p.status, 201, p.text);
        const k = await admin(single, 'POST', 'keys', { tenant_id: t.json.id, project_id: p.json.id, name: 'moved' });
        assert.equal(k.status, 201, k.text);
        assert.equal((await admin(single, 'PUT', `tenants/${t.json.id}/billing`, { mode: 'prepaid' })).status, 200);
        const adj = await admin(single, 'POST', `tenants/${t.json.id}/adjust`, { amount_micros: 50000000, reason: 'opening balance' });
        assert.equal(adj.status, 201, adj.text);
        for (let i = 0; i < 3; i++) assert.equal((await chat(single, k.json.key)).status, 200);
        // the last request's settle is written after its answer: the opening balance and
        // three reserve + settle pairs, none held, before the wallet is what was made
        let w;
        await waitFor(async () => {
            w = await admin(single, 'GET', `tenants/${t.json.id}/wallet`);
            return w.status === 200 && w.json.entries === 7 && w.json.held_micros === 0;
        }, { timeoutMs: 10000, what: 'the three requests settled' }).catch((e) => { throw new Error(`${e.message}: ${w?.text}`); });
        Object.assign(made, { tenant: t.json, project: p.json, key: k.json, wallet: w.json });
        made.tenantView = (await admin(single, 'GET', `tenants/${t.json.id}`)).json;
        made.keyView = (await admin(single, 'GET', `keys/${k.json.id}`)).json;
        await single.gw.close(); // a graceful stop: every write committed

        const first = migrate();
        assert.equal(first.status, 0, first.stderr);
        assert.match(first.stdout, /migrate-store: \d+ control rows, 3 usage events, 1 wallets/);
        const [log] = pg.rows("SELECT COUNT(*) AS n FROM control_log WHERE tbl IN ('tenants','projects','api_keys')");
        assert.equal(Number(log.n), 3);
        assert.equal(pg.rows(`SELECT 1 FROM usage_events WHERE tenant_id = ${t.json.id}`).length, 3);
        const entries = pg.rows(`SELECT kind FROM ledger_entries WHERE tenant_id = ${t.json.id}`).length;
        const [pw] = pg.rows(`SELECT * FROM wallets WHERE tenant_id = ${t.json.id}`);
        assert.equal(Number(pw.balance_micros), w.json.balance_micros);

        const again = migrate();
        assert.equal(again.status, 1, 'a non-empty target is refused');
        assert.match(again.stderr, /not empty/);
        const forced = migrate('--force');
        assert.equal(forced.status, 0, forced.stderr);
        assert.match(forced.stdout, /0 usage events, 0 wallets \(0 entries/);
        assert.equal(pg.rows(`SELECT 1 FROM usage_events WHERE tenant_id = ${t.json.id}`).length, 3);
        assert.equal(pg.rows(`SELECT kind FROM ledger_entries WHERE tenant_id = ${t.json.id}`).length, entries);
    });

    test('an instance on an empty SQLite with that PostgreSQL catches up and serves the migrated key', async () => {
        assert.ok(made.key, 'the first test made the data');
        member = await start(true);
        await waitFor(async () => (await admin(member, 'GET', `keys/${made.key.id}`)).status === 200,
            { timeoutMs: 10000, what: 'the migrated key caught up' });
        assert.deepEqual((await admin(member, 'GET', `tenants/${made.tenant.id}`)).json, made.tenantView);
        const kv = (await admin(member, 'GET', `keys/${made.key.id}`)).json;
        assert.deepEqual({ ...kv, last_used_at: null }, { ...made.keyView, last_used_at: null });
        await waitFor(async () => (await chat(member, made.key.key)).status === 200, { timeoutMs: 10000, what: 'the migrated key served' });
        // the wallet carried over (the mock's route is free: balance unchanged) and serves:
        // the request's reserve and settle entries join the migrated ones (an attempt the
        // waitFor above retried, before the key had caught up in memory, may have reserved
        // and released too: every request adds its pair, none is left open)
        let w;
        const added = () => w.json.entries - made.wallet.entries;
        await waitFor(async () => {
            w = await admin(member, 'GET', `tenants/${made.tenant.id}/wallet`);
            return w.json?.held_micros === 0 && added() >= 2 && added() % 2 === 0;
        }, { timeoutMs: 10000, what: 'the request reserved and settled on the migrated wallet' }).catch((e) => {
            const rows = pg.rows(`SELECT id, kind, amount_micros, hold_micros, request_id FROM ledger_entries WHERE tenant_id = ${made.tenant.id} ORDER BY id`);
            throw new Error(`${e.message}: ${JSON.stringify(w?.json)} (migrated ${JSON.stringify(made.wallet)}); entries ${JSON.stringify(rows)}`);
        });
        assert.ok(pg.rows(`SELECT 1 FROM ledger_entries WHERE tenant_id = ${made.tenant.id} AND kind = 'settle'`).length >= 1);
        assert.equal(w.json.balance_micros, made.wallet.balance_micros);
        assert.equal(w.json.held_micros, 0);
        assert.equal(w.json.billing_mode, 'prepaid');
        // an admin write on the new member gets the next id after the migrated ones
        const t2 = await admin(member, 'POST', 'tenants', { name: 'after-the-move' });
        assert.equal(t2.status, 201, t2.text);
        assert.ok(t2.json.id > made.tenant.id);
    });
});
