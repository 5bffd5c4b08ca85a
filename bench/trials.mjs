#!/usr/bin/env node
// Fault trials with figures (issue 23): `make trials` runs them and prints a table. Every
// trial is bounded in count and time; TRIALS_SHORT=1 runs the short form (fewer rounds).
//   sighup      reloads 100 ms apart, alternating a valid and a broken config, under steady
//               stream and non-stream load: failed requests (goal 0)
//   kill9       kill -9 under load, restart: PRAGMA integrity_check passes every time
//   upstream    per fault (500 with HTML, reset mid-stream, garbage, no [DONE], connection
//               refused): streamed requests that end with a clear error; none looks like
//               success, none hangs
//   hang        an upstream that sends its headers (or its first frame) and then nothing:
//               stream and non-stream, every request ends with a clear error within the
//               configured timeout (an error event and [DONE] for a started stream)
//   state       kill -9 under load, restart: a cooldown, an open route breaker, the
//               idempotency records and the usage events of completed requests are there
//   slow        1,000 clients sending headers or bodies a byte at a time and 200 reading a
//               stream a byte a second beside normal traffic, the gateway started with a
//               soft fd limit of 1,024: normal p99 vs unloaded, slow ones closed by their
//               timeouts, no provider down, RSS back near idle
//   memory      RSS after N requests (TRIALS_REQUESTS, default 1M, short 50k) vs after 10k;
//               TRIALS_STREAMS (default 10,000, at most what the hard fd limit holds at two
//               a stream) idle SSE streams open at once: RSS per stream
// `node bench/trials.mjs NAME` runs one trial. TRIALS_DEBUG_TRIM=1 calls malloc_trim(0) in the
// slow-clients gateway through gdb and prints its RSS (freed heap or live memory?);
// TRIALS_DEBUG_HEAP=1 prints where its RSS is (smaps, malloc_info per arena) at idle and
// after, TRIALS_DEBUG_HEAPTRACK=1 records it with heaptrack from idle to after. Needs
// build/moongate (MOONGATE_BIN), the test tooling (tests/node_modules, sqlite3), wrk and
// prlimit. The full form takes about 12 minutes, the short one 4. `--test` (ctest's
// trials/short, in make test: about 20 s) runs sighup (20 reloads), kill9 (20 kills), state
// (5 kills), upstream and hang (10 requests each) and asserts only correctness (no request
// failed, lost or hung; no timing, no RSS), so it holds on busy cores.
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
    adminCall, postJson, postStream, rawRequest, REPO_ROOT, sleep, sqliteRows, startEnv, startGateway, startMock, waitFor,
} from '../tests/e2e/lib/harness.mjs';

const TEST = process.argv.includes('--test'); // make test's subset: small counts, no timings
const SHORT = !!process.env.TRIALS_SHORT;
/* a trial's count in the full form, the short form and make test's */
const count = (full, short, test) => (TEST ? test : SHORT ? short : full);
const rows = [];
const row = (trial, runs, figure, goal, ok) => rows.push({ trial, runs, figure, goal, ok: ok ? 'yes' : 'NO' });
const chatBody = (stream) => ({ model: 'chat', stream, messages: [{ role: 'user', content: 'hello there' }] });

const failures = new Map(); // how failed requests of load() failed, for the figures
const failed = (why) => (failures.set(why, (failures.get(why) ?? 0) + 1), false);

async function one(env, stream) {
    try {
        if (!stream) {
            const r = await postJson(`${env.api}/chat/completions`, chatBody(false));
            return r.status === 200 || failed(`${r.status} ${r.json?.error?.code ?? r.text.slice(0, 60)}`);
        }
        const r = await postStream(`${env.api}/chat/completions`, chatBody(true));
        return (r.status === 200 && r.text.includes('[DONE]') && !r.text.includes('"error"')) ||
            failed(`stream ${r.status} ${r.error?.message ?? r.text.slice(-120)}`);
    } catch (e) {
        return failed(`${stream ? 'stream ' : ''}${e.name}: ${e.cause?.code ?? e.message}`);
    }
}

/* steady load until stop(): 4 workers, two streaming */
function load(env) {
    let stop = false, ok = 0, failed = 0;
    const worker = async (stream) => {
        while (!stop) (await one(env, stream)) ? ok++ : failed++;
    };
    const ws = [worker(false), worker(false), worker(true), worker(true)];
    return { stop: async () => { stop = true; await Promise.all(ws); return { ok, failed }; } };
}

async function sighup() {
    const env = await startEnv({});
    const good = fs.readFileSync(env.configPath, 'utf8');
    const n = count(100, 20, 20);
    const l = load(env);
    for (let i = 0; i < n; i++) {
        fs.writeFileSync(env.configPath, i % 2 ? 'server: [unclosed\n' : good);
        env.gw.child.kill('SIGHUP');
        await sleep(100);
    }
    fs.writeFileSync(env.configPath, good);
    const { ok, failed } = await l.stop();
    await env.close();
    const why = [...failures].map(([k, v]) => `${v} ${k}`).join('; ');
    failures.clear();
    row('SIGHUP storm', `${n} reloads, ${ok + failed} requests`, `${failed} failed${why ? ` (${why})` : ''}`, '0 failed', failed === 0);
}

