// Per-request timeouts (body "timeouts", capped by the config) and GET/DELETE /v1/tasks/{id}
// for tasks in flight: the real binary against the mock engine.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, startGateway, postJson, postStream, waitFor, sleep, RawConn, rawRequest } from './lib/harness.mjs';

let env;
const messages = [{ role: 'user', content: 'tasks test' }];
const chat = (extra = {}) => ({ model: 'chat', messages, ...extra });

before(async () => {
    env = await startEnv({ timeouts: { first_byte_ms: 5000, total_ms: 20000, queue_ms: 5000 } });
});

after(async () => {
    await env?.close();
});

describe('per-request timeouts', () => {
    test('timeouts.first_token_ms shorter than the config wins -> 408 FIRST_TOKEN_TIMEOUT', async () => {
        // a stream's deadline: a whole answer's first byte is the answer (issue 18.1)
        await env.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 2000 } });
        const t0 = Date.now();
        const r = await postJson(`${env.api}/chat/completions`,
            chat({ stream: true, timeouts: { first_token_ms: 300 } }));
        const dt = Date.now() - t0;
        assert.equal(r.status, 408, r.text);
        assert.equal(r.json.error.code, 'FIRST_TOKEN_TIMEOUT');
        assert.ok(dt < 1500, `answered after ${dt} ms, not after ~300 ms`);
    });

    test('timeouts.inference_ms ends a slow stream with an error event', async () => {
        await env.mock.script({ model: 'up-chat', times: 1, action: { chunk_delay_ms: 400, chunks: 10 } });
        const s = await postStream(`${env.api}/chat/completions`,
            chat({ stream: true, timeouts: { inference_ms: 1000 } }));
        assert.equal(s.status, 200);
        assert.equal(s.data.at(-1), '[DONE]');
        const err = s.events.find((e) => e && typeof e === 'object' && e.error);
        assert.ok(err, `an error event before [DONE]: ${s.text.slice(-300)}`);
        // the request's own deadline passed, not the provider's: a timeout of the inference,
        // not a stalled upstream (and the provider's health does not count it: issue 16.3)
        assert.equal(err.error.code, 'INFERENCE_TIMEOUT');
        const line = await env.gw.requestLog(s.headers.get('x-request-id'));
        assert.equal(line.ended_by, 'client');
    });

    test('a request may not raise a timeout above the configured one, and bad values are 400', async () => {
        const bad = await postJson(`${env.api}/chat/completions`, chat({ timeouts: { queue_ms: -5 } }));
        assert.equal(bad.status, 400);
        assert.equal(bad.json.error.code, 'INVALID_REQUEST');
        const notObject = await postJson(`${env.api}/chat/completions`, chat({ timeouts: 7 }));
        assert.equal(notObject.status, 400);
        // asking for more than first_byte_ms (5 s) does not lift it: the config still rules
        await env.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 300 } });
        const ok = await postJson(`${env.api}/chat/completions`, chat({ timeouts: { first_token_ms: 999999 } }));
        assert.equal(ok.status, 200, ok.text);
    });
});

