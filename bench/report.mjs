// Turns bench/run's raw records (raw.jsonl) into the figures: prints a table and writes
// results.json and results.md. usage: node report.mjs RAW_JSONL OUT_DIR
import fs from 'node:fs';
import path from 'node:path';

const [rawPath, outDir] = process.argv.slice(2);
const records = fs.readFileSync(rawPath, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
const meta = records.find((r) => r.kind === 'meta') || {};
const status = records.find((r) => r.kind === 'status') || {};
const clkTck = meta.clk_tck || 100;
const VARIANTS = ['direct', 'nginx', 'moongate'];
const MODES = ['json', 'sse'];
const warnings = [];

const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);
const median = (xs) => {
    if (!xs.length) return null;
    const s = [...xs].sort((a, b) => a - b);
    const h = Math.floor(s.length / 2);
    return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2;
};
function percentile(sorted, p) { // nearest rank
    if (!sorted.length) return null;
    const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
    return sorted[i];
}

// ---- per-run figures ----------------------------------------------------------------------------
const runs = records.filter((r) => r.kind === 'wrk').map((r) => {
    const w = r.wrk;
    const errors = w.failed ? null
        : w.err_connect + w.err_read + w.err_write + w.err_status + w.err_timeout;
    const ok = !w.failed && w.requests > 0;
    const perReq = (ticks) => (ok && ticks !== null ? (ticks * 1e6) / clkTck / w.requests : null);
    const run = {
        phase: r.phase, mode: r.mode, variant: r.variant, rep: r.rep, conns: r.conns,
        threads: r.threads, think_ms: r.think_ms,
        requests: w.requests || 0, errors,
        rps: ok ? (w.requests * 1e6) / w.duration_us : null,
        p50_us: ok ? w.lat_p50_us : null, p90_us: ok ? w.lat_p90_us : null,
        p99_us: ok ? w.lat_p99_us : null, p999_us: ok ? w.lat_p999_us : null,
        mean_us: ok ? w.lat_mean_us : null, max_us: ok ? w.lat_max_us : null,
        proxy_cpu_us_per_req: perReq(r.proxy_ticks), mock_cpu_us_per_req: perReq(r.mock_ticks),
        proxy_ticks: r.proxy_ticks, mock_ticks: r.mock_ticks,
        steal_ticks: r.steal_ticks ?? null, host_ticks: r.host_ticks ?? null,
        hist: ok && Array.isArray(w.hist) ? w.hist : null, // [[us, count], ...] (paced runs)
    };
    if (!ok) warnings.push(`${r.phase} ${r.mode} ${r.variant} rep${r.rep}: no result from wrk`);
    else if (errors > 0) {
        warnings.push(`${r.phase} ${r.mode} ${r.variant} rep${r.rep}: ${errors} errors ` +
            `(connect ${w.err_connect}, read ${w.err_read}, write ${w.err_write}, ` +
            `non-2xx ${w.err_status}, timeout ${w.err_timeout}) of ${w.requests} requests`);
    }
    return run;
});

// One figure over the repetitions, null when the variant has no valid run: the mean, but the
// median for latency percentiles (`p50_us`, `p99_us`). A run's p99 is set by the few stalls of the host that
// fall into it, so one unlucky run would move a mean of p99s by milliseconds; the median of
// many rounds is what the proxy adds. (With two runs the median is their mean.)
function agg(phase, mode, variant, field) {
    const xs = runs.filter((r) => r.phase === phase && r.mode === mode && r.variant === variant)
        .map((r) => r[field]).filter((x) => x !== null && x !== undefined);
    return /^p\d+_us$/.test(field) ? median(xs) : mean(xs);
}
const ratio = (a, b) => (a !== null && b !== null && b > 0 && a >= 0 ? a / b : null);

// ---- figures --------------------------------------------------------------------------------------
const figures = { cpu_us_per_req: {}, mock_cpu_us_per_req: {}, latency_added_ms: {}, rps: {},
                  rss_mib: {}, sse_first_byte_ms: {} };

for (const phase of ['c50', 'paced']) {
    figures.cpu_us_per_req[phase] = {};
    figures.mock_cpu_us_per_req[phase] = {};
    for (const mode of MODES) {
        const nginx = agg(phase, mode, 'nginx', 'proxy_cpu_us_per_req');
        const mg = agg(phase, mode, 'moongate', 'proxy_cpu_us_per_req');
        figures.cpu_us_per_req[phase][mode] = { nginx, moongate: mg, ratio: ratio(mg, nginx) };
        figures.mock_cpu_us_per_req[phase][mode] = Object.fromEntries(
            VARIANTS.map((v) => [v, agg(phase, mode, v, 'mock_cpu_us_per_req')]));
    }
}

