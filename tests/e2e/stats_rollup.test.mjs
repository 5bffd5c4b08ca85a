// The stats read from the daily and hourly roll-ups (issue 22): every answer of
// /api/v2/stats/{overview,daily,tokens,providers/{id}} and /api/v2/usage/analytics equals a
// direct sum over usage_events, for ranges that do not start or end on an hour or a day,
// cross midnights, hold whole days or none, by hour and by day, as the platform admin, with
// ?tenant_id= and as a tenant admin. The events (70 days of them, some exactly at midnight or
// a millisecond before) are written behind the gateway's back past the roll-ups' watermark,
// what a kill -9 between two flushes leaves, so the next start sums them into the hourly
// and the daily tables alike.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { sqliteRows, adminCall, startEnv, startGateway, postJson, journalDrained, waitFor } from './lib/harness.mjs';

const ADMIN = 'adm-stats-rollup-token-77c1';
const DAY = 86400;
const HOUR = 3600;
let env;
let events; // every usage event, as the database has it
let alpha; // { id, token (its tenant admin) }
let beta;

const bin = (ms) => {
    let b = 0;
    while (ms > 0 && b < 24) {
        ms = Math.floor(ms / 2);
        b++;
    }
    return b;
};

before(async () => {
    env = await startEnv({
        configure: (c) => ({ ...c, auth: { enabled: true }, health: { probes: false }, usage: { retention_days: 400 } }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN },
    });
    const admin = (m, p, b) => adminCall(env.base, ADMIN, m, p, b);
    const tenants = [];
    for (const name of ['alpha', 'beta']) {
        const t = await admin('POST', 'tenants', { name });
        assert.equal(t.status, 201, t.text);
        const k = await admin('POST', 'keys', { tenant_id: t.json.id, name: `${name}-key` });
        assert.equal(k.status, 201, k.text);
        const tok = await admin('POST', 'admin-tokens', { tenant_id: t.json.id, name: `${name}-ops` });
        assert.equal(tok.status, 201, tok.text);
        tenants.push({ id: t.json.id, key: k.json.key, keyId: k.json.id, token: tok.json.token });
    }
    [alpha, beta] = tenants;
    for (const t of tenants) {
        const r = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: 'hello' }] },
            { headers: { authorization: `Bearer ${t.key}` } });
        assert.equal(r.status, 200, r.text);
    }
    await journalDrained(env.gw);
    await env.gw.close();

    // 6,000 events over the last 70 days (a deterministic sequence), a tenth of them at a
    // midnight or the millisecond before it
    const now = Date.now();
    let x = 12345;
    const rnd = (n) => {
        x = (x * 1103515245 + 12345) % 2147483648;
        return x % n;
    };
    const pick = (a) => a[rnd(a.length)];
    const rows = [];
    for (let i = 0; i < 6000; i++) {
        let at = now - 60000 - rnd(70 * DAY) * 1000 - rnd(1000);
        if (i % 10 === 0) at = Math.floor(at / (DAY * 1000)) * DAY * 1000 - (i % 20 === 0 ? 1 : 0);
        const status = pick(['succeeded', 'succeeded', 'succeeded', 'failed', 'cancelled', 'timed_out']);
        const latency = rnd(20000);
        const ttft = rnd(3) ? rnd(5000) : null;
        const v = [`'sr-${i}'`, at, "'chat'", pick([alpha.id, beta.id, 'NULL']), pick(['NULL', 1, 2]), pick(['NULL', 11, 12, 13]),
            pick(["'chat'", "'embed'", 'NULL']), "'up-chat'", pick(["'mock-openai'", "'mock-openai-b'", 'NULL']), "'main'", 1,
            `'${status}'`, rnd(5000), rnd(900), rnd(4) ? 0 : rnd(3000), rnd(50), rnd(30), rnd(9) ? 0 : 1, rnd(7) ? 0 : 1,
            latency, ttft ?? 'NULL', rnd(100000), bin(latency), ttft === null ? 'NULL' : bin(ttft)];
        rows.push(`(${v.join(', ')})`);
    }
    const fill = `BEGIN; INSERT INTO usage_events(request_id, at_ms, endpoint, tenant_id, project_id, key_id,
        logical_model, actual_model, provider_id, pool, attempts, status, input_tokens, output_tokens,
        cached_read_tokens, cache_write_tokens, reasoning_tokens, input_estimated, output_estimated,
        latency_ms, ttft_ms, cost_micros, latency_bin, ttft_bin) VALUES ${rows.join(',\n')}; COMMIT;`;
    execFileSync('sqlite3', ['-cmd', '.timeout 5000', env.config.storage.path], { input: fill });
    env.gw = await startGateway(env.configPath, { env: { MOONGATE_ADMIN_TOKEN: ADMIN } });
    env.base = env.gw.base;
    const sql = (q) => sqliteRows(env.config.storage.path, q);
    await waitFor(() => {
        const [r] = sql('SELECT (SELECT seq FROM usage_rollup_mark) AS mark, (SELECT max(seq) FROM usage_events) AS last');
        return r.mark >= r.last;
    }, { timeoutMs: 30000, what: 'the start-up roll-up' });
    events = JSON.parse(execFileSync('sqlite3', ['-json', env.config.storage.path, `SELECT at_ms, tenant_id, project_id,
        key_id, logical_model, provider_id, status, input_tokens, output_tokens, cached_read_tokens, cache_write_tokens,
        reasoning_tokens, input_estimated, output_estimated, latency_ms, ttft_ms, cost_micros, latency_bin, ttft_bin
        FROM usage_events`], { encoding: 'utf8', maxBuffer: 64 << 20 }));
    assert.equal(events.length, 6002);
    const [d] = sql('SELECT COUNT(*) AS n, SUM(requests) AS r FROM usage_daily');
    assert.ok(d.n > 1000, 'the daily table holds the seeded days');
    assert.equal(d.r, 6002, 'every event in a daily row');
});

