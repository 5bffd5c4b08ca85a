// The last byte's latency of metered answers: what holding an answer's end until its spend
// is committed costs (issue 16, item 6), before / after, in one run.
//
// For each binary given, starts the mock engine (tests/mock/engine.mjs) and the gateway with
// auth on, one key, a priced provider (every answer is charged, so every answer's end waits
// for its spend's commit) and storage in a temp dir; then, per phase, C keep-alive raw-socket
// clients send requests back to back (closed loop) and the time from writing a request to its
// last byte (the terminating chunk of a stream, the last body byte otherwise) is recorded.
// Binaries and repetitions are interleaved, so a busy machine hurts both alike. Prints one
// table (p50 / p99 in microseconds, requests per second, writes per commit) and a JSON line.
//
// usage: node bench/lastbyte.mjs [--reps 3] [--n 3000] LABEL=path[@free] [LABEL=path[@free] ...]
//   e.g. node bench/lastbyte.mjs before=/tmp/main/build/moongate after=build/moongate \
//            unmetered=build/moongate@free
// (@nousage: usage.enabled false, no usage events; modes combine: build/moongate@free@nousage)
// (@free: the provider has no price, so nothing is charged and no answer waits: the floor)
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const ADMIN = 'bench-lastbyte-admin-token';
const args = process.argv.slice(2);
const opt = (name, dflt) => {
    const i = args.indexOf(`--${name}`);
    if (i < 0) return dflt;
    const v = Number(args[i + 1]);
    args.splice(i, 2);
    return v;
};
const REPS = opt('reps', 3);
const N = opt('n', 3000);
const bins = args.map((a) => {
    const [label, spec] = a.split('=');
    // path@free: the provider has no price, nothing is charged; @nousage: usage.enabled false
    const [p, ...modes] = spec.split('@');
    return { label, bin: path.resolve(p), price: modes.includes('free') ? 0 : 2, usage: !modes.includes('nousage') };
});
if (!bins.length) {
    console.error('usage: node bench/lastbyte.mjs [--reps R] [--n N] label=path/to/moongate ...');
    process.exit(2);
}
const PHASES = [
    { name: 'json c=1', stream: false, conns: 1, n: Math.round(N / 3) },
    { name: 'json c=32', stream: false, conns: 32, n: N },
    { name: 'sse c=1', stream: true, conns: 1, n: Math.round(N / 3) },
    { name: 'sse c=32', stream: true, conns: 32, n: N },
];

function waitLine(stream, pred, ms, what) {
    return new Promise((resolve, reject) => {
        let buf = '';
        const t = setTimeout(() => reject(new Error(`timeout waiting for ${what}`)), ms);
        const on = (d) => {
            buf += d;
            let i;
            while ((i = buf.indexOf('\n')) >= 0) {
                const line = buf.slice(0, i);
                buf = buf.slice(i + 1);
                try {
                    const j = JSON.parse(line);
                    if (pred(j)) {
                        clearTimeout(t);
                        stream.off('data', on);
                        resolve(j);
                        return;
                    }
                } catch {
                    /* not JSON */
                }
            }
        };
        stream.setEncoding('utf8');
        stream.on('data', on);
    });
}

async function start(bin, dir, mockPort, price, usage = true) {
    const cfg = path.join(dir, 'moongate.yaml');
    fs.writeFileSync(cfg, [
        'server: { listen: "127.0.0.1:0", metrics_listen: "127.0.0.1:0" }',
        `storage: { path: ${JSON.stringify(path.join(dir, 'moongate.db'))} }`,
        'auth: { enabled: true }',
        'log: { level: warn }',
        'health: { probes: false }',
        ...(usage ? [] : ['usage: { enabled: false }']),
        `lua: { policies: ${ROOT}/policies, adapters: ${ROOT}/adapters, lib: ${ROOT}/lua }`,
        'providers:',
        `  - { id: mock, adapter: openai, base_url: "http://127.0.0.1:${mockPort}/v1", cost_per_1k_tokens: ${price} }`,
        'models:',
        '  chat: { routes: [ { provider: mock, model: up-chat } ] }',
        '',
    ].join('\n'));
    const child = spawn(bin, ['-c', cfg], {
        cwd: ROOT, env: { ...process.env, MOONGATE_ADMIN_TOKEN: ADMIN }, stdio: ['ignore', 'pipe', 'inherit'],
    });
    const l = await waitLine(child.stdout, (j) => j.msg === 'listening', 15000, 'listening');
    child.stdout.resume();
    const port = Number(/:(\d+)$/.exec(l.listen)[1]);
    const metricsPort = Number(/:(\d+)$/.exec(l.metrics_listen)[1]);
    const admin = async (p, body) => {
        const r = await fetch(`http://127.0.0.1:${port}/api/v2/${p}`, {
            method: 'POST', headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
            body: JSON.stringify(body),
        });
        return r.json();
    };
    const t = await admin('tenants', { name: 'bench' });
    const k = await admin('keys', { tenant_id: t.id, name: 'bench' });
    return { child, port, metricsPort, key: k.key };
}

