// Provider management through the admin API (Sidecar ADR 6, 8.3-8.4, 10): create with the
// test call (GET {endpoint}/models with the key: ok, key refused, cannot connect, other
// status), validation, masked reads, update (a new key is tested again), enable / disable /
// delete taking effect on the next request without a restart, several keys behind one
// model_prefix sharing the load and standing in for each other, config-file providers
// read-only, the test endpoint, a restart (keys decrypt again), a start without
// MOONGATE_ENCRYPTION_KEY (stored providers not served, file providers still are, writes
// refused with a clear message), and a scan proving the provider keys never appear in clear:
// not in the log, not in the SQLite files, not in any admin response.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { adminCall, gatewayBin, startEnv, startGateway, startMock, postJson } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-providers-e2e-token-a41c';
const ENC_KEY = 'a1'.repeat(32);
const KEY_A = 'nvapi-providerkey-aaaa-0123456789abcdef';
const KEY_B = 'nvapi-providerkey-bbbb-fedcba9876543210';
const KEY_C = 'nvapi-providerkey-cccc-55aa55aa55aa55aa';
const ENC_KEY_2 = 'b2'.repeat(32);
const SECRETS = [KEY_A, KEY_B, KEY_C, ENC_KEY, ENC_KEY_2];

let env;
let up; // the mock engine the stored providers point at
const gwEnv = { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN, MOONGATE_ENCRYPTION_KEY: ENC_KEY };
const adminTexts = [];
const pastOutput = []; // stdout and stderr of the gateways stopped by restart()

before(async () => {
    up = await startMock();
    env = await startEnv({
        // the test call uses the probe timeout: short, so "does not answer" is quick to test;
        // no background model lists (GET /v1/models): their fetches of {endpoint}/models
        // would take the one-shot answers scripted below for the test calls
        configure: (c) => ({ ...c, health: { probes: false, probe_timeout_ms: 800 }, protocols: { models_refresh_seconds: 0 } }),
        env: gwEnv,
    });
});

after(async () => {
    await env?.close();
    await up?.close();
});

async function admin(method, p, body) {
    const r = await adminCall(env.base, ADMIN_TOKEN, method, p, body, { timeoutMs: 15000 });
    adminTexts.push(r.text);
    return r;
}

function chat(model) {
    return postJson(`${env.api}/chat/completions`, { model, messages: [{ role: 'user', content: 'hi' }] });
}

const upstream = () => `${up.base}/v1`;
const ids = {};