for (const phase of ['c1', 'paced']) {
    figures.latency_added_ms[phase] = {};
    for (const mode of MODES) {
        figures.latency_added_ms[phase][mode] = {};
        for (const p of ['p50', 'p99']) {
            const direct = agg(phase, mode, 'direct', `${p}_us`);
            const added = (v) => {
                const x = agg(phase, mode, v, `${p}_us`);
                return x === null || direct === null ? null : (x - direct) / 1000;
            };
            const nginx = added('nginx');
            const mg = added('moongate');
            figures.latency_added_ms[phase][mode][p] = {
                direct_ms: direct === null ? null : direct / 1000, nginx, moongate: mg,
                ratio: ratio(mg, nginx),
            };
        }
        figures.latency_added_ms[phase][mode].rps = Object.fromEntries(
            VARIANTS.map((v) => [v, agg(phase, mode, v, 'rps')]));
    }
}

for (const phase of ['c50', 'c200']) {
    figures.rps[phase] = {};
    for (const mode of MODES) {
        const row = Object.fromEntries(VARIANTS.map((v) => [v, agg(phase, mode, v, 'rps')]));
        row.ratio = ratio(row.moongate, row.nginx);
        figures.rps[phase][mode] = row;
    }
}

for (const when of ['idle', 'after_c200']) {
    const rss = (v) => {
        const r = records.find((x) => x.kind === 'rss' && x.when === when && x.variant === v);
        return r && r.vmhwm_kib > 0 ? r.vmhwm_kib / 1024 : null;
    };
    const nginx = rss('nginx');
    const mg = rss('moongate');
    figures.rss_mib[when] = { nginx, moongate: mg, ratio: ratio(mg, nginx), mock: rss('mock') };
}

for (const [k, label] of [['busy_start_pct', 'before'], ['busy_end_pct', 'after']]) {
    if (status[k] >= 10) {
        warnings.push(`the machine was ${status[k]}% busy with other work just ${label} the runs ` +
            '(while the servers idled): the figures are noisier than usual, rerun on a quiet box');
    }
}

if (status.moongate_log_lines > 1000) {
    warnings.push(`moongate wrote ${status.moongate_log_lines} log lines (about one per request, ` +
        'although the bench config sets log.level warn); nginx runs with access_log off, so ' +
        "moongate's CPU figures include its per-request logging");
}

const ttfbRuns = records.filter((r) => r.kind === 'ttfb');
const ttfb = {};
for (const v of VARIANTS) {
    const rs = ttfbRuns.filter((r) => r.variant === v);
    const samples = rs.flatMap((r) => r.result.ttfb_us).sort((a, b) => a - b);
    const totals = rs.flatMap((r) => r.result.total_us).sort((a, b) => a - b);
    const errors = rs.reduce((a, r) => a + r.result.errors, 0);
    if (errors) {
        const first = rs.map((r) => r.result.first_error).find(Boolean);
        warnings.push(`first-byte ${v}: ${errors} failed requests (${first})`);
    }
    ttfb[v] = { n: samples.length, errors, p50_us: percentile(samples, 50),
                p99_us: percentile(samples, 99), total_p50_us: percentile(totals, 50) };
}
for (const p of ['p50', 'p99']) {
    const direct = ttfb.direct[`${p}_us`];
    const added = (v) => (ttfb[v][`${p}_us`] === null || direct === null ? null
        : (ttfb[v][`${p}_us`] - direct) / 1000);
    const nginx = added('nginx');
    const mg = added('moongate');
    figures.sse_first_byte_ms[p] = { direct_ms: direct === null ? null : direct / 1000, nginx,
                                     moongate: mg, ratio: ratio(mg, nginx) };
}

// ---- the core's targets (issue 2), and how far the paced p99 can be trusted ------------------------
// A paced run's p99 is the 50th slowest of ~5,000 requests: a few stalls of the host decide it.
// Beside the medians the report gives each variant's spread over the rounds, the median of the
// per-round gaps (moongate's p99 minus nginx's in the same round: the runs of a round are
// adjacent, so slow drifts of the host cancel), and the hypervisor's steal over the phase.
function pacedRounds(mode, variant, field) {
    return runs.filter((r) => r.phase === 'paced' && r.mode === mode && r.variant === variant &&
                        r[field] !== null).sort((a, b) => a.rep - b.rep);
}
function stealPct(phase) { // phase null: every run
    const rs = runs.filter((r) => (phase === null || r.phase === phase) && r.steal_ticks !== null &&
                           r.host_ticks > 0);
    const host = rs.reduce((a, r) => a + r.host_ticks, 0);
    return host > 0 ? (100 * rs.reduce((a, r) => a + r.steal_ticks, 0)) / host : null;
}
// A percentile over every request of a variant's paced rounds (their histograms pooled), null
// when no round has one.
function pooledPercentile(mode, variant, p) {
    const samples = pacedRounds(mode, variant, 'hist')
        .flatMap((r) => r.hist.flatMap(([v, c]) => Array(c).fill(v)));
    return percentile(samples.sort((a, b) => a - b), p);
}
// The lowest and highest of the rounds' figures, ms.
const spreadMs = (rs, field) => (rs.length ? [Math.min(...rs.map((r) => r[field])) / 1000,
                                              Math.max(...rs.map((r) => r[field])) / 1000] : null);
