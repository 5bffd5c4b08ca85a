// One to three moongate instances with Redis and PostgreSQL configured, beside the embedded
// default (issue 24's performance): for each variant, a closed-loop run (REQUESTS chat
// requests, CONCURRENCY at a time, spread over the instances in turn) gives req/s, latency
// and the CPU per request of the gateways, redis-server and PostgreSQL; then a paced run
// (RATE requests a second for SECONDS) gives the latency a client sees below saturation.
// Each request has a key with an RPM limit and a concurrency cap: one Redis reservation and
// one release per request, one usage event into PostgreSQL. On a 2-core machine where the
// node client, the mock and every server share the cores, req/s is informational.
//   node bench/cluster_scale.mjs   (REQUESTS=4000 CONCURRENCY=24 RATE=300 SECONDS=10
//                                   VARIANTS=embedded:1,cluster:1,cluster:2,cluster:3)
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { REPO_ROOT, adminCall, buildConfig, deadPort, startGateway, startMock, toYaml, waitFor } from '../tests/e2e/lib/harness.mjs';
import { startPostgres } from '../tests/e2e/lib/postgres.mjs';
import { startRedis } from '../tests/e2e/lib/redis.mjs';
import { TICK, closedLoop, cpuTicks, paced, pgTicks } from './cluster_lib.mjs';

const REQUESTS = Number(process.env.REQUESTS ?? 4000);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 24);
const RATE = Number(process.env.RATE ?? 300);
const SECONDS = Number(process.env.SECONDS ?? 10);
const TOKEN = 'adm-bench-cluster-scale-0001';
const us = (ticks, n) => Math.round(((ticks / TICK) * 1e6) / n);

const redis = await startRedis();
const pg = await startPostgres();
const mock = await startMock();
const dead = await deadPort();
const lua = { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') };

/** n instances of one variant, each with a key of its own (RPM limit, concurrency cap). */
async function startVariant(kind, n, tag) {
    const gws = [];
    for (let i = 0; i < n; i++) {
        const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-bench-'));
        const c = buildConfig(dir, mock.port, dead, { lua, log: { level: 'warn' } });
        c.health = { probes: false };
        c.auth = { enabled: true };
        if (kind === 'cluster')
            c.cluster = { node_id: `${tag}-${i}`, redis: { url: redis.url, key_prefix: `${tag}.` }, postgres: { url: pg.url } };
        fs.writeFileSync(path.join(dir, 'm.yaml'), toYaml(c));
        const gw = await startGateway(path.join(dir, 'm.yaml'), { env: { MOONGATE_ADMIN_TOKEN: TOKEN } });
        gws.push({ gw, dir });
    }
    const targets = [];
    for (let i = 0; i < n; i++) {
        const { gw } = gws[i];
        const t = await adminCall(gw.base, TOKEN, 'POST', 'tenants', { name: `${tag}-${i}` });
        const k = await adminCall(gw.base, TOKEN, 'POST', 'keys', { tenant_id: t.json.id, rpm_limit: 10000000, max_concurrency: 1000 });
        if (k.status !== 201) throw new Error(`key on ${tag}-${i}: ${k.status} ${k.text}`);
        targets.push({ base: gw.base, headers: { authorization: `Bearer ${k.json.key}` } });
    }
    return { gws, targets };
}

const eventsLanded = (tag) => Number(pg.rows(`SELECT COUNT(*) AS n FROM usage_events WHERE node_id LIKE '${tag}-%'`)[0].n);

const rows = [];
try {
    for (const v of (process.env.VARIANTS ?? 'embedded:1,cluster:1,cluster:2,cluster:3').split(',')) {
        const [kind, count] = v.split(':');
        const n = Number(count);
        const tag = `b${Date.now().toString(36)}${kind[0]}${n}`;
        const { gws, targets } = await startVariant(kind, n, tag);
        await closedLoop(targets, Math.min(REQUESTS, 1000), CONCURRENCY); // warm-up
        const gateways = () => gws.reduce((s, g) => s + cpuTicks(g.gw.pid), 0);
        const g0 = gateways();
        const r0 = cpuTicks(redis.child.pid);
        const p0 = pgTicks(pg.data);
        const t0 = process.hrtime.bigint();
        const res = await closedLoop(targets, REQUESTS, CONCURRENCY);
        const secs = Number(process.hrtime.bigint() - t0) / 1e9;
        const g1 = gateways();
        const r1 = cpuTicks(redis.child.pid);
        if (kind === 'cluster') // every event of both runs in PostgreSQL before its CPU is read
            await waitFor(() => eventsLanded(tag) >= Math.min(REQUESTS, 1000) + REQUESTS, { timeoutMs: 60000, intervalMs: 250 });
        const p1 = pgTicks(pg.data);
        const pace = await paced(targets, RATE, SECONDS);
        rows.push({
            variant: v, failed: res.failed + pace.failed, rps: Math.round(REQUESTS / secs),
            p50_ms: res.p50.toFixed(1), p99_ms: res.p99.toFixed(1),
            gateways_us: us(g1 - g0, REQUESTS),
            redis_us: kind === 'cluster' ? us(r1 - r0, REQUESTS) : 0,
            postgres_us: kind === 'cluster' ? us(p1 - p0, REQUESTS) : 0,
            [`paced_${RATE}_p50_ms`]: pace.p50.toFixed(1), [`paced_${RATE}_p99_ms`]: pace.p99.toFixed(1),
        });
        for (const { gw, dir } of gws) {
            await gw.close();
            await fsp.rm(dir, { recursive: true, force: true });
        }
    }
} finally {
    await mock.close();
    await pg.close();
    await redis.stop();
}
console.table(rows);
