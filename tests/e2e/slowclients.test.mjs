// Slow clients never count against a healthy provider (issue 16, item 3). A client that reads
// a stream slower than the upstream sends it pauses the upstream; when the request's deadline
// then passes, that is the client side's doing: the provider's health, breakers and cooldown
// learn nothing from it, the log line says ended_by: client, and everybody else keeps being
// served. Each slow client is a raw socket that sends a streaming request and never reads.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startEnv, RawConn, rawRequest, postJson, waitFor } from './lib/harness.mjs';

const TOTAL_MS = 1500;
const SLOW_CLIENTS = 6; // more than the route breaker's 3 failures in a row
const PIECES = 3000;
const PIECE_BYTES = 16 << 10; // a 48 MiB stream: more than loopback buffers hold

let env;

before(async () => {
    env = await startEnv({
        timeouts: { total_ms: TOTAL_MS },
        server: { write_timeout_ms: 60000 }, // the deadline passes first, not the write timeout
        extraModels: { slow: { routes: [{ provider: 'mock-openai', model: 'up-slow' }] } },
        configure: (c) => ({ ...c, health: { probes: false } }),
    });
    await env.mock.script({ model: 'up-slow', times: SLOW_CLIENTS,
        action: { chunks: PIECES, piece_bytes: PIECE_BYTES } });
});

after(async () => {
    await env?.close();
});

async function slowClient() {
    const c = await RawConn.open(env.gw.port);
    c.socket.pause();
    await c.write(rawRequest('POST', '/v1/chat/completions', {
        body: { model: 'slow', stream: true, messages: [{ role: 'user', content: 'read me slowly' }] },
    }));
    return c;
}

test('clients too slow for the deadline: the provider stays healthy and serves the next request', async () => {
    const from = env.gw.logs.length;
    const clients = [];
    for (let i = 0; i < SLOW_CLIENTS; i++) clients.push(await slowClient());
    try {
        const lines = await waitFor(() => {
            const done = env.gw.logs.slice(from).filter((l) => l.msg === 'request' && l.model === 'slow');
            return done.length >= SLOW_CLIENTS ? done : null;
        }, { timeoutMs: 20000, what: `${SLOW_CLIENTS} slow requests to end` });
        for (const l of lines) {
            assert.equal(l.error, 'INFERENCE_TIMEOUT', JSON.stringify(l));
            assert.equal(l.ended_by, 'client', 'the log says the client side ended it');
        }
        const st = await env.gw.getJson('/status');
        const p = st.json.providers.find((x) => x.id === 'mock-openai');
        assert.equal(p.available, true, `the provider is still available: ${JSON.stringify(p)}`);
        assert.equal(p.consecutive_failures, 0);
        const r = await postJson(`${env.api}/chat/completions`,
            { model: 'slow', messages: [{ role: 'user', content: 'and now a normal one' }] });
        assert.equal(r.status, 200, r.text);
    } finally {
        for (const c of clients) c.close();
    }
});
