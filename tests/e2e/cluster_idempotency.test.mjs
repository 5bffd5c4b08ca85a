// Idempotency keys shared through Redis (issue 24): three moongate instances (each its own
// SQLite) share one real redis-server and one mock engine. The same key sent to every instance
// at once makes one upstream call and every client gets the same answer (the twins on the other
// instances wait for it); a later request with the key, on any instance, is a replay. A stream
// likewise. Redis stopped (SIGSTOP): a new key runs locally (the degraded fallback) within
// timeout_ms; a twin waiting for another instance's answer gets 409 IDEMPOTENCY_IN_PROGRESS,
// never a second upstream call. An instance killed while running a key: its claim expires and
// a twin elsewhere runs the key.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import OpenAI from 'openai';

import { REPO_ROOT, buildConfig, deadPort, sseData, startMock, waitFor } from './lib/harness.mjs';
import { closeInstances, startInstances } from './lib/instances.mjs';
import { startRedis } from './lib/redis.mjs';

const N = 3;
const TIMEOUT_MS = 100;
const TOTAL_MS = 2000; // with the queue's 500 ms and 5 s of slack: a claim lives 7.5 s
const QUEUE_MS = 500;

let redis;
let mock;
const dirs = [];
const gws = [];
const tag = `${process.pid}-${Date.now()}`;

function config(dir, i, dead) {
    const lua = { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') };
    const c = buildConfig(dir, mock.port, dead, { lua, timeouts: { total_ms: TOTAL_MS, max_total_ms: TOTAL_MS } });
    return {
        ...c,
        health: { probes: false },
        routing: { ...(c.routing ?? {}), queue_timeout_ms: QUEUE_MS },
        models: {
            chat: { tokenizer: 'estimate', routes: [{ provider: 'mock-openai', model: 'up-chat' }] },
            slow: { tokenizer: 'estimate', routes: [{ provider: 'mock-openai', model: 'up-slow' }] },
        },
        cluster: { node_id: `node-${i}`, redis: { url: redis.url, timeout_ms: TIMEOUT_MS } },
    };
}

const status = async (i) => (await fetch(`${gws[i].base}/status`)).json();
const redisCli = (...args) => execFileSync('redis-cli', ['-p', String(redis.port), ...args], { encoding: 'utf8' }).trim();

async function send(i, key, content, { model = 'chat', stream = false, timeoutMs = 10000 } = {}) {
    const t0 = performance.now();
    const r = await fetch(`${gws[i].base}/v1/chat/completions`, {
        method: 'POST',
        // the same credential as the SDK's: one scope (open mode: the application + the credential)
        headers: { 'content-type': 'application/json', 'idempotency-key': key, authorization: 'Bearer unused' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content }], max_tokens: 8, stream }),
        signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* a stream */ }
    return { status: r.status, text, json, replayed: r.headers.get('idempotent-replayed'), node: json?.node_id, ms: performance.now() - t0 };
}

const upstreamCalls = async (content) => (await mock.requests((q) => q.body?.messages?.[0]?.content === content)).length;

before(async () => {
    redis = await startRedis();
    mock = await startMock();
    // a slow answer: the twins arrive while it runs
    await mock.script({ model: 'up-slow', action: { delay_first_byte_ms: 600 } });
    const dead = await deadPort();
    const up = await startInstances(N, 'cidem', (dir, i) => config(dir, i, dead));
    dirs.push(...up.dirs);
    gws.push(...up.gws);
    for (let i = 0; i < N; i++)
        await waitFor(async () => (await status(i)).cluster.redis.state === 'up', { what: `node-${i} redis up` });
});

after(async () => {
    await closeInstances(gws, dirs);
    await mock?.close().catch(() => {});
    await redis?.stop();
});

