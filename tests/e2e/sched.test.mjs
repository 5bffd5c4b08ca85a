// The scheduler in the request path: priorities and their ordering (P0 first, aging, P4 idle
// only, reserved realtime slots), per-model max_concurrency, the full queue (429/503
// QUEUE_FULL), the queue timeout (408 QUEUE_TIMEOUT), client disconnects while queued,
// running or streaming, backpressure levels, memory admission's degrade steps (shorter output,
// smaller route, then the queue), the task state log lines, /status and /metrics.
//
// Each describe has its own mock and gateway. The bottleneck is usually model "a" with
// max_concurrency 1 (the global max_running_tasks stays large, so that the running share
// of the load stays low): one task runs on "a", the others wait in the one scheduler queue,
// and because only one runs at a time, the order in which the mock sees the requests is the
// dispatch order. Each request carries a tag as its message text; the mock records it.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, postJson, postStream, sleep, waitFor, RawConn, rawRequest } from './lib/harness.mjs';

const CHAT_PATH = '/v1/chat/completions';

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

/** Models: "a" (max_concurrency 1), "b" (unlimited), "c" (unlimited), all on the mock. */
function schedModels() {
    return {
        a: { max_concurrency: 1, routes: [{ provider: 'mock-openai', model: 'up-a' }] },
        b: { routes: [{ provider: 'mock-openai', model: 'up-b' }] },
        c: { routes: [{ provider: 'mock-openai', model: 'up-c' }] },
    };
}

/** A mock + gateway with the given scheduler section (and timeouts, log). */
function schedEnv({ scheduler, timeouts, log } = {}) {
    return startEnv({
        models: schedModels(),
        timeouts,
        log,
        configure(config) {
            config.scheduler = {
                max_running_tasks: 64,
                max_queued_tasks: 200,
                reserved_realtime_slots: 0,
                ...scheduler,
            };
            return config;
        },
    });
}

function chatBody(model, tag, { priority, stream, extra } = {}) {
    const b = { model, messages: [{ role: 'user', content: tag }], ...extra };
    if (priority !== undefined) b.priority = priority;
    if (stream) b.stream = true;
    return b;
}

/** A non-stream chat request; resolves { status, headers, text, json }. */
function send(env, model, tag, opts = {}) {
    return postJson(`${env.api}/chat/completions`, chatBody(model, tag, opts),
        { headers: opts.headers ?? {}, timeoutMs: opts.timeoutMs ?? 20000 });
}

/** As send(), for requests left pending when a test ends (their failure is expected). */
function sendDetached(env, model, tag, opts = {}) {
    const p = send(env, model, tag, opts);
    p.catch(() => {});
    return p;
}

/** A raw connection with one request written (to disconnect it on purpose). */
async function sendRaw(env, model, tag, opts = {}) {
    const conn = await RawConn.open(env.gw.port);
    await conn.write(rawRequest('POST', CHAT_PATH, { body: chatBody(model, tag, opts) }));
    return conn;
}

const tagOf = (r) => r.body?.messages?.[0]?.content;

/** Chat requests the mock saw, in arrival order. */
async function mockChats(env) {
    const all = await env.mock.requests((r) => r.path === CHAT_PATH);
    return all.sort((x, y) => x.seq - y.seq);
}

async function mockTags(env) {
    return (await mockChats(env)).map(tagOf);
}

function waitMock(env, tag, { timeoutMs = 5000, extra = () => true } = {}) {
    return env.mock.waitRequest((r) => r.path === CHAT_PATH && tagOf(r) === tag && extra(r),
        { timeoutMs, what: `mock request "${tag}"` });
}

async function sched(env) {
    const r = await env.gw.getJson('/status');
    assert.equal(r.status, 200, `/status: ${r.text.slice(0, 200)}`);
    assert.ok(r.json?.scheduler, `/status has "scheduler": ${r.text.slice(0, 300)}`);
    return r.json.scheduler;
}

/** Wait until /status's scheduler satisfies pred; returns it. */
function waitSched(env, pred, what, timeoutMs = 5000) {
    return waitFor(async () => {
        const s = await sched(env);
        return pred(s) ? s : null;
    }, { timeoutMs, intervalMs: 20, what: `scheduler: ${what}` });
}

const waitQueued = (env, n, timeoutMs) => waitSched(env, (s) => s.queued === n, `${n} queued`, timeoutMs);

/** Fresh mock rules and records; the gateway idle (nothing running or queued). */
async function resetAll(env) {
    await waitSched(env, (s) => s.running === 0 && s.queued === 0, 'idle', 10000);
    await env.mock.reset();
}

