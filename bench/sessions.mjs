// Sessions for bench/run's moongate_session variant (issue 21: a session request's CPU per
// request beside a plain one): N sessions of `max_messages: 2 x TURNS`, each filled with TURNS
// turns through the gateway (the bench's own question, the mock's answer), so that every
// measured request replays a TURNS-turn history and appends one more turn (the oldest leaves:
// the history stays TURNS turns). Then the token counts, from the gateway's budget report
// (`context.input_tokens`, counted by the model's tokenizer): a request on a full session, and
// the same request on an empty one (the plain request's own messages).
//
// usage: node bench/sessions.mjs PORT SESSIONS TURNS IDS_FILE
// Writes the session ids to IDS_FILE, one a line, and prints one JSON line. Bounded: SESSIONS x
// TURNS requests, 16 at a time, each with a 5 s timeout, the whole within 120 s.
import fs from 'node:fs';

const [port, nArg, turnsArg, idsFile] = process.argv.slice(2);
const N = Number(nArg);
const TURNS = Number(turnsArg);
if (!port || !(N >= 1 && N <= 10000) || !(TURNS >= 1 && TURNS <= 1000) || !idsFile) {
    console.error('usage: node bench/sessions.mjs PORT SESSIONS(1-10000) TURNS(1-1000) IDS_FILE');
    process.exit(2);
}
const base = `http://127.0.0.1:${port}/v1`;
const deadline = Date.now() + 120000;
// the body of bench/chat.lua, so that the only difference from a plain request is session_id
const SYSTEM = 'You are a concise assistant.';
const QUESTION = 'In one short sentence, explain why an HTTP reverse proxy should keep upstream connections alive and pooled.';

async function post(path, body) {
    if (Date.now() > deadline) throw new Error('the sessions were not filled within 120 s');
    const r = await fetch(base + path, {
        method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
        signal: AbortSignal.timeout(5000),
    });
    const text = await r.text();
    if (r.status >= 300) throw new Error(`POST ${path}: ${r.status} ${text.slice(0, 200)}`);
    return JSON.parse(text);
}

const chat = (id) => post('/chat/completions', {
    model: 'gpt-4o-mini', session_id: id, max_tokens: 64, temperature: 0.2, user: 'bench-client-0001',
    messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: QUESTION }],
});

const ids = [];
for (let i = 0; i < N; i++) ids.push((await post('/sessions', { max_messages: 2 * TURNS })).id);
let next = 0;
async function filler() {
    while (next < ids.length) {
        const id = ids[next++];
        for (let t = 0; t < TURNS; t++) await chat(id);
    }
}
await Promise.all(Array.from({ length: Math.min(16, N) }, filler));

// the counts: one more turn on a full session (it stays TURNS turns), and on an empty one
const full = await chat(ids[0]);
const empty = (await post('/sessions', {})).id;
const plain = await chat(empty);
const got = await (await fetch(`${base}/sessions/${ids[0]}`, { signal: AbortSignal.timeout(5000) })).json();
fs.writeFileSync(idsFile, ids.join('\n') + '\n');
console.log(JSON.stringify({
    sessions: N, turns: TURNS, messages: got.message_count, session_tokens: got.token_count,
    input_tokens: full.context?.input_tokens ?? null, budget: full.context?.budget ?? null,
    trimmed: full.context?.trimmed ?? null, plain_input_tokens: plain.context?.input_tokens ?? null,
}));
