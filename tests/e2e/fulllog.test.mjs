// The edge PRD's `full` logging mode (issue 22): off by default (the request line has a
// prompt_hash, never the text); an admin call opens a window of a bounded length in which
// the request line also carries the prompt and the answer, secrets masked; it closes by
// itself, or by DELETE; every switch is audited; a tenant admin may not open it.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { adminCall, startEnv, waitFor } from './lib/harness.mjs';
import { openStream, signIn } from './lib/dashboard.mjs';

const ADMIN_TOKEN = 'admin-token-for-fulllog-0123456789';
// a key the client pastes into its prompt: it must never reach the log whole
const PASTED_KEY = 'sk-proj-Zq81fK0xLmN2pQ4rS6tU8vW0yA2bC4dE';
const PASTED_MIDDLE = PASTED_KEY.slice(8, 32);

let env;
let client;
let apiKey;
let tenantId;

const admin = (method, p, body, token = ADMIN_TOKEN) => adminCall(env.base, token, method, p, body);

before(async () => {
    env = await startEnv({
        configure: (c, e) => ({ ...c, auth: { enabled: true }, health: { probes: false },
            dashboard: { stream_interval_ms: 250 },
            // a native Anthropic route: /v1/messages passes through (pipeline/messages_native.c)
            // and a native Responses route (pipeline/responses_native.c)
            providers: [...c.providers, { id: 'mock-anthropic', adapter: 'anthropic',
                base_url: `http://127.0.0.1:${e.mock.port}`, api_key: 'sk-ant-upstream-key' },
            { id: 'mock-responses', adapter: 'openai_responses', base_url: `http://127.0.0.1:${e.mock.port}/v1` }],
            models: { ...c.models, 'claude-native': { routes: [{ provider: 'mock-anthropic', model: 'claude-up' }] },
                'resp-native': { routes: [{ provider: 'mock-responses', model: 'up-native' }] } } }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
    tenantId = (await admin('POST', 'tenants', { name: 'fulllog' })).json.id;
    apiKey = (await admin('POST', 'keys', { tenant_id: tenantId, name: 'fulllog' })).json.key;
    client = new OpenAI({ baseURL: env.api, apiKey, maxRetries: 0, timeout: 10000 });
});

after(async () => {
    await env?.close();
});

/** A chat call through the SDK with a marker and the pasted key in its prompt; its request
 * log line. */
async function chat(marker, { stream = false } = {}) {
    const messages = [{ role: 'user', content: `${marker}: why does my key ${PASTED_KEY} fail?` }];
    let requestId;
    let text = '';
    if (stream) {
        const { data, response } = await client.chat.completions.create({ model: 'chat', messages, stream: true })
            .withResponse();
        requestId = response.headers.get('x-request-id');
        for await (const ch of data) text += ch.choices[0]?.delta?.content ?? '';
    } else {
        const { data, response } = await client.chat.completions.create({ model: 'chat', messages }).withResponse();
        requestId = response.headers.get('x-request-id');
        text = data.choices[0].message.content;
    }
    assert.ok(requestId);
    return { line: await env.gw.requestLog(requestId), text };
}

async function auditActions() {
    const r = await admin('GET', 'audit?limit=100');
    assert.equal(r.status, 200, r.text);
    const rows = r.json.data ?? r.json.records ?? r.json;
    return rows;
}

describe('full logging mode', () => {
    test('off by default: a hash, never the prompt, and GET says metadata_only', async () => {
        const g = await admin('GET', 'logging/full');
        assert.equal(g.status, 200, g.text);
        assert.equal(g.json.mode, 'metadata_only');
        assert.equal(g.json.max_duration_seconds, 3600);
        const { line } = await chat('MARKER-OFF-1');
        assert.match(line.prompt_hash, /^sha256:[0-9a-f]{64}$/);
        assert.equal(line.prompt, undefined);
        assert.equal(line.answer, undefined);
        assert.ok(!env.gw.stdoutText().includes('MARKER-OFF-1'), 'no prompt text anywhere in the log');
        assert.ok(!env.gw.stdoutText().includes(PASTED_MIDDLE));
    });

    test('bad requests: 400 naming the field; a tenant admin is refused', async () => {
        for (const body of [{ duration_seconds: 0, reason: 'x' }, { duration_seconds: 3601, reason: 'x' },
            { duration_seconds: 1.5, reason: 'x' }, { duration_seconds: 60 }, { duration_seconds: 60, reason: '' },
            { duration_seconds: 60, reason: 'x', extra: 1 }]) {
            const r = await admin('POST', 'logging/full', body);
            assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
            assert.equal(r.json.error.code, 'INVALID_REQUEST');
        }
        const bad = await admin('POST', 'logging/full', { duration_seconds: 60, reason: 'x' }, 'wrong-token');
        assert.equal(bad.status, 401);
        const t = await admin('POST', 'admin-tokens', { tenant_id: tenantId, name: 'ops' });
        assert.equal(t.status, 201, t.text);
        const asTenant = await admin('POST', 'logging/full', { duration_seconds: 60, reason: 'mine' }, t.json.token);
        assert.equal(asTenant.status, 403, asTenant.text);
        assert.equal((await admin('GET', 'logging/full')).json.mode, 'metadata_only');
    });

    test('on: prompt and answer in the request line, the pasted key masked; expires by itself', async () => {
        const on = await admin('POST', 'logging/full', { duration_seconds: 3, reason: 'ticket 4711: wrong answers' });
        assert.equal(on.status, 200, on.text);
        assert.equal(on.json.mode, 'full');
        assert.equal(on.json.reason, 'ticket 4711: wrong answers');
        assert.ok(on.json.remaining_seconds >= 1 && on.json.remaining_seconds <= 3, on.text);
        assert.ok(on.json.until_ms > Date.now());
        const opened = Date.now();

        const { line, text } = await chat('MARKER-ON-1');
        assert.equal(line.log_mode, 'full');
        assert.ok(line.prompt.includes('MARKER-ON-1'), line.prompt);
        assert.ok(!line.prompt.includes(PASTED_MIDDLE), `the key is masked: ${line.prompt}`);
        assert.ok(line.prompt.includes('sk-pro*****-bC4dE'.replace('bC4dE', PASTED_KEY.slice(-4))), line.prompt);
        assert.ok(!line.prompt.includes(apiKey.slice(3)), 'the client key is not in it either');
        assert.ok(line.secrets_masked >= 1);
        assert.ok(line.answer.includes(text), `the answer: ${line.answer}`);
        assert.match(line.prompt_hash, /^sha256:/, 'the hash stays');

        const s = await chat('MARKER-ON-2', { stream: true });
        assert.ok(s.line.prompt.includes('MARKER-ON-2'));
        assert.equal(s.line.answer, s.text, 'a stream: its text put together');
        assert.ok(!env.gw.stdoutText().includes(PASTED_MIDDLE), 'the key nowhere in the log');

        const audit = await auditActions();
        const rec = audit.find((a) => a.action === 'logging.full.enable' && a.status === 200);
        assert.ok(rec, JSON.stringify(audit.slice(0, 5)));
        assert.match(rec.target, /duration_seconds=3 reason=ticket 4711/);
        assert.equal(rec.actor, 'admin');

        // it ends by itself (a timer on the loop), then the log is metadata_only again
        const off = await env.gw.waitLog((l) => l.msg === 'full logging off', { timeoutMs: 6000 });
        assert.equal(off.why, 'expired');
        assert.ok(Date.now() - opened >= 2500, 'not before its time');
        assert.equal((await admin('GET', 'logging/full')).json.mode, 'metadata_only');
        await waitFor(async () => (await auditActions()).some((a) => a.action === 'logging.full.expired' &&
            a.actor === 'system' && /ticket 4711/.test(a.target)), { what: 'the expiry audited' });
        const after = await chat('MARKER-AFTER-1');
        assert.equal(after.line.prompt, undefined);
        assert.ok(!env.gw.stdoutText().includes('MARKER-AFTER-1'));
    });

    test('the dashboard: the snapshot says so while it is on, the page has the banner', async () => {
        const page = await fetch(`${env.base}/api/dashboard`).then((r) => r.text());
        assert.ok(page.includes('id="full-logging"'), 'the banner is on the page');
        const { cookie } = await signIn(env.base, ADMIN_TOKEN);
        const st = await openStream(env.base, cookie);
        try {
            const off = await st.waitFor((e) => e.event === 'snapshot');
            assert.equal(off.data.logging.mode, 'metadata_only');
            const from = st.events.length;
            await admin('POST', 'logging/full', { duration_seconds: 600, reason: 'dashboard look' });
            const on = await st.waitFor((e) => e.event === 'snapshot' && e.data.logging.mode === 'full',
                { from, what: 'a snapshot in full mode' });
            assert.equal(on.data.logging.reason, 'dashboard look');
            assert.ok(on.data.logging.until_ms > Date.now() + 590000);
        } finally {
            st.close();
        }
    });

    test('a native Anthropic stream: the prompt and its text deltas put together, capped alike', async () => {
        const on = await admin('POST', 'logging/full', { duration_seconds: 60, reason: 'native stream' });
        assert.equal(on.status, 200, on.text);
        try {
            const anth = new Anthropic({ baseURL: env.base, apiKey, maxRetries: 0, timeout: 10000 });
            const content = `MARKER-NATIVE-1: why does my key ${PASTED_KEY} fail?`;
            const { data, response } = await anth.messages.create({ model: 'claude-native', max_tokens: 64, stream: true,
                messages: [{ role: 'user', content }] }).withResponse();
            let text = '';
            for await (const ev of data) if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
            assert.ok(text.length > 0, 'the mock streamed some text');
            const line = await env.gw.requestLog(response.headers.get('x-request-id'));
            assert.equal(line.log_mode, 'full');
            assert.ok(line.prompt.includes('MARKER-NATIVE-1'), line.prompt);
            assert.ok(!line.prompt.includes(PASTED_MIDDLE), 'the key is masked');
            assert.equal(line.answer, text, 'the streamed text, whole');
            const whole = await anth.messages.create({ model: 'claude-native', max_tokens: 64,
                messages: [{ role: 'user', content: 'MARKER-NATIVE-2' }] }).withResponse();
            const wl = await env.gw.requestLog(whole.response.headers.get('x-request-id'));
            assert.ok(wl.answer.includes(whole.data.content[0].text), 'a whole answer is logged too');
        } finally {
            assert.equal((await admin('DELETE', 'logging/full')).status, 200);
        }
    });

    test('a native Responses stream: its output_text deltas put together; a whole answer too', async () => {
        const on = await admin('POST', 'logging/full', { duration_seconds: 60, reason: 'native responses' });
        assert.equal(on.status, 200, on.text);
        try {
            const { data, response } = await client.responses.create({ model: 'resp-native', stream: true,
                input: 'MARKER-RESP-1: summarise this' }).withResponse();
            let text = '';
            for await (const ev of data) if (ev.type === 'response.output_text.delta') text += ev.delta;
            assert.ok(text.length > 0, 'the mock streamed some text');
            const line = await env.gw.requestLog(response.headers.get('x-request-id'));
            assert.equal(line.log_mode, 'full');
            assert.ok(line.prompt.includes('MARKER-RESP-1'), line.prompt);
            assert.equal(line.answer, text, 'the streamed text, whole');
            const whole = await client.responses.create({ model: 'resp-native', input: 'MARKER-RESP-2' }).withResponse();
            const wl = await env.gw.requestLog(whole.response.headers.get('x-request-id'));
            assert.ok(wl.answer.includes(whole.data.output_text), 'a whole answer is logged too');
        } finally {
            assert.equal((await admin('DELETE', 'logging/full')).status, 200);
        }
    });

    test('DELETE ends it early, audited', async () => {
        const on = await admin('POST', 'logging/full', { duration_seconds: 600, reason: 'short look' });
        assert.equal(on.status, 200);
        assert.equal((await admin('GET', 'logging/full')).json.mode, 'full');
        const del = await admin('DELETE', 'logging/full');
        assert.equal(del.status, 200, del.text);
        assert.equal(del.json.mode, 'metadata_only');
        const { line } = await chat('MARKER-DELETED-1');
        assert.equal(line.prompt, undefined);
        await waitFor(async () => (await auditActions()).some((a) => a.action === 'logging.full.disable'),
            { what: 'the disable audited' });
        const l = await env.gw.waitLog((x) => x.msg === 'full logging off' && x.why === 'disabled');
        assert.ok(l);
    });
});