async function metricsText(env) {
    assert.ok(env.gw.metricsPort, 'the gateway has a metrics listener');
    const r = await env.gw.getJson('/metrics', env.gw.metricsPort);
    assert.equal(r.status, 200);
    return r.text;
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

function stateLines(env, requestId) {
    return env.gw.logs.filter((l) => l.msg === 'task_state_change' && l.task_id === requestId);
}

function assertError(r, status, code) {
    assert.equal(r.status, status, `status (body: ${r.text?.slice(0, 300)})`);
    assert.equal(r.json?.error?.code, code, `code (body: ${r.text?.slice(0, 300)})`);
    assert.equal(r.json.error.request_id, r.headers.get('x-request-id'));
}

/** A Retry-After header of whole seconds (>= 1) and the matching retry_after_ms. */
function assertRetryAfter(r) {
    const ra = r.headers.get('retry-after');
    assert.match(ra ?? '', /^\d+$/, `Retry-After header (got ${ra})`);
    assert.ok(Number(ra) >= 1, `Retry-After >= 1 (got ${ra})`);
    assert.equal(typeof r.json.error.retry_after_ms, 'number', 'error.retry_after_ms');
    assert.ok(r.json.error.retry_after_ms > 0);
}

// ---------------------------------------------------------------------------
// ordering
// ---------------------------------------------------------------------------

describe('priority ordering', () => {
    let env;
    before(async () => {
        env = await schedEnv({ scheduler: { priority_aging_seconds: 30 } });
    });
    after(async () => {
        await env?.close();
    });

    test('a P0 submitted behind 30 queued P3 requests runs next; the P3s stay FIFO', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { delay_first_byte_ms: 1500 } });
        const blocker = send(env, 'a', 'blocker');
        await waitMock(env, 'blocker');
        const p3 = [];
        for (let i = 0; i < 30; i++) p3.push(send(env, 'a', `p3-${i}`, { priority: 'P3' }));
        await waitQueued(env, 30, 3000);
        const p0 = send(env, 'a', 'p0', { priority: 'P0' });
        const s = await waitQueued(env, 31, 2000);
        assert.equal(s.queued_by_priority.P3, 30);
        assert.equal(s.queued_by_priority.P0, 1);
        assert.equal(s.running, 1);
        assert.equal((await mockTags(env)).length, 1, 'everything queued while the blocker runs');

        const results = await Promise.all([blocker, p0, ...p3]);
        for (const r of results) assert.equal(r.status, 200, r.text.slice(0, 200));
        const chats = await mockChats(env);
        const tags = chats.map(tagOf);
        assert.equal(tags.length, 32);
        assert.equal(tags[0], 'blocker');
        assert.equal(tags[1], 'p0', `P0 runs right after the running task; order: ${tags.join(',')}`);
        // the P3s form one flow: they run in the order they were queued
        const queuedOrder = env.gw.logs
            .filter((l) => l.msg === 'task_state_change' && l.to_state === 'QUEUED' && l.priority === 'P3')
            .map((l) => l.task_id);
        const p3Ids = new Set(results.slice(2).map((r) => r.headers.get('x-request-id')));
        const runOrder = chats.slice(2).map((r) => r.headers['x-request-id']);
        assert.deepEqual(runOrder, queuedOrder.filter((id) => p3Ids.has(id)), 'P3s run first-in first-out');
        // every P3 was queued before the P0 and left after it: each waited longer
        const p0Wait = results[1].json.timing.queue_ms;
        for (const r of results.slice(2)) assert.ok(r.json.timing.queue_ms > p0Wait, 'P3 waited longer than P0');
    });

    test('P4 runs only when nothing else waits, even behind later P3/P1 arrivals', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { delay_first_byte_ms: 1000 } });
        const blocker = send(env, 'a', 'blocker');
        await waitMock(env, 'blocker');
        const idle = send(env, 'a', 'p4', { priority: 'P4' });
        await waitQueued(env, 1);
        const p3 = send(env, 'a', 'p3', { priority: 'P3' });
        await waitQueued(env, 2);
        const p1 = send(env, 'a', 'p1', { priority: 'P1' });
        await waitQueued(env, 3);
        for (const r of await Promise.all([blocker, idle, p3, p1])) assert.equal(r.status, 200);
        assert.deepEqual(await mockTags(env), ['blocker', 'p1', 'p3', 'p4']);
    });

    test('a P4 on an idle model still waits while a P0-P3 task is queued (even a blocked one)', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { delay_first_byte_ms: 1000 } });
        const blocker = send(env, 'a', 'blocker');
        await waitMock(env, 'blocker');
        const p3 = send(env, 'a', 'p3-on-a', { priority: 'P3' });
        await waitQueued(env, 1);
        const idle = send(env, 'b', 'p4-on-b', { priority: 'P4' });
        await waitQueued(env, 2);
        await sleep(300);
        assert.deepEqual(await mockTags(env), ['blocker'], 'the P4 on model b waits although b is free');
        for (const r of await Promise.all([blocker, p3, idle])) assert.equal(r.status, 200);
        const chats = await mockChats(env);
        const at = Object.fromEntries(chats.map((r) => [tagOf(r), r.started_at]));
        assert.ok(at['p4-on-b'] >= at['p3-on-a'], `P4 started after the P3 left the queue: ${JSON.stringify(at)}`);
    });
});

describe('aging', () => {
    let env;
    const AGING_S = 1;
    before(async () => {
        env = await schedEnv({ scheduler: { priority_aging_seconds: AGING_S } });
    });
    after(async () => {
        await env?.close();
    });

    // A fresh P(k) sits one aging period A behind a fresh P(k-1) (sched.h): an old P3 that
    // waited 1.6 A is ahead of fresh P2s, and a fresh P3 (queued behind the old P3, before
    // the P2s) is behind them.
    test('an old P3 passes fresh P2s; a fresh P3 queued before them does not', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { delay_first_byte_ms: 2600 } });
        const blocker = send(env, 'a', 'blocker');
        await waitMock(env, 'blocker');
        const pending = [send(env, 'a', 'old-p3', { priority: 'P3' })];
        await waitQueued(env, 1);
        const t0 = Date.now();
        await sleep(AGING_S * 1600);
        pending.push(send(env, 'a', 'fresh-p3', { priority: 'P3' }));
        await waitQueued(env, 2);
        for (let i = 0; i < 3; i++) {
            pending.push(send(env, 'a', `p2-${i}`, { priority: 'P2' }));
            await waitQueued(env, 3 + i);
        }
        const tags = await mockTags(env);
        assert.deepEqual(tags, ['blocker'], `all queued before the blocker ended (${Date.now() - t0} ms after old-p3)`);
        for (const r of await Promise.all([blocker, ...pending])) assert.equal(r.status, 200, r.text.slice(0, 200));
        assert.deepEqual(await mockTags(env), ['blocker', 'old-p3', 'p2-0', 'p2-1', 'p2-2', 'fresh-p3']);
    });
});