figures.core_targets = { steal_pct: { paced: stealPct('paced'), all: stealPct(null) } };
for (const mode of MODES) {
    const t = {};
    for (const p of ['p50', 'p99']) {
        const field = `${p}_us`;
        const ng = pacedRounds(mode, 'nginx', field);
        const mg = pacedRounds(mode, 'moongate', field);
        const byRep = new Map(ng.map((r) => [r.rep, r[field]]));
        const gaps = mg.filter((r) => byRep.has(r.rep)).map((r) => (r[field] - byRep.get(r.rep)) / 1000);
        const l = figures.latency_added_ms.paced[mode][p];
        // the verdict: the median of the rounds. Pooled, the few rounds a host stall hits decide
        // the p99 (measured: one nginx round at 6.5 ms moved its pooled SSE p99 by 0.6 ms).
        const gap = l.moongate === null || l.nginx === null ? null : l.moongate - l.nginx;
        const pooled = Object.fromEntries(VARIANTS.map((v) => {
            const us = pooledPercentile(mode, v, Number(p.slice(1)));
            return [v, us === null ? null : us / 1000];
        }));
        const pooledGap = pooled.moongate === null || pooled.nginx === null ? null
            : pooled.moongate - pooled.nginx;
        t[p] = { gap_ms: gap, pooled_gap_ms: pooledGap, pooled_ms: pooled,
                 paired_gap_ms: median(gaps), met: gap === null ? null : gap <= 0.1,
                 rounds_ms: { nginx: spreadMs(ng, field), moongate: spreadMs(mg, field) } };
    }
    figures.core_targets[mode] = t;
}
if (figures.core_targets.steal_pct.paced !== null && figures.core_targets.steal_pct.paced >= 2) {
    warnings.push(`the hypervisor took ${figures.core_targets.steal_pct.paced.toFixed(1)}% of the CPU ` +
        'time (steal) during the paced phase: its p99s are noisier than usual');
}

// ---- the moongate variants: 10 providers per model, auth on with 100,000 keys ---------------------
// Measured in the paced and 50-connection phases only; every figure is set against the plain
// moongate variant (1 provider, auth off) of the same run, and against nginx.
const EXTRA = {
    moongate_10p: { title: `moongate with ${meta.providers_10p || 10} providers per model`,
                    base: '1 provider', col: `${meta.providers_10p || 10} providers`,
                    short: `${meta.providers_10p || 10}p`, baseShort: '1p', target: 0.90,
                    issue: 'issue 3: req/s within 10% of 1 provider' },
    moongate_auth: { title: `moongate with auth on and ${(meta.auth_keys || 100000).toLocaleString('en-US')} keys loaded`,
                     base: 'auth off', col: `auth on, ${(meta.auth_keys || 100000).toLocaleString('en-US')} keys`,
                     short: 'on', baseShort: 'off', target: 0.95,
                     issue: 'issue 5: req/s within 5% of auth off' },
    moongate_dash: { title: `moongate with ${meta.dashboards || 10} dashboards on the live stream`,
                     base: 'no dashboard', col: `${meta.dashboards || 10} dashboards`,
                     short: 'dash', baseShort: 'none', target: 0.95,
                     issue: 'issue 22: within the noise of no dashboard' },
    // metering off against plain moongate (metering on, the default): the ratios are on/off,
    // and the target is on CPU per request (issue 19: metering costs at most 10 % more)
    moongate_nometer: { title: 'moongate with metering off (usage.enabled: false)',
                        base: 'metering on', col: 'metering off', short: 'on', baseShort: 'off',
                        invert: true, cpuTarget: 1.10,
                        issue: 'issue 19: CPU per request with metering on at most 10% above off' },
    // the plain request beside the same request on a session of N turns (issue 21: figures,
    // no target): the session's CPU per request, and the token counts it was measured with
    moongate_session: { title: `moongate with every request on a ${meta.session_turns || 50}-turn session (session_id)`,
                        base: 'plain', col: `on a ${meta.session_turns || 50}-turn session`,
                        short: 'session', baseShort: 'plain',
                        issue: 'issue 21: a session request beside a plain one, figures only' },
};
// a run with BENCH_EXTRA names the extra variants it ran; older runs ran all but the last
if (Array.isArray(meta.extra_variants)) {
    for (const v of Object.keys(EXTRA)) if (!meta.extra_variants.includes(v)) delete EXTRA[v];
} else delete EXTRA.moongate_nometer;
const variantStatus = (v) => (status.variants && status.variants[v]) || { ok: 0, reason: 'not run' };

