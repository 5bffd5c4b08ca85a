// Clients that stop reading (issue 16, item 5). server.write_timeout_ms closes a connection
// whose queued answer makes no progress; a stream's upstream is cancelled (the engine sees
// its connection closed) and the request is accounted cancelled / client_stalled, in its log
// line and in the metrics; a whole answer the client never takes is dropped and said so; and
// the memory those answers held goes back to the system once they are gone.
//
// The clients are raw sockets that send a request and then never read (node reads its
// first 16 KiB and stops). Every wait is bounded; nothing asserts on how long anything took.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startEnv, RawConn, rawRequest, waitFor, parseResponse, gatewayBin } from './lib/harness.mjs';

const WRITE_TIMEOUT_MS = 1000;
const BIG_PIECES = 8;
const BIG_PIECE_BYTES = 1 << 20; // an 8 MiB non-stream answer
const STREAM_PIECES = 3000;
const STREAM_PIECE_BYTES = 16 << 10; // a 48 MiB stream: more than loopback buffers hold
const N_BIG = 16;
const N_STREAM = 40;
// VmRSS after the stalled clients are gone may exceed the start by at most this. The whole
// answers held 100+ MiB, the streams about 1.2 MiB each (their queued output); glibc keeps
// the streams' many smaller blocks after they are freed unless the gateway trims it.
const RSS_SLACK_WHOLE = 48 << 20;
const RSS_SLACK_STREAM = 16 << 20;

let env;

before(async () => {
    env = await startEnv({
        server: { write_timeout_ms: WRITE_TIMEOUT_MS },
        extraModels: {
            big: { routes: [{ provider: 'mock-openai', model: 'up-big' }] },
            bigstream: { routes: [{ provider: 'mock-openai', model: 'up-bigstream' }] },
        },
        configure: (c) => ({ ...c, health: { probes: false } }),
    });
    await env.mock.script([
        // the warm-up stream (read in full) is a short one
        { model: 'up-bigstream', times: 1, action: { chunks: 64, piece_bytes: STREAM_PIECE_BYTES } },
        { model: 'up-big', action: { chunks: BIG_PIECES, piece_bytes: BIG_PIECE_BYTES } },
        { model: 'up-bigstream', action: { chunks: STREAM_PIECES, piece_bytes: STREAM_PIECE_BYTES } },
    ]);
});

after(async () => {
    await env?.close();
});

function rssBytes(pid) {
    const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    assert.ok(m, 'VmRSS in /proc/<pid>/status');
    return Number(m[1]) * 1024;
}

/** The value of one sample of the Prometheus text (name with labels, exactly), or undefined. */
function metric(text, sample) {
    for (const line of text.split('\n')) {
        if (line.startsWith('#')) continue;
        const i = line.lastIndexOf(' ');
        if (i > 0 && line.slice(0, i) === sample) return Number(line.slice(i + 1));
    }
    return undefined;
}

/** A client that sends one chat request and then reads nothing more. */
async function stalledClient(model, stream) {
    const c = await RawConn.open(env.gw.port);
    c.socket.pause();
    await c.write(rawRequest('POST', '/v1/chat/completions', {
        body: { model, stream, messages: [{ role: 'user', content: 'never read' }] },
    }));
    return c;
}

/** After the gateway cut it: reading again finds the connection closed, the answer short. */
async function assertCut(c, what) {
    c.socket.resume();
    assert.ok(await c.waitClose(10000), `${what}: the gateway closed the connection`);
    const parsed = parseResponse(c.buf, false);
    assert.equal(parsed, null, `${what}: the client did not get a complete answer`);
    c.close();
}

/** Warm the process up (a request of each kind, read in full), then its RSS. */
async function baselineRss() {
    for (const [model, stream] of [['big', false], ['bigstream', true]]) {
        const c = await RawConn.open(env.gw.port);
        await c.write(rawRequest('POST', '/v1/chat/completions', {
            body: { model, stream, messages: [{ role: 'user', content: 'warm up' }] },
        }));
        const r = await c.readResponse(20000);
        assert.equal(r.status, 200);
        c.close();
    }
    return rssBytes(env.gw.pid);
}

const mib = (n) => `${(n / 1048576).toFixed(1)} MiB`;

// A sanitizer build's allocator keeps freed memory in its quarantine: VmRSS says nothing there.
const SANITIZED = fs.readFileSync(gatewayBin()).includes('__asan_init');