// ---------------------------------------------------------------------------
// slots: per-model max_concurrency, reserved realtime slots
// ---------------------------------------------------------------------------

describe('slots', () => {
    // 3 global slots, 1 of them reserved for P0: two non-P0 tasks can run at once
    let env;
    before(async () => {
        env = await schedEnv({ scheduler: { max_running_tasks: 3, reserved_realtime_slots: 1 } });
    });
    after(async () => {
        await env?.close();
    });

    test('model max_concurrency 1: a second "a" request waits while a "b" request runs at once', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', action: { delay_first_byte_ms: 900 } });
        const a1 = send(env, 'a', 'a1');
        await waitMock(env, 'a1');
        const a2 = send(env, 'a', 'a2');
        await waitQueued(env, 1);
        const b = await send(env, 'b', 'b1');
        assert.equal(b.status, 200, b.text.slice(0, 200));
        assert.ok(b.json.timing.queue_ms < 300, `b did not wait (queue_ms ${b.json.timing.queue_ms})`);
        assert.deepEqual(await mockTags(env), ['a1', 'b1'], 'a2 still waits for model a');
        const s = await sched(env);
        assert.equal(s.running, 1);
        assert.equal(s.queued, 1);
        const [r1, r2] = await Promise.all([a1, a2]);
        assert.equal(r1.status, 200);
        assert.equal(r2.status, 200);
        const rec = Object.fromEntries((await mockChats(env)).map((r) => [tagOf(r), r]));
        assert.ok(rec.a2.started_at >= rec.a1.ended_at - 5, 'a2 started when a1 ended');
        assert.ok(r2.json.timing.queue_ms > 300, `timing.queue_ms reflects the wait (${r2.json.timing.queue_ms})`);
        assert.ok(r1.json.timing.queue_ms < r2.json.timing.queue_ms);
    });

    test('reserved_realtime_slots: a P0 runs on the reserved slot while a P1 waits for a free one', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-c', times: 2, action: { delay_first_byte_ms: 1000 } });
        const first = send(env, 'c', 'first', { priority: 'P2' });
        await waitMock(env, 'first');
        const second = send(env, 'c', 'second', { priority: 'P2' });
        await waitMock(env, 'second');
        const waits = send(env, 'c', 'p1-waits', { priority: 'P1' });
        await waitQueued(env, 1);
        const rt = await send(env, 'c', 'p0-rt', { priority: 'P0' });
        assert.equal(rt.status, 200);
        assert.deepEqual(await mockTags(env), ['first', 'second', 'p0-rt'],
            'the P0 ran while the two other slots were busy');
        for (const r of await Promise.all([first, second, waits])) assert.equal(r.status, 200);
        const rec = Object.fromEntries((await mockChats(env)).map((r) => [tagOf(r), r]));
        assert.ok(rec['p1-waits'].started_at >= Math.min(rec.first.ended_at, rec.second.ended_at) - 5,
            'the P1 waited for a non-reserved slot');
    });
});

// Regression: busy global slots once counted as backpressure load, so P2-P4 were shed
// with 503 instead of queueing behind a full global cap.
describe('global max_running_tasks 1', () => {
    let env;
    before(async () => {
        env = await schedEnv({ scheduler: { max_running_tasks: 1, max_queued_tasks: 100 } });
    });
    after(async () => {
        await env?.close();
    });

    test('30 P3s queue behind the one running task; a P0 submitted after them runs next',
        async () => {
            await resetAll(env);
            await env.mock.script({ model: 'up-b', times: 1, action: { delay_first_byte_ms: 1500 } });
            const blocker = send(env, 'b', 'blocker');
            await waitMock(env, 'blocker');
            const p3 = [];
            for (let i = 0; i < 30; i++) p3.push(send(env, 'b', `p3-${i}`, { priority: 'P3' }));
            await waitQueued(env, 30, 3000);
            const p0 = send(env, 'b', 'p0', { priority: 'P0' });
            await waitQueued(env, 31, 2000);
            assert.equal((await mockTags(env)).length, 1, 'everything queued while the blocker runs');
            for (const r of await Promise.all([blocker, p0, ...p3])) assert.equal(r.status, 200, r.text.slice(0, 200));
            const tags = await mockTags(env);
            assert.equal(tags.length, 32);
            assert.equal(tags[1], 'p0', `order: ${tags.join(',')}`);
        });
});

// At backpressure level 2 the scheduler lowers the task's max_output_tokens to 1024 (sched.h,
// mg_sched_enqueue), and the upstream must get the lowered value (take_admission in
// core/pipeline/admit.c), not the client's max_tokens.
describe('backpressure level 2 output cap', () => {
    let env;
    before(async () => {
        env = await schedEnv({ scheduler: { max_queued_tasks: 20 } });
    });
    after(async () => {
        await env?.close();
    });

    test('a task admitted at level 2 reaches the upstream with max_tokens <= 1024',
        async () => {
            await resetAll(env);
            await env.mock.script({ model: 'up-a', times: 1, action: { delay_first_byte_ms: 1200 } });
            const pending = [send(env, 'a', 'blocker')];
            await waitMock(env, 'blocker');
            for (let i = 0; i < 17; i++) pending.push(send(env, 'a', `fill-${i}`, { priority: 'P1' }));
            const s = await waitQueued(env, 17, 3000);
            assert.equal(s.backpressure_level, 2);
            pending.push(send(env, 'a', 'capped', { priority: 'P2', extra: { max_tokens: 4000 } }));
            await waitQueued(env, 18);
            for (const r of await Promise.all(pending)) assert.equal(r.status, 200, r.text.slice(0, 200));
            const rec = (await mockChats(env)).find((r) => tagOf(r) === 'capped');
            assert.ok(rec.body.max_tokens <= 1024, `upstream max_tokens ${rec.body.max_tokens}`);
        });
});

