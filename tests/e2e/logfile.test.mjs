// log.file (appended to, reopened on SIGUSR1 after logrotate moved it) and log.format: text
// (key=value lines), with the request's trace in them; a bad log.format fails --check.

import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { buildConfig, deadPort, gatewayBin, postJson, startMock, toYaml, waitFor, REPO_ROOT, TEST_KEY_ENV, TEST_KEY }
    from './lib/harness.mjs';

const cleanup = [];
after(async () => {
    for (const f of cleanup.reverse()) await f().catch(() => {});
});

/** A gateway whose log goes to a file: { dir, logPath, child, base, api }. */
async function startWithLogFile(log) {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-log-'));
    cleanup.push(() => fsp.rm(dir, { recursive: true, force: true }));
    const mock = await startMock();
    cleanup.push(() => mock.close());
    const logPath = path.join(dir, 'gw.log');
    const config = buildConfig(dir, mock.port, await deadPort(), {
        lua: { policies: path.join(REPO_ROOT, 'policies'), adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') },
        log: { file: logPath, ...log },
    });
    const configPath = path.join(dir, 'moongate.yaml');
    fs.writeFileSync(configPath, toYaml(config));
    const child = spawn(gatewayBin(), ['-c', configPath], {
        cwd: REPO_ROOT, env: { ...process.env, [TEST_KEY_ENV]: TEST_KEY }, stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    child.stdout.on('data', (d) => (stdout += d));
    cleanup.push(() => new Promise((r) => {
        if (child.exitCode !== null) return r();
        child.once('exit', r);
        child.kill('SIGKILL');
    }));
    const read = () => (fs.existsSync(logPath) ? fs.readFileSync(logPath, 'utf8') : '');
    const listening = await waitFor(() => /listening/.test(read()) && read(), { timeoutMs: 15000, what: 'listening in log.file' });
    const port = Number(/listen[=":]+127\.0\.0\.1:(\d+)/.exec(listening)?.[1]);
    assert.ok(port > 0, listening);
    assert.equal(stdout, '', 'nothing on stdout');
    const base = `http://127.0.0.1:${port}`;
    return { dir, logPath, child, base, api: `${base}/v1`, read };
}

const chat = { model: 'chat', messages: [{ role: 'user', content: 'log me' }] };
const TRACE = '0af7651916cd43dd8448eb211c80319c';

describe('log.file and log.format', () => {
    test('JSON lines in log.file; SIGUSR1 reopens it after a rotation', async () => {
        const gw = await startWithLogFile({});
        const r1 = await postJson(`${gw.api}/chat/completions`, chat,
            { headers: { traceparent: `00-${TRACE}-b7ad6b7169203331-01` } });
        assert.equal(r1.status, 200);
        const id1 = r1.headers.get('x-request-id');
        const line1 = await waitFor(() => gw.read().split('\n').filter(Boolean).map((l) => JSON.parse(l))
            .find((l) => l.msg === 'request' && l.request_id === id1), { what: 'request line in the file' });
        assert.equal(line1.trace_id, TRACE);

        // logrotate: move the file, signal, the next lines go to a new file of the same name
        fs.renameSync(gw.logPath, `${gw.logPath}.1`);
        gw.child.kill('SIGUSR1');
        await waitFor(() => fs.existsSync(gw.logPath) && /log.file reopened/.test(gw.read()), { what: 'reopened' });
        const r2 = await postJson(`${gw.api}/chat/completions`, chat);
        const id2 = r2.headers.get('x-request-id');
        await waitFor(() => gw.read().includes(id2), { what: 'second request in the new file' });
        const old = fs.readFileSync(`${gw.logPath}.1`, 'utf8');
        assert.ok(old.includes(id1) && !old.includes(id2), 'the first request stays in the rotated file');
        assert.ok(!gw.read().includes(id1));
    });

    test('log.format: text gives key=value lines with the trace', async () => {
        const gw = await startWithLogFile({ format: 'text' });
        const r = await postJson(`${gw.api}/chat/completions`, chat,
            { headers: { traceparent: `00-${TRACE}-b7ad6b7169203331-01` } });
        assert.equal(r.status, 200);
        const id = r.headers.get('x-request-id');
        const line = await waitFor(() => gw.read().split('\n').find((l) => / info request /.test(l) && l.includes(id)),
            { what: 'text request line' });
        assert.match(line, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z info request /);
        assert.match(line, new RegExp(` request_id=${id} trace_id=${TRACE} span_id=[0-9a-f]{16} `));
        assert.match(line, / status=200 /);
        assert.match(line, / model=chat /);
        assert.match(line, / path=\/v1\/chat\/completions /);
        assert.ok(!line.startsWith('{'));
    });

    test('a log.format other than json or text fails --check', async () => {
        const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-logcheck-'));
        cleanup.push(() => fsp.rm(dir, { recursive: true, force: true }));
        const config = buildConfig(dir, 1, 2, { log: { format: 'xml' } });
        const configPath = path.join(dir, 'moongate.yaml');
        fs.writeFileSync(configPath, toYaml(config));
        const r = spawnSync(gatewayBin(), ['--check', '-c', configPath], { cwd: REPO_ROOT, encoding: 'utf8', timeout: 10000 });
        assert.notEqual(r.status, 0);
        assert.match(r.stderr + r.stdout, /log\.format must be json or text/);
    });
});
