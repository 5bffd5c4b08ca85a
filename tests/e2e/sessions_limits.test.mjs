// Session settings the other session tests leave out (issue 21): `context.append_on_failure:
// user_turn` keeps the user turn of a failed request, `ttl_seconds` ends a session that is
// still in use, and `context.max_session_messages` caps a session's own `max_messages`.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { postJson, startEnv } from './lib/harness.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let env;

before(async () => {
    env = await startEnv({
        configure: (c) => ({
            ...c,
            context: { enable_prompt_persistence: false, append_on_failure: 'user_turn', max_session_messages: 6 },
            models: { ...c.models, lim: { tokenizer: 'o200k_base', routes: [{ provider: 'mock-openai', model: 'up-lim' }] } },
        }),
    });
});

after(async () => {
    await env?.close();
});

async function newSession(body = {}) {
    const r = await postJson(`${env.api}/sessions`, body);
    assert.equal(r.status, 201, r.text);
    return r.json;
}

async function messagesOf(id) {
    const r = await fetch(`${env.api}/sessions/${id}/messages?limit=100`);
    assert.equal(r.status, 200);
    return (await r.json()).data.map((d) => d.message);
}

describe('session limits and failure modes', () => {
    test('append_on_failure user_turn: a failed request keeps its user turn alone', async () => {
        const { id } = await newSession();
        await env.mock.script({ model: 'up-lim', times: 4, action: { status: 500 } });
        const r = await postJson(`${env.api}/chat/completions`,
            { model: 'lim', messages: [{ role: 'user', content: 'fails' }], session_id: id });
        assert.ok(r.status >= 500, r.text);
        await env.mock.reset();
        assert.deepEqual((await messagesOf(id)).map((m) => [m.role, m.content]), [['user', 'fails']]);
    });

    test('ttl_seconds ends a session even while it is used', async () => {
        const { id } = await newSession({ ttl_seconds: 1 });
        for (let i = 0; i < 3; i++) {
            assert.equal((await fetch(`${env.api}/sessions/${id}`)).status, 200);
            await sleep(400);
        }
        await sleep(1000);
        assert.equal((await fetch(`${env.api}/sessions/${id}`)).status, 404);
    });

    test('context.max_session_messages caps a session\'s max_messages', async () => {
        const s = await newSession({ max_messages: 100 });
        const g = await (await fetch(`${env.api}/sessions/${s.id}`)).json();
        assert.equal(g.max_messages, 6, JSON.stringify(g));
    });
});