// ---------------------------------------------------------------------------
// the full queue
// ---------------------------------------------------------------------------

async function queueFullScenario(env, expectStatus) {
    await resetAll(env);
    await env.mock.script({ model: 'up-a', times: 1, action: { delay_first_byte_ms: 1200 } });
    const blocker = send(env, 'a', 'blocker');
    await waitMock(env, 'blocker');
    const fillers = [];
    for (let i = 0; i < 3; i++) {
        fillers.push(send(env, 'a', `fill-${i}`, { priority: 'P1' }));
        await waitQueued(env, i + 1);
    }
    const over = await send(env, 'a', 'overflow', { priority: 'P1' });
    assertError(over, expectStatus, 'QUEUE_FULL');
    assert.equal(over.json.error.type, expectStatus === 429 ? 'rate_limit_error' : 'api_error');
    assertRetryAfter(over);
    const id = over.headers.get('x-request-id');
    const line = await env.gw.requestLog(id);
    assert.equal(line.status, expectStatus);
    assert.equal(line.task_state, 'REJECTED');
    assert.equal(line.priority, 'P1');
    const states = stateLines(env, id).map((l) => `${l.from_state}>${l.to_state}`);
    assert.deepEqual(states, ['RECEIVED>VALIDATING', 'VALIDATING>REJECTED']);
    for (const r of await Promise.all([blocker, ...fillers])) assert.equal(r.status, 200);
    assert.ok(!(await mockTags(env)).includes('overflow'), 'the rejected request never reached the upstream');
}

describe('queue full (default overflow_status)', () => {
    let env;
    before(async () => {
        env = await schedEnv({ scheduler: { max_queued_tasks: 3 } });
    });
    after(async () => {
        await env?.close();
    });

    test('429 QUEUE_FULL with Retry-After when max_queued_tasks are waiting', async () => {
        await queueFullScenario(env, 429);
    });
});

describe('queue full (overflow_status 503)', () => {
    let env;
    before(async () => {
        env = await schedEnv({ scheduler: { max_queued_tasks: 3, overflow_status: 503 } });
    });
    after(async () => {
        await env?.close();
    });

    test('503 QUEUE_FULL with Retry-After', async () => {
        await queueFullScenario(env, 503);
    });
});

// ---------------------------------------------------------------------------
// queue timeout
// ---------------------------------------------------------------------------

describe('queue timeout', () => {
    const QUEUE_MS = 600;
    let env;
    before(async () => {
        env = await schedEnv({ timeouts: { queue_ms: QUEUE_MS } });
    });
    after(async () => {
        await env?.close();
    });

    test('408 QUEUE_TIMEOUT after timeouts.queue_ms, with the queue length in the message', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { delay_first_byte_ms: 2500 } });
        const blocker = send(env, 'a', 'blocker');
        await waitMock(env, 'blocker');
        const t1 = Date.now();
        const q1 = send(env, 'a', 'q1');
        await waitQueued(env, 1);
        await sleep(250);
        const q2 = send(env, 'a', 'q2');
        await waitQueued(env, 2);
        const r1 = await q1;
        const waited = Date.now() - t1;
        assertError(r1, 408, 'QUEUE_TIMEOUT');
        assert.ok(waited >= QUEUE_MS - 50 && waited < QUEUE_MS + 1500, `q1 answered after ${waited} ms`);
        // when q1 expires, q2 is still waiting: the queue length is 1
        assert.match(r1.json.error.message, /queue length: 1\b/, r1.json.error.message);
        const r2 = await q2;
        assertError(r2, 408, 'QUEUE_TIMEOUT');
        assert.match(r2.json.error.message, /queue length: 0\b/, r2.json.error.message);
        const line = await env.gw.requestLog(r1.headers.get('x-request-id'));
        assert.equal(line.status, 408);
        assert.equal(line.task_state, 'TIMED_OUT');
        const last = stateLines(env, r1.headers.get('x-request-id')).at(-1);
        assert.equal(`${last.from_state}>${last.to_state}`, 'QUEUED>TIMED_OUT');
        assert.equal((await blocker).status, 200);
        assert.deepEqual(await mockTags(env), ['blocker'], 'timed-out tasks never reach the upstream');
        assert.equal((await sched(env)).queued, 0);
    });
});

// ---------------------------------------------------------------------------
// client disconnects
// ---------------------------------------------------------------------------

