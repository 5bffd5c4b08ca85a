// GET /v1/models aggregated (issue 20, Sidecar ADR 8.1): the logical models, then the models
// the providers with a model_prefix report, each under the name that reaches it, fetched in
// the background and served from the cache. Two prefixed OpenAI-wire providers behind one
// prefix (two keys of one NIM-like service, each its own mock), a prefixed Anthropic provider,
// a prefixed Ollama provider, a prefixed provider that never answers, and the plain default
// providers (whose own lists are never shown). Driven by the official `openai` and
// `@anthropic-ai/sdk` clients' models.list() / models.retrieve(): the listing, dedup, the
// key restriction, a provider whose list starts failing (its last list kept, said once in
// the log), a provider absent from the start, no base URL or key anywhere in the answers,
// and the listing answered while an upstream's list request hangs.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { postJson, startEnv, startMock, waitFor } from './lib/harness.mjs';
import { assertConforms } from './lib/conformance.mjs';

const ADMIN_TOKEN = 'adm-models-e2e-token-5d1e';
const KEY_A = 'nvapi-models-aaaa-0123456789abcdef';
const KEY_B = 'nvapi-models-bbbb-fedcba9876543210';
const KEY_ANTH = 'sk-ant-models-cccc-55aa55aa55aa';
const SECRETS = [KEY_A, KEY_B, KEY_ANTH];

const LIST_A = ['meta/llama-3.1-8b-instruct', 'meta/llama-3.3-70b-instruct', 'nvidia/nemotron-4-340b',
    'meta/shared', 'meta/llama-3.1-8b-instruct'];
const LIST_B = ['meta/llama-3.1-8b-instruct', 'meta/codellama-70b'];
const LIST_ANTH = ['claude-sonnet-4-5', 'claude-haiku-4-5', 'other-model'];

let env;
let nimA;
let nimB;
let anth;
let full; // a key that may use every model
let narrow; // a key restricted to three models
let usageOnly; // a key without the inference or models scope
const answers = []; // every /v1/models answer's text, scanned for secrets at the end

// the SDKs' answers are read too (for the scan at the end)
const recording = async (url, init) => {
    const r = await fetch(url, init);
    answers.push(await r.clone().text());
    return r;
};

const openaiList = (ids) => ({ object: 'list', data: ids.map((id) => ({ id, object: 'model', created: 1700000000, owned_by: 'nvidia' })) });
const anthropicList = (ids) => ({
    data: ids.map((id) => ({ type: 'model', id, display_name: id.toUpperCase(), created_at: '2025-09-29T00:00:00Z' })),
    has_more: false, first_id: ids[0], last_id: ids.at(-1),
});

before(async () => {
    nimA = await startMock();
    nimB = await startMock();
    anth = await startMock();
    await nimA.script({ path: '/v1/models', action: { body: openaiList(LIST_A) } });
    await nimB.script({ path: '/v1/models', action: { body: openaiList(LIST_B) } });
    await anth.script({ path: '/v1/models', action: { body: anthropicList(LIST_ANTH) } });
    env = await startEnv({
        configure: (c, e) => ({
            ...c,
            auth: { enabled: true },
            health: { probes: false, probe_timeout_ms: 5000 },
            protocols: { models_refresh_seconds: 1 },
            providers: [
                ...c.providers,
                { id: 'nim-a', name: 'NIM key A', adapter: 'openai', base_url: `${nimA.base}/v1`, api_key: KEY_A, model_prefix: 'meta/' },
                { id: 'nim-b', name: 'NIM key B', adapter: 'openai', base_url: `${nimB.base}/v1`, api_key: KEY_B, model_prefix: 'meta/' },
                { id: 'claude-up', adapter: 'anthropic', base_url: anth.base, api_key: KEY_ANTH, model_prefix: 'claude-' },
                { id: 'local-ollama', name: 'Ollama here', adapter: 'ollama', base_url: e.mock.base, model_prefix: 'mock-' },
                { id: 'gone', adapter: 'openai', base_url: `http://127.0.0.1:${e.deadPort}/v1`, model_prefix: 'gone/' },
            ],
            models: { ...c.models, 'meta/shared': { routes: [{ provider: 'mock-openai', model: 'up-shared' }] } },
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN, MOONGATE_ENCRYPTION_KEY: 'c3'.repeat(32) },
    });
    const hdr = { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } };
    const t = await postJson(`${env.base}/api/v2/tenants`, { name: 'model-listers' }, hdr);
    const mk = async (body) => {
        const k = await postJson(`${env.base}/api/v2/keys`, { tenant_id: t.json.id, ...body }, hdr);
        assert.equal(k.status, 201, k.text);
        return k.json.key;
    };
    full = await mk({});
    narrow = await mk({ models: ['chat', 'meta/llama-3.1-8b-instruct', 'claude-sonnet-4-5'] });
    usageOnly = await mk({ scopes: ['usage'] });
});