describe('create with the test call', () => {
    test('a working key: 201, test_result ok, the key masked, the mock saw the key on /models', async () => {
        const r = await admin('POST', 'providers', {
            name: 'acme key A', api_key: KEY_A, endpoint_url: `${upstream()}/`, pool: 'main',
            rpm_limit: 40, model_prefix: 'acme/', cost_per_1k_tokens: 0.001,
        });
        assert.equal(r.status, 201, r.text);
        assert.match(r.json.id, /^p_[0-9a-f]{12}$/);
        assert.equal(r.json.test_result, 'ok');
        assert.equal(typeof r.json.test_latency_ms, 'number');
        assert.equal(r.json.status, 'active');
        assert.equal(r.json.source, 'db');
        assert.equal(r.json.endpoint_url, upstream(), 'trailing slash dropped');
        assert.equal(r.json.rpm_limit, 40);
        assert.match(r.json.api_key, /^nvapi-\*{5}-.{4}$/);
        assert.ok(!r.text.includes(KEY_A));
        ids.a = r.json.id;
        const seen = await up.requests((q) => q.path === '/v1/models');
        assert.equal(seen.at(-1).headers.authorization, `Bearer ${KEY_A}`);
    });

    test('the new provider serves its prefix at once, with its key', async () => {
        const r = await chat('acme/llama-3.1-8b');
        assert.equal(r.status, 200, r.text);
        const req = (await up.requests((q) => q.path === '/v1/chat/completions')).at(-1);
        assert.equal(req.body.model, 'acme/llama-3.1-8b');
        assert.equal(req.headers.authorization, `Bearer ${KEY_A}`);
    });

    test('a refused key: 400 api_key_invalid, nothing stored', async () => {
        await up.script({ path: '/v1/models', times: 1, action: { status: 401 } });
        const r = await admin('POST', 'providers', { name: 'bad key', api_key: 'nvapi-wrong-0000000000000', endpoint_url: upstream() });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.code, 'api_key_invalid');
        assert.match(r.json.error.message, /401/);
        const list = await admin('GET', 'providers');
        assert.ok(!list.json.providers.some((p) => p.name === 'bad key'));
    });

    test('nothing listening: 400 with "cannot connect"', async () => {
        const r = await admin('POST', 'providers', { name: 'nowhere', api_key: KEY_C, endpoint_url: `http://127.0.0.1:${env.deadPort}/v1` });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.code, 'provider_unreachable');
        assert.match(r.json.error.message, /cannot connect/);
    });

    test('an endpoint that does not answer: 400 "cannot connect" after the probe timeout', async () => {
        await up.script({ path: '/v1/models', times: 1, action: { hang: true } });
        const t0 = Date.now();
        const r = await admin('POST', 'providers', { name: 'silent', api_key: KEY_C, endpoint_url: upstream() });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.code, 'provider_unreachable');
        assert.match(r.json.error.message, /cannot connect.*timed out/);
        assert.ok(Date.now() - t0 >= 700, 'waited for the timeout');
    });

    test('the event loop serves while a test call waits', async () => {
        await up.script({ path: '/v1/models', times: 1, action: { hang: true } });
        const slow = admin('POST', 'providers', { name: 'silent2', api_key: KEY_C, endpoint_url: upstream() });
        const first = await Promise.race([chat('chat').then((c) => `chat ${c.status}`), slow.then(() => 'admin')]);
        assert.equal(first, 'chat 200', 'a chat request is answered while the admin call waits');
        assert.equal((await slow).status, 400);
    });

    test('any other answer: 400 with the upstream status', async () => {
        await up.script({ path: '/v1/models', times: 1, action: { status: 503 } });
        const r = await admin('POST', 'providers', { name: 'flaky', api_key: KEY_C, endpoint_url: upstream() });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.code, 'provider_test_failed');
        assert.match(r.json.error.message, /503/);
    });

    test('validation names the field', async () => {
        const cases = [
            [{ api_key: KEY_C, endpoint_url: upstream() }, /'name' is required/],
            [{ name: 'x', endpoint_url: upstream() }, /'api_key' is required/],
            [{ name: 'x', api_key: KEY_C, endpoint_url: 'ftp://host/v1' }, /'endpoint_url'/],
            [{ name: 'x', api_key: KEY_C, endpoint_url: upstream(), pool: 'spare' }, /'pool'/],
            [{ name: 'x', api_key: KEY_C, endpoint_url: upstream(), rpm_limit: -1 }, /'rpm_limit'/],
            [{ name: 'x', api_key: KEY_C, endpoint_url: upstream(), weight: 0 }, /'weight'/],
            [{ name: 'x', api_key: KEY_C, endpoint_url: upstream(), adapter: 'nope' }, /'adapter'/],
            [{ name: 'x', api_key: KEY_C, endpoint_url: upstream(), colour: 'red' }, /unknown field 'colour'/],
            [{ name: 'acme key A', api_key: KEY_C, endpoint_url: upstream() }, /'name': a provider with this name exists/],
        ];
        for (const [body, re] of cases) {
            const r = await admin('POST', 'providers', body);
            assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
            assert.match(r.json.error.message, re);
            assert.ok(!r.text.includes(KEY_C), 'the key is never echoed');
        }
    });
});

