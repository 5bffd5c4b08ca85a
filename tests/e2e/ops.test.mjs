// Operations: the systemd unit verifies, the log file is reopened after logrotate moved it,
// an online backup taken under load is a whole database, and the in-process upkeep (backups,
// integrity check) shows in the metrics.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
    REPO_ROOT, TEST_KEY, TEST_KEY_ENV, buildConfig, gatewayBin, postJson, startEnv, toYaml, waitFor,
    withTimeout,
} from './lib/harness.mjs';

const lua = {
    policies: path.join(REPO_ROOT, 'policies'),
    adapters: path.join(REPO_ROOT, 'adapters'),
    lib: path.join(REPO_ROOT, 'lua'),
};

function chat(base, content = 'hi') {
    return postJson(`${base}/v1/chat/completions`, { model: 'chat', messages: [{ role: 'user', content }] });
}

/** Run a command without blocking this process's event loop; resolves {status, stdout, stderr}. */
function runAsync(cmd, args, timeoutMs = 30000) {
    const child = spawn(cmd, args, { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    return withTimeout(new Promise((resolve) => child.on('close', (status) => resolve({ status, stdout, stderr }))),
        timeoutMs, `${cmd} ${args.join(' ')}`);
}

function sqlite(db, sql) {
    return execFileSync('sqlite3', [db, sql], { encoding: 'utf8', timeout: 10000 }).trim();
}

describe('systemd unit', () => {
    test('verifies with systemd-analyze and carries the hardening the issue names', () => {
        const src = fs.readFileSync(path.join(REPO_ROOT, 'config/systemd/moongate.service'), 'utf8');
        for (const d of ['Type=notify', 'ProtectSystem=strict', 'NoNewPrivileges=yes', 'PrivateTmp=yes',
            'MemoryMax=', 'LimitNOFILE=65536', 'User=moongate', 'ReadWritePaths=/var/lib/moongate',
            'ExecReload=/bin/kill -HUP $MAINPID'])
            assert.ok(src.includes(d), `the unit says ${d}`);
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moongate-unit-'));
        try {
            // verify checks that the commands exist: point them at this build
            const unit = path.join(dir, 'moongate.service');
            fs.writeFileSync(unit, src.replaceAll('/usr/bin/moongate', gatewayBin()));
            const r = spawnSync('systemd-analyze', ['verify', unit], { encoding: 'utf8', timeout: 30000 });
            assert.equal(r.status, 0, r.stderr);
            const ours = r.stderr.split('\n').filter((l) => l.includes('moongate.service'));
            assert.deepEqual(ours, [], 'systemd-analyze has nothing to say about the unit');
        } finally {
            fs.rmSync(dir, { recursive: true, force: true });
        }
    });
});

describe('log.file and logrotate', () => {
    let dir;
    let child;
    before(() => {
        dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moongate-logfile-'));
    });
    after(async () => {
        if (child && child.exitCode === null) {
            child.kill('SIGTERM');
            await withTimeout(new Promise((r) => child.once('exit', r)), 5000, 'exit').catch(() => child.kill('SIGKILL'));
        }
        fs.rmSync(dir, { recursive: true, force: true });
    });

    const lines = (file) => (fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '')
        .split('\n').filter(Boolean).map((l) => JSON.parse(l));

    test('the log goes to log.file, and after logrotate and SIGUSR1 to the new one, no line lost', async () => {
        const { startMock } = await import('./lib/harness.mjs');
        const mock = await startMock();
        try {
            const logFile = path.join(dir, 'moongate.log');
            const cfg = buildConfig(dir, mock.port, 1, { lua, log: { file: logFile } });
            const cfgPath = path.join(dir, 'moongate.yaml');
            fs.writeFileSync(cfgPath, toYaml(cfg));
            child = spawn(gatewayBin(), ['-c', cfgPath], {
                cwd: REPO_ROOT, env: { ...process.env, [TEST_KEY_ENV]: TEST_KEY }, stdio: ['ignore', 'pipe', 'pipe'],
            });
            let stdout = '';
            child.stdout.on('data', (d) => (stdout += d));
            const listening = await waitFor(() => lines(logFile).find((l) => l.msg === 'listening'),
                { timeoutMs: 10000, what: 'listening line in log.file' });
            const base = `http://127.0.0.1:${/:(\d+)$/.exec(listening.listen)[1]}`;
            const first = await chat(base, 'before rotation');
            assert.equal(first.status, 200);
            const id1 = first.headers.get('x-request-id');
            await waitFor(() => lines(logFile).some((l) => l.request_id === id1), { what: 'first request line' });

            // logrotate as installed, with the signal sent to this process instead of the unit
            const conf = fs.readFileSync(path.join(REPO_ROOT, 'config/logrotate/moongate'), 'utf8')
                .replaceAll('/var/log/moongate/moongate.log', logFile)
                .replace(/^\s*create .*$/m, '')
                .replace(/systemctl kill .*$/m, `kill -USR1 ${child.pid}`);
            const confPath = path.join(dir, 'logrotate.conf');
            fs.writeFileSync(confPath, conf);
            const r = spawnSync('logrotate', ['-f', '-s', path.join(dir, 'logrotate.state'), confPath],
                { encoding: 'utf8', timeout: 15000 });
            assert.equal(r.status, 0, r.stderr);
            const rotated = `${logFile}.1`;
            assert.ok(fs.existsSync(rotated), 'the old file was moved to .1');
            await waitFor(() => lines(logFile).some((l) => l.msg === 'log.file reopened: ' + logFile),
                { timeoutMs: 5000, what: 'reopened line in the new file' });

            const second = await chat(base, 'after rotation');
            assert.equal(second.status, 200);
            const id2 = second.headers.get('x-request-id');
            await waitFor(() => lines(logFile).some((l) => l.request_id === id2), { what: 'second request line' });
            assert.ok(lines(rotated).some((l) => l.request_id === id1), 'the first request is in the rotated file');
            assert.ok(!lines(rotated).some((l) => l.request_id === id2), 'the second is not');
            assert.equal(stdout, '', 'nothing went to stdout');
        } finally {
            await mock.close();
        }
    });
});

describe('backups', () => {
    let env;
    let backupDir;
    before(async () => {
        env = await startEnv({
            configure: (c, e) => {
                backupDir = path.join(e.dir, 'backups');
                c.storage = { ...c.storage, backup: { dir: backupDir, every_hours: 24, keep_days: 7 } };
                return c;
            },
        });
    });
    after(() => env?.close());

    test('moongate backup under load makes a whole, consistent copy', async () => {
        const dest = path.join(env.dir, 'copy.db');
        let stop = false;
        let sent = 0;
        const load = (async () => {
            while (!stop && sent < 2000) {
                const batch = Array.from({ length: 8 }, () => chat(env.base));
                sent += batch.length;
                const rs = await Promise.all(batch);
                for (const r of rs) assert.equal(r.status, 200);
            }
        })();
        const r = await runAsync(gatewayBin(), ['backup', dest, '-c', env.configPath]);
        stop = true;
        await load;
        assert.ok(sent > 0, 'requests ran while the backup was taken');
        assert.equal(r.status, 0, r.stderr);
        assert.match(r.stdout, /backed up .* to /);
        assert.equal(sqlite(dest, 'PRAGMA integrity_check'), 'ok');
        assert.ok(Number(sqlite(dest, 'SELECT COUNT(*) FROM schema_migrations')) > 0);
        assert.ok(!fs.existsSync(`${dest}.tmp`));
    });

    test('a missing destination directory is a clear error, exit 1', () => {
        const r = spawnSync(gatewayBin(), ['backup', path.join(env.dir, 'no/such/dir/x.db'), '-c', env.configPath],
            { cwd: REPO_ROOT, encoding: 'utf8', timeout: 30000 });
        assert.equal(r.status, 1);
        assert.match(r.stderr, /moongate: .*x\.db\.tmp/);
        const usage = spawnSync(gatewayBin(), ['backup'], { encoding: 'utf8', timeout: 10000 });
        assert.equal(usage.status, 2);
        assert.match(usage.stderr, /destination/);
    });

    test('storage.backup: a backup at start, the integrity check, both in the metrics', async () => {
        await waitFor(async () => /moongate_db_backups_total\{result="ok"\} 1/.test(await env.gw.metrics()),
            { timeoutMs: 10000, what: 'first in-process backup' });
        const text = await env.gw.metrics();
        assert.match(text, /^sidecar_db_integrity_ok 1$/m);
        assert.match(text, /^moongate_db_backups_total\{result="failed"\} 0$/m);
        assert.match(text, /^moongate_db_last_backup_timestamp_seconds [1-9]\d+$/m);
        await waitFor(async () => /^sidecar_db_size_bytes [1-9]\d*$/m.test(await env.gw.metrics()),
            { timeoutMs: 15000, what: 'database size measured' });
        const files = fs.readdirSync(backupDir).filter((f) => /^moongate-\d{8}-\d{6}\.db$/.test(f));
        assert.equal(files.length, 1);
        assert.equal(sqlite(path.join(backupDir, files[0]), 'PRAGMA integrity_check'), 'ok');
    });
});
