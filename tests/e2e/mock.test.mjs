// Checks the mock engine itself (no gateway needed): canned answers in the documented shapes,
// scripted rules, request records, closed_early, resets and truncation.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { startMock, postJson, postStream, RawConn, rawRequest, sleep, withTimeout, MOCK_SCRIPT } from './lib/harness.mjs';
import { assertConforms } from './lib/conformance.mjs';
import { contentFor, embeddingFor } from '../mock/engine.mjs';

let mock;
before(async () => {
    mock = await startMock();
});
after(async () => {
    await mock?.close();
});

const chatBody = (model, extra = {}) => ({ model, messages: [{ role: 'user', content: 'hello there mock' }], ...extra });

async function ndjsonLines(url, body) {
    const r = await fetch(url, { method: 'POST', body: JSON.stringify(body), signal: AbortSignal.timeout(5000) });
    const text = await r.text();
    return { status: r.status, headers: r.headers, lines: text.split('\n').filter(Boolean).map((l) => JSON.parse(l)) };
}

describe('canned answers', () => {
    test('chat non-stream conforms and echoes the model', async () => {
        const r = await postJson(`${mock.base}/v1/chat/completions`, chatBody('m-a'));
        assert.equal(r.status, 200);
        assertConforms('CreateChatCompletionResponse', r.json);
        assert.equal(r.json.model, 'm-a');
        assert.equal(r.json.choices[0].message.content, contentFor('m-a'));
        assert.deepEqual(r.json.usage, { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 });
    });

    test('chat stream: role chunk, 5 content chunks, finish chunk, [DONE]; usage only when asked', async () => {
        const s = await postStream(`${mock.base}/v1/chat/completions`, chatBody('m-b', { stream: true }));
        assert.equal(s.status, 200);
        assert.match(s.headers.get('content-type'), /text\/event-stream/);
        assert.equal(s.data.at(-1), '[DONE]');
        const chunks = s.events.slice(0, -1);
        assert.equal(chunks.length, 7);
        for (const c of chunks) assertConforms('CreateChatCompletionStreamResponse', c);
        assert.equal(chunks[0].choices[0].delta.role, 'assistant');
        assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
        assert.ok(chunks.every((c) => !('usage' in c)));
        assert.equal(chunks.map((c) => c.choices[0].delta.content ?? '').join(''), contentFor('m-b'));

        const u = await postStream(`${mock.base}/v1/chat/completions`,
            chatBody('m-b', { stream: true, stream_options: { include_usage: true } }));
        const last = u.events.at(-2);
        assert.deepEqual(last.choices, []);
        assert.equal(last.usage.completion_tokens, 5);
        for (const c of u.events.slice(0, -1)) assertConforms('CreateChatCompletionStreamResponse', c);
    });

    test('max_tokens cuts the answer with finish_reason length', async () => {
        const r = await postJson(`${mock.base}/v1/chat/completions`, chatBody('m-c', { max_tokens: 2 }));
        assert.equal(r.json.choices[0].finish_reason, 'length');
        assert.equal(r.json.choices[0].message.content, contentFor('m-c', 2));
    });

    test('completions, embeddings (float and base64), models conform', async () => {
        const c = await postJson(`${mock.base}/v1/completions`, { model: 'm-d', prompt: 'say hi' });
        assertConforms('CreateCompletionResponse', c.json);
        assert.equal(c.json.choices[0].text, contentFor('m-d'));
        const cs = await postStream(`${mock.base}/v1/completions`, { model: 'm-d', prompt: 'x', stream: true });
        assert.equal(cs.data.at(-1), '[DONE]');
        // the official schema has a non-nullable finish_reason, so only the finishing chunk of a
        // legacy completions stream can conform
        assertConforms('CreateCompletionResponse', cs.events.at(-2));
        assert.equal(cs.events.at(-2).choices[0].finish_reason, 'stop');

        const e = await postJson(`${mock.base}/v1/embeddings`, { model: 'm-e', input: ['a', 'b'] });
        assertConforms('CreateEmbeddingResponse', e.json);
        assert.deepEqual(e.json.data[1].embedding, embeddingFor('b'));
        const b = await postJson(`${mock.base}/v1/embeddings`, { model: 'm-e', input: 'a', encoding_format: 'base64' });
        const buf = Buffer.from(b.json.data[0].embedding, 'base64');
        assert.deepEqual(Array.from(new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4)), embeddingFor('a'));

        const m = await fetch(`${mock.base}/v1/models`).then((r) => r.json());
        assertConforms('ListModelsResponse', m);
    });

    test('ollama /api/chat streams NDJSON by default and ends with done:true', async () => {
        const r = await ndjsonLines(`${mock.base}/api/chat`, chatBody('o-a'));
        assert.equal(r.status, 200);
        assert.match(r.headers.get('content-type'), /application\/x-ndjson/);
        assert.equal(r.lines.length, 6);
        const last = r.lines.at(-1);
        assert.equal(last.done, true);
        assert.equal(last.done_reason, 'stop');
        assert.equal(last.eval_count, 5);
        assert.equal(last.prompt_eval_count, 3);
        assert.equal(r.lines.map((l) => l.message.content).join(''), contentFor('o-a'));
        assert.ok(r.lines.slice(0, -1).every((l) => l.done === false));
    });

    test('ollama non-stream chat, num_predict, generate, embed, tags', async () => {
        const r = await postJson(`${mock.base}/api/chat`, chatBody('o-b', { stream: false, options: { num_predict: 3 } }));
        assert.equal(r.json.done, true);
        assert.equal(r.json.done_reason, 'length');
        assert.equal(r.json.message.content, contentFor('o-b', 3));
        const g = await ndjsonLines(`${mock.base}/api/generate`, { model: 'o-c', prompt: 'hi' });
        assert.equal(g.lines.map((l) => l.response).join(''), contentFor('o-c'));
        assert.equal(g.lines.at(-1).done, true);
        const e = await postJson(`${mock.base}/api/embed`, { model: 'o-d', input: ['x', 'y'] });
        assert.deepEqual(e.json.embeddings, [embeddingFor('x'), embeddingFor('y')]);
        const t = await fetch(`${mock.base}/api/tags`).then((x) => x.json());
        assert.ok(Array.isArray(t.models) && t.models[0].name);
    });
});

