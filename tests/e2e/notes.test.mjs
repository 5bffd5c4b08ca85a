// Identity and permission notes, output constraints (issue 21, the edge PRD's assembly steps 3
// and 8): a chat request's `identity_notes` become one system message right after the leading
// system messages, its `output_constraints` one system message after the current request.
// Both are protected from trimming, counted in the budget, never stored in a session and never
// sent upstream as fields. Driven through the openai SDK; the mock engine reports what it
// received, counted here with tiktoken's o200k_base.
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
            applications: {
                ...c.applications,
                helpdesk: {
                    identity_notes: 'Tenant acme, support tier.',
                    output_constraints: 'Never quote a card number.',
                },
            },
            models: {
                ...c.models,
                notes: {
                    tokenizer: 'o200k_base', context_window: WINDOW, max_output_tokens: MAX_TOKENS,
                    routes: [{ provider: 'mock-openai', model: 'up-notes' }],
                },
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

async function lastUpstream() {
    return (await env.mock.requests((r) => r.body?.model === 'up-notes')).at(-1)?.body;
}

const words = (tag, n) => Array.from({ length: n }, (_, i) => `${tag}${i}`).join(' ');

describe('identity notes and output constraints', () => {
    test('placed in the PRD\'s order, as plain system messages, counted exactly', async () => {
        const r = await client.chat.completions.create({
            model: 'notes',
            messages: [{ role: 'system', content: 'You are the help desk.' }, { role: 'user', content: 'Refund my order.' }],
            identity_notes: ['The caller is agent 7.', 'Read-only on billing.'],
            output_constraints: 'Answer in one sentence.',
            retrieval: ['Refunds take 30 days.'],
        });
        const sent = await lastUpstream();
        assert.deepEqual(sent.messages, [
            { role: 'system', content: 'You are the help desk.' },
            { role: 'system', content: 'The caller is agent 7.\n\nRead-only on billing.' },
            { role: 'system', content: 'Refunds take 30 days.' },
            { role: 'user', content: 'Refund my order.' },
            { role: 'system', content: 'Answer in one sentence.' },
        ]);
        assert.equal(sent.identity_notes, undefined, 'the extension never goes upstream');
        assert.equal(sent.output_constraints, undefined, 'the extension never goes upstream');
        assert.equal(r.context.input_tokens, countMessages(sent.messages));
    });

    test('over the budget: the history goes, the notes and constraints stay', async () => {
        const history = [{ role: 'user', content: words('h', 60) }, { role: 'assistant', content: words('g', 60) }];
        const identity = words('who', 40);
        const constraints = words('fmt', 40);
        const r = await client.chat.completions.create({
            model: 'notes', messages: [...history, { role: 'user', content: 'q' }],
            identity_notes: identity, output_constraints: [constraints],
        });
        const sent = await lastUpstream();
        assert.ok(r.context.trimmed.includes('drop_oldest_turns'), JSON.stringify(r.context));
        assert.deepEqual(sent.messages, [
            { role: 'system', content: identity },
            { role: 'user', content: 'q' },
            { role: 'system', content: constraints },
        ]);
        assert.equal(r.context.input_tokens, countMessages(sent.messages));
        assert.ok(r.context.input_tokens <= BUDGET);
    });

    test('protected: when they alone exceed the budget the answer is 400 CONTEXT_TOO_LARGE', async () => {
        await assert.rejects(
            client.chat.completions.create({
                model: 'notes', messages: [{ role: 'user', content: 'q' }],
                identity_notes: words('who', 200), output_constraints: words('fmt', 200),
            }),
            (e) => e.status === 400 && /CONTEXT_TOO_LARGE/.test(JSON.stringify(e.error ?? e.message)),
        );
    });

    test('on a session they are sent with the turn but never stored', async () => {
        const created = await postJson(`${env.api}/sessions`, {});
        assert.equal(created.status, 201, created.text);
        const id = created.json.id;
        await client.chat.completions.create({ model: 'notes', session_id: id, identity_notes: 'agent one',
            output_constraints: 'short', messages: [{ role: 'user', content: 'first' }] });
        await client.chat.completions.create({ model: 'notes', session_id: id, identity_notes: 'agent two',
            messages: [{ role: 'user', content: 'second' }] });
        const sent = await lastUpstream();
        const contents = sent.messages.map((m) => m.content);
        assert.equal(contents[0], 'agent two', 'the identity notes lead');
        assert.ok(!contents.includes('agent one') && !contents.includes('short'));
        assert.equal(contents.at(-1), 'second');
        const stored = await (await fetch(`${env.api}/sessions/${id}/messages?limit=100`)).json();
        assert.deepEqual(stored.data.map((d) => d.message.role), ['user', 'assistant', 'user', 'assistant']);
        assert.ok(!JSON.stringify(stored).includes('agent'));
    });

    test('a malformed note is a 400 naming the field', async () => {
        for (const [field, v] of [['identity_notes', 3], ['identity_notes', ['']], ['output_constraints', { a: 1 }],
            ['output_constraints', ['ok', 7]]]) {
            await assert.rejects(
                client.chat.completions.create({ model: 'notes', messages: [{ role: 'user', content: 'q' }], [field]: v }),
                (e) => e.status === 400 && e.message.includes(field),
            );
        }
    });

    test('an application\'s configured notes come first, then the request\'s', async () => {
        const r = await client.chat.completions.create({
            model: 'notes',
            messages: [{ role: 'user', content: 'Where is my parcel?' }],
            metadata: { application: 'helpdesk' },
            identity_notes: 'The caller is agent 9.',
        });
        const sent = await lastUpstream();
        assert.deepEqual(sent.messages, [
            { role: 'system', content: 'Tenant acme, support tier.\n\nThe caller is agent 9.' },
            { role: 'user', content: 'Where is my parcel?' },
            { role: 'system', content: 'Never quote a card number.' },
        ]);
        assert.equal(r.context.input_tokens, countMessages(sent.messages));
        // a plain body (no extension) of the application gets them too
        await client.chat.completions.create({
            model: 'notes',
            messages: [{ role: 'user', content: 'Hello' }],
            metadata: { application: 'helpdesk' },
        });
        assert.deepEqual((await lastUpstream()).messages, [
            { role: 'system', content: 'Tenant acme, support tier.' },
            { role: 'user', content: 'Hello' },
            { role: 'system', content: 'Never quote a card number.' },
        ]);
        // another application's (none configured) do not
        await client.chat.completions.create({ model: 'notes', messages: [{ role: 'user', content: 'Hi' }] });
        assert.deepEqual((await lastUpstream()).messages, [{ role: 'user', content: 'Hi' }]);
    });
});
