// Usage events (issue 19): one event per request that reached routing, on every endpoint and
// outcome, stream or not, with its fields; cache tokens kept apart; the hourly and daily
// roll-ups equal the sums of the raw events; versioned prices stamped on each event.
//
// The database is read with the sqlite3 command-line shell (scripts/setup installs it). An
// event is committed before its answer's last byte left (obs/usage.h), so a test may read
// it as soon as the client has the whole answer.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { startEnv, postJson, postStream, sleep, journalDrained } from './lib/harness.mjs';

let env;
let dbPath;

before(async () => {
    env = await startEnv({
        timeouts: { first_byte_ms: 300, max_first_byte_ms: 2000 },
        configure: (c) => ({
            ...c,
            models: { ...c.models, chat: { ...c.models.chat, tokenizer: 'o200k_base' } },
            health: { probes: false },
            usage: { retention_days: 1, prune_interval_s: 1, prune_batch: 2 },
            providers: c.providers.map((p) => (p.id === 'mock-openai-b' ? { ...p, cost_per_1k_tokens: 2 } : p)),
            prices: [
                { provider: 'mock-openai', model: 'up-chat', input_per_1m_micros: 1000000, output_per_1m_micros: 4000000,
                  cached_input_per_1m_micros: 250000, cache_write_per_1m_micros: 1250000, effective_at: 0 },
                // a later version of the same price: in force from now on
                { provider: 'mock-openai', model: 'up-chat', input_per_1m_micros: 2000000, output_per_1m_micros: 8000000,
                  cached_input_per_1m_micros: 500000, cache_write_per_1m_micros: 2500000, effective_at: '2020-01-01T00:00:00Z' },
                // a future one: not yet
                { provider: 'mock-openai', model: 'up-chat', input_per_1m_micros: 9, output_per_1m_micros: 9,
                  effective_at: '2999-01-01T00:00:00Z' },
                { provider: 'mock-openai', input_per_1m_micros: 3000000, output_per_1m_micros: 3000000 },
            ],
        }),
    });
    dbPath = env.config.storage.path;
});

after(async () => {
    await env?.close();
});

/** One SQL query on the database, rows as objects (the sqlite3 shell's -json mode). */
export function query(sql, db = dbPath) {
    const out = execFileSync('sqlite3', ['-json', '-cmd', '.timeout 5000', db, sql], { encoding: 'utf8', timeout: 10000 });
    return out.trim() ? JSON.parse(out) : [];
}

/** The roll-ups are written about once a second (core/store/store.h): wait until they cover
 *  every event in the table (the watermark reached the last seq). */
async function rolledUp() {
    await journalDrained(env.gw);
    for (let i = 0; i < 100; i++) {
        const r = query('SELECT (SELECT seq FROM usage_rollup_mark) AS mark, (SELECT COALESCE(MAX(seq), 0) FROM usage_events) AS last')[0];
        if (r.mark >= r.last) return;
        await sleep(50);
    }
    assert.fail('the roll-ups never covered the last event');
}

async function eventOf(requestId) {
    await journalDrained(env.gw);
    const rows = query(`SELECT * FROM usage_events WHERE request_id = '${requestId.replace(/'/g, "''")}'`);
    assert.equal(rows.length, 1, `exactly one event for ${requestId}`);
    return rows[0];
}

async function script(rules) {
    const r = await fetch(`http://127.0.0.1:${env.mock.port}/__mock/script`, {
        method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(rules),
    });
    assert.equal(r.status, 200);
}

async function resetMock() {
    await fetch(`http://127.0.0.1:${env.mock.port}/__mock/reset`, { method: 'POST' });
}

const chat = (extra = {}) => ({ model: 'chat', messages: [{ role: 'user', content: 'count my tokens please' }], ...extra });

/** Events whose request ids are given, by the answer header X-Request-Id. */
const rid = (r) => r.headers.get('x-request-id');

/** micros = ceil(sum tokens x price per 1M / 1e6) */
const cost = (t, p) => Math.ceil((t.input * p.in + t.output * p.out + t.cached * p.cached + t.write * p.write) / 1e6);
const PRICE_NOW = { in: 2000000, out: 8000000, cached: 500000, write: 2500000 };