describe('reads, changes and the prefix pool', () => {
    test('list and get show it masked, with filters', async () => {
        const one = await admin('GET', `providers/${ids.a}`);
        assert.equal(one.status, 200, one.text);
        assert.equal(one.json.name, 'acme key A');
        assert.equal(one.json.source, 'db');
        assert.equal(one.json.cost_per_1k_tokens, 0.001);
        assert.match(one.json.api_key, /\*{5}/);
        const main = await admin('GET', 'providers?pool=main');
        assert.ok(main.json.providers.some((p) => p.id === ids.a));
        const fb = await admin('GET', 'providers?pool=fallback');
        assert.ok(!fb.json.providers.some((p) => p.id === ids.a));
    });

    test('a second key behind the same prefix shares the load', async () => {
        const r = await admin('POST', 'providers', { name: 'acme key B', api_key: KEY_B, endpoint_url: upstream(), model_prefix: 'acme/' });
        assert.equal(r.status, 201, r.text);
        ids.b = r.json.id;
        const before = (await up.requests()).length;
        for (let i = 0; i < 30; i++) assert.equal((await chat(`acme/m${i}`)).status, 200);
        const keys = (await up.requests((q) => q.seq > before && q.path === '/v1/chat/completions'))
            .map((q) => q.headers.authorization);
        assert.ok(keys.includes(`Bearer ${KEY_A}`) && keys.includes(`Bearer ${KEY_B}`), 'both keys used');
    });

    test('disable takes it out of routing on the next request; enable brings it back', async () => {
        let r = await admin('POST', `providers/${ids.a}/disable`);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.status, 'disabled');
        assert.equal((await admin('GET', `providers/${ids.a}`)).json.status, 'disabled');
        const before = (await up.requests()).length;
        for (let i = 0; i < 6; i++) assert.equal((await chat('acme/x')).status, 200);
        const keys = (await up.requests((q) => q.seq > before && q.path === '/v1/chat/completions'))
            .map((q) => q.headers.authorization);
        assert.deepEqual([...new Set(keys)], [`Bearer ${KEY_B}`], 'only the enabled key is used');
        r = await admin('POST', `providers/${ids.b}/disable`);
        assert.equal(r.status, 200);
        const none = await chat('acme/x');
        assert.equal(none.status, 503, none.text);
        r = await admin('POST', `providers/${ids.a}/enable`);
        assert.equal(r.json.status, 'active');
        assert.equal((await chat('acme/x')).status, 200);
        await admin('POST', `providers/${ids.b}/enable`);
    });

    test('update: limits change at once; a new key is tested and used', async () => {
        let r = await admin('PUT', `providers/${ids.a}`, { rpm_limit: 900, weight: 2.5 });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.rpm_limit, 900);
        assert.equal((await admin('GET', `providers/${ids.a}`)).json.rpm_limit, 900);
        await up.script({ path: '/v1/models', times: 1, action: { status: 403 } });
        r = await admin('PUT', `providers/${ids.a}`, { api_key: KEY_C });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.code, 'api_key_invalid');
        r = await admin('PUT', `providers/${ids.a}`, { api_key: KEY_C });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.test_result, 'ok');
        await admin('POST', `providers/${ids.b}/disable`);
        assert.equal((await chat('acme/y')).status, 200);
        const req = (await up.requests((q) => q.path === '/v1/chat/completions')).at(-1);
        assert.equal(req.headers.authorization, `Bearer ${KEY_C}`);
        await admin('POST', `providers/${ids.b}/enable`);
    });

    test('the test endpoint reports the outcome', async () => {
        let r = await admin('POST', `providers/${ids.a}/test`);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.test_result, 'ok');
        assert.equal(r.json.upstream_status, 200);
        r = await admin('POST', 'providers/dead/test');
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.test_result, 'cannot_connect');
        assert.equal((await admin('POST', 'providers/p_000000000000/test')).status, 404);
    });

    test('config-file providers are read-only; unknown ones are 404', async () => {
        for (const [m, p, b] of [['PUT', 'providers/mock-openai', { rpm_limit: 1 }], ['DELETE', 'providers/mock-openai'],
            ['POST', 'providers/mock-openai/disable']]) {
            const r = await admin(m, p, b);
            assert.equal(r.status, 409, `${m} ${p}: ${r.text}`);
            assert.match(r.json.error.message, /source=file/);
        }
        assert.equal((await admin('PUT', 'providers/p_ffffffffffff', { rpm_limit: 1 })).status, 404);
        assert.equal((await admin('GET', 'providers/p_ffffffffffff')).status, 404);
    });

    test('every change is in the audit trail', async () => {
        const r = await admin('GET', 'audit?limit=200');
        const actions = new Set(r.json.data.map((x) => x.action));
        for (const a of ['provider.create', 'provider.update', 'provider.disable', 'provider.enable', 'provider.test'])
            assert.ok(actions.has(a), a);
        assert.ok(r.json.data.some((x) => x.target === `provider:${ids.a}`));
    });
});

