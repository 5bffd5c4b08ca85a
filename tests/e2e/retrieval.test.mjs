// Retrieval snippets (issue 21, the edge PRD's assembly step 6 and trimming steps 1 and 5): a
// chat request's `retrieval` list is placed before the current request as one system message
// (the snippets' text only, nothing of the gateway's), counted in the budget, and trimmed by
// policies/context.lua: repeats and low-relevance snippets first (drop_snippets), the rest
// lowest score first after the history (shrink_retrieval). Driven through the openai SDK; the
// mock engine reports what it received, counted here with tiktoken's o200k_base.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import OpenAI from 'openai';
import { REPO_ROOT, postJson, startEnv } from './lib/harness.mjs';

const require = createRequire(path.join(REPO_ROOT, 'tests', 'package.json'));
const { get_encoding } = require('tiktoken');
const o200k = get_encoding('o200k_base');

const WINDOW = 300;
const MAX_TOKENS = 40;
const BUDGET = WINDOW - MAX_TOKENS;

let env, client;

before(async () => {
    env = await startEnv({
        configure: (c) => ({
            ...c,
            context: { safety_margin_ratio: 0, enable_prompt_persistence: false },
            models: {
                ...c.models,
                rag: {
                    tokenizer: 'o200k_base', context_window: WINDOW, max_output_tokens: MAX_TOKENS,
                    routes: [{ provider: 'mock-openai', model: 'up-rag' }],
                },
                open: { tokenizer: 'o200k_base', routes: [{ provider: 'mock-openai', model: 'up-open' }] },
            },
        }),
    });
    client = new OpenAI({ baseURL: env.api, apiKey: 'unused', maxRetries: 0, timeout: 10000 });
});

after(async () => {
    await env?.close();
});

const tok = (s) => (typeof s === 'string' && s ? o200k.encode(s).length : 0);

/** The chat rule of core/token/chat.h, over a message list. */
function countMessages(msgs) {
    let n = 3;
    for (const m of msgs) n += 3 + tok(m.role) + tok(m.content);
    return n;
}

async function lastUpstream(model) {
    return (await env.mock.requests((r) => r.body?.model === model)).at(-1)?.body;
}

const words = (tag, n) => Array.from({ length: n }, (_, i) => `${tag}${i}`).join(' ');

describe('retrieval snippets', () => {
    test('within the budget: one system message before the question, the snippets\' text only', async () => {
        const r = await client.chat.completions.create({
            model: 'rag',
            messages: [{ role: 'system', content: 'Answer from the documents.' }, { role: 'user', content: 'What is the refund window?' }],
            retrieval: ['Refunds are accepted for 30 days.', { text: 'Store credit after 30 days.', score: 0.9, source: 'kb/7', id: 'd7' }],
        });
        const sent = await lastUpstream('up-rag');
        assert.deepEqual(sent.messages, [
            { role: 'system', content: 'Answer from the documents.' },
            { role: 'system', content: 'Refunds are accepted for 30 days.\n\nStore credit after 30 days.' },
            { role: 'user', content: 'What is the refund window?' },
        ]);
        assert.equal(sent.retrieval, undefined, 'the extension never goes upstream');
        assert.deepEqual(r.context.trimmed, []);
        assert.equal(r.context.input_tokens, countMessages(sent.messages));
    });

    test('a model without a window still gets the snippets, untrimmed', async () => {
        await client.chat.completions.create({
            model: 'open', retrieval: ['a', 'a'],
            messages: [{ role: 'user', content: 'q1' }, { role: 'assistant', content: 'a1' }, { role: 'user', content: 'q2' }],
        });
        const sent = await lastUpstream('up-open');
        assert.deepEqual(sent.messages.map((m) => m.content), ['q1', 'a1', 'a\n\na', 'q2']);
    });

    test('over the budget: repeats and low-relevance snippets go first, the history stays', async () => {
        const history = [{ role: 'user', content: words('h', 20) }, { role: 'assistant', content: words('g', 20) }];
        const retrieval = [
            { text: words('keep', 30), score: 0.9 },
            { text: ` ${words('keep', 30)}  `, score: 0.8 }, // the same text: a repeat
            { text: words('low', 60), score: 0.2 }, // low relevance
            { text: words('other', 30), score: 0.7, id: 'x' },
            { text: words('again', 10), score: 0.9, id: 'x' }, // the same id: a repeat
        ];
        const messages = [...history, { role: 'user', content: 'the question' }];
        const r = await client.chat.completions.create({ model: 'rag', messages, retrieval });
        const sent = await lastUpstream('up-rag');
        assert.deepEqual(r.context.trimmed, ['drop_snippets']);
        assert.deepEqual(sent.messages, [...history,
            { role: 'system', content: `${words('keep', 30)}\n\n${words('other', 30)}` },
            { role: 'user', content: 'the question' }]);
        assert.equal(r.context.input_tokens, countMessages(sent.messages));
        assert.ok(r.context.input_tokens <= BUDGET);
    });

    test('far over: the history goes, then snippets lowest score first; the question stays', async () => {
        const history = [{ role: 'user', content: words('h', 60) }, { role: 'assistant', content: words('g', 60) }];
        const retrieval = [
            { text: words('best', 45), score: 0.95 },
            { text: words('fine', 45), score: 0.6 },
            { text: words('good', 45), score: 0.8 },
        ];
        const r = await client.chat.completions.create({ model: 'rag', messages: [...history, { role: 'user', content: 'q' }], retrieval });
        const sent = await lastUpstream('up-rag');
        assert.deepEqual(r.context.trimmed, ['drop_oldest_turns', 'shrink_retrieval']);
        assert.deepEqual(sent.messages, [{ role: 'system', content: `${words('best', 45)}\n\n${words('good', 45)}` },
            { role: 'user', content: 'q' }]);
        assert.ok(countMessages(sent.messages) <= BUDGET);
        assert.match(await env.gw.metrics(), /moongate_context_trimming_total\{step="shrink_retrieval"\} [1-9]/);
    });

    test('on a session the snippets are sent with the turn but never stored in its history', async () => {
        const created = await postJson(`${env.api}/sessions`, {});
        assert.equal(created.status, 201, created.text);
        const id = created.json.id;
        await client.chat.completions.create({ model: 'rag', session_id: id, retrieval: ['fact one'],
            messages: [{ role: 'user', content: 'first' }] });
        await client.chat.completions.create({ model: 'rag', session_id: id, retrieval: ['fact two'],
            messages: [{ role: 'user', content: 'second' }] });
        const sent = await lastUpstream('up-rag');
        assert.deepEqual(sent.messages.map((m) => m.content).filter((c) => c.startsWith('fact')), ['fact two']);
        assert.equal(sent.messages.at(-1).content, 'second');
        assert.equal(sent.messages.at(-2).content, 'fact two', 'the snippets sit before the current request');
        const stored = await (await fetch(`${env.api}/sessions/${id}/messages?limit=100`)).json();
        assert.deepEqual(stored.data.map((d) => d.message.role), ['user', 'assistant', 'user', 'assistant']);
        assert.ok(!JSON.stringify(stored).includes('fact'));
    });

    test('a malformed retrieval list is a 400 naming it', async () => {
        for (const retrieval of [{ text: 'x' }, [3], [{ score: 1 }], [{ text: 'x', score: 'high' }], ['']]) {
            await assert.rejects(
                client.chat.completions.create({ model: 'rag', messages: [{ role: 'user', content: 'q' }], retrieval }),
                (e) => e.status === 400 && /snippet|retrieval/.test(e.message),
            );
        }
    });
});