describe('idempotency keys shared through redis', () => {
    test('twins on three instances at once: one upstream call, one answer; replayed from any instance', async () => {
        const RUNS = 5;
        let calls = 0;
        for (let run = 0; run < RUNS; run++) {
            const key = `twins-${tag}-${run}`;
            const content = `twins ${tag} ${run}`;
            // two requests per instance, all at once
            const rs = await Promise.all([0, 1, 2, 0, 1, 2].map((i) => send(i, key, content, { model: 'slow' })));
            for (const r of rs) assert.equal(r.status, 200, r.text);
            const bodies = new Set(rs.map((r) => r.text));
            assert.equal(bodies.size, 1, 'every twin has the same answer (same id, request_id, node_id)');
            calls += await upstreamCalls(content);
            assert.equal(await upstreamCalls(content), 1, `run ${run}: one upstream call for six twins on ${N} instances`);
            // afterwards, any instance replays it
            for (let i = 0; i < N; i++) {
                const again = await send(i, key, content, { model: 'slow' });
                assert.equal(again.status, 200);
                assert.equal(again.text, rs[0].text);
                assert.equal(again.replayed, 'true');
                assert.ok(again.ms < 300, `a replay does not wait for the engine (${again.ms.toFixed(0)} ms)`);
            }
            assert.equal(await upstreamCalls(content), 1);
        }
        console.log(`${RUNS} keys x 6 twins on ${N} instances: ${calls} upstream calls`);
        const sts = await Promise.all([0, 1, 2].map(status));
        const sum = (f) => sts.reduce((n, s) => n + s.cluster.redis.idempotency[f], 0);
        assert.equal(sum('claimed'), RUNS, 'each key was claimed once in the cluster');
        assert.ok(sum('stored') >= RUNS);
        assert.ok(sum('twins') >= 1, 'some instance waited for another\'s run');
    });

    test('a stream through the openai SDK: twins on two instances, one call, the same events', async () => {
        const key = `stream-${tag}`;
        const content = `stream ${tag}`;
        const clients = [0, 1].map((i) => new OpenAI({ baseURL: `${gws[i].base}/v1`, apiKey: 'unused', maxRetries: 0 }));
        const collect = async (client) => {
            const s = await client.chat.completions.create(
                { model: 'slow', stream: true, messages: [{ role: 'user', content }], max_tokens: 8 },
                { headers: { 'Idempotency-Key': key } },
            );
            const parts = [];
            for await (const ch of s) parts.push(JSON.stringify(ch));
            return parts;
        };
        const [a, b] = await Promise.all(clients.map(collect));
        assert.ok(a.length > 1);
        assert.deepEqual(a, b, 'the same stream, frame by frame');
        assert.equal(await upstreamCalls(content), 1);
        const again = await send(2, key, content, { model: 'slow', stream: true });
        assert.equal(again.replayed, 'true');
        assert.equal(sseData(again.text).at(-1), '[DONE]');
        assert.equal(await upstreamCalls(content), 1);
    });

    test('the answer in redis has the idempotency TTL; the scope and key are not in the clear', async () => {
        const key = `ttl-${tag}`;
        const r = await send(0, key, `ttl ${tag}`);
        assert.equal(r.status, 200);
        const keys = redisCli('--scan', '--pattern', 'moongate:idem:*').split('\n');
        assert.ok(keys.every((k) => /^moongate:idem:[0-9a-f]{64}$/.test(k)), keys.join(','));
        assert.ok(!redisCli('--scan', '--pattern', `*${key}*`));
        const ttls = keys.map((k) => Number(redisCli('PTTL', k)));
        assert.ok(ttls.every((t) => t > 0), 'every record expires');
    });

    test('redis stopped: a new key runs locally within timeout_ms; a twin of a remote run gets 409', async () => {
        // a run claimed on node-0, its twin waiting on node-1
        const key = `stop-${tag}`;
        const content = `stop ${tag}`;
        const owner = send(0, key, content, { model: 'slow' });
        await mock.waitRequest((q) => q.body?.messages?.[0]?.content === content, { what: 'the owner\'s upstream call' });
        const twin = send(1, key, content, { model: 'slow' });
        await new Promise((res) => setTimeout(res, 100)); // it is polling
        redis.pause();
        try {
            const t = await twin;
            assert.equal(t.status, 409, t.text);
            assert.equal(t.json.error.code, 'IDEMPOTENCY_IN_PROGRESS');
            assert.ok(t.ms < 100 + 600 + 2 * TIMEOUT_MS + 200, `the twin was told at once (${t.ms.toFixed(0)} ms)`);
            assert.equal((await owner).status, 200);
            assert.equal(await upstreamCalls(content), 1, 'never a second upstream call');
            // a new key: local, as a single node
            const fresh = await send(2, `fresh-${tag}`, `fresh ${tag}`);
            assert.equal(fresh.status, 200);
            assert.ok(fresh.ms < TIMEOUT_MS + 500, `within timeout_ms (${fresh.ms.toFixed(0)} ms)`);
            // and replayed locally while redis is still away
            const again = await send(2, `fresh-${tag}`, `fresh ${tag}`);
            assert.equal(again.replayed, 'true');
            assert.ok((await status(1)).cluster.redis.idempotency.conflicts >= 1);
        } finally {
            redis.resume();
        }
        for (let i = 0; i < N; i++)
            await waitFor(async () => (await status(i)).cluster.redis.state === 'up', { what: `node-${i} redis up again` });
        // back: the owner's answer reached redis (or is put there by the next run); node-1 replays it
        const later = await send(1, key, content, { model: 'slow' });
        assert.equal(later.status, 200);
        assert.equal(await upstreamCalls(content), 1, 'the key still ran once');
    });

    test('an instance killed while running a key: its claim expires, a twin elsewhere runs it', async () => {
        const key = `kill-${tag}`;
        const content = `kill ${tag}`;
        const doomed = send(2, key, content, { model: 'slow' }).catch(() => 'gone');
        await mock.waitRequest((q) => q.body?.messages?.[0]?.content === content, { what: 'the doomed upstream call' });
        gws[2].child.kill('SIGKILL');
        assert.equal(await doomed, 'gone');
        const claims = redisCli('--scan', '--pattern', 'moongate:idem:*').split('\n')
            .filter((k) => redisCli('GET', k) === 'P\nnode-2');
        assert.equal(claims.length, 1, 'the dead instance\'s claim is in redis');
        const claimTtl = Number(redisCli('PTTL', claims[0]));
        const t0 = performance.now();
        const twin = await send(0, key, content, { model: 'slow', timeoutMs: 20000 });
        const waited = performance.now() - t0;
        console.log(`the killed instance's claim (pttl ${claimTtl} ms) freed the key after ${waited.toFixed(0)} ms`);
        assert.equal(twin.status, 200, twin.text);
        assert.equal(twin.replayed, null);
        assert.equal(await upstreamCalls(content), 2, 'the dead run and the twin\'s own');
        assert.ok(waited < TOTAL_MS + QUEUE_MS + 5000 + 1500);
    });
});