function versus(phase, mode, v, field, direct) {
    const get = (x) => {
        const y = agg(phase, mode, x, field);
        if (direct === undefined) return y;
        return y === null || direct === null ? null : (y - direct) / 1000; // added ms over direct
    };
    const nginx = get('nginx');
    const base = get('moongate');
    const x = get(v);
    // invert: the plain variant is the one with the feature (metering on: on/off)
    const vs = EXTRA[v].invert ? ratio(base, x) : ratio(x, base);
    return { nginx, moongate: base, [v]: x, vs_moongate: vs, vs_nginx: ratio(x, nginx) };
}

for (const v of Object.keys(EXTRA)) {
    const f = { c50: {}, c50m: {}, paced: {}, rss_mib: {} };
    for (const mode of MODES) {
        for (const phase of ['c50', 'c50m']) { // (c50m: the moongate variants alone, more rounds)
            f[phase][mode] = { rps: versus(phase, mode, v, 'rps'),
                               cpu_us_per_req: versus(phase, mode, v, 'proxy_cpu_us_per_req') };
        }
        const p = { rps: versus('paced', mode, v, 'rps'),
                    cpu_us_per_req: versus('paced', mode, v, 'proxy_cpu_us_per_req') };
        for (const q of ['p50', 'p99']) {
            p[`${q}_added_ms`] = versus('paced', mode, v, `${q}_us`, agg('paced', mode, 'direct', `${q}_us`));
        }
        f.paced[mode] = p;
    }
    for (const when of ['idle', 'after_c50']) {
        const rss = (x) => {
            const r = records.find((y) => y.kind === 'rss' && y.when === when && y.variant === x);
            return r && r.vmhwm_kib > 0 ? r.vmhwm_kib / 1024 : null;
        };
        f.rss_mib[when] = { nginx: rss('nginx'), moongate: rss('moongate'), [v]: rss(v),
                            vs_moongate: ratio(rss(v), rss('moongate')), vs_nginx: ratio(rss(v), rss('nginx')) };
    }
    const start = records.find((r) => r.kind === 'start' && r.variant === v);
    const startBase = records.find((r) => r.kind === 'start' && r.variant === 'moongate');
    f.startup_ms = { moongate: startBase ? startBase.startup_ms : null, [v]: start ? start.startup_ms : null };
    const e = EXTRA[v];
    // decided on the rounds of the moongate variants alone when the run has them
    f.target_phase = MODES.some((m) => f.c50m[m].rps.vs_moongate !== null) ? 'c50m' : 'c50';
    f.target = e.target === undefined && !e.cpuTarget ? null : e.cpuTarget ? {
        cpu_ratio_at_most: e.cpuTarget, what: e.issue, phases: ['paced', f.target_phase],
        met: Object.fromEntries(MODES.map((m) => {
            const rs = ['paced', f.target_phase].map((ph) => f[ph][m].cpu_us_per_req.vs_moongate);
            return [m, rs.some((r) => r === null) ? null : rs.every((r) => r <= e.cpuTarget)];
        })) } : { rps_ratio_at_least: e.target, what: e.issue, phase: f.target_phase,
                 met: Object.fromEntries(MODES.map((m) => {
                     const r = f[f.target_phase][m].rps.vs_moongate;
                     return [m, r === null ? null : r >= e.target];
                 })) };
    figures[v] = f;
    const st = variantStatus(v);
    if (st.log_lines > 1000) {
        warnings.push(`${v} wrote ${st.log_lines} log lines (about one per request): its CPU ` +
            'figures include per-request logging');
    }
}

