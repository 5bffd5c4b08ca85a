// The HTTP/1.1 front end over raw sockets: keep-alive, pipelining, request bodies, limits,
// timeouts, error bodies, health/readiness/status endpoints.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, RawConn, rawRequest, sleep } from './lib/harness.mjs';
import { assertConforms } from './lib/conformance.mjs';
import { contentFor } from '../mock/engine.mjs';

const MAX_BODY = 64 * 1024;
const MAX_HEADER = 8 * 1024;
const HEADER_READ_MS = 500;
const KEEPALIVE_IDLE_MS = 500;

let env;

before(async () => {
    env = await startEnv({
        server: { max_body_bytes: MAX_BODY, max_header_bytes: MAX_HEADER },
        timeouts: { header_read_ms: HEADER_READ_MS, keepalive_idle_ms: KEEPALIVE_IDLE_MS },
    });
});

after(async () => {
    await env?.close();
});

const chat = (model = 'chat', extra = {}) => ({ model, messages: [{ role: 'user', content: 'hi raw' }], ...extra });

async function open() {
    return RawConn.open(env.gw.port);
}

/** One request on a fresh connection; returns the response (and closes the socket). */
async function once(method, p, opts = {}) {
    const c = await open();
    try {
        await c.write(rawRequest(method, p, opts));
        return await c.readResponse(opts.timeoutMs ?? 5000);
    } finally {
        c.close();
    }
}

/** Every error the gateway sends: status, OpenAI error shape, code, request id, conformance. */
function assertError(res, status, code) {
    assert.equal(res.status, status, `status (body: ${res.text.slice(0, 300)})`);
    assert.match(res.headers['content-type'] ?? '', /application\/json/);
    const rid = res.headers['x-request-id'];
    assert.ok(rid, 'X-Request-Id header on an error');
    let j;
    assert.doesNotThrow(() => {
        j = res.json();
    }, `error body is JSON: ${res.text.slice(0, 200)}`);
    assertConforms('ErrorResponse', j, `${status} error body`);
    const e = j.error;
    assert.equal(typeof e.message, 'string');
    assert.ok(e.message.length > 0);
    assert.equal(typeof e.type, 'string');
    assert.ok('param' in e, 'error.param present');
    assert.ok(e.param === null || typeof e.param === 'string');
    assert.equal(e.code, code);
    assert.equal(e.request_id, rid, 'error.request_id equals X-Request-Id');
    // the type follows the status (net/error.c): a deadline is a timeout, not the client's mistake
    const want = status === 408 ? 'timeout_error' : status >= 400 && status < 500 && status !== 429
        ? 'invalid_request_error' : null;
    if (want) assert.equal(e.type, want);
    return j;
}

