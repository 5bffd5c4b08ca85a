// CORS for the client API (issue 18.6): a browser application on an allowed origin can call
// /v1/ (preflight 204, Access-Control-Allow-Origin on every answer, streams too, the
// gateway's headers exposed); another origin is refused; the admin API never answers
// cross-origin.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, postStream } from './lib/harness.mjs';

const ORIGIN = 'https://app.example';
let env;

before(async () => {
    env = await startEnv({
        server: { cors: { allowed_origins: [ORIGIN], max_age_s: 120 } },
        env: { MOONGATE_ADMIN_TOKEN: 'adm-cors-e2e' },
    });
});

after(async () => {
    await env?.close();
});

const preflight = (origin) => fetch(`${env.api}/chat/completions`, {
    method: 'OPTIONS',
    headers: { origin, 'access-control-request-method': 'POST',
        'access-control-request-headers': 'authorization, content-type, x-stainless-os' },
    signal: AbortSignal.timeout(5000),
});

test('a preflight from an allowed origin: 204 with the methods, the headers asked for and Max-Age', async () => {
    const r = await preflight(ORIGIN);
    assert.equal(r.status, 204);
    assert.equal(r.headers.get('access-control-allow-origin'), ORIGIN);
    assert.match(r.headers.get('access-control-allow-methods'), /POST/);
    assert.equal(r.headers.get('access-control-allow-headers'), 'authorization, content-type, x-stainless-os');
    assert.equal(r.headers.get('access-control-max-age'), '120');
    assert.equal(r.headers.get('access-control-allow-credentials'), null);
});

test('a preflight from another origin is refused, without CORS headers', async () => {
    const r = await preflight('https://evil.example');
    assert.equal(r.status, 403);
    assert.equal(r.headers.get('access-control-allow-origin'), null);
});

test('answers to an allowed origin carry Allow-Origin and expose X-Request-Id, streams too', async () => {
    const body = { model: 'chat', messages: [{ role: 'user', content: 'from a browser' }] };
    const r = await fetch(`${env.api}/chat/completions`, {
        method: 'POST', headers: { origin: ORIGIN, 'content-type': 'application/json' },
        body: JSON.stringify(body), signal: AbortSignal.timeout(5000),
    });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('access-control-allow-origin'), ORIGIN);
    assert.match(r.headers.get('vary'), /Origin/);
    assert.match(r.headers.get('access-control-expose-headers'), /X-Request-Id/);
    await r.text();
    const s = await postStream(`${env.api}/chat/completions`, { ...body, stream: true }, { headers: { origin: ORIGIN } });
    assert.equal(s.status, 200);
    assert.equal(s.headers.get('access-control-allow-origin'), ORIGIN);
    const err = await fetch(`${env.api}/chat/completions`, {
        method: 'POST', headers: { origin: ORIGIN, 'content-type': 'application/json' },
        body: '{}', signal: AbortSignal.timeout(5000),
    });
    assert.equal(err.status, 400);
    assert.equal(err.headers.get('access-control-allow-origin'), ORIGIN, 'errors too');
});

test('the admin API never answers cross-origin', async () => {
    const r = await fetch(`${env.gw.base}/api/v2/pools`, {
        headers: { origin: ORIGIN, authorization: 'Bearer adm-cors-e2e' }, signal: AbortSignal.timeout(5000),
    });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('access-control-allow-origin'), null);
});
