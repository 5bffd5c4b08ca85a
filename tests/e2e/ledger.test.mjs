// Spend limits and the prepaid ledger (issue 19): a request's estimated cost reserved at
// admission against the key's, project's and tenant's day and month limits (429
// QUOTA_EXCEEDED with Retry-After on every endpoint, streamed or not); prepaid wallets that
// reserve before the upstream and settle after, 402 INSUFFICIENT_BALANCE at zero, a balance
// that equals the sum of its entries after concurrent requests, retries, failures and
// top-ups, no double settlement; the signed top-up webhook (signature, replay window,
// idempotency); metering_failed holds kept until an administrator releases them with a
// reason; `moongate check-ledger`.
//
// Prices: the mock provider costs 1 per 1,000 tokens (1,000 micros a token, input and
// output alike). The models count prompts as "estimate" (body bytes / 4), so an estimate is
// exactly (floor(body bytes / 4) + max_tokens) x 1,000 micros; the mock reports usage as the
// prompt's words + the pieces it streamed (5, or max_tokens when lower).

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { adminCall, startEnv, postJson, postStream, gatewayBin, sqliteRows, waitFor, journalDrained } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-ledger-e2e-token-77aa01';
const SECRET = 'whsec-ledger-e2e-0123456789';
const PER_TOKEN = 1000; // micros

let env;