after(async () => {
    await env?.close();
});

// ---- the expected answers, from the raw events ----

const hourOf = (e) => Math.floor(e.at_ms / 3600000) * HOUR;
const floorTo = (v, u) => Math.floor(v / u) * u;
const ceilTo = (v, u) => Math.ceil(v / u) * u;
const upper = (b) => (b <= 0 ? 1 : 2 ** b);
const idiv = (a, b) => Math.trunc(a / b);

// events of the tenant (null: all) whose hour starts in [from, to), and pass `more`
const select = (tenant, from, to, more = () => true) =>
    events.filter((e) => (tenant === null || e.tenant_id === tenant) && hourOf(e) >= from && hourOf(e) < to && more(e));

function totals(evs) {
    const s = (f) => evs.reduce((a, e) => a + f(e), 0);
    return {
        requests: evs.length,
        errors: s((e) => (e.status === 'failed' || e.status === 'timed_out' ? 1 : 0)),
        cancelled: s((e) => (e.status === 'cancelled' ? 1 : 0)),
        tokens_in: s((e) => e.input_tokens + e.cached_read_tokens + e.cache_write_tokens),
        tokens_out: s((e) => e.output_tokens),
        input_tokens: s((e) => e.input_tokens),
        cached_read_tokens: s((e) => e.cached_read_tokens),
        cache_write_tokens: s((e) => e.cache_write_tokens),
        reasoning_tokens: s((e) => e.reasoning_tokens),
        cost_micros: s((e) => e.cost_micros),
    };
}

function percentile(bins, p) {
    const n = bins.length;
    if (!n) return null;
    const h = new Array(25).fill(0);
    for (const b of bins) h[b]++;
    const rank = idiv(n * p + 99, 100);
    let seen = 0;
    for (let b = 0; b < 25; b++) if ((seen += h[b]) >= rank) return upper(b);
    return upper(24);
}

const change = (now, before) => (before <= 0 ? null : (now - before) / before);
const tokensOf = (t) => t.tokens_in + t.tokens_out;

const GROUPS = {
    model: (e) => e.logical_model ?? '',
    provider: (e) => e.provider_id ?? '',
    key: (e) => e.key_id ?? 0,
    project: (e) => e.project_id ?? 0,
};