async function kill9() {
    const env = await startEnv({});
    const n = count(100, 5, 20);
    let intact = 0;
    for (let i = 0; i < n; i++) {
        const l = load(env);
        await sleep(150);
        env.gw.child.kill('SIGKILL');
        await l.stop();
        await new Promise((r) => (env.gw.exited ? r() : env.gw.child.once('exit', r)));
        const check = sqliteRows(env.config.storage.path, 'PRAGMA integrity_check');
        if (check.length === 1 && check[0].integrity_check === 'ok') intact++;
        env.gw = await startGateway(env.configPath);
        env.api = `${env.gw.base}/v1`;
    }
    await env.close();
    row('kill -9 under load', `${n} kills`, `${intact}/${n} integrity_check ok`, `${n}/${n}`, intact === n);
}

async function upstream() {
    const env = await startEnv({ extraModels: { 'dead-only': { routes: [{ provider: 'dead', model: 'up-dead' }] } } });
    const n = count(100, 20, 10);
    const faults = [
        ['500 with HTML', { status: 500, body: '<html><body>Internal Server Error</body></html>' }],
        ['reset mid-stream', { reset_after_chunks: 2 }],
        ['garbage', { garbage: true }],
        ['no [DONE]', { truncate_after_chunks: 2 }],
    ];
    for (const [name, action] of faults) {
        await env.mock.script({ model: 'up-chat', action });
        let clear = 0, success = 0, hung = 0;
        for (let i = 0; i < n; i++) {
            try {
                const r = await postStream(`${env.api}/chat/completions`, chatBody(true), { timeoutMs: 10000 });
                const looksOk = r.status === 200 && r.text.includes('[DONE]') && !r.text.includes('"error"');
                looksOk ? success++ : clear++;
            } catch {
                hung++;
            }
        }
        await env.mock.reset?.();
        row(`upstream: ${name}`, `${n} streams`, `${clear} clear errors, ${success} look ok, ${hung} hung`, `${n} clear`, clear === n);
    }
    let clear = 0;
    for (let i = 0; i < n; i++) {
        const r = await postStream(`${env.api}/chat/completions`, { ...chatBody(true), model: 'dead-only' }).catch(() => null);
        if (r && r.status >= 500) clear++;
    }
    await env.close();
    row('upstream: refused', `${n} streams`, `${clear} clear errors`, `${n} clear`, clear === n);
}


/* An upstream that goes silent after its headers. The timeouts are short so that the trial
 * is quick; every request must end by its bound (the timeout plus 1 s of slack). */
async function hang() {
    const timeouts = { first_byte_ms: 1500, idle_ms: 1500, total_ms: 3000 };
    const env = await startEnv({
        timeouts,
        configure: (c) => ({
            ...c, health: { probes: false }, log: { level: 'warn' },
            circuit_breaker: { consecutive_failures: 1000, min_requests: 1000000 },
        }),
    });
    const n = count(100, 20, 10);
    const cases = [
        // the status line and headers, then nothing: first_byte_ms
        ['hang after headers (stream)', true, { delay_first_chunk_ms: 600000 }, timeouts.first_byte_ms],
        // the headers and the first frame (the client has its 200), then nothing: idle_ms
        ['hang after first frame (stream)', true, { chunk_delay_ms: 600000 }, timeouts.first_byte_ms + timeouts.idle_ms],
        // a whole answer's headers and its first bytes, then nothing: total_ms
        ['hang after headers (non-stream)', false, { body: ['{"id":"chatcmpl-hang",', '"object":"chat.completion"}'], chunk_delay_ms: 600000 }, timeouts.total_ms],
    ];
    for (const [name, stream, action, bound] of cases) {
        await env.mock.reset();
        await env.mock.script({ model: 'up-chat', action });
        let clear = 0, success = 0, hung = 0, late = 0, worst = 0;
        const kinds = new Set(); // how the errors looked: "504 CODE" or "200 + error event CODE"
        const oneHang = async () => {
            const t0 = Date.now();
            try {
                if (stream) {
                    const r = await postStream(`${env.api}/chat/completions`, chatBody(true), { timeoutMs: bound + 10000 });
                    const errorEvent = r.events.some((e) => e && typeof e === 'object' && e.error);
                    const ok = r.status === 200 && !errorEvent && r.text.includes('[DONE]');
                    const clearErr = r.status >= 400 ? !!JSON.parse(r.text)?.error?.code
                        : errorEvent && r.data.at(-1) === '[DONE]';
                    if (ok) success++;
                    else if (clearErr && !r.error) clear++;
                    if (r.status >= 400) kinds.add(`${r.status} ${JSON.parse(r.text)?.error?.code}`);
                    else if (errorEvent) kinds.add(`200 + error event ${r.events.find((e) => e?.error)?.error?.code}`);
                    else hung++;
                } else {
                    const r = await postJson(`${env.api}/chat/completions`, chatBody(false), { timeoutMs: bound + 10000 });
                    if (r.status === 200) success++;
                    else if (r.status >= 400 && r.json?.error?.code) clear++;
                    else hung++;
                    kinds.add(`${r.status} ${r.json?.error?.code}`);
                }
            } catch {
                hung++;
            }
            const ms = Date.now() - t0;
            worst = Math.max(worst, ms);
            if (ms > bound + 1000) late++;
        };
        for (let i = 0; i < n; i += 25) await Promise.all(Array.from({ length: Math.min(25, n - i) }, oneHang));
        row(`upstream: ${name}`, `${n} requests`, `${clear} clear errors (${[...kinds].join(', ')}), ${success} look ok, ${hung} hung/unclear, slowest ${worst} ms (bound ${bound} + 1 s)`,
            TEST ? `${n} clear` : `${n} clear, 0 late`, clear === n && (TEST || late === 0)); // make test asserts no timing
    }
    await env.close();
}