describe('/v1/tasks/{id}', () => {
    test('GET shows a streaming task, DELETE cancels it: its client gets an error event, the upstream is closed', async () => {
        await env.mock.reset();
        await env.mock.script({ model: 'up-chat', times: 1, action: { chunk_delay_ms: 300, chunks: 30 } });
        const from = env.gw.logs.length;
        const streamed = postStream(`${env.api}/chat/completions`, chat({ stream: true }), { timeoutMs: 15000 });
        const line = await env.gw.waitLog((l) => l.msg === 'task_state_change' && l.to_state === 'STREAMING',
            { timeoutMs: 5000, from });
        const id = line.task_id;
        const g = await fetch(`${env.api}/tasks/${id}`, { signal: AbortSignal.timeout(5000) });
        assert.equal(g.status, 200);
        const gj = await g.json();
        assert.equal(gj.task_id, id);
        assert.equal(gj.status, 'STREAMING');
        assert.ok(gj.timing && typeof gj.timing.total_ms === 'number');
        const d = await fetch(`${env.api}/tasks/${id}`, { method: 'DELETE', signal: AbortSignal.timeout(5000) });
        assert.equal(d.status, 200);
        assert.equal((await d.json()).status, 'CANCELLED');
        const s = await streamed;
        assert.equal(s.data.at(-1), '[DONE]');
        const err = s.events.find((e) => e && typeof e === 'object' && e.error);
        assert.equal(err?.error?.code, 'REQUEST_CANCELLED');
        await waitFor(async () => (await env.mock.requests((r) => r.body?.model === 'up-chat'))
            .some((r) => r.closed_early), { timeoutMs: 3000, what: 'the mock to see its connection closed' });
        const log = await env.gw.waitLog((l) => l.msg === 'request' && l.request_id === id, { timeoutMs: 3000 });
        assert.equal(log.outcome, 'cancelled');
        assert.equal(log.task_state, 'CANCELLED');
        assert.equal(log.cancel_reason, 'request');
        assert.ok(log.released_after_ms >= 0 && log.released_after_ms < 3000, 'slot back within the grace period');
        const gone = await fetch(`${env.api}/tasks/${id}`, { signal: AbortSignal.timeout(5000) });
        assert.equal(gone.status, 404);
    });

    test('DELETE on a non-stream task answers its client 409 REQUEST_CANCELLED', async () => {
        await env.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 3000 } });
        const from = env.gw.logs.length;
        const pending = postJson(`${env.api}/chat/completions`, chat());
        const line = await env.gw.waitLog((l) => l.msg === 'task_state_change' && l.to_state === 'RUNNING',
            { timeoutMs: 5000, from });
        await sleep(50);
        const d = await fetch(`${env.api}/tasks/${line.task_id}`, { method: 'DELETE', signal: AbortSignal.timeout(5000) });
        assert.equal(d.status, 200);
        const r = await pending;
        assert.equal(r.status, 409, r.text);
        assert.equal(r.json.error.code, 'REQUEST_CANCELLED');
    });

    test('unknown task -> 404; other methods -> 405', async () => {
        const r = await fetch(`${env.api}/tasks/req-000000000000000000000000`, { signal: AbortSignal.timeout(5000) });
        assert.equal(r.status, 404);
        const p = await fetch(`${env.api}/tasks/req-000000000000000000000000`, { method: 'PUT', signal: AbortSignal.timeout(5000) });
        assert.equal(p.status, 405);
    });
});

describe('memory admission', () => {
    let menv;
    before(async () => {
        menv = await startEnv({
            timeouts: { queue_ms: 8000 },
            scheduler: { vram_bytes: 100000, safety_margin_ratio: 0.01 },
            extraModels: {
                small: { kv_cache_per_token_bytes: 500, routes: [{ provider: 'mock-openai', model: 'up-mem' }] },
            },
        });
    });
    after(async () => {
        await menv?.close();
    });

    const body = (extra = {}) => ({ model: 'small', messages: [{ role: 'user', content: 'm' }], ...extra });

    test('a task that does not fit waits until memory frees, then runs', async () => {
        // each task reserves 500 B x (input ~30 + 100 output) ~ 65 KB of a 99 KB budget: one at a time
        await menv.mock.script({ model: 'up-mem', times: 1, action: { delay_first_byte_ms: 1000 } });
        const first = postJson(`${menv.api}/chat/completions`, body({ max_tokens: 100 }));
        await sleep(200);
        const t0 = Date.now();
        const second = await postJson(`${menv.api}/chat/completions`, body({ max_tokens: 100 }));
        const r1 = await first;
        assert.equal(r1.status, 200, r1.text);
        assert.equal(second.status, 200, second.text);
        assert.ok(second.json.timing.queue_ms >= 500, `queued ${second.json.timing.queue_ms} ms`);
        assert.ok(Date.now() - t0 >= 600);
    });

    test('a task that can never fit -> 503 RESOURCE_EXHAUSTED', async () => {
        const r = await postJson(`${menv.api}/chat/completions`, body({ max_tokens: 1000 }));
        assert.equal(r.status, 503, r.text);
        assert.equal(r.json.error.code, 'RESOURCE_EXHAUSTED');
    });
});