// What loading the keys costs: moongate_auth started with 1 key, then with all of them.
if (figures.moongate_auth) {
    const loads = records.filter((r) => r.kind === 'auth_load').sort((a, b) => a.keys - b.keys);
    const seed = records.find((r) => r.kind === 'auth_seed');
    const one = loads.length >= 2 ? loads[0] : null;
    const all = loads.length >= 2 ? loads[loads.length - 1] : null;
    const per = (a, b, scale) => (one && all && a >= 0 && b >= 0 ? ((b - a) * scale) / (all.keys - one.keys) : null);
    figures.moongate_auth.keys = {
        keys: all ? all.keys : null,
        startup_ms: { one_key: one ? one.startup_ms : null, all_keys: all ? all.startup_ms : null },
        load_ms: one && all ? all.startup_ms - one.startup_ms : null,
        load_us_per_key: one && all ? per(one.startup_ms, all.startup_ms, 1000) : null,
        vmrss_mib: { one_key: one ? one.vmrss_kib / 1024 : null, all_keys: all ? all.vmrss_kib / 1024 : null },
        vmhwm_mib: { one_key: one ? one.vmhwm_kib / 1024 : null, all_keys: all ? all.vmhwm_kib / 1024 : null },
        rss_bytes_per_key: one && all ? per(one.vmrss_kib, all.vmrss_kib, 1024) : null,
        hwm_bytes_per_key: one && all ? per(one.vmhwm_kib, all.vmhwm_kib, 1024) : null,
        seed_s: seed ? seed.seconds : null,
    };
}

// ---- table ----------------------------------------------------------------------------------------
const NA = 'n/a';
const fmt = (x, d) => (x === null || x === undefined ? NA : x.toFixed(d));
const fmtAdd = (x) => (x === null || x === undefined ? NA : (x >= 0 ? '+' : '') + x.toFixed(3));
const fmtRatio = (x) => (x === null || x === undefined ? NA : `${x.toFixed(2)}x`);
const rows = [];
const row = (figure, mode, direct, nginx, moongate, r) =>
    rows.push({ figure, mode, direct, nginx, moongate, ratio: r });
const section = (title) => rows.push({ section: title });

section('CPU of the proxy process, us per request (utime+stime / requests)');
for (const [phase, label] of [['c50', '50 conns'], ['paced', `~${pacedRate()} req/s`]]) {
    for (const mode of MODES) {
        const c = figures.cpu_us_per_req[phase][mode];
        row(`CPU us/req @${label}`, mode, '-', fmt(c.nginx, 1), fmt(c.moongate, 1),
            fmtRatio(c.ratio));
    }
}
// the session case beside the plain request (issue 21): the same body with a session_id, in
// the moongate column (its own table below has the session/plain ratios)
if (EXTRA.moongate_session) {
    for (const [phase, label] of [['c50', '50 conns'], ['paced', `~${pacedRate()} req/s`]]) {
        for (const mode of MODES) {
            const c = figures.moongate_session[phase][mode].cpu_us_per_req;
            row(`CPU us/req @${label}, ${meta.session_turns || 50}-turn session`, mode, '-',
                fmt(c.nginx, 1), fmt(c.moongate_session, 1), fmtRatio(c.vs_nginx));
        }
    }
}
for (const mode of MODES) {
    const m = figures.mock_cpu_us_per_req.c50[mode];
    row('  (mock upstream us/req @50 conns)', mode, fmt(m.direct, 1), fmt(m.nginx, 1),
        fmt(m.moongate, 1), '');
}
section('Latency added over direct, ms (direct column: its own latency)');
for (const [phase, label] of [['c1', '1 conn'], ['paced', `~${pacedRate()} req/s`]]) {
    for (const mode of MODES) {
        for (const p of ['p50', 'p99']) {
            const l = figures.latency_added_ms[phase][mode][p];
            row(`${p} @${label}`, mode, `(${fmt(l.direct_ms, 3)})`, fmtAdd(l.nginx),
                fmtAdd(l.moongate), fmtRatio(l.ratio));
        }
    }
}
section('SSE time to first body byte, added over direct, ms (sequential)');
for (const p of ['p50', 'p99']) {
    const t = figures.sse_first_byte_ms[p];
    row(`first byte ${p}`, 'sse', `(${fmt(t.direct_ms, 3)})`, fmtAdd(t.nginx), fmtAdd(t.moongate),
        fmtRatio(t.ratio));
}
section('Throughput, req/s (information: wrk, mock and proxy share the cores)');
for (const [phase, label] of [['c50', '50 conns'], ['c200', '200 conns']]) {
    for (const mode of MODES) {
        const r = figures.rps[phase][mode];
        row(`req/s @${label}`, mode, fmt(r.direct, 0), fmt(r.nginx, 0), fmt(r.moongate, 0),
            fmtRatio(r.ratio));
    }
}
section('Peak RSS (VmHWM), MiB: nginx worker vs moongate');
for (const [when, label] of [['idle', 'idle'], ['after_c200', 'after 200 conns']]) {
    const r = figures.rss_mib[when];
    row(`peak RSS ${label}`, '', '-', fmt(r.nginx, 1), fmt(r.moongate, 1), fmtRatio(r.ratio));
}

