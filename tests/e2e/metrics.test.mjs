// The metrics listener under traffic: the scrape passes `promtool check metrics` (Debian's
// prometheus package), taken while streams are in flight and again after the traffic, and the
// Sidecar ADR, edge PRD and OpenTelemetry GenAI families carry the values the traffic made.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { startEnv, postJson, postStream, waitFor, withTimeout } from './lib/harness.mjs';

let env;

before(async () => {
    env = await startEnv({
        applications: { shop: { max_running_tasks: 8 } },
        scheduler: { max_queued_tasks: 77 },
        configure(c) {
            c.providers.find((p) => p.id === 'mock-openai-b').rpm_limit = 100;
            c.providers.find((p) => p.id === 'mock-openai').cost_per_1k_tokens = 2;
            return c;
        },
    });
});

after(async () => {
    await env?.close();
});

/** promtool check metrics on text: { code, output }. */
function promtool(text) {
    return withTimeout(new Promise((resolve, reject) => {
        const p = spawn('promtool', ['check', 'metrics'], { stdio: ['pipe', 'pipe', 'pipe'] });
        let output = '';
        p.stdout.on('data', (d) => (output += d));
        p.stderr.on('data', (d) => (output += d));
        p.on('error', reject);
        p.on('close', (code) => resolve({ code, output }));
        p.stdin.end(text);
    }), 10000, 'promtool');
}

/** The value of the sample `name{labels}` (labels in the rendered order), or undefined. */
function sample(text, series) {
    for (const line of text.split('\n')) {
        if (!line.startsWith(series + ' ')) continue;
        const v = line.slice(series.length + 1);
        return v === '+Inf' ? Infinity : Number(v);
    }
    return undefined;
}

const chat = (content, extra = {}) => ({ model: 'chat', messages: [{ role: 'user', content }], ...extra });
const shop = { metadata: { application: 'shop' } };

