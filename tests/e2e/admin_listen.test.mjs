// server.admin_listen: the admin API and the dashboard on their own listener; the public
// listener then answers their paths 404 while serving the client API as before.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { adminCall, gatewayBin, postJson, startEnv } from './lib/harness.mjs';

const ADMIN_TOKEN = 'admin-listen-token-0123456789';
let env;

before(async () => {
    env = await startEnv({
        configure: (c) => ({ ...c, server: { ...c.server, admin_listen: '127.0.0.1:0' } }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
});

after(async () => {
    await env?.close();
});

const get = async (port, p, headers = {}) => {
    const r = await fetch(`http://127.0.0.1:${port}${p}`, { headers, signal: AbortSignal.timeout(5000) });
    return { status: r.status, text: await r.text(), type: r.headers.get('content-type') };
};

describe('server.admin_listen', () => {
    test('the admin API answers on the admin listener and 404 on the public one', async () => {
        const { gw } = env;
        assert.ok(gw.adminPort && gw.adminPort !== gw.port, 'the listening line names the admin address');
        const bearer = { authorization: `Bearer ${ADMIN_TOKEN}` };
        const onAdmin = await get(gw.adminPort, '/api/v2/providers', bearer);
        assert.equal(onAdmin.status, 200, onAdmin.text);
        const onPublic = await get(gw.port, '/api/v2/providers', bearer);
        assert.equal(onPublic.status, 404, onPublic.text);
        assert.match(onPublic.text, /NOT_FOUND/);
        // a write through the admin listener works as on the public one before
        const k = await adminCall(`http://127.0.0.1:${gw.adminPort}`, ADMIN_TOKEN, 'GET', 'keys');
        assert.equal(k.status, 200, k.text);
    });

    test('the dashboard moved with it: / and its sign-in only on the admin listener', async () => {
        const { gw } = env;
        const page = await get(gw.adminPort, '/');
        assert.equal(page.status, 200);
        assert.match(page.type ?? '', /text\/html/);
        assert.equal((await get(gw.port, '/')).status, 404);
        const signInPublic = await postJson(`${gw.base}/api/dashboard/login`, { token: ADMIN_TOKEN });
        assert.equal(signInPublic.status, 404);
    });

    test('the client API stays on the public listener only', async () => {
        const { gw } = env;
        const chat = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(chat.status, 200, chat.text);
        const onAdmin = await postJson(`http://127.0.0.1:${gw.adminPort}/v1/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(onAdmin.status, 404);
        assert.equal((await get(gw.adminPort, '/health')).status, 200);
        assert.equal((await get(gw.port, '/health')).status, 200);
        assert.match(await gw.metrics(), /listener="admin"/);
    });

    test('--check refuses an admin_listen equal to listen or not an address', () => {
        const dir = fs.mkdtempSync(path.join(env.dir, 'chk-'));
        const cases = [
            ['server:\n  listen: 127.0.0.1:9190\n  admin_listen: 127.0.0.1:9190\n', /admin_listen must differ/],
            ['server:\n  admin_listen: nowhere\n', /server.admin_listen: invalid address 'nowhere'/],
        ];
        for (const [yaml, want] of cases) {
            const f = path.join(dir, 'bad.yaml');
            fs.writeFileSync(f, yaml);
            const r = spawnSync(gatewayBin(), ['--check', '-c', f], { encoding: 'utf8' });
            assert.equal(r.error, undefined);
            assert.notEqual(r.status, 0, yaml);
            assert.match(r.stderr + r.stdout, want, yaml);
        }
    });
});
