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
    };
    if (!ok) warnings.push(`${r.phase} ${r.mode} ${r.variant} rep${r.rep}: no result from wrk`);
    else if (errors > 0) {
        warnings.push(`${r.phase} ${r.mode} ${r.variant} rep${r.rep}: ${errors} errors ` +
            `(connect ${w.err_connect}, read ${w.err_read}, write ${w.err_write}, ` +
            `non-2xx ${w.err_status}, timeout ${w.err_timeout}) of ${w.requests} requests`);
    }
    return run;
});

// Mean over the repetitions of one figure, null when the variant has no valid run.
function agg(phase, mode, variant, field) {
    const xs = runs.filter((r) => r.phase === phase && r.mode === mode && r.variant === variant)
        .map((r) => r[field]).filter((x) => x !== null && x !== undefined);
    return mean(xs);
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

function pacedRate() {
    const xs = runs.filter((r) => r.phase === 'paced' && r.variant === 'direct' && r.rps)
        .map((r) => r.rps);
    return xs.length ? Math.round(mean(xs) / 50) * 50 : 1000;
}

const HEAD = { figure: 'figure', mode: 'mode', direct: 'direct', nginx: 'nginx',
               moongate: 'moongate', ratio: 'moongate/nginx' };
const COLS = ['figure', 'mode', 'direct', 'nginx', 'moongate', 'ratio'];
const width = Object.fromEntries(COLS.map((c) => [c, Math.max(HEAD[c].length,
    ...rows.filter((r) => !r.section).map((r) => r[c].length))]));
const line = (r) => COLS.map((c, i) => (i < 2 ? r[c].padEnd(width[c]) : r[c].padStart(width[c])))
    .join('  ');

const mgLine = status.moongate_ok ? `moongate: ${meta.moongate_bin} ${meta.moongate_version || ''}`
    : `moongate: n/a (${status.moongate_reason || 'not run'})`;
const header = [
    `moongate side-by-side bench, ${meta.date}, ${meta.quick ? 'QUICK, ' : ''}` +
        `${meta.reps} interleaved runs per variant, ${meta.duration_s}s closed-loop / ` +
        `${meta.paced_duration_s}s paced (think ${meta.think_ms} ms), ` +
        `${meta.ttfb_n} first-byte samples per run, ${status.elapsed_s}s total`,
    `${meta.nginx}; ${meta.wrk}; ${meta.nproc} cores; kernel ${meta.kernel}`,
    mgLine,
];

let text = header.join('\n') + '\n\n' + line(HEAD) + '\n';
for (const r of rows) text += r.section ? `-- ${r.section}\n` : line(r) + '\n';
if (warnings.length) text += '\nwarnings:\n' + warnings.map((w) => `  ! ${w}`).join('\n') + '\n';
process.stdout.write('\n' + text);

let md = '# moongate bench results\n\n' + header.map((h) => `${h}  `).join('\n') + '\n\n';
md += '| figure | mode | direct | nginx | moongate | moongate/nginx |\n';
md += '|---|---|---:|---:|---:|---:|\n';
for (const r of rows) {
    md += r.section ? `| **${r.section}** | | | | | |\n`
        : `| ${r.figure.trim()} | ${r.mode} | ${r.direct} | ${r.nginx} | ${r.moongate} | ${r.ratio} |\n`;
}
if (warnings.length) md += '\n## Warnings\n\n' + warnings.map((w) => `- ${w}`).join('\n') + '\n';
md += '\nSee bench/README.md for what each figure means.\n';

const results = { meta, moongate: { ok: !!status.moongate_ok, reason: status.moongate_reason || null },
                  elapsed_s: status.elapsed_s, figures, ttfb, runs, warnings, table: rows };
fs.writeFileSync(path.join(outDir, 'results.json'), JSON.stringify(results, null, 2) + '\n');
fs.writeFileSync(path.join(outDir, 'results.md'), md);
process.stdout.write(`\nwrote ${path.join(outDir, 'results.json')} and results.md\n`);