describe('one usage event per request', () => {
    test('a non-stream and a streamed chat agree: tokens, cost, price version; the stream says so', async () => {
        const a = await postJson(`${env.api}/chat/completions`, chat());
        assert.equal(a.status, 200, a.text);
        const s = await postStream(`${env.api}/chat/completions`, chat({ stream: true, stream_options: { include_usage: true } }));
        assert.equal(s.status, 200);
        const ea = await eventOf(rid(a));
        const es = await eventOf(rid(s));
        assert.equal(ea.status, 'succeeded');
        assert.equal(es.status, 'succeeded');
        assert.equal(ea.stream, 0);
        assert.equal(es.stream, 1);
        assert.equal(ea.endpoint, 'chat');
        assert.equal(ea.logical_model, 'chat');
        assert.equal(ea.actual_model, 'up-chat');
        assert.equal(ea.provider_id, 'mock-openai');
        assert.equal(ea.pool, 'main');
        assert.equal(ea.attempts, 1);
        assert.equal(ea.http_status, 200);
        assert.equal(ea.error_code, null);
        assert.equal(ea.input_tokens, a.json.usage.prompt_tokens);
        assert.equal(ea.output_tokens, a.json.usage.completion_tokens);
        assert.equal(ea.input_estimated, 0);
        assert.equal(ea.cancelled, 0);
        for (const k of ['input_tokens', 'output_tokens', 'cached_read_tokens', 'cache_write_tokens', 'cost_micros', 'price_version'])
            assert.equal(es[k], ea[k], `stream and non-stream agree on ${k}`);
        const expected = cost({ input: ea.input_tokens, output: ea.output_tokens, cached: 0, write: 0 }, PRICE_NOW);
        assert.equal(ea.cost_micros, expected, 'the version in force (2020), not the older nor the future one');
        assert.match(ea.price_version, /^cfg-[0-9a-f]{8}$/);
        assert.ok(ea.latency_ms >= 0 && es.ttft_ms !== null && es.ttft_ms <= es.latency_ms);
        assert.ok(ea.queue_ms <= ea.latency_ms);
    });

    test('OpenAI cached_tokens are a subset of prompt_tokens; reasoning a subset of completion; both apart in the event', async () => {
        const usage = { prompt_tokens: 100, completion_tokens: 20, total_tokens: 120,
            prompt_tokens_details: { cached_tokens: 40 }, completion_tokens_details: { reasoning_tokens: 5 } };
        await script({ model: 'up-chat', times: 1, action: { status: 200, body: {
            id: 'x', object: 'chat.completion', created: 1, model: 'up-chat',
            choices: [{ index: 0, message: { role: 'assistant', content: 'hi', refusal: null }, logprobs: null, finish_reason: 'stop' }],
            usage } } });
        const a = await postJson(`${env.api}/chat/completions`, chat());
        assert.equal(a.status, 200, a.text);
        const e = await eventOf(rid(a));
        assert.equal(e.input_tokens, 60, 'uncached input = prompt_tokens - cached_tokens');
        assert.equal(e.cached_read_tokens, 40);
        assert.equal(e.cache_write_tokens, 0);
        assert.equal(e.output_tokens, 20);
        assert.equal(e.reasoning_tokens, 5);
        assert.equal(e.cost_micros, cost({ input: 60, output: 20, cached: 40, write: 0 }, PRICE_NOW));
    });

    test('Anthropic cache fields are apart from the input: nothing subtracted (streamed)', async () => {
        const chunk = (o) => `data: ${JSON.stringify(o)}\n\n`;
        const base = { id: 'y', object: 'chat.completion.chunk', created: 1, model: 'up-chat' };
        await script({ model: 'up-chat', times: 1, action: { status: 200, headers: { 'content-type': 'text/event-stream' }, body: [
            chunk({ ...base, choices: [{ index: 0, delta: { role: 'assistant', content: 'hi' }, logprobs: null, finish_reason: null }] }),
            chunk({ ...base, choices: [{ index: 0, delta: {}, logprobs: null, finish_reason: 'stop' }] }),
            chunk({ ...base, choices: [], usage: { prompt_tokens: 10, completion_tokens: 3, total_tokens: 13,
                cache_read_input_tokens: 30, cache_creation_input_tokens: 7 } }),
            'data: [DONE]\n\n',
        ] } });
        const s = await postStream(`${env.api}/chat/completions`, chat({ stream: true }));
        assert.equal(s.status, 200);
        const e = await eventOf(rid(s));
        assert.equal(e.input_tokens, 10);
        assert.equal(e.cached_read_tokens, 30);
        assert.equal(e.cache_write_tokens, 7);
        assert.equal(e.output_tokens, 3);
        assert.equal(e.cost_micros, cost({ input: 10, output: 3, cached: 30, write: 7 }, PRICE_NOW));
    });

    test('an upstream without usage: the tokenizer counts, the event says estimated, the cost is charged', async () => {
        await script({ model: 'up-chat', times: 1, action: { status: 200, body: {
            id: 'z', object: 'chat.completion', created: 1, model: 'up-chat',
            choices: [{ index: 0, message: { role: 'assistant', content: 'hello there my friend', refusal: null }, logprobs: null, finish_reason: 'stop' }] } } });
        const a = await postJson(`${env.api}/chat/completions`, chat());
        assert.equal(a.status, 200, a.text);
        const e = await eventOf(rid(a));
        assert.equal(e.input_estimated, 1);
        assert.equal(e.output_estimated, 1);
        assert.ok(e.input_tokens > 0, 'the prompt was counted');
        assert.equal(e.output_tokens, 4, '"hello there my friend" is 4 tokens');
        assert.ok(e.cost_micros > 0, 'never free');
    });

    test('failed: every attempt refused; status, error code and attempts recorded, nothing charged', async () => {
        await script({ model: 'up-chat', times: 10, action: { status: 500 } });
        const a = await postJson(`${env.api}/chat/completions`, chat());
        await resetMock();
        assert.ok(a.status >= 500, a.text);
        const e = await eventOf(rid(a));
        assert.equal(e.status, 'failed');
        assert.equal(e.http_status, a.status);
        assert.equal(e.error_code, a.json.error.code);
        assert.ok(e.attempts >= 1);
        assert.equal(e.output_tokens, 0);
        assert.equal(e.cost_micros, 0);
    });

    test('timed out: no first byte in time', async () => {
        await script({ model: 'up-chat', times: 10, action: { delay_first_byte_ms: 1500 } });
        const a = await postJson(`${env.api}/chat/completions`, chat({ timeouts: { inference_ms: 300 } }));
        await resetMock();
        assert.equal(a.status, 408, a.text);
        const e = await eventOf(rid(a));
        assert.equal(e.status, 'timed_out');
        assert.equal(e.error_code, a.json.error.code);
    });

    test('cancelled by the client mid-stream: one event, cancelled, the output so far estimated', async () => {
        await script({ model: 'up-chat', times: 1, action: { chunks: 50, chunk_delay_ms: 40 } });
        const ctl = new AbortController();
        const r = await fetch(`${env.api}/chat/completions`, {
            method: 'POST', headers: { 'content-type': 'application/json' },
            body: JSON.stringify(chat({ stream: true })), signal: ctl.signal,
        });
        const id = rid(r);
        const reader = r.body.getReader();
        let got = '';
        while (!got.includes('mock')) got += new TextDecoder().decode((await reader.read()).value);
        ctl.abort();
        let e = null;
        for (let i = 0; i < 100 && !e; i++) {
            const rows = query(`SELECT * FROM usage_events WHERE request_id = '${id}'`);
            if (rows.length) e = rows[0];
            else await sleep(50);
        }
        await resetMock();
        assert.ok(e, 'the cancelled request has its event');
        assert.equal(e.status, 'cancelled');
        assert.equal(e.cancelled, 1);
        assert.equal(e.stream, 1);
        assert.equal(e.output_estimated, 1);
        assert.ok(e.output_tokens >= 1 && e.output_tokens < 50, `the output so far: ${e.output_tokens}`);
    });

    test('embeddings, completions, messages and responses have events too; a provider without a price table uses cost_per_1k_tokens', async () => {
        const em = await postJson(`${env.api}/embeddings`, { model: 'embed', input: 'one two three' });
        assert.equal(em.status, 200, em.text);
        const ee = await eventOf(rid(em));
        assert.equal(ee.endpoint, 'embeddings');
        assert.equal(ee.actual_model, 'up-embed');
        assert.equal(ee.price_version, 'cfg-' + ee.price_version.slice(4), 'the provider-wide "*" price');
        assert.equal(ee.cost_micros, Math.ceil((ee.input_tokens * 3000000) / 1e6));
        const co = await postJson(`${env.api}/completions`, { model: 'failover', prompt: 'say hi' });
        assert.equal(co.status, 200, co.text);
        const ec = await eventOf(rid(co));
        assert.equal(ec.endpoint, 'completions');
        // the Anthropic and Responses front ends run as chat; their events name the surface
        const ms = await postJson(`${env.api}/messages`, { model: 'chat', max_tokens: 20, messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(ms.status, 200, ms.text);
        assert.equal((await eventOf(rid(ms))).endpoint, 'messages');
        const rs = await postJson(`${env.api}/responses`, { model: 'chat', input: 'hi' });
        assert.equal(rs.status, 200, rs.text);
        assert.equal((await eventOf(rid(rs))).endpoint, 'responses');
        // failover's first route is on mock-openai (priced "*"), both answer: the first serves
        assert.equal(ec.provider_id, 'mock-openai');
        await script({ model: 'up-fail-1', times: 10, action: { status: 503 } });
        const fo = await postJson(`${env.api}/chat/completions`, { model: 'failover', messages: [{ role: 'user', content: 'x' }] });
        await resetMock();
        assert.equal(fo.status, 200, fo.text);
        const ef = await eventOf(rid(fo));
        assert.equal(ef.provider_id, 'mock-openai-b');
        assert.ok(ef.attempts >= 2, 'the failed attempt counted');
        assert.equal(ef.price_version, 'cost_per_1k');
        assert.equal(ef.cost_micros, (ef.input_tokens + ef.output_tokens) * 2 * 1000);
    });

    test('a request refused before routing has no event', async () => {
        await journalDrained(env.gw);
        const before = query('SELECT COUNT(*) AS n FROM usage_events')[0].n;
        const r = await postJson(`${env.api}/chat/completions`, { model: 'no-such-model', messages: [] });
        assert.ok(r.status >= 400 && r.status < 500);
        const bad = await postJson(`${env.api}/chat/completions`, '{not json');
        assert.equal(bad.status, 400);
        await journalDrained(env.gw);
        assert.equal(query('SELECT COUNT(*) AS n FROM usage_events')[0].n, before);
    });
});

describe('roll-ups', () => {
    test('hourly buckets, provider buckets and daily stats equal the sums of the raw events', async () => {
        await rolledUp();
        const ev = query(`SELECT COUNT(*) AS requests, SUM(input_tokens) AS input, SUM(output_tokens) AS output,
            SUM(cached_read_tokens) AS cached, SUM(cache_write_tokens) AS write, SUM(cost_micros) AS cost,
            SUM(status IN ('failed','timed_out')) AS errors, SUM(latency_ms) AS latency FROM usage_events`)[0];
        const h = query(`SELECT SUM(requests) AS requests, SUM(input_tokens) AS input, SUM(output_tokens) AS output,
            SUM(cached_read_tokens) AS cached, SUM(cache_write_tokens) AS write, SUM(cost_micros) AS cost,
            SUM(errors) AS errors, SUM(latency_ms_sum) AS latency FROM usage_hourly`)[0];
        assert.ok(ev.requests >= 10);
        assert.deepEqual(h, ev, 'usage_hourly');
        const hist = query("SELECT kind, SUM(n) AS n FROM usage_hist GROUP BY kind ORDER BY kind");
        assert.equal(hist.find((r) => r.kind === 'latency').n, ev.requests, 'one latency sample per event');
        const withTtft = query('SELECT COUNT(*) AS n FROM usage_events WHERE ttft_ms IS NOT NULL')[0].n;
        assert.equal(hist.find((r) => r.kind === 'ttft').n, withTtft);
        const pe = query(`SELECT provider_id, COALESCE(actual_model,'unknown') AS model, COUNT(*) AS requests,
            SUM(cost_micros) AS cost, SUM(output_tokens) AS output,
            SUM(input_tokens + cached_read_tokens + cache_write_tokens) AS prompt
            FROM usage_events WHERE provider_id IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2`);
        const pb = query(`SELECT provider_id, model, SUM(request_count) AS requests, SUM(cost_micros) AS cost,
            SUM(completion_tokens) AS output, SUM(prompt_tokens) AS prompt
            FROM provider_usage_logs GROUP BY 1, 2 ORDER BY 1, 2`);
        assert.deepEqual(pb, pe, 'provider_usage_logs per provider and model');
        const de = query(`SELECT date(at_ms / 1000, 'unixepoch') AS date, pool, COUNT(*) AS requests, SUM(cost_micros) AS cost
            FROM usage_events WHERE pool IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2`);
        const ds = query('SELECT date, pool, total_requests AS requests, total_cost_micros AS cost FROM daily_stats ORDER BY 1, 2');
        assert.deepEqual(ds, de, 'daily_stats per pool');
    });

    test('a replayed write of the same event never doubles it or its buckets', async () => {
        await rolledUp();
        const one = query('SELECT request_id FROM usage_events ORDER BY seq LIMIT 1')[0].request_id;
        const before = query('SELECT SUM(requests) AS n FROM usage_hourly')[0].n;
        query(`INSERT OR IGNORE INTO usage_events(request_id, at_ms, endpoint, status) VALUES ('${one}', 0, 'chat', 'succeeded')`);
        assert.equal(query(`SELECT COUNT(*) AS n FROM usage_events WHERE request_id = '${one}'`)[0].n, 1);
        assert.equal(query('SELECT SUM(requests) AS n FROM usage_hourly')[0].n, before);
    });
});

describe('retention', () => {
    test('events older than usage.retention_days are pruned in small batches; the buckets stay', async () => {
        await rolledUp();
        const old = Date.now() - 3 * 86400000;
        /* events are written in the order their calls end, so the old ones come first in seq
           (the pruner walks the oldest by seq, obs/usage.c): written before the others */
        const first = query('SELECT COALESCE(MIN(seq), 1) AS s FROM usage_events')[0].s;
        const values = Array.from({ length: 5 }, (_, i) => `(${first - 5 + i}, 'old-${i}', ${old + i}, 'chat', 'succeeded', 10, 1)`).join(',');
        query(`INSERT INTO usage_events(seq, request_id, at_ms, endpoint, status, input_tokens, key_id) VALUES ${values}`);
        /* the pruner keeps the newest event (seq must grow past the roll-ups' watermark): a
           recent one after the old ones */
        query(`INSERT INTO usage_events(request_id, at_ms, endpoint, status) VALUES ('recent-after-old', ${Date.now()}, 'chat', 'succeeded')`);
        const oldHour = Math.floor(old / 3600000) * 3600;
        /* the writer sums events into their buckets in C (obs/usage_rollup.h); rows written
           behind its back get the bucket it would have written */
        query(`INSERT INTO usage_hourly(hour, tenant_id, project_id, key_id, provider_id, model, requests, input_tokens)
            VALUES (${oldHour}, 0, 0, 1, '', '', 5, 50)`);
        const buckets = query('SELECT SUM(requests) AS n FROM usage_hourly')[0].n;
        assert.equal(query(`SELECT SUM(requests) AS n FROM usage_hourly WHERE hour = ${oldHour}`)[0].n, 5, 'rolled up');
        const fresh = query(`SELECT COUNT(*) AS n FROM usage_events WHERE at_ms >= ${Date.now() - 86400000}`)[0].n;
        let left = 5;
        for (let i = 0; i < 100 && left > 0; i++) {
            await sleep(100);
            left = query("SELECT COUNT(*) AS n FROM usage_events WHERE request_id LIKE 'old-%'")[0].n;
        }
        assert.equal(left, 0, 'the old events are gone (2 a second)');
        assert.equal(query(`SELECT COUNT(*) AS n FROM usage_events WHERE at_ms >= ${Date.now() - 86400000}`)[0].n, fresh, 'the recent ones stay');
        assert.equal(query('SELECT SUM(requests) AS n FROM usage_hourly')[0].n, buckets, 'the roll-ups keep them');
    });
});
