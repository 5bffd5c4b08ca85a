// The per-adapter parameter tables (issue 18.3): every Chat Completions, Completions and
// Embeddings parameter is sent through a running gateway to each adapter, and what reached the
// mock engine (or what came back) must be what lua/README.md's "Parameters per adapter" says:
// forwarded, honoured, emulated, refused, gateway or ignored. The tables are read from the
// README here, so the documentation and the behaviour cannot drift apart.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { REPO_ROOT, startEnv, postJson, postStream } from './lib/harness.mjs';

// The OpenAI API's parameters (openai v6's request types): a table that leaves one out fails.
const OPENAI_PARAMS = {
    chat: ['messages', 'model', 'audio', 'frequency_penalty', 'function_call', 'functions',
        'logit_bias', 'logprobs', 'max_completion_tokens', 'max_tokens', 'metadata', 'modalities',
        'n', 'parallel_tool_calls', 'prediction', 'presence_penalty', 'prompt_cache_key',
        'reasoning_effort', 'response_format', 'safety_identifier', 'seed', 'service_tier', 'stop',
        'store', 'stream', 'stream_options', 'temperature', 'tool_choice', 'tools', 'top_logprobs',
        'top_p', 'user', 'verbosity', 'web_search_options'],
    completions: ['model', 'prompt', 'best_of', 'echo', 'frequency_penalty', 'logit_bias',
        'logprobs', 'max_tokens', 'n', 'presence_penalty', 'seed', 'stop', 'stream',
        'stream_options', 'suffix', 'temperature', 'top_p', 'user'],
    embeddings: ['input', 'model', 'dimensions', 'encoding_format', 'user'],
};
const RULES = new Set(['forwarded', 'honoured', 'emulated', 'refused', 'gateway', 'ignored']);
const HEADINGS = { chat: 'Chat Completions', completions: 'Completions', embeddings: 'Embeddings' };