describe('metrics', () => {
    test('a scrape under load and one after it pass promtool, with the values the traffic made', async () => {
        const api = env.api;
        // streams slow enough to be in flight while the first scrape is taken
        await env.mock.script({ model: 'up-chat', times: 3, action: { chunk_delay_ms: 150, chunks: 6 } });
        const slow = [1, 2, 3].map(() => postStream(`${api}/chat/completions`, chat('slow', { stream: true, ...shop })));
        const during = await waitFor(async () => {
            const t = await env.gw.metrics();
            return sample(t, 'moongate_active_tasks{application="shop",model="chat"}') === 3 ? t : null;
        }, { timeoutMs: 5000, what: 'three active tasks' });
        const checkDuring = await promtool(during);
        assert.equal(checkDuring.code, 0, checkDuring.output);
        assert.equal(checkDuring.output.trim(), '', 'no lint findings');
        for (const r of await Promise.all(slow)) assert.equal(r.status, 200);

        // then: two plain answers, one stream, one 429 that the route retries on, one unknown model
        for (let i = 0; i < 2; i++) assert.equal((await postJson(`${api}/chat/completions`, chat('hi', shop))).status, 200);
        assert.equal((await postStream(`${api}/chat/completions`, chat('s', { stream: true }))).status, 200);
        await env.mock.script({ model: 'up-fail-1', times: 1, action: { status: 429, headers: { 'retry-after': '1' } } });
        assert.equal((await postJson(`${api}/chat/completions`, { ...chat('f'), model: 'failover' })).status, 200);
        assert.equal((await postJson(`${api}/chat/completions`, { ...chat('x'), model: 'no-such-model' })).status, 404);

        const text = await env.gw.metrics();
        const check = await promtool(text);
        assert.equal(check.code, 0, check.output);
        assert.equal(check.output.trim(), '', 'no lint findings');

        // every family has HELP and TYPE
        const helps = new Set(), types = new Set(), families = new Set();
        for (const line of text.split('\n')) {
            let m = /^# HELP (\S+) /.exec(line);
            if (m) helps.add(m[1]);
            m = /^# TYPE (\S+) /.exec(line);
            if (m) types.add(m[1]);
            m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/.exec(line);
            if (m && !line.startsWith('#')) families.add(m[1].replace(/_(bucket|sum|count)$/, ''));
        }
        for (const f of families) {
            assert.ok(types.has(f) || types.has(f + '_bucket'), `TYPE for ${f}`);
            assert.ok(helps.has(f), `HELP for ${f}`);
        }

        // the edge PRD's families, labelled
        assert.equal(sample(text, 'moongate_requests_total{application="shop",model="chat",priority="P2",status="200"}'), 5);
        assert.equal(sample(text, 'moongate_requests_total{application="_none",model="chat",priority="P2",status="200"}'), 1);
        assert.equal(sample(text, 'moongate_requests_total{application="_none",model="failover",priority="P2",status="200"}'), 1);
        assert.equal(sample(text, 'moongate_requests_total{application="_none",model="_none",priority="P2",status="404"}'), 1);
        assert.equal(sample(text, 'moongate_request_duration_seconds_count{application="shop",model="chat"}'), 5);
        assert.equal(sample(text, 'moongate_first_token_latency_seconds_count{application="shop",model="chat"}'), 3);
        assert.equal(sample(text, 'moongate_queue_time_seconds_count{application="shop",model="chat"}'), 5);
        const tokensIn = sample(text, 'moongate_tokens_total{application="shop",model="chat",direction="input"}');
        const tokensOut = sample(text, 'moongate_tokens_total{application="shop",model="chat",direction="output"}');
        assert.ok(tokensIn > 0 && tokensOut > 0);
        // the spend: tokens at mock-openai's 2 per 1,000
        assert.ok(Math.abs(sample(text, 'moongate_cost_total{application="shop",model="chat"}') - (tokensIn + tokensOut) * 0.002) < 1e-9);
        // the cooldown the 429 started
        assert.equal(sample(text, 'sidecar_cooldown_events_total{provider_id="mock-openai"}'), 1);
        assert.ok(sample(text, 'moongate_tokens_per_second{model="chat"}') > 0);
        assert.equal(sample(text, 'moongate_active_tasks{application="shop",model="chat"}'), undefined, 'none active now');
        assert.equal(sample(text, 'moongate_queue_capacity'), 77);

        // the Sidecar ADR's names: the status code itself, the latency histograms, the store
        assert.equal(sample(text, 'sidecar_provider_requests_total{provider_id="mock-openai",pool="main",status_code="429"}'), 1);
        assert.equal(sample(text, 'sidecar_provider_requests_total{provider_id="mock-openai-b",pool="main",status_code="200"}'), 1);
        assert.equal(sample(text, 'sidecar_provider_requests_total{provider_id="mock-openai",pool="main",status_code="200"}'), 6);
        assert.equal(sample(text, 'sidecar_provider_latency_seconds_count{provider_id="mock-openai"}'), 7);
        assert.equal(sample(text, 'sidecar_latency_seconds_count'), 8);
        assert.equal(sample(text, 'sidecar_queue_depth'), 0);
        assert.equal(sample(text, 'sidecar_token_bucket_available{provider_id="mock-openai"}'), Infinity);
        assert.equal(sample(text, 'sidecar_token_bucket_available{provider_id="mock-openai-b"}'), 99);
        assert.equal(sample(text, 'moongate_provider_rpm_limit{provider_id="mock-openai-b"}'), 100);
        assert.equal(sample(text, 'sidecar_provider_rpm_current{provider_id="mock-openai-b"}'), 1);
        assert.equal(sample(text, 'sidecar_db_integrity_ok'), 1);
        assert.ok(sample(text, 'sidecar_db_size_bytes') > 0);
        assert.ok(sample(text, 'sidecar_db_wal_size_bytes') >= 0);
        assert.ok(sample(text, 'sidecar_requests_total') >= 8);

        // the OpenTelemetry GenAI histograms with the spec's bounds
        const g = 'gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="chat",gen_ai_response_model="up-chat"';
        assert.equal(sample(text, `gen_ai_server_request_duration_seconds_count{${g}}`), 6);
        assert.equal(sample(text, `gen_ai_server_time_to_first_token_seconds_count{${g}}`), 4);
        assert.ok(sample(text, `gen_ai_server_time_to_first_token_seconds_bucket{${g},le="0.001"}`) >= 0);
        assert.equal(sample(text, `gen_ai_server_time_to_first_token_seconds_bucket{${g},le="10"}`), 4);
        assert.equal(sample(text, `gen_ai_server_time_per_output_token_seconds_count{${g}}`), 4);
        assert.ok(sample(text, `gen_ai_server_time_per_output_token_seconds_bucket{${g},le="2.5"}`) === 4);
        assert.equal(sample(text, `gen_ai_client_token_usage_count{${g},gen_ai_token_type="input"}`), 6);
        assert.equal(sample(text, `gen_ai_client_token_usage_bucket{${g},gen_ai_token_type="input",le="67108864"}`), 6);
    });
});