/* What a restart after kill -9 must find again: the cooldown of a provider that answered 429
 * (Retry-After 600), the open breaker of a route that failed 3 times, the stored answer of
 * every completed idempotent request (it replays) and the usage event of every completed
 * request. Each round sets the state up again where it is missing, runs load (a quarter of it
 * idempotent), kills the gateway mid-load and checks after the restart. */
async function state() {
    const TOKEN = 'adm-trials-state-token-5b2e9d';
    const env = await startEnv({
        env: { MOONGATE_ADMIN_TOKEN: TOKEN },
        extraProviders: [
            { id: 'cool-p', adapter: 'openai', base_url: 'MOCK/v1' },
            { id: 'brk-p', adapter: 'openai', base_url: 'MOCK/v1' },
        ],
        extraModels: {
            cool: { routes: [{ provider: 'cool-p', model: 'up-cool' }, { provider: 'mock-openai', model: 'up-chat', priority: 1 }] },
            brk: { routes: [{ provider: 'brk-p', model: 'up-brk' }] },
        },
        configure: (c, e) => ({
            ...c, health: { probes: false }, log: { level: 'warn' },
            circuit_breaker: { consecutive_failures: 3, open_duration_seconds: 600 },
            idempotency: { ttl_seconds: 3600 },
            providers: c.providers.map((p) => ({ ...p, base_url: p.base_url.replace('MOCK', e.mock.base) })),
        }),
    });
    const admin = (p) => adminCall(env.base, TOKEN, 'GET', p);
    const rounds = count(20, 3, 5);
    const lost = { cooldown: 0, breaker: 0, idem: 0, usage: 0 };
    let idemChecked = 0, usageChecked = 0;
    const tag = `${process.pid}-${Date.now()}`;
    for (let round = 0; round < rounds; round++) {
        // set up what is missing: the 429 and the three 500s reach the upstream only then
        if (!(await admin('cooldowns')).json.cooldowns.some((c) => c.provider_id === 'cool-p')) {
            await env.mock.script({ model: 'up-cool', times: 1, action: { status: 429, headers: { 'Retry-After': '600' } } });
            await postJson(`${env.api}/chat/completions`, { ...chatBody(false), model: 'cool' });
        }
        const brk = () => admin('providers/brk-p').then((r) => r.json.routes.find((x) => x.model === 'up-brk')?.breaker);
        if ((await brk()) !== 'open') {
            await env.mock.script({ model: 'up-brk', times: 3, action: { status: 500 } });
            for (let i = 0; i < 3; i++) await postJson(`${env.api}/chat/completions`, { ...chatBody(false), model: 'brk' });
        }
        const before = { cooldown: true, breaker: (await brk()) === 'open' };
        // load: 4 clients, every fourth request idempotent; a request counts once its answer is whole
        let stop = false, seq = 0;
        const done = [];
        const client = async (c) => {
            while (!stop) {
                const n = seq++;
                const stream = n % 2 === 1;
                const key = n % 4 < 2 ? `trial-${tag}-${round}-${n}` : undefined;
                const body = { ...chatBody(stream), messages: [{ role: 'user', content: `round ${round} request ${n} client ${c}` }], idempotency_key: key };
                try {
                    const r = await fetch(`${env.api}/chat/completions`, {
                        method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
                        signal: AbortSignal.timeout(10000),
                    });
                    const text = await r.text();
                    if (r.status === 200 && (!stream || text.endsWith('data: [DONE]\n\n')))
                        done.push({ id: r.headers.get('x-request-id'), key, body, text });
                } catch {
                    return; // killed mid-request: not completed
                }
            }
        };
        const clients = [0, 1, 2, 3].map(client);
        await sleep(300 + Math.random() * 300);
        env.gw.child.kill('SIGKILL');
        await env.gw.waitExit(5000);
        stop = true;
        await Promise.all(clients);
        env.gw = await startGateway(env.configPath, { env: { MOONGATE_ADMIN_TOKEN: TOKEN } });
        env.base = env.gw.base;
        env.api = `${env.base}/v1`;
        // after the restart
        const cds = (await admin('cooldowns')).json.cooldowns;
        if (before.cooldown && !cds.some((c) => c.provider_id === 'cool-p' && c.remaining_seconds > 0)) lost.cooldown++;
        if (before.breaker && (await brk()) !== 'open') lost.breaker++;
        const ids = done.map((d) => d.id);
        const found = new Set();
        for (let i = 0; i < ids.length; i += 200) {
            const list = ids.slice(i, i + 200).map((id) => `'${id.replace(/'/g, '')}'`).join(',');
            for (const r of sqliteRows(env.config.storage.path, `SELECT request_id FROM usage_events WHERE request_id IN (${list})`)) found.add(r.request_id);
        }
        lost.usage += ids.filter((id) => !found.has(id)).length;
        usageChecked += ids.length;
        for (const d of done.filter((x) => x.key)) {
            const r = await fetch(`${env.api}/chat/completions`, {
                method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(d.body),
                signal: AbortSignal.timeout(10000),
            });
            const text = await r.text();
            if (r.headers.get('idempotent-replayed') !== 'true' || text !== d.text) lost.idem++;
            idemChecked++;
        }
    }
    await env.close();
    row('kill -9: cooldown survives', `${rounds} kills`, `lost ${lost.cooldown}/${rounds}`, '0 lost', lost.cooldown === 0);
    row('kill -9: open breaker survives', `${rounds} kills`, `lost ${lost.breaker}/${rounds}`, '0 lost', lost.breaker === 0);
    row('kill -9: idempotency records', `${idemChecked} completed keys`, `${lost.idem} did not replay`, '0', lost.idem === 0);
    row('kill -9: usage events', `${usageChecked} completed requests`, `${lost.usage} without an event`, '0', lost.usage === 0);
}

