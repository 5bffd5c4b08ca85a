// Helpers for the dashboard tests: sign-in through /api/dashboard/login, requests with the
// session cookie and CSRF token, and a reader of /api/dashboard/stream's SSE events. Every wait
// is bounded.

import { readAnswer, withTimeout } from './harness.mjs';

/** POST /api/dashboard/login; returns { status, json, cookie (name=value), setCookie }. */
export async function signIn(base, token) {
    const r = await fetch(`${base}/api/dashboard/login`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ token }),
        signal: AbortSignal.timeout(5000),
    });
    const text = await r.text();
    const setCookie = r.headers.get('set-cookie');
    let json = null;
    try {
        json = JSON.parse(text);
    } catch {
        /* not JSON */
    }
    return { status: r.status, json, text, setCookie, cookie: setCookie ? setCookie.split(';')[0] : null };
}

/** A request with a session: { cookie, csrf } (either may be missing). */
export async function withSession(base, method, p, { cookie, csrf, body, headers = {} } = {}) {
    const h = { ...headers };
    if (cookie) h.cookie = cookie;
    if (csrf) h['x-csrf-token'] = csrf;
    if (body !== undefined) h['content-type'] = 'application/json';
    const r = await fetch(`${base}${p}`, {
        method, headers: h, body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(10000),
    });
    return readAnswer(r);
}

/** Parse SSE text into complete events [{event, id, data, comment}] and the incomplete rest. */
export function parseSse(text) {
    const events = [];
    const blocks = text.split('\n\n');
    const rest = blocks.pop();
    for (const b of blocks) {
        const ev = { event: 'message', id: null, data: null, comments: [], retry: null };
        const data = [];
        for (const line of b.split('\n')) {
            if (line.startsWith(':')) ev.comments.push(line.slice(1).trim());
            else if (line.startsWith('event: ')) ev.event = line.slice(7);
            else if (line.startsWith('id: ')) ev.id = line.slice(4);
            else if (line.startsWith('data: ')) data.push(line.slice(6));
            else if (line.startsWith('retry: ')) ev.retry = Number(line.slice(7));
        }
        if (data.length) ev.data = JSON.parse(data.join('\n'));
        events.push(ev);
    }
    return { events, rest };
}

/** Open the stream (query: its query string); returns { status, headers, events (growing), waitFor(pred), ended, close() }. */
export async function openStream(base, cookie, { lastEventId, query } = {}) {
    const ctl = new AbortController();
    const headers = { cookie };
    if (lastEventId !== undefined) headers['last-event-id'] = String(lastEventId);
    const r = await fetch(`${base}/api/dashboard/stream${query ? `?${query}` : ''}`, { headers, signal: ctl.signal });
    const s = { status: r.status, headers: r.headers, events: [], ended: false, waiters: new Set() };
    if (r.status !== 200) {
        s.text = await r.text();
        return s;
    }
    let buf = '';
    const dec = new TextDecoder();
    (async () => {
        try {
            for await (const chunk of r.body) {
                buf += dec.decode(chunk, { stream: true });
                const { events, rest } = parseSse(buf);
                buf = rest;
                s.events.push(...events);
                for (const w of s.waiters) w();
            }
        } catch {
            /* aborted */
        }
        s.ended = true;
        for (const w of s.waiters) w();
    })();
    /** Resolve with the first event (from index `from` on) matching pred. */
    s.waitFor = (pred, { timeoutMs = 5000, from = 0, what = 'stream event' } = {}) => {
        let w;
        const p = new Promise((resolve, reject) => {
            w = () => {
                const e = s.events.slice(from).find(pred);
                if (e) resolve(e);
                else if (s.ended) reject(new Error(`stream ended before ${what}`));
            };
            s.waiters.add(w);
            w();
        });
        return withTimeout(p, timeoutMs, what).finally(() => s.waiters.delete(w));
    };
    s.waitEnd = (timeoutMs = 5000) => withTimeout(new Promise((resolve) => {
        const w = () => s.ended && resolve();
        s.waiters.add(w);
        w();
    }), timeoutMs, 'stream end');
    s.close = () => ctl.abort();
    return s;
}