function pairRounds() {
    return `${meta.pair_reps || '?'} interleaved rounds of ${meta.pair_duration_s || '?'}s runs`;
}

function pacedRate() {
    const xs = runs.filter((r) => r.phase === 'paced' && r.variant === 'direct' && r.rps)
        .map((r) => r.rps);
    return xs.length ? Math.round(mean(xs) / 50) * 50 : 1000;
}

// Plain-text and Markdown rendering of a table: cols = [[key, title], ...], the first two
// left-aligned; rows = { section } or { key: text, ... }.
function renderText(cols, rs) {
    const width = Object.fromEntries(cols.map(([c, t]) => [c, Math.max(t.length,
        ...rs.filter((r) => !r.section).map((r) => r[c].length))]));
    const line = (r) => cols.map(([c], i) => (i < 2 ? r[c].padEnd(width[c]) : r[c].padStart(width[c])))
        .join('  ');
    let out = line(Object.fromEntries(cols)) + '\n';
    for (const r of rs) out += r.section ? `-- ${r.section}\n` : line(r) + '\n';
    return out;
}
function renderMd(cols, rs) {
    let out = `| ${cols.map(([, t]) => t).join(' | ')} |\n`;
    out += `|${cols.map((_, i) => (i < 2 ? '---' : '---:')).join('|')}|\n`;
    for (const r of rs) {
        out += r.section ? `| **${r.section}** |${' |'.repeat(cols.length - 1)}\n`
            : `| ${cols.map(([c]) => r[c].trim()).join(' | ')} |\n`;
    }
    return out;
}

const COLS = [['figure', 'figure'], ['mode', 'mode'], ['direct', 'direct'], ['nginx', 'nginx'],
              ['moongate', 'moongate'], ['ratio', 'moongate/nginx']];