const SLOW_SENDERS = 1000, SLOW_READERS = 200;

/* The slow clients, in a process of their own (so that their timers do not slow the parent's
 * measurement): SLOW_SENDERS connections that send a request a byte every 500 ms, half of them
 * in the headers and half in the body, and SLOW_READERS that ask for a long stream and take a
 * byte a second of it. A closed one is replaced for `seconds`; then none is, and once all are
 * gone (or 60 s passed) one JSON line says how they ended. */
async function slowChild(port, seconds, lifeMs) {
    const stats = { senders: 0, readers: 0, sender_408: 0, sender_closed_other: 0, reader_closed: 0, reader_completed: 0, open_at_end: 0, connect_errors: 0 };
    let replacing = true, open = 0;
    const body = JSON.stringify({ model: 'chat', messages: [{ role: 'user', content: 'a slow client sends this very slowly' }] });
    const request = (i) => i % 2 === 0
        ? `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`
        : body; // the headers go at once, the body a byte at a time
    const sender = (i) => {
        const s = net.connect(port, '127.0.0.1');
        stats.senders++; open++;
        let got = '', pos = 0, timer = null;
        const text = request(i);
        s.on('connect', () => {
            if (i % 2 === 1) s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`);
            timer = setInterval(() => pos < text.length && s.write(text[pos++]), 500);
        });
        s.on('data', (d) => (got += d.toString('latin1')));
        s.on('error', () => {});
        s.on('close', (hadError) => {
            clearInterval(timer); open--;
            if (/^HTTP\/1\.1 408 /.test(got)) stats.sender_408++;
            else stats.sender_closed_other++;
            if (hadError && !got) stats.connect_errors++;
            if (replacing) sender(i);
        });
    };
    // A paused socket does not see the gateway's reset until it reads again: a reader lives
    // lifeMs (past the write timeout), then reads what is left; a reset or an end before
    // [DONE] is the gateway closing it, [DONE] is an answer that the gateway could hand to the
    // kernel whole (loopback's socket buffers grow to several MiB) before the write timeout.
    const reader = () => {
        const s = net.connect(port, '127.0.0.1');
        stats.readers++; open++;
        let timer = null, tail = '';
        s.on('connect', () => {
            s.pause();
            s.write(rawRequest('POST', '/v1/chat/completions', { body: { model: 'big', stream: true, messages: [{ role: 'user', content: 'read me slowly' }] } }));
            timer = setInterval(() => s.read(1), 1000);
            setTimeout(() => {
                clearInterval(timer);
                s.on('data', (d) => {
                    tail = (tail + d.toString('latin1')).slice(-64);
                    if (tail.endsWith('data: [DONE]\n\n\r\n0\r\n\r\n')) s.destroy(); // whole: leave
                });
                s.resume();
            }, lifeMs);
        });
        s.on('error', () => {});
        s.on('close', () => {
            clearInterval(timer); open--;
            if (tail.includes('data: [DONE]')) stats.reader_completed++;
            else stats.reader_closed++;
            if (replacing) reader();
        });
    };
    const kind = process.env.TRIALS_SLOW_KIND; // debugging: only 'senders' or only 'readers'
    for (let i = 0; i < (kind === 'readers' ? 0 : SLOW_SENDERS); i++) {
        sender(i);
        if (i % 100 === 99) await sleep(20);
    }
    for (let i = 0; i < (kind === 'senders' ? 0 : SLOW_READERS); i++) reader();
    console.log(JSON.stringify({ started: true }));
    await sleep(seconds * 1000);
    replacing = false;
    const deadline = Date.now() + 60000;
    while (open > 0 && Date.now() < deadline) await sleep(100);
    stats.open_at_end = open;
    console.log(JSON.stringify(stats));
    process.exit(0);
}

// the hard descriptor limit this process may give its children (raising it needs CAP_SYS_RESOURCE)
const HARD_NOFILE = Number(execFileSync('sh', ['-c', 'ulimit -Hn'], { encoding: 'utf8' }).trim()) || 4096;
const rssOf = (pid) => Number(/VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;
const mib = (n) => (n / 1048576).toFixed(1);
// CPU seconds (user + system) a process has used: /proc/PID/stat's utime and stime, in ticks
const TICK = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
const cpuOf = (pid) => {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / TICK; // fields 14 and 15, counted after the name
};
// the whole machine's busy CPU seconds (every core; /proc/stat's first line less idle and iowait)
const machineBusy = () => {
    const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
    return (f.reduce((a, b) => a + b, 0) - f[3] - f[4]) / TICK;
};

// moongate_loop_busy_seconds' cumulative buckets {le: count}, with its count and sum
const loopBusy = (text) => {
    const h = { buckets: new Map(), count: 0, sum: 0 };
    for (const l of text.split('\n')) {
        let m = /^moongate_loop_busy_seconds_bucket\{le="([^"]+)"\} (\S+)/.exec(l);
        if (m) h.buckets.set(m[1], Number(m[2]));
        m = /^moongate_loop_busy_seconds_(count|sum) (\S+)/.exec(l);
        if (m) h[m[1]] = Number(m[2]);
    }
    return h;
};
// turns per bucket between two snapshots: how many loop turns took more than 1, 5 and 10 ms
const loopSummary = (a, b) => {
    const n = b.count - a.count;
    if (!n) return 'no loop_busy metric';
    const over = (le) => (b.buckets.has(le) ? `${n - (b.buckets.get(le) - (a.buckets.get(le) ?? 0))} > ${Number(le) * 1000} ms` : null);
    const parts = ['0.001', '0.005', '0.01', '0.025'].map(over).filter(Boolean);
    return `${n} turns, mean ${((b.sum - a.sum) / n * 1e6).toFixed(0)} us, ${parts.join(', ')}`;
};

/* TRIALS_DEBUG_HEAP=1: where a process's RSS is (smaps: the heap, anonymous maps, the rest)
 * and what glibc's allocator holds in use and free per arena (malloc_info through gdb). */
function heapReport(pid, label) {
    const by = new Map();
    let name = '';
    for (const l of fs.readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
        const m = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \d+\s*(.*)$/.exec(l);
        if (m) name = m[1] ? (m[1].startsWith('/') ? 'file' : m[1]) : 'anon';
        const r = /^Rss:\s+(\d+) kB/.exec(l);
        if (r) by.set(name, (by.get(name) ?? 0) + Number(r[1]));
    }
    const xml = `/tmp/moongate-malloc-info-${pid}.xml`;
    execFileSync('gdb', ['-p', String(pid), '-batch', '-ex', `set $f = (void*)fopen("${xml}", "w")`,
        '-ex', 'call (int)malloc_info(0, $f)', '-ex', 'call (int)fclose($f)'], { stdio: 'ignore' });
    const mi = fs.readFileSync(xml, 'utf8');
    fs.rmSync(xml);
    const arenas = [...mi.matchAll(/<heap nr="(\d+)">[\s\S]*?<\/heap>/g)].map((h) => {
        const get = (re) => Number(re.exec(h[0])?.[1] ?? 0);
        return `arena ${h[1]}: mem ${mib(get(/<system type="current" size="(\d+)"/))} MiB, free ${mib(get(/<total type="fast" count="\d+" size="(\d+)"/) + get(/<total type="rest" count="\d+" size="(\d+)"/))} MiB`;
    });
    console.log(`${label}: RSS by map (KiB) ${JSON.stringify(Object.fromEntries(by))}; ${arenas.join('; ')}`);
}

/* One keep-alive connection's non-stream request: the answer's status, or a reason it failed
 * (the measuring clients are raw sockets: fetch's own CPU per request would compete with the
 * gateway on the two cores and land in the latencies). */
function keepAliveClient(port) {
    const s = net.connect(port, '127.0.0.1');
    s.setNoDelay(true);
    let buf = Buffer.alloc(0), want = null, done = null;
    const fail = (why) => { if (done) { const d = done; done = null; d(why); } };
    s.on('error', (e) => fail(e.code ?? 'error'));
    s.on('close', () => fail('closed'));
    s.on('data', (d) => {
        buf = buf.length ? Buffer.concat([buf, d]) : d;
        if (!want) {
            const end = buf.indexOf('\r\n\r\n');
            if (end < 0) return;
            const head = buf.subarray(0, end).toString('latin1');
            const len = /\r\ncontent-length: *(\d+)/i.exec(head);
            if (!len) return fail('no content-length');
            want = { status: Number(head.slice(9, 12)), total: end + 4 + Number(len[1]) };
        }
        if (buf.length < want.total) return;
        const { status } = want;
        buf = buf.subarray(want.total);
        want = null;
        const resolve = done;
        done = null;
        resolve?.(status);
    });
    const req = Buffer.from(rawRequest('POST', '/v1/chat/completions', { body: chatBody(false) }));
    return {
        ask: () => new Promise((resolve) => { done = resolve; s.write(req); }),
        close: () => s.destroy(),
    };
}

/* Non-stream requests from 4 keep-alive clients for ms; their latencies (ms). */
async function latencies(env, ms) {
    const out = [];
    const until = Date.now() + ms;
    let failed = 0;
    const why = new Set();
    const port = Number(new URL(env.api).port);
    const w = async () => {
        let c = keepAliveClient(port);
        while (Date.now() < until) {
            const t0 = performance.now();
            const status = await c.ask();
            if (status === 200) out.push(performance.now() - t0);
            else {
                failed++;
                why.add(String(status));
                c.close();
                c = keepAliveClient(port); // a connection the gateway closed: a new one
            }
        }
        c.close();
    };
    await Promise.all([w(), w(), w(), w()]);
    out.sort((a, b) => a - b);
    if (!out.length) out.push(NaN);
    return { n: out.length, failed, why: [...why].join(', '), p50: out[Math.floor(out.length * 0.5)], p99: out[Math.floor(out.length * 0.99)] };
}

/* The slow readers' upstream, in a process of its own: one OpenAI stream of 512 events of
 * 16 KiB content (8 MiB: more than loopback's buffers hold) built once and written from that
 * buffer for every request, paused while the gateway does not read, so that its own CPU
 * is the kernel's copy and not a mock generating megabytes of JSON per reader. Prints its
 * port as one JSON line. */
const drainedOrClosed = (res) => new Promise((resolve) => {
    const go = () => { res.off('drain', go); res.off('close', go); resolve(); };
    res.on('drain', go);
    res.on('close', go);
});

async function bigUpstream() {
    const piece = 'x'.repeat(16384);
    const frame = (delta, finish) => `data: ${JSON.stringify({ id: 'chatcmpl-big', object: 'chat.completion.chunk', created: 1, model: 'up-big', choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] })}\n\n`;
    const body = Buffer.from(frame({ role: 'assistant', content: '' }, null) + frame({ content: piece }, null).repeat(512) +
        frame({}, 'stop') + 'data: [DONE]\n\n');
    const SLICE = 65536;
    const server = http.createServer((req, res) => {
        req.resume();
        req.on('end', async () => {
            if (req.method !== 'POST') {
                res.writeHead(200, { 'Content-Type': 'application/json' });
                return res.end('{"object":"list","data":[{"id":"up-big","object":"model"}]}');
            }
            res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
            for (let at = 0; at < body.length && !res.destroyed; at += SLICE) {
                if (!res.write(body.subarray(at, at + SLICE))) await drainedOrClosed(res);
            }
            res.end();
        });
    });
    server.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: server.address().port })));
    await new Promise(() => {}); // serves until killed
}

/* The big upstream started as a child; { base, pid, close }. */
async function startBigUpstream() {
    const child = spawn(process.execPath, [fileURLToPath(import.meta.url), '--big-upstream'], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    await waitFor(() => out.includes('port'), { timeoutMs: 30000, what: 'the big upstream' });
    const { port } = JSON.parse(out.trim().split('\n')[0]);
    return {
        base: `http://127.0.0.1:${port}`, pid: child.pid,
        close: () => new Promise((r) => { child.once('exit', r); child.kill(); }),
    };
}

async function slow() {
    const big = await startBigUpstream();
    const timeouts = { header_read_ms: 5000, idle_ms: 60000, total_ms: 120000 };
    const env = await startEnv({
        timeouts,
        server: { write_timeout_ms: 5000 },
        wrap: ['prlimit', `--nofile=1024:${HARD_NOFILE}`, '--'],
        extraProviders: [{ id: 'big-engine', adapter: 'openai', base_url: 'BIG/v1' }],
        extraModels: { big: { routes: [{ provider: 'big-engine', model: 'up-big' }] } },
        // the long streams come from a mock of their own: its work (an 8 MiB stream per
        // reader, until the gateway pauses it) does not slow the normal traffic's engine
        configure: (c) => ({
            ...c, health: { probes: false }, log: { level: 'info' },
            scheduler: { max_running_tasks: 4096, max_queued_tasks: 4096 },
            providers: c.providers.map((p) => ({ ...p, base_url: p.base_url.replace('BIG', big.base) })),
        }),
    });
    const fdLine = env.gw.logs.find((l) => l.msg === 'fd_limit');
    const seconds = SHORT ? 12 : 30;
    const pid = env.gw.pid;
    await latencies(env, 2000); // warm up
    const loopBase0 = loopBusy(await env.gw.metrics());
    let cpu0 = cpuOf(pid), t0 = performance.now();
    const base = await latencies(env, SHORT ? 5000 : 10000);
    const loopBase1 = loopBusy(await env.gw.metrics());
    const cpuBase = (cpuOf(pid) - cpu0) / ((performance.now() - t0) / 1000); // CPU s per s
    await sleep(1000);
    const idle = rssOf(pid); // after the unloaded run: what normal traffic itself keeps is in it
    if (process.env.TRIALS_DEBUG_HEAP) heapReport(pid, 'idle');
    /* TRIALS_DEBUG_HEAPTRACK=1: heaptrack from here (its file, heaptrack.moongate.PID.zst, in
       the temp dir); the gateway is killed after, so that heaptrack_print --print-leaks shows
       what was allocated since idle and is still live then */
    const ht = process.env.TRIALS_DEBUG_HEAPTRACK &&
        spawn('heaptrack', ['-p', String(pid)], { stdio: 'ignore', cwd: fs.realpathSync('/tmp') });
    if (ht) await sleep(5000);
    const child = spawn(process.execPath, [fileURLToPath(import.meta.url), '--slow-child', String(env.gw.port), String(seconds), '8000'],
        { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    await waitFor(() => out.includes('started'), { timeoutMs: 30000, what: 'the slow clients' });
    await sleep(6000); // the first ones time out and are replaced: the steady state
    let peak = rssOf(pid);
    const peakTimer = setInterval(() => (peak = Math.max(peak, rssOf(pid))), 250);
    /* TRIALS_DEBUG_PERF=FILE: perf record -g of the gateway during the loaded run */
    const perf = process.env.TRIALS_DEBUG_PERF &&
        spawn('perf', ['record', '-g', '-o', process.env.TRIALS_DEBUG_PERF, '-p', String(pid)], { stdio: 'ignore' });
    cpu0 = cpuOf(pid);
    // every process of the trial shares the two cores: each one's CPU over the loaded run
    const others = { child: child.pid, big: big.pid, mock: env.mock.child.pid, parent: process.pid };
    const others0 = Object.fromEntries(Object.entries(others).map(([k, p]) => [k, cpuOf(p)]));
    const machine0 = machineBusy();
    const loop0 = loopBusy(await env.gw.metrics());
    t0 = performance.now();
    const loaded = await latencies(env, Math.max(2000, (seconds - 8) * 1000));
    const loadedSecs = (performance.now() - t0) / 1000;
    const cpuLoaded = (cpuOf(pid) - cpu0) / loadedSecs;
    const cpuOthers = Object.fromEntries(Object.entries(others).map(([k, p]) => [k, (cpuOf(p) - others0[k]) / loadedSecs]));
    const cpuMachine = (machineBusy() - machine0) / loadedSecs;
    const loadAvg = fs.readFileSync('/proc/loadavg', 'utf8').split(' ')[0];
    const loop1 = loopBusy(await env.gw.metrics());
    if (perf) perf.kill('SIGINT');
    await new Promise((r) => child.once('exit', r));
    clearInterval(peakTimer);
    const stats = JSON.parse(out.trim().split('\n').at(-1));
    await sleep(5000);
    const after = rssOf(pid);
    if (process.env.TRIALS_DEBUG_HEAP) heapReport(pid, 'after');
    if (ht) {
        process.kill(pid, 'SIGKILL');
        await new Promise((r) => (ht.exitCode !== null ? r() : ht.once('exit', r)));
    }
    if (process.env.TRIALS_DEBUG_TRIM) {
        execFileSync('gdb', ['-p', String(pid), '-batch', '-ex', 'call (int)malloc_trim(0)'], { stdio: 'ignore' });
        console.log('after malloc_trim', mib(rssOf(pid)));
    }
    const st = await env.gw.getJson('/status');
    // the calls still held (pipeline) and those still at a provider: 0 each once all left
    const inFlight = (st.json.in_flight ?? 0) + st.json.providers.reduce((n, p) => n + (p.in_flight ?? 0), 0);
    const down = st.json.providers.filter((p) => !p.available || p.health === 'down' || p.consecutive_failures > 0).map((p) => p.id);
    const stalled = env.gw.logs.filter((l) => l.cancel_reason === 'client_stalled' || l.msg === 'client_stalled').length;
    await env.close();
    await big.close();
    const fd = fdLine ? `fd limit ${fdLine.soft_before} raised to ${fdLine.soft}, max_connections ${fdLine.max_connections}` : 'no fd_limit line';
    row('slow clients: normal p99', `${base.n} unloaded, ${loaded.n} loaded requests`,
        `p99 ${base.p99.toFixed(1)} -> ${loaded.p99.toFixed(1)} ms (p50 ${base.p50.toFixed(1)} -> ${loaded.p50.toFixed(1)}), ${loaded.failed} failed ${loaded.why}`,
        'p99 <= 2x, 0 failed', loaded.p99 <= 2 * base.p99 && loaded.failed === 0);
    // where the machine's time went: the gateway's CPU with and without the slow clients, and
    // the slow clients' own process (it shares the two cores with the gateway and the mocks)
    row('slow clients: CPU', 'unloaded, loaded runs',
        `gateway ${cpuBase.toFixed(2)} -> ${cpuLoaded.toFixed(2)} CPU s/s; loaded: slow clients ${cpuOthers.child.toFixed(2)}, big mock ${cpuOthers.big.toFixed(2)}, normal mock ${cpuOthers.mock.toFixed(2)}, measuring parent ${cpuOthers.parent.toFixed(2)}, machine ${cpuMachine.toFixed(2)} of ${os.cpus().length} (load ${loadAvg})`,
        'a figure', true);
    // the loop's busy stretches during the loaded run (moongate_loop_busy_seconds): a long
    // turn delays every request that arrives during it
    row('slow clients: loop turns', 'unloaded, loaded runs',
        `unloaded ${loopSummary(loopBase0, loopBase1)}; loaded ${loopSummary(loop0, loop1)}`, 'a figure', true);
    row('slow clients: closed by timeouts', `${stats.senders} senders, ${stats.readers} readers`,
        `${stats.sender_408} senders got 408, ${stats.sender_closed_other} closed otherwise, ${stats.reader_closed} readers reset (${stalled} client_stalled lines), ${stats.reader_completed} handed over whole, ${stats.open_at_end} left open, ${inFlight} in flight after`,
        'none left open, senders by 408', stats.open_at_end === 0 && stats.sender_closed_other === 0 && inFlight === 0);
    row('slow clients: providers', fd, down.length ? `marked down or failing: ${down.join(', ')}` : 'none down, 0 failures', 'none down', down.length === 0);
    row('slow clients: RSS', `${seconds} s of slow clients`, `idle ${mib(idle)}, peak ${mib(peak)}, after ${mib(after)} MiB`,
        'after <= idle + 10%', after <= idle * 1.1);
}

/* wrk against the API for secs: half the connections non-stream, half streamed. */
function wrkRun(port, secs) {
    const run = (stream) => new Promise((resolve) => {
        const p = spawn('wrk', ['-t1', '-c8', `-d${secs}s`, '-s', path.join(REPO_ROOT, 'bench/chat.lua'), `http://127.0.0.1:${port}`],
            { env: { ...process.env, MODEL: 'chat', STREAM: stream ? '1' : '0' }, stdio: ['ignore', 'pipe', 'inherit'] });
        let out = '';
        p.stdout.on('data', (d) => (out += d));
        p.once('exit', () => {
            const m = /WRKJSON (\{.*\})/.exec(out);
            const j = m ? JSON.parse(m[1]) : { requests: 0, err_status: 0, err_read: 0 };
            resolve(j);
        });
    });
    return Promise.all([run(false), run(true)]).then(([a, b]) => ({
        requests: a.requests + b.requests,
        errors: a.err_status + b.err_status + a.err_read + b.err_read + a.err_timeout + b.err_timeout,
    }));
}

async function memory() {
    const N = Number(process.env.TRIALS_REQUESTS ?? (SHORT ? 50000 : 1000000));
    {
        const env = await startEnv({ configure: (c) => ({ ...c, health: { probes: false }, log: { level: 'warn' } }) });
        const pid = env.gw.pid;
        let total = 0, errors = 0, at10k = 0;
        const t0 = Date.now();
        while (total < Math.max(N, 10000)) {
            const { requests, errors: e } = await wrkRun(env.gw.port, total < 10000 ? 2 : 10);
            total += requests;
            errors += e;
            await env.mock.reset(); // the mock keeps a record of every request: forget them
            if (!at10k && total >= 10000) {
                await sleep(1000);
                at10k = rssOf(pid);
            }
        }
        await sleep(2000);
        const atN = rssOf(pid);
        const secs = (Date.now() - t0) / 1000;
        await env.close();
        const growth = (atN - at10k) / at10k;
        row('memory: RSS after N requests', `${total} requests (${Math.round(total / secs)}/s), ${errors} errors`,
            `after 10k ${mib(at10k)} MiB, after ${total} ${mib(atN)} MiB (${(growth * 100).toFixed(1)}%)`,
            'within 10%', Math.abs(growth) <= 0.1 && errors === 0);
    }
    {
        // two descriptors a stream (client and upstream): as many as the hard limit holds
        const STREAMS = Number(process.env.TRIALS_STREAMS ?? Math.min(10000, Math.floor((HARD_NOFILE - 200) / 2)));
        const env = await startEnv({
            timeouts: { idle_ms: 600000, total_ms: 600000 },
            server: { max_connections: STREAMS + 50 },
            wrap: ['prlimit', `--nofile=${HARD_NOFILE}:${HARD_NOFILE}`, '--'],
            extraModels: { idle: { routes: [{ provider: 'mock-openai', model: 'up-idle' }] } },
            configure: (c) => ({
                ...c, health: { probes: false }, log: { level: 'warn' },
                scheduler: { max_running_tasks: STREAMS * 2, max_queued_tasks: STREAMS * 2 },
            }),
        });
        // the lead frame at once, then nothing for 10 minutes
        await env.mock.script({ model: 'up-idle', action: { chunk_delay_ms: 600000 } });
        const pid = env.gw.pid;
        await latencies(env, 1000);
        await sleep(1000);
        const before = rssOf(pid);
        const req = rawRequest('POST', '/v1/chat/completions', { body: { model: 'idle', stream: true, messages: [{ role: 'user', content: 'stay with me' }] } });
        const socks = [];
        let started = 0, closed = 0, leaving = false;
        const early = new Map(); // how the ones closed early began: count by status line
        const open = () => new Promise((resolve) => {
            const s = net.connect(env.gw.port, '127.0.0.1');
            let seen = false, head = '';
            s.on('connect', () => s.write(req));
            s.on('data', (d) => {
                if (head.length < 1000) head += d.toString('latin1');
                if (!seen && d.includes('data: ')) { seen = true; started++; }
            });
            s.on('error', (e) => (head ||= e.code));
            s.on('close', () => {
                if (leaving) return;
                closed++;
                const k = (/^[^\r\n]*/.exec(head)?.[0] || 'nothing') + ` ${/"code":"(\w+)"/.exec(head)?.[1] ?? ''}` +
                    (seen ? ' (after its first frame)' : '');
                early.set(k, (early.get(k) ?? 0) + 1);
                resolve();
            });
            s.once('connect', () => resolve());
            socks.push(s);
        });
        for (let i = 0; i < STREAMS; i += 200) await Promise.all(Array.from({ length: Math.min(200, STREAMS - i) }, open));
        await waitFor(() => started + closed >= STREAMS, { timeoutMs: 120000, intervalMs: 200, what: `${STREAMS} streams to start` }).catch(() => {});
        await sleep(2000);
        const held = rssOf(pid);
        leaving = true;
        for (const s of socks) s.destroy();
        await sleep(3000);
        const after = rssOf(pid);
        await env.close();
        const per = (held - before) / Math.max(1, started);
        row('memory: idle SSE streams', `${started}/${STREAMS} streams open (${closed} closed early${closed ? `: ${[...early].map(([k, v]) => `${v} ${k}`).join(', ')}` : ''})`,
            `RSS ${mib(before)} -> ${mib(held)} MiB: ${(per / 1024).toFixed(1)} KiB per stream; ${mib(after)} MiB after they left`,
            '< 10 KiB per stream', started === STREAMS && per < 10240);
    }
}

if (process.argv[2] === '--big-upstream') await bigUpstream();
else if (process.argv[2] === '--slow-child') await slowChild(Number(process.argv[3]), Number(process.argv[4]), Number(process.argv[5]));

const only = TEST ? null : process.argv[2];
const inTest = new Set(['sighup', 'kill9', 'state', 'upstream', 'hang']); // slow and memory measure: not in make test
const trials = [['sighup', sighup], ['kill9', kill9], ['state', state], ['upstream', upstream], ['hang', hang], ['slow', slow], ['memory', memory]];
for (const [name, fn] of trials) {
    if ((only && only !== name) || (TEST && !inTest.has(name))) continue;
    const t0 = Date.now(), first = rows.length;
    await fn();
    const secs = ((Date.now() - t0) / 1000).toFixed(1);
    for (let i = first; i < rows.length; i++) rows[i].seconds = i === first ? secs : '';
}
console.table(rows);
process.exit(rows.every((r) => r.ok === 'yes') ? 0 : 1);