describe('logical models: /api/v2/models', () => {
    test('lists the file\'s models, read-only', async () => {
        const r = await admin('GET', 'models');
        assert.equal(r.status, 200, r.text);
        const chatModel = r.json.data.find((m) => m.name === 'chat');
        assert.equal(chatModel.source, 'file');
        assert.deepEqual(chatModel.routes.map((x) => x.provider), ['mock-openai']);
        assert.equal((await admin('PUT', 'models/chat', { max_concurrency: 1 })).status, 409);
        assert.equal((await admin('DELETE', 'models/chat')).status, 409);
        assert.equal((await admin('GET', 'models/nope')).status, 404);
    });

    test('create: validated, serves at once through a stored provider', async () => {
        const bad = [
            [{ name: 'x y', routes: [{ provider: 'mock-openai', model: 'm' }] }, /'name'/],
            [{ name: 'chat', routes: [{ provider: 'mock-openai', model: 'm' }] }, /exists/],
            [{ name: 'nr', routes: [] }, /'routes'/],
            [{ name: 'np', routes: [{ provider: 'nope', model: 'm' }] }, /'routes\[0\]\.provider'/],
            [{ name: 'nm', routes: [{ provider: 'mock-openai' }] }, /'routes\[0\]\.model'/],
            [{ name: 'uf', routes: [{ provider: 'mock-openai', model: 'm', colour: 1 }] }, /unknown field 'routes\[0\]\.colour'/],
            [{ name: 'mc', routes: [{ provider: 'mock-openai', model: 'm' }], max_concurrency: -1 }, /max_concurrency/],
        ];
        for (const [body, re] of bad) {
            const r = await admin('POST', 'models', body);
            assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
            assert.match(r.json.error.message, re);
        }
        const r = await admin('POST', 'models', {
            name: 'team-chat',
            routes: [{ provider: ids.a, model: 'up-team' }, { provider: 'mock-openai', model: 'up-team-file', priority: 1 }],
            max_concurrency: 4,
        });
        assert.equal(r.status, 201, r.text);
        assert.equal(r.json.source, 'db');
        assert.equal(r.json.routes.length, 2);
        const c = await chat('team-chat');
        assert.equal(c.status, 200, c.text);
        assert.equal(c.json.logical_model, 'team-chat');
        const req = (await up.requests((q) => q.path === '/v1/chat/completions')).at(-1);
        assert.equal(req.body.model, 'up-team');
        const listed = await admin('GET', 'models/team-chat');
        assert.equal(listed.json.max_concurrency, 4);
    });

    test('a provider a stored model routes to cannot be deleted', async () => {
        const r = await admin('DELETE', `providers/${ids.a}`);
        assert.equal(r.status, 409, r.text);
        assert.match(r.json.error.message, /team-chat/);
    });

    test('update replaces the members given; delete stops serving', async () => {
        const r = await admin('PUT', 'models/team-chat', { routes: [{ provider: 'mock-openai', model: 'up-team-2' }] });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.max_concurrency, 4, 'members not given are kept');
        assert.equal((await admin('PUT', 'models/team-chat', { name: 'other' })).status, 400);
        const c = await chat('team-chat');
        assert.equal(c.status, 200);
        const req = (await env.mock.requests((q) => q.path === '/v1/chat/completions')).at(-1);
        assert.equal(req.body.model, 'up-team-2');
        assert.equal((await admin('POST', 'models', { name: 'kept-chat', routes: [{ provider: 'mock-openai', model: 'up-kept' }] })).status, 201);
        assert.equal((await admin('DELETE', 'models/team-chat')).status, 200);
        assert.equal((await chat('team-chat')).status, 404);
        assert.equal((await admin('GET', 'models/team-chat')).status, 404);
    });
});