/** Wait (bounded) for VmRSS to fall below `bound`; the peak seen on the way is reported. */
async function rssFallsBelow(t, base, bound, peak, what) {
    t.diagnostic(`VmRSS: ${mib(base)} before, ${mib(peak)} with the stalled clients`);
    if (SANITIZED) {
        t.diagnostic('ASan build: freed memory stays in its quarantine, VmRSS not asserted');
        return;
    }
    await waitFor(() => rssBytes(env.gw.pid) < bound, {
        timeoutMs: 20000, intervalMs: 200,
        what: `${what}: VmRSS below ${mib(bound)} (now ${mib(rssBytes(env.gw.pid))})`,
    });
    t.diagnostic(`VmRSS after they left: ${mib(rssBytes(env.gw.pid))}`);
}

describe('a client that stops reading', () => {
    let base;

    before(async () => {
        base = await baselineRss();
    });

    test('a whole answer it never reads: cut after write_timeout_ms, said and counted, memory back', async (t) => {
        const from = env.gw.logs.length;
        const clients = [];
        for (let i = 0; i < N_BIG; i++) clients.push(await stalledClient('big', false));
        // every request was answered (the upstream's part is over), then each connection stalls
        let peak = 0;
        const lines = await waitFor(() => {
            peak = Math.max(peak, rssBytes(env.gw.pid));
            const reqs = env.gw.logs.slice(from).filter((l) => l.msg === 'request' && l.model === 'big');
            return reqs.length === N_BIG ? reqs : null;
        }, { timeoutMs: 20000, what: `${N_BIG} request lines` });
        for (const l of lines) assert.equal(l.status, 200);
        peak = Math.max(peak, rssBytes(env.gw.pid));
        const ids = new Set(lines.map((l) => l.request_id));
        const stalled = await waitFor(() => {
            const s = env.gw.logs.slice(from).filter((l) => l.msg === 'client_stalled' && ids.has(l.request_id));
            return s.length === N_BIG ? s : null;
        }, { timeoutMs: 20000, what: `${N_BIG} client_stalled lines` });
        for (const s of stalled) {
            assert.equal(s.outcome, 'cancelled');
            assert.equal(s.cancel_reason, 'client_stalled');
            assert.equal(s.listener, 'api');
            assert.ok(s.unsent_bytes > 0, 'bytes were still queued when it was cut');
        }
        for (const [i, c] of clients.entries()) await assertCut(c, `client ${i}`);
        const text = await env.gw.metrics();
        assert.ok(metric(text, 'moongate_client_timeouts_total{listener="api",reason="write"}') >= N_BIG);
        await waitFor(async () => metric(await env.gw.metrics(), 'moongate_connections_open{listener="api"}') === 0,
            { timeoutMs: 5000, what: 'no API connection left open' });
        await rssFallsBelow(t, base, base + RSS_SLACK_WHOLE, peak, 'after the stalled whole answers');
    });

    test('a stream it never reads: cut, its upstream cancelled, cancelled / client_stalled', async (t) => {
        const from = env.gw.logs.length;
        const seqBefore = Math.max(0, ...(await env.mock.requests()).map((r) => r.seq));
        const before0 = metric(await env.gw.metrics(), 'moongate_cancellations_total{reason="client_stalled"}') ?? 0;
        const clients = [];
        for (let i = 0; i < N_STREAM; i++) clients.push(await stalledClient('bigstream', true));
        let peak = 0;
        const lines = await waitFor(() => {
            peak = Math.max(peak, rssBytes(env.gw.pid));
            const reqs = env.gw.logs.slice(from).filter((l) => l.msg === 'request' && l.model === 'bigstream');
            return reqs.length === N_STREAM ? reqs : null;
        }, { timeoutMs: 30000, what: `${N_STREAM} request lines` });
        for (const l of lines) {
            assert.equal(l.outcome, 'cancelled', JSON.stringify(l));
            assert.equal(l.cancel_reason, 'client_stalled', JSON.stringify(l));
            assert.equal(l.task_state, 'CANCELLED');
        }
        // the engine saw each of its connections closed before its answer was done
        const ups = await waitFor(async () => {
            const r = (await env.mock.requests()).filter((x) => x.seq > seqBefore && x.body?.model === 'up-bigstream');
            return r.length === N_STREAM && r.every((x) => x.ended_at !== null) ? r : null;
        }, { timeoutMs: 10000, what: 'the upstream requests ended' });
        for (const u of ups) {
            assert.equal(u.finished, false, 'the engine did not get to finish');
            assert.equal(u.closed_early, true, 'the engine saw its connection closed');
        }
        for (const [i, c] of clients.entries()) await assertCut(c, `stream client ${i}`);
        const text = await env.gw.metrics();
        assert.equal(metric(text, 'moongate_cancellations_total{reason="client_stalled"}') - before0, N_STREAM);
        await rssFallsBelow(t, base, base + RSS_SLACK_STREAM, peak, 'after the stalled streams');
    });
});