function groupJson(by, key, cur, prev) {
    const t = totals(cur);
    const p = totals(prev);
    const withTtft = cur.filter((e) => e.ttft_ms !== null);
    const numeric = by === 'key' || by === 'project';
    return {
        ...t,
        group: numeric ? (key === 0 ? null : key) : key === '' ? null : key,
        success_rate: t.requests ? (t.requests - t.errors - t.cancelled) / t.requests : null,
        cache_hits: cur.filter((e) => e.cached_read_tokens > 0).length,
        missing_usage: cur.filter((e) => e.status === 'succeeded' && (e.input_estimated || e.output_estimated)).length,
        latency_ms: {
            avg: t.requests ? idiv(cur.reduce((a, e) => a + e.latency_ms, 0), t.requests) : null,
            p50: percentile(cur.map((e) => e.latency_bin), 50),
            p95: percentile(cur.map((e) => e.latency_bin), 95),
        },
        ttft_ms: {
            avg: withTtft.length ? idiv(withTtft.reduce((a, e) => a + e.ttft_ms, 0), withTtft.length) : null,
            p50: percentile(withTtft.map((e) => e.ttft_bin), 50),
            p95: percentile(withTtft.map((e) => e.ttft_bin), 95),
        },
        previous: { requests: p.requests, tokens: tokensOf(p), cost_micros: p.cost_micros, errors: p.errors },
        change: { requests: change(t.requests, p.requests), tokens: change(tokensOf(t), tokensOf(p)), cost_micros: change(t.cost_micros, p.cost_micros) },
    };
}

// range_params: from down and to up to whole hours, an empty range one hour long
function hours(from, to) {
    const f = floorTo(from, HOUR);
    let t = ceilTo(to, HOUR);
    if (t <= f) t = f + HOUR;
    return [f, t];
}

function expectAnalytics(by, tenant, from, to) {
    const [f, t] = hours(from, to);
    const len = t - f;
    const cur = select(tenant, f, t);
    const prev = select(tenant, f - len, f);
    const keys = [...new Set([...cur, ...prev].map(GROUPS[by]))];
    const data = keys.map((k) => groupJson(by, k, cur.filter((e) => GROUPS[by](e) === k), prev.filter((e) => GROUPS[by](e) === k)));
    return { f, t, data };
}

const iso = (s) => new Date(s * 1000).toISOString().replace('.000Z', 'Z');

function expectSeries(tenant, width, f, t) {
    const out = [];
    for (let b = floorTo(f, width); b < t; b += width)
        out.push({ ...totals(select(tenant, b, b + width)), bucket_start: b, bucket: width === DAY ? iso(b).slice(0, 10) : iso(b) });
    return out;
}

const byGroup = (a, b) => String(a.group).localeCompare(String(b.group));

// ---- the calls ----

// the three ways to see one tenant or all: [label, token, query suffix, tenant id or null]
const scopes = () => [
    ['platform admin', ADMIN, '', null],
    ['platform admin, ?tenant_id=', ADMIN, `tenant_id=${beta.id}`, beta.id],
    ['tenant admin', alpha.token, '', alpha.id],
];

async function get(token, p, suffix) {
    const sep = p.includes('?') ? '&' : '?';
    const r = await adminCall(env.base, token, 'GET', suffix ? `${p}${sep}${suffix}` : p);
    assert.equal(r.status, 200, `${p}: ${r.text}`);
    return r.json;
}

// [label, from, to] in unix seconds: unaligned, across midnights, whole days or none
function ranges() {
    const now = Math.floor(Date.now() / 1000);
    const d = floorTo(now, DAY) - 20 * DAY; // a midnight twenty days ago
    return [
        ['30 days, unaligned both ends', now - 30 * DAY - 5 * HOUR - 7, now - 3 * HOUR - 17 * 60 - 13],
        ['3 whole days, aligned', d, d + 3 * DAY],
        ['one second either side of a midnight', d + DAY - 1, d + DAY + 1],
        ['a day and an hour either side', d - HOUR, d + DAY + HOUR],
        ['within one day', d + 2 * HOUR + 1800, d + 20 * HOUR + 600],
        ['45 days to now (a previous period with events)', now - 45 * DAY, now],
        ['from a midnight to an unaligned end', d, d + 5 * DAY + 7 * HOUR + 5],
        ['from an unaligned start to a midnight', d - 2 * DAY - 13 * HOUR - 59, d],
        ['empty (from = to at a midnight)', d, d],
    ];
}