describe('applications: /api/v2/applications (the PRD\'s permission model)', () => {
    const asApp = (app, model = 'chat', extra = {}) => postJson(`${env.api}/chat/completions`,
        { model, messages: [{ role: 'user', content: 'hi' }], metadata: { application: app }, ...extra });

    test('create: validated; allowed models and priorities hold at once', async () => {
        for (const [body, re] of [
            [{ name: 'a b' }, /'name'/],
            [{ name: 'x', allowed_priorities: ['P9'] }, /allowed_priorities/],
            [{ name: 'x', allowed_models: 'chat' }, /allowed_models/],
            [{ name: 'x', max_running_tasks: -1 }, /max_running_tasks/],
            [{ name: 'x', data_policy: { allow_cloud: 'yes' } }, /allow_cloud/],
            [{ name: 'x', identity_notes: 7 }, /identity_notes/],
            [{ name: 'x', colour: 1 }, /unknown field 'colour'/],
        ]) {
            const r = await admin('POST', 'applications', body);
            assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
            assert.match(r.json.error.message, re);
        }
        const r = await admin('POST', 'applications', {
            name: 'team-app', allowed_models: ['chat'], allowed_priorities: ['P1', 'P2'],
            max_running_tasks: 4, data_policy: { allow_cloud: true },
            output_constraints: 'Answer in English.',
        });
        assert.equal(r.status, 201, r.text);
        assert.equal(r.json.source, 'db');
        assert.equal(r.json.output_constraints, 'Answer in English.');
        assert.equal(r.json.identity_notes, null);
        assert.deepEqual(r.json.allowed_priorities, ['P1', 'P2']);
        assert.equal((await asApp('team-app')).status, 200);
        const other = await asApp('team-app', 'embed-chat-none');
        assert.equal(other.status, 404, 'an unknown model is still 404');
        const notAllowed = await asApp('team-app', 'kept-chat');
        assert.equal(notAllowed.status, 403, notAllowed.text);
        assert.match(notAllowed.json.error.message, /may not use that model/);
        const prio = await asApp('team-app', 'chat', { priority: 'P0' });
        assert.equal(prio.status, 403, prio.text);
        assert.equal((await asApp('no-such-app', 'kept-chat')).status, 200, 'unknown applications are not limited');
    });

    test('update and delete apply at once; listed with the file\'s', async () => {
        let r = await admin('PUT', 'applications/team-app', { allowed_models: ['chat', 'kept-chat'] });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.max_running_tasks, 4, 'members not given are kept');
        assert.equal((await asApp('team-app', 'kept-chat')).status, 200);
        const list = await admin('GET', 'applications');
        assert.ok(list.json.data.some((x) => x.name === 'team-app'));
        r = await admin('DELETE', 'applications/team-app');
        assert.equal(r.status, 200, r.text);
        assert.equal((await admin('GET', 'applications/team-app')).status, 404);
        assert.equal((await asApp('team-app', 'chat', { priority: 'P0' })).status, 200, 'no longer limited');
    });
});

describe('quotas and policies: views over settings and applications', () => {
    const asApp = (app, model) => postJson(`${env.api}/chat/completions`,
        { model, messages: [{ role: 'user', content: 'hi' }], metadata: { application: app } });

    test('PUT /api/v2/quotas: users and application caps in one transaction', async () => {
        assert.equal((await admin('POST', 'applications', { name: 'quota-app', max_queued_tasks: 3 })).status, 201);
        let r = await admin('GET', 'quotas');
        assert.equal(r.status, 200, r.text);
        assert.deepEqual(r.json.users, { default_max_running_tasks: 0, default_max_queued_tasks: 0, default_requests_per_minute: 0 });
        assert.deepEqual(r.json.applications['quota-app'], { max_running_tasks: 0, max_queued_tasks: 3, source: 'db' });
        // one bad part refuses the whole request
        r = await admin('PUT', 'quotas', { users: { default_max_queued_tasks: 9 }, applications: { nope: { max_queued_tasks: 1 } } });
        assert.equal(r.status, 404, r.text);
        assert.equal((await admin('GET', 'quotas')).json.users.default_max_queued_tasks, 0, 'nothing written');
        for (const body of [{ users: { colour: 1 } }, { limits: {} }, { applications: { 'quota-app': { allowed_models: [] } } }]) {
            assert.equal((await admin('PUT', 'quotas', body)).status, 400, JSON.stringify(body));
        }
        r = await admin('PUT', 'quotas', { users: { default_max_running_tasks: 2 }, applications: { 'quota-app': { max_queued_tasks: 7 } } });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.users.default_max_running_tasks, 2);
        assert.equal(r.json.applications['quota-app'].max_queued_tasks, 7);
        assert.equal((await admin('GET', 'applications/quota-app')).json.max_queued_tasks, 7);
    });

    test('users.default_requests_per_minute: per user within an application, 429 with Retry-After', async () => {
        let r = await admin('PUT', 'quotas', { users: { default_requests_per_minute: 2 } });
        assert.equal(r.status, 200, r.text);
        const asUser = (app, user) => postJson(`${env.api}/chat/completions`,
            { model: 'chat', messages: [{ role: 'user', content: 'hi' }], metadata: { application: app, user_id: user } });
        assert.equal((await asUser('quota-app', 'u1')).status, 200);
        assert.equal((await asUser('quota-app', 'u1')).status, 200);
        const third = await asUser('quota-app', 'u1');
        assert.equal(third.status, 429, third.text);
        assert.equal(third.json.error.code, 'RATE_LIMITED');
        const ra = Number(third.headers.get('retry-after'));
        assert.ok(ra >= 1 && ra <= 60, `Retry-After ${ra}`);
        assert.equal((await asUser('quota-app', 'u2')).status, 200, 'another user has its own minute');
        assert.equal((await asUser('other-app', 'u1')).status, 200, 'the same user in another application too');
        r = await admin('PUT', 'quotas', { users: { default_requests_per_minute: null } });
        assert.equal(r.json.users.default_requests_per_minute, 0);
        assert.equal((await asUser('quota-app', 'u1')).status, 200, 'off again');
    });

    test('PUT /api/v2/policies: application permissions and routing flags, in force at once', async () => {
        assert.equal((await asApp('quota-app', 'kept-chat')).status, 200);
        let r = await admin('PUT', 'policies', { routing: { allow_smaller_model: true },
            applications: { 'quota-app': { allowed_models: ['chat'] } } });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.routing.allow_smaller_model, true);
        assert.deepEqual(r.json.applications['quota-app'].allowed_models, ['chat']);
        assert.equal((await asApp('quota-app', 'kept-chat')).status, 403);
        assert.equal((await asApp('quota-app', 'chat')).status, 200);
        // back to the file's values, so later tests start clean
        r = await admin('PUT', 'policies', { routing: { allow_smaller_model: null } });
        assert.equal(r.json.routing.allow_smaller_model, false);
        r = await admin('PUT', 'quotas', { users: { default_max_running_tasks: null } });
        assert.equal(r.json.users.default_max_running_tasks, 0);
        assert.equal((await admin('DELETE', 'applications/quota-app')).status, 200);
    });
});

