// Hot reload (SIGHUP) and graceful shutdown (SIGTERM). Uses copies of policies/ and adapters/
// in the temp dir so that the tests can break them.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startEnv, postJson, postStream, sleep, withTimeout, waitFor, RawConn, rawRequest, toYaml } from './lib/harness.mjs';
import { contentFor } from '../mock/engine.mjs';

let env;
let routingPath;
let routingOriginal;

before(async () => {
    env = await startEnv({ copyLua: true });
    routingPath = path.join(env.lua.policies, 'routing.lua');
    routingOriginal = fs.readFileSync(routingPath, 'utf8');
});

after(async () => {
    await env?.close();
});

const messages = [{ role: 'user', content: 'reload me' }];

async function status() {
    const r = await env.gw.getJson('/status');
    assert.equal(r.status, 200);
    return r.json;
}

async function chatOk(model = 'chat') {
    const r = await postJson(`${env.api}/chat/completions`, { model, messages });
    assert.equal(r.status, 200, `request to ${model} after reload: ${r.text.slice(0, 300)}`);
    return r.json;
}

function restoreRouting() {
    fs.writeFileSync(routingPath, routingOriginal);
}

test('SIGHUP after adding a logical model: new requests see it, generation increments', async () => {
    const g0 = (await status()).generation;
    const before404 = await postJson(`${env.api}/chat/completions`, { model: 'added', messages });
    assert.equal(before404.status, 404);
    const config = structuredClone(env.config);
    config.models.added = { routes: [{ provider: 'mock-openai-b', model: 'up-added' }] };
    env.writeConfig(config);
    const line = await env.gw.reload();
    assert.equal(line.result, 'ok', `reload line: ${JSON.stringify(line)}`);
    assert.equal(line.generation, g0 + 1);
    const s = await status();
    assert.equal(s.generation, g0 + 1);
    assert.equal(s.reload?.result, 'ok');
    const j = await chatOk('added');
    assert.equal(j.choices[0].message.content, contentFor('up-added'));
    const models = await env.gw.getJson('/v1/models');
    assert.ok(models.json.data.some((m) => m.id === 'added'), '/v1/models lists the new model');
});

test('SIGHUP with a syntax error in the routing policy: reload fails with file:line, serving goes on', async () => {
    const g0 = (await status()).generation;
    fs.writeFileSync(routingPath, '-- e2e: broken on purpose\n-- the next line is a syntax error\nlocal broken = = 1\n' +
        routingOriginal);
    try {
        const line = await env.gw.reload();
        assert.equal(line.result, 'failed', `reload line: ${JSON.stringify(line)}`);
        assert.match(String(line.error), /routing\.lua:3\b/, `error names the file and line: ${line.error}`);
        const s = await status();
        assert.equal(s.generation, g0, 'a failed reload keeps the generation');
        assert.equal(s.reload?.result, 'failed');
        assert.match(String(s.reload?.error), /routing\.lua/);
        await chatOk();
        await chatOk('added');
    } finally {
        restoreRouting();
    }
});

test('SIGHUP with a routing policy missing route(): reload fails, serving goes on', async () => {
    const g0 = (await status()).generation;
    fs.writeFileSync(routingPath, 'local M = { name = "routing", version = 1 }\nreturn M\n');
    try {
        const line = await env.gw.reload();
        assert.equal(line.result, 'failed', `reload line: ${JSON.stringify(line)}`);
        assert.match(String(line.error), /routing\.lua/);
        assert.match(String(line.error), /route/);
        const s = await status();
        assert.equal(s.generation, g0);
        assert.equal(s.reload?.result, 'failed');
        await chatOk();
    } finally {
        restoreRouting();
    }
    const line = await env.gw.reload();
    assert.equal(line.result, 'ok', 'the restored policy reloads');
    assert.equal((await status()).reload?.result, 'ok');
});

test('SIGHUP with a policy or adapter of another API version: reload fails naming the file, nothing changes', async () => {
    const adapterPath = path.join(env.lua.adapters, 'openai.lua');
    const adapterOriginal = fs.readFileSync(adapterPath, 'utf8');
    const cases = [
        [routingPath, routingOriginal.replace('version = 1', 'version = 2'), /routing\.lua: version = 2, but this gateway speaks API version 1/],
        [routingPath, routingOriginal.replace('name = "routing", version = 1', 'name = "routing"'), /routing\.lua: the module table needs version = 1/],
        [adapterPath, adapterOriginal.replace('name = "openai", ', ''), /openai\.lua: the module table needs name = "openai"/],
    ];
    for (const [file, text, reason] of cases) {
        const original = file === routingPath ? routingOriginal : adapterOriginal;
        assert.notEqual(text, original, `the case edits ${path.basename(file)}`);
        const g0 = (await status()).generation;
        fs.writeFileSync(file, text);
        try {
            const line = await env.gw.reload();
            assert.equal(line.result, 'failed', `reload line: ${JSON.stringify(line)}`);
            assert.match(String(line.error), reason);
            const s = await status();
            assert.equal(s.generation, g0, 'a failed reload keeps the generation');
            assert.match(String(s.reload?.error), reason);
            await chatOk();
        } finally {
            fs.writeFileSync(file, original);
        }
    }
    const line = await env.gw.reload();
    assert.equal(line.result, 'ok', 'the restored files reload');
});

