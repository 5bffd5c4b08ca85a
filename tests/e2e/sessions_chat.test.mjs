// Chat on a session (issue 21, items 2 and 3): a request with session_id is answered on the
// session's history and appends its turn (a whole streamed answer too, tool calls included);
// a failed request appends nothing; concurrent requests on one session are serialised (the
// second waits within its queue timeout, then 409 SESSION_BUSY).
// The budget: context_window - max_tokens (safety margin 0 here), counted by the chat rule
// with tiktoken's o200k_base over what the mock received; a conversation longer than the
// window stays answerable, its oldest turns dropped whole (a tool call with its result);
// what cannot fit is 400 CONTEXT_TOO_LARGE. Persistence off: sessions are memory only.
// A summary never blocks the session: while the summariser's answer is held by the mock, the
// next request is answered on the other trimming steps; the one after it carries the summary.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import OpenAI from 'openai';
import { REPO_ROOT, adminCall, startEnv, startGateway, postJson } from './lib/harness.mjs';

const require = createRequire(path.join(REPO_ROOT, 'tests', 'package.json'));
const { get_encoding } = require('tiktoken');
const o200k = get_encoding('o200k_base');

const WINDOW = 400;
const MAX_TOKENS = 40;
const BUDGET = WINDOW - MAX_TOKENS;
const ADMIN_TOKEN = 'adm-sessions-chat-e2e-token-7f3e';

let env, client;

