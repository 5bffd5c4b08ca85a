// Durable usage events (issue 19): a request whose client received its complete answer has
// its usage event in the database, whatever happens next. The gateway holds the answer's
// last bytes until the event is in the usage journal or its transaction committed
// (obs/usage.h), so a kill -9 at any moment loses none of them: the restart replays the
// journal before serving.
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
            // the restart replays the usage journal (store.h) before it serves: an event
            // acknowledged from the journal is in the database from then on
            gw = await startGateway(env.configPath);
            env.gw = gw;
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
        }
        assert.ok(acked >= TRIALS * CLIENTS, `the trials acknowledged ${acked} requests in all`);
        const ev = query('SELECT COUNT(*) AS n, SUM(cost_micros) AS c, SUM(input_tokens) AS i, SUM(output_tokens) AS o FROM usage_events')[0];
        const h = query('SELECT SUM(requests) AS n, SUM(cost_micros) AS c, SUM(input_tokens) AS i, SUM(output_tokens) AS o FROM usage_hourly')[0];
        assert.deepEqual(h, ev, 'the hourly roll-up equals the raw events after every kill');
    });
});

/** Every roll-up against the sums of the raw events: per hour bucket, per histogram kind,
 *  per provider and model, per day and pool. */
function checkRollups(what) {
    const hourlyEv = query(`SELECT hour, COUNT(*) AS requests, SUM(input_tokens) AS input, SUM(output_tokens) AS output,
        SUM(cost_micros) AS cost, SUM(status IN ('failed','timed_out')) AS errors, SUM(latency_ms) AS latency
        FROM (SELECT *, at_ms / 3600000 * 3600 AS hour FROM usage_events) GROUP BY hour ORDER BY hour`);
    const hourly = query(`SELECT hour, SUM(requests) AS requests, SUM(input_tokens) AS input, SUM(output_tokens) AS output,
        SUM(cost_micros) AS cost, SUM(errors) AS errors, SUM(latency_ms_sum) AS latency FROM usage_hourly GROUP BY hour ORDER BY hour`);
    assert.deepEqual(hourly, hourlyEv, `${what}: usage_hourly`);
    const n = query('SELECT COUNT(*) AS n FROM usage_events')[0].n;
    const lat = query("SELECT COALESCE(SUM(n), 0) AS n FROM usage_hist WHERE kind = 'latency'")[0].n;
    assert.equal(lat, n, `${what}: one latency sample per event`);
    const pe = query(`SELECT provider_id, COALESCE(actual_model,'unknown') AS model, COUNT(*) AS requests, SUM(cost_micros) AS cost,
        SUM(input_tokens + cached_read_tokens + cache_write_tokens) AS prompt
        FROM usage_events WHERE provider_id IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2`);
    const pb = query(`SELECT provider_id, model, SUM(request_count) AS requests, SUM(cost_micros) AS cost, SUM(prompt_tokens) AS prompt
        FROM provider_usage_logs GROUP BY 1, 2 ORDER BY 1, 2`);
    assert.deepEqual(pb, pe, `${what}: provider_usage_logs`);
    const de = query(`SELECT date(at_ms / 1000, 'unixepoch') AS date, pool, COUNT(*) AS requests, SUM(cost_micros) AS cost
        FROM usage_events WHERE pool IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2`);
    const ds = query('SELECT date, pool, total_requests AS requests, total_cost_micros AS cost FROM daily_stats ORDER BY 1, 2');
    assert.deepEqual(ds, de, `${what}: daily_stats`);
}

describe('roll-ups written once a second', () => {
    test('kill -9 between two flushes of the roll-ups: after the restart the buckets equal the raw events', async () => {
        let between = 0;
        for (let trial = 0; trial < 10 && between < 3; trial++) {
            const base = env.gw.base;
            const ids = [];
            for (let n = 0; n < 5; n++) {
                const { path, body } = requestOf(trial, n);
                const r = await fetch(`${base}/v1/${path}`, {
                    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
                });
                assert.equal(r.status, 200);
                ids.push(r.headers.get('x-request-id'));
                await r.text();
            }
            env.gw.child.kill('SIGKILL');
            await env.gw.waitExit(5000);
            const list = ids.map((id) => `'${id}'`).join(',');
            const m = query(`SELECT (SELECT seq FROM usage_rollup_mark) AS mark, (SELECT MAX(seq) FROM usage_events) AS last,
                (SELECT COUNT(*) FROM usage_events WHERE request_id IN (${list})) AS stored`)[0];
            // the kill came before the pending sums were written, or before the usage journal
            // was drained (the restart replays it and sums its events)
            if (m.mark < m.last || m.stored < ids.length) between++;
            env.gw = await startGateway(env.configPath);
            const after = query('SELECT (SELECT seq FROM usage_rollup_mark) AS mark, (SELECT MAX(seq) FROM usage_events) AS last')[0];
            assert.equal(after.mark, after.last, `trial ${trial}: the restart summed the events past the watermark`);
            assert.equal(query(`SELECT COUNT(*) AS n FROM usage_events WHERE request_id IN (${list})`)[0].n, ids.length,
                `trial ${trial}: every acknowledged event after the restart`);
            checkRollups(`trial ${trial}`);
        }
        assert.ok(between >= 1, 'at least one kill fell between two flushes');
    });
});
