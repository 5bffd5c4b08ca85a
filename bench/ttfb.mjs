// Time to first body byte of a streamed chat completion, for bench/run.
//
// Sends N sequential POST /v1/chat/completions (stream: true) on one keep-alive connection and
// measures, per request, the time from writing the request to the arrival of the first byte
// after the response headers (the first SSE chunk) and to the end of the response. A raw socket
// with a minimal HTTP/1.1 parser keeps the tool's own cost small and identical for every variant.
//
// usage: node ttfb.mjs PORT MODEL N [WARMUP]
// prints one JSON line: {"n":..,"errors":..,"first_error":..,"ttfb_us":[..],"total_us":[..]}
import net from 'node:net';

const [port, model, nStr, warmStr] = process.argv.slice(2);
const N = Number(nStr || 200);
const WARMUP = Number(warmStr || 20);
const TIMEOUT_MS = 5000;

const body = JSON.stringify({
    model,
    messages: [
        { role: 'system', content: 'You are a concise assistant.' },
        {
            role: 'user',
            content: 'In one short sentence, explain why an HTTP reverse proxy should keep ' +
                'upstream connections alive and pooled.',
        },
    ],
    max_tokens: 64,
    temperature: 0.2,
    user: 'bench-client-0001',
    stream: true,
    stream_options: { include_usage: true },
});
const request = Buffer.from(
    'POST /v1/chat/completions HTTP/1.1\r\n' +
    `Host: 127.0.0.1:${port}\r\n` +
    'Content-Type: application/json\r\n' +
    'Authorization: Bearer sk-mock-0000000000000000\r\n' +
    'Accept: text/event-stream\r\n' +
    `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n` + body);

// Returns { done, payload } for a chunked body received so far (null payload = malformed).
function dechunk(buf) {
    const parts = [];
    let pos = 0;
    for (;;) {
        const eol = buf.indexOf('\r\n', pos);
        if (eol < 0) return { done: false };
        const size = parseInt(buf.toString('latin1', pos, eol).split(';')[0], 16);
        if (Number.isNaN(size)) return { done: true, payload: null };
        if (size === 0) {
            const end = buf.indexOf('\r\n\r\n', eol);
            if (end < 0) return { done: false }; // trailers / final CRLF still to come
            return { done: true, payload: Buffer.concat(parts).toString() };
        }
        if (buf.length < eol + 2 + size + 2) return { done: false };
        parts.push(buf.subarray(eol + 2, eol + 2 + size));
        pos = eol + 2 + size + 2;
    }
}

// One response parser/state per request.
function newState(t0) {
    return { t0, buf: Buffer.alloc(0), headerEnd: -1, status: 0, chunked: false, clen: -1,
             close: false, ttfb: 0n };
}

function parseHeaders(st) {
    const head = st.buf.toString('latin1', 0, st.headerEnd);
    const lines = head.split('\r\n');
    st.status = Number(lines[0].split(' ')[1]);
    for (const line of lines.slice(1)) {
        const i = line.indexOf(':');
        const name = line.slice(0, i).trim().toLowerCase();
        const value = line.slice(i + 1).trim().toLowerCase();
        if (name === 'transfer-encoding' && value.includes('chunked')) st.chunked = true;
        if (name === 'content-length') st.clen = Number(value);
        if (name === 'connection' && value === 'close') st.close = true;
    }
}

// Feeds bytes; returns null while incomplete, else { ok, error }.
function feed(st, data, now) {
    st.buf = st.buf.length ? Buffer.concat([st.buf, data]) : data;
    if (st.headerEnd < 0) {
        const i = st.buf.indexOf('\r\n\r\n');
        if (i < 0) return null;
        st.headerEnd = i + 4;
        parseHeaders(st);
    }
    const bodyBuf = st.buf.subarray(st.headerEnd);
    if (bodyBuf.length > 0 && st.ttfb === 0n) st.ttfb = now - st.t0;
    let payload;
    if (st.chunked) {
        const r = dechunk(bodyBuf);
        if (!r.done) return null;
        if (r.payload === null) return { ok: false, error: 'malformed chunked body' };
        payload = r.payload;
    } else if (st.clen >= 0) {
        if (bodyBuf.length < st.clen) return null;
        payload = bodyBuf.toString();
    } else {
        return null; // read until close
    }
    if (st.status !== 200) return { ok: false, error: `HTTP ${st.status}: ${payload.slice(0, 200)}` };
    if (!payload.includes('data: [DONE]')) return { ok: false, error: 'stream without [DONE]' };
    return { ok: true };
}

function connect() {
    return new Promise((resolve, reject) => {
        const s = net.connect({ host: '127.0.0.1', port: Number(port) }, () => resolve(s));
        s.setNoDelay(true);
        s.once('error', reject);
    });
}

function once(sock) {
    return new Promise((resolve) => {
        const st = newState(process.hrtime.bigint());
        const timer = setTimeout(() => finish({ ok: false, error: 'timeout' }), TIMEOUT_MS);
        function finish(r) {
            clearTimeout(timer);
            sock.off('data', onData);
            sock.off('close', onClose);
            sock.off('error', onClose);
            const end = process.hrtime.bigint();
            resolve({ ...r, close: st.close, ttfb: Number(st.ttfb) / 1000,
                      total: Number(end - st.t0) / 1000 });
        }
        function onData(d) {
            const r = feed(st, d, process.hrtime.bigint());
            if (r) finish(r);
        }
        function onClose() {
            finish({ ok: false, error: 'connection closed mid-response', closed: true });
        }
        sock.on('data', onData);
        sock.on('close', onClose);
        sock.on('error', onClose);
        st.t0 = process.hrtime.bigint();
        sock.write(request);
    });
}

async function main() {
    const out = { n: 0, errors: 0, first_error: null, ttfb_us: [], total_us: [] };
    let sock = null;
    for (let i = 0; i < WARMUP + N; i++) {
        if (!sock || sock.destroyed) sock = await connect();
        const r = await once(sock);
        if (r.close || r.closed || !r.ok) { sock.destroy(); sock = null; }
        if (i < WARMUP) continue;
        if (!r.ok) {
            out.errors++;
            if (!out.first_error) out.first_error = r.error;
            continue;
        }
        out.n++;
        out.ttfb_us.push(Math.round(r.ttfb * 10) / 10);
        out.total_us.push(Math.round(r.total * 10) / 10);
    }
    if (sock) sock.destroy();
    process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => {
    process.stdout.write(JSON.stringify({ n: 0, errors: 1, first_error: String(e), ttfb_us: [],
                                          total_us: [] }) + '\n');
});
