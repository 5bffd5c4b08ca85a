// Sidecar V1 migration: the ADR's 12.1 compatibility checklist, line by line, against a
// gateway started the way a V1 deployment is: no providers in the config, the SIDECAR_*
// environment of V1 (and the V2 SOP's SIDECAR_ENCRYPTION_KEY and SIDECAR_ADMIN_TOKEN).

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
    REPO_ROOT, buildConfig, deadPort, postJson, startGateway, startMock, toYaml,
} from './lib/harness.mjs';

const V1_KEY = 'nvapi-v1-e2e-KEEPSECRET-0123456789abcd';
const ADMIN = 'v1-admin-token-e2e-0123456789';
const ENC_KEY = 'ab'.repeat(32);

describe('Sidecar V1 compatibility checklist (ADR 12.1)', () => {
    let dir;
    let mock;
    let gw;
    let port;
    before(async () => {
        dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moongate-v1-'));
        mock = await startMock();
        port = await deadPort(); // a free port for SIDECAR_PORT
        const lua = {
            policies: path.join(REPO_ROOT, 'policies'),
            adapters: path.join(REPO_ROOT, 'adapters'),
            lib: path.join(REPO_ROOT, 'lua'),
        };
        const cfg = buildConfig(dir, mock.port, 1, { lua, providers: [], models: {} });
        delete cfg.server.listen; // SIDECAR_HOST/PORT decide
        cfg.scheduler = { max_running_tasks: 1, reserved_realtime_slots: 0 };
        const p = path.join(dir, 'moongate.yaml');
        fs.writeFileSync(p, toYaml(cfg));
        gw = await startGateway(p, {
            env: {
                SIDECAR_API_KEY: V1_KEY,
                SIDECAR_UPSTREAM: `http://127.0.0.1:${mock.port}/v1`,
                SIDECAR_RATE_RPM: '37',
                SIDECAR_HOST: '127.0.0.1',
                SIDECAR_PORT: String(port),
                SIDECAR_QUEUE_MAX: '1',
                SIDECAR_ENCRYPTION_KEY: ENC_KEY,
                SIDECAR_ADMIN_TOKEN: ADMIN,
                MOONGATE_ENCRYPTION_KEY: '',
                MOONGATE_ADMIN_TOKEN: '',
            },
        });
    });
    after(async () => {
        await gw?.close();
        await mock?.close();
        fs.rmSync(dir, { recursive: true, force: true });
    });

    const admin = (p, init = {}) => fetch(`${gw.base}/api/v2${p}`, {
        ...init,
        headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json', ...(init.headers ?? {}) },
        signal: AbortSignal.timeout(10000),
    }).then(async (r) => ({ status: r.status, json: await r.json() }));

    test('SIDECAR_HOST/PORT: the listener is where V1 listened', () => {
        assert.equal(gw.port, port);
    });

    test('/v1/chat/completions, /v1/completions, /v1/embeddings reach SIDECAR_UPSTREAM with SIDECAR_API_KEY', async () => {
        const model = 'meta/llama-3.1-8b-instruct'; // any V1 model name passes through
        const calls = [
            ['chat/completions', { model, messages: [{ role: 'user', content: 'hi' }] }],
            ['completions', { model, prompt: 'hi' }],
            ['embeddings', { model, input: 'hi' }],
        ];
        for (const [p, body] of calls) {
            const r = await postJson(`${gw.base}/v1/${p}`, body);
            assert.equal(r.status, 200, `${p}: ${r.text}`);
            const seen = await mock.waitRequest((q) => q.path === `/v1/${p}`, { what: p });
            assert.equal(seen.headers.authorization, `Bearer ${V1_KEY}`);
            assert.equal(seen.body.model, model);
        }
    });

    test('SIDECAR_RATE_RPM: the one provider has that RPM limit', async () => {
        const r = await admin('/providers/env');
        assert.equal(r.status, 200);
        assert.equal(r.json.rpm_limit, 37);
        assert.equal(r.json.pool, 'main');
        assert.equal(r.json.api_key, `${V1_KEY.slice(0, 6)}*****-${V1_KEY.slice(-4)}`, 'masked: first 6 + last 4');
    });

    test('/health, /health/ready, /status (pools and cooldowns)', async () => {
        assert.equal((await gw.getJson('/health')).status, 200);
        const ready = await gw.getJson('/health/ready');
        assert.equal(ready.status, 200);
        const st = await gw.getJson('/status');
        assert.equal(st.status, 200);
        const env = st.json.providers.find((p) => p.id === 'env');
        assert.ok(env, 'the env provider is in /status');
        assert.equal(env.pool, 'main');
    });

    test('/metrics: sidecar_* names on the metrics listener', async () => {
        const text = await gw.metrics();
        for (const name of ['sidecar_requests_total', 'sidecar_provider_requests_total',
            'sidecar_provider_rpm_current', 'sidecar_provider_cooldown_active', 'sidecar_db_integrity_ok'])
            assert.match(text, new RegExp(`^# TYPE ${name} `, 'm'), name);
    });

    test('SIDECAR_QUEUE_MAX: one running, one queued, the next refused as queue full', async () => {
        await mock.script({ path: '/v1/chat/completions', times: 2, action: { delay_first_byte_ms: 1500 } });
        const body = { model: 'm', messages: [{ role: 'user', content: 'q' }] };
        const first = postJson(`${gw.base}/v1/chat/completions`, body);
        await mock.waitRequest((q) => q.path === '/v1/chat/completions' && q.body?.messages?.[0]?.content === 'q',
            { what: 'first request at the upstream' });
        const second = postJson(`${gw.base}/v1/chat/completions`, body);
        await new Promise((r) => setTimeout(r, 200));
        const third = await postJson(`${gw.base}/v1/chat/completions`, body);
        assert.equal(third.status, 429, third.text);
        assert.equal(third.json.error.code, 'QUEUE_FULL');
        assert.equal((await first).status, 200);
        assert.equal((await second).status, 200);
    });

    test('X-Priority header is the priority (V1 words and P0..P4)', async () => {
        for (const [h, want] of [['urgent', 'P0'], ['high', 'P1'], ['low', 'P3'], ['P4', 'P4']]) {
            const r = await postJson(`${gw.base}/v1/chat/completions`,
                { model: 'm', messages: [{ role: 'user', content: 'p' }] }, { headers: { 'x-priority': h } });
            assert.equal(r.status, 200);
            const line = await gw.requestLog(r.headers.get('x-request-id'));
            assert.equal(line.priority, want, h);
        }
    });

    test('logs: one JSON object per line; the V1 key never in clear', () => {
        assert.deepEqual(gw.nonJsonLines(), []);
        assert.ok(!gw.stdoutText().includes(V1_KEY));
    });

    test('SIDECAR_ADMIN_TOKEN and SIDECAR_ENCRYPTION_KEY: a provider added through the admin API', async () => {
        const r = await admin('/providers', {
            method: 'POST',
            body: JSON.stringify({
                name: 'second', api_key: 'nvapi-second-key-0123456789abcdef',
                endpoint_url: `http://127.0.0.1:${mock.port}/v1`, pool: 'fallback',
            }),
        });
        assert.equal(r.status, 201, JSON.stringify(r.json));
        assert.equal(r.json.api_key, 'nvapi-*****-cdef');
        const list = await admin('/pools/fallback/providers');
        assert.equal(list.status, 200);
        assert.deepEqual(list.json.providers.map((p) => p.pool), ['fallback']);
        assert.ok(list.json.providers.some((p) => p.name === 'second' || p.id === r.json.id));
        const main = await admin('/pools/main/providers');
        assert.deepEqual(main.json.providers.map((p) => p.id), ['env']);
        assert.equal((await admin('/pools/spare/providers')).status, 404);
        const refused = await fetch(`${gw.base}/api/v2/pools`, {
            headers: { authorization: 'Bearer wrong' }, signal: AbortSignal.timeout(5000),
        });
        assert.equal(refused.status, 401);
    });
});
