// A key's RPM limit shared by three instances under uneven load, held over a sustained minute
// (issue 24: within ±2%, where per-instance counting drifts to N times the limit). Three
// moongate instances share one redis-server and one mock engine; the same key (same id on
// each) has rpm_limit LIMIT; each instance is offered its own steady rate (SHARES of
// OFFERED x LIMIT per minute: 60/30/10 % of twice the limit by default) for DURATION_S
// seconds. Every answer's time is kept; the figure is the admitted count in every 60 s window
// that starts at an admitted request (the windows Redis' sliding log counts), its highest and
// lowest over the run, against the limit. The `local` variant is the same without Redis
// (each instance counts alone: the drift the issue quotes).
//   node bench/cluster_hold.mjs   (LIMIT=300 OFFERED=2 DURATION_S=75 VARIANTS=redis,local;
//                                  needs build/moongate)
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { REPO_ROOT, adminCall, buildConfig, deadPort, postJson, startGateway, startMock, toYaml } from '../tests/e2e/lib/harness.mjs';
import { startRedis } from '../tests/e2e/lib/redis.mjs';

const LIMIT = Number(process.env.LIMIT ?? 300);
const OFFERED = Number(process.env.OFFERED ?? 2);
const DURATION_S = Math.min(Number(process.env.DURATION_S ?? 75), 600);
const SHARES = [0.6, 0.3, 0.1];
const TOKEN = 'adm-bench-cluster-hold-0001';
const WINDOW_MS = 60000;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* One instance's steady offer: a request every `every` ms until the end, each on its own (a
   slow answer does not delay the next); the times of the 200s. */
async function offer(base, headers, perMinute, endAt) {
    const every = 60000 / perMinute;
    const admitted = [];
    const pending = [];
    let refused = 0, failed = 0;
    const body = { model: 'chat', messages: [{ role: 'user', content: 'hello' }], max_tokens: 5 };
    for (let next = performance.now(); next < endAt; next += every) {
        const wait = next - performance.now();
        if (wait > 0) await sleep(wait);
        pending.push(postJson(`${base}/v1/chat/completions`, body, { headers }).then((r) => {
            if (r.status === 200) admitted.push(performance.now());
            else if (r.status === 429) refused++;
            else failed++;
        }, () => failed++));
    }
    await Promise.all(pending);
    return { admitted, refused, failed };
}

/* The admitted count of every 60 s window starting at an admitted request that ends within
   the run: its highest and lowest. */
function windows(times, runEnd) {
    times.sort((a, b) => a - b);
    let hi = 0, lo = Infinity, j = 0;
    for (let i = 0; i < times.length && times[i] + WINDOW_MS <= runEnd; i++) {
        while (j < times.length && times[j] < times[i] + WINDOW_MS) j++;
        hi = Math.max(hi, j - i);
        lo = Math.min(lo, j - i);
    }
    return { hi, lo: lo === Infinity ? 0 : lo };
}

async function variant(name, redis, mock, dead) {
    const lua = { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') };
    const gws = [], dirs = [], secrets = [];
    const prefix = `hold${Date.now()}.`;
    try {
        for (let i = 0; i < SHARES.length; i++) {
            const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-bench-hold-'));
            dirs.push(dir);
            const c = buildConfig(dir, mock.port, dead, { lua, log: { level: 'warn' } });
            c.health = { probes: false };
            c.auth = { enabled: true };
            if (name === 'redis') c.cluster = { node_id: `hold-${i}`, redis: { url: redis.url, key_prefix: prefix } };
            fs.writeFileSync(path.join(dir, 'm.yaml'), toYaml(c));
            const gw = await startGateway(path.join(dir, 'm.yaml'), { env: { MOONGATE_ADMIN_TOKEN: TOKEN } });
            gws.push(gw);
            const t = await adminCall(gw.base, TOKEN, 'POST', 'tenants', { name: 'hold' });
            const k = await adminCall(gw.base, TOKEN, 'POST', 'keys', { tenant_id: t.json.id, rpm_limit: LIMIT });
            if (k.status !== 201) throw new Error(`key: ${k.text}`);
            secrets.push(k.json.key);
        }
        const start = performance.now(), endAt = start + DURATION_S * 1000;
        const res = await Promise.all(gws.map((gw, i) => offer(gw.base, { authorization: `Bearer ${secrets[i]}` },
            LIMIT * OFFERED * SHARES[i], endAt)));
        const all = res.flatMap((r) => r.admitted);
        const w = windows(all, endAt);
        return {
            variant: name, limit_rpm: LIMIT, offered_rpm: LIMIT * OFFERED, seconds: DURATION_S,
            admitted: all.length, refused: res.reduce((n, r) => n + r.refused, 0), failed: res.reduce((n, r) => n + r.failed, 0),
            per_instance: res.map((r) => r.admitted.length).join('/'),
            window_max: w.hi, window_min: w.lo,
            max_vs_limit: `${((w.hi / LIMIT - 1) * 100).toFixed(1)}%`, min_vs_limit: `${((w.lo / LIMIT - 1) * 100).toFixed(1)}%`,
        };
    } finally {
        for (const gw of gws) await gw.close();
        for (const d of dirs) await fsp.rm(d, { recursive: true, force: true });
    }
}

const redis = await startRedis();
const mock = await startMock();
const dead = await deadPort();
const rows = [];
try {
    for (const v of (process.env.VARIANTS ?? 'redis,local').split(',')) rows.push(await variant(v, redis, mock, dead));
} finally {
    await mock.close();
    await redis.stop();
}
console.table(rows);
