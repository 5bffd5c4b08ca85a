// The gateway's Anthropic objects type-checked against the official @anthropic-ai/sdk's
// TypeScript types (issue 20, conformance): real answers of a translated (OpenAI-wire) and a
// passed-through (Anthropic) provider are captured, written into a .ts file as object literals
// checked with `satisfies Anthropic.Message` (RawMessageStreamEvent, MessageTokensCount,
// ModelInfo's page, ErrorResponse), and `tsc --noEmit --strict` must accept it. `satisfies` on
// a literal reports a missing member, a wrong type and an excess member alike; a control file
// with one extra member proves tsc is really asked (it must fail).
//
// The SDK (1.15.0) declares some members of its response types required (nullable) that the
// API's documented answers do not carry (text blocks without `citations`, tool_use without
// `caller`, usage with only the token counts, models without `capabilities`...): the recorded
// Anthropic answers in tests/fixtures/anthropic, passed through untouched, fail on them exactly
// as the gateway's own do. Those members, and only those, are optional in the checked type
// (SDK_ONLY, printed by the test); everything else is checked as the SDK declares it: a member
// the gateway sends must exist in the SDK's type, with its type, and every other required
// member must be there.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { postJson, postStream, startEnv } from './lib/harness.mjs';

const TESTS = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const SDK = path.join(TESTS, 'node_modules/@anthropic-ai/sdk');
const TSC = path.join(TESTS, 'node_modules/typescript/bin/tsc');
const AV = { headers: { 'anthropic-version': '2023-06-01' } };
const TOOLS = [{ name: 'get_weather', description: 'weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
let env;
let dir;

before(async () => {
    assert.ok(fs.existsSync(TSC), `${TSC} missing: install the tests' npm packages (scripts/setup, or npm ci in tests/)`);
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moongate-types-'));
    env = await startEnv({
        configure(c, e) {
            c.providers.push({ id: 'mock-anthropic', adapter: 'anthropic', base_url: `http://127.0.0.1:${e.mock.port}`,
                api_key: 'sk-ant-upstream' });
            c.models['ty-chat'] = { routes: [{ provider: 'mock-openai', model: 'up-ty' }] };
            c.models['ty-claude'] = { routes: [{ provider: 'mock-anthropic', model: 'claude-up' }] };
            return c;
        },
    });
});

after(async () => {
    await env?.close();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

/** tsc on one file: { code, out }. */
function tsc(file) {
    const config = {
        compilerOptions: {
            strict: true, noEmit: true, target: 'es2022', module: 'esnext', moduleResolution: 'bundler',
            lib: ['es2022', 'dom'], types: [], skipLibCheck: true,
            paths: { '@anthropic-ai/sdk': [SDK], '@anthropic-ai/sdk/*': [`${SDK}/*`] },
        },
        files: [file],
    };
    const project = `${file}.tsconfig.json`;
    fs.writeFileSync(project, JSON.stringify(config, null, 1));
    return new Promise((resolve) => {
        execFile(process.execPath, [TSC, '-p', project], { timeout: 120000 }, (err, stdout, stderr) =>
            resolve({ code: err ? (err.code ?? 1) : 0, out: stdout + stderr }));
    });
}

// SDK-required members the API's documented answers lack (see the top of this file).
const SDK_ONLY = ['citations', 'caller', 'cache_creation', 'inference_geo', 'output_tokens_details', 'server_tool_use',
    'service_tier', 'speed', 'container', 'stop_details', 'capabilities', 'deprecated_at', 'lifecycle', 'line',
    'max_input_tokens', 'max_tokens', 'retires_at', 'diagnostics'];
// An Anthropic upstream's events passed through untouched, as the API documents them:
// message_delta's usage carries output_tokens alone (the SDK's MessageDeltaUsage wants all).
const PASSED_ONLY = ['input_tokens', 'cache_creation_input_tokens', 'cache_read_input_tokens'];

/** A .ts source declaring each value as a literal checked against its SDK type (SDK_ONLY
 * members optional, at any depth; unions stay unions, so a block's type still picks its
 * member and excess members are still reported). */
function source(decls, sdkOnly = SDK_ONLY) {
    const lines = [
        "import type Anthropic from '@anthropic-ai/sdk';",
        `type SdkOnly = ${sdkOnly.map((k) => JSON.stringify(k)).join(' | ') || 'never'};`,
        'type Lax<T> = T extends readonly (infer U)[] ? Lax<U>[] : T extends object',
        '    ? { [K in keyof T as K extends SdkOnly ? K : never]?: Lax<T[K]> } & { [K in keyof T as K extends SdkOnly ? never : K]: Lax<T[K]> }',
        '    : T;',
        '',
    ];
    if (!sdkOnly.length) lines.splice(1, 4, 'type Lax<T> = T;');
    else lines.push(`type SdkOnlyPassed = SdkOnly | ${PASSED_ONLY.map((k) => JSON.stringify(k)).join(' | ')};`,
        'type LaxPassed<T> = T extends readonly (infer U)[] ? LaxPassed<U>[] : T extends object',
        '    ? { [K in keyof T as K extends SdkOnlyPassed ? K : never]?: LaxPassed<T[K]> } & { [K in keyof T as K extends SdkOnlyPassed ? never : K]: LaxPassed<T[K]> }',
        '    : T;', '');
    decls.forEach(([type, value, passed], i) => {
        const lax = passed && sdkOnly.length ? 'LaxPassed' : 'Lax';
        lines.push(`export const v${i} = ${JSON.stringify(value, null, 1)} satisfies ${lax}<${type}>;`, '');
    });
    return lines.join('\n');
}

const ERROR = 'Omit<Anthropic.ErrorResponse, "request_id">'; // a stream's error event has no request_id

const captured = [];

describe('capture real answers', () => {
    test('messages: non-stream with thinking, text and tool_use (translated and passed through)', async () => {
        await env.mock.script({ model: 'up-ty', times: 1, action: { reasoning: 'think first', chunks: 2,
            tool_calls: [{ name: 'get_weather', arguments: { city: 'Paris' } }] } });
        const t = await postJson(`${env.base}/v1/messages`, { model: 'ty-chat', max_tokens: 100, tools: TOOLS,
            messages: [{ role: 'user', content: 'weather?' }] }, AV);
        assert.equal(t.status, 200, t.text);
        assert.deepEqual(t.json.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
        captured.push(['Anthropic.Message', t.json]);
        await env.mock.script({ model: 'claude-up', times: 1, action: { fixture: 'anthropic/message_tools_thinking.json' } });
        const p = await postJson(`${env.base}/v1/messages`, { model: 'ty-claude', max_tokens: 100, tools: TOOLS,
            messages: [{ role: 'user', content: 'weather?' }] }, AV);
        assert.equal(p.status, 200, p.text);
        captured.push(['Anthropic.Message', p.json, true]);
    });

    test('messages: stream events, thinking, text, tools, and an error event', async () => {
        await env.mock.script({ model: 'up-ty', times: 1, action: { reasoning: 'think first', chunks: 2,
            tool_calls: [{ name: 'get_weather', arguments: { city: 'Paris' } }] } });
        const s = await postStream(`${env.base}/v1/messages`, { model: 'ty-chat', max_tokens: 100, stream: true, tools: TOOLS,
            messages: [{ role: 'user', content: 'weather?' }] }, AV);
        await env.mock.script({ model: 'claude-up', times: 1, action: { fixture: 'anthropic/stream_tools_thinking.sse' } });
        const p = await postStream(`${env.base}/v1/messages`, { model: 'ty-claude', max_tokens: 100, stream: true,
            messages: [{ role: 'user', content: 'weather?' }] }, AV);
        await env.mock.script({ model: 'up-ty', times: 1, action: { fixture: 'openai/chat_stream_error.sse' } });
        const e = await postStream(`${env.base}/v1/messages`, { model: 'ty-chat', max_tokens: 100, stream: true,
            messages: [{ role: 'user', content: 'story' }] }, AV);
        const types = new Set();
        const take = (events, passed) => {
            for (const ev of events) {
                types.add(ev.type);
                if (ev.type === 'ping') continue; // the SDK has no type for ping (it skips it); the API sends it
                captured.push([ev.type === 'error' ? ERROR : 'Anthropic.RawMessageStreamEvent', ev, passed]);
            }
        };
        take(s.events, false);
        take(p.events, true);
        take(e.events, false);
        for (const t of ['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta',
            'message_stop', 'error']) assert.ok(types.has(t), `a ${t} event captured`);
    });

    test('count_tokens, the models list in Anthropic\'s shape, an error body', async () => {
        const c = await postJson(`${env.base}/v1/messages/count_tokens`, { model: 'ty-chat', tools: TOOLS,
            messages: [{ role: 'user', content: 'how many tokens is this?' }] }, AV);
        assert.equal(c.status, 200, c.text);
        captured.push(['Anthropic.MessageTokensCount', c.json]);
        const m = await fetch(`${env.api}/models`, { headers: { ...AV.headers, 'x-api-key': 'sk-x' }, signal: AbortSignal.timeout(5000) });
        const models = await m.json();
        assert.equal(m.status, 200);
        assert.ok(models.data.length > 0);
        captured.push(['Anthropic.PageResponse<Anthropic.ModelInfo>', models]); // ModelInfosPage's wire shape
        const r = await postJson(`${env.base}/v1/messages`, { model: 'no-such-model', max_tokens: 10,
            messages: [{ role: 'user', content: 'x' }] }, AV);
        assert.equal(r.status, 404);
        captured.push(['Anthropic.ErrorResponse', r.json]);
    });
});

describe('tsc --noEmit --strict', () => {
    test('every captured object satisfies its SDK type', async () => {
        assert.ok(captured.length >= 10, `captured ${captured.length}`);
        const file = path.join(dir, 'answers.ts');
        fs.writeFileSync(file, source(captured));
        const r = await tsc(file);
        assert.equal(r.code, 0, `tsc found the gateway's answers off the SDK's types:\n${r.out}\n(the file: ${file})`);
    });

    test('the strict SDK types (no member optional) refuse the recorded Anthropic answer too: the SDK asks for more than the API documents', async () => {
        const file = path.join(dir, 'strict.ts');
        const rec = JSON.parse(fs.readFileSync(path.join(TESTS, 'fixtures/anthropic/message_tools_thinking.json'), 'utf8'));
        fs.writeFileSync(file, source([['Anthropic.Message', rec]], []));
        const r = await tsc(file);
        assert.notEqual(r.code, 0);
        const missing = [...r.out.matchAll(/Property '(\w+)' is missing|missing the following properties from type '\w+': ([\w, ]+)/g)]
            .flatMap((m) => (m[1] ? [m[1]] : m[2].split(', '))).map((k) => k.replace(/^and \d+ more$/, '')).filter(Boolean);
        console.log(`SDK-only members the documented answer lacks: ${[...new Set(missing)].join(', ')}`);
        for (const k of missing) assert.ok(SDK_ONLY.includes(k), `${k}: required by the SDK, not in SDK_ONLY\n${r.out}`);
    });

    test('control: an excess member and a wrong stop_reason are reported', async () => {
        const msg = structuredClone(captured.find(([t]) => t === 'Anthropic.Message')[1]);
        const file = path.join(dir, 'control.ts');
        fs.writeFileSync(file, source([
            ['Anthropic.Message', { ...msg, x_moongate: 1 }],
            ['Anthropic.Message', { ...msg, stop_reason: 'stop' }],
        ]));
        const r = await tsc(file);
        assert.notEqual(r.code, 0);
        assert.match(r.out, /TS2353[^\n]*x_moongate/, r.out); // object literal may only specify known properties
        assert.match(r.out, /TS2322[^\n]*"stop"/, r.out);
    });
});