before(async () => {
    const m = (model) => ({ tokenizer: 'estimate', routes: [{ provider: 'mock-openai', model }] });
    env = await startEnv({
        configure: (c) => ({
            ...c,
            auth: { enabled: true },
            health: { probes: false },
            // every failover request must try up-fail-1 first, however the four interleave
            // (a slow build used to open its route's breaker after three, before the fourth)
            circuit_breaker: { consecutive_failures: 1000, min_requests: 1000000 },
            billing: { webhook_secret: '${LEDGER_TOPUP_SECRET}', webhook_tolerance_s: 300 },
            providers: c.providers.map((p) => (p.id.startsWith('mock-openai') ? { ...p, cost_per_1k_tokens: 1 } : p)),
            models: {
                chat: m('up-chat'),
                embed: m('up-embed'),
                slow: m('up-slow'),
                broken: m('up-broken'),
                nousage: m('up-nousage'),
                failover: {
                    tokenizer: 'estimate',
                    routes: [
                        { provider: 'mock-openai', model: 'up-fail-1' },
                        { provider: 'mock-openai-b', model: 'up-fail-2', priority: 1 },
                    ],
                },
            },
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN, LEDGER_TOPUP_SECRET: SECRET },
    });
    await env.mock.script({ model: 'up-broken', action: { status: 500 } });
    await env.mock.script({ model: 'up-fail-1', action: { status: 500 } });
    await env.mock.script({ model: 'up-slow', action: { delay_first_byte_ms: 1500 } });
    await env.mock.script({
        model: 'up-nousage',
        action: {
            body: {
                id: 'chatcmpl-nousage', object: 'chat.completion', created: 1, model: 'up-nousage',
                choices: [{ index: 0, message: { role: 'assistant', content: 'hi', refusal: null }, logprobs: null, finish_reason: 'stop' }],
            },
        },
    });
});

after(async () => {
    await env?.close();
});

function admin(method, p, body) {
    return adminCall(env.base, ADMIN_TOKEN, method, p, body);
}

async function tenant(name, billing) {
    const t = await admin('POST', 'tenants', { name });
    assert.equal(t.status, 201, t.text);
    if (billing) assert.equal((await admin('PUT', `tenants/${t.json.id}/billing`, billing)).status, 200);
    return t.json.id;
}

async function key(body) {
    const k = await admin('POST', 'keys', body);
    assert.equal(k.status, 201, k.text);
    return k.json;
}

function sign(raw, t = Math.floor(Date.now() / 1000), secret = SECRET) {
    const mac = crypto.createHmac('sha256', secret).update(`${t}.${raw}`).digest('hex');
    return `t=${t},v1=${mac}`;
}

async function webhook(body, { signature, raw } = {}) {
    const text = raw ?? JSON.stringify(body);
    const headers = { 'content-type': 'application/json' };
    const sig = signature === undefined ? sign(text) : signature;
    if (sig !== null) headers['moongate-signature'] = sig;
    const r = await fetch(`${env.base}/api/v2/webhooks/topup`, {
        method: 'POST', headers, body: text, signal: AbortSignal.timeout(10000),
    });
    const t = await r.text();
    return { status: r.status, json: t ? JSON.parse(t) : null };
}

async function wallet(id) {
    const w = await admin('GET', `tenants/${id}/wallet`);
    assert.equal(w.status, 200, w.text);
    return w.json;
}

/** Every ledger entry of a tenant, through the cursor pages (small pages on purpose). */
async function ledger(id) {
    const all = [];
    let cursor = null;
    for (let page = 0; page < 200; page++) {
        const r = await admin('GET', `tenants/${id}/ledger?limit=7${cursor ? `&cursor=${cursor}` : ''}`);
        assert.equal(r.status, 200, r.text);
        all.push(...r.json.data);
        if (!r.json.has_more) return all;
        cursor = r.json.next_cursor;
    }
    throw new Error('ledger pages do not end');
}

async function holds(id, state) {
    const r = await admin('GET', `tenants/${id}/holds${state ? `?state=${state}` : ''}`);
    assert.equal(r.status, 200, r.text);
    return r.json.data;
}

const auth = (k) => ({ authorization: `Bearer ${k.key}` });
const chatBody = (extra = {}) => ({ model: 'chat', messages: [{ role: 'user', content: 'count my cost' }], max_tokens: 50, ...extra });
const estimate = (body) => (Math.floor(Buffer.byteLength(JSON.stringify(body)) / 4) + (body.max_tokens ?? 256)) * PER_TOKEN;

function checkLedger() {
    return spawnSync(gatewayBin(), ['check-ledger', '-c', env.configPath], {
        encoding: 'utf8', timeout: 20000, env: { ...process.env, LEDGER_TOPUP_SECRET: SECRET },
    });
}

describe('the top-up webhook', () => {
    let t;
    before(async () => {
        t = await tenant('hooked', { mode: 'prepaid' });
    });

    test('a wrong, missing or malformed signature and an old timestamp add nothing', async () => {
        const body = { id: 'evt_bad_1', tenant_id: t, amount_micros: 5000 };
        assert.equal((await webhook(body, { signature: null })).status, 401);
        assert.equal((await webhook(body, { signature: 'v1=abc' })).status, 401);
        assert.equal((await webhook(body, { signature: sign(JSON.stringify(body), undefined, 'other-secret') })).status, 401);
        // signed for another body
        assert.equal((await webhook(body, { signature: sign(JSON.stringify({ ...body, amount_micros: 9 })) })).status, 401);
        const old = Math.floor(Date.now() / 1000) - 301;
        const r = await webhook(body, { signature: sign(JSON.stringify(body), old) });
        assert.equal(r.status, 401);
        assert.match(r.json.error.message, /replay window/);
        assert.equal((await wallet(t)).balance_micros, 0);
    });

    test('a valid top-up credits once; a redelivery is a duplicate; a clash is 409', async () => {
        const body = { id: 'evt_ok_1', tenant_id: t, amount_micros: 250000 };
        const first = await webhook(body);
        assert.equal(first.status, 200, JSON.stringify(first.json));
        assert.equal(first.json.duplicate, false);
        const again = await webhook(body); // a new signature, the same event
        assert.equal(again.status, 200);
        assert.equal(again.json.duplicate, true);
        assert.equal((await webhook({ ...body, amount_micros: 1 })).status, 409);
        const w = await wallet(t);
        assert.equal(w.balance_micros, 250000);
        assert.equal(w.held_micros, 0);
        const entries = await ledger(t);
        assert.equal(entries.length, 1);
        assert.equal(entries[0].kind, 'topup');
        assert.equal(entries[0].source_id, 'evt_ok_1');
        // bad bodies are 400 and add nothing
        assert.equal((await webhook({ id: 'evt_neg', tenant_id: t, amount_micros: -5 })).status, 400);
        assert.equal((await webhook({ id: 'evt_x', tenant_id: 999999, amount_micros: 5 })).status, 404);
        assert.equal((await wallet(t)).balance_micros, 250000);
    });
});

describe('prepaid wallets', () => {
    test('402 INSUFFICIENT_BALANCE at zero, on chat, streamed chat and embeddings; a top-up lets it through', async () => {
        const t = await tenant('empty', { mode: 'prepaid' });
        const k = await key({ tenant_id: t });
        const seen = (await env.mock.requests()).length;
        const r = await postJson(`${env.api}/chat/completions`, chatBody(), { headers: auth(k) });
        assert.equal(r.status, 402, r.text);
        assert.equal(r.json.error.code, 'INSUFFICIENT_BALANCE');
        const s = await postStream(`${env.api}/chat/completions`, chatBody({ stream: true }), { headers: auth(k) });
        assert.equal(s.status, 402);
        const e = await postJson(`${env.api}/embeddings`, { model: 'embed', input: 'x' }, { headers: auth(k) });
        assert.equal(e.status, 402);
        assert.equal((await env.mock.requests()).length, seen, 'a refused request never reaches the upstream');
        assert.equal((await webhook({ id: `evt_empty_${t}`, tenant_id: t, amount_micros: 1000000 })).status, 200);
        const ok = await postJson(`${env.api}/chat/completions`, chatBody(), { headers: auth(k) });
        assert.equal(ok.status, 200, ok.text);
        await waitFor(async () => (await holds(t, 'held')).length === 0, { what: 'the hold settled' });
        const [h] = await holds(t, 'settled');
        assert.equal(h.reserved_micros, estimate(chatBody()));
        assert.equal(h.charged_micros, (3 + 5) * PER_TOKEN); // 3 prompt words, 5 pieces
        assert.equal((await wallet(t)).balance_micros, 1000000 - h.charged_micros);
    });

    test('an estimate above the balance is 402 even when the balance is not zero', async () => {
        const t = await tenant('short', { mode: 'prepaid' });
        const k = await key({ tenant_id: t });
        const need = estimate(chatBody());
        assert.equal((await webhook({ id: `evt_short_${t}`, tenant_id: t, amount_micros: need - 1 })).status, 200);
        assert.equal((await postJson(`${env.api}/chat/completions`, chatBody(), { headers: auth(k) })).status, 402);
        assert.equal((await webhook({ id: `evt_short2_${t}`, tenant_id: t, amount_micros: 1 })).status, 200);
        assert.equal((await postJson(`${env.api}/chat/completions`, chatBody(), { headers: auth(k) })).status, 200);
    });

    test('balance = sum of entries after concurrent requests, retries, failures and top-ups; no double settlement', async () => {
        const t = await tenant('busy', { mode: 'prepaid' });
        const k = await key({ tenant_id: t });
        assert.equal((await webhook({ id: `evt_busy_0_${t}`, tenant_id: t, amount_micros: 50000000 })).status, 200);
        const work = [];
        for (let i = 0; i < 12; i++) {
            const body = chatBody({ messages: [{ role: 'user', content: `request number ${i}` }] });
            work.push(i % 2
                ? postStream(`${env.api}/chat/completions`, { ...body, stream: true }, { headers: auth(k) }).then((r) => ({ kind: 'ok', r }))
                : postJson(`${env.api}/chat/completions`, body, { headers: auth(k) }).then((r) => ({ kind: 'ok', r })));
        }
        for (let i = 0; i < 4; i++) {
            work.push(postJson(`${env.api}/chat/completions`, chatBody({ model: 'failover' }), { headers: auth(k) }).then((r) => ({ kind: 'retry', r })));
            work.push(postJson(`${env.api}/chat/completions`, chatBody({ model: 'broken' }), { headers: auth(k) }).then((r) => ({ kind: 'fail', r })));
            work.push(webhook({ id: `evt_busy_${i + 1}_${t}`, tenant_id: t, amount_micros: 1000 * (i + 1) }).then((r) => ({ kind: 'topup', r })));
            work.push(postJson(`${env.api}/embeddings`, { model: 'embed', input: ['one two', 'three'] }, { headers: auth(k) }).then((r) => ({ kind: 'ok', r })));
        }
        const done = await Promise.all(work);
        for (const d of done) {
            if (d.kind === 'fail') assert.ok(d.r.status >= 500, `a broken upstream fails (${d.r.status})`);
            else assert.equal(d.r.status, 200, `${d.kind}: ${d.r.text ?? JSON.stringify(d.r.json)}`);
        }
        await waitFor(async () => (await holds(t, 'held')).length === 0, { timeoutMs: 10000, what: 'every hold ended' });
        const w = await wallet(t);
        const entries = await ledger(t);
        assert.equal(w.entries, entries.length);
        assert.equal(w.balance_micros, entries.reduce((s, e) => s + e.amount_micros, 0));
        assert.equal(w.held_micros, entries.reduce((s, e) => s + e.hold_micros, 0));
        assert.equal(w.held_micros, 0);
        // every request reserved once and ended once; failures released, the rest settled
        const byRequest = new Map();
        for (const e of entries.filter((x) => x.request_id)) {
            const list = byRequest.get(e.request_id) ?? [];
            list.push(e.kind);
            byRequest.set(e.request_id, list);
        }
        assert.equal(byRequest.size, 12 + 4 + 4 + 4);
        for (const [rid, kinds] of byRequest) {
            assert.equal(kinds.filter((x) => x === 'reserve').length, 1, rid);
            assert.equal(kinds.filter((x) => x !== 'reserve').length, 1, `${rid}: one end, not ${kinds}`);
        }
        const hs = await holds(t);
        assert.equal(hs.filter((h) => h.state === 'released').length, 4, 'the broken requests cost nothing');
        assert.equal(hs.filter((h) => h.state === 'settled').length, 20);
        const charged = hs.reduce((s, h) => s + (h.charged_micros ?? 0), 0);
        assert.equal(w.balance_micros, 50000000 + 1000 + 2000 + 3000 + 4000 - charged);
        // the failover requests were retried upstream and charged once
        const fo = await env.mock.requests();
        assert.ok(fo.filter((q) => q.body?.model === 'up-fail-1').length >= 4);
        const cl = checkLedger();
        assert.equal(cl.status, 0, cl.stdout + cl.stderr);
        assert.match(cl.stdout, /consistent/);
    });
});

describe('prepaid: retries and cancellations', () => {
    test('a client retry with the same Idempotency-Key reserves and settles once', async () => {
        const t = await tenant('retrying', { mode: 'prepaid' });
        const k = await key({ tenant_id: t });
        assert.equal((await webhook({ id: `evt_retry_${t}`, tenant_id: t, amount_micros: 5000000 })).status, 200);
        const headers = { ...auth(k), 'idempotency-key': `retry-${t}` };
        const a = await postJson(`${env.api}/chat/completions`, chatBody(), { headers });
        const b = await postJson(`${env.api}/chat/completions`, chatBody(), { headers });
        assert.equal(a.status, 200, a.text);
        assert.equal(b.status, 200, b.text);
        await waitFor(async () => (await holds(t, 'held')).length === 0, { what: 'settled' });
        const hs = await holds(t);
        assert.equal(hs.length, 1, 'one reservation for the request and its retry');
        assert.equal(hs[0].state, 'settled');
        assert.equal((await wallet(t)).balance_micros, 5000000 - hs[0].charged_micros);
    });

    test('a client that leaves while the upstream works: the reservation is released, not charged', async () => {
        const t = await tenant('leaving', { mode: 'prepaid' });
        const k = await key({ tenant_id: t });
        assert.equal((await webhook({ id: `evt_leave_${t}`, tenant_id: t, amount_micros: 5000000 })).status, 200);
        const before = (await env.mock.requests()).filter((q) => q.body?.model === 'up-slow').length;
        const ctl = new AbortController();
        const p = postJson(`${env.api}/chat/completions`, chatBody({ model: 'slow' }), { headers: auth(k), signal: ctl.signal })
            .catch((e) => e);
        await waitFor(async () => (await env.mock.requests()).filter((q) => q.body?.model === 'up-slow').length > before,
            { what: 'upstream reached' });
        ctl.abort();
        await p;
        await waitFor(async () => (await holds(t, 'released')).length === 1, { what: 'released' });
        const w = await wallet(t);
        assert.equal(w.balance_micros, 5000000);
        assert.equal(w.held_micros, 0);
    });
});

describe('metering_failed', () => {
    test('no upstream usage with require_upstream_usage: held until released with a reason, audited', async () => {
        const t = await tenant('strict', { mode: 'prepaid', require_upstream_usage: true });
        const k = await key({ tenant_id: t });
        assert.equal((await webhook({ id: `evt_strict_${t}`, tenant_id: t, amount_micros: 5000000 })).status, 200);
        const body = chatBody({ model: 'nousage' });
        const r = await postJson(`${env.api}/chat/completions`, body, { headers: auth(k) });
        assert.equal(r.status, 200, r.text);
        const rid = r.headers.get('x-request-id');
        await waitFor(async () => (await holds(t, 'metering_failed')).length === 1, { what: 'metering_failed' });
        let w = await wallet(t);
        assert.equal(w.held_micros, estimate(body));
        assert.equal(w.balance_micros, 5000000);
        // not released without a reason, nor by a tenant's own request path
        assert.equal((await admin('POST', `tenants/${t}/release`, { request_id: rid })).status, 400);
        assert.equal((await admin('POST', `tenants/${t}/release`, { request_id: rid, reason: '   ' })).status, 400);
        assert.equal((await admin('POST', `tenants/${t}/release`, { request_id: 'req-nope', reason: 'x' })).status, 404);
        const rel = await admin('POST', `tenants/${t}/release`, { request_id: rid, reason: 'provider invoice: not billed' });
        assert.equal(rel.status, 200, rel.text);
        assert.equal(rel.json.state, 'released_unmetered');
        assert.equal(rel.json.reason, 'provider invoice: not billed');
        assert.equal((await admin('POST', `tenants/${t}/release`, { request_id: rid, reason: 'again' })).status, 409);
        w = await wallet(t);
        assert.equal(w.held_micros, 0);
        assert.equal(w.balance_micros, 5000000, 'nothing charged, nothing invented');
        const entries = await ledger(t);
        const end = entries.find((e) => e.request_id === rid && e.kind === 'release');
        assert.equal(end.amount_micros, 0);
        assert.equal(end.reason, 'provider invoice: not billed');
        const audit = await admin('GET', 'audit?limit=50');
        assert.ok(audit.json.data.some((a) => a.action === 'ledger.released_unmetered' && a.status === 200));
        // a settled hold is not released by an administrator either
        const ok = await postJson(`${env.api}/chat/completions`, chatBody(), { headers: auth(k) });
        await waitFor(async () => (await holds(t, 'settled')).length === 1, { what: 'settled' });
        assert.equal((await admin('POST', `tenants/${t}/release`, { request_id: ok.headers.get('x-request-id'), reason: 'x' })).status, 409);
    });

    test('without require_upstream_usage the tokenizer count is charged', async () => {
        const t = await tenant('lenient', { mode: 'prepaid' });
        const k = await key({ tenant_id: t });
        assert.equal((await webhook({ id: `evt_len_${t}`, tenant_id: t, amount_micros: 5000000 })).status, 200);
        assert.equal((await postJson(`${env.api}/chat/completions`, chatBody({ model: 'nousage' }), { headers: auth(k) })).status, 200);
        await waitFor(async () => (await holds(t, 'settled')).length === 1, { what: 'settled' });
        const [h] = await holds(t, 'settled');
        assert.ok(h.charged_micros > 0, 'charged on the estimate, not free');
    });
});

describe('spend limits', () => {
    const endpoints = [
        ['chat', '/chat/completions', chatBody(), false],
        ['chat stream', '/chat/completions', chatBody({ stream: true }), true],
        ['completions', '/completions', { model: 'chat', prompt: 'say hi', max_tokens: 20 }, false],
        ['completions stream', '/completions', { model: 'chat', prompt: 'say hi', max_tokens: 20, stream: true }, true],
        ['embeddings', '/embeddings', { model: 'embed', input: 'hello there' }, false],
    ];

    async function call(k, p, body, stream) {
        return stream ? postStream(`${env.api}${p}`, body, { headers: auth(k) }) : postJson(`${env.api}${p}`, body, { headers: auth(k) });
    }

    async function refusedEverywhere(k, re) {
        for (const [name, p, body, stream] of endpoints) {
            const r = await call(k, p, body, stream);
            assert.equal(r.status, 429, `${name}: ${r.status}`);
            const j = stream ? JSON.parse(r.text) : r.json;
            assert.equal(j.error.code, 'QUOTA_EXCEEDED', name);
            assert.match(j.error.message, re, name);
            const ra = Number(r.headers.get('retry-after'));
            assert.ok(ra >= 1 && ra <= 31 * 86400, `${name}: Retry-After ${ra}`);
        }
    }

    test('key, project and tenant limits, day and month, on every endpoint, streamed and not', async () => {
        const t = await tenant('limited');
        const kd = await key({ tenant_id: t, daily_limit_micros: 1 });
        await refusedEverywhere(kd, /API key's daily spend limit/);
        const p = await admin('POST', 'projects', { tenant_id: t, name: 'p-day', daily_limit_micros: 1 });
        assert.equal(p.status, 201, p.text);
        assert.equal(p.json.daily_limit_micros, 1);
        await refusedEverywhere(await key({ tenant_id: t, project_id: p.json.id }), /project's daily spend limit/);
        const free = await key({ tenant_id: t });
        for (const [name, path, body, stream] of endpoints) assert.equal((await call(free, path, body, stream)).status, 200, name);
        assert.equal((await admin('PUT', `tenants/${t}/billing`, { monthly_limit_micros: 1 })).status, 200);
        await refusedEverywhere(free, /tenant's monthly spend limit/);
        assert.equal((await admin('PUT', `tenants/${t}/billing`, { monthly_limit_micros: 0, daily_limit_micros: 1 })).status, 200);
        await refusedEverywhere(free, /tenant's daily spend limit/);
        const b = await admin('GET', `tenants/${t}/billing`);
        assert.equal(b.json.daily_limit_micros, 1);
        assert.equal(b.json.mode, 'postpaid');
    });

    test('the reservation counts requests in flight; settled with the actual cost, released on failure', async () => {
        const t = await tenant('reserved');
        const body = chatBody({ model: 'slow' });
        const est = estimate(body);
        const k = await key({ tenant_id: t, daily_limit_micros: Math.floor(est * 1.5) });
        const first = postJson(`${env.api}/chat/completions`, body, { headers: auth(k) });
        await waitFor(async () => (await env.mock.requests()).some((q) => q.body?.model === 'up-slow'), { what: 'in flight' });
        const second = await postJson(`${env.api}/chat/completions`, body, { headers: auth(k) });
        assert.equal(second.status, 429, 'the first request holds its estimate');
        assert.match(second.json.error.message, /in flight hold/);
        assert.equal((await first).status, 200);
        // settled at (3 words + 5 pieces) x 1,000: far below the estimate, so there is room again
        const third = await postJson(`${env.api}/chat/completions`, body, { headers: auth(k) });
        assert.equal(third.status, 200, third.text);
        // a failed request holds nothing once it is over
        const kb = await key({ tenant_id: t, daily_limit_micros: Math.floor(est * 1.5) });
        for (let i = 0; i < 3; i++) {
            const r = await postJson(`${env.api}/chat/completions`, chatBody({ model: 'broken' }), { headers: auth(kb) });
            assert.ok(r.status >= 500);
        }
        assert.equal((await postJson(`${env.api}/chat/completions`, chatBody(), { headers: auth(kb) })).status, 200);
        const usage = await admin('GET', `usage?tenant_id=${t}`);
        const day = usage.json.data?.find((u) => u.scope === 'key' && u.id === k.id && u.period.startsWith('d:'));
        assert.ok(day, usage.text);
        const tday = usage.json.data.find((u) => u.scope === 'tenant' && u.id === t && u.period.startsWith('d:'));
        assert.equal(tday.spent_micros, 3 * (3 + 5) * PER_TOKEN, 'the tenant counts both keys');
        assert.equal(day.spent_micros, 2 * (3 + 5) * PER_TOKEN);
    });

    test('an upstream without usage: the spend settles on the tokenizer count, the event says estimated', async () => {
        const t = await tenant('nousage-spend');
        const k = await key({ tenant_id: t });
        const r = await postJson(`${env.api}/chat/completions`, chatBody({ model: 'nousage' }), { headers: auth(k) });
        assert.equal(r.status, 200, r.text);
        await journalDrained(env.gw);
        const ev = sqliteRows(env.config.storage.path,
            `SELECT input_estimated, output_estimated, input_tokens, output_tokens, cost_micros FROM usage_events WHERE request_id = '${r.headers.get('x-request-id')}'`);
        assert.equal(ev.length, 1);
        assert.equal(ev[0].input_estimated, 1);
        assert.equal(ev[0].output_estimated, 1);
        assert.ok(ev[0].input_tokens > 0 && ev[0].output_tokens > 0, JSON.stringify(ev[0]));
        assert.equal(ev[0].cost_micros, (ev[0].input_tokens + ev[0].output_tokens) * PER_TOKEN);
        const usage = await admin('GET', `usage?tenant_id=${t}`);
        const day = usage.json.data?.find((u) => u.scope === 'key' && u.id === k.id && u.period.startsWith('d:'));
        assert.ok(day, usage.text);
        assert.equal(day.spent_micros, ev[0].cost_micros, 'the spend counter moved by the estimated cost');
        const tday = usage.json.data.find((u) => u.scope === 'tenant' && u.id === t && u.period.startsWith('d:'));
        assert.equal(tday.spent_micros, ev[0].cost_micros);
    });

    test('check-ledger passes on the live store after everything above (tampering: test_wallet)', async () => {
        const ok = checkLedger();
        assert.equal(ok.status, 0, ok.stdout + ok.stderr);
    });
});
