// The command line: --help, --check on a valid and on broken configs.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { buildConfig, gatewayBin, toYaml, withTimeout, REPO_ROOT } from './lib/harness.mjs';

let dir;

before(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moongate-cli-'));
});

after(() => {
    fs.rmSync(dir, { recursive: true, force: true });
});

/** Run the binary to completion (bounded); resolves { code, signal, stdout, stderr }. */
function run(args, timeoutMs = 10000) {
    const bin = gatewayBin();
    assert.ok(fs.existsSync(bin), `gateway binary not found at ${bin}`);
    const child = spawn(bin, args, { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    return withTimeout(new Promise((resolve) => {
        child.on('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
    }), timeoutMs, `moongate ${args.join(' ')}`).catch((err) => {
        child.kill('SIGKILL');
        throw err;
    });
}

function writeConfig(name, text) {
    const p = path.join(dir, name);
    fs.writeFileSync(p, text);
    return p;
}

const lua = {
    policies: path.join(REPO_ROOT, 'policies'),
    adapters: path.join(REPO_ROOT, 'adapters'),
    lib: path.join(REPO_ROOT, 'lua'),
};

test('--help exits 0 and documents -c and --check', async () => {
    const r = await run(['--help']);
    assert.equal(r.code, 0);
    assert.match(r.stdout + r.stderr, /-c/);
    assert.match(r.stdout + r.stderr, /--check/);
});

test('--check accepts the e2e config', async () => {
    const p = writeConfig('good.yaml', toYaml(buildConfig(dir, 9, 10, { lua })));
    const r = await run(['--check', '-c', p]);
    assert.equal(r.code, 0, `stderr: ${r.stderr}`);
});

test('--check rejects a route to an unknown provider with FILE:LINE: reason', async () => {
    const c = buildConfig(dir, 9, 10, { lua });
    c.models.bad = { routes: [{ provider: 'nope', model: 'x' }] };
    const p = writeConfig('bad-provider.yaml', toYaml(c));
    const r = await run(['--check', '-c', p]);
    assert.notEqual(r.code, 0);
    assert.ok(r.stderr.includes(`${p}:`) || r.stderr.includes('bad-provider.yaml:'), `stderr: ${r.stderr}`);
    assert.match(r.stderr, /bad-provider\.yaml:\d+: \S/);
});

test('--check rejects broken YAML with FILE:LINE', async () => {
    const p = writeConfig('broken.yaml', 'server:\n  listen: 127.0.0.1:0\n  bad: [unclosed\n');
    const r = await run(['--check', '-c', p]);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /broken\.yaml:\d+/);
});

test('a missing config file is an error, not a crash', async () => {
    const r = await run(['--check', '-c', path.join(dir, 'does-not-exist.yaml')]);
    assert.notEqual(r.code, 0);
    assert.equal(r.signal, null, 'no crash');
    assert.match(r.stderr, /does-not-exist\.yaml/);
});
