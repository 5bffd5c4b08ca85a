// The tokenizer in the request path (issue 19): a prompt is counted with the model's encoding
// where a decision takes the count (a provider's TPM reservation), and where the upstream
// reports no usage the prompt's tokens are the count, not a byte estimate. The expected
// numbers come from the npm tiktoken package over the exact bytes sent.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import { REPO_ROOT, TEST_KEY_ENV, startEnv, postJson, postStream } from './lib/harness.mjs';

const require = createRequire(path.join(REPO_ROOT, 'tests', 'package.json'));
const { get_encoding } = require('tiktoken');
const o200k = get_encoding('o200k_base');

const TPM = 400;
const MAX_TOKENS = 10;

let env;

before(async () => {
    env = await startEnv({
        configure: (c) => {
            const m = c.providers[0].base_url;
            return {
                ...c,
                providers: [
                    ...c.providers,
                    { id: 'tpm-small', adapter: 'openai', base_url: m, api_key: `\${${TEST_KEY_ENV}}`, tpm_limit: TPM },
                    { id: 'no-usage', adapter: 'openai', base_url: m, api_key: `\${${TEST_KEY_ENV}}`, stream_usage: false },
                ],
                models: {
                    ...c.models,
                    // gpt-4o family: counted with o200k_base
                    counted: { routes: [{ provider: 'tpm-small', model: 'gpt-4o-mini' }] },
                    // the same provider, estimated from the bytes
                    estimated: { tokenizer: 'estimate', routes: [{ provider: 'tpm-small', model: 'gpt-4o-mini' }] },
                    unreported: { routes: [{ provider: 'no-usage', model: 'gpt-4o-mini' }] },
                },
                routing: { queue_timeout_ms: 300 },
            };
        },
    });
});

after(async () => {
    await env?.close();
});

// Text dense in tokens: about one token for every byte and a half, where bytes/4 guesses a
// quarter of that.
const dense = Array.from({ length: 180 }, (_, i) => `${(i * 7919) % 1000}é!`).join('');

describe('a TPM reservation takes the counted prompt', () => {
    const body = (model) => ({ model, max_tokens: MAX_TOKENS, messages: [{ role: 'user', content: dense }] });

    test('the preconditions: the count is over the limit, the byte estimate under it', () => {
        const bytes = Buffer.byteLength(JSON.stringify(body('counted')));
        const counted = o200k.encode_ordinary(JSON.stringify(body('counted'))).length;
        assert.ok(bytes / 4 + MAX_TOKENS < TPM, `bytes/4 ${bytes / 4}`);
        assert.ok(counted + MAX_TOKENS > TPM, `counted ${counted}`);
    });

    test('estimated from the bytes, it fits and is served', async () => {
        const r = await postJson(`${env.api}/chat/completions`, body('estimated'));
        assert.equal(r.status, 200, r.text);
    });

    test('counted, it can never fit the provider: refused, not sent', async () => {
        const r = await postJson(`${env.api}/chat/completions`, body('counted'));
        assert.notEqual(r.status, 200, r.text);
        assert.ok(r.status === 429 || r.status === 503, `${r.status} ${r.text}`);
    });
});

describe('without upstream usage the prompt is counted, not guessed', () => {
    test('a stream from a provider that reports no usage: prompt_tokens is the exact count', async () => {
        const payload = { model: 'unreported', stream: true, stream_options: { include_usage: true },
            messages: [{ role: 'user', content: 'Count me exactly: naïve café, 東京, 🙂 and 12345.' }] };
        const exact = o200k.encode_ordinary(JSON.stringify(payload)).length;
        const r = await postStream(`${env.api}/chat/completions`, payload);
        assert.equal(r.status, 200, r.text);
        const rid = r.headers.get('x-request-id');
        const log = await env.gw.requestLog(rid);
        assert.equal(log.prompt_tokens, exact, 'the logged prompt tokens are the count');
        const usage = r.events.find((e) => e !== '[DONE]' && e.usage)?.usage;
        assert.equal(usage?.prompt_tokens, exact, 'the usage the client sees is the count');
    });
});
