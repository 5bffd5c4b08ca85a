// CPU per request of moongate with cluster.postgres configured vs the embedded default (issue
// 24): the same chat request sent REQUESTS times (CONCURRENCY at a time) to each variant over
// loopback, against the e2e mock upstream; the CPU is the gateway process's user + system time
// (/proc/PID/stat) over the run, and for the PostgreSQL variants also the server's (every
// process of the throw-away cluster). Variants: embedded (auth off), pg (auth off: one usage
// event per request into PostgreSQL too), embedded_prepaid and pg_prepaid (auth on, a prepaid
// tenant: a reservation and a settlement per request, in SQLite or in PostgreSQL).
//   node bench/cluster_pg.mjs   (REQUESTS=4000 CONCURRENCY=16; needs build/moongate)
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { REPO_ROOT, adminCall, buildConfig, deadPort, startGateway, startMock, toYaml, waitFor } from '../tests/e2e/lib/harness.mjs';
import { startPostgres } from '../tests/e2e/lib/postgres.mjs';
import { TICK, closedLoop, cpuTicks, pgTicks } from './cluster_lib.mjs';

const REQUESTS = Number(process.env.REQUESTS ?? 4000);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 16);
const TOKEN = 'adm-bench-cluster-pg-0001';

const pg = await startPostgres();
const mock = await startMock();
const dead = await deadPort();
const lua = { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') };
const rows = [];
try {
    for (const v of (process.env.VARIANTS ?? "embedded,pg,embedded_prepaid,pg_prepaid").split(",")) {
        const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-bench-'));
        const prepaid = v.endsWith('prepaid');
        const c = buildConfig(dir, mock.port, dead, { lua, log: { level: 'warn' } });
        c.health = { probes: false };
        c.providers = c.providers.map((p) => (p.id === 'mock-openai' ? { ...p, cost_per_1k_tokens: 0.001 } : p));
        if (prepaid) c.auth = { enabled: true };
        if (v.startsWith('pg')) c.cluster = { node_id: v, postgres: { url: pg.url } };
        fs.writeFileSync(path.join(dir, 'm.yaml'), toYaml(c));
        const gw = await startGateway(path.join(dir, 'm.yaml'), { env: { MOONGATE_ADMIN_TOKEN: TOKEN } });
        let headers = {};
        if (prepaid) {
            const t = await adminCall(gw.base, TOKEN, 'POST', 'tenants', { name: `bench-${v}` });
            await adminCall(gw.base, TOKEN, 'PUT', `tenants/${t.json.id}/billing`, { mode: 'prepaid' });
            const k = await adminCall(gw.base, TOKEN, 'POST', 'keys', { tenant_id: t.json.id });
            headers = { authorization: `Bearer ${k.json.key}` };
            if (v.startsWith('pg')) {
                await waitFor(() => pg.rows('SELECT 1 FROM mg_schema WHERE version = 2').length === 1, { timeoutMs: 10000 });
                pg.exec(`SELECT mg_wallet_topup('bench-${v}', ${t.json.id}, 1000000000000, 0, 'bench')`);
            } else {
                execFileSync('sqlite3', ['-cmd', '.timeout 5000', path.join(dir, 'moongate.db'),
                    `INSERT INTO topups VALUES ('bench', ${t.json.id}, 1000000000000, 0)`]);
            }
        }
        await closedLoop([{ base: gw.base, headers }], REQUESTS, CONCURRENCY); // warm-up (connections, caches)
        const g0 = cpuTicks(gw.pid);
        const p0 = pgTicks(pg.data);
        const t0 = process.hrtime.bigint();
        const { failed } = await closedLoop([{ base: gw.base, headers }], REQUESTS, CONCURRENCY);
        const secs = Number(process.hrtime.bigint() - t0) / 1e9;
        const g1 = cpuTicks(gw.pid);
        if (v.startsWith('pg')) {
            const landed = () => Number(pg.rows(`SELECT COUNT(*) AS n FROM usage_events WHERE node_id = '${v}'`)[0].n);
            await waitFor(() => landed() >= 2 * REQUESTS, { timeoutMs: 60000, intervalMs: 250 }).catch(() => {
                throw new Error(`${v}: ${landed()} of ${2 * REQUESTS} events in PostgreSQL\n${gw.stdoutText().slice(-3000)}`);
            });
        }
        const p1 = pgTicks(pg.data);
        rows.push({
            variant: v, requests: REQUESTS, failed, rps: Math.round(REQUESTS / secs),
            gateway_us_per_req: Math.round(((g1 - g0) / TICK) * 1e6 / REQUESTS),
            postgres_us_per_req: v.startsWith('pg') ? Math.round(((p1 - p0) / TICK) * 1e6 / REQUESTS) : 0,
        });
        await gw.close();
        await fsp.rm(dir, { recursive: true, force: true });
    }
} finally {
    await mock.close();
    await pg.close();
}
console.table(rows);

