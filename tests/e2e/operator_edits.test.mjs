// An operator's edits in a running gateway: a copy of policies/ changed by one line
// (tests/lua/operator_edits_spec.lua holds the three edits against the files' own rules), and
// what the gateway then does. "Cool down on 503 too": a 503 puts the provider into a cooldown.
// "Prefer idle local engines": the share of a local engine follows the load its probes read,
// and the plans the core keeps follow it too (the share is asked again when the load changes).
// Every wait is bounded.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { REPO_ROOT, startMock, startGateway, toYaml, postJson, waitFor } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-edits-e2e-token-5b1d';
const messages = [{ role: 'user', content: 'edit me' }];

/** A copy of policies/ with `file`'s one line `from` changed to `to` (there exactly once). */
async function editedPolicies(dir, file, from, to) {
    const policies = path.join(dir, 'policies');
    await fsp.mkdir(policies, { recursive: true });
    for (const f of await fsp.readdir(path.join(REPO_ROOT, 'policies')))
        await fsp.copyFile(path.join(REPO_ROOT, 'policies', f), path.join(policies, f));
    const p = path.join(policies, file);
    const src = fs.readFileSync(p, 'utf8');
    assert.equal(src.split(from).length, 2, `${file} has the line the edit changes, once: ${from}`);
    fs.writeFileSync(p, src.replace(from, to));
    return policies;
}

/** A gateway over `mocks` (one provider each, all local, main pool) with the edited policies. */
async function gateway(dir, policies, mocks, more = {}) {
    const config = {
        server: { listen: '127.0.0.1:0', metrics_listen: '127.0.0.1:0' },
        storage: { path: path.join(dir, 'moongate.db') },
        auth: { enabled: false },
        lua: { policies, adapters: path.join(REPO_ROOT, 'adapters'), lib: path.join(REPO_ROOT, 'lua') },
        log: { level: 'info' },
        upstream: { max_retries: 3 },
        timeouts: { connect_ms: 1000, first_byte_ms: 5000, drain_ms: 2000 },
        health: { probes: false },
        providers: mocks.map((m, i) => ({ id: `e${i}`, adapter: 'openai', base_url: `${m.base}/v1`,
            pool: 'main', local: true, ...(more.provider ?? {}) })),
        models: { m: { routes: mocks.map((_, i) => ({ provider: `e${i}`, model: `up-e${i}` })) } },
        ...(more.config ?? {}),
    };
    const configPath = path.join(dir, 'moongate.yaml');
    fs.writeFileSync(configPath, toYaml(config));
    return startGateway(configPath, { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
}

async function provider(gw, id) {
    const r = await fetch(`${gw.base}/api/v2/providers/${id}`, {
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` }, signal: AbortSignal.timeout(5000),
    });
    assert.equal(r.status, 200);
    return r.json();
}

describe('cool down on 503 too', { timeout: 20000 }, () => {
    let dir, mock, gw;
    before(async () => {
        dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-edits-'));
        const policies = await editedPolicies(dir, 'cooldown.lua', 'local COOLS = { [429] = true }',
            'local COOLS = { [429] = true, [503] = true }');
        mock = await startMock();
        gw = await gateway(dir, policies, [mock, mock]);
    });
    after(async () => {
        await gw?.close().catch(() => {});
        await mock?.close().catch(() => {});
        await fsp.rm(dir, { recursive: true, force: true }).catch(() => {});
    });

    test('a 503 cools the provider for the first backoff step; the other one serves', async () => {
        await mock.script({ model: 'up-e0', action: { status: 503 } });
        let saw503 = false;
        for (let i = 0; i < 40 && !saw503; i++) {
            const r = await postJson(`${gw.base}/v1/chat/completions`, { model: 'm', messages });
            assert.equal(r.status, 200, `request ${i}: ${r.text.slice(0, 200)}`);
            saw503 = (await mock.requests((x) => x.body?.model === 'up-e0')).length > 0;
        }
        assert.ok(saw503, 'e0 got a request within 40');
        const p = await waitFor(async () => {
            const x = await provider(gw, 'e0');
            return x.status === 'cooldown' ? x : null;
        }, { timeoutMs: 2000, what: 'e0 cooling' });
        assert.ok(p.cooldown_remaining_s > 25 && p.cooldown_remaining_s <= 30,
            `30 s for the first one: ${p.cooldown_remaining_s}`);
        const before = (await mock.requests((x) => x.body?.model === 'up-e0')).length;
        for (let i = 0; i < 10; i++) {
            const r = await postJson(`${gw.base}/v1/chat/completions`, { model: 'm', messages });
            assert.equal(r.status, 200);
            assert.equal(r.json.actual_model, 'up-e1');
        }
        assert.equal((await mock.requests((x) => x.body?.model === 'up-e0')).length, before,
            'nothing reached e0 while it cools');
    });
});

describe('prefer idle local engines', { timeout: 30000 }, () => {
    let dir, idle, busy, gw;
    before(async () => {
        dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-edits-'));
        const policies = await editedPolicies(dir, 'routing.lua',
            '    local s = (tonumber(c.weight) or 1) * (tonumber(c.headroom) or 1)',
            '    local s = (tonumber(c.weight) or 1) * (tonumber(c.headroom) or 1) / (1 + (c.load and c.load.waiting or 0))');
        [idle, busy] = [await startMock(), await startMock()];
        gw = await gateway(dir, policies, [idle, busy], {
            provider: { engine: 'vllm' },
            config: { health: { probes: true, probe_interval_ms: 60000, load_interval_ms: 200 } },
        });
    });
    after(async () => {
        await gw?.close().catch(() => {});
        await idle?.close().catch(() => {});
        await busy?.close().catch(() => {});
        await fsp.rm(dir, { recursive: true, force: true }).catch(() => {});
    });

    async function setLoad(mock, load) {
        const r = await fetch(`${mock.base}/__mock/load`, {
            method: 'POST', headers: { 'content-type': 'application/json' },
            body: JSON.stringify(load), signal: AbortSignal.timeout(5000),
        });
        assert.equal(r.status, 200);
    }

    async function share(n) {
        let toIdle = 0;
        for (let i = 0; i < n; i++) {
            const r = await postJson(`${gw.base}/v1/chat/completions`, { model: 'm', messages });
            assert.equal(r.status, 200, r.text.slice(0, 200));
            toIdle += r.json.actual_model === 'up-e0';
        }
        return toIdle / n;
    }

    async function waitWaiting(id, waiting) {
        await waitFor(async () => (await provider(gw, id)).load?.waiting === waiting,
            { timeoutMs: 5000, intervalMs: 100, what: `${id} load.waiting = ${waiting}` });
    }

    test('equal loads share equally; 9 waiting on one engine sends nearly all to the other', async () => {
        await setLoad(idle, { running: 1, waiting: 0 });
        await setLoad(busy, { running: 1, waiting: 0 });
        await waitWaiting('e1', 0);
        const even = await share(120);
        assert.ok(even > 0.3 && even < 0.7, `equal loads: ${even} to e0`);
        await setLoad(busy, { running: 4, waiting: 9 });
        await waitWaiting('e1', 9);
        const skewed = await share(120);
        // e0's share is 1 / (1 + 1/10): 10 of 11 requests, the plan kept while the load stays
        assert.ok(skewed > 0.8, `9 waiting on e1: ${skewed} to e0`);
        // and back
        await setLoad(busy, { running: 1, waiting: 0 });
        await waitWaiting('e1', 0);
        const back = await share(120);
        assert.ok(back > 0.3 && back < 0.7, `equal again: ${back} to e0`);
    });
});