describe('client disconnect', () => {
    let env;
    before(async () => {
        env = await schedEnv();
    });
    after(async () => {
        await env?.close();
    });

    test('while queued: the task leaves the queue, never reaches the upstream, the next one runs', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { delay_first_byte_ms: 1500 } });
        const blocker = send(env, 'a', 'blocker');
        await waitMock(env, 'blocker');
        const conn = await sendRaw(env, 'a', 'gone');
        await waitQueued(env, 1);
        const next = send(env, 'a', 'next');
        await waitQueued(env, 2);
        const from = env.gw.logs.length;
        conn.destroy();
        // the queue shrinks at once, long before the blocker ends
        await waitQueued(env, 1, 800);
        const cancel = await env.gw.waitLog((l) => l.msg === 'task_state_change' && l.to_state === 'CANCELLED',
            { from, what: 'CANCELLED transition' });
        assert.equal(cancel.from_state, 'QUEUED');
        assert.equal(cancel.reason, 'client_disconnected');
        const line = await env.gw.requestLog(cancel.task_id);
        assert.equal(line.outcome, 'cancelled');
        assert.equal(line.task_state, 'CANCELLED');
        for (const r of await Promise.all([blocker, next])) assert.equal(r.status, 200);
        assert.deepEqual(await mockTags(env), ['blocker', 'next']);
    });

    test('while streaming: the upstream transfer is closed and the next queued task starts within 1 s', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { chunk_delay_ms: 250, chunks: 40 } });
        const conn = await sendRaw(env, 'a', 'streamer', { stream: true });
        await waitMock(env, 'streamer');
        const next = send(env, 'a', 'next');
        await waitQueued(env, 1);
        await conn.waitText('data:', 5000);
        const from = env.gw.logs.length;
        const t = Date.now();
        conn.destroy();
        const rec = await waitMock(env, 'streamer', { timeoutMs: 2000, extra: (r) => r.closed_early });
        assert.ok(rec.closed_early && !rec.finished, 'the mock saw its stream closed early');
        const nx = await waitMock(env, 'next', { timeoutMs: 2000 });
        assert.ok(nx.started_at - t < 1000, `the next task started ${nx.started_at - t} ms after the disconnect`);
        assert.equal((await next).status, 200);
        const cancel = await env.gw.waitLog((l) => l.msg === 'task_state_change' && l.to_state === 'CANCELLED',
            { from, what: 'CANCELLED transition' });
        assert.equal(cancel.from_state, 'STREAMING');
        const line = await env.gw.requestLog(cancel.task_id);
        assert.equal(line.outcome, 'cancelled');
    });

    test('while running (waiting for a non-stream answer): upstream closed, the next task starts', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { hang: true } });
        const conn = await sendRaw(env, 'a', 'hanger');
        await waitMock(env, 'hanger');
        const next = send(env, 'a', 'next');
        await waitQueued(env, 1);
        const t = Date.now();
        conn.destroy();
        await waitMock(env, 'hanger', { timeoutMs: 2000, extra: (r) => r.closed_early });
        const nx = await waitMock(env, 'next', { timeoutMs: 2000 });
        assert.ok(nx.started_at - t < 1000, `the next task started ${nx.started_at - t} ms after the disconnect`);
        assert.equal((await next).status, 200);
    });
});

// ---------------------------------------------------------------------------
// backpressure, /status and /metrics
// ---------------------------------------------------------------------------

describe('backpressure', () => {
    // load = queued / 20 here (1 of 64 running slots is busy): 14 queued = 0.70 (level 1),
    // 17 = 0.85 (level 2), 19 = 0.95 (level 3), 20 = full
    let env;
    before(async () => {
        // requests left queued at the end: a short drain lets the gateway stop at once
        env = await schedEnv({ scheduler: { max_queued_tasks: 20 }, timeouts: { drain_ms: 200 } });
    });
    after(async () => {
        await env?.close();
    });

    test('/status and /metrics at rest', async () => {
        const s = await sched(env);
        assert.equal(s.running, 0);
        assert.equal(s.queued, 0);
        assert.deepEqual(s.queued_by_priority, { P0: 0, P1: 0, P2: 0, P3: 0, P4: 0 });
        assert.equal(s.load, 0);
        assert.equal(s.backpressure_level, 0);
        const m = await metricsText(env);
        for (const p of ['P0', 'P1', 'P2', 'P3', 'P4'])
            assert.equal(metric(m, `moongate_queue_length{priority="${p}"}`), 0, `queue_length ${p}`);
        assert.equal(metric(m, 'moongate_running_tasks'), 0);
        assert.equal(metric(m, 'moongate_backpressure_level'), 0);
        const lua = metric(m, 'moongate_lua_bytes'); // the policies and adapters loaded
        assert.ok(lua > 64 * 1024 && lua < 64 * 1024 * 1024, `lua_bytes ${lua}`);
    });

    test('levels 1-3 shed P4, then P3, then P2 (503 RESOURCE_EXHAUSTED); higher ones still queue', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { hang: true } });
        sendDetached(env, 'a', 'blocker'); // holds model a until the gateway is closed
        await waitMock(env, 'blocker');
        let queued = 0;
        const admit = async (prio, tag) => {
            sendDetached(env, 'a', tag, { priority: prio });
            queued++;
            return waitQueued(env, queued);
        };
        const shed = async (prio, level) => {
            const r = await send(env, 'a', `shed-${prio}`, { priority: prio });
            assertError(r, 503, 'RESOURCE_EXHAUSTED');
            assertRetryAfter(r);
            const line = await env.gw.requestLog(r.headers.get('x-request-id'));
            assert.equal(line.task_state, 'REJECTED');
            const s = await sched(env);
            assert.equal(s.backpressure_level, level);
            assert.equal(s.queued, queued, 'a shed request is not queued');
        };
        for (let i = 0; i < 13; i++) sendDetached(env, 'a', `fill-${i}`, { priority: 'P1' });
        queued = 13;
        let s = await waitQueued(env, 13, 3000);
        assert.equal(s.backpressure_level, 0);
        s = await admit('P4', 'p4-admitted-at-level-0');
        assert.equal(s.backpressure_level, 1);
        assert.ok(Math.abs(s.load - 0.7) < 1e-9, `load ${s.load}`);
        await shed('P4', 1);
        await admit('P3', 'p3-admitted-at-level-1');
        s = await admit('P2', 'p2-admitted-at-level-1');
        assert.equal(s.backpressure_level, 1);
        s = await admit('P1', 'p1-admitted-at-level-1');
        assert.equal(s.backpressure_level, 2);
        assert.ok(Math.abs(s.load - 0.85) < 1e-9, `load ${s.load}`);
        await shed('P3', 2);
        await shed('P4', 2);
        s = await admit('P2', 'p2-admitted-at-level-2');
        assert.equal(s.backpressure_level, 2);
        s = await admit('P1', 'p1-admitted-at-level-2');
        assert.equal(s.backpressure_level, 3);
        assert.ok(Math.abs(s.load - 0.95) < 1e-9, `load ${s.load}`);
        await shed('P2', 3);
        await shed('P3', 3);
        s = await admit('P1', 'p1-admitted-at-level-3');
        assert.equal(s.queued, 20);
        // the queue is full now: even a P0 gets QUEUE_FULL
        const full = await send(env, 'a', 'p0-full', { priority: 'P0' });
        assertError(full, 429, 'QUEUE_FULL');

        // /status and /metrics agree on the state
        s = await sched(env);
        assert.equal(s.running, 1);
        assert.deepEqual(s.queued_by_priority, { P0: 0, P1: 16, P2: 2, P3: 1, P4: 1 });
        assert.equal(s.load, 1);
        assert.equal(s.backpressure_level, 3);
        const m = await metricsText(env);
        assert.equal(metric(m, 'moongate_queue_length{priority="P1"}'), 16);
        assert.equal(metric(m, 'moongate_queue_length{priority="P2"}'), 2);
        assert.equal(metric(m, 'moongate_queue_length{priority="P3"}'), 1);
        assert.equal(metric(m, 'moongate_queue_length{priority="P4"}'), 1);
        assert.equal(metric(m, 'moongate_queue_length{priority="P0"}'), 0);
        assert.equal(metric(m, 'moongate_running_tasks'), 1);
        assert.equal(metric(m, 'moongate_backpressure_level'), 3);
        assert.deepEqual(await mockTags(env), ['blocker'], 'nothing but the blocker reached the upstream');
    });
});

