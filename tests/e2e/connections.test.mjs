// Slow-body connections against a low file descriptor limit (issue 16, item 2): a bounded
// load script. The gateway runs under `prlimit --nofile` so that a few hundred connections
// are more than its descriptors allow (and raises its soft limit to the hard one at start); SLOW clients each send a chat request's head with a
// 100,000-byte Content-Length and then one body byte every TRICKLE_MS (a byte per gap used
// to re-arm the header timer forever).
//
// With the connection cap derived from the limit: the first max_connections are held until
// their body falls behind server.min_body_bytes_per_s (after timeouts.header_read_ms of
// grace) and are then answered 408; the rest are refused with a 503 in the gateway's error
// shape (or, past the 503s in flight, closed); the metrics listener, the admin API and
// /health stay reachable meanwhile; refusals are counted and logged; afterwards a client is
// served. With a cap above the limit: accepting fails with EMFILE, which is counted, logged
// and met with a pause, and service resumes once the slow clients are cut.
//
// Every wait is bounded; nothing asserts on how long anything took.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startEnv, RawConn, waitFor } from './lib/harness.mjs';

const TRICKLE_MS = 250;
const ADMIN_TOKEN = 'adm-connections-e2e-token-7f3a';

/** The value of one sample of the Prometheus text (name with labels, exactly), or undefined. */
function metric(text, sample) {
    for (const line of text.split('\n')) {
        if (line.startsWith('#')) continue;
        const i = line.lastIndexOf(' ');
        if (i > 0 && line.slice(0, i) === sample) return Number(line.slice(i + 1));
    }
    return undefined;
}

/** A client that sends a chat request's head and then trickles its body. */
class SlowClient {
    static async open(port) {
        const c = new SlowClient(await RawConn.open(port, '127.0.0.1', 15000));
        await c.conn.write('POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n' +
            'Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{');
        c.timer = setInterval(() => {
            if (c.conn.closed || c.conn.error) return c.stop();
            c.conn.socket.write(' ', () => {});
        }, TRICKLE_MS);
        return c;
    }

    constructor(conn) {
        this.conn = conn;
        this.timer = null;
    }

    stop() {
        clearInterval(this.timer);
        this.timer = null;
    }

    /** { status, json, headers } once answered, { closed: true } when closed unanswered. */
    async outcome(timeoutMs) {
        try {
            const r = await this.conn.readResponse(timeoutMs);
            let json = null;
            try {
                json = r.json();
            } catch {
                /* not JSON */
            }
            return { status: r.status, json, headers: r.headers };
        } catch (err) {
            if (this.conn.closed) return { closed: true };
            throw err;
        }
    }

    /** Settled (answered or closed) by now, without waiting. */
    get settled() {
        return this.conn.closed || this.conn.buf.includes('\r\n\r\n');
    }

    close() {
        this.stop();
        this.conn.close();
    }
}

async function openSlow(port, n) {
    const list = [];
    for (let i = 0; i < n; i++) list.push(await SlowClient.open(port));
    return list;
}

function openai(env) {
    return new OpenAI({ baseURL: env.api, apiKey: 'unused', maxRetries: 0, timeout: 15000 });
}

function chat(env) {
    return openai(env).chat.completions.create({ model: 'chat', messages: [{ role: 'user', content: 'still there?' }] });
}

