// Idempotency keys past the in-memory cap (issue 16, item 9): with idempotency.max_entries: 2
// the gateway keeps two stored answers in memory; older keys are read back from the store, so
// a replay after eviction (and after a restart, which loads only the newest) still replays the
// stored answer and never runs the request again.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, startGateway, sseData } from './lib/harness.mjs';

let env;

before(async () => {
    env = await startEnv({ idempotency: { ttl_seconds: 600, max_entries: 2 } });
});

after(async () => {
    await env?.close();
});

const tag = `${process.pid}-${Date.now()}`;

function body(i, stream = false) {
    return {
        model: 'chat',
        messages: [{ role: 'user', content: `idempotent ${tag} number ${i}` }],
        stream,
        idempotency_key: `cap-${tag}-${i}`,
    };
}

async function send(i, stream = false) {
    const r = await fetch(`${env.gw.base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body(i, stream)),
        signal: AbortSignal.timeout(10000),
    });
    return { status: r.status, replayed: r.headers.get('idempotent-replayed'), text: await r.text() };
}

/** How often the mock saw request i. */
async function upstreamRuns(i) {
    const want = `idempotent ${tag} number ${i}`;
    return (await env.mock.requests((q) => q.body?.messages?.[0]?.content === want)).length;
}

describe('idempotency.max_entries', () => {
    const first = new Map();

    test('keys beyond the cap still replay: the evicted ones are read from the store', async () => {
        for (let i = 0; i < 6; i++) {
            const r = await send(i, i === 0);
            assert.equal(r.status, 200, r.text);
            assert.equal(r.replayed, null, `key ${i} runs the first time`);
            first.set(i, r.text);
        }
        assert.equal(sseData(first.get(0)).at(-1), '[DONE]');
        for (const i of [0, 1, 5, 2]) { // 0-3 were pushed out of memory; 5 is still there
            const again = await send(i, i === 0);
            assert.equal(again.status, 200, again.text);
            assert.equal(again.replayed, 'true', `key ${i} replays`);
            assert.equal(again.text, first.get(i), `key ${i}: the stored answer`);
            assert.equal(await upstreamRuns(i), 1, `key ${i} ran upstream once`);
        }
    });

    test('after a restart (which loads only the newest two) every key still replays', async () => {
        env.gw.term();
        await env.gw.waitExit(10000);
        env.gw = await startGateway(env.configPath);
        for (const i of [3, 0, 4]) {
            const again = await send(i, i === 0);
            assert.equal(again.replayed, 'true', `key ${i} replays after the restart`);
            assert.equal(again.text, first.get(i));
            assert.equal(await upstreamRuns(i), 1, `key ${i} ran upstream once`);
        }
    });
});

// One key, one request id (issue 16, item 10): the first answer, a twin that waited for it and
// every replay carry the run's request id in X-Request-Id, in the body and in the log, and
// every replay writes a log line of its own.
describe('the request id of an idempotent answer', () => {
    async function post(i, stream = false) {
        const r = await fetch(`${env.gw.base}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify(body(i, stream)),
            signal: AbortSignal.timeout(10000),
        });
        return { id: r.headers.get('x-request-id'), replayed: r.headers.get('idempotent-replayed'), text: await r.text() };
    }
    const bodyId = (r, stream) => JSON.parse(stream ? sseData(r.text)[0] : r.text).request_id;

    for (const stream of [false, true]) {
        test(`header, body and log agree, first and replayed${stream ? ' (stream)' : ''}`, async () => {
            const i = stream ? 'rid-stream' : 'rid-json';
            await env.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 300 } });
            const [first, twin] = await Promise.all([post(i, stream), post(i, stream)]);
            const replay = await post(i, stream);
            assert.equal(first.id, bodyId(first, stream), 'first: X-Request-Id is the body\'s request_id');
            assert.equal(twin.id, first.id, 'the twin that waited carries the run\'s id');
            assert.equal(replay.replayed, 'true');
            assert.equal(replay.id, first.id, 'the replay carries the run\'s id');
            assert.equal(bodyId(replay, stream), first.id);
            for (const outcome of ['ok', 'idempotent_twin', 'idempotent_replay'])
                await env.gw.waitLog((l) => l.msg === 'request' && l.request_id === first.id && l.outcome === outcome,
                    { what: `the ${outcome} line of ${first.id}` });
        });
    }
});
