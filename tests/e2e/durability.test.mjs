// Durability of what an answer acknowledges (issue 16, item 6): a request whose client received
// its complete answer has its spend and, with an idempotency key, its stored answer in the
// database, whatever happens next.
//
// kill -9 trials: clients (one API key each, so each key's spend is one client's) send requests
// back to back, streamed and not, half with idempotency keys; at a random moment the gateway is
// killed with SIGKILL, in some trials while another connection holds the database's write lock.
// After a restart on the same database every client's spend must equal the cost of its
// acknowledged requests, plus at most the one that was in flight; the last acknowledged
// idempotent requests replay (Idempotent-Replayed: true, the same body) and charge nothing.
// A second test holds the write lock for 1.5 s while the clients run, with a write queue of 2
// so that writes park: nothing fails, nothing is lost, the writer says it waited.
//
// The database is read with the sqlite3 command-line shell (scripts/setup installs it).

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { sqliteRows, adminCall, startEnv, startGateway, sleep, withTimeout } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-durability-e2e-token-91c4';
const PRICE = 2; // per 1,000 tokens: a request of t tokens costs t * 2,000 micros
const CLIENTS = 6;
const TRIALS = 20;

let env;
let dbPath;
const keys = []; // { id, key }

before(async () => {
    env = await startEnv({
        configure: (c) => ({
            ...c,
            auth: { enabled: true },
            health: { probes: false },
            providers: c.providers.map((p) => (p.id === 'mock-openai' ? { ...p, cost_per_1k_tokens: PRICE } : p)),
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
    dbPath = env.config.storage.path;
    const t = await admin('POST', 'tenants', { name: 'durable' });
    assert.equal(t.status, 201, t.text);
    for (let i = 0; i < CLIENTS; i++) {
        const k = await admin('POST', 'keys', { tenant_id: t.json.id, name: `client-${i}` });
        assert.equal(k.status, 201, k.text);
        keys.push({ id: k.json.id, key: k.json.key });
    }
});

after(async () => {
    await env?.close();
});

function admin(method, p, body) {
    return adminCall(env.base, ADMIN_TOKEN, method, p, body);
}

const query = (sql) => sqliteRows(dbPath, sql);

/** Micros charged so far per key id (every day's row: robust to midnight). */
function spendByKey() {
    const m = new Map(keys.map((k) => [k.id, 0]));
    for (const r of query("SELECT id, SUM(micros) AS micros FROM spend WHERE scope = 'key' AND period LIKE 'd:%' GROUP BY id"))
        m.set(r.id, Number(r.micros));
    return m;
}

/** Another connection takes the write lock (BEGIN IMMEDIATE); release() rolls it back. */
async function holdWriteLock() {
    const child = spawn('sqlite3', [dbPath], { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.setEncoding('utf8');
    const locked = new Promise((resolve, reject) => {
        child.stdout.on('data', (d) => {
            out += d;
            if (out.includes('locked')) resolve();
        });
        child.once('exit', (code) => reject(new Error(`sqlite3 exited (${code}) before taking the lock`)));
    });
    child.stdin.write(".timeout 5000\nBEGIN IMMEDIATE;\nSELECT 'locked';\n");
    await withTimeout(locked, 6000, 'the write lock');
    const exited = new Promise((r) => child.once('exit', r));
    return {
        async release() {
            child.stdin.end('ROLLBACK;\n.quit\n');
            await withTimeout(exited, 5000, 'sqlite3 exit');
        },
    };
}

const words = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta'];

/** The n-th request of client c in a trial: streamed every other one, keyed every third. */
function requestOf(trial, c, n) {
    const m = 1 + ((c + n) % words.length); // the prompt's word count varies the cost
    const body = {
        model: 'chat',
        messages: [{ role: 'user', content: words.slice(0, m).join(' ') }],
        stream: n % 2 === 1,
    };
    if (n % 3 !== 2) body.idempotency_key = `durable-${process.pid}-${trial}-${c}-${n}`;
    return { body, expectedCost: (m + 5) * PRICE * 1000 }; // the mock answers 5 tokens
}

/** The cost an answer acknowledges: its usage x the price. */
function costOf(text, stream) {
    let usage = null;
    if (!stream) {
        usage = JSON.parse(text).usage;
    } else {
        for (const block of text.split('\n\n')) {
            if (!block.startsWith('data: {')) continue;
            const ev = JSON.parse(block.slice(6));
            if (ev.usage) usage = ev.usage;
        }
    }
    return usage ? (usage.prompt_tokens + usage.completion_tokens) * PRICE * 1000 : null;
}

/** A client sending requests back to back until stopped or the gateway dies. */
async function runClient(base, trial, c, state, logs = []) {
    const log = [];
    logs.push(log);
    for (let n = 0; !state.stop; n++) {
        const { body, expectedCost } = requestOf(trial, c, n);
        const rec = { n, body, expectedCost, acked: false };
        log.push(rec);
        try {
            const r = await fetch(`${base}/v1/chat/completions`, {
                method: 'POST',
                headers: { 'content-type': 'application/json', authorization: `Bearer ${keys[c].key}` },
                body: JSON.stringify(body),
                signal: AbortSignal.timeout(15000),
            });
            rec.status = r.status;
            rec.text = await r.text(); // resolves only once the whole body (and its end) arrived
            rec.acked = r.status === 200 && (!body.stream || rec.text.endsWith('data: [DONE]\n\n'));
            if (r.status !== 200) state.failures.push(`${r.status} ${rec.text.slice(0, 200)}`);
        } catch {
            break; // the gateway died mid-request: this one is not acknowledged
        }
        if (rec.acked) rec.cost = costOf(rec.text, body.stream);
    }
    return log;
}

/** Replay a request with its idempotency key; { status, replayed, text }. */
async function replay(base, c, rec) {
    const r = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${keys[c].key}` },
        body: JSON.stringify(rec.body),
        signal: AbortSignal.timeout(10000),
    });
    return { status: r.status, replayed: r.headers.get('idempotent-replayed'), text: await r.text() };
}

async function kill9(gw) {
    gw.child.kill('SIGKILL');
    await gw.waitExit(5000);
}

/**
 * Every client's spend went up by exactly its acknowledged requests' costs, plus at most its
 * one unacknowledged request; the last acknowledged idempotent requests replay as they were
 * and charge nothing. Returns the spend after the checks (the next trial's baseline).
 */
async function verify(gw, what, logs, before) {
    const after = spendByKey();
    for (let c = 0; c < CLIENTS; c++) {
        const log = logs[c];
        const acked = log.filter((r) => r.acked);
        for (const r of acked) assert.equal(r.cost, r.expectedCost, `${what}: client ${c} request ${r.n}: usage as expected`);
        const ackedCost = acked.reduce((a, r) => a + r.cost, 0);
        const pending = log.filter((r) => !r.acked);
        assert.ok(pending.length <= 1, `${what}: client ${c}: requests are sequential`);
        const delta = after.get(keys[c].id) - before.get(keys[c].id);
        const allowed = [ackedCost, ...pending.map((r) => ackedCost + r.expectedCost)];
        assert.ok(allowed.includes(delta),
            `${what}: client ${c}: spend rose by ${delta} micros; its ${acked.length} acknowledged requests cost ` +
            `${ackedCost}${pending.length ? ` (+${pending[0].expectedCost} if the one in flight was charged)` : ''}`);
    }
    for (let c = 0; c < CLIENTS; c++) {
        const keyed = logs[c].filter((r) => r.acked && r.body.idempotency_key).slice(-2);
        for (const r of keyed) {
            const again = await replay(gw.base, c, r);
            assert.equal(again.status, 200, `${what}: replay of client ${c} request ${r.n}: ${again.text.slice(0, 200)}`);
            assert.equal(again.replayed, 'true', `${what}: client ${c} request ${r.n} was acknowledged, so it replays`);
            assert.equal(again.text, r.text, `${what}: the replay is the acknowledged answer`);
        }
    }
    const replayed = spendByKey();
    for (const k of keys) assert.equal(replayed.get(k.id), after.get(k.id), `${what}: a replay charges nothing`);
    return replayed;
}

describe('acknowledged means durable', () => {
    test(`kill -9 at a random moment under load, ${TRIALS} trials: no acknowledged spend or idempotency record is lost`, async () => {
        let gw = env.gw;
        let before = spendByKey();
        let acked = 0;
        for (let trial = 0; trial < TRIALS; trial++) {
            const state = { stop: false, failures: [] };
            const clients = keys.map((_, c) => runClient(gw.base, trial, c, state));
            // every third trial, another connection holds the write lock for a while
            let lock = null;
            const locking = trial % 3 === 1
                ? sleep(Math.random() * 100).then(async () => {
                    lock = await holdWriteLock();
                })
                : Promise.resolve();
            await sleep(60 + Math.random() * 300);
            await locking;
            await kill9(gw);
            const logs = await withTimeout(Promise.all(clients), 10000, 'clients after the kill');
            if (lock) await lock.release();
            assert.deepEqual(state.failures, [], `trial ${trial}: no request failed before the kill`);
            gw = await startGateway(env.configPath, { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
            env.gw = gw;
            env.base = gw.base;
            before = await verify(gw, `trial ${trial}${trial % 3 === 1 ? ' (write lock held)' : ''}`, logs, before);
            acked += logs.reduce((a, l) => a + l.filter((r) => r.acked).length, 0);
        }
        assert.ok(acked >= TRIALS * CLIENTS, `the trials acknowledged ${acked} requests in all`);
    });

    test('another connection holds the write lock for 1.5 s: requests wait, then complete; nothing is lost', async () => {
        // a queue of 2 writes: most of the held spend and idempotency writes park on the loop side
        env.config.storage.queue_max = 2;
        env.writeConfig(env.config);
        await kill9(env.gw);
        const gw = await startGateway(env.configPath, { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
        env.gw = gw;
        env.base = gw.base;
        const before = spendByKey();
        const lock = await holdWriteLock();
        const state = { stop: false, failures: [] };
        const logsSoFar = [];
        const clients = keys.map((_, c) => runClient(gw.base, 1000, c, state, logsSoFar));
        await sleep(1500);
        const metricsDuring = await gw.metrics();
        // nothing could commit, so no answer may have ended: each would acknowledge a record
        // that a kill -9 now would lose
        const ackedDuring = logsSoFar.flat().filter((r) => r.acked).length;
        await lock.release();
        await sleep(300);
        state.stop = true;
        const logs = await withTimeout(Promise.all(clients), 10000, 'clients after the lock');
        assert.deepEqual(state.failures, [], 'no request failed while the database was locked');
        assert.equal(ackedDuring, 0, 'no answer ended while the write lock was held');
        const busy = /^moongate_store_busy_retries_total (\d+)$/m.exec(metricsDuring);
        assert.ok(busy && Number(busy[1]) > 0, `the writer waited for the lock: ${busy?.[0]}`);
        const parked = /^moongate_store_parked (\d+)$/m.exec(metricsDuring);
        assert.ok(parked && Number(parked[1]) > 0, `writes parked behind the full queue: ${parked?.[0]}`);
        const total = logs.reduce((a, l) => a + l.filter((r) => r.acked).length, 0);
        assert.ok(total > CLIENTS, `requests completed after the lock (${total})`);
        // every answer is out: kill at once, nothing may be missing
        await kill9(gw);
        const again = await startGateway(env.configPath, { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
        env.gw = again;
        env.base = again.base;
        for (const l of logs) assert.ok(l.every((r) => r.acked), 'every request was answered in full');
        await verify(again, 'write lock held 1.5 s', logs, before);
    });
});