describe('runtime settings: GET/PUT /api/v2/config', () => {
    test('read, change (hot), validate, and back to the file value with null', async () => {
        let r = await admin('GET', 'config');
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.settings['log.level'], 'info');
        assert.equal(r.json.settings['upstream.max_retries'], 3);
        assert.deepEqual(r.json.overridden, []);
        for (const [body, re] of [[{ 'log.level': 'loud' }, /log.level/], [{ nope: 1 }, /'nope' is not a runtime setting/],
            [{ 'upstream.max_retries': 0 }, /from 1 to 10/]]) {
            const bad = await admin('PUT', 'config', body);
            assert.equal(bad.status, 400, bad.text);
            assert.match(bad.json.error.message, re);
        }
        r = await admin('PUT', 'config', { 'log.level': 'warn', 'upstream.max_retries': 1 });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.settings['log.level'], 'warn');
        assert.equal(r.json.settings['upstream.max_retries'], 1);
        assert.deepEqual(r.json.overridden, ['log.level', 'upstream.max_retries']);
        // in force at once: at warn, a successful request writes no request line
        const quiet = await chat('chat');
        assert.equal(quiet.status, 200);
        await assert.rejects(env.gw.requestLog(quiet.json.request_id, 500));
        r = await admin('PUT', 'config', { 'log.level': null });
        assert.equal(r.json.settings['log.level'], 'info');
        const loud = await chat('chat');
        await env.gw.requestLog(loud.json.request_id);
    });
});