describe('scripts and records', () => {
    test('status rule with headers, times, model and path matching, FIFO', async () => {
        await mock.reset();
        await mock.script({ model: 'rl', times: 1, action: { status: 429, headers: { 'Retry-After': '3' } } });
        await mock.script({ model: 'rl', times: 1, action: { status: 500 } });
        await mock.script({ path: '/api/chat', times: 1, action: { status: 401 } });
        const a = await postJson(`${mock.base}/v1/chat/completions`, chatBody('rl'));
        assert.equal(a.status, 429);
        assert.equal(a.headers.get('retry-after'), '3');
        assert.equal(a.json.error.type, 'rate_limit_error');
        const b = await postJson(`${mock.base}/v1/chat/completions`, chatBody('rl'));
        assert.equal(b.status, 500);
        const c = await postJson(`${mock.base}/v1/chat/completions`, chatBody('rl'));
        assert.equal(c.status, 200);
        const d = await postJson(`${mock.base}/api/chat`, chatBody('zz', { stream: false }));
        assert.equal(d.status, 401);
        assert.equal(typeof d.json.error, 'string');
        const recs = await mock.requests();
        assert.equal(recs.length, 4);
        assert.ok(recs.every((r, i) => i === 0 || r.seq === recs[i - 1].seq + 1), 'seq increases by one');
        assert.equal(recs[0].body.model, 'rl');
        assert.ok(recs.every((r) => r.finished && !r.closed_early && r.ended_at >= r.started_at));
        const rules = await mock.rules();
        assert.deepEqual(rules.map((r) => r.used), [1, 1, 1]);
    });

    test('custom body, garbage (non-stream and stream)', async () => {
        await mock.reset();
        await mock.script({ model: 'g1', action: { garbage: true } });
        await mock.script({ model: 'g2', action: { status: 200, body: 'plain text' } });
        const g = await postJson(`${mock.base}/v1/chat/completions`, chatBody('g1'));
        assert.equal(g.status, 200);
        assert.equal(g.json, null);
        const s = await postStream(`${mock.base}/v1/chat/completions`, chatBody('g1', { stream: true }));
        assert.equal(s.events.length, 1);
        assert.ok(s.events[0].__unparsed);
        const p = await postJson(`${mock.base}/v1/chat/completions`, chatBody('g2'));
        assert.equal(p.text, 'plain text');
    });

    test('chunks, truncate_after_chunks, reset_after_chunks, garbage_after_chunks', async () => {
        await mock.reset();
        await mock.script({ model: 'c8', action: { chunks: 8 } });
        await mock.script({ model: 'tr', action: { truncate_after_chunks: 2 } });
        await mock.script({ model: 'rs', action: { reset_after_chunks: 2, chunk_delay_ms: 10 } });
        await mock.script({ model: 'ga', action: { garbage_after_chunks: 1 } });
        const c8 = await postStream(`${mock.base}/v1/chat/completions`, chatBody('c8', { stream: true }));
        assert.equal(c8.events.length, 1 + 8 + 1 + 1);
        const tr = await postStream(`${mock.base}/v1/chat/completions`, chatBody('tr', { stream: true }));
        assert.equal(tr.error, null, 'truncation ends cleanly at the HTTP level');
        assert.equal(tr.events.length, 3);
        assert.ok(!tr.data.includes('[DONE]'));
        const rs = await postStream(`${mock.base}/v1/chat/completions`, chatBody('rs', { stream: true }));
        assert.ok(rs.error, 'a reset breaks the HTTP transfer');
        assert.equal(rs.events.length, 3);
        const ga = await postStream(`${mock.base}/v1/chat/completions`, chatBody('ga', { stream: true }));
        assert.equal(ga.events.length, 3);
        assert.ok(ga.events[2].__unparsed);
        const ot = await ndjsonLines(`${mock.base}/api/chat`, chatBody('tr'));
        assert.equal(ot.lines.length, 2);
        assert.ok(ot.lines.every((l) => l.done === false));
        const recs = await mock.requests((r) => r.body?.model === 'rs');
        assert.equal(recs[0].reset_by_mock, true);
        assert.equal(recs[0].closed_early, false);
    });

    test('a body in parts arrives in separate writes; an injected frame and the stream goes on', async () => {
        await mock.reset();
        await mock.script({ model: 'parts', action: { body: ['{"a":', '1}\n'], chunk_delay_ms: 30 } });
        await mock.script({ model: 'inj', action: { inject_frame: 'data: not json\n\n', inject_after_frames: 2 } });
        const r = await fetch(`${mock.base}/api/chat`, { method: 'POST', body: JSON.stringify(chatBody('parts')) });
        const pieces = [];
        for await (const c of r.body) pieces.push(Buffer.from(c).toString());
        assert.equal(pieces.join(''), '{"a":1}\n');
        assert.ok(pieces.length >= 2, `two reads: ${JSON.stringify(pieces)}`);
        const s = await postStream(`${mock.base}/v1/chat/completions`, chatBody('inj', { stream: true }));
        assert.equal(s.data[2], 'not json');
        assert.equal(s.events.length, 1 + 5 + 1 + 1 + 1, 'the whole stream around it');
        assert.equal(s.data.at(-1), '[DONE]');
    });

    test('reset before any byte', async () => {
        await mock.reset();
        await mock.script({ model: 'r0', action: { reset: true } });
        await assert.rejects(postJson(`${mock.base}/v1/chat/completions`, chatBody('r0')));
    });

    test('delay_first_byte_ms and chunk_delay_ms', async () => {
        await mock.reset();
        await mock.script({ model: 'slow', action: { delay_first_byte_ms: 300, chunk_delay_ms: 50, chunks: 3 } });
        const t0 = Date.now();
        const s = await postStream(`${mock.base}/v1/chat/completions`, chatBody('slow', { stream: true }));
        const dt = Date.now() - t0;
        assert.equal(s.data.at(-1), '[DONE]');
        assert.ok(dt >= 300 + 4 * 50 - 20, `took ${dt} ms`);
    });

    test('hold: answered only once released, in any order with the others; later ones pass', async () => {
        await mock.reset();
        await mock.script({ model: 'held', action: { hold: 'h1' } });
        const held = postJson(`${mock.base}/v1/chat/completions`, chatBody('held'));
        const rec = await mock.waitRequest((r) => r.body?.model === 'held' && r.held);
        // another model is answered while the first waits
        const other = await postJson(`${mock.base}/v1/chat/completions`, chatBody('free'));
        assert.equal(other.status, 200);
        const still = (await mock.requests((r) => r.seq === rec.seq))[0];
        assert.equal(still.finished, false, 'the held request is not answered yet');
        assert.equal((await mock.release('h1')).released, 1);
        const r = await held;
        assert.equal(r.status, 200);
        assert.equal(r.json.model, 'held');
        const after = (await mock.requests((x) => x.seq === rec.seq))[0];
        assert.equal(after.held, false);
        assert.equal(after.finished, true);
        // released: the next one under that name passes at once
        assert.equal((await postJson(`${mock.base}/v1/chat/completions`, chatBody('held'))).status, 200);
        const bad = await fetch(`${mock.base}/__mock/release`, { method: 'POST', body: '{}' });
        assert.equal(bad.status, 400);
    });

    test('hang + client close -> closed_early; mid-stream client close -> closed_early', async () => {
        await mock.reset();
        await mock.script({ model: 'hang', action: { hang: true } });
        await mock.script({ model: 'slowstream', action: { chunk_delay_ms: 300, chunks: 20 } });
        const ac = new AbortController();
        const p = fetch(`${mock.base}/v1/chat/completions`, { method: 'POST', body: JSON.stringify(chatBody('hang')), signal: ac.signal });
        await mock.waitRequest((r) => r.body?.model === 'hang');
        ac.abort();
        await assert.rejects(p);
        const h = await mock.waitRequest((r) => r.body?.model === 'hang' && r.closed_early, { timeoutMs: 2000 });
        assert.equal(h.finished, false);

        const conn = await RawConn.open(mock.port);
        await conn.write(rawRequest('POST', '/v1/chat/completions', { body: chatBody('slowstream', { stream: true }) }));
        await conn.waitText('says', 5000);
        conn.destroy();
        const s = await mock.waitRequest((r) => r.body?.model === 'slowstream' && r.closed_early, { timeoutMs: 2000 });
        assert.equal(s.finished, false);
        assert.ok(s.ended_at !== null);
    });

    test('keep-alive: records per request, not per connection', async () => {
        await mock.reset();
        const conn = await RawConn.open(mock.port);
        await conn.write(rawRequest('POST', '/v1/chat/completions', { body: chatBody('k1') }) +
            rawRequest('POST', '/v1/chat/completions', { body: chatBody('k2') }));
        const a = await conn.readResponse();
        const b = await conn.readResponse();
        assert.equal(a.json().model, 'k1');
        assert.equal(b.json().model, 'k2');
        conn.close();
        assert.equal((await mock.requests()).length, 2);
    });

    test('tens of concurrent streams', async () => {
        await mock.reset();
        await mock.script({ model: 'many', action: { chunk_delay_ms: 20, chunks: 10 } });
        const t0 = Date.now();
        const all = await Promise.all(Array.from({ length: 40 }, () =>
            postStream(`${mock.base}/v1/chat/completions`, chatBody('many', { stream: true }))));
        assert.ok(all.every((s) => s.data.at(-1) === '[DONE]'));
        assert.ok(Date.now() - t0 < 3000);
        assert.equal((await mock.requests()).length, 40);
    });
});

test('CLI: --demo banner on stderr, listening line on stdout, --port', async () => {
    const child = spawn(process.execPath, [MOCK_SCRIPT, '--demo', '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    try {
        let out = '';
        let err = '';
        child.stdout.on('data', (d) => (out += d));
        child.stderr.on('data', (d) => (err += d));
        await withTimeout((async () => {
            while (!out.includes('\n')) await sleep(20);
        })(), 5000, 'mock listening line');
        const j = JSON.parse(out.split('\n')[0]);
        assert.equal(j.mock, 'listening');
        assert.ok(j.port > 0);
        await sleep(50);
        assert.match(err, /DEMO ENGINE/);
        assert.match(err, /NOT a language model/);
        // the port really answers
        await new Promise((resolve, reject) => {
            const s = net.connect(j.port, '127.0.0.1', () => {
                s.destroy();
                resolve();
            });
            s.on('error', reject);
        });
    } finally {
        child.kill('SIGKILL');
    }
});