// One table per extra variant: nginx, plain moongate, the variant, and the two ratios.
const extraTables = {};
for (const [v, e] of Object.entries(EXTRA)) {
    const f = figures[v];
    const rs = [];
    const add = (figure, mode, x, show, showRatio = fmtRatio) => rs.push({
        figure, mode, nginx: show(x.nginx), moongate: show(x.moongate), variant: show(x[v]),
        vs_moongate: showRatio(x.vs_moongate), vs_nginx: showRatio(x.vs_nginx) });
    rs.push({ section: 'closed loop, 50 connections' });
    for (const mode of MODES) add('req/s @50 conns', mode, f.c50[mode].rps, (x) => fmt(x, 0));
    for (const mode of MODES) add('CPU us/req @50 conns', mode, f.c50[mode].cpu_us_per_req, (x) => fmt(x, 1));
    if (f.target_phase === 'c50m') {
        rs.push({ section: `closed loop, 50 connections, moongate variants only, ${pairRounds()}` });
        for (const mode of MODES) add('req/s @50 conns', mode, f.c50m[mode].rps, (x) => fmt(x, 0));
        for (const mode of MODES) add('CPU us/req @50 conns', mode, f.c50m[mode].cpu_us_per_req, (x) => fmt(x, 1));
    }
    rs.push({ section: `paced, ~${pacedRate()} req/s` });
    for (const mode of MODES) add(`CPU us/req @~${pacedRate()} req/s`, mode, f.paced[mode].cpu_us_per_req, (x) => fmt(x, 1));
    for (const q of ['p50', 'p99']) {
        for (const mode of MODES) {
            add(`${q} added over direct, ms`, mode, f.paced[mode][`${q}_added_ms`], fmtAdd);
        }
    }
    rs.push({ section: 'memory' });
    add('peak RSS after 50 conns, MiB', '', f.rss_mib.after_c50, (x) => fmt(x, 1));
    const cols = [['figure', 'figure'], ['mode', 'mode'], ['nginx', 'nginx'], ['moongate', e.base],
                  ['variant', e.col], ['vs_moongate', `${e.short}/${e.baseShort}`],
                  ['vs_nginx', `${e.invert ? e.baseShort : e.short}/nginx`]];
    const st = variantStatus(v);
    const notes = [];
    if (!st.ok) notes.push(`${v}: n/a (${st.reason || 'not run'})`);
    const over = f.target_phase === 'c50m' ? `at 50 conns, the ${pairRounds()}` : 'at 50 conns';
    if (e.cpuTarget) {
        const verdict = (r) => `${fmtRatio(r)}${r === null ? '' : r <= e.cpuTarget ? ' (met)' : ' (missed)'}`;
        notes.push(`target (${e.issue}; CPU/req on/off): ` + MODES.map((m) =>
            `${m} paced ${verdict(f.paced[m].cpu_us_per_req.vs_moongate)}, ${over} ` +
            verdict(f[f.target_phase][m].cpu_us_per_req.vs_moongate)).join('; '));
        notes.push('the last byte added by the durable events at the paced rate (on minus off): ' +
            MODES.map((m) => ['p50', 'p99'].map((q) => {
                const a = f.paced[m][`${q}_added_ms`];
                const d = a.moongate === null || a[v] === null ? null : a.moongate - a[v];
                return `${m} ${q} ${d === null ? NA : `${Math.round(d * 1000)} us`}`;
            }).join(', ')).join('; '));
        extraTables[v] = { title: e.title, cols, rows: rs, notes };
        continue;
    }
    if (v === 'moongate_session') {
        const load = records.find((r) => r.kind === 'session_load');
        notes.push(`${e.issue}; CPU/req session/plain: ` + MODES.map((m) =>
            `${m} paced ${fmtRatio(f.paced[m].cpu_us_per_req.vs_moongate)}, ${over} ` +
            fmtRatio(f[f.target_phase][m].cpu_us_per_req.vs_moongate)).join('; '));
        notes.push(load ? `the sessions: ${load.sessions} of ${load.turns} turns (${load.messages} messages, ` +
            `${load.session_tokens} tokens stored); a request on one counts ${load.input_tokens} input tokens ` +
            `(budget ${load.budget}, trimmed: ${JSON.stringify(load.trimmed)}), the plain request ` +
            `${load.plain_input_tokens}` : 'the sessions: not filled');
        f.sessions = load || null;
        extraTables[v] = { title: e.title, cols, rows: rs, notes };
        continue;
    }
    const met = MODES.map((m) => {
        const r = f[f.target_phase][m].rps.vs_moongate;
        const c = f[f.target_phase][m].cpu_us_per_req.vs_moongate;
        return `${m} ${fmtRatio(r)}${r === null ? '' : r >= e.target ? ' (met)' : ' (missed)'}` +
            `, CPU/req ${fmtRatio(c)}`;
    });
    notes.push(`target (${e.issue}, ${over}): ${met.join('; ')}`);
    if (v === 'moongate_auth') {
        const k = f.keys;
        const n = k.keys === null ? 'all' : k.keys.toLocaleString('en-US');
        notes.push(`loading the keys (moongate_auth started with 1 key, then with ${n}):`);
        notes.push(`  time from exec to listening: ${fmt(k.startup_ms.one_key, 0)} ms vs ` +
            `${fmt(k.startup_ms.all_keys, 0)} ms: ${fmt(k.load_ms, 0)} ms to load them, ` +
            `${fmt(k.load_us_per_key, 2)} us per key`);
        notes.push(`  VmRSS after start-up and the sanity requests: ${fmt(k.vmrss_mib.one_key, 1)} MiB vs ` +
            `${fmt(k.vmrss_mib.all_keys, 1)} MiB: ${fmt(k.rss_bytes_per_key, 0)} bytes per key ` +
            `(peak VmHWM: ${fmt(k.hwm_bytes_per_key, 0)} bytes per key)`);
        if (k.seed_s !== null) notes.push(`  (seeding the store with bench/seed_keys took ${k.seed_s.toFixed(2)} s)`);
    }
    extraTables[v] = { title: e.title, cols, rows: rs, notes };
}

const mgLine = status.moongate_ok ? `moongate: ${meta.moongate_bin} ${meta.moongate_version || ''}`
    : `moongate: n/a (${status.moongate_reason || 'not run'})`;
const header = [
    `moongate side-by-side bench, ${meta.date}, ${meta.quick ? 'QUICK, ' : ''}` +
        `${meta.reps} interleaved runs per variant, ${meta.duration_s}s closed-loop / ` +
        `${meta.paced_reps || meta.reps} rounds of ${meta.paced_duration_s}s paced (think ${meta.think_ms} ms), ` +
        `${meta.ttfb_n} first-byte samples per run, ${status.elapsed_s}s total`,
    `${meta.nginx}; ${meta.wrk}; ${meta.nproc} cores; kernel ${meta.kernel}`,
    mgLine,
];

