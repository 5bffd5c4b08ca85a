// W3C trace context through the gateway, and one request followed through the logs: the
// client's traceparent is kept (or a trace is started), each upstream attempt gets a child
// span sent as traceparent, the gateway's span comes back in the answer's traceparent, and
// every log line of the request carries request_id and trace_id, the request line the
// tenant, key id, model, provider, status and latency; never a secret.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startEnv, postJson, postStream, TEST_KEY } from './lib/harness.mjs';

const ADMIN_TOKEN = 'admin-token-for-tracing-0123456789';
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const CLIENT_TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const CLIENT_SPAN = '00f067aa0ba902b7';

let env;
let apiKey;
let keyId;
let tenantId;

before(async () => {
    env = await startEnv({
        configure: (c) => ({ ...c, auth: { enabled: true }, health: { probes: false } }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
    const admin = async (p, body) => {
        const r = await postJson(`${env.base}/api/v2/${p}`, body, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
        assert.equal(r.status, 201, r.text);
        return r.json;
    };
    tenantId = (await admin('tenants', { name: 'traced' })).id;
    const k = await admin('keys', { tenant_id: tenantId, name: 'tracing' });
    apiKey = k.key;
    keyId = k.id;
});

after(async () => {
    await env?.close();
});

const auth = () => ({ authorization: `Bearer ${apiKey}` });
const chat = (extra = {}) => ({ model: 'chat', messages: [{ role: 'user', content: 'trace me' }], ...extra });

/** The mock's record of the upstream request the gateway sent for request_id. */
async function upstreamOf(requestId) {
    return env.mock.waitRequest((r) => r.headers?.['x-request-id'] === requestId, { what: `upstream request of ${requestId}` });
}

/** Every log line of the request, once its request line is there. */
async function linesOf(requestId) {
    await env.gw.requestLog(requestId);
    return env.gw.logs.filter((l) => l.request_id === requestId || l.task_id === requestId);
}

describe('trace context', () => {
    test('a client traceparent: kept, a child span upstream, the gateway span back, in every log line', async () => {
        const r = await postJson(`${env.api}/chat/completions`, chat(),
            { headers: { ...auth(), traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` } });
        assert.equal(r.status, 200, r.text);
        const requestId = r.headers.get('x-request-id');
        const back = TRACEPARENT.exec(r.headers.get('traceparent') ?? '');
        assert.ok(back, `traceparent in the answer: ${r.headers.get('traceparent')}`);
        assert.equal(back[1], CLIENT_TRACE, 'the same trace');
        assert.notEqual(back[2], CLIENT_SPAN, 'the gateway span is its own');
        assert.equal(back[3], '01', 'the flags as sent');

        const up = await upstreamOf(requestId);
        const sent = TRACEPARENT.exec(up.headers.traceparent ?? '');
        assert.ok(sent, `traceparent upstream: ${up.headers.traceparent}`);
        assert.equal(sent[1], CLIENT_TRACE);
        assert.notEqual(sent[2], back[2], 'the attempt is a child span');
        assert.notEqual(sent[2], CLIENT_SPAN);

        // the request through the logs: every line of it has the trace id
        const lines = await linesOf(requestId);
        assert.ok(lines.length >= 4, `lines of the request: ${lines.map((l) => l.msg)}`);
        const msgs = new Set(lines.map((l) => l.msg));
        assert.ok(msgs.has('task_state_change') && msgs.has('request'), [...msgs].join(','));
        for (const l of lines) {
            assert.equal(l.trace_id, CLIENT_TRACE, `${l.msg} line has the trace id`);
            assert.equal(l.span_id, back[2], `${l.msg} line has the gateway span`);
        }
        const states = lines.filter((l) => l.msg === 'task_state_change').map((l) => l.to_state);
        assert.equal(states.at(-1), 'SUCCEEDED', states.join(' > '));
        const req = lines.find((l) => l.msg === 'request');
        assert.equal(req.parent_span_id, CLIENT_SPAN);
        assert.equal(req.upstream_span_id, sent[2]);
        assert.equal(req.tenant_id, tenantId);
        assert.equal(req.key_id, keyId);
        assert.equal(req.model, 'chat');
        assert.equal(req.provider, 'mock-openai');
        assert.equal(req.status, 200);
        assert.equal(typeof req.duration_ms, 'number');
        assert.ok(req.duration_ms >= 0);
    });

    test('without a traceparent (or with an invalid one) the gateway starts a trace', async () => {
        const invalid = [
            undefined,
            `00-${CLIENT_TRACE.toUpperCase()}-${CLIENT_SPAN}-01`, // upper case
            `ff-${CLIENT_TRACE}-${CLIENT_SPAN}-01`, // version ff
            `00-${'0'.repeat(32)}-${CLIENT_SPAN}-01`, // all-zero trace id
            `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01-extra`, // version 00 with more after it
            'garbage',
        ];
        const seen = new Set();
        for (const tp of invalid) {
            const headers = { ...auth(), ...(tp === undefined ? {} : { traceparent: tp }) };
            const r = await postJson(`${env.api}/chat/completions`, chat(), { headers });
            assert.equal(r.status, 200, r.text);
            const back = TRACEPARENT.exec(r.headers.get('traceparent') ?? '');
            assert.ok(back, `a traceparent for ${tp}`);
            assert.notEqual(back[1], CLIENT_TRACE, `${tp}: not the client's`);
            assert.ok(!seen.has(back[1]), 'a new trace each time');
            seen.add(back[1]);
            const requestId = r.headers.get('x-request-id');
            const up = await upstreamOf(requestId);
            assert.equal(TRACEPARENT.exec(up.headers.traceparent)[1], back[1]);
            const req = await env.gw.requestLog(requestId);
            assert.equal(req.trace_id, back[1]);
            assert.equal(req.parent_span_id, undefined);
        }
        // a later version's extra fields are allowed (the spec's forward compatibility)
        const r = await postJson(`${env.api}/chat/completions`, chat(),
            { headers: { ...auth(), traceparent: `01-${CLIENT_TRACE}-${CLIENT_SPAN}-00-what-comes-next` } });
        assert.equal(TRACEPARENT.exec(r.headers.get('traceparent'))[1], CLIENT_TRACE);
        assert.match(r.headers.get('traceparent'), /-00$/, 'not sampled stays not sampled');
    });

    test('streams, errors and retried attempts are traced the same way', async () => {
        const s = await postStream(`${env.api}/chat/completions`, chat({ stream: true }),
            { headers: { ...auth(), traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` } });
        assert.equal(s.status, 200);
        assert.equal(TRACEPARENT.exec(s.headers.get('traceparent'))[1], CLIENT_TRACE);
        const up = await upstreamOf(s.headers.get('x-request-id'));
        assert.equal(TRACEPARENT.exec(up.headers.traceparent)[1], CLIENT_TRACE);

        // a refused request (unknown model) still answers with the trace and logs it
        const e = await postJson(`${env.api}/chat/completions`, { ...chat(), model: 'no-such-model' },
            { headers: { ...auth(), traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` } });
        assert.equal(e.status, 404);
        assert.equal(TRACEPARENT.exec(e.headers.get('traceparent'))[1], CLIENT_TRACE);
        assert.equal((await env.gw.requestLog(e.headers.get('x-request-id'))).trace_id, CLIENT_TRACE);

        // failover: two attempts, two child spans, one trace
        await env.mock.script({ model: 'up-fail-1', times: 1, action: { status: 500 } });
        const f = await postJson(`${env.api}/chat/completions`, { ...chat(), model: 'failover' },
            { headers: { ...auth(), traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` } });
        assert.equal(f.status, 200, f.text);
        const rid = f.headers.get('x-request-id');
        const attempts = await env.mock.requests((r) => r.headers?.['x-request-id'] === rid);
        assert.equal(attempts.length, 2);
        const spans = attempts.map((a) => TRACEPARENT.exec(a.headers.traceparent));
        assert.ok(spans.every((m) => m && m[1] === CLIENT_TRACE));
        assert.notEqual(spans[0][2], spans[1][2], 'one span per attempt');
        assert.equal((await env.gw.requestLog(rid)).upstream_span_id, spans[1][2], 'the last attempt logged');
    });

    test('the request line: session, user, and the prompt as a hash, never its text', async () => {
        const session = await postJson(`${env.api}/sessions`, {}, { headers: auth() });
        assert.equal(session.status, 201, session.text);
        const body = { ...chat(), messages: [{ role: 'user', content: 'a secret plan 42' }], session_id: session.json.id,
            metadata: { user_id: 'user-1001' } };
        const r = await postJson(`${env.api}/chat/completions`, body, { headers: auth() });
        assert.equal(r.status, 200, r.text);
        const req = await env.gw.requestLog(r.headers.get('x-request-id'));
        assert.equal(req.session_id, session.json.id);
        assert.equal(req.user_id, 'user-1001');
        assert.equal(req.prompt_hash, `sha256:${crypto.createHash('sha256').update(JSON.stringify(body)).digest('hex')}`);
        assert.ok(!env.gw.stdoutText().includes('a secret plan 42'), 'no prompt text in the log');
    });

    test('no secret in any log line', async () => {
        const out = env.gw.stdoutText();
        assert.ok(!out.includes(apiKey), 'the client key');
        assert.ok(!out.includes(TEST_KEY), 'the provider key');
        assert.ok(!out.includes(ADMIN_TOKEN), 'the admin token');
        assert.deepEqual(env.gw.nonJsonLines(), []);
    });
});