describe('async tasks (POST /v1/tasks)', () => {
    let tenv;
    before(async () => {
        tenv = await startEnv({});
    });
    after(async () => {
        await tenv?.close();
    });

    const getTask = async (id) => {
        const r = await fetch(`${tenv.api}/tasks/${id}`, { signal: AbortSignal.timeout(5000) });
        return { status: r.status, json: await r.json() };
    };

    test('the 202 says Accepted on its status line', async () => {
        const conn = await RawConn.open(tenv.gw.port);
        try {
            await conn.write(rawRequest('POST', '/v1/tasks', { body: JSON.stringify({ model: 'chat', messages }) }));
            const r = await conn.readResponse();
            assert.equal(r.status, 202);
            assert.equal(r.statusText, 'Accepted');
            // its task ends before the next test scripts the mock (a slow build's upstream call
            // used to arrive after that script and take its one delay)
            const id = r.json().task_id;
            await waitFor(async () => ['SUCCEEDED', 'FAILED'].includes((await getTask(id)).json.status),
                { timeoutMs: 10000, what: 'the first task to end' });
        } finally {
            conn.close();
        }
    });

    test('submit answers 202 at once; poll until SUCCEEDED with the result', async () => {
        await tenv.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 800 } });
        const t0 = Date.now();
        const r = await postJson(`${tenv.api}/tasks`, { model: 'chat', messages, stream: true });
        assert.equal(r.status, 202, r.text);
        assert.ok(Date.now() - t0 < 600, 'the submit does not wait for the answer');
        const id = r.json.task_id;
        assert.match(id, /^req-[0-9a-f]{24}$/);
        const running = await getTask(id);
        assert.equal(running.status, 200);
        assert.notEqual(running.json.status, 'SUCCEEDED');
        const done = await waitFor(async () => {
            const g = await getTask(id);
            return g.json.status === 'SUCCEEDED' ? g : null;
        }, { timeoutMs: 5000, what: 'the task to finish' });
        assert.equal(done.json.http_status, 200);
        assert.equal(done.json.result.object, 'chat.completion', 'a task does not stream');
        assert.equal(done.json.result.request_id, id);
    });

    test('DELETE cancels a running task; a finished one is 409; an unknown model fails at once', async () => {
        await tenv.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 3000 } });
        const r = await postJson(`${tenv.api}/tasks`, { model: 'chat', messages });
        const id = r.json.task_id;
        await sleep(200);
        const d = await fetch(`${tenv.api}/tasks/${id}`, { method: 'DELETE', signal: AbortSignal.timeout(5000) });
        assert.equal(d.status, 200);
        const g = await getTask(id);
        assert.equal(g.json.status, 'CANCELLED');
        const again = await fetch(`${tenv.api}/tasks/${id}`, { method: 'DELETE', signal: AbortSignal.timeout(5000) });
        assert.equal(again.status, 409);
        const bad = await postJson(`${tenv.api}/tasks`, { model: 'no-such-model', messages });
        assert.equal(bad.status, 202);
        assert.equal(bad.json.status, 'FAILED');
        assert.equal(bad.json.http_status, 404);
        const notJson = await postJson(`${tenv.api}/tasks`, 'nope');
        assert.equal(notJson.status, 400);
    });

    test('records survive a restart; a task running at the stop ends FAILED (restart)', async () => {
        const ok = await postJson(`${tenv.api}/tasks`, { model: 'chat', messages });
        await waitFor(async () => (await getTask(ok.json.task_id)).json.status === 'SUCCEEDED',
            { timeoutMs: 5000, what: 'the first task' });
        await tenv.mock.script({ model: 'up-chat', times: 1, action: { hang: true } });
        const hung = await postJson(`${tenv.api}/tasks`, { model: 'chat', messages });
        await sleep(200);
        tenv.gw.child.kill('SIGKILL'); // a crash: no chance to finish anything
        await tenv.gw.exit;
        tenv.gw = await startGateway(tenv.configPath, {});
        tenv.api = `${tenv.gw.base}/v1`;
        const a = await getTask(ok.json.task_id);
        assert.equal(a.json.status, 'SUCCEEDED');
        assert.equal(a.json.result.object, 'chat.completion');
        const b = await getTask(hung.json.task_id);
        assert.equal(b.json.status, 'FAILED');
        assert.equal(b.json.reason, 'restart');
    });
});

