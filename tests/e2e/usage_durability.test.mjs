// Durable usage events (issue 19): a request whose client received its complete answer has
// its usage event in the database, whatever happens next. The gateway holds the answer's
// last bytes until the event's transaction committed (obs/usage.h), so a kill -9 at any
// moment loses none of them.
//
// kill -9 trials under load: clients send requests back to back (streamed and not, chat and
// embeddings); at a random moment the gateway is killed with SIGKILL; after a restart on the
// same database every acknowledged request (status 200, the whole body, a stream's [DONE])
// has exactly one event, and the roll-ups still equal the raw events' sums.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { startEnv, startGateway, sleep, withTimeout } from './lib/harness.mjs';

const CLIENTS = 6;
const TRIALS = Number(process.env.MOONGATE_USAGE_TRIALS ?? 20);

let env;
let dbPath;

before(async () => {
    env = await startEnv({ configure: (c) => ({ ...c, health: { probes: false } }) });
    dbPath = env.config.storage.path;
});

after(async () => {
    await env?.close();
});

function query(sql) {
    const out = execFileSync('sqlite3', ['-json', '-cmd', '.timeout 5000', dbPath, sql], { encoding: 'utf8', timeout: 10000 });
    return out.trim() ? JSON.parse(out) : [];
}

function requestOf(c, n) {
    if (n % 5 === 4) return { path: 'embeddings', body: { model: 'embed', input: `client ${c} item ${n}` } };
    return { path: 'chat/completions', body: { model: 'chat', messages: [{ role: 'user', content: `client ${c} says ${n}` }], stream: n % 2 === 1 } };
}

async function runClient(base, c, state) {
    const log = [];
    for (let n = 0; !state.stop; n++) {
        const { path, body } = requestOf(c, n);
        const rec = { n, acked: false };
        log.push(rec);
        try {
            const r = await fetch(`${base}/v1/${path}`, {
                method: 'POST', headers: { 'content-type': 'application/json' },
                body: JSON.stringify(body), signal: AbortSignal.timeout(15000),
            });
            rec.id = r.headers.get('x-request-id');
            const text = await r.text(); // resolves once the whole body (and its end) arrived
            rec.acked = r.status === 200 && (!body.stream || text.endsWith('data: [DONE]\n\n'));
            if (r.status !== 200) state.failures.push(`${r.status} ${text.slice(0, 200)}`);
        } catch {
            break; // the gateway died mid-request: not acknowledged
        }
    }
    return log;
}

describe('acknowledged means metered', () => {
    test(`kill -9 at a random moment under load, ${TRIALS} trials: no acknowledged request loses its usage event`, async () => {
        let gw = env.gw;
        let acked = 0;
        for (let trial = 0; trial < TRIALS; trial++) {
            const state = { stop: false, failures: [] };
            const clients = Array.from({ length: CLIENTS }, (_, c) => runClient(gw.base, c, state));
            await sleep(80 + Math.random() * 300);
            gw.child.kill('SIGKILL');
            await gw.waitExit(5000);
            const logs = await withTimeout(Promise.all(clients), 10000, 'clients after the kill');
            assert.deepEqual(state.failures, [], `trial ${trial}: no request failed before the kill`);
            const ids = logs.flat().filter((r) => r.acked).map((r) => r.id);
            assert.ok(ids.every((id) => /^[A-Za-z0-9_-]+$/.test(id)), 'request ids are plain');
            const found = new Set();
            for (let i = 0; i < ids.length; i += 200) {
                const list = ids.slice(i, i + 200).map((id) => `'${id}'`).join(',');
                for (const r of query(`SELECT request_id FROM usage_events WHERE request_id IN (${list})`)) found.add(r.request_id);
            }
            const lost = ids.filter((id) => !found.has(id));
            assert.deepEqual(lost, [], `trial ${trial}: ${lost.length} of ${ids.length} acknowledged requests lost their event`);
            acked += ids.length;
            gw = await startGateway(env.configPath);
            env.gw = gw;
        }
        assert.ok(acked >= TRIALS * CLIENTS, `the trials acknowledged ${acked} requests in all`);
        const ev = query('SELECT COUNT(*) AS n, SUM(cost_micros) AS c, SUM(input_tokens) AS i, SUM(output_tokens) AS o FROM usage_events')[0];
        const h = query('SELECT SUM(requests) AS n, SUM(cost_micros) AS c, SUM(input_tokens) AS i, SUM(output_tokens) AS o FROM usage_hourly')[0];
        assert.deepEqual(h, ev, 'the hourly roll-up equals the raw events after every kill');
    });
});
