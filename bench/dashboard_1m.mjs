// The dashboard's own API calls with a million usage events in the store (issue 22): every
// call the WebUI makes, timed through the running gateway.
//
// Starts the mock engine and the gateway (auth on, an admin token) once so it migrates its
// store, creates a tenant and a key, stops it; fills usage_events with EVENTS rows in one
// sqlite3 transaction (a recursive CTE: 30 days back to now, at_ms rising with seq as the
// gateway writes them; 2 tenants, 50 keys, 5 projects, 4 models, 3 providers, 97 % succeeded,
// plus 10 events of one rare key) and their hourly and daily roll-ups in the same transaction; restarts
// the gateway on it and times each call N times, one at a time
// with fetch on one keep-alive connection: p50 and max in ms, the wall time from the request
// to the whole body. Prints a table and a JSON line.
//
// usage: node bench/dashboard_1m.mjs [--events 1000000] [--n 20] [--bin build/moongate] [--only REGEX]
//   (--only: the calls whose label matches, e.g. --only requests)
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
const opt = (name, dflt) => {
    const i = args.indexOf(`--${name}`);
    return i < 0 ? dflt : args[i + 1];
};
const EVENTS = Number(opt('events', 1000000));
const N = Number(opt('n', 20));
const ONLY = new RegExp(opt('only', '.'));
process.env.MOONGATE_BIN = path.resolve(opt('bin', path.join(ROOT, 'build/moongate')));
const { startEnv, startGateway, adminCall, postJson, sqliteRows } = await import(path.join(ROOT, 'tests/e2e/lib/harness.mjs'));