test('SIGHUP with a changed routing policy: the next request follows it (kept plans end with their generation)', async () => {
    // the default policy's plan for the one-route model 'added' holds (plan.reuse): it is kept
    await chatOk('added');
    await chatOk('added');
    fs.writeFileSync(routingPath, 'local M = { name = "routing", version = 1 }\n' +
        'function M.route(req, candidates) return {} end\nreturn M\n');
    try {
        const line = await env.gw.reload();
        assert.equal(line.result, 'ok', `reload line: ${JSON.stringify(line)}`);
        const r = await postJson(`${env.api}/chat/completions`, { model: 'added', messages });
        assert.equal(r.status, 503, `the new policy serves nothing: ${r.text.slice(0, 300)}`);
        assert.equal(r.json?.error?.code, 'MODEL_UNAVAILABLE');
    } finally {
        restoreRouting();
    }
    const line = await env.gw.reload();
    assert.equal(line.result, 'ok', 'the restored policy reloads');
    await chatOk('added');
});

test('SIGHUP with a syntax error in an adapter: reload fails with adapter file:line, serving goes on', async () => {
    const adapterPath = path.join(env.lua.adapters, 'openai.lua');
    const original = fs.readFileSync(adapterPath, 'utf8');
    const g0 = (await status()).generation;
    fs.writeFileSync(adapterPath, '-- e2e: broken on purpose\nlocal broken = = 1\n' + original);
    try {
        const line = await env.gw.reload();
        assert.equal(line.result, 'failed', `reload line: ${JSON.stringify(line)}`);
        assert.match(String(line.error), /openai\.lua:2\b/, `error names the file and line: ${line.error}`);
        assert.equal((await status()).generation, g0);
        await chatOk();
    } finally {
        fs.writeFileSync(adapterPath, original);
    }
    const line = await env.gw.reload();
    assert.equal(line.result, 'ok', 'the restored adapter reloads');
});

test('SIGHUP with an invalid config: reload fails with config file:line, serving goes on', async () => {
    const good = fs.readFileSync(env.configPath, 'utf8');
    const g0 = (await status()).generation;
    // a route that names a provider that does not exist
    const config = structuredClone(env.config);
    config.models.broken = { routes: [{ provider: 'no-such-provider', model: 'x' }] };
    env.writeConfig(config);
    try {
        const line = await env.gw.reload();
        assert.equal(line.result, 'failed', `reload line: ${JSON.stringify(line)}`);
        assert.match(String(line.error), /moongate\.yaml:\d+/, `error names the config file and line: ${line.error}`);
        assert.equal((await status()).generation, g0);
        await chatOk();
    } finally {
        fs.writeFileSync(env.configPath, good);
        delete env.config.models.broken;
    }
    assert.equal((await env.gw.reload()).result, 'ok');
});