// ---------------------------------------------------------------------------
// priorities from the request, task states in the log
// ---------------------------------------------------------------------------

describe('priorities and task states', () => {
    let env;
    before(async () => {
        env = await schedEnv();
    });
    after(async () => {
        await env?.close();
    });

    test('priority from the body (P0-P4) or X-Priority (urgent/high/normal/low); default P2', async () => {
        await resetAll(env);
        const cases = [
            [{}, {}, 'P2'],
            [{ priority: 'P0' }, {}, 'P0'],
            [{ priority: 'P4' }, {}, 'P4'],
            [{}, { 'X-Priority': 'urgent' }, 'P0'],
            [{}, { 'X-Priority': 'high' }, 'P1'],
            [{}, { 'X-Priority': 'normal' }, 'P2'],
            [{}, { 'X-Priority': 'low' }, 'P3'],
            [{ priority: 'P1' }, { 'X-Priority': 'low' }, 'P1'],
        ];
        for (const [opts, headers, want] of cases) {
            const r = await send(env, 'b', `prio-${want}`, { ...opts, headers });
            assert.equal(r.status, 200, r.text.slice(0, 200));
            const line = await env.gw.requestLog(r.headers.get('x-request-id'));
            assert.equal(line.priority, want, `${JSON.stringify(opts)} ${JSON.stringify(headers)}`);
            assert.equal(line.task_state, 'SUCCEEDED');
        }
        for (const bad of ['P5', 'high', 'p9', true]) {
            const r = await send(env, 'b', 'bad-priority', { priority: bad });
            assertError(r, 400, 'INVALID_REQUEST');
            assert.match(r.json.error.message, /priority/);
        }
        assert.ok(!(await mockTags(env)).includes('bad-priority'));
        // an integer is the engine's (vLLM's priority scheduling), not the gateway's: it is
        // forwarded, and the gateway's priority comes from X-Priority or the default (issue 18.8)
        const r = await send(env, 'b', 'engine-priority', { priority: 7, headers: { 'X-Priority': 'high' } });
        assert.equal(r.status, 200, r.text.slice(0, 200));
        assert.equal((await env.gw.requestLog(r.headers.get('x-request-id'))).priority, 'P1');
        const seen = (await env.mock.requests()).find((q) => tagOf(q) === 'engine-priority');
        assert.equal(seen?.body?.priority, 7, 'the engine got its priority');
    });

    test('a streamed request logs each state change in order; the request line has task_state', async () => {
        await resetAll(env);
        const s = await postStream(`${env.api}/chat/completions`, chatBody('b', 'streamed', { stream: true }),
            { headers: { 'X-Priority': 'high' } });
        assert.equal(s.status, 200);
        assert.equal(s.events.at(-1), '[DONE]');
        const id = s.headers.get('x-request-id');
        const line = await env.gw.requestLog(id);
        assert.equal(line.task_state, 'SUCCEEDED');
        assert.equal(line.priority, 'P1');
        assert.equal(line.outcome, 'ok');
        const changes = stateLines(env, id);
        assert.deepEqual(changes.map((l) => [l.from_state, l.to_state]), [
            ['RECEIVED', 'VALIDATING'],
            ['VALIDATING', 'QUEUED'],
            ['QUEUED', 'DISPATCHING'],
            ['DISPATCHING', 'RUNNING'],
            ['RUNNING', 'STREAMING'],
            ['STREAMING', 'SUCCEEDED'],
        ]);
        for (const l of changes) {
            assert.equal(l.level, 'info');
            assert.equal(typeof l.ts, 'string');
            assert.equal(typeof l.reason, 'string');
            assert.ok(l.reason.length > 0, `reason of ${l.from_state}>${l.to_state}`);
            assert.equal(l.priority, 'P1');
            assert.equal(l.logical_model, 'b');
        }
        // the last state change comes before the request line
        const idx = (l) => env.gw.logs.indexOf(l);
        assert.ok(idx(changes.at(-1)) < idx(line));
        // the finishing chunk carries timing
        const fin = s.events.find((e) => e?.choices?.[0]?.finish_reason);
        assert.equal(typeof fin?.timing?.queue_ms, 'number');
    });

    test('a streamed request that waited reports timing.queue_ms > 0 in its finishing chunk', async () => {
        await resetAll(env);
        await env.mock.script({ model: 'up-a', times: 1, action: { delay_first_byte_ms: 600 } });
        const blocker = send(env, 'a', 'blocker');
        await waitMock(env, 'blocker');
        const s = await postStream(`${env.api}/chat/completions`, chatBody('a', 'waiter', { stream: true }));
        assert.equal(s.status, 200);
        const fin = s.events.find((e) => e?.choices?.[0]?.finish_reason);
        assert.ok(fin?.timing?.queue_ms > 200, `timing.queue_ms ${fin?.timing?.queue_ms}`);
        assert.equal((await blocker).status, 200);
    });
});