describe('idempotency keys', () => {
    let ienv;
    before(async () => {
        ienv = await startEnv({ idempotency: { ttl_seconds: 2 } });
    });
    after(async () => {
        await ienv?.close();
    });

    const upstreamCalls = async () => (await ienv.mock.requests((r) => r.body?.model === 'up-chat')).length;

    test('twins in flight make one upstream call and get the same answer; a repeat replays it', async () => {
        await ienv.mock.reset();
        await ienv.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 700 } });
        const body = { model: 'chat', messages, idempotency_key: 'order-42' };
        const [a, b] = await Promise.all([
            postJson(`${ienv.api}/chat/completions`, body),
            (async () => {
                await sleep(150);
                return postJson(`${ienv.api}/chat/completions`, { model: 'chat', messages },
                    { headers: { 'Idempotency-Key': 'order-42' } });
            })(),
        ]);
        assert.equal(a.status, 200, a.text);
        assert.equal(b.status, 200, b.text);
        assert.equal(a.json.id, b.json.id, 'both clients got the one answer');
        assert.equal(await upstreamCalls(), 1);
        const again = await postJson(`${ienv.api}/chat/completions`, body);
        assert.equal(again.status, 200);
        assert.equal(again.headers.get('idempotent-replayed'), 'true');
        assert.equal(again.json.id, a.json.id);
        assert.equal(await upstreamCalls(), 1, 'the repeat did not reach the upstream');
        // another caller (another API key) never sees this caller's answer
        const other = await postJson(`${ienv.api}/chat/completions`, body, { headers: { Authorization: 'Bearer other' } });
        assert.equal(other.status, 200);
        assert.equal(other.headers.get('idempotent-replayed'), null);
        assert.equal(await upstreamCalls(), 2);
    });

    test('the stored answer survives a restart; after the TTL the key runs anew', async () => {
        await ienv.mock.reset();
        const body = { model: 'chat', messages, idempotency_key: 'restart-1' };
        const first = await postJson(`${ienv.api}/chat/completions`, body);
        assert.equal(first.status, 200);
        await sleep(300); // let the writer thread commit
        await ienv.gw.close();
        ienv.gw = await startGateway(ienv.configPath, {});
        ienv.api = `${ienv.gw.base}/v1`;
        const replayed = await postJson(`${ienv.api}/chat/completions`, body);
        assert.equal(replayed.headers.get('idempotent-replayed'), 'true');
        assert.equal(replayed.json.id, first.json.id);
        assert.equal(await upstreamCalls(), 1);
        await sleep(2200);
        const fresh = await postJson(`${ienv.api}/chat/completions`, body);
        assert.equal(fresh.status, 200);
        assert.equal(fresh.headers.get('idempotent-replayed'), null);
        assert.equal(await upstreamCalls(), 2);
    });
});