describe('connections', () => {
    test('keep-alive: two requests on one socket', async () => {
        const c = await open();
        try {
            await c.write(rawRequest('POST', '/v1/chat/completions', { body: chat() }));
            const a = await c.readResponse();
            assert.equal(a.status, 200);
            assert.equal(a.json().choices[0].message.content, contentFor('up-chat'));
            assert.ok(!/close/i.test(a.headers.connection ?? ''), 'no Connection: close on a keep-alive answer');
            await c.write(rawRequest('GET', '/health'));
            const b = await c.readResponse();
            assert.equal(b.status, 200);
            assert.ok(a.headers['x-request-id'] && b.headers['x-request-id']);
            assert.notEqual(a.headers['x-request-id'], b.headers['x-request-id']);
            assert.equal(c.closed, false);
        } finally {
            c.close();
        }
    });

    test('pipelining: three requests in one write are answered in order', async () => {
        await env.mock.script({ model: 'up-chat', times: 1, action: { delay_first_byte_ms: 300 } });
        const c = await open();
        try {
            await c.write(
                rawRequest('POST', '/v1/chat/completions', { body: chat() }) +
                rawRequest('GET', '/health') +
                rawRequest('GET', '/v1/models'));
            const a = await c.readResponse();
            const b = await c.readResponse();
            const d = await c.readResponse();
            assert.equal(a.status, 200);
            assert.equal(a.json().object, 'chat.completion', 'first answer is the (slow) chat');
            assert.equal(b.status, 200);
            assert.equal(b.json().status, 'ok', 'second answer is /health');
            assert.equal(d.status, 200);
            assert.equal(d.json().object, 'list', 'third answer is /v1/models');
        } finally {
            c.close();
        }
    });

    test('a request that arrives while a stream is being answered is answered after it', async () => {
        // the second request comes in its own write once the stream is under way: it is read
        // (into the listener's shared buffer, then kept by the connection) while the first is
        // with the handler, and parsed when the stream ends
        await env.mock.script({ model: 'up-chat', times: 1, action: { chunk_delay_ms: 100 } });
        const c = await open();
        try {
            await c.write(rawRequest('POST', '/v1/chat/completions', { body: chat('chat', { stream: true }) }));
            await c.waitText('data: ');
            await c.write(rawRequest('GET', '/health') + rawRequest('GET', '/v1/models').slice(0, 10));
            await sleep(50);
            await c.write(rawRequest('GET', '/v1/models').slice(10));
            const a = await c.readResponse();
            const b = await c.readResponse();
            const d = await c.readResponse();
            assert.equal(a.status, 200);
            assert.match(a.text, /data: \[DONE\]\n\n$/, 'the whole stream first');
            assert.equal(b.status, 200);
            assert.equal(b.json().status, 'ok', 'then /health');
            assert.equal(d.json().object, 'list', 'then /v1/models, which came in two writes');
        } finally {
            c.close();
        }
    });

    test('Connection: close is honoured', async () => {
        const c = await open();
        try {
            await c.write(rawRequest('GET', '/health', { headers: { Connection: 'close' } }));
            const r = await c.readResponse();
            assert.equal(r.status, 200);
            assert.ok(await c.waitClose(3000), 'server closes after Connection: close');
        } finally {
            c.close();
        }
    });

    test('chunked request body, sent in pieces', async () => {
        const body = JSON.stringify(chat());
        const c = await open();
        try {
            await c.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
                'Transfer-Encoding: chunked\r\n\r\n');
            const parts = [body.slice(0, 10), body.slice(10, 25), body.slice(25)];
            for (const p of parts) {
                await c.write(`${Buffer.byteLength(p).toString(16)}\r\n${p}\r\n`);
                await sleep(30);
            }
            await c.write('0\r\n\r\n');
            const r = await c.readResponse();
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json().choices[0].message.content, contentFor('up-chat'));
        } finally {
            c.close();
        }
    });

    test('Content-Length body split over two writes', async () => {
        const body = JSON.stringify(chat());
        const c = await open();
        try {
            await c.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body.slice(0, 7)}`);
            await sleep(50);
            await c.write(body.slice(7));
            const r = await c.readResponse();
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json().model, 'chat');
        } finally {
            c.close();
        }
    });
});

describe('limits and malformed requests', () => {
    test('body over max_body_bytes -> 413 REQUEST_TOO_LARGE', async () => {
        const big = JSON.stringify(chat('chat', { pad: 'x'.repeat(MAX_BODY + 1024) }));
        const c = await open();
        try {
            await c.write(rawRequest('POST', '/v1/chat/completions', { body: big })).catch(() => {});
            const r = await c.readResponse();
            assertError(r, 413, 'REQUEST_TOO_LARGE');
        } finally {
            c.close();
        }
    });

    test('chunked body over max_body_bytes -> 413', async () => {
        const c = await open();
        try {
            await c.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
                'Transfer-Encoding: chunked\r\n\r\n');
            const piece = 'x'.repeat(16 * 1024);
            for (let i = 0; i < 6 && !c.closed; i++) {
                await c.write(`${piece.length.toString(16)}\r\n${piece}\r\n`).catch(() => {});
            }
            await c.write('0\r\n\r\n').catch(() => {});
            const r = await c.readResponse();
            assertError(r, 413, 'REQUEST_TOO_LARGE');
        } finally {
            c.close();
        }
    });

    test('headers over max_header_bytes -> 431 HEADERS_TOO_LARGE', async () => {
        const c = await open();
        try {
            await c.write(rawRequest('GET', '/health', { headers: { 'X-Big': 'b'.repeat(MAX_HEADER * 2) } }))
                .catch(() => {});
            const r = await c.readResponse();
            assertError(r, 431, 'HEADERS_TOO_LARGE');
        } finally {
            c.close();
        }
    });

    test('malformed JSON -> 400 INVALID_REQUEST', async () => {
        const r = await once('POST', '/v1/chat/completions', { body: '{"model": "chat", "messages": [}' });
        assertError(r, 400, 'INVALID_REQUEST');
    });

    test('missing messages -> 400 INVALID_REQUEST', async () => {
        const r = await once('POST', '/v1/chat/completions', { body: { model: 'chat' } });
        assertError(r, 400, 'INVALID_REQUEST');
    });

    test('missing model -> 400 INVALID_REQUEST', async () => {
        const r = await once('POST', '/v1/chat/completions', { body: { messages: [{ role: 'user', content: 'x' }] } });
        assertError(r, 400, 'INVALID_REQUEST');
    });

    test('wrong types -> 400 INVALID_REQUEST', async () => {
        const r = await once('POST', '/v1/chat/completions', { body: { model: 'chat', messages: 'not an array' } });
        assertError(r, 400, 'INVALID_REQUEST');
    });

    test('unknown model -> 404 MODEL_NOT_FOUND', async () => {
        const r = await once('POST', '/v1/chat/completions', { body: chat('nope') });
        assertError(r, 404, 'MODEL_NOT_FOUND');
    });

    test('wrong method -> 405 METHOD_NOT_ALLOWED', async () => {
        const r = await once('GET', '/v1/chat/completions');
        assertError(r, 405, 'METHOD_NOT_ALLOWED');
    });

    test('unknown path -> 404 NOT_FOUND', async () => {
        const r = await once('GET', '/v1/no/such/path');
        assertError(r, 404, 'NOT_FOUND');
    });

    test('an error answer keeps the connection usable', async () => {
        const c = await open();
        try {
            await c.write(rawRequest('POST', '/v1/chat/completions', { body: '{bad json' }));
            assertError(await c.readResponse(), 400, 'INVALID_REQUEST');
            await c.write(rawRequest('GET', '/health'));
            assert.equal((await c.readResponse()).status, 200);
        } finally {
            c.close();
        }
    });
});

describe('timeouts', () => {
    test('a client that sends half its headers gets 408 REQUEST_TIMEOUT or a close', async () => {
        const c = await open();
        try {
            const t0 = Date.now();
            await c.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty');
            const closed = await c.waitClose(HEADER_READ_MS + 4000);
            assert.ok(closed, `connection still open ${Date.now() - t0} ms after a half request`);
            if (c.buf.length) {
                const r = await c.readResponse(100);
                assertError(r, 408, 'REQUEST_TIMEOUT');
            }
        } finally {
            c.close();
        }
    });

    test('an idle keep-alive connection is closed after keepalive_idle_ms', async () => {
        const c = await open();
        try {
            await c.write(rawRequest('GET', '/health'));
            assert.equal((await c.readResponse()).status, 200);
            const t0 = Date.now();
            const closed = await c.waitClose(KEEPALIVE_IDLE_MS + 4000);
            assert.ok(closed, `idle connection still open after ${Date.now() - t0} ms`);
            assert.equal(c.buf.length, 0, `no bytes expected on an idle close, got ${c.text().slice(0, 200)}`);
        } finally {
            c.close();
        }
    });

    test('an idle connection that never sent a byte is closed too', async () => {
        const c = await open();
        try {
            assert.ok(await c.waitClose(Math.max(HEADER_READ_MS, KEEPALIVE_IDLE_MS) + 4000), 'silent connection closed');
        } finally {
            c.close();
        }
    });
});

describe('health, readiness, status', () => {
    test('/health', async () => {
        const r = await once('GET', '/health');
        assert.equal(r.status, 200);
        assert.deepEqual(r.json().status, 'ok');
        assert.ok(r.headers['x-request-id']);
    });

    for (const p of ['/ready', '/health/ready']) {
        test(p, async () => {
            const r = await once('GET', p);
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json().status, 'ready');
            assert.ok(r.headers['x-request-id']);
        });
    }

    test('/status shape', async () => {
        const r = await once('GET', '/status');
        assert.equal(r.status, 200);
        const s = r.json();
        assert.ok(Number.isInteger(s.generation) && s.generation >= 1, `generation: ${s.generation}`);
        assert.equal(s.reload?.result, 'ok');
        assert.ok(Array.isArray(s.providers), 'providers is an array');
        assert.equal(s.providers.length, env.config.providers.length);
        assert.ok(Number.isInteger(s.in_flight) && s.in_flight >= 0, `in_flight: ${s.in_flight}`);
    });

    test('POST on a GET-only endpoint -> 405', async () => {
        const r = await once('POST', '/v1/models', { body: {} });
        assertError(r, 405, 'METHOD_NOT_ALLOWED');
    });
});