// ---------------------------------------------------------------------------
// memory admission degrades before it waits (PRD 3.4.3)
// ---------------------------------------------------------------------------

// One device of 101000 B with a 1% margin and no weights: about 99990 B of KV cache. Model
// "mem" takes 100 B a token (about 1000 tokens in all); its smaller route "up-mem-small" 20 B.
// The gateway guesses a request's input tokens as its body bytes / 3, so each test computes
// what fits from the bodies it sends. A "hog" request holds its memory while the mock delays
// its answer; the request under test then finds only the rest free.
const MEM_BUDGET = Math.floor(101000 * (1 - 0.01));
const MEM_KV = 100;
const MEM_KV_SMALL = 20;
const MEM_FLOOR = 256;
const NO_SMALLER = { routing: { allow_smaller_model: false } };

function memEnv() {
    return startEnv({
        timeouts: { queue_ms: 8000 },
        models: {
            mem: {
                kv_cache_per_token_bytes: MEM_KV,
                routes: [
                    { provider: 'mock-openai', model: 'up-mem' },
                    { provider: 'mock-openai', model: 'up-mem-small', smaller: true,
                        kv_cache_per_token_bytes: MEM_KV_SMALL },
                ],
            },
        },
        configure(config) {
            config.scheduler = {
                vram_bytes: 101000,
                safety_margin_ratio: 0.01,
                min_output_tokens: MEM_FLOOR,
                // a nearly full device must not shed these P2 requests: memory admission alone
                backpressure: { level1_threshold: 0.99, level2_threshold: 0.995, level3_threshold: 0.999 },
            };
            config.routing = { allow_smaller_model: true }; // requests that do not say may go smaller
            return config;
        },
    });
}

function memBody(tag, maxTokens, extra = {}) {
    return { model: 'mem', messages: [{ role: 'user', content: tag }], max_tokens: maxTokens, ...extra };
}

/** The gateway's input-token guess for a body: its JSON bytes / 3. */
const inputGuess = (body) => Math.floor(Buffer.byteLength(JSON.stringify(body)) / 3);

/** Bytes a body reserves on a model at an output ceiling. */
const reserve = (kv, body, out) => kv * (inputGuess(body) + out);

/** Start a hog with max_tokens n whose answer the mock delays; resolves once it runs. */
async function startHog(env, n, delayMs = 1500) {
    const body = memBody('hog', n, NO_SMALLER);
    assert.ok(reserve(MEM_KV, body, n) <= MEM_BUDGET, 'precondition: the hog fits as asked');
    await env.mock.script({ model: 'up-mem', times: 1, action: { delay_first_byte_ms: delayMs } });
    const done = postJson(`${env.api}/chat/completions`, body, { timeoutMs: 20000 });
    await waitMock(env, 'hog');
    return { done, free: MEM_BUDGET - reserve(MEM_KV, body, n) };
}

