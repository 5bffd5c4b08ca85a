// The disk full under the store's writer (issue 23): the store lives on a small tmpfs that a
// filler file fills up. Requests keep being answered, /status, the metric and a log line say
// the disk is full, the usage events wait in memory and are all written once the filler is
// gone; the database passes PRAGMA integrity_check. Needs root (mount); skipped otherwise.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { postJson, sqliteRows, startEnv, waitFor } from './lib/harness.mjs';

const disk = fs.mkdtempSync(path.join(os.tmpdir(), 'moongate-diskfull-'));
let mounted = false;
try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=3m', 'tmpfs', disk], { stdio: 'ignore' });
    mounted = true;
} catch {
    /* not root, or no mount in this container: skipped below */
}
const db = path.join(disk, 'moongate.db');
const filler = path.join(disk, 'filler');
let env;

before(async () => {
    if (!mounted) return;
    env = await startEnv({ configure: (c) => ({ ...c, storage: { ...c.storage, path: db } }) });
});

after(async () => {
    await env?.close();
    if (mounted) execFileSync('umount', ['-l', disk]);
    fs.rmSync(disk, { recursive: true, force: true });
});

const chat = (i) => postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: `request ${i}` }] });
const gauge = async (name) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(await env.gw.metrics())?.[1]);

function fill() {
    const fd = fs.openSync(filler, 'w');
    const block = Buffer.alloc(64 * 1024, 1);
    try {
        for (let i = 0; i < 1000; i++) fs.writeSync(fd, block); // 64 MiB at most: the disk is 3
    } catch (e) {
        if (e.code !== 'ENOSPC') throw e;
    } finally {
        fs.closeSync(fd);
    }
}

describe('the disk full', { skip: mounted ? false : 'needs root to mount a small tmpfs' }, () => {
    test('requests are served, the full disk is said, the held writes land when it has room', async () => {
        let sent = 0;
        for (; sent < 5; sent++) assert.equal((await chat(sent)).status, 200);
        await waitFor(async () => sqliteRows(db, 'SELECT count(*) AS n FROM usage_events')[0].n === 5, { what: 'the first events' });
        fill();
        // serving goes on while the writer finds the disk full (bounded: 3000 requests)
        let full = 0;
        for (let batch = 0; batch < 150 && !full; batch++) {
            const rs = await Promise.all(Array.from({ length: 20 }, () => chat(sent++)))
            for (const r of rs) assert.equal(r.status, 200, r.text);
            full = await gauge('moongate_store_disk_full');
        }
        assert.equal(full, 1, 'the writer found the disk full');
        const st = await env.gw.getJson('/status');
        assert.equal(st.json.store.disk_full, true);
        assert.ok(env.gw.rawLines.some((l) => l.includes('the disk is full')), 'a log line says it');
        for (let i = 0; i < 20; i++) assert.equal((await chat(sent++)).status, 200);
        assert.ok(await gauge('moongate_store_disk_full_total') >= 1);
        // the room comes back: every held write is committed, none lost
        fs.rmSync(filler);
        await waitFor(async () => (await gauge('moongate_store_disk_full')) === 0, { timeoutMs: 15000, what: 'the writer to recover' });
        await waitFor(async () => sqliteRows(db, 'SELECT count(*) AS n FROM usage_events')[0].n === sent,
            { timeoutMs: 15000, what: `all ${sent} usage events` });
        await waitFor(async () => env.gw.rawLines.some((l) => l.includes('the disk has room again')),
            { timeoutMs: 5000, what: 'the line that says it' });
        assert.equal(await gauge('moongate_store_refused_writes_total'), 0);
        assert.equal((await env.gw.getJson('/status')).json.store.disk_full, false);
        assert.deepEqual(sqliteRows(db, 'PRAGMA integrity_check'), [{ integrity_check: 'ok' }]);
        assert.equal((await chat(sent++)).status, 200, 'and serving goes on');
    });
});
