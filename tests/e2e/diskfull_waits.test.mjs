// The disk full and the answers that wait for a commit (issue 23): with auth on and a price, a
// key's answer waits for its spend's commit, an idempotent one for its stored answer, a
// prepaid one for its reservation. The store lives on a small tmpfs that a filler file fills
// up. While it is full the spend and the idempotency record are held in memory and the
// answers go at once (before: they waited for the disk), a prepaid request is refused at once
// with 503 DISK_FULL (its reservation is never held in memory); once the disk has room, the
// idempotent answer replays, the held spend is in the database, prepaid requests pass again.
// Needs root (mount); skipped otherwise.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { adminCall, postJson, sqliteRows, startEnv, waitFor } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-diskfull-e2e-token-41c7';
const SECRET = 'whsec-diskfull-e2e-0123456789';
const disk = fs.mkdtempSync(path.join(os.tmpdir(), 'moongate-diskfull-waits-'));
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
    env = await startEnv({
        configure: (c) => ({
            ...c,
            storage: { ...c.storage, path: db },
            auth: { enabled: true },
            health: { probes: false },
            billing: { webhook_secret: '${DISKFULL_TOPUP_SECRET}', webhook_tolerance_s: 300 },
            idempotency: { ttl_seconds: 3600 },
            providers: c.providers.map((p) => (p.id.startsWith('mock-openai') ? { ...p, cost_per_1k_tokens: 1 } : p)),
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN, DISKFULL_TOPUP_SECRET: SECRET },
    });
});

after(async () => {
    await env?.close();
    if (mounted) execFileSync('umount', ['-l', disk]);
    fs.rmSync(disk, { recursive: true, force: true });
});

const admin = (method, p, body) => adminCall(env.base, ADMIN_TOKEN, method, p, body);
const gauge = async (name) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(await env.gw.metrics())?.[1]);

async function tenantKey(name, billing) {
    const t = await admin('POST', 'tenants', { name });
    assert.equal(t.status, 201, t.text);
    if (billing) assert.equal((await admin('PUT', `tenants/${t.json.id}/billing`, billing)).status, 200);
    const k = await admin('POST', 'keys', { tenant_id: t.json.id });
    assert.equal(k.status, 201, k.text);
    return { tenant: t.json.id, key: k.json.key };
}

async function topup(tenant, micros) {
    const raw = JSON.stringify({ id: `evt_${tenant}_${micros}`, tenant_id: tenant, amount_micros: micros });
    const t = Math.floor(Date.now() / 1000);
    const mac = crypto.createHmac('sha256', SECRET).update(`${t}.${raw}`).digest('hex');
    const r = await fetch(`${env.base}/api/v2/webhooks/topup`, {
        method: 'POST', headers: { 'content-type': 'application/json', 'moongate-signature': `t=${t},v1=${mac}` }, body: raw,
    });
    assert.equal(r.status, 200, await r.text());
}

/* a client that gives up after 8 s: an answer waiting for the disk would never come */
const chat = (who, content, extra = {}) => postJson(`${env.api}/chat/completions`,
    { model: 'chat', messages: [{ role: 'user', content }], max_tokens: 20, ...extra },
    { headers: { authorization: `Bearer ${who.key}` }, timeoutMs: 8000 });

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

describe('the disk full, answers waiting for their commit', { skip: mounted ? false : 'needs root to mount a small tmpfs' }, () => {
    test('spend and idempotency go on from memory, a prepaid request is refused at once', async () => {
        const post = await tenantKey('postpaid');
        const pre = await tenantKey('prepaid', { mode: 'prepaid' });
        await topup(pre.tenant, 100000000);
        assert.equal((await chat(pre, 'prepaid before')).status, 200);
        assert.equal((await chat(post, 'postpaid before')).status, 200);
        fill();
        // the writer finds the disk full (bounded: 2000 requests); every answer comes
        let sent = 0, full = 0;
        for (let batch = 0; batch < 100 && !full; batch++) {
            const rs = await Promise.all(Array.from({ length: 20 }, () => chat(post, `filling ${sent++}`)));
            for (const r of rs) assert.equal(r.status, 200, r.text);
            full = await gauge('moongate_store_disk_full');
        }
        assert.equal(full, 1, 'the writer found the disk full');
        // while full: a spend-charged answer and an idempotent one go on, each within 8 s
        for (let i = 0; i < 10; i++) assert.equal((await chat(post, `while full ${i}`)).status, 200);
        const idem = await chat(post, 'idempotent while full', { idempotency_key: 'disk-full-key-1' });
        assert.equal(idem.status, 200, idem.text);
        // a prepaid request: 503 DISK_FULL at once, with Retry-After
        const refused = await chat(pre, 'prepaid while full');
        assert.equal(refused.status, 503, refused.text);
        assert.equal(refused.json.error.code, 'DISK_FULL');
        assert.ok(refused.headers.get('retry-after'));
        assert.equal(await gauge('moongate_store_disk_full'), 1, 'still full');
        // the room comes back
        fs.rmSync(filler);
        await waitFor(async () => (await gauge('moongate_store_disk_full')) === 0, { timeoutMs: 15000, what: 'the writer to recover' });
        const replay = await chat(post, 'idempotent while full', { idempotency_key: 'disk-full-key-1' });
        assert.equal(replay.status, 200);
        assert.equal(replay.text, idem.text);
        // the only idempotent request: its record (the key is stored hashed) landed
        await waitFor(async () => sqliteRows(db, 'SELECT count(*) AS n FROM idempotency')[0].n === 1,
            { timeoutMs: 15000, what: 'the held idempotency record' });
        // every charged request's spend is in the database: the key's day total covers them all
        const spent = sqliteRows(db, `SELECT COALESCE(SUM(micros), 0) AS m FROM spend WHERE scope = 'key'`);
        assert.ok(spent.length === 1 && spent[0].m > 0, JSON.stringify(spent));
        const ok = await chat(pre, 'prepaid after');
        assert.equal(ok.status, 200, ok.text);
        assert.deepEqual(sqliteRows(db, 'PRAGMA integrity_check'), [{ integrity_check: 'ok' }]);
    });
});