describe('memory admission degrades before it waits', () => {
    let env;
    before(async () => {
        env = await memEnv();
    });
    after(async () => {
        await env?.close();
    });

    test('max_tokens that does not fit, a shorter one does: runs at once with the largest that fits, sent upstream, degraded "shorter_output"',
        async () => {
            await resetAll(env);
            const hog = await startHog(env, 400);
            const body = memBody('short', 900, NO_SMALLER);
            assert.ok(reserve(MEM_KV, body, 900) > hog.free, 'precondition: 900 does not fit beside the hog');
            const want = Math.floor(hog.free / MEM_KV) - inputGuess(body);
            assert.ok(want >= MEM_FLOOR && want < 900, `precondition: a shorter ceiling fits (${want})`);
            const t0 = Date.now();
            const r = await postJson(`${env.api}/chat/completions`, body);
            assert.equal(r.status, 200, r.text);
            assert.ok(Date.now() - t0 < 1000, 'ran at once, not after the hog');
            assert.equal(r.headers.get('x-sidecar-degraded'), 'shorter_output');
            assert.equal(r.json.degraded, true);
            assert.equal(r.json.degraded_reason, 'shorter_output');
            assert.equal(r.json.max_output_tokens, want);
            assert.equal(r.json.actual_model, 'up-mem');
            const rec = (await mockChats(env)).find((x) => tagOf(x) === 'short');
            assert.equal(rec.body.max_tokens, want, 'the upstream got the shortened max_tokens');
            const line = await env.gw.requestLog(r.headers.get('x-request-id'));
            assert.equal(line.degraded, 'shorter_output');
            assert.equal(line.max_output_tokens, want);

            // the same for a stream (its first chunk carries the metadata)
            const sbody = memBody('short-stream', 900, { ...NO_SMALLER, stream: true });
            const swant = Math.floor(hog.free / MEM_KV) - inputGuess(sbody);
            const s = await postStream(`${env.api}/chat/completions`, sbody);
            assert.equal(s.status, 200);
            assert.equal(s.headers.get('x-sidecar-degraded'), 'shorter_output');
            assert.equal(s.events[0].degraded, true);
            assert.equal(s.events[0].degraded_reason, 'shorter_output');
            assert.equal(s.events[0].max_output_tokens, swant);
            const srec = (await mockChats(env)).find((x) => tagOf(x) === 'short-stream');
            assert.equal(srec.body.max_tokens, swant);

            assert.equal((await hog.done).status, 200);
            const m = await metricsText(env);
            assert.ok(metric(m, 'moongate_degraded_total{kind="shorter_output"}') >= 2);
        });

    test('not even the shortest output fits, a smaller route does: runs there at once, degraded "smaller"',
        async () => {
            await resetAll(env);
            const hog = await startHog(env, 720);
            const body = memBody('smaller', 900); // smaller models: allowed by routing.allow_smaller_model
            assert.ok(reserve(MEM_KV, body, MEM_FLOOR) > hog.free, 'precondition: the floor does not fit');
            assert.ok(reserve(MEM_KV_SMALL, body, 900) <= hog.free, 'precondition: the smaller model fits');
            const t0 = Date.now();
            const r = await postJson(`${env.api}/chat/completions`, body);
            assert.equal(r.status, 200, r.text);
            assert.ok(Date.now() - t0 < 1000, 'ran at once, not after the hog');
            assert.equal(r.headers.get('x-sidecar-degraded'), 'smaller');
            assert.equal(r.json.degraded, true);
            assert.equal(r.json.degraded_reason, 'smaller');
            assert.equal(r.json.actual_model, 'up-mem-small');
            assert.equal(r.json.max_output_tokens, undefined, 'the output was not shortened');
            const rec = (await mockChats(env)).find((x) => tagOf(x) === 'smaller');
            assert.equal(rec.body.model, 'up-mem-small');
            assert.equal(rec.body.max_tokens, 900);
            const line = await env.gw.requestLog(r.headers.get('x-request-id'));
            assert.equal(line.degraded, 'smaller');
            assert.equal((await hog.done).status, 200);
        });

    test('smaller models not allowed by the request: it waits, then runs as asked when memory frees',
        async () => {
            await resetAll(env);
            const hog = await startHog(env, 720);
            const body = memBody('no-smaller', 900, NO_SMALLER);
            assert.ok(reserve(MEM_KV, body, MEM_FLOOR) > hog.free, 'precondition: the floor does not fit');
            assert.ok(reserve(MEM_KV_SMALL, body, 900) <= hog.free, 'precondition: the smaller model would');
            const r = await postJson(`${env.api}/chat/completions`, body, { timeoutMs: 20000 });
            assert.equal(r.status, 200, r.text);
            assert.ok(r.json.timing.queue_ms >= 500, `waited for the hog (queue_ms ${r.json.timing.queue_ms})`);
            assert.equal(r.headers.get('x-sidecar-degraded'), null);
            assert.equal(r.json.degraded, false);
            assert.equal(r.json.actual_model, 'up-mem');
            const rec = (await mockChats(env)).find((x) => tagOf(x) === 'no-smaller');
            assert.equal(rec.body.max_tokens, 900);
            assert.equal((await hog.done).status, 200);
        });

    test('neither a shorter output nor the smaller model fits: it waits, then runs as asked when memory frees',
        async () => {
            await resetAll(env);
            const hog = await startHog(env, 930);
            const body = memBody('waiter', 900);
            assert.ok(reserve(MEM_KV, body, MEM_FLOOR) > hog.free, 'precondition: the floor does not fit');
            assert.ok(reserve(MEM_KV_SMALL, body, MEM_FLOOR) > hog.free,
                'precondition: nor the smaller model at the floor');
            assert.ok(reserve(MEM_KV, body, 900) <= MEM_BUDGET, 'precondition: it fits as asked alone');
            const r = await postJson(`${env.api}/chat/completions`, body, { timeoutMs: 20000 });
            assert.equal(r.status, 200, r.text);
            assert.ok(r.json.timing.queue_ms >= 500, `waited for the hog (queue_ms ${r.json.timing.queue_ms})`);
            assert.equal(r.headers.get('x-sidecar-degraded'), null, 'free memory: no step needed');
            assert.equal(r.json.degraded, false);
            assert.equal(r.json.actual_model, 'up-mem');
            const rec = (await mockChats(env)).find((x) => tagOf(x) === 'waiter');
            assert.equal(rec.body.max_tokens, 900);
            assert.equal((await hog.done).status, 200);
        });
});

describe('log.task_events false', () => {
    let env;
    before(async () => {
        env = await schedEnv({ log: { task_events: false } });
    });
    after(async () => {
        await env?.close();
    });

    test('no task_state_change lines; the request line still has task_state and priority', async () => {
        const r = await send(env, 'b', 'quiet', { priority: 'P3' });
        assert.equal(r.status, 200);
        const line = await env.gw.requestLog(r.headers.get('x-request-id'));
        assert.equal(line.task_state, 'SUCCEEDED');
        assert.equal(line.priority, 'P3');
        assert.equal(env.gw.logs.filter((l) => l.msg === 'task_state_change').length, 0);
    });
});
