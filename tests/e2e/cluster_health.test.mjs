// Route health shared through a bounded Redis stream (issue 24, the design's "共享历史"):
// three moongate instances and one real redis-server. A provider failing on node-a's traffic
// only goes down on node-b and node-c too, which then route away from it; every count is
// exact (an instance never counts its own samples twice); a fresh instance replays the
// stream's history and sees the same health, and so does a restarted one (a new run id: its
// previous run's samples are replayed, not skipped); Redis killed: every instance keeps
// serving on its own samples (one log line), and sharing resumes once Redis is back.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
    REPO_ROOT, buildConfig, deadPort, postJson, postStream, sleep, startGateway, startMock, toYaml,
    waitFor,
} from './lib/harness.mjs';
import { startRedis } from './lib/redis.mjs';

const NAMES = ['a', 'b', 'c'];
const TTFT_MS = 40; // the steady provider's first chunk waits this long

let redis;
let mock;
let dead;
const dirs = {};
const gws = {};

function config(dir, name, redisExtra = {}) {
    const lua = { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') };
    const m = `http://127.0.0.1:${mock.port}/v1`;
    const c = buildConfig(dir, mock.port, dead, { lua });
    return {
        ...c,
        health: { probes: false, retry_down_ms: 600000 }, // no trial request within the test
        // the breakers kept out of the way: health alone decides here
        circuit_breaker: { consecutive_failures: 1000, min_requests: 1000000 },
        providers: [{ id: 'flaky', adapter: 'openai', base_url: m }, { id: 'steady', adapter: 'openai', base_url: m }],
        models: {
            // node-a's traffic only: one route, the provider failing
            'a-only': { tokenizer: 'estimate', routes: [{ provider: 'flaky', model: 'up-flaky-a' }] },
            // the others': two routes of the same priority
            mixed: {
                tokenizer: 'estimate',
                routes: [{ provider: 'flaky', model: 'up-flaky-m' }, { provider: 'steady', model: 'up-steady' }],
            },
        },
        cluster: { node_id: `node-${name}`, redis: { url: redis.url, timeout_ms: 200, ...redisExtra } },
    };
}

async function start(name, redisExtra) {
    if (!dirs[name]) dirs[name] = await fsp.mkdtemp(path.join(os.tmpdir(), `moongate-e2e-health-${name}-`));
    const p = path.join(dirs[name], 'moongate.yaml');
    await fsp.writeFile(p, toYaml(config(dirs[name], name, redisExtra)));
    gws[name] = await startGateway(p);
    return gws[name];
}

const status = async (n) => (await fetch(`${gws[n].base}/status`)).json();
const samples = async (n) => (await status(n)).cluster.redis.health_samples;
const provider = async (n, id) => (await status(n)).providers.find((p) => p.id === id);
const sentTo = async (model) => (await mock.requests()).filter((x) => x.body?.model === model).length;

async function chat(n, model) {
    return postJson(`${gws[n].base}/v1/chat/completions`, { model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 });
}

async function stream(n, model) {
    const r = await postStream(`${gws[n].base}/v1/chat/completions`,
        { model, stream: true, messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 });
    assert.equal(r.status, 200, r.text);
    assert.ok(r.data.includes('[DONE]'), r.text);
}

/** Waits until instance n's counters are `want`, then checks they stay so a while (exact). */
async function countsAre(n, want, what) {
    const pick = (s) => Object.fromEntries(Object.keys(want).map((k) => [k, s[k]]));
    await waitFor(async () => JSON.stringify(pick(await samples(n))) === JSON.stringify(want),
        { timeoutMs: 5000, what: `${what}: ${JSON.stringify(want)}` }).catch(async (e) => {
        throw new Error(`${e.message}; node-${n} has ${JSON.stringify(await samples(n))}`);
    });
    await sleep(600); // three read ticks: nothing more comes
    assert.deepEqual(pick(await samples(n)), want, `${what}, still`);
}

before(async () => {
    redis = await startRedis();
    mock = await startMock();
    await mock.script({ model: 'up-flaky-a', action: { status: 500 } });
    await mock.script({ model: 'up-steady', action: { delay_first_chunk_ms: TTFT_MS } });
    dead = await deadPort();
    await Promise.all(NAMES.map(start));
    for (const n of NAMES) { // the (empty) history read: what comes next is heard, not replayed
        await waitFor(async () => (await status(n)).cluster.redis.state === 'up', { what: `node-${n} redis up` });
        await gws[n].waitLog((l) => l.msg === 'health samples replayed', { what: `node-${n} replayed` });
    }
});

after(async () => {
    for (const g of Object.values(gws)) await g.close().catch(() => {});
    await mock?.close().catch(() => {});
    await redis?.stop();
    if (!process.env.MOONGATE_E2E_KEEP) for (const d of Object.values(dirs)) await fsp.rm(d, { recursive: true, force: true }).catch(() => {});
});

describe('route health shared through redis', () => {
    test('a provider failing on node-a\'s traffic goes down on node-b and node-c, which route away', async () => {
        for (let i = 0; i < 10; i++) assert.equal((await chat('a', 'a-only')).status, 502);
        const t0 = performance.now();
        const fa = await provider('a', 'flaky');
        assert.equal(fa.health, 'down');
        assert.equal(fa.samples_5m, 10);
        for (const n of ['b', 'c']) {
            await waitFor(async () => (await provider(n, 'flaky')).health === 'down',
                { timeoutMs: 3000, intervalMs: 10, what: `flaky down on node-${n}` });
        }
        const ms = performance.now() - t0;
        for (const n of ['b', 'c']) {
            const f = await provider(n, 'flaky');
            assert.equal(f.samples_5m, 10);
            assert.equal(f.success_rate_5m, 0);
            assert.equal(f.requests_total, 0, 'node-' + n + ' sent it nothing');
            assert.equal(f.cooldown_remaining_ms, 0, 'health, not a cooldown');
        }
        await countsAre('a', { added: 10, dropped: 0, heard: 0, replayed: 0 }, 'node-a');
        console.log(`flaky down on node-b and node-c ${ms.toFixed(0)} ms after node-a's 10th failure`);
        // node-b and node-c route their traffic away from it; streams: their TTFT is shared too
        for (let i = 0; i < 10; i++) {
            await stream('b', 'mixed');
            await stream('c', 'mixed');
        }
        assert.equal(await sentTo('up-flaky-m'), 0, 'no request went to the down provider');
        assert.equal(await sentTo('up-steady'), 20);
    });

    test('exact counts: each instance has every sample once, its own never twice', async () => {
        // node-a: its 10 (not heard back) and the others' 20; node-b: node-a's 10 and node-c's 10
        await countsAre('a', { added: 10, heard: 20, replayed: 0, dropped: 0 }, 'node-a');
        await countsAre('b', { added: 10, heard: 20, replayed: 0, dropped: 0 }, 'node-b');
        await countsAre('c', { added: 10, heard: 20, replayed: 0, dropped: 0 }, 'node-c');
        for (const n of NAMES) {
            const f = await provider(n, 'flaky');
            const s = await provider(n, 'steady');
            assert.equal(f.samples_5m, 10, `node-${n} flaky`);
            assert.equal(s.samples_5m, 20, `node-${n} steady`);
            assert.equal(s.success_rate_5m, 1);
            assert.ok(s.ttft_ms_5m >= TTFT_MS, `node-${n} steady ttft ${s.ttft_ms_5m}`);
        }
        const entries = Number(execFileSync('redis-cli', ['-p', String(redis.port), 'XLEN', 'moongate:health'], { encoding: 'utf8' }));
        const ttl = Number(execFileSync('redis-cli', ['-p', String(redis.port), 'TTL', 'moongate:health'], { encoding: 'utf8' }));
        assert.ok(entries >= 3 && entries <= 30, `entries ${entries}: batched`);
        assert.ok(ttl > 250 && ttl <= 300, `ttl ${ttl}`);
    });

    test('a fresh instance replays the history and sees the same health; its own samples count once', async () => {
        const t0 = performance.now();
        await start('d');
        await waitFor(async () => (await samples('d')).replayed === 30, { timeoutMs: 5000, intervalMs: 20, what: 'node-d replayed 30' });
        const line = await gws.d.waitLog((l) => l.msg === 'health samples replayed', { timeoutMs: 2000 });
        console.log(`node-d replayed ${line.samples} samples in ${line.ms} ms (${(performance.now() - t0).toFixed(0)} ms after its start)`);
        const f = await provider('d', 'flaky');
        assert.equal(f.health, 'down');
        assert.equal(f.samples_5m, 10);
        assert.equal(f.success_rate_5m, 0);
        assert.equal((await provider('d', 'steady')).samples_5m, 20);
        for (let i = 0; i < 5; i++) assert.equal((await chat('d', 'mixed')).status, 200);
        assert.equal(await sentTo('up-flaky-m'), 0, 'node-d routes away from it as well');
        await countsAre('d', { added: 5, heard: 0, replayed: 30, dropped: 0 }, 'node-d');
        assert.equal((await provider('d', 'steady')).samples_5m, 25);
        await countsAre('a', { heard: 25 }, 'node-a hears node-d');
    });

    test('a restarted instance replays its previous run\'s samples too (a new run id)', async () => {
        await gws.a.close();
        await start('a');
        // node-a's own 10 of its last run, node-b's and node-c's 20, node-d's 5
        await waitFor(async () => (await samples('a')).replayed === 35, { timeoutMs: 5000, intervalMs: 20, what: 'node-a replayed 35' });
        await countsAre('a', { added: 0, heard: 0, replayed: 35, dropped: 0 }, 'restarted node-a');
        const f = await provider('a', 'flaky');
        assert.equal(f.health, 'down');
        assert.equal(f.samples_5m, 10);
        assert.equal((await provider('a', 'steady')).samples_5m, 25);
    });

    test('redis killed: every instance serves on its own samples; back: sharing resumes', async () => {
        const port = redis.port;
        const from = gws.b.logs.length;
        await redis.stop();
        redis = null;
        for (const n of ['b', 'c']) await waitFor(async () => (await status(n)).cluster.redis.state === 'degraded', { what: `node-${n} degraded` });
        const before_ = await samples('b');
        for (let i = 0; i < 5; i++) assert.equal((await chat('b', 'mixed')).status, 200);
        await waitFor(async () => (await samples('b')).dropped === before_.dropped + 5, { what: 'node-b dropped 5' });
        assert.equal((await samples('b')).added, before_.added);
        assert.equal((await provider('b', 'steady')).samples_5m, 30, 'its own still count');
        await gws.b.waitLog((l) => l.msg === 'health samples local only', { from, timeoutMs: 2000 });
        redis = await startRedis({ port });
        for (const n of ['b', 'c']) await waitFor(async () => (await status(n)).cluster.redis.state === 'up', { timeoutMs: 15000, what: `node-${n} up again` });
        const heardB = (await samples('b')).heard;
        for (let i = 0; i < 4; i++) assert.equal((await chat('c', 'mixed')).status, 200);
        await countsAre('b', { heard: heardB + 4 }, 'node-b hears node-c again');
        const lost = gws.b.logs.slice(from).filter((l) => l.msg === 'health samples local only');
        assert.equal(lost.length, 1, 'one line for the outage, not one per flush');
        await gws.b.waitLog((l) => l.msg === 'health samples shared', { from, timeoutMs: 2000 });
    });

    test('cluster.redis.health_samples: false: neither shared nor heard', async () => {
        await start('e', { health_samples: false });
        await waitFor(async () => (await status('e')).cluster.redis.state === 'up', { what: 'node-e redis up' });
        const heardC = (await samples('c')).heard;
        for (let i = 0; i < 3; i++) assert.equal((await chat('e', 'mixed')).status, 200);
        await sleep(600); // three read ticks of the others
        assert.deepEqual(await samples('e'), { added: 0, dropped: 0, heard: 0, replayed: 0 });
        assert.equal((await samples('c')).heard, heardC, 'node-c heard nothing of node-e');
        // its own three only; the provider down elsewhere is healthy here
        const f = await provider('e', 'flaky');
        assert.equal(f.health, 'healthy');
        assert.equal(f.samples_5m + (await provider('e', 'steady')).samples_5m, 3);
    });
});
