// What the cluster benchmarks share: the CPU a process (or the throw-away PostgreSQL cluster)
// spent, from /proc, and a closed-loop client. Loopback only; every loop bounded in count.
import fs from 'node:fs';
import { postJson } from '../tests/e2e/lib/harness.mjs';

export const TICK = 100; // USER_HZ

/** utime + stime of pid, in ticks. */
export function cpuTicks(pid) {
    const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const rest = f.slice(f.lastIndexOf(')') + 2).split(' ');
    return Number(rest[11]) + Number(rest[12]);
}

/** The CPU of a PostgreSQL cluster's processes: the postmaster (its command line names the
 * data dir) and its children (backends, writers). */
export function pgTicks(dataDir) {
    let sum = 0;
    for (const p of fs.readdirSync('/proc')) {
        if (!/^\d+$/.test(p)) continue;
        try {
            if (fs.readFileSync(`/proc/${p}/comm`, 'utf8').trim() !== 'postgres') continue;
            const f = fs.readFileSync(`/proc/${p}/stat`, 'utf8');
            const ppid = f.slice(f.lastIndexOf(')') + 2).split(' ')[1];
            const mine = (q) => fs.readFileSync(`/proc/${q}/cmdline`, 'utf8').includes(dataDir);
            if (mine(p) || mine(ppid)) sum += cpuTicks(p);
        } catch {
            /* gone */
        }
    }
    return sum;
}

export const CHAT_BODY = { model: 'chat', messages: [{ role: 'user', content: 'hello' }], max_tokens: 5 };

/** requests chat requests, concurrency at a time; targets[i] = {base, headers}, taken in
 * turn. Returns failures and latency percentiles (ms). */
export async function closedLoop(targets, requests, concurrency, body = CHAT_BODY) {
    let next = 0;
    let failed = 0;
    const lat = [];
    const worker = async () => {
        while (next < requests) {
            const t = targets[next++ % targets.length];
            const t0 = performance.now();
            const r = await postJson(`${t.base}/v1/chat/completions`, body, { headers: t.headers });
            lat.push(performance.now() - t0);
            if (r.status !== 200) failed++;
        }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    lat.sort((a, b) => a - b);
    return { failed, p50: lat[Math.floor(lat.length / 2)], p99: lat[Math.floor(lat.length * 0.99)] };
}

/** rate requests a second for seconds (open loop: sent on time whatever the answers do),
 * targets in turn. Returns failures and latency percentiles (ms). */
export async function paced(targets, rate, seconds, body = CHAT_BODY) {
    const total = Math.round(rate * seconds);
    const start = performance.now();
    const lat = [];
    let failed = 0;
    const pending = [];
    for (let i = 0; i < total; i++) {
        const due = start + (i * 1000) / rate;
        const wait = due - performance.now();
        if (wait > 1) await new Promise((r) => setTimeout(r, wait));
        const t = targets[i % targets.length];
        const t0 = performance.now();
        pending.push(postJson(`${t.base}/v1/chat/completions`, body, { headers: t.headers }).then((r) => {
            lat.push(performance.now() - t0);
            if (r.status !== 200) failed++;
        }, () => { failed++; }));
    }
    await Promise.all(pending);
    lat.sort((a, b) => a - b);
    return { failed, p50: lat[Math.floor(lat.length / 2)], p99: lat[Math.floor(lat.length * 0.99)] };
}