after(async () => {
    await env?.close();
    for (const m of [nimA, nimB, anth]) await m?.close();
});

async function list(key, headers = {}) {
    const r = await fetch(`${env.api}/models`, { headers: { authorization: `Bearer ${key}`, ...headers }, signal: AbortSignal.timeout(5000) });
    const text = await r.text();
    answers.push(text);
    return { status: r.status, text, json: JSON.parse(text) };
}

const ids = (r) => r.json.data.map((m) => m.id);
const has = (...want) => async () => {
    const r = await list(full);
    return want.every((id) => ids(r).includes(id)) ? r : null;
};

const UPSTREAM_IDS = ['meta/llama-3.1-8b-instruct', 'meta/llama-3.3-70b-instruct', 'meta/codellama-70b',
    'claude-sonnet-4-5', 'claude-haiku-4-5', 'mock-chat:latest', 'mock-embed:latest'];

describe('the aggregated listing', () => {
    test('logical models first, then each prefixed provider\'s models, once each, OpenAI shape', async () => {
        const r = await waitFor(has(...UPSTREAM_IDS), { timeoutMs: 15000, what: 'every provider listed' });
        assert.equal(r.status, 200);
        assertConforms('ListModelsResponse', r.json, 'aggregated models list');
        const logical = Object.keys(env.config.models);
        assert.deepEqual(ids(r).slice(0, logical.length), logical, 'the logical models first, in config order');
        // then providers in config order, each list in the upstream's order, deduplicated
        assert.deepEqual(ids(r).slice(logical.length), UPSTREAM_IDS);
        const by = Object.fromEntries(r.json.data.map((m) => [m.id, m.owned_by]));
        for (const id of logical) assert.equal(by[id], 'moongate');
        assert.equal(by['meta/llama-3.1-8b-instruct'], 'NIM key A', 'the first provider reporting it owns it');
        assert.equal(by['meta/codellama-70b'], 'NIM key B');
        assert.equal(by['claude-sonnet-4-5'], 'claude-up', 'a provider without a name: its id');
        assert.equal(by['mock-chat:latest'], 'Ollama here');
        assert.equal(by['meta/shared'], 'moongate', 'a logical model of the same name is listed as such, once');
        assert.equal(ids(r).filter((id) => id === 'meta/llama-3.1-8b-instruct').length, 1);
        // what the prefix cannot reach, and the plain providers' own lists, are not listed
        for (const id of ['nvidia/nemotron-4-340b', 'other-model', 'mock-chat', 'mock-embed'])
            assert.ok(!ids(r).includes(id), `${id} is not listed`);
        assert.ok(!ids(r).some((id) => id.startsWith('gone/')), 'a provider that never answered lists nothing');
    });

    test('each upstream was asked with its own credentials, on its own wire', async () => {
        const a = (await nimA.requests((q) => q.path === '/v1/models')).at(-1);
        assert.equal(a.headers.authorization, `Bearer ${KEY_A}`);
        const b = (await nimB.requests((q) => q.path === '/v1/models')).at(-1);
        assert.equal(b.headers.authorization, `Bearer ${KEY_B}`);
        const c = (await anth.requests((q) => q.path === '/v1/models')).at(-1);
        assert.equal(c.headers['x-api-key'], KEY_ANTH);
        assert.equal(c.headers['anthropic-version'], '2023-06-01');
        assert.equal(c.query, '?limit=1000');
        assert.ok(!c.headers.authorization);
        assert.ok((await env.mock.requests((q) => q.path === '/api/tags')).length > 0, 'Ollama: /api/tags');
        assert.equal((await env.mock.requests((q) => q.path === '/v1/models')).length, 0, 'plain providers are not asked');
    });

    test('the official openai client: models.list() and models.retrieve() of a prefixed model, which is served', async () => {
        const client = new OpenAI({ baseURL: env.api, apiKey: full, maxRetries: 0, timeout: 10000, fetch: recording });
        const seen = [];
        for await (const m of client.models.list()) seen.push(m.id);
        for (const id of UPSTREAM_IDS) assert.ok(seen.includes(id), id);
        const m = await client.models.retrieve('meta/llama-3.3-70b-instruct');
        assert.equal(m.id, 'meta/llama-3.3-70b-instruct');
        assert.equal(m.owned_by, 'NIM key A');
        assertConforms('Model', JSON.parse(JSON.stringify(m)), 'a prefixed model');
        const slashed = await fetch(`${env.api}/models/${encodeURIComponent('meta/codellama-70b')}`, { headers: { authorization: `Bearer ${full}` } });
        assert.equal((await slashed.json()).owned_by, 'NIM key B');
        await assert.rejects(client.models.retrieve('nvidia/nemotron-4-340b'), (e) => e instanceof OpenAI.NotFoundError);
        // a listed name is one the gateway serves: it reaches a provider of its prefix as is
        const c = await client.chat.completions.create({ model: 'meta/llama-3.3-70b-instruct', messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(c.model, 'meta/llama-3.3-70b-instruct');
        const sent = [...await nimA.requests((q) => q.path === '/v1/chat/completions'), ...await nimB.requests((q) => q.path === '/v1/chat/completions')];
        assert.equal(sent.at(-1).body.model, 'meta/llama-3.3-70b-instruct');
    });

    test('the official @anthropic-ai/sdk: models.list() in Anthropic\'s shape, models.retrieve()', async () => {
        const client = new Anthropic({ baseURL: env.base, apiKey: full, maxRetries: 0, fetch: recording });
        const seen = [];
        for await (const m of client.models.list()) {
            assert.equal(m.type, 'model');
            assert.match(m.created_at, /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/);
            seen.push(m.id);
        }
        assert.deepEqual(seen, ids(await list(full)));
        const page = await list(full, { 'anthropic-version': '2023-06-01' });
        assert.equal(page.json.has_more, false);
        assert.equal(page.json.first_id, seen[0]);
        assert.equal(page.json.last_id, seen.at(-1));
        assert.equal(page.json.object, undefined);
        const m = await client.models.retrieve('claude-haiku-4-5');
        assert.equal(m.id, 'claude-haiku-4-5');
        assert.equal(m.type, 'model');
        await assert.rejects(client.models.retrieve('other-model'), (e) => {
            assert.ok(e instanceof Anthropic.NotFoundError, String(e));
            assert.equal(e.error.error.type, 'not_found_error');
            return true;
        });
    });
});

describe('who sees what', () => {
    test('a key restricted to some models sees only those; the others are 404 to it', async () => {
        const r = await list(narrow);
        assert.deepEqual(ids(r), ['chat', 'meta/llama-3.1-8b-instruct', 'claude-sonnet-4-5']);
        const client = new OpenAI({ baseURL: env.api, apiKey: narrow, maxRetries: 0, fetch: recording });
        assert.equal((await client.models.retrieve('meta/llama-3.1-8b-instruct')).id, 'meta/llama-3.1-8b-instruct');
        for (const id of ['meta/llama-3.3-70b-instruct', 'embed'])
            await assert.rejects(client.models.retrieve(id), (e) => e instanceof OpenAI.NotFoundError);
        const an = await list(narrow, { 'anthropic-version': '2023-06-01' });
        assert.deepEqual(ids(an), ['chat', 'meta/llama-3.1-8b-instruct', 'claude-sonnet-4-5']);
    });

    test('no key or an unknown one: 401; a key without the inference or models scope: 403', async () => {
        const none = await fetch(`${env.api}/models`);
        assert.equal(none.status, 401);
        assert.equal((await none.json()).error.code, 'AUTH_FAILED');
        const bad = new Anthropic({ baseURL: env.base, apiKey: 'mg-not-a-real-key', maxRetries: 0 });
        await assert.rejects(bad.models.list(), (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
        const one = await fetch(`${env.api}/models/chat`);
        assert.equal(one.status, 401);
        const scoped = await list(usageOnly);
        assert.equal(scoped.status, 403);
        assert.equal(scoped.json.error.code, 'PERMISSION_DENIED');
    });
});

describe('a provider whose list fails, or hangs', () => {
    test('a failing provider keeps its last list, and the log says so once', async () => {
        const from = env.gw.logs.length;
        await nimB.reset();
        await nimB.script({ path: '/v1/models', action: { status: 500 } });
        const line = await env.gw.waitLog((l) => l.msg === 'provider models unavailable' && l.provider === 'nim-b',
            { from, timeoutMs: 15000 });
        assert.equal(line.status, 500);
        assert.equal(line.kept, LIST_B.length);
        // it is asked again (each second here) and keeps failing: still one line
        const asked = (await nimB.requests((q) => q.path === '/v1/models')).length;
        await waitFor(async () => (await nimB.requests((q) => q.path === '/v1/models')).length >= asked + 2,
            { timeoutMs: 15000, what: 'two more failed fetches' });
        assert.equal(env.gw.logs.slice(from).filter((l) => l.msg === 'provider models unavailable').length, 1);
        const r = await list(full);
        assert.ok(ids(r).includes('meta/codellama-70b'), 'the last good list is kept');
        assert.equal(r.json.data.find((m) => m.id === 'meta/codellama-70b').owned_by, 'NIM key B');
    });

    test('a provider that answers again: its new list replaces the old, with no request waiting for it', async () => {
        const from = env.gw.logs.length;
        await nimB.reset();
        await nimB.script({ path: '/v1/models', action: { body: openaiList(['meta/new-model']) } });
        await env.gw.waitLog((l) => l.msg === 'provider models' && l.provider === 'nim-b', { from, timeoutMs: 15000 });
        const r = await waitFor(has('meta/new-model'), { timeoutMs: 10000, what: 'the new list' });
        assert.ok(!ids(r).includes('meta/codellama-70b'), 'the old list is gone');
        assert.ok(ids(r).includes('meta/llama-3.1-8b-instruct'), 'still listed: nim-a reports it');
    });

    test('the listing is answered while an upstream\'s list request hangs', async () => {
        await nimB.reset();
        await nimB.script({ path: '/v1/models', action: { hang: true } });
        const hanging = await nimB.waitRequest((q) => q.path === '/v1/models', { timeoutMs: 10000, what: 'a hanging list request' });
        const r = await list(full);
        assert.equal(r.status, 200);
        assert.ok(ids(r).includes('meta/new-model'), 'served from the cache');
        const still = (await nimB.requests((q) => q.seq === hanging.seq))[0];
        assert.equal(still.finished, false, 'the upstream had not answered');
        assert.equal(still.closed_early, false, 'nor had the gateway given up on it');
    });

    test('a provider added through the admin API (Sidecar ADR 8.4) lists its models at once', async () => {
        const r = await postJson(`${env.base}/api/v2/providers`, {
            name: 'NVIDIA Key 2', api_key: KEY_A, endpoint_url: `${nimA.base}/v1`, pool: 'main',
            rpm_limit: 40, model_prefix: 'nvidia/', cost_per_1k_tokens: 0.001,
        }, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
        assert.equal(r.status, 201, r.text);
        const l = await waitFor(has('nvidia/nemotron-4-340b'), { timeoutMs: 15000, what: 'the new provider\'s models' });
        assert.equal(l.json.data.find((m) => m.id === 'nvidia/nemotron-4-340b').owned_by, 'NVIDIA Key 2');
    });

    test('a reload: a provider removed takes its models along; models_refresh_seconds: 0 lists none', async () => {
        const c = structuredClone(env.config);
        c.providers = c.providers.filter((p) => p.id !== 'claude-up');
        env.writeConfig(c);
        assert.equal((await env.gw.reload()).result, 'ok');
        const r = await list(full);
        assert.ok(!ids(r).some((id) => id.startsWith('claude-')), 'claude-up\'s models are gone');
        assert.ok(ids(r).includes('meta/llama-3.1-8b-instruct'), 'the others stay');
        env.writeConfig({ ...c, protocols: { models_refresh_seconds: 0 } });
        assert.equal((await env.gw.reload()).result, 'ok');
        assert.deepEqual(ids(await list(full)), Object.keys(env.config.models), 'the logical models only');
    });

    test('no base URL and no key in any answer', () => {
        assert.ok(answers.length >= 10, `${answers.length} answers read`);
        for (const text of answers) {
            for (const s of SECRETS) assert.ok(!text.includes(s), 'a provider key in an answer');
            assert.ok(!text.includes('127.0.0.1'), `a base URL in an answer: ${text.slice(0, 200)}`);
            assert.ok(!text.includes(ADMIN_TOKEN));
        }
        for (const l of env.gw.rawLines) for (const s of SECRETS) assert.ok(!l.includes(s), 'a provider key in the log');
    });
});