test('SIGHUP during a long stream: the stream completes normally', async () => {
    await env.mock.script({ model: 'up-chat', times: 1, action: { chunk_delay_ms: 100, chunks: 15 } });
    const r = await fetch(`${env.api}/chat/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'chat', messages, stream: true }),
        signal: AbortSignal.timeout(15000),
    });
    assert.equal(r.status, 200);
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let text = '';
    const first = await reader.read();
    text += dec.decode(first.value, { stream: true });
    const line = await env.gw.reload();
    assert.equal(line.result, 'ok');
    for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        text += dec.decode(value, { stream: true });
    }
    const data = text.split('\n\n').filter((b) => b.startsWith('data: ')).map((b) => b.slice(6));
    assert.equal(data.at(-1), '[DONE]');
    const events = data.slice(0, -1).map((d) => JSON.parse(d));
    assert.ok(!events.some((e) => e.error), 'no error event');
    assert.equal(events.map((e) => e.choices?.[0]?.delta?.content ?? '').join(''), contentFor('up-chat', 15));
    assert.equal(events.at(-1).choices[0].finish_reason, 'stop');
});

test('SIGHUP 5 times under steady load: zero failed requests', async (t) => {
    await env.mock.script({ model: 'up-chat', action: { chunk_delay_ms: 10, chunks: 5 } });
    const CLIENTS = 8;
    const MAX_PER_CLIENT = 150;
    const DEADLINE = Date.now() + 3500;
    let stop = false;
    const failures = [];
    let done = 0;
    const client = async (i) => {
        for (let n = 0; n < MAX_PER_CLIENT && !stop && Date.now() < DEADLINE; n++) {
            try {
                if ((i + n) % 2 === 0) {
                    const s = await postStream(`${env.api}/chat/completions`,
                        { model: 'chat', messages, stream: true }, { timeoutMs: 10000 });
                    const ok = s.status === 200 && !s.error && s.data.at(-1) === '[DONE]' && !s.events.some((e) => e?.error);
                    if (!ok) failures.push(`stream: status ${s.status} ${s.error ?? ''} ${s.data.slice(-2).join(' | ')}`);
                } else {
                    const r = await postJson(`${env.api}/chat/completions`, { model: 'failover', messages }, { timeoutMs: 10000 });
                    if (r.status !== 200) failures.push(`non-stream: ${r.status} ${r.text.slice(0, 200)}`);
                }
            } catch (err) {
                failures.push(`client ${i}: ${err.message}`);
            }
            done++;
        }
    };
    const g0 = (await status()).generation;
    const load = Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(i)));
    const results = [];
    try {
        for (let k = 0; k < 5; k++) {
            await sleep(400);
            results.push(await env.gw.reload());
        }
    } finally {
        await withTimeout(load, 20000, 'load clients').finally(() => {
            stop = true;
        });
        await env.mock.reset();
    }
    t.diagnostic(`${done} requests by ${CLIENTS} clients, ${failures.length} failed`);
    assert.deepEqual(results.map((l) => l.result), ['ok', 'ok', 'ok', 'ok', 'ok']);
    assert.equal((await status()).generation, g0 + 5);
    assert.ok(done >= CLIENTS * 3, `load too light to mean anything: ${done} requests`);
    assert.deepEqual(failures.slice(0, 10), [], `${failures.length} of ${done} requests failed`);
});

test('a SIGHUP during a running reload is not lost: the last signal always wins (10 bursts)', async () => {
    const configWith = (name) => {
        const c = structuredClone(env.config);
        c.models[name] = { routes: [{ provider: 'mock-openai-b', model: `up-${name}` }] };
        return toYaml(c);
    };
    const put = (text) => { // what an operator's deploy does: write beside, rename into place
        fs.writeFileSync(`${env.configPath}.next`, text);
        fs.renameSync(`${env.configPath}.next`, env.configPath);
    };
    const served = async () => (await env.gw.getJson('/v1/models')).json.data.map((m) => m.id);
    for (let burst = 0; burst < 10; burst++) {
        const a = `burst-a${burst}`, b = `burst-b${burst}`;
        put(configWith(a));
        env.gw.hup();
        await new Promise((r) => setTimeout(r, 0)); // the first reload is still building
        put(configWith(b));
        env.gw.hup();
        await waitFor(async () => (await served()).includes(b),
            { timeoutMs: 5000, what: `burst ${burst}: the last config (${b}) in force` });
        assert.ok(!(await served()).includes(a), `burst ${burst}: ${a} is gone`);
    }
    put(toYaml(env.config));
    assert.equal((await env.gw.reload()).result, 'ok');
});

test('SIGTERM with an in-flight stream: the stream completes, then the process exits 0', async () => {
    await env.mock.script({ model: 'up-chat', times: 1, action: { chunk_delay_ms: 100, chunks: 20 } });
    const streamP = postStream(`${env.api}/chat/completions`, { model: 'chat', messages, stream: true }, { timeoutMs: 15000 });
    await env.mock.waitRequest((r) => r.body?.model === 'up-chat' && !r.finished && r.body.stream, { timeoutMs: 3000 });
    await sleep(150);
    env.gw.term();
    // it stops accepting: a new connection is refused (or at least not served) while the stream drains
    await waitFor(async () => {
        let c;
        try {
            c = await RawConn.open(env.gw.port, '127.0.0.1', 1000);
        } catch (err) {
            return err.code === 'ECONNREFUSED';
        }
        try {
            await c.write(rawRequest('GET', '/health'));
            const r = await c.readResponse(1000).catch(() => null);
            return r === null || r.status === 503;
        } finally {
            c.close();
        }
    }, { timeoutMs: 1500, intervalMs: 100, what: 'the listener to stop accepting after SIGTERM' });
    const s = await streamP;
    assert.equal(s.status, 200);
    assert.equal(s.error, null);
    assert.equal(s.data.at(-1), '[DONE]');
    assert.ok(!s.events.some((e) => e?.error), 'no error event');
    assert.equal(s.events.slice(0, -1).map((e) => e.choices?.[0]?.delta?.content ?? '').join(''), contentFor('up-chat', 20));
    const { code, signal } = await env.gw.waitExit(10000);
    assert.equal(signal, null);
    assert.equal(code, 0);
});