describe('restart and the encryption key', () => {
    async function restart(extraEnv) {
        env.gw.term();
        const { code } = await env.gw.waitExit(8000);
        assert.equal(code, 0);
        pastOutput.push(env.gw.stdoutText(), env.gw.stderr);
        env.gw = await startGateway(env.configPath, { env: extraEnv });
        env.base = env.gw.base;
        env.api = `${env.gw.base}/v1`;
    }

    test('after a restart the stored providers serve again, and the settings hold', async () => {
        await restart(gwEnv);
        assert.equal((await chat('acme/after-restart')).status, 200);
        assert.equal((await chat('kept-chat')).status, 200, 'a stored model survives the restart');
        const r = await admin('GET', 'config');
        assert.equal(r.json.settings['upstream.max_retries'], 1);
        assert.deepEqual(r.json.overridden, ['upstream.max_retries']);
    });

    test('without MOONGATE_ENCRYPTION_KEY: stored providers not served, file ones are, writes refused', async () => {
        await restart({ MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN });
        const r = await chat('acme/z');
        assert.equal(r.status, 404, r.text);
        assert.equal((await chat('chat')).status, 200, 'file providers keep serving');
        const w = await admin('POST', 'providers', { name: 'k', api_key: KEY_C, endpoint_url: upstream() });
        assert.equal(w.status, 503, w.text);
        assert.equal(w.json.error.code, 'ENCRYPTION_KEY_MISSING');
        assert.match(w.json.error.message, /MOONGATE_ENCRYPTION_KEY/);
        assert.ok(env.gw.logs.some((l) => /stored provider\(s\) not served/.test(l.msg ?? '')));
        await restart(gwEnv);
    });

    test('keygen prints a fresh 64-hex key', () => {
        const a = spawnSync(gatewayBin(), ['keygen'], { encoding: 'utf8' });
        const b = spawnSync(gatewayBin(), ['keygen'], { encoding: 'utf8' });
        assert.equal(a.status, 0);
        assert.match(a.stdout, /^[0-9a-f]{64}\n$/);
        assert.notEqual(a.stdout, b.stdout);
    });

    test('rotate-encryption-key: all or nothing, then the new key serves and the old does not', async () => {
        env.gw.term();
        assert.equal((await env.gw.waitExit(8000)).code, 0);
        pastOutput.push(env.gw.stdoutText(), env.gw.stderr);
        const rotate = (oldKey, newKey) => spawnSync(gatewayBin(), ['rotate-encryption-key', '-c', env.configPath], {
            encoding: 'utf8', env: { ...process.env, MOONGATE_ENCRYPTION_KEY: oldKey, MOONGATE_NEW_ENCRYPTION_KEY: newKey },
        });
        const wrong = rotate('c3'.repeat(32), ENC_KEY_2);
        assert.equal(wrong.status, 1, wrong.stdout + wrong.stderr);
        assert.match(wrong.stderr, /does not decrypt with the old key.*nothing changed/);
        const bad = rotate(ENC_KEY, 'xyz');
        assert.equal(bad.status, 1);
        assert.match(bad.stderr, /MOONGATE_NEW_ENCRYPTION_KEY/);
        const ok = rotate(ENC_KEY, ENC_KEY_2);
        assert.equal(ok.status, 0, ok.stderr);
        assert.match(ok.stdout, /re-encrypted 2 provider key/);
        pastOutput.push(wrong.stdout, wrong.stderr, bad.stderr, ok.stdout, ok.stderr);
        env.gw = await startGateway(env.configPath, { env: { ...gwEnv, MOONGATE_ENCRYPTION_KEY: ENC_KEY_2 } });
        env.base = env.gw.base;
        env.api = `${env.gw.base}/v1`;
        assert.equal((await chat('acme/rotated')).status, 200);
        await restart(gwEnv); /* the old key no longer opens them */
        assert.equal((await chat('acme/rotated')).status, 404);
        assert.ok(env.gw.logs.some((l) => /does not decrypt/.test(l.msg ?? '')));
        await restart({ ...gwEnv, MOONGATE_ENCRYPTION_KEY: ENC_KEY_2 });
        gwEnv.MOONGATE_ENCRYPTION_KEY = ENC_KEY_2;
    });

    test('delete: gone from routing and from the list', async () => {
        for (const id of [ids.a, ids.b]) {
            const r = await admin('DELETE', `providers/${id}`);
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json.deleted, true);
        }
        assert.equal((await chat('acme/gone')).status, 404);
        assert.equal((await admin('GET', `providers/${ids.a}`)).status, 404);
    });

    test('no provider key or the encryption key in clear: log, SQLite files, admin answers', async () => {
        const texts = [env.gw.stdoutText(), env.gw.stderr, ...pastOutput, ...adminTexts];
        for (const f of fs.readdirSync(env.dir)) {
            if (f.startsWith('moongate.db')) texts.push(fs.readFileSync(path.join(env.dir, f)).toString('latin1'));
        }
        for (const s of SECRETS) for (const t of texts) assert.ok(!t.includes(s), `a secret appears in clear`);
    });
});