describe('max_connections from the descriptor limit: slow bodies are cut, the rest refused, admin and metrics stay up', () => {
    const NOFILE = 128; // the hard limit; the soft one starts at half of it
    const SLOW = 200;
    let env;
    let slow = [];

    before(async () => {
        env = await startEnv({
            wrap: ['prlimit', `--nofile=${NOFILE / 2}:${NOFILE}`],
            // the body's grace (and the head's limit); min_body_bytes_per_s stays at its default
            timeouts: { header_read_ms: 15000 },
            env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
            configure: (c) => ({ ...c, health: { probes: false } }),
        });
    });

    after(async () => {
        for (const s of slow) s.close();
        await env?.close();
    });

    test('more slow clients than descriptors: a cap, 503s for the rest, the others still served', async (t) => {
        const fd = env.gw.logs.find((l) => l.msg === 'fd_limit');
        assert.ok(fd, 'the descriptor limit is logged at start');
        assert.equal(fd.soft_before, NOFILE / 2);
        assert.equal(fd.soft, NOFILE, 'the soft limit is raised to the hard one');
        assert.equal(fd.max_connections_from, 'fd_limit');
        const cap = fd.max_connections;
        assert.ok(cap > 0 && cap < SLOW, `a cap below the descriptors (${cap})`);

        slow = await openSlow(env.gw.port, SLOW);
        // all but the first `cap` are refused at once (503, or a close past the 503s in flight)
        await waitFor(() => slow.filter((s) => s.settled).length >= SLOW - cap,
            { timeoutMs: 20000, what: `${SLOW - cap} refusals` });
        const held = slow.filter((s) => !s.settled);
        assert.equal(held.length, cap, 'max_connections slow clients are held');
        const refused = await Promise.all(slow.filter((s) => s.settled).map((s) => s.outcome(1000)));
        const answered = refused.filter((o) => !o.closed);
        t.diagnostic(`cap ${cap}: ${answered.length} refusals answered 503, ${refused.length - answered.length} closed`);
        assert.ok(answered.length > 0, 'refusals are answered while they can be');
        for (const o of answered) {
            assert.equal(o.status, 503);
            assert.equal(o.json?.error?.code, 'RESOURCE_EXHAUSTED');
            assert.equal(o.json?.error?.type, 'api_error');
            assert.ok('param' in o.json.error && o.json.error.request_id, 'the gateway error shape');
            assert.equal(o.headers.connection, 'close');
            assert.equal(o.headers['retry-after'], '1');
        }

        // meanwhile: the metrics listener, health and the admin API (the reserve) answer
        const text = await env.gw.metrics();
        assert.ok(metric(text, 'moongate_connections_refused_total{listener="api"}') >= SLOW - cap);
        assert.equal(metric(text, 'moongate_connections_max{listener="api"}'), cap);
        assert.equal((await env.gw.getJson('/health')).status, 200);
        const pools = await fetch(`${env.base}/api/v2/pools`, {
            headers: { authorization: `Bearer ${ADMIN_TOKEN}` }, signal: AbortSignal.timeout(10000),
        });
        assert.equal(pools.status, 200, 'the admin API is served from the reserve');
        // an ordinary request is refused clearly, not left hanging
        await assert.rejects(chat(env), (err) => err.status === 503 && err.code === 'RESOURCE_EXHAUSTED');
        const said = await env.gw.waitLog((l) => l.msg === 'connections_refused' && l.listener === 'api',
            { timeoutMs: 10000, what: 'the refusals in the log' });
        assert.ok(said.refused > 0);
        assert.equal(said.max_connections, cap);

        // the held ones are cut once their body falls behind the minimum rate: 408
        const outcomes = await Promise.all(held.map((s) => s.outcome(60000)));
        for (const o of outcomes) {
            assert.equal(o.status, 408, JSON.stringify(o));
            assert.equal(o.json?.error?.code, 'REQUEST_TIMEOUT');
            assert.equal(o.json?.error?.message, 'request body arrived too slowly');
        }
        for (const s of slow) s.close();

        // and then an ordinary client is served
        const r = await chat(env);
        assert.equal(r.choices[0].message.role, 'assistant');
        const after2 = await env.gw.metrics();
        assert.equal(metric(after2, 'moongate_client_timeouts_total{listener="api",reason="min_body_rate"}'), cap);
        const cut = env.gw.logs.filter((l) => l.msg === 'request' && l.status === 408 && l.error === 'REQUEST_TIMEOUT');
        assert.equal(cut.length, cap, 'each cut request is logged');
    });
});

describe('max_connections above the descriptor limit: EMFILE is counted, logged, paused on', () => {
    const NOFILE = 64;
    const SLOW = 100;
    let env;
    let slow = [];

    before(async () => {
        env = await startEnv({
            wrap: ['prlimit', `--nofile=${NOFILE}:${NOFILE}`],
            server: { max_connections: 1000 },
            timeouts: { header_read_ms: 2000 },
            configure: (c) => ({ ...c, health: { probes: false } }),
        });
    });

    after(async () => {
        for (const s of slow) s.close();
        await env?.close();
    });

    test('out of descriptors: accept pauses, the slow clients are cut, service resumes', async (t) => {
        const fd = env.gw.logs.find((l) => l.msg === 'fd_limit');
        assert.ok(fd?.warning, 'a cap the descriptors cannot hold is warned about');
        assert.equal(fd.max_connections, 1000);

        slow = await openSlow(env.gw.port, SLOW);
        const said = await env.gw.waitLog((l) => l.msg === 'accept_failed' && l.listener === 'api',
            { timeoutMs: 20000, what: 'the accept failure in the log' });
        assert.equal(said.error, 'EMFILE');
        assert.ok(said.failures >= 1);
        // every slow client is eventually accepted (after a pause) and cut at its deadline
        const outcomes = await Promise.all(slow.map((s) => s.outcome(90000)));
        const statuses = outcomes.map((o) => (o.closed ? 'closed' : o.status));
        assert.ok(statuses.every((s) => s === 408), `all cut with 408: ${JSON.stringify(statuses)}`);
        for (const s of slow) s.close();

        const r = await chat(env);
        assert.equal(r.choices[0].message.role, 'assistant');
        const text = await env.gw.metrics();
        const emfile = metric(text, 'moongate_accept_errors_total{listener="api",error="EMFILE"}');
        t.diagnostic(`accept failed with EMFILE ${emfile} times`);
        assert.ok(emfile >= 1, 'EMFILE counted');
        // paused, not spinning: one failure per pause (100 ms), so a few dozen over the
        // seconds this took; a loop retrying accept would count millions
        assert.ok(emfile < 5000, `accept failures bounded by the pauses (${emfile})`);
        assert.equal(metric(text, 'moongate_client_timeouts_total{listener="api",reason="min_body_rate"}'), SLOW);
    });
});