describe('stats over the daily and hourly roll-ups equal the raw events', () => {
    test('usage/analytics, every group_by, every range and scope', async () => {
        for (const [label, from, to] of ranges()) {
            for (const by of Object.keys(GROUPS)) {
                for (const [who, token, suffix, tenant] of scopes()) {
                    const got = await get(token, `usage/analytics?group_by=${by}&from=${from}&to=${to}`, suffix);
                    const exp = expectAnalytics(by, tenant, from, to);
                    const what = `${label}, ${by}, ${who}`;
                    assert.equal(got.from, exp.f, what);
                    assert.equal(got.to, exp.t, what);
                    assert.deepEqual(got.data.sort(byGroup), exp.data.sort(byGroup), what);
                }
            }
        }
    });

    test('stats/tokens by hour and by day, every range and scope', async () => {
        for (const [label, from, to] of ranges()) {
            for (const [who, token, suffix, tenant] of scopes()) {
                const [f, t] = hours(from, to);
                const h = await get(token, `stats/tokens?bucket=hour&from=${from}&to=${to}`, suffix);
                assert.deepEqual([h.from, h.to], [f, t], `${label}, ${who}`);
                assert.deepEqual(h.data, expectSeries(tenant, HOUR, f, t), `${label}, by hour, ${who}`);
                const df = floorTo(f, DAY);
                const dt = ceilTo(t, DAY);
                const d = await get(token, `stats/tokens?bucket=day&from=${from}&to=${to}`, suffix);
                assert.deepEqual([d.from, d.to], [df, dt], `${label}, ${who}`);
                assert.deepEqual(d.data, expectSeries(tenant, DAY, df, dt), `${label}, by day, ${who}`);
            }
        }
        // ISO times, the same answer
        const d = floorTo(Math.floor(Date.now() / 1000), DAY) - 10 * DAY;
        const a = await get(ADMIN, `stats/tokens?bucket=day&from=${d + 5}&to=${d + 3 * DAY + 5}`);
        const b = await get(ADMIN, `stats/tokens?bucket=day&from=${iso(d + 5)}&to=${iso(d + 3 * DAY + 5)}`);
        assert.deepEqual(b, a);
    });

    test('stats/overview, stats/daily and stats/providers/{id}, every scope', async () => {
        for (const [who, token, suffix, tenant] of scopes()) {
            // the periods are the server's now: asked again when a day began meanwhile
            for (let attempt = 0; ; attempt++) {
                const t0 = Math.floor(Date.now() / 1000);
                const [o, daily, pr] = [await get(token, 'stats/overview', suffix), await get(token, 'stats/daily?days=40', suffix),
                    await get(token, 'stats/providers/mock-openai', suffix)];
                const t1 = Math.floor(Date.now() / 1000);
                if (floorTo(t0, DAY) !== floorTo(t1, DAY) && attempt < 2) continue;
                const day = floorTo(t0, DAY);
                const wd = new Date(t0 * 1000).getUTCDay();
                const week = day - ((wd + 6) % 7) * DAY;
                const month = day - (new Date(t0 * 1000).getUTCDate() - 1) * DAY;
                const period = (from, more) => ({ ...totals(select(tenant, ceilTo(from, HOUR), ceilTo(t0 + HOUR, HOUR), more)), from: iso(from) });
                assert.deepEqual(o.today, period(day), `today, ${who}`);
                assert.deepEqual(o.this_week, period(week), `this week, ${who}`);
                assert.deepEqual(o.this_month, period(month), `this month, ${who}`);
                assert.equal(daily.data.length, 40);
                assert.deepEqual(daily.data, expectSeries(tenant, DAY, day - 39 * DAY, day + DAY), `daily, ${who}`);
                const mo = (e) => e.provider_id === 'mock-openai';
                assert.deepEqual(pr.today, period(day, mo), `provider today, ${who}`);
                assert.deepEqual(pr.last_7_days, period(day - 6 * DAY, mo), `provider 7 days, ${who}`);
                assert.deepEqual(pr.last_30_days, period(day - 29 * DAY, mo), `provider 30 days, ${who}`);
                const evs = select(tenant, day - 29 * DAY, ceilTo(t0 + HOUR, HOUR), mo);
                const models = [...new Set(evs.map((e) => e.logical_model ?? ''))].map((m) => {
                    const g = evs.filter((e) => (e.logical_model ?? '') === m);
                    return { ...totals(g), model: m, avg_latency_ms: idiv(g.reduce((a, e) => a + e.latency_ms, 0), g.length) };
                });
                const byModel = (a, b) => a.model.localeCompare(b.model);
                assert.deepEqual(pr.models_last_30_days.sort(byModel), models.sort(byModel), `provider models, ${who}`);
                assert.ok(o.this_month.requests > 0 || new Date(t0 * 1000).getUTCDate() === 1);
                break;
            }
        }
    });
});