describe('applications and users (PRD 3.2.2)', () => {
    let aenv;
    before(async () => {
        aenv = await startEnv({
            applications: {
                batch: { max_running_tasks: 1, allowed_priorities: ['P2', 'P3'] },
                medical: { data_policy: { allow_cloud: false } },
            },
            users: { default_max_running_tasks: 1 },
            extraProviders: [{ id: 'cloud', adapter: 'openai', base_url: 'http://127.0.0.1:1/v1' }],
            extraModels: {
                mixed: {
                    routes: [
                        { provider: 'cloud', model: 'up-cloud' },
                        { provider: 'mock-openai', model: 'up-local', priority: 1 },
                    ],
                },
            },
            configure(config) {
                // mock-openai is the local engine here; "cloud" is not local
                config.providers.find((p) => p.id === 'mock-openai').local = true;
                return config;
            },
        });
    });
    after(async () => {
        await aenv?.close();
    });

    const req = (app, extra = {}) => ({ model: 'chat', messages, metadata: { application: app }, ...extra });

    test("an application's max_running_tasks queues its second task while another application's runs", async () => {
        await aenv.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 800 } });
        const first = postJson(`${aenv.api}/chat/completions`, req('batch'));
        await sleep(150);
        const [second, other] = await Promise.all([
            postJson(`${aenv.api}/chat/completions`, req('batch')),
            postJson(`${aenv.api}/chat/completions`, req('office')),
        ]);
        assert.equal((await first).status, 200);
        assert.equal(second.status, 200);
        assert.equal(other.status, 200);
        assert.ok(second.json.timing.queue_ms >= 400, `batch #2 waited ${second.json.timing.queue_ms} ms`);
        assert.ok(other.json.timing.queue_ms < 300, `another application ran at once (${other.json.timing.queue_ms} ms)`);
    });

    test('a priority the application may not use -> 403 PERMISSION_DENIED', async () => {
        const r = await postJson(`${aenv.api}/chat/completions`, req('batch', { priority: 'P0' }));
        assert.equal(r.status, 403, r.text);
        assert.equal(r.json.error.code, 'PERMISSION_DENIED');
    });

    test('users.default_max_running_tasks: one user waits for their own task, not for others', async () => {
        await aenv.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 800 } });
        const mine = (u) => ({ model: 'chat', messages, user: u });
        const first = postJson(`${aenv.api}/chat/completions`, mine('alice'));
        await sleep(150);
        const [again, bob] = await Promise.all([
            postJson(`${aenv.api}/chat/completions`, mine('alice')),
            postJson(`${aenv.api}/chat/completions`, mine('bob')),
        ]);
        assert.equal((await first).status, 200);
        assert.ok(again.json.timing.queue_ms >= 400, `alice #2 waited ${again.json.timing.queue_ms} ms`);
        assert.ok(bob.json.timing.queue_ms < 300);
    });

    test('a data policy without allow_cloud never reaches a cloud provider', async () => {
        await aenv.mock.reset();
        const r = await postJson(`${aenv.api}/chat/completions`,
            { model: 'mixed', messages, metadata: { application: 'medical' } });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.actual_model, 'up-local');
        const log = await aenv.gw.requestLog(r.headers.get('x-request-id'));
        assert.equal(log.attempts, 1, 'the cloud route was not even tried');
        assert.ok(!aenv.gw.logs.some((l) => l.msg === 'audit' && l.request_id === log.request_id));
    });

    test('an attempt on a cloud provider is audited', async () => {
        // no data policy: local first; when the local engine fails, the (unreachable) cloud
        // route is tried, and that attempt is audited
        await aenv.mock.script({ model: 'up-local', times: 1, action: { status: 500 } });
        const r = await postJson(`${aenv.api}/chat/completions`, { model: 'mixed', messages });
        assert.equal(r.status, 502, r.text);
        const id = r.headers.get('x-request-id');
        const audit = await aenv.gw.waitLog((l) => l.msg === 'audit' && l.request_id === id, { timeoutMs: 3000 });
        assert.equal(audit.event, 'cloud_egress');
        assert.equal(audit.provider, 'cloud');
    });
});

describe('scheduling metrics', () => {
    test('queue time histogram, cancellations by reason, timeouts by layer, memory reserved', async () => {
        const menv2 = await startEnv({});
        try {
            await menv2.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 2000 } });
            await postJson(`${menv2.api}/chat/completions`,
                chat({ stream: true, timeouts: { first_token_ms: 200 } }));
            const text = await menv2.gw.metrics();
            assert.match(text, /^moongate_queue_time_seconds_count\{[^}]*\} [1-9]/m);
            assert.match(text, /^moongate_timeouts_total\{layer="first_token"\} 1$/m);
            assert.match(text, /^moongate_cancellations_total\{reason="client_disconnected"\} 0$/m);
            assert.match(text, /^moongate_memory_reserved_bytes 0$/m);
        } finally {
            await menv2.close();
        }
    });
});