/** { endpoint: { param: { adapter: rule } } } from lua/README.md. */
function readTables() {
    const text = fs.readFileSync(path.join(REPO_ROOT, 'lua/README.md'), 'utf8');
    const section = text.split(/^## Parameters per adapter$/m)[1]?.split(/^## /m)[0];
    assert.ok(section, 'lua/README.md has a "Parameters per adapter" section');
    const out = {};
    for (const [ep, heading] of Object.entries(HEADINGS)) {
        const part = section.split(new RegExp(`^### ${heading} \\(`, 'm'))[1]?.split(/^### /m)[0];
        assert.ok(part, `a "${heading}" table`);
        const rows = part.split('\n').filter((l) => l.startsWith('| `'));
        const head = part.split('\n').find((l) => l.startsWith('| parameter'));
        const adapters = head.split('|').slice(2, -1).map((c) => c.trim().replace(/`/g, ''));
        out[ep] = {};
        for (const row of rows) {
            const cells = row.split(/(?<!\\)\|/).slice(1, -1).map((c) => c.trim());
            const name = cells[0].replace(/`/g, '');
            out[ep][name] = {};
            adapters.forEach((a, i) => {
                const rule = cells[i + 1].split(/[\s:(]/)[0];
                assert.ok(RULES.has(rule), `${ep}.${name} on ${a}: "${rule}" is not a rule`);
                out[ep][name][a] = rule;
            });
        }
    }
    return out;
}

const TABLES = readTables();
const MODELS = {
    openai: { chat: 'chat', completions: 'chat', embeddings: 'embed' },
    ollama: { chat: 'ollama-chat', completions: 'ollama-chat', embeddings: 'ollama-embed' },
};
const UPSTREAM = {
    openai: { chat: 'up-chat', completions: 'up-chat', embeddings: 'up-embed' },
    ollama: { chat: 'up-ollama-chat', completions: 'up-ollama-chat', embeddings: 'up-ollama-embed' },
};
const PATHS = { chat: '/v1/chat/completions', completions: '/v1/completions', embeddings: '/v1/embeddings' };
const BIG_SEED = '9007199254740993'; // 2^53 + 1: a double cannot hold it

const weather = { type: 'function', function: { name: 'weather', parameters: { type: 'object', properties: {} } } };
const clock = { type: 'function', function: { name: 'clock', parameters: { type: 'object', properties: {} } } };

// An Ollama answer with two tool calls, for the parallel_tool_calls emulation.
const ollamaTwoCalls = {
    model: 'up-ollama-chat', created_at: '2024-01-01T00:00:00Z', done: true, done_reason: 'stop',
    message: { role: 'assistant', content: '', tool_calls: [
        { function: { name: 'weather', arguments: { city: 'Paris' } } },
        { function: { name: 'clock', arguments: {} } }] },
    prompt_eval_count: 3, eval_count: 2,
};

const base = {
    chat: () => ({ messages: [{ role: 'user', content: 'hi' }] }),
    completions: () => ({ prompt: 'Say hi' }),
    embeddings: () => ({ input: 'hello' }),
};

// Per parameter: `send` (the members to add; `raw` for body text JSON cannot write), and
// the checks a rule needs beyond the generic ones: honoured/emulated(up, res, adapter), a
// `forwarded` override, and `script(adapter)` for a scripted mock answer.
const PROBES = {
    chat: {
        messages: {
            send: { messages: [{ role: 'developer', content: 'Rules' }, { role: 'user', content: 'hi' }] },
            honoured: (up) => up.messages[0].role === 'system' && up.messages[0].content === 'Rules',
        },
        model: { send: {}, honoured: (up, res, a) => up.model === UPSTREAM[a].chat },
        audio: { send: { audio: { voice: 'alloy', format: 'wav' } } },
        frequency_penalty: { send: { frequency_penalty: 0.5 }, honoured: (up) => up.options.frequency_penalty === 0.5 },
        function_call: { send: { function_call: 'auto' } },
        functions: { send: { functions: [{ name: 'f', parameters: { type: 'object' } }] } },
        logit_bias: { send: { logit_bias: { 50256: -100 } } },
        logprobs: { send: { logprobs: true } },
        max_completion_tokens: { send: { max_completion_tokens: 3 }, honoured: (up) => up.options.num_predict === 3 },
        max_tokens: { send: { max_tokens: 4 }, honoured: (up) => up.options.num_predict === 4 },
        metadata: { send: { metadata: { trace: 't-1' } } },
        modalities: { send: { modalities: ['text', 'audio'] } },
        n: { send: { n: 2 } },
        parallel_tool_calls: {
            send: { tools: [weather, clock], parallel_tool_calls: false },
            script: (a) => (a === 'ollama' ? { path: '/api/chat', action: { body: ollamaTwoCalls } } : null),
            forwarded: (up) => up.parallel_tool_calls === false,
            emulated: (up, res) => res.json.choices[0].message.tool_calls.length === 1 &&
                res.json.choices[0].message.tool_calls[0].function.name === 'weather',
        },
        prediction: { send: { prediction: { type: 'content', content: 'hello' } } },
        presence_penalty: { send: { presence_penalty: 0.25 }, honoured: (up) => up.options.presence_penalty === 0.25 },
        prompt_cache_key: { send: { prompt_cache_key: 'k-1' } },
        reasoning_effort: { send: { reasoning_effort: 'high' }, honoured: (up) => up.think === true },
        response_format: { send: { response_format: { type: 'json_object' } }, honoured: (up) => up.format === 'json' },
        safety_identifier: { send: { safety_identifier: 'u-hash' } },
        seed: {
            raw: `"seed":${BIG_SEED}`,
            forwarded: (up, res, a, raw) => raw.includes(`"seed":${BIG_SEED}`),
            honoured: (up, res, a, raw) => new RegExp(`"seed":${BIG_SEED}[,}]`).test(raw),
        },
        service_tier: { send: { service_tier: 'auto' } },
        stop: { send: { stop: 'END' }, honoured: (up) => JSON.stringify(up.options.stop) === '["END"]' },
        store: { send: { store: true } },
        stream: { send: { stream: true }, honoured: (up, res) => up.stream === true && res.events.at(-1) === '[DONE]' },
        stream_options: {
            send: { stream: true, stream_options: { include_usage: true } },
            honoured: (up, res) => {
                const last = res.events.filter((e) => e !== '[DONE]').at(-1);
                return up.stream_options === undefined && last.choices.length === 0 && last.usage.total_tokens > 0;
            },
        },
        temperature: { send: { temperature: 0.3 }, honoured: (up) => up.options.temperature === 0.3 },
        tool_choice: {
            send: { tools: [weather, clock], tool_choice: 'none' },
            emulated: (up) => up.tools === undefined,
        },
        tools: { send: { tools: [weather] }, honoured: (up) => up.tools.length === 1 && up.tools[0].function.name === 'weather' },
        top_logprobs: { send: { top_logprobs: 2 } },
        top_p: { send: { top_p: 0.9 }, honoured: (up) => up.options.top_p === 0.9 },
        user: { send: { user: 'end-user-1' } },
        verbosity: { send: { verbosity: 'low' } },
        web_search_options: { send: { web_search_options: {} } },
    },
    completions: {
        model: { send: {}, honoured: (up, res, a) => up.model === UPSTREAM[a].completions },
        prompt: { send: { prompt: ['Say hi'] }, honoured: (up) => up.prompt === 'Say hi' },
        best_of: { send: { best_of: 3 } },
        echo: { send: { echo: true }, emulated: (up, res) => res.json.choices[0].text.startsWith('Say hi') },
        frequency_penalty: { send: { frequency_penalty: 0.5 }, honoured: (up) => up.options.frequency_penalty === 0.5 },
        logit_bias: { send: { logit_bias: { 50256: -100 } } },
        logprobs: { send: { logprobs: 2 } },
        max_tokens: { send: { max_tokens: 4 }, honoured: (up) => up.options.num_predict === 4 },
        n: { send: { n: 2 } },
        presence_penalty: { send: { presence_penalty: 0.25 }, honoured: (up) => up.options.presence_penalty === 0.25 },
        seed: {
            raw: `"seed":${BIG_SEED}`,
            forwarded: (up, res, a, raw) => raw.includes(`"seed":${BIG_SEED}`),
            honoured: (up, res, a, raw) => new RegExp(`"seed":${BIG_SEED}[,}]`).test(raw),
        },
        stop: { send: { stop: ['END'] }, honoured: (up) => JSON.stringify(up.options.stop) === '["END"]' },
        stream: { send: { stream: true }, honoured: (up, res) => up.stream === true && res.events.at(-1) === '[DONE]' },
        stream_options: {
            send: { stream: true, stream_options: { include_usage: true } },
            honoured: (up, res) => {
                const last = res.events.filter((e) => e !== '[DONE]').at(-1);
                return last.choices.length === 0 && last.usage.total_tokens > 0;
            },
        },
        suffix: { send: { suffix: ' end' }, honoured: (up) => up.suffix === ' end' },
        temperature: { send: { temperature: 0.3 }, honoured: (up) => up.options.temperature === 0.3 },
        top_p: { send: { top_p: 0.9 }, honoured: (up) => up.options.top_p === 0.9 },
        user: { send: { user: 'end-user-1' } },
    },
    embeddings: {
        input: { send: { input: ['a', 'b'] }, honoured: (up, res) => up.input.length === 2 && res.json.data.length === 2 },
        model: { send: {}, honoured: (up, res, a) => up.model === UPSTREAM[a].embeddings },
        dimensions: { send: { dimensions: 4 }, honoured: (up) => up.dimensions === 4 },
        encoding_format: {
            send: { encoding_format: 'base64' },
            honoured: (up, res) => typeof res.json.data[0].embedding === 'string' &&
                Buffer.from(res.json.data[0].embedding, 'base64').length % 4 === 0,
        },
        user: { send: { user: 'end-user-1' } },
    },
};

let env;

before(async () => {
    env = await startEnv({});
});

after(async () => {
    await env?.close();
});

/** The request body text for endpoint, adapter and probe. */
function bodyText(ep, adapter, probe) {
    const body = { ...base[ep](), model: MODELS[adapter][ep], ...(probe.send ?? {}) };
    const text = JSON.stringify(body);
    return probe.raw ? `${text.slice(0, -1)},${probe.raw}}` : text;
}

/** Send one probe; returns { res, up (the upstream body, or null), raw }. */
async function send(ep, adapter, probe) {
    const since = (await env.mock.requests()).reduce((m, r) => Math.max(m, r.seq), 0);
    const script = probe.script?.(adapter);
    if (script) await env.mock.script({ ...script, model: UPSTREAM[adapter][ep], times: 1 });
    const text = bodyText(ep, adapter, probe);
    const stream = JSON.parse(text).stream === true;
    const res = stream
        ? await postStream(env.api + PATHS[ep].slice(3), JSON.parse(text))
        : await postJson(env.api + PATHS[ep].slice(3), text);
    const seen = await env.mock.requests((r) => r.seq > since && r.method === 'POST');
    const last = seen.at(-1);
    return { res, up: last?.body ?? null, raw: last?.raw ?? '' };
}

for (const ep of Object.keys(OPENAI_PARAMS)) {
    describe(`${HEADINGS[ep]}: the table is the behaviour`, () => {
        test('the table lists every parameter of the OpenAI API, and every one has a probe', () => {
            assert.deepEqual(Object.keys(TABLES[ep]).sort(), [...OPENAI_PARAMS[ep]].sort());
            assert.deepEqual(Object.keys(PROBES[ep]).sort(), [...OPENAI_PARAMS[ep]].sort());
        });

        for (const adapter of ['openai', 'ollama']) {
            test(`${adapter}: each parameter is what the table says`, async () => {
                for (const [name, rules] of Object.entries(TABLES[ep])) {
                    const rule = rules[adapter];
                    const probe = PROBES[ep][name];
                    const { res, up, raw } = await send(ep, adapter, probe);
                    const what = `${ep}.${name} on ${adapter} (${rule}): ${res.status} ${res.text.slice(0, 300)}`;
                    if (rule === 'refused') {
                        assert.equal(res.status, 400, what);
                        assert.equal(res.json.error.code, 'INVALID_REQUEST', what);
                        assert.equal(res.json.error.param, name, what);
                        continue;
                    }
                    assert.equal(res.status, 200, what);
                    assert.ok(up, `${what}: nothing reached the upstream`);
                    if (rule === 'forwarded') {
                        const ok = probe.forwarded ? probe.forwarded(up, res, adapter, raw)
                            : JSON.stringify(up[name]) === JSON.stringify(probe.send[name]);
                        assert.ok(ok, `${what}: upstream got ${JSON.stringify(up[name])}`);
                    } else if (rule === 'gateway' || rule === 'ignored') {
                        assert.equal(up[name], undefined, `${what}: sent upstream`);
                    } else {
                        assert.ok(probe[rule], `${what}: the probe has no "${rule}" check`);
                        assert.ok(probe[rule](up, res, adapter, raw), `${what}: upstream got ${raw.slice(0, 400)}`);
                    }
                }
            });
        }
    });
}