function requestBytes(port, key, stream) {
    const body = JSON.stringify({
        model: 'chat', stream,
        messages: [{ role: 'user', content: 'why should a proxy keep upstream connections alive' }],
    });
    return Buffer.from('POST /v1/chat/completions HTTP/1.1\r\n' + `Host: 127.0.0.1:${port}\r\n` +
        `Authorization: Bearer ${key}\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n` + body);
}

// Returns true once buf holds one whole response (Content-Length or chunked).
function complete(buf) {
    const he = buf.indexOf('\r\n\r\n');
    if (he < 0) return false;
    const head = buf.toString('latin1', 0, he).toLowerCase();
    const m = /content-length: (\d+)/.exec(head);
    if (m) return buf.length >= he + 4 + Number(m[1]);
    return buf.length >= 5 && buf.toString('latin1', buf.length - 5) === '0\r\n\r\n';
}

async function client(port, req, count, out) {
    const sock = await new Promise((resolve, reject) => {
        const s = net.connect({ host: '127.0.0.1', port }, () => resolve(s));
        s.setNoDelay(true);
        s.once('error', reject);
    });
    for (let i = 0; i < count; i++) {
        const t0 = process.hrtime.bigint();
        await new Promise((resolve, reject) => {
            let buf = Buffer.alloc(0);
            const on = (d) => {
                buf = Buffer.concat([buf, d]);
                if (!complete(buf)) return;
                sock.off('data', on);
                if (!buf.toString('latin1', 0, 12).endsWith('200')) reject(new Error(buf.toString().slice(0, 300)));
                else resolve();
            };
            sock.on('data', on);
            sock.write(req);
        });
        out.push(Number(process.hrtime.bigint() - t0) / 1000);
    }
    sock.destroy();
}

async function storeCounters(metricsPort) {
    const t = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    const get = (n) => Number((new RegExp(`^${n} (\\d+)$`, 'm').exec(t) ?? [0, NaN])[1]);
    return { writes: get('moongate_store_writes_total'), commits: get('moongate_store_commits_total') };
}

async function phase(gw, p) {
    const req = requestBytes(gw.port, gw.key, p.stream);
    await Promise.all(Array.from({ length: p.conns }, () => client(gw.port, req, 20, []))); // warm-up
    const before = await storeCounters(gw.metricsPort);
    const lat = [];
    const t0 = process.hrtime.bigint();
    const per = Math.ceil(p.n / p.conns);
    await Promise.all(Array.from({ length: p.conns }, () => client(gw.port, req, per, lat)));
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    const after = await storeCounters(gw.metricsPort);
    lat.sort((a, b) => a - b);
    const q = (x) => lat[Math.min(lat.length - 1, Math.floor(x * lat.length))];
    return {
        p50_us: Math.round(q(0.5)), p99_us: Math.round(q(0.99)), rps: Math.round(lat.length / secs),
        writes_per_commit: after.commits > before.commits
            ? Math.round(((after.writes - before.writes) / (after.commits - before.commits)) * 10) / 10 : null,
    };
}

async function main() {
    const mock = spawn(process.execPath, [path.join(ROOT, 'tests/mock/engine.mjs'), '--port', '0', '--exit-with-stdin'],
        { stdio: ['pipe', 'pipe', 'inherit'] });
    const mockPort = (await waitLine(mock.stdout, (j) => j.mock === 'listening', 10000, 'mock')).port;
    mock.stdout.resume();
    const results = {}; // label -> phase -> [runs]
    for (let rep = 0; rep < REPS; rep++) {
        for (const b of bins) {
            const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mg-lastbyte-'));
            const gw = await start(b.bin, dir, mockPort, b.price, b.usage);
            try {
                for (const p of PHASES) {
                    const r = await phase(gw, p);
                    ((results[b.label] ??= {})[p.name] ??= []).push(r);
                    console.error(`rep ${rep} ${b.label.padEnd(8)} ${p.name.padEnd(10)} p50 ${r.p50_us} us  p99 ${r.p99_us} us  ${r.rps} req/s  writes/commit ${r.writes_per_commit ?? 'n/a'}`);
                }
            } finally {
                gw.child.kill('SIGTERM');
                await new Promise((r) => gw.child.once('exit', r));
                fs.rmSync(dir, { recursive: true, force: true });
            }
        }
    }
    mock.kill('SIGTERM');
    // medians over the repetitions
    const med = (xs) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    console.log('| phase | ' + bins.map((b) => `${b.label} p50 / p99 us, req/s, writes/commit`).join(' | ') + ' |');
    console.log('|---|' + bins.map(() => '---|').join(''));
    const summary = {};
    for (const p of PHASES) {
        const cells = bins.map((b) => {
            const runs = results[b.label][p.name];
            const s = {
                p50_us: med(runs.map((r) => r.p50_us)), p99_us: med(runs.map((r) => r.p99_us)),
                rps: med(runs.map((r) => r.rps)), writes_per_commit: med(runs.map((r) => r.writes_per_commit ?? 0)),
            };
            (summary[b.label] ??= {})[p.name] = s;
            return `${s.p50_us} / ${s.p99_us}, ${s.rps}, ${s.writes_per_commit || 'n/a'}`;
        });
        console.log(`| ${p.name} | ${cells.join(' | ')} |`);
    }
    console.log(JSON.stringify({ reps: REPS, n: N, summary }));
}

main().catch((e) => {
    console.error(e);
    process.exit(1);
});