const ADMIN = 'bench-dashboard-1m-admin-token';
const env = await startEnv({
    configure: (c) => ({ ...c, auth: { enabled: true }, health: { probes: false }, usage: { retention_days: 400 } }),
    env: { MOONGATE_ADMIN_TOKEN: ADMIN },
});
const sql = (q) => sqliteRows(env.config.storage.path, q);
try {
    const admin = (m, p, b) => adminCall(env.base, ADMIN, m, p, b);
    const t = await admin('POST', 'tenants', { name: 'bench' });
    const k = await admin('POST', 'keys', { tenant_id: t.json.id, name: 'bench-key' });
    for (let i = 0; i < 3; i++) {
        const r = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: `hello ${i}` }] },
            { headers: { authorization: `Bearer ${k.json.key}` } });
        if (r.status !== 200) throw new Error(`a real request failed: ${r.status} ${r.text}`);
    }
    await env.gw.close();

    const now = Date.now();
    const span = 30 * 86400 * 1000;
    const t0 = process.hrtime.bigint();
    // the roll-ups of the events past the watermark per `unit` seconds (hour; and day, and
    // per hour and tenant, when the binary has those tables: migration 24)
    const daily = sql("SELECT count(*) AS n FROM sqlite_master WHERE name = 'usage_daily'")[0].n > 0;
    const key = (unit) => `(at_ms / ${unit * 1000}) * ${unit}, COALESCE(tenant_id, 0),
  COALESCE(project_id, 0), COALESCE(key_id, 0), COALESCE(provider_id, ''), COALESCE(logical_model, '')`;
    const past = 'FROM usage_events WHERE seq > (SELECT seq FROM usage_rollup_mark)';
    const sums = `count(*), sum(status IN ('failed','timed_out')), sum(status = 'cancelled'), sum(input_tokens),
  sum(output_tokens), sum(cached_read_tokens), sum(cache_write_tokens), sum(reasoning_tokens),
  sum(cached_read_tokens > 0), sum(status = 'succeeded' AND (input_estimated OR output_estimated)),
  sum(cost_micros), sum(latency_ms), sum(COALESCE(ttft_ms, 0)), sum(ttft_ms IS NOT NULL)`;
    const totals = `INSERT INTO usage_tenant_hourly SELECT (at_ms / 3600000) * 3600, COALESCE(tenant_id, 0), ${sums}
  ${past} GROUP BY 1, 2;`;
    const rollups = (table, hist, unit) => `
INSERT INTO ${table} SELECT ${key(unit)}, ${sums}
  ${past} GROUP BY 1, 2, 3, 4, 5, 6;
INSERT INTO ${hist} SELECT ${key(unit)}, 'latency', latency_bin, count(*) ${past}
  GROUP BY 1, 2, 3, 4, 5, 6, 8;
INSERT INTO ${hist} SELECT ${key(unit)}, 'ttft', ttft_bin, count(*) ${past}
  AND ttft_bin IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6, 8;`;
    // seq is assigned by SQLite (INTEGER PRIMARY KEY): after the real events
    const fill = `
PRAGMA journal_mode=WAL;
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${EVENTS})
INSERT INTO usage_events(request_id, at_ms, endpoint, tenant_id, project_id, key_id, application,
  logical_model, actual_model, provider_id, pool, attempts, status, http_status, error_code, stream,
  input_tokens, output_tokens, latency_ms, ttft_ms, cost_micros, latency_bin, ttft_bin)
SELECT printf('bench-%d', i), ${now - span} + i * ${Math.floor(span / EVENTS)}, 'chat',
  1000 + i % 2, 100 + i % 5, CASE WHEN i % 100000 = 7 THEN 999 ELSE 1 + i % 50 END, 'bench',
  'model-' || (i % 4), 'up-' || (i % 4), 'prov-' || (i % 3), 'main', 1,
  CASE WHEN i % 100 < 97 THEN 'succeeded' WHEN i % 100 < 99 THEN 'failed'
       WHEN i % 200 = 199 THEN 'cancelled' ELSE 'timed_out' END,
  CASE WHEN i % 100 < 97 THEN 200 ELSE 502 END, CASE WHEN i % 100 < 97 THEN NULL ELSE 'UPSTREAM_ERROR' END,
  i % 2, 100 + i % 900, 50 + i % 400, 200 + i % 3000, 50 + i % 500, i % 1000, 8 + i % 4, 6 + i % 3
FROM n;
-- the roll-ups of the new events, as the writer sums them (obs/usage_rollup.c; the
-- per-event trigger of migration 10 in SQL), and the watermark past them: summing a million
-- events at start-up instead takes minutes (bench/README.md)
${rollups('usage_hourly', 'usage_hist', 3600)}
${daily ? rollups('usage_daily', 'usage_hist_daily', 86400) + totals : ''}
UPDATE usage_rollup_mark SET seq = (SELECT max(seq) FROM usage_events);
COMMIT;`;
    execFileSync('sqlite3', [env.config.storage.path], { input: fill, maxBuffer: 1 << 26 });
    const fillMs = Number(process.hrtime.bigint() - t0) / 1e6;
    const dbBytes = fs.statSync(env.config.storage.path).size;

    const startMs = Date.now();
    env.gw = await startGateway(env.configPath, { env: { MOONGATE_ADMIN_TOKEN: ADMIN }, timeoutMs: 120000 });
    env.base = env.gw.base;
    for (;;) {
        const [r] = sql('SELECT (SELECT seq FROM usage_rollup_mark) AS mark, (SELECT max(seq) FROM usage_events) AS last');
        if (r.mark >= r.last) break;
        await new Promise((res) => setTimeout(res, 200));
    }
    const rollupMs = Date.now() - startMs;
    const [{ n: rows }] = sql('SELECT count(*) AS n FROM usage_events');

    const to = Math.floor(Date.now() / 1000);
    const range = (h) => `from=${to - h * 3600}&to=${to}`;
    const calls = [
        ['stats/overview', 'stats/overview'],
        ['trends: tokens by hour, 24 h', `stats/tokens?bucket=hour&${range(24)}`],
        ['trends: tokens by hour, 7 days', `stats/tokens?bucket=hour&${range(168)}`],
        ['trends: tokens by hour, 30 days', `stats/tokens?bucket=hour&${range(720)}`],
        ['trends: tokens by day, 7 days', `stats/tokens?bucket=day&${range(168)}`],
        ['trends: tokens by day, 30 days', `stats/tokens?bucket=day&${range(720)}`],
        ['trends: provider share, 24 h', `usage/analytics?group_by=provider&${range(24)}`],
        ['trends: provider share, 7 days', `usage/analytics?group_by=provider&${range(168)}`],
        ['trends: provider share, 30 days', `usage/analytics?group_by=provider&${range(720)}`],
        ['usage: group by model, 24 h', `usage/analytics?group_by=model&${range(24)}`],
        ['usage: group by model, 7 days', `usage/analytics?group_by=model&${range(168)}`],
        ...['model', 'provider', 'key', 'project'].map((g) => [`usage: group by ${g}, 30 days`, `usage/analytics?group_by=${g}&${range(720)}`]),
        ['stats/daily, 30 days', 'stats/daily?days=30'],
        ['stats/providers/{id}', 'stats/providers/mock-openai'],
        ['requests: newest 50', 'usage/events?limit=50'],
        ['requests: page 2 (cursor)', null], // filled below
        ['requests: model', 'usage/events?limit=50&model=model-2'],
        ['requests: provider', 'usage/events?limit=50&provider=prov-1'],
        ['requests: key_id', 'usage/events?limit=50&key_id=17'],
        ['requests: project_id', 'usage/events?limit=50&project_id=103'],
        ['requests: status failed', 'usage/events?limit=50&status=failed'],
        ['requests: status cancelled', 'usage/events?limit=50&status=cancelled'],
        ['requests: rare key (10 events)', 'usage/events?limit=50&key_id=999'],
        ['requests: no match (model)', 'usage/events?limit=50&model=nope'],
        ['requests: no match, 5 filters', 'usage/events?limit=50&model=model-1&provider=prov-2&key_id=4&project_id=101&status=cancelled'],
        ['requests: tenant_id', 'usage/events?limit=50&tenant_id=1001'],
        ['requests: a day, 30 days ago', `usage/events?limit=50&from=${to - 30 * 86400}&to=${to - 29 * 86400}`],
        ['requests: one request (by id)', null],
        ['providers', 'providers'],
        ['cooldowns/history', 'cooldowns/history?limit=50'],
        ['tenants', 'tenants'],
        ['keys', 'keys'],
        ['usage (spend)', 'usage'],
        ['tasks', '/v1/tasks?limit=100'],
        ['config', 'config'],
        ['dashboard session', '/api/dashboard/session'],
    ];
    const first = await admin('GET', 'usage/events?limit=50');
    calls.find((c) => c[0].includes('page 2'))[1] = `usage/events?limit=50&cursor=${first.json.next_cursor}`;
    calls.find((c) => c[0].includes('one request'))[1] = `usage/events?limit=1&request_id=bench-${Math.floor(EVENTS / 2)}`;

    const get = async (p) => {
        const url = p.startsWith('/') ? `${env.base}${p}` : `${env.base}/api/v2/${p}`;
        const s = process.hrtime.bigint();
        const r = await fetch(url, { headers: { authorization: `Bearer ${ADMIN}` } });
        const body = await r.text();
        return { ms: Number(process.hrtime.bigint() - s) / 1e6, status: r.status, body };
    };
    // the gateway's CPU (all threads: the admin API runs on a worker), ms
    const tck = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }));
    const cpuMs = () => {
        const f = fs.readFileSync(`/proc/${env.gw.child.pid}/stat`, 'utf8').split(') ')[1].split(' ');
        return ((Number(f[11]) + Number(f[12])) * 1000) / tck;
    };
    const out = [];
    for (const [label, p] of calls.filter((c) => ONLY.test(c[0]))) {
        const ms = [];
        let status = 0;
        let size = 0;
        let n = 0;
        let c0 = 0;
        for (let i = 0; i < N + 2; i++) {
            const r = await get(p);
            status = r.status;
            size = r.body.length;
            try { n = JSON.parse(r.body).data?.length ?? n; } catch { /* not JSON */ }
            if (i === 1) c0 = cpuMs();
            if (i >= 2) ms.push(r.ms); // two warm-up calls
        }
        const cpu = (cpuMs() - c0) / N;
        ms.sort((a, b) => a - b);
        out.push({ label, path: p, status, rows: n, bytes: size, p50: ms[Math.floor(ms.length / 2)], max: ms[ms.length - 1], cpu });
    }
    // the overview page: the stream's first snapshot event
    const snap = [];
    const s0 = cpuMs();
    for (let i = 0; i < N; i++) {
        const s = process.hrtime.bigint();
        const ac = new AbortController();
        const r = await fetch(`${env.base}/api/dashboard/stream`, { headers: { authorization: `Bearer ${ADMIN}` }, signal: ac.signal });
        const rd = r.body.getReader();
        let text = '';
        while (!/event: snapshot[\s\S]*?\n\n/.test(text)) {
            const { value, done } = await rd.read();
            if (done) break;
            text += Buffer.from(value).toString();
        }
        snap.push(Number(process.hrtime.bigint() - s) / 1e6);
        ac.abort();
        await rd.cancel().catch(() => {});
    }
    snap.sort((a, b) => a - b);
    out.unshift({ label: 'overview: stream, first snapshot', path: '/api/dashboard/stream', status: 200, rows: 0, bytes: 0,
        p50: snap[Math.floor(snap.length / 2)], max: snap[snap.length - 1], cpu: (cpuMs() - s0) / N });

    console.log(`${rows} usage events, filled in ${(fillMs / 1000).toFixed(1)} s, ${(dbBytes / 1048576).toFixed(0)} MiB;` +
        ` start-up + roll-up ${(rollupMs / 1000).toFixed(1)} s; ${N} calls each, ms\n`);
    console.log('| call | status | rows | p50 ms | max ms | CPU ms per call |\n|---|---:|---:|---:|---:|---:|');
    for (const o of out) console.log(`| ${o.label} | ${o.status} | ${o.rows} | ${o.p50.toFixed(2)} | ${o.max.toFixed(2)} | ${o.cpu.toFixed(1)} |`);
    const over = out.filter((o) => o.max >= 50 || o.status !== 200);
    console.log(over.length ? `\nover 50 ms or not 200: ${over.map((o) => o.label).join(', ')}` : '\nevery call under 50 ms');
    console.log(JSON.stringify({ events: rows, n: N, calls: out.map(({ label, status, rows: r, p50, max, cpu }) => ({ label, status, rows: r, p50, max, cpu })) }));
} finally {
    await env.close();
}