before(async () => {
    env = await startEnv({
        configure: (c) => ({
            ...c,
            context: { safety_margin_ratio: 0, enable_prompt_persistence: false, summarizer_model: 'summ', switch_to_larger_window: true },
            models: {
                ...c.models,
                talk: { tokenizer: 'o200k_base', routes: [{ provider: 'mock-openai', model: 'up-talk' }] },
                summ: { tokenizer: 'o200k_base', routes: [{ provider: 'mock-openai', model: 'up-summ' }] },
                // a fallback route on a smaller engine: the budget is the window every route holds
                mixed: {
                    tokenizer: 'o200k_base', context_window: 4000, max_output_tokens: MAX_TOKENS,
                    routes: [{ provider: 'mock-openai', model: 'up-mixed' },
                        { provider: 'mock-openai-b', model: 'up-mixed-small', priority: 1, context_window: WINDOW }],
                },
                small: {
                    tokenizer: 'o200k_base', context_window: WINDOW, max_output_tokens: MAX_TOKENS,
                    routes: [{ provider: 'mock-openai', model: 'up-small' }],
                },
            },
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
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
    for (const m of msgs) {
        n += 3 + tok(m.role) + tok(m.name) + (m.name ? 1 : 0) + tok(m.reasoning_content) + tok(m.tool_call_id);
        if (Array.isArray(m.content)) for (const p of m.content) n += tok(p.text);
        else n += tok(m.content);
        for (const tc of m.tool_calls ?? []) n += tok(tc.function?.name) + tok(tc.function?.arguments) + 3;
    }
    return n;
}

async function newSession(body = {}) {
    const r = await postJson(`${env.api}/sessions`, body);
    assert.equal(r.status, 201, r.text);
    return r.json.id;
}

async function messagesOf(id) {
    const r = await fetch(`${env.api}/sessions/${id}/messages?limit=100`);
    assert.equal(r.status, 200);
    return (await r.json()).data.map((d) => d.message);
}

/** The body the mock received for the last request to upstream model `model`. */
async function lastUpstream(model) {
    const all = await env.mock.requests((r) => r.body?.model === model);
    return all.at(-1)?.body;
}

describe('a session replays its history', () => {
    test('each turn is sent with the ones before it and appended when it succeeded', async () => {
        const id = await newSession({ system: 'You are terse.' });
        const one = await client.chat.completions.create({
            model: 'talk', messages: [{ role: 'user', content: 'first question' }], session_id: id,
        });
        assert.equal(one.session_id, id);
        assert.ok(one.context && one.context.input_tokens > 0, JSON.stringify(one.context));
        const answer1 = one.choices[0].message.content;
        await client.chat.completions.create({
            model: 'talk', messages: [{ role: 'user', content: 'second question' }], session_id: id,
        });
        const sent = await lastUpstream('up-talk');
        assert.deepEqual(sent.messages.map((m) => [m.role, m.content]), [
            ['system', 'You are terse.'], ['user', 'first question'], ['assistant', answer1],
            ['user', 'second question'],
        ]);
        assert.equal(sent.session_id, undefined, 'the extension is not sent upstream');
        const kept = await messagesOf(id);
        assert.equal(kept.length, 4);
        assert.equal(kept[3].role, 'assistant');
        const s = await (await fetch(`${env.api}/sessions/${id}`)).json();
        assert.equal(s.message_count, 4);
        assert.equal(s.token_count, countMessages(kept) - 3);
    });

    test('a streamed answer is appended whole', async () => {
        const id = await newSession();
        const stream = await client.chat.completions.create({
            model: 'talk', stream: true, messages: [{ role: 'user', content: 'stream it' }], session_id: id,
        });
        let text = '';
        for await (const ch of stream) text += ch.choices[0]?.delta?.content ?? '';
        assert.ok(text.length > 0);
        const kept = await messagesOf(id);
        assert.deepEqual(kept.map((m) => m.role), ['user', 'assistant']);
        assert.equal(kept[1].content, text);
    });

    test('an answer with tool calls is kept with them; the client sends the result next', async () => {
        const id = await newSession();
        const toolCall = { id: 'call_1', type: 'function', function: { name: 'weather', arguments: '{"city":"Oslo"}' } };
        await env.mock.script({ model: 'up-talk', times: 1, action: { body: {
            id: 'x', object: 'chat.completion', created: 1, model: 'up-talk',
            choices: [{ index: 0, message: { role: 'assistant', content: null, tool_calls: [toolCall] }, finish_reason: 'tool_calls' }],
            usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 },
        } } });
        await client.chat.completions.create({ model: 'talk', messages: [{ role: 'user', content: 'weather in Oslo?' }], session_id: id });
        await client.chat.completions.create({
            model: 'talk', session_id: id, messages: [{ role: 'tool', tool_call_id: 'call_1', content: 'sunny' }],
        });
        const sent = await lastUpstream('up-talk');
        assert.deepEqual(sent.messages[1].tool_calls, [toolCall]);
        assert.equal(sent.messages[2].role, 'tool');
        const kept = await messagesOf(id);
        assert.deepEqual(kept.map((m) => m.role), ['user', 'assistant', 'tool', 'assistant']);
    });

    test('a failed request appends nothing; an unknown session is 404', async () => {
        const id = await newSession();
        await env.mock.script({ model: 'up-talk', times: 4, action: { status: 500 } });
        const r = await postJson(`${env.api}/chat/completions`,
            { model: 'talk', messages: [{ role: 'user', content: 'fails' }], session_id: id });
        assert.ok(r.status >= 500, r.text);
        assert.equal((await messagesOf(id)).length, 0);
        await env.mock.reset();
        const nf = await postJson(`${env.api}/chat/completions`,
            { model: 'talk', messages: [{ role: 'user', content: 'x' }], session_id: 'sess_000000000000000000000000' });
        assert.equal(nf.status, 404);
        assert.equal(nf.json.error.code, 'SESSION_NOT_FOUND');
    });

    test('a second request while one runs waits for it and is answered on its turn', async () => {
        const id = await newSession();
        await env.mock.script({ model: 'up-talk', times: 1, action: { delay_first_byte_ms: 600 } });
        const slow = postJson(`${env.api}/chat/completions`,
            { model: 'talk', messages: [{ role: 'user', content: 'slow' }], session_id: id });
        await env.mock.waitRequest((r) => r.body?.messages?.at(-1)?.content === 'slow');
        const next = await postJson(`${env.api}/chat/completions`,
            { model: 'talk', messages: [{ role: 'user', content: 'next' }], session_id: id });
        assert.equal(next.status, 200, next.text);
        assert.equal((await slow).status, 200);
        const sent = await lastUpstream('up-talk');
        assert.deepEqual(sent.messages.map((m) => m.content).filter((c) => c === 'slow' || c === 'next'), ['slow', 'next'],
            'the second ran after the first, on its history');
        assert.deepEqual((await messagesOf(id)).map((m) => m.role), ['user', 'assistant', 'user', 'assistant']);
    });

    test('a waiter past its queue timeout gets 409 SESSION_BUSY; the holder goes on', async () => {
        const id = await newSession();
        await env.mock.script({ model: 'up-talk', times: 1, action: { delay_first_byte_ms: 1500 } });
        const slow = postJson(`${env.api}/chat/completions`,
            { model: 'talk', messages: [{ role: 'user', content: 'slower' }], session_id: id });
        await env.mock.waitRequest((r) => r.body?.messages?.at(-1)?.content === 'slower');
        const busy = await postJson(`${env.api}/chat/completions`,
            { model: 'talk', messages: [{ role: 'user', content: 'impatient' }], session_id: id, timeouts: { queue_ms: 200 } });
        assert.equal(busy.status, 409, busy.text);
        assert.equal(busy.json.error.code, 'SESSION_BUSY');
        assert.equal((await slow).status, 200);
        assert.deepEqual((await messagesOf(id)).map((m) => m.content), ['slower', (await messagesOf(id))[1].content]);
    });

    test('persistence off: a restart forgets the sessions (memory only, by design)', async () => {
        const id = await newSession({ system: 'x' });
        await env.gw.close();
        env.gw = await startGateway(env.configPath, { env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN } });
        env.api = `${env.gw.base}/v1`;
        client = new OpenAI({ baseURL: env.api, apiKey: 'unused', maxRetries: 0, timeout: 10000 });
        assert.equal((await fetch(`${env.api}/sessions/${id}`)).status, 404);
    });
});

describe('the budget and trimming', () => {
    test('a long conversation stays answerable; every prompt the engine got is within budget', async () => {
        const id = await newSession();
        const filler = 'the quick brown fox jumps over the lazy dog '.repeat(4);
        let trimmed = 0;
        for (let i = 0; i < 12; i++) {
            const r = await client.chat.completions.create({
                model: 'small', session_id: id, messages: [{ role: 'user', content: `turn ${i}: ${filler}` }],
            });
            const sent = await lastUpstream('up-small');
            const n = countMessages(sent.messages);
            assert.ok(n <= BUDGET, `turn ${i}: ${n} tokens sent, budget ${BUDGET}`);
            assert.equal(r.context.input_tokens, n, 'the report counts what was sent');
            assert.equal(r.context.budget, BUDGET);
            assert.equal(sent.messages.at(-1).content, `turn ${i}: ${filler}`, 'the question is never cut');
            const firstTurn = sent.messages.find((m) => m.role !== 'system');
            assert.equal(firstTurn.role, 'user', 'a turn starts with its question');
            if (r.context.trimmed.length) trimmed++;
        }
        assert.ok(trimmed > 0, 'the window was passed and the history trimmed');
    });

    test('the prefix sent upstream stays byte-identical between turns, moving only at a trim every few turns', async () => {
        // recent_only: no summary folds the history (that moves the prefix too, by design)
        const id = await newSession({ system: 'You are terse.', context_policy: 'recent_only' });
        const filler = 'a b c d e f g h '.repeat(3);
        const sent = [];
        for (let i = 0; i < 30; i++) {
            const r = await client.chat.completions.create({
                model: 'small', session_id: id, messages: [{ role: 'user', content: `turn ${i}: ${filler}` }],
            });
            const rec = (await env.mock.requests((q) => q.body?.model === 'up-small')).at(-1);
            assert.ok(rec.raw, 'the mock kept the bytes');
            const text = JSON.stringify(rec.body.messages);
            assert.ok(rec.raw.includes(text), 'the messages are sent as compact JSON');
            assert.ok(countMessages(rec.body.messages) <= BUDGET, `turn ${i} within budget`);
            sent.push({ raw: rec.raw, text, trimmed: r.context.trimmed.length > 0 });
        }
        // a turn keeps the prefix when its bytes start with the whole list the turn before sent
        const moves = [];
        for (let i = 1; i < sent.length; i++) {
            const prefix = `"messages":${sent[i - 1].text.slice(0, -1)},`;
            if (!sent[i].raw.includes(prefix)) moves.push(i);
        }
        assert.ok(moves.length >= 2, `the budget was passed more than once: moves ${moves}`);
        for (const i of moves) assert.ok(sent[i].trimmed, `turn ${i}: the prefix moved without a trim`);
        for (let k = 1; k < moves.length; k++) {
            assert.ok(moves[k] - moves[k - 1] >= 3, `trims at turns ${moves[k - 1]} and ${moves[k]}: ${moves}`);
        }
        assert.ok(sent.filter((s) => s.trimmed).length > moves.length, 'turns over the budget reuse the last cut');
    });

    test('a tool call and its result leave together', async () => {
        const id = await newSession();
        const big = 'data '.repeat(60);
        const toolCall = { id: 'call_9', type: 'function', function: { name: 'lookup', arguments: '{}' } };
        await env.mock.script({ model: 'up-small', times: 1, action: { body: {
            id: 'x', object: 'chat.completion', created: 1, model: 'up-small',
            choices: [{ index: 0, message: { role: 'assistant', content: null, tool_calls: [toolCall] }, finish_reason: 'tool_calls' }],
            usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 },
        } } });
        await client.chat.completions.create({ model: 'small', session_id: id, messages: [{ role: 'user', content: 'look it up' }] });
        await client.chat.completions.create({ model: 'small', session_id: id, messages: [{ role: 'tool', tool_call_id: 'call_9', content: big }] });
        for (let i = 0; i < 6; i++) {
            await client.chat.completions.create({ model: 'small', session_id: id, messages: [{ role: 'user', content: `more ${i} ${'words '.repeat(30)}` }] });
            const sent = await lastUpstream('up-small');
            const calls = sent.messages.filter((m) => m.tool_calls).length;
            const results = sent.messages.filter((m) => m.role === 'tool').length;
            assert.equal(calls, results, `turn ${i}: ${JSON.stringify(sent.messages.map((m) => m.role))}`);
            assert.ok(countMessages(sent.messages) <= BUDGET);
        }
    });

    test('exact: a request at the budget is sent whole, a few tokens over is trimmed', async () => {
        // a history turn and a question sized so the list counts exactly BUDGET
        const history = [{ role: 'user', content: 'old question' }, { role: 'assistant', content: 'old answer' }];
        // ' w' is one token of o200k_base: words are added until the list counts the budget
        let text = 'q';
        while (countMessages([...history, { role: 'user', content: text + ' w' }]) <= BUDGET) text += ' w';
        const at = countMessages([...history, { role: 'user', content: text }]);
        assert.equal(at, BUDGET);
        const r1 = await postJson(`${env.api}/chat/completions`, { model: 'small', messages: [...history, { role: 'user', content: text }] });
        assert.equal(r1.status, 200, r1.text);
        const sent1 = await lastUpstream('up-small');
        assert.equal(sent1.messages.length, 3, `at ${at} of ${BUDGET}: sent whole`);
        // now one over: a longer history message pushes it past
        const over = [{ role: 'user', content: 'old question and more' }, history[1]];
        const n2 = countMessages([...over, { role: 'user', content: text }]);
        assert.ok(n2 > BUDGET);
        const r2 = await postJson(`${env.api}/chat/completions`, { model: 'small', messages: [...over, { role: 'user', content: text }] });
        assert.equal(r2.status, 200, r2.text);
        const sent2 = await lastUpstream('up-small');
        assert.deepEqual(sent2.messages, [{ role: 'user', content: text }]);
        assert.deepEqual(r2.json.context.trimmed, ['drop_oldest_turns']);
        assert.equal(r2.json.context.input_tokens, countMessages(sent2.messages));
        const line = await env.gw.requestLog(r2.json.request_id);
        assert.equal(line.context_trimmed, 'drop_oldest_turns');
        assert.equal(line.context_tokens, countMessages(sent2.messages));
        assert.equal(line.context_budget, BUDGET);
        assert.match(await env.gw.metrics(), /moongate_context_trimming_total\{step="drop_oldest_turns"\} [1-9]/);
    });

    test('a route with a smaller window than its model makes the budget', async () => {
        const long = [{ role: 'user', content: 'x '.repeat(500) }, { role: 'assistant', content: 'y' }, { role: 'user', content: 'q' }];
        const r = await postJson(`${env.api}/chat/completions`, { model: 'mixed', messages: long });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.context.budget, BUDGET);
        const sent = await lastUpstream('up-mixed');
        assert.ok(countMessages(sent.messages) <= BUDGET);
    });

    test('what no trim fits in the smallest window goes to the routes with a larger one (step 6)', async () => {
        const big = 'w'.repeat(0) + ' w'.repeat(1000); // about 1000 tokens: over the small route's 360
        const r = await postJson(`${env.api}/chat/completions`, { model: 'mixed', messages: [{ role: 'user', content: big }] });
        assert.equal(r.status, 200, r.text);
        assert.ok(r.json.context.trimmed.includes('switch_route'), JSON.stringify(r.json.context));
        assert.equal(r.json.context.budget, 4000 - MAX_TOKENS);
        const sent = await lastUpstream('up-mixed');
        assert.equal(sent.messages.at(-1).content, big, 'sent whole to the large route');
        // the small route may not stand in for it: its failure is not retried there
        const before = (await env.mock.requests((q) => q.body?.model === 'up-mixed-small')).length;
        await env.mock.script({ model: 'up-mixed', times: 3, action: { status: 500, body: { error: { message: 'down' } } } });
        const failed = await postJson(`${env.api}/chat/completions`, { model: 'mixed', messages: [{ role: 'user', content: big }] });
        assert.ok(failed.status >= 500, failed.text);
        assert.equal((await env.mock.requests((q) => q.body?.model === 'up-mixed-small')).length, before);
        // a small request still uses every route's window as its budget
        const small = await postJson(`${env.api}/chat/completions`, { model: 'mixed', messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(small.status, 200, small.text);
        assert.equal(small.json.context?.budget ?? BUDGET, BUDGET);
    });

    test('what cannot fit is 400 CONTEXT_TOO_LARGE with the counts; policy none does not trim', async () => {
        const huge = 'word '.repeat(BUDGET);
        const r = await postJson(`${env.api}/chat/completions`, { model: 'small', messages: [{ role: 'user', content: huge }] });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.code, 'CONTEXT_TOO_LARGE');
        assert.match(r.json.error.message, new RegExp(`budget is ${BUDGET}`));
        assert.match(await env.gw.metrics(), /moongate_context_too_large_total [1-9]/);
        const long = [{ role: 'user', content: 'x '.repeat(500) }, { role: 'assistant', content: 'y' }, { role: 'user', content: 'q' }];
        const none = await postJson(`${env.api}/chat/completions`, { model: 'small', messages: long, context_policy: 'none' });
        assert.equal(none.status, 400, none.text);
        assert.equal(none.json.error.code, 'CONTEXT_TOO_LARGE');
        const trims = await postJson(`${env.api}/chat/completions`, { model: 'small', messages: long });
        assert.equal(trims.status, 200, trims.text);
        const reserve = await postJson(`${env.api}/chat/completions`, { model: 'small', max_tokens: WINDOW, messages: [{ role: 'user', content: 'q' }] });
        assert.equal(reserve.status, 400, reserve.text);
        assert.equal(reserve.json.error.code, 'CONTEXT_TOO_LARGE');
    });
});

describe('summaries', () => {
    test('near max_messages the older half is summarised through the pipeline at P4 and replaces those turns', async () => {
        const id = await newSession({ max_messages: 8 });
        for (let i = 0; i < 3; i++) {
            await client.chat.completions.create({ model: 'talk', session_id: id, messages: [{ role: 'user', content: `fact ${i}` }] });
        }
        // six messages kept: three quarters of eight passed, the next request starts the summary
        const from = env.gw.logs.length;
        await client.chat.completions.create({ model: 'talk', session_id: id, messages: [{ role: 'user', content: 'fact 3' }] });
        const line = await env.gw.waitLog((l) => l.model === 'summ' && l.path === '/v1/chat/completions', { timeoutMs: 5000, from });
        assert.equal(line.priority, 'P4');
        assert.equal(line.status, 200);
        const asked = (await env.mock.requests((r) => r.body?.model === 'up-summ')).at(-1).body;
        assert.match(asked.messages[1].content, /user: fact 0\nassistant: .*\nuser: fact 1\nassistant: /s);
        assert.doesNotMatch(asked.messages[1].content, /fact 2/, 'the cut is at the middle turn');
        let s;
        for (let i = 0; i < 50; i++) {
            s = await (await fetch(`${env.api}/sessions/${id}`)).json();
            if (s.summary) break;
            await new Promise((r) => setTimeout(r, 50));
        }
        assert.ok(s.summary && s.summary.startsWith('up-summ'), JSON.stringify(s));
        const kept = await messagesOf(id);
        assert.equal(kept[0].content, 'fact 2', 'the summarised turns left the session');
        assert.equal(kept.length, 4, 'two left after the cut, and the turn that started it');
        // the next request: system summary first, then the turns after the cut
        const r = await client.chat.completions.create({ model: 'talk', session_id: id, messages: [{ role: 'user', content: 'what do you know?' }] });
        assert.equal(r.context.summary_used, true);
        const sent = await lastUpstream('up-talk');
        assert.equal(sent.messages[0].role, 'system');
        assert.equal(sent.messages[0].content, `Summary of the earlier conversation:\n${s.summary}`);
        assert.equal(sent.messages[1].content, 'fact 2');
        assert.match(await env.gw.metrics(), /moongate_session_summaries_total\{outcome="ok"\} [1-9]/);
    });
});

describe('a summary pending', () => {
    // The summariser's upstream is held (the mock answers it only when released): what the
    // session does meanwhile is ordered by that, with no clock in the assertions.
    test('does not hold up the session: a request meanwhile is answered, trimmed by the other steps; the one after it carries the summary', async () => {
        const HOLD = 'summary-pending';
        // every summary call waits until released (an earlier test's late one too: harmless)
        await env.mock.script({ model: 'up-summ', action: { hold: HOLD } });
        const id = await newSession();
        const filler = 'the quick brown fox jumps over the lazy dog '.repeat(4);
        const isOurs = (r) => r.body?.model === 'up-summ' && r.body.messages?.[1]?.content?.includes('pend first');
        const toolCall = { id: 'call_pend', type: 'function', function: { name: 'lookup', arguments: '{"q":"pend"}' } };
        const ask = (content) => client.chat.completions.create({ model: 'small', session_id: id, messages: [{ role: 'user', content }] });
        // two turns before the tool call: the first cut drops them and keeps the call's turn
        await ask(`pend first: ${filler}`);
        await ask(`pend second: ${filler}`);
        await env.mock.script({ model: 'up-small', times: 1, action: { body: {
            id: 'x', object: 'chat.completion', created: 1, model: 'up-small',
            choices: [{ index: 0, message: { role: 'assistant', content: null, tool_calls: [toolCall] }, finish_reason: 'tool_calls' }],
            usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 },
        } } });
        await ask('pend look it up');
        await client.chat.completions.create({
            model: 'small', session_id: id, messages: [{ role: 'tool', tool_call_id: 'call_pend', content: `pend result: ${filler}` }],
        });
        // turns until one is trimmed: that one starts the summary
        let started = null;
        for (let i = 0; i < 20 && !started; i++) {
            const r = await ask(`pend ${i}: ${filler}`);
            if (r.context.trimmed.includes('drop_oldest_turns')) started = r;
        }
        assert.ok(started, 'the session passed its budget');
        const summ = await env.mock.waitRequest((r) => isOurs(r) && r.held, { what: 'the held summary call' });
        // the request that started it was answered (awaited above) while its summary is held
        assert.equal((await env.mock.requests((r) => r.seq === summ.seq))[0].finished, false);
        assert.equal((await (await fetch(`${env.api}/sessions/${id}`)).json()).summary, null);

        // a request while the summary is pending
        const stored = await messagesOf(id);
        const q = `pend while pending: ${filler}`;
        const r = await ask(q);
        const rec = (await env.mock.requests((x) => x.body?.model === 'up-small')).at(-1);
        assert.equal(rec.body.messages.at(-1).content, q);
        assert.ok(rec.seq > summ.seq, 'the engine got the request after the summary call');
        assert.equal((await env.mock.requests((x) => x.seq === summ.seq))[0].finished, false,
            'the request was answered before the summary call was');
        assert.equal((await env.mock.requests(isOurs)).length, 1, 'one summary at a time');
        // trimmed by the other steps, within the budget by the tokenizer, oldest turns out whole
        const sent = JSON.parse(rec.raw).messages;
        assert.equal(r.context.summary_used, false);
        assert.ok(r.context.trimmed.includes('drop_oldest_turns'), JSON.stringify(r.context));
        const n = countMessages(sent);
        assert.ok(n <= BUDGET, `${n} tokens sent, budget ${BUDGET}`);
        assert.equal(r.context.input_tokens, n);
        assert.equal(r.context.budget, BUDGET);
        const history = sent.slice(0, -1);
        assert.ok(history.length > 0 && history.length < stored.length, `${history.length} of ${stored.length} kept`);
        assert.deepEqual(history, stored.slice(stored.length - history.length), 'the newest turns, as stored');
        assert.equal(history[0].role, 'user', 'the cut is at a turn start');
        for (const [i, m] of sent.entries()) {
            if (m.role !== 'tool') continue;
            const call = sent.slice(0, i).findLast((x) => x.tool_calls);
            assert.ok(call?.tool_calls.some((tc) => tc.id === m.tool_call_id), `tool result ${i} without its call`);
        }
        for (const m of sent.filter((x) => x.tool_calls)) {
            for (const tc of m.tool_calls) assert.ok(sent.some((x) => x.role === 'tool' && x.tool_call_id === tc.id), 'a call without its result');
        }

        // the summary lands; the request after it carries it
        assert.equal((await env.mock.release(HOLD)).released >= 1, true);
        let s;
        for (let i = 0; i < 100; i++) {
            s = await (await fetch(`${env.api}/sessions/${id}`)).json();
            if (s.summary) break;
            await new Promise((res) => setTimeout(res, 50));
        }
        assert.ok(s.summary && s.summary.startsWith('up-summ'), JSON.stringify(s));
        const after = await ask('pend after the summary');
        assert.equal(after.context.summary_used, true);
        const last = await lastUpstream('up-small');
        assert.equal(last.messages[0].role, 'system');
        assert.equal(last.messages[0].content, `Summary of the earlier conversation:\n${s.summary}`);
        assert.equal(last.messages.at(-1).content, 'pend after the summary');
        assert.ok(countMessages(last.messages) <= BUDGET);
        assert.ok(!last.messages.some((m) => m.content?.startsWith('pend first')), 'the summarised turns left');
        await env.mock.reset();
    });
});

describe('a model made through the admin API has a window', () => {
    const admin = (method, p, body) => adminCall(env.gw.base, ADMIN_TOKEN, method, p, body, { timeoutMs: 15000 });
    const route = [{ provider: 'mock-openai', model: 'up-admin' }];

    test('context_window, max_output_tokens and tokenizer: validated naming the field', async () => {
        for (const [extra, re] of [
            [{ context_window: -1 }, /'context_window'/],
            [{ context_window: 1.5 }, /'context_window'/],
            [{ context_window: 'big' }, /'context_window'/],
            [{ max_output_tokens: -5 }, /'max_output_tokens'/],
            [{ max_output_tokens: 1e9 }, /'max_output_tokens'/],
            [{ tokenizer: 'gpt2' }, /'tokenizer'/],
            [{ routes: [{ ...route[0], context_window: 'x' }] }, /'routes\[0\]\.context_window'/],
        ]) {
            const r = await admin('POST', 'models', { name: 'bad-window', routes: route, ...extra });
            assert.equal(r.status, 400, `${JSON.stringify(extra)}: ${r.text}`);
            assert.equal(r.json.error.code, 'INVALID_REQUEST');
            assert.match(r.json.error.message, re);
        }
        assert.equal((await admin('GET', 'models/bad-window')).status, 404);
    });

    test('stored, returned, and the budget of a session chat on it; an update changes it', async () => {
        const c = await admin('POST', 'models', {
            name: 'admin-small', routes: route, tokenizer: 'o200k_base',
            context_window: WINDOW, max_output_tokens: MAX_TOKENS,
        });
        assert.equal(c.status, 201, c.text);
        const got = await admin('GET', 'models/admin-small');
        assert.equal(got.status, 200, got.text);
        assert.equal(got.json.context_window, WINDOW);
        assert.equal(got.json.max_output_tokens, MAX_TOKENS);
        assert.equal(got.json.tokenizer, 'o200k_base');

        const id = await newSession({ model: 'admin-small' });
        const filler = 'the quick brown fox jumps over the lazy dog '.repeat(4);
        let trimmed = 0;
        for (let i = 0; i < 10; i++) {
            const r = await client.chat.completions.create({
                model: 'admin-small', session_id: id, messages: [{ role: 'user', content: `turn ${i}: ${filler}` }],
            });
            assert.equal(r.context.budget, BUDGET, JSON.stringify(r.context));
            const sent = await lastUpstream('up-admin');
            assert.ok(countMessages(sent.messages) <= BUDGET, `turn ${i}: over the budget`);
            if (r.context.trimmed.length) trimmed++;
        }
        assert.ok(trimmed > 0, 'the admin model\'s window trimmed the history');

        // max_tokens absent: the reserve is the model's max_output_tokens; an update moves both
        const u = await admin('PUT', 'models/admin-small', { context_window: 2 * WINDOW, max_output_tokens: 100 });
        assert.equal(u.status, 200, u.text);
        assert.equal(u.json.context_window, 2 * WINDOW);
        const r = await client.chat.completions.create({
            model: 'admin-small', session_id: id, messages: [{ role: 'user', content: 'after the update' }],
        });
        assert.equal(r.context.budget, 2 * WINDOW - 100);

        // a route's own smaller window makes the budget, as in the file
        const rw = await admin('PUT', 'models/admin-small', { routes: [{ ...route[0], context_window: WINDOW }] });
        assert.equal(rw.status, 200, rw.text);
        assert.equal(rw.json.routes[0].context_window, WINDOW);
        const r2 = await client.chat.completions.create({
            model: 'admin-small', session_id: id, messages: [{ role: 'user', content: 'smaller route' }],
        });
        assert.equal(r2.context.budget, WINDOW - 100);
        assert.equal((await admin('DELETE', 'models/admin-small')).status, 200);
    });
});