// The core's targets (issue 2) in words, under the main table.
const coreNotes = [];
{
    const ct = figures.core_targets;
    const cpu = MODES.map((m) => [['c50', '50 conns'], ['paced', 'paced']].map(([ph, l]) => {
        const r = figures.cpu_us_per_req[ph][m].ratio;
        return `${m} ${l} ${fmtRatio(r)}${r === null ? '' : r <= 2 ? ' (met)' : ' (missed)'}`;
    }).join(', ')).join('; ');
    coreNotes.push(`target (issue 2: CPU per request at most 2x nginx's): ${cpu}`);
    for (const p of ['p50', 'p99']) {
        const parts = MODES.map((m) => {
            const t = ct[m][p];
            const ms = (x) => (x === null ? NA : `${Math.round(x * 1000)} us`);
            const verdict = t.met === null ? '' : t.met ? ' (met)' : ' (missed)';
            const others = [`median per-round gap ${ms(t.paired_gap_ms)}`,
                            t.pooled_gap_ms !== null ? `over all the rounds' requests ${ms(t.pooled_gap_ms)}` : null]
                .filter(Boolean).join(', ');
            return `${m} ${ms(t.gap_ms)}${verdict} median of the rounds (${others})`;
        });
        coreNotes.push(`target (issue 2: paced ${p} added within nginx's + 0.1 ms; moongate's minus ` +
            `nginx's): ${parts.join('; ')}`);
    }
    const range = (x) => (x ? `${x[0].toFixed(2)}-${x[1].toFixed(2)}` : NA);
    const pooledP99 = (m) => (ct[m].p99.pooled_ms.moongate === null ? '' : ' (over all rounds: ' +
        VARIANTS.map((v) => `${v} ${fmt(ct[m].p99.pooled_ms[v], 2)}`).join(', ') + ')');
    coreNotes.push('  paced p99 per round, ms (their own latency, not added): ' + MODES.map((m) =>
        `${m} nginx ${range(ct[m].p99.rounds_ms.nginx)}, moongate ${range(ct[m].p99.rounds_ms.moongate)}` +
        pooledP99(m)).join('; '));
    const fb = figures.sse_first_byte_ms.p50;
    const fbGap = fb.moongate === null || fb.nginx === null ? null : fb.moongate - fb.nginx;
    coreNotes.push(`target (issue 2: SSE first byte p50 within nginx's + 0.1 ms): ` +
        `${fbGap === null ? NA : `${Math.round(fbGap * 1000)} us${fbGap <= 0.1 ? ' (met)' : ' (missed)'}`}`);
    const rss = figures.rss_mib.after_c200.moongate;
    coreNotes.push(`target (issue 2: RSS under 32 MiB after 200 conns): ` +
        `${rss === null ? NA : `${rss.toFixed(1)} MiB${rss < 32 ? ' (met)' : ' (missed)'}`}`);
    const pct = (x) => (x === null ? NA : `${x.toFixed(1)}%`);
    coreNotes.push(`host steal (CPU time the hypervisor gave to other guests): paced phase ` +
        `${pct(ct.steal_pct.paced)}, all runs ${pct(ct.steal_pct.all)}`);
}

let text = header.join('\n') + '\n\n' + renderText(COLS, rows);
text += coreNotes.map((n) => `${n}\n`).join('');
for (const t of Object.values(extraTables)) {
    text += `\n== ${t.title} (paced and 50-connection phases)\n` + renderText(t.cols, t.rows);
    text += t.notes.map((n) => `${n}\n`).join('');
}
if (warnings.length) text += '\nwarnings:\n' + warnings.map((w) => `  ! ${w}`).join('\n') + '\n';
process.stdout.write('\n' + text);

let md = '# moongate bench results\n\n' + header.map((h) => `${h}  `).join('\n') + '\n\n';
md += renderMd(COLS, rows);
md += '\n' + coreNotes.map((n) => (n.startsWith('  ') ? `    - ${n.trim()}` : `- ${n}`)).join('\n') + '\n';
for (const t of Object.values(extraTables)) {
    md += `\n## ${t.title}\n\nPaced and 50-connection phases only.\n\n` + renderMd(t.cols, t.rows) + '\n';
    md += t.notes.map((n) => (n.startsWith('  ') ? `    - ${n.trim()}` : `- ${n}`)).join('\n') + '\n';
}
if (warnings.length) md += '\n## Warnings\n\n' + warnings.map((w) => `- ${w}`).join('\n') + '\n';
md += '\nSee bench/README.md for what each figure means.\n';

const results = { meta, moongate: { ok: !!status.moongate_ok, reason: status.moongate_reason || null },
                  variants: status.variants || null, elapsed_s: status.elapsed_s, figures, ttfb, runs,
                  warnings, table: rows,
                  tables: Object.fromEntries(Object.entries(extraTables).map(([v, t]) => [v, t])) };
fs.writeFileSync(path.join(outDir, 'results.json'), JSON.stringify(results, null, 2) + '\n');
fs.writeFileSync(path.join(outDir, 'results.md'), md);
process.stdout.write(`\nwrote ${path.join(outDir, 'results.json')} and results.md\n`);
