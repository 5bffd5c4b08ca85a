#!/usr/bin/env node
// The gateway's CPU per request for Anthropic Messages in -> an OpenAI-wire route (the request
// and every stream event translated, in C) beside the same request as chat completions
// (pass-through), in one run, interleaved: the real binary against the tests' mock engine, a
// 20-event stream (role chunk, 17 content chunks, finish chunk, usage chunk) and a whole
// answer. The gateway's own CPU time (utime + stime of its process, /proc/<pid>/stat) is read
// around each batch (/proc/<pid>/task/*/schedstat), so the mock's and the client's costs do not count. Prints microseconds
// of gateway CPU per request and the ratio Messages / chat.
//   node bench/messages.mjs [REQUESTS_PER_BATCH]     (needs build/moongate)
import fs from 'node:fs';
import os from 'node:os';
import { startEnv } from '../tests/e2e/lib/harness.mjs';

const PER_BATCH = Number(process.argv[2] || 1000);
const ROUNDS = 5;
const CONCURRENCY = 4;

// The process's CPU time in microseconds: every thread's time on a CPU (schedstat, in ns;
// /proc/<pid>/stat's ticks of 10 ms are too coarse for batches of a few ms).
function cpuUs(pid) {
    let ns = 0;
    for (const t of fs.readdirSync(`/proc/${pid}/task`)) {
        try {
            ns += Number(fs.readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ')[0]);
        } catch {
            /* a thread that ended */
        }
    }
    return ns / 1000;
}

const ONLY = process.env.BENCH_ONLY; // one variant's name: profile it (the pid is printed)
const variants = {
    chat_stream: { path: '/v1/chat/completions', body: { model: 'b', stream: true, max_tokens: 64, messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'why pool connections?' }] } },
    messages_stream: { path: '/v1/messages', body: { model: 'b', stream: true, max_tokens: 64, system: 'be brief', messages: [{ role: 'user', content: 'why pool connections?' }] } },
    chat_whole: { path: '/v1/chat/completions', body: { model: 'b', max_tokens: 64, messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'why pool connections?' }] } },
    messages_whole: { path: '/v1/messages', body: { model: 'b', max_tokens: 64, system: 'be brief', messages: [{ role: 'user', content: 'why pool connections?' }] } },
};

async function batch(env, v) {
    let left = PER_BATCH;
    const body = JSON.stringify(v.body);
    const worker = async () => {
        while (left-- > 0) {
            const r = await fetch(env.base + v.path, { method: 'POST', headers: { 'content-type': 'application/json' }, body, signal: AbortSignal.timeout(10000) });
            await r.text();
            if (r.status !== 200) throw new Error(`${v.path}: ${r.status}`);
        }
    };
    const pid = env.gw.child.pid;
    const t0 = cpuUs(pid);
    await Promise.all(Array.from({ length: CONCURRENCY }, worker));
    return (cpuUs(pid) - t0) / PER_BATCH;
}

const env = await startEnv({
    log: { level: 'warn' },
    configure: (c) => {
        c.models.b = { routes: [{ provider: 'mock-openai-b', model: 'bench-up' }] };
        return c;
    },
});
try {
    await env.mock.script({ model: 'bench-up', times: 1e9, action: { chunks: 17 } });
    if (ONLY) {
        console.log(`gateway pid ${env.gw.child.pid}`);
        for (let i = 0; i < 20; i++) await batch(env, variants[ONLY]);
    } else {
        await measure(env);
    }
} finally {
    await env.close();
}

async function measure(env) {
    for (const v of Object.values(variants)) await batch(env, { ...v, warm: true }); // warm-up
    const results = Object.fromEntries(Object.keys(variants).map((k) => [k, []]));
    for (let r = 0; r < ROUNDS; r++)
        for (const [k, v] of Object.entries(variants)) results[k].push(await batch(env, v));
    const best = (k) => Math.min(...results[k]);
    console.log(`messages.mjs: gateway CPU per request (us, best of ${ROUNDS} batches of ${PER_BATCH}; ${os.cpus().length} cpus)`);
    console.log(`  stream (20 events)  chat ${best('chat_stream').toFixed(0)}   messages ${best('messages_stream').toFixed(0)}   ratio ${(best('messages_stream') / best('chat_stream')).toFixed(2)}`);
    console.log(`  whole answer        chat ${best('chat_whole').toFixed(0)}   messages ${best('messages_whole').toFixed(0)}   ratio ${(best('messages_whole') / best('chat_whole')).toFixed(2)}`);
}
