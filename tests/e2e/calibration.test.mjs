// The calibrated estimate (issue 19): a model without a known tokenizer estimates its prompts
// from the body's bytes at the bytes per token learned for the route from the upstream's
// reported prompt_tokens (an EWMA, token/calib.h), kept in the store and reloaded at start.
// The mock engine reports a chat prompt's tokens as its words, so a body of short words has a
// known ratio, far from the old bytes / 4. Visible on /metrics:
// moongate_token_estimate_bytes_per_token and moongate_token_estimate_error_ratio.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { TEST_KEY_ENV, startEnv, startGateway, postJson, postStream } from './lib/harness.mjs';

let env;

before(async () => {
    env = await startEnv({
        configure: (c) => {
            const m = c.providers[0].base_url;
            return {
                ...c,
                health: { probes: false },
                providers: [
                    ...c.providers,
                    // JSON answers carry usage (learned from); streams carry none (estimated)
                    { id: 'cal', adapter: 'openai', base_url: m, api_key: `\${${TEST_KEY_ENV}}`, stream_usage: false },
                ],
                models: {
                    ...c.models,
                    calibrated: { tokenizer: 'estimate', routes: [{ provider: 'cal', model: 'wordy-1' }] },
                },
            };
        },
    });
});

after(async () => {
    await env?.close();
});

const words = (n) => Array.from({ length: n }, (_, i) => String.fromCharCode(97 + (i % 26))).join(' ');
const body = (n, extra = {}) => ({ model: 'calibrated', messages: [{ role: 'user', content: words(n) }], ...extra });
const ratio = (b) => Buffer.byteLength(JSON.stringify(b)) / b.messages[0].content.split(' ').length;

function metric(text, name, labels) {
    const re = new RegExp(`^${name}\\{${labels.replace(/[{}"]/g, (ch) => `\\${ch}`)}\\} (\\S+)$`, 'm');
    const m = re.exec(text);
    return m ? Number(m[1]) : undefined;
}

const LABELS = 'provider="cal",model="wordy-1"';

describe('bytes per token learned per route', () => {
    test('before any answer the route reads the default: no series yet', async () => {
        const t = await env.gw.metrics();
        assert.match(t, /# TYPE moongate_token_estimate_error_ratio histogram/);
        assert.match(t, /# TYPE moongate_token_estimate_bytes_per_token gauge/);
        assert.equal(metric(t, 'moongate_token_estimate_bytes_per_token', LABELS), undefined);
    });

    test('answers with reported usage: the learned value converges on the route\'s ratio, the error shrinks', async () => {
        const sizes = [200, 240, 180, 220, 260, 210, 190, 230, 250, 200, 215, 205, 225, 195, 235];
        for (const n of sizes) {
            const r = await postJson(`${env.api}/chat/completions`, body(n));
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json.usage.prompt_tokens, n, 'the mock reports the words');
        }
        const truth = sizes.map((n) => ratio(body(n))).reduce((a, b) => a + b) / sizes.length;
        assert.ok(truth > 2 && truth < 3, `the route's true ratio ${truth} (bytes / 4 is far off)`);
        const t = await env.gw.metrics();
        const bpt = metric(t, 'moongate_token_estimate_bytes_per_token', LABELS);
        assert.ok(bpt !== undefined, 'the learned value is exported');
        assert.ok(Math.abs(bpt - truth) / truth < 0.05, `learned ${bpt}, true ${truth}`);
        const count = metric(t, 'moongate_token_estimate_error_ratio_count', LABELS);
        assert.equal(count, sizes.length, 'one error observation per answer');
        const within = metric(t, 'moongate_token_estimate_error_ratio_bucket', `${LABELS},le="0.1"`)
            - metric(t, 'moongate_token_estimate_error_ratio_bucket', `${LABELS},le="-0.1"`);
        assert.ok(within >= sizes.length - 2, `${within} of ${sizes.length} estimates within 10 %`);
        const far = metric(t, 'moongate_token_estimate_error_ratio_bucket', `${LABELS},le="-0.25"`);
        assert.equal(far, 1, 'only the first estimate (bytes / 4) was off by more than 25 %');
    });

    test('an answer without usage is estimated at the learned value, not bytes / 4', async () => {
        const b = body(300, { stream: true, stream_options: { include_usage: true } });
        const r = await postStream(`${env.api}/chat/completions`, b);
        assert.equal(r.status, 200, r.text);
        const log = await env.gw.requestLog(r.headers.get('x-request-id'));
        const bytes = Buffer.byteLength(JSON.stringify(b));
        assert.ok(Math.abs(log.prompt_tokens - 300) / 300 < 0.1,
            `estimated ${log.prompt_tokens} for 300 words (bytes / 4 would say ${Math.floor(bytes / 4)})`);
        const usage = r.events.find((e) => e !== '[DONE]' && e.usage)?.usage;
        assert.equal(usage?.prompt_tokens, log.prompt_tokens, 'the client sees the same estimate');
    });

    test('kept in the store and reloaded at start-up', async () => {
        const before = metric(await env.gw.metrics(), 'moongate_token_estimate_bytes_per_token', LABELS);
        await env.gw.close();
        env.gw = await startGateway(env.configPath);
        env.api = `${env.gw.base}/v1`;
        const after = metric(await env.gw.metrics(), 'moongate_token_estimate_bytes_per_token', LABELS);
        assert.ok(after !== undefined, 'the value is there before any new answer');
        assert.ok(Math.abs(after - before) < 1e-3, `reloaded ${after}, was ${before}`);
        const b = body(300, { stream: true, stream_options: { include_usage: true } });
        const r = await postStream(`${env.api}/chat/completions`, b);
        const log = await env.gw.requestLog(r.headers.get('x-request-id'));
        assert.ok(Math.abs(log.prompt_tokens - 300) / 300 < 0.1, `after the restart: ${log.prompt_tokens}`);
    });
});
