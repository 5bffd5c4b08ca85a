// CPU per request of moongate with the limits shared through Redis vs the embedded default
// (issue 24): the same chat request sent REQUESTS times (CONCURRENCY at a time) with a key
// that has an RPM limit and a concurrency cap, over loopback, against the e2e mock upstream.
// CPU is the gateway process's user + system time (/proc/PID/stat) over the run, and for the
// Redis variant also the redis-server's. Variants: embedded (auth on, the key's quota counted
// in the process), redis (the same key, its quota reserved in one Lua script per request and
// released at its end: two commands, one the request waits for).
//   node bench/cluster_redis.mjs   (REQUESTS=4000 CONCURRENCY=16; needs build/moongate)
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { REPO_ROOT, adminCall, buildConfig, deadPort, startGateway, startMock, toYaml } from '../tests/e2e/lib/harness.mjs';
import { startRedis } from '../tests/e2e/lib/redis.mjs';
import { TICK, closedLoop, cpuTicks } from './cluster_lib.mjs';

const REQUESTS = Number(process.env.REQUESTS ?? 4000);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 16);
const TOKEN = 'adm-bench-cluster-redis-0001';

const redis = await startRedis();
const mock = await startMock();
const dead = await deadPort();
const lua = { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') };
const rows = [];
try {
    for (const v of (process.env.VARIANTS ?? 'embedded,redis').split(',')) {
        const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-bench-'));
        const c = buildConfig(dir, mock.port, dead, { lua, log: { level: 'warn' } });
        c.health = { probes: false };
        c.auth = { enabled: true };
        if (v === 'redis') c.cluster = { node_id: v, redis: { url: redis.url, key_prefix: `bench${Date.now()}.` } };
        fs.writeFileSync(path.join(dir, 'm.yaml'), toYaml(c));
        const gw = await startGateway(path.join(dir, 'm.yaml'), { env: { MOONGATE_ADMIN_TOKEN: TOKEN } });
        const t = await adminCall(gw.base, TOKEN, 'POST', 'tenants', { name: `bench-${v}` });
        const k = await adminCall(gw.base, TOKEN, 'POST', 'keys', { tenant_id: t.json.id, rpm_limit: 10000000, max_concurrency: 1000 });
        const headers = { authorization: `Bearer ${k.json.key}` };
        await closedLoop([{ base: gw.base, headers }], REQUESTS, CONCURRENCY); // warm-up (connections, caches)
        const g0 = cpuTicks(gw.pid);
        const r0 = cpuTicks(redis.child.pid);
        const t0 = process.hrtime.bigint();
        const res = await closedLoop([{ base: gw.base, headers }], REQUESTS, CONCURRENCY);
        const secs = Number(process.hrtime.bigint() - t0) / 1e9;
        const g1 = cpuTicks(gw.pid);
        const r1 = cpuTicks(redis.child.pid);
        const st = await (await fetch(`${gw.base}/status`)).json();
        rows.push({
            variant: v, requests: REQUESTS, failed: res.failed, rps: Math.round(REQUESTS / secs),
            p50_ms: res.p50.toFixed(2), p99_ms: res.p99.toFixed(2),
            gateway_us_per_req: Math.round(((g1 - g0) / TICK) * 1e6 / REQUESTS),
            redis_us_per_req: v === 'redis' ? Math.round(((r1 - r0) / TICK) * 1e6 / REQUESTS) : 0,
            script_rtt_ms: v === 'redis' ? st.cluster.redis.shared_limits.rtt_ms_avg.toFixed(3) : '-',
        });
        await gw.close();
        await fsp.rm(dir, { recursive: true, force: true });
    }
} finally {
    await mock.close();
    await redis.stop();
}
console.table(rows);
