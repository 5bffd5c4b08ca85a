#!/usr/bin/env node
// Fault trials with figures (issue 23): `make trials` runs them and prints a table. Every
// trial is bounded in count and time; TRIALS_SHORT=1 runs the short form (fewer rounds).
//   sighup      reloads 100 ms apart, alternating a valid and a broken config, under steady
//               stream and non-stream load: failed requests (goal 0)
//   kill9       kill -9 under load, restart: PRAGMA integrity_check passes every time
//   upstream    per fault (500 with HTML, reset mid-stream, garbage, no [DONE], connection
//               refused): streamed requests that end with a clear error; none looks like
//               success, none hangs
// Needs build/moongate (MOONGATE_BIN) and the test tooling (tests/node_modules, sqlite3).
import fs from 'node:fs';
import { postJson, postStream, sleep, sqliteRows, startEnv, startGateway } from '../tests/e2e/lib/harness.mjs';

const SHORT = !!process.env.TRIALS_SHORT;
const rows = [];
const row = (trial, runs, figure, goal, ok) => rows.push({ trial, runs, figure, goal, ok: ok ? 'yes' : 'NO' });
const chatBody = (stream) => ({ model: 'chat', stream, messages: [{ role: 'user', content: 'hello there' }] });

async function one(env, stream) {
    try {
        if (!stream) return (await postJson(`${env.api}/chat/completions`, chatBody(false))).status === 200;
        const r = await postStream(`${env.api}/chat/completions`, chatBody(true));
        return r.status === 200 && r.text.includes('[DONE]') && !r.text.includes('"error"');
    } catch {
        return false;
    }
}

/* steady load until stop(): 4 workers, two streaming */
function load(env) {
    let stop = false, ok = 0, failed = 0;
    const worker = async (stream) => {
        while (!stop) (await one(env, stream)) ? ok++ : failed++;
    };
    const ws = [worker(false), worker(false), worker(true), worker(true)];
    return { stop: async () => { stop = true; await Promise.all(ws); return { ok, failed }; } };
}

async function sighup() {
    const env = await startEnv({});
    const good = fs.readFileSync(env.configPath, 'utf8');
    const n = SHORT ? 20 : 100;
    const l = load(env);
    for (let i = 0; i < n; i++) {
        fs.writeFileSync(env.configPath, i % 2 ? 'server: [unclosed\n' : good);
        env.gw.child.kill('SIGHUP');
        await sleep(100);
    }
    fs.writeFileSync(env.configPath, good);
    const { ok, failed } = await l.stop();
    await env.close();
    row('SIGHUP storm', `${n} reloads, ${ok + failed} requests`, `${failed} failed`, '0 failed', failed === 0);
}

async function kill9() {
    const env = await startEnv({});
    const n = SHORT ? 5 : 100;
    let intact = 0;
    for (let i = 0; i < n; i++) {
        const l = load(env);
        await sleep(150);
        env.gw.child.kill('SIGKILL');
        await l.stop();
        await new Promise((r) => (env.gw.exited ? r() : env.gw.child.once('exit', r)));
        const check = sqliteRows(env.config.storage.path, 'PRAGMA integrity_check');
        if (check.length === 1 && check[0].integrity_check === 'ok') intact++;
        env.gw = await startGateway(env.configPath);
        env.api = `${env.gw.base}/v1`;
    }
    await env.close();
    row('kill -9 under load', `${n} kills`, `${intact}/${n} integrity_check ok`, `${n}/${n}`, intact === n);
}

async function upstream() {
    const env = await startEnv({ extraModels: { 'dead-only': { routes: [{ provider: 'dead', model: 'up-dead' }] } } });
    const n = SHORT ? 20 : 100;
    const faults = [
        ['500 with HTML', { status: 500, body: '<html><body>Internal Server Error</body></html>' }],
        ['reset mid-stream', { reset_after_chunks: 2 }],
        ['garbage', { garbage: true }],
        ['no [DONE]', { truncate_after_chunks: 2 }],
    ];
    for (const [name, action] of faults) {
        await env.mock.script({ model: 'up-chat', action });
        let clear = 0, success = 0, hung = 0;
        for (let i = 0; i < n; i++) {
            try {
                const r = await postStream(`${env.api}/chat/completions`, chatBody(true), { timeoutMs: 10000 });
                const looksOk = r.status === 200 && r.text.includes('[DONE]') && !r.text.includes('"error"');
                looksOk ? success++ : clear++;
            } catch {
                hung++;
            }
        }
        await env.mock.reset?.();
        row(`upstream: ${name}`, `${n} streams`, `${clear} clear errors, ${success} look ok, ${hung} hung`, `${n} clear`, clear === n);
    }
    let clear = 0;
    for (let i = 0; i < n; i++) {
        const r = await postStream(`${env.api}/chat/completions`, { ...chatBody(true), model: 'dead-only' }).catch(() => null);
        if (r && r.status >= 500) clear++;
    }
    await env.close();
    row('upstream: refused', `${n} streams`, `${clear} clear errors`, `${n} clear`, clear === n);
}

const only = process.argv[2];
for (const [name, fn] of [['sighup', sighup], ['kill9', kill9], ['upstream', upstream]]) {
    if (only && only !== name) continue;
    const t0 = Date.now(), first = rows.length;
    await fn();
    const secs = ((Date.now() - t0) / 1000).toFixed(1);
    for (let i = first; i < rows.length; i++) rows[i].seconds = i === first ? secs : '';
}
console.table(rows);
process.exit(rows.every((r) => r.ok === 'yes') ? 0 : 1);
