#!/usr/bin/env node
// Scriptable mock model engine for moongate's end-to-end tests.
//
// It speaks the OpenAI wire (/v1/models, /v1/chat/completions, /v1/completions,
// /v1/embeddings, /v1/responses), Anthropic's Messages API (/v1/messages), Ollama's native API (/api/chat, /api/generate, /api/embed,
// /api/tags) and Triton's generate extension (/v2/models/{model}/generate and
// generate_stream, /v2/health/ready) in their documented shapes, with deterministic canned answers, and it
// records every request it sees. Tests script failures through a small control API:
//
//   POST /__mock/script   {model?, path?, method?, times?, action: {...}} (or an array of them)
//   GET  /__mock/requests every request seen (?path=/v1/... filters, ?since=N only seq > N)
//   GET  /__mock/rules    the rules and how often each was used
//   POST /__mock/release  {hold}: answer the requests held under that name (see hold below)
//                         and let later ones through; returns {released: n}
//   POST /__mock/reset    forget rules, records and holds (and the load below)
//   POST /__mock/load     {running?, waiting?, kv_cache?, slots?}: the engine load that
//                         GET /metrics (vLLM Prometheus text), GET /slots (llama.cpp server:
//                         `slots` slots, default 4, `running` of them processing) and
//                         GET /api/ps (Ollama: `running` models loaded) report; GET shows it
//
// Rules are matched first-in-first-used: the first rule whose model/path/method match and
// that has uses left decides the answer. Actions (all optional, combinable):
//   status, headers, body      fixed answer (body: object -> JSON, string -> raw, array of
//                              strings -> raw parts written chunk_delay_ms apart, default 20,
//                              so that they reach the client in separate reads); with a
//                              status >= 400 and no body, a wire-appropriate error body
//   headers (alone)            extra headers on the normal answer
//   delay_first_byte_ms        wait before the status line
//   delay_first_chunk_ms       send the headers, then wait before the first stream frame
//   chunk_delay_ms             wait between stream frames
//   chunks                     number of content pieces (default 5)
//   piece_bytes                each content piece padded with "x" to this many bytes (large
//                              answers and streams, OpenAI wire)
//   reset / reset_after_chunks destroy the socket before anything / after N content frames
//                              (closed with FIN; add rst: true for a TCP RST)
//   truncate_after_chunks      end the response cleanly after N content frames, without the
//                              final chunk, [DONE] or done:true
//   garbage / garbage_after_chunks   a non-JSON body (non-stream) or stream line
//   inject_frame, inject_after_frames   a stream: the raw string inject_frame is written after
//                              that many frames (lead and content frames counted; default 0,
//                              before the first), and the stream goes on as scripted
//   hang                       never answer
//   fixture                    a file under tests/fixtures (e.g. "openai/chat_stream.sse"),
//                              replayed as recorded: .json whole (application/json), .sse frame
//                              by frame and .ndjson line by line chunk_delay_ms apart (default
//                              20; each frame its own write), .txt whole (Prometheus text);
//                              status from action.status (default 200)
//   hold                       a name: wait (before delay_first_byte_ms) until POST
//                              /__mock/release names it, then answer as scripted; the record
//                              says held: true until then. An upstream made slow with no clock
//                              in it: a test asserts what happened while the answer was held
//   no_done                    an OpenAI-wire stream ends after its finish (and usage) chunk
//                              without data: [DONE] (EOF after a complete answer)
//   tool_calls                 "first" or "all": a chat request that carries tools (and no
//                              tool_choice "none", and whose last message is not a tool
//                              result) is answered with calls of its first tool, of every
//                              tool, or of the tool its tool_choice names, in the path's wire
//                              shape (OpenAI streams the arguments in two deltas per call);
//                              arguments from action.arguments[name] (default {})
//   error_after_chunks, fail_early, usage {cached, reasoning}   on /v1/responses (the
//                              Responses API natively): see openaiResponses
//   thinking                   text an Ollama chat answer thinks before it answers
//                              (message.thinking; streamed in two lines before the content)
//
// Structured output: a chat request with response_format json_schema / json_object (OpenAI
// wire) or format (Ollama) is answered with JSON: a minimal instance of the schema.
//   tool_calls (a list)        [{name, arguments}] (arguments: object or JSON text): the
//                              answer calls these tools (finish_reason tool_calls; streamed as
//                              the OpenAI wire does, each call's arguments in 3 deltas; Ollama:
//                              arguments as an object); no text beside them unless chunks says
//   reasoning                  text: the answer's reasoning_content (OpenAI wire; streamed in
//                              2 deltas before the content)
//   empty_tool_calls, stop_reason   chat answers as vLLM sends them (openaiChatScripted, which
//                              also takes tool_calls and reasoning then); on /v1/messages: thinking, tool_calls,
//                              stop_sequence, cache (anthropicMessages)
//
// This file only uses node: modules. Run `node tests/mock/engine.mjs --help`.

import fs from 'node:fs';
import http from 'node:http';
import nodePath from 'node:path';
import { fileURLToPath } from 'node:url';
import process from 'node:process';

const DEFAULT_CHUNKS = 5;
const EMBED_DIMS = 8;
const WORDS = ['says', 'hello', 'from', 'the', 'mock', 'engine'];
const CONTROL_PREFIX = '/__mock/';
const FIXTURES_DIR = nodePath.resolve(nodePath.dirname(fileURLToPath(import.meta.url)), '../fixtures');

// ---------------------------------------------------------------------------
// Deterministic content
// ---------------------------------------------------------------------------

/** The content pieces the mock streams for `model`: n pieces, the first is the model name. */
export function contentPieces(model, n = DEFAULT_CHUNKS) {
    const pieces = [];
    for (let i = 0; i < n; i++) {
        if (i === 0) pieces.push(String(model));
        else pieces.push(' ' + (WORDS[i - 1] ?? `w${i}`));
    }
    return pieces;
}

/** The full text the mock answers for `model` with n pieces (e.g. "m says hello from the"). */
export function contentFor(model, n = DEFAULT_CHUNKS) {
    return contentPieces(model, n).join('');
}

/** Deterministic embedding of one input string: EMBED_DIMS floats exactly representable in float32. */
export function embeddingFor(text) {
    let h = 2166136261;
    const s = String(text);
    for (let i = 0; i < s.length; i++) {
        h ^= s.charCodeAt(i);
        h = Math.imul(h, 16777619) >>> 0;
    }
    const v = [];
    for (let j = 0; j < EMBED_DIMS; j++) v.push((((h >>> (j % 24)) + j * 37) % 256) / 256 - 0.5);
    return v;
}

function wordCount(s) {
    if (typeof s !== 'string') return 0;
    const t = s.trim();
    return t ? t.split(/\s+/).length : 0;
}

/** Prompt "tokens" of a chat request: words of every message's text content (at least 1). */
function promptTokensChat(body) {
    let n = 0;
    for (const m of Array.isArray(body?.messages) ? body.messages : []) {
        if (typeof m?.content === 'string') n += wordCount(m.content);
        else if (Array.isArray(m?.content))
            for (const p of m.content) n += wordCount(p?.text);
    }
    return Math.max(n, 1);
}

function promptTokensText(input) {
    if (Array.isArray(input)) return Math.max(input.reduce((a, s) => a + wordCount(String(s)), 0), 1);
    return Math.max(wordCount(String(input ?? '')), 1);
}

function nowSec() {
    return Math.floor(Date.now() / 1000);
}

// ---------------------------------------------------------------------------
// Answers: each builder returns a plan { status, headers, json } for non-stream answers
// or { status, headers, stream: true, format, lead, content, tail } for streams, where
// lead/content/tail are arrays of wire strings (content = one frame per piece).
// ---------------------------------------------------------------------------

function sse(obj) {
    return `data: ${JSON.stringify(obj)}\n\n`;
}

function ndjson(obj) {
    return JSON.stringify(obj) + '\n';
}

/** How many pieces to produce: the scripted count, cut by the client's token limit. */
function pieceCount(action, limit) {
    const n = Number.isInteger(action.chunks) && action.chunks >= 0 ? action.chunks : DEFAULT_CHUNKS;
    if (Number.isInteger(limit) && limit >= 0 && limit < n) return { n: limit, finish: 'length' };
    return { n, finish: 'stop' };
}

/** One piece padded to action.piece_bytes, when asked for. */
function padPiece(p, action) {
    const size = action.piece_bytes;
    if (!Number.isInteger(size) || size <= 0 || p.length >= size) return p;
    return p + 'x'.repeat(size - p.length);
}

/** A read-only array of n items made on access: a large stream is not built up front. */
function lazyList(n, make) {
    return new Proxy([], {
        get(target, key) {
            if (key === 'length') return n;
            const i = typeof key === 'string' && /^\d+$/.test(key) ? Number(key) : -1;
            if (i >= 0) return i < n ? make(i) : undefined;
            return Reflect.get(target, key);
        },
    });
}

/** The tool calls a chat request gets under action.tool_calls, or null: [{ name, args }]. */
function toolCallsFor(body, action) {
    const mode = action.tool_calls;
    const tools = Array.isArray(body.tools) ? body.tools : [];
    if (typeof mode !== 'string' || !tools.length || body.tool_choice === 'none') return null;
    const msgs = Array.isArray(body.messages) ? body.messages : [];
    if (msgs.at(-1)?.role === 'tool') return null;
    const nameOf = (t) => t?.function?.name ?? t?.name;
    let names = mode === 'all' ? tools.map(nameOf) : [nameOf(tools[0])];
    const chosen = body.tool_choice?.function?.name;
    if (chosen) names = [chosen];
    return names.map((name) => ({ name, args: action.arguments?.[name] ?? {} }));
}

/** A minimal JSON instance of a JSON schema (objects, arrays, scalars, enums, anyOf). */
function instanceOf(schema, depth = 0) {
    if (!schema || typeof schema !== 'object' || depth > 8) return null;
    if (Array.isArray(schema.enum) && schema.enum.length) return schema.enum[0];
    if ('const' in schema) return schema.const;
    const alt = schema.anyOf ?? schema.oneOf;
    if (Array.isArray(alt) && alt.length) return instanceOf(alt[0], depth + 1);
    const type = Array.isArray(schema.type) ? schema.type.find((t) => t !== 'null') : schema.type;
    if (type === 'object' || schema.properties) {
        const out = {};
        for (const [k, v] of Object.entries(schema.properties ?? {})) out[k] = instanceOf(v, depth + 1);
        return out;
    }
    if (type === 'array') return schema.items ? [instanceOf(schema.items, depth + 1)] : [];
    if (type === 'string') return 'mock';
    if (type === 'integer' || type === 'number') return 1;
    if (type === 'boolean') return true;
    return null;
}

/** The JSON text a structured-output request is answered with, or null for free text. */
function structuredAnswer(body) {
    const rf = body.response_format;
    if (rf?.type === 'json_schema') return JSON.stringify(instanceOf(rf.json_schema?.schema));
    if (rf?.type === 'json_object') return '{"mock":true}';
    if (body.format === 'json') return '{"mock":true}';
    if (body.format && typeof body.format === 'object') return JSON.stringify(instanceOf(body.format));
    return null;
}

/** The JSON text split into n pieces (a stream of it). */
function splitText(text, n) {
    const size = Math.max(1, Math.ceil(text.length / n));
    const out = [];
    for (let i = 0; i < text.length; i += size) out.push(text.slice(i, i + size));
    return out;
}

function openaiToolCalls(ctx, calls) {
    const { body, seq } = ctx;
    const model = body.model ?? 'mock-model';
    const id = `chatcmpl-mock-${seq}`;
    const created = nowSec();
    const pt = promptTokensChat(body);
    const usage = { prompt_tokens: pt, completion_tokens: calls.length, total_tokens: pt + calls.length };
    const wire = calls.map((c, i) => ({ id: `call_mock_${seq}_${i}`, type: 'function',
        function: { name: c.name, arguments: JSON.stringify(c.args) } }));
    if (!body.stream) {
        return {
            status: 200,
            json: { id, object: 'chat.completion', created, model, system_fingerprint: 'fp_mock',
                choices: [{ index: 0, message: { role: 'assistant', content: null, refusal: null, tool_calls: wire },
                    logprobs: null, finish_reason: 'tool_calls' }], usage },
        };
    }
    const withUsage = body.stream_options?.include_usage === true;
    const chunk = (delta, finish) => sse({ id, object: 'chat.completion.chunk', created, model,
        choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }], ...(withUsage ? { usage: null } : {}) });
    const content = [];
    wire.forEach((w, i) => {
        const [a, b] = [w.function.arguments.slice(0, 1), w.function.arguments.slice(1)];
        content.push(chunk({ tool_calls: [{ index: i, id: w.id, type: 'function', function: { name: w.function.name, arguments: '' } }] }, null));
        content.push(chunk({ tool_calls: [{ index: i, function: { arguments: a } }] }, null));
        content.push(chunk({ tool_calls: [{ index: i, function: { arguments: b } }] }, null));
    });
    const tail = [chunk({}, 'tool_calls')];
    if (withUsage) tail.push(sse({ id, object: 'chat.completion.chunk', created, model, choices: [], usage }));
    tail.push('data: [DONE]\n\n');
    return { status: 200, stream: true, format: 'sse', lead: [chunk({ role: 'assistant', content: null }, null)], content, tail };
}

/** The scripted tool calls with their arguments as JSON text. */
function scriptedCalls(action) {
    if (!Array.isArray(action.tool_calls)) return [];
    return action.tool_calls.map((t, i) => ({
        id: `call_mock_${i}`,
        name: String(t.name),
        arguments: typeof t.arguments === 'string' ? t.arguments : JSON.stringify(t.arguments ?? {}),
    }));
}

/**
 * A chat answer with what the plain one lacks, as vLLM sends it: action.reasoning (a
 * reasoning_content text streamed before the answer), action.tool_calls ([{name, arguments}]:
 * each call's first fragment carries id and name, its arguments follow in three fragments;
 * finish_reason "tool_calls"), action.empty_tool_calls (every content delta also carries
 * `tool_calls: []`), action.stop_reason (vLLM's matched stop string on the final choice).
 */
function openaiChatScripted(ctx) {
    const { body, action, seq } = ctx;
    const model = body.model ?? 'mock-model';
    const limit = body.max_completion_tokens ?? body.max_tokens;
    const calls = Array.isArray(action.tool_calls) ? action.tool_calls : [];
    const { n, finish: textFinish } = pieceCount(action, limit);
    const pieces = contentPieces(model, calls.length ? Math.min(n, action.chunks ?? 0) : n);
    const finish = calls.length ? 'tool_calls' : textFinish;
    const id = `chatcmpl-mock-${seq}`;
    const created = nowSec();
    const usage = { prompt_tokens: promptTokensChat(body), completion_tokens: pieces.length + calls.length };
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    const toolId = (i) => `call_mock_${seq}_${i}`;
    const stopReason = action.stop_reason;
    if (!body.stream) {
        const message = { role: 'assistant', content: pieces.length ? pieces.join('') : null, refusal: null };
        if (action.reasoning) message.reasoning_content = action.reasoning;
        if (calls.length) {
            message.tool_calls = calls.map((c, i) => ({
                id: toolId(i), type: 'function', function: { name: c.name, arguments: c.arguments },
            }));
        }
        const choice = { index: 0, message, logprobs: null, finish_reason: finish };
        if (stopReason !== undefined) choice.stop_reason = stopReason;
        return { status: 200, json: { id, object: 'chat.completion', created, model, choices: [choice], usage } };
    }
    const chunk = (delta, finishReason, extra = {}) => sse({
        id, object: 'chat.completion.chunk', created, model,
        choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason, ...extra }],
    });
    const empty = action.empty_tool_calls ? { tool_calls: [] } : {};
    const content = [];
    for (const r of action.reasoning ? splitText(action.reasoning, 3) : []) content.push(chunk({ reasoning_content: r, ...empty }, null));
    for (const p of pieces) content.push(chunk({ content: p, ...empty }, null));
    calls.forEach((c, i) => {
        content.push(chunk({ tool_calls: [{ index: i, id: toolId(i), type: 'function', function: { name: c.name, arguments: '' } }] }, null));
        for (const a of splitText(c.arguments, 3)) content.push(chunk({ tool_calls: [{ index: i, function: { arguments: a } }] }, null));
    });
    const tail = [chunk({}, finish, stopReason !== undefined ? { stop_reason: stopReason } : {})];
    if (body.stream_options?.include_usage === true) tail.push(sse({ id, object: 'chat.completion.chunk', created, model, choices: [], usage }));
    tail.push('data: [DONE]\n\n');
    return { status: 200, stream: true, format: 'sse', lead: [chunk({ role: 'assistant', content: '' }, null)], content, tail };
}

function openaiChat(ctx) {
    const { body, action, seq } = ctx;
    const modeCalls = toolCallsFor(body, action);
    if (modeCalls) return openaiToolCalls(ctx, modeCalls);
    if (action.empty_tool_calls || action.stop_reason !== undefined) return openaiChatScripted(ctx);
    const calls = scriptedCalls(action);
    const reasoning = typeof action.reasoning === 'string' ? action.reasoning : null;
    const model = body.model ?? 'mock-model';
    const limit = body.max_completion_tokens ?? body.max_tokens;
    const counted = pieceCount(action, limit);
    const finish = counted.finish;
    const n = calls.length && action.chunks === undefined ? 0 : counted.n; /* calls alone, unless chunks says */
    const structured = structuredAnswer(body);
    const raw = structured !== null ? splitText(structured, n) : contentPieces(model, n);
    const pieces = action.piece_bytes ? lazyList(n, (i) => padPiece(raw[i], action)) : raw;
    const id = `chatcmpl-mock-${seq}`;
    const created = nowSec();
    const usage = {
        prompt_tokens: promptTokensChat(body),
        completion_tokens: n,
        total_tokens: promptTokensChat(body) + n,
    };
    const finishAll = calls.length ? 'tool_calls' : finish;
    if (!body.stream) {
        const message = { role: 'assistant', content: Array.from({ length: pieces.length }, (_, i) => pieces[i]).join(''), refusal: null, annotations: [] };
        if (calls.length) {
            if (!n) message.content = null;
            message.tool_calls = calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }));
        }
        if (reasoning !== null) message.reasoning_content = reasoning;
        return {
            status: 200,
            json: {
                id, object: 'chat.completion', created, model,
                choices: [{
                    index: 0,
                    message,
                    logprobs: null,
                    finish_reason: finishAll,
                }],
                usage,
                service_tier: 'default',
                system_fingerprint: 'fp_mock',
            },
        };
    }
    const withUsage = body.stream_options?.include_usage === true;
    const chunk = (delta, finishReason) => {
        const c = {
            id, object: 'chat.completion.chunk', created, model, system_fingerprint: 'fp_mock',
            choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
        };
        if (withUsage) c.usage = null;
        return sse(c);
    };
    const tail = [];
    calls.forEach((c, i) => {
        tail.push(chunk({ tool_calls: [{ index: i, id: c.id, type: 'function', function: { name: c.name, arguments: '' } }] }, null));
        for (const piece of splitText(c.arguments, 3)) tail.push(chunk({ tool_calls: [{ index: i, function: { arguments: piece } }] }, null));
    });
    tail.push(chunk({}, finishAll));
    if (withUsage) {
        tail.push(sse({ id, object: 'chat.completion.chunk', created, model, system_fingerprint: 'fp_mock', choices: [], usage }));
    }
    tail.push('data: [DONE]\n\n');
    const lead = [chunk({ role: 'assistant', content: '', refusal: null }, null)];
    if (reasoning !== null) for (const piece of splitText(reasoning, 2)) lead.push(chunk({ reasoning_content: piece }, null));
    return {
        status: 200, stream: true, format: 'sse',
        lead,
        content: lazyList(pieces.length, (i) => chunk({ content: pieces[i] }, null)),
        tail,
    };
}

function openaiCompletion(ctx) {
    const { body, action, seq } = ctx;
    const model = body.model ?? 'mock-model';
    const { n, finish } = pieceCount(action, body.max_tokens);
    const pieces = contentPieces(model, n);
    const id = `cmpl-mock-${seq}`;
    const created = nowSec();
    const pt = promptTokensText(body.prompt);
    const usage = { prompt_tokens: pt, completion_tokens: n, total_tokens: pt + n };
    if (!body.stream) {
        return {
            status: 200,
            json: {
                id, object: 'text_completion', created, model, system_fingerprint: 'fp_mock',
                choices: [{ text: pieces.join(''), index: 0, logprobs: null, finish_reason: finish }],
                usage,
            },
        };
    }
    const withUsage = body.stream_options?.include_usage === true;
    const chunk = (text, finishReason) => {
        const c = {
            id, object: 'text_completion', created, model, system_fingerprint: 'fp_mock',
            choices: [{ text, index: 0, logprobs: null, finish_reason: finishReason }],
        };
        if (withUsage) c.usage = null;
        return sse(c);
    };
    const tail = [chunk('', finish)];
    if (withUsage) tail.push(sse({ id, object: 'text_completion', created, model, choices: [], usage }));
    tail.push('data: [DONE]\n\n');
    return { status: 200, stream: true, format: 'sse', lead: [], content: pieces.map((p) => chunk(p, null)), tail };
}

function base64Floats(v) {
    const f = new Float32Array(v);
    return Buffer.from(f.buffer, f.byteOffset, f.byteLength).toString('base64');
}

function openaiEmbeddings(ctx) {
    const { body } = ctx;
    const model = body.model ?? 'mock-embed';
    const inputs = Array.isArray(body.input) ? body.input : [body.input ?? ''];
    const b64 = body.encoding_format === 'base64';
    const data = inputs.map((s, index) => {
        const v = embeddingFor(typeof s === 'string' ? s : JSON.stringify(s));
        return { object: 'embedding', index, embedding: b64 ? base64Floats(v) : v };
    });
    const pt = promptTokensText(inputs.map((s) => (typeof s === 'string' ? s : 'x')));
    return { status: 200, json: { object: 'list', data, model, usage: { prompt_tokens: pt, total_tokens: pt } } };
}

function openaiModels() {
    const created = 1700000000;
    return {
        status: 200,
        json: {
            object: 'list',
            data: ['mock-chat', 'mock-embed'].map((id) => ({ id, object: 'model', created, owned_by: 'mock' })),
        },
    };
}

function ollamaTimings(pt, n) {
    return {
        total_duration: 1000000 * (n + 1),
        load_duration: 1000,
        prompt_eval_count: pt,
        prompt_eval_duration: 100000,
        eval_count: n,
        eval_duration: 1000000 * n,
    };
}

function ollamaChat(ctx) {
    const { body, action } = ctx;
    const model = body.model ?? 'mock-model';
    const { n, finish } = pieceCount(action, body.options?.num_predict);
    const structured = structuredAnswer(body);
    const pieces = structured !== null ? splitText(structured, n) : contentPieces(model, n);
    const pt = promptTokensChat(body);
    const created_at = new Date().toISOString();
    const modeCalls = toolCallsFor(body, action)?.map((c) => ({ function: { name: c.name, arguments: c.args } }));
    const final = (content, extra = {}) => ({
        model, created_at, message: { role: 'assistant', content, ...extra },
        done_reason: finish, done: true, ...ollamaTimings(pt, modeCalls ? modeCalls.length : n),
    });
    if (modeCalls) {
        if (body.stream === false) return { status: 200, json: final('', { tool_calls: modeCalls }) };
        return {
            status: 200, stream: true, format: 'ndjson', lead: [],
            content: modeCalls.map((c) => ndjson({ model, created_at, message: { role: 'assistant', content: '', tool_calls: [c] }, done: false })),
            tail: [ndjson(final(''))],
        };
    }
    // scripted tool calls (a list): arguments as an object, all in one message after the text
    const toolCalls = scriptedCalls(action).map((c) => ({ function: { name: c.name, arguments: JSON.parse(c.arguments) } }));
    const thinking = typeof action.thinking === 'string' ? action.thinking : null;
    if (body.stream === false) {
        return { status: 200, json: final(pieces.join(''), {
            ...(thinking ? { thinking } : {}), ...(toolCalls.length ? { tool_calls: toolCalls } : {}) }) };
    }
    const thought = thinking ? splitText(thinking, 2).map((t) =>
        ndjson({ model, created_at, message: { role: 'assistant', content: '', thinking: t }, done: false })) : [];
    const tail = [];
    if (toolCalls.length) tail.push(ndjson({ model, created_at, message: { role: 'assistant', content: '', tool_calls: toolCalls }, done: false }));
    tail.push(ndjson(final('')));
    return {
        status: 200, stream: true, format: 'ndjson', lead: thought,
        content: pieces.map((p) => ndjson({ model, created_at, message: { role: 'assistant', content: p }, done: false })),
        tail,
    };
}

function ollamaGenerate(ctx) {
    const { body, action } = ctx;
    const model = body.model ?? 'mock-model';
    const { n, finish } = pieceCount(action, body.options?.num_predict);
    const pieces = contentPieces(model, n);
    const pt = promptTokensText(body.prompt);
    const created_at = new Date().toISOString();
    const final = (response) => ({
        model, created_at, response, done: true, done_reason: finish,
        context: [1, 2, 3], ...ollamaTimings(pt, n),
    });
    if (body.stream === false) return { status: 200, json: final(pieces.join('')) };
    return {
        status: 200, stream: true, format: 'ndjson', lead: [],
        content: pieces.map((p) => ndjson({ model, created_at, response: p, done: false })),
        tail: [ndjson(final(''))],
    };
}

function ollamaEmbed(ctx) {
    const { body } = ctx;
    const model = body.model ?? 'mock-embed';
    const inputs = Array.isArray(body.input) ? body.input : [body.input ?? ''];
    return {
        status: 200,
        json: {
            model,
            embeddings: inputs.map((s) => embeddingFor(String(s))),
            total_duration: 14143917,
            load_duration: 1019500,
            prompt_eval_count: promptTokensText(inputs),
        },
    };
}

function ollamaTags() {
    const modified_at = '2024-01-01T00:00:00Z';
    return {
        status: 200,
        json: {
            models: ['mock-chat:latest', 'mock-embed:latest'].map((name) => ({
                name, model: name, modified_at, size: 2019393189,
                digest: 'a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72',
                details: {
                    parent_model: '', format: 'gguf', family: 'llama', families: ['llama'],
                    parameter_size: '3.2B', quantization_level: 'Q4_K_M',
                },
            })),
        },
    };
}

// Engine load, as the gateway's load probes read it.
function defaultLoad() {
    return { running: 0, waiting: 0, kv_cache: 0, slots: 4 };
}

function vllmMetrics(ctx) {
    const { running, waiting, kv_cache: kv } = ctx.load;
    const labels = 'engine="0",model_name="mock-chat"';
    const gauge = (name, help, v) => `# HELP ${name} ${help}\n# TYPE ${name} gauge\n${name}{${labels}} ${Number(v).toFixed(1)}\n`;
    const text = '# HELP python_gc_objects_collected_total Objects collected during gc\n'
        + '# TYPE python_gc_objects_collected_total counter\n'
        + 'python_gc_objects_collected_total{generation="0"} 1234.0\n'
        + gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', running)
        + gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', waiting)
        + `# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n`
        + `# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{${labels}} ${kv}\n`
        + '# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n'
        + '# TYPE vllm:prompt_tokens_total counter\n'
        + `vllm:prompt_tokens_total{${labels}} 4096.0\n`;
    return { status: 200, text, contentType: 'text/plain; version=0.0.4; charset=utf-8' };
}

/**
 * Triton's metrics port (tritonserver --metrics-port, 8002 by default: a listener of its own,
 * GET /metrics only), as a TensorRT-LLM ensemble reports the load: the per-model queue
 * (nv_inference_pending_request_count: `waiting` on tensorrt_llm), the batch manager's
 * requests (nv_trt_llm_request_metrics: `running` scheduled and active) and its KV-cache
 * blocks (used / max = `kv_cache`). Shaped like tests/fixtures/triton/metrics_trtllm.txt.
 */
function tritonMetrics(load) {
    const { running, waiting, kv_cache: kv } = load;
    const models = ['ensemble', 'postprocessing', 'preprocessing', 'tensorrt_llm'];
    const lines = [];
    const family = (name, type, help) => lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    family('nv_inference_request_success', 'counter', 'Number of successful inference requests, all batch sizes');
    for (const m of models) lines.push(`nv_inference_request_success{model="${m}",version="1"} 1207`);
    family('nv_inference_pending_request_count', 'gauge',
        'Instantaneous number of pending requests awaiting execution per-model.');
    for (const m of models) {
        lines.push(`nv_inference_pending_request_count{model="${m}",version="1"} ${m === 'tensorrt_llm' ? waiting : 0}`);
    }
    family('nv_trt_llm_request_metrics', 'gauge', 'TRT LLM request metrics');
    for (const [type, v] of [['context', Math.min(running, 1)], ['scheduled', running], ['max', 64], ['active', running]]) {
        lines.push(`nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="${type}",version="1"} ${v}`);
    }
    family('nv_trt_llm_kv_cache_block_metrics', 'gauge', 'TRT LLM KV cache block metrics');
    const max = 2448, used = Math.round(kv * max);
    for (const [type, v] of [['tokens_per', 64], ['used', used], ['free', max - used], ['max', max]]) {
        lines.push(`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="${type}",model="tensorrt_llm",version="1"} ${v}`);
    }
    family('nv_gpu_utilization', 'gauge', 'GPU utilization rate [0.0 - 1.0)');
    lines.push(`nv_gpu_utilization{gpu_uuid="GPU-3d1f9c2e-7a51-4c8e-9a0b-5f2e6d7c8b91"} ${running ? 0.93 : 0}`);
    return lines.join('\n') + '\n';
}

function llamaSlots(ctx) {
    const { running, slots } = ctx.load;
    const n = Math.max(slots, running);
    const json = [];
    for (let id = 0; id < n; id++) {
        const busy = id < running;
        json.push({
            id, id_task: busy ? 100 + id : -1, n_ctx: 4096, speculative: false, is_processing: busy,
            params: { n_predict: -1, temperature: 0.8, stream: true },
            next_token: { has_next_token: true, has_new_line: false, n_remain: -1, n_decoded: busy ? 7 : 0, stopping_word: '' },
        });
    }
    return { status: 200, json };
}

function ollamaPs(ctx) {
    const models = [];
    for (let i = 0; i < ctx.load.running; i++) {
        const name = i === 0 ? 'mock-chat:latest' : `mock-chat-${i}:latest`;
        models.push({
            name, model: name, size: 2019393189, digest: 'a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72',
            details: { parent_model: '', format: 'gguf', family: 'llama', families: ['llama'], parameter_size: '3.2B', quantization_level: 'Q4_K_M' },
            expires_at: '2030-01-01T00:00:00Z', size_vram: 2019393189,
        });
    }
    return { status: 200, json: { models } };
}

/**
 * Anthropic's Messages API (POST /v1/messages), as api.anthropic.com answers it: the text
 * pieces of the plain answer as one text block (max_tokens below the piece count: stop_reason
 * max_tokens), after action.thinking ({thinking, signature}: a thinking block, its signature
 * byte for byte) and before action.tool_calls ([{name, input}]: tool_use blocks, stop_reason
 * tool_use); action.stop_sequence: stop_reason stop_sequence with that string;
 * action.cache ({read, write}): cache token counts. Streams are the event sequence with a
 * ping, input_json_delta in three fragments per tool.
 */
function anthropicMessages(ctx) {
    const { body, action, seq } = ctx;
    const model = body.model ?? 'mock-model';
    const calls = Array.isArray(action.tool_calls) ? action.tool_calls : [];
    const { n, finish } = pieceCount(action, body.max_tokens);
    const pieces = contentPieces(model, n);
    const id = `msg_mock_${seq}`;
    const stopReason = calls.length ? 'tool_use' : action.stop_sequence ? 'stop_sequence'
        : finish === 'length' ? 'max_tokens' : 'end_turn';
    const stopSequence = action.stop_sequence ?? null;
    const input = promptTokensAnthropic(body);
    const usage = {
        input_tokens: input, output_tokens: n + calls.length,
        cache_creation_input_tokens: action.cache?.write ?? 0, cache_read_input_tokens: action.cache?.read ?? 0,
    };
    const toolId = (i) => `toolu_mock_${seq}_${i}`;
    const blocks = [];
    if (action.thinking) blocks.push({ type: 'thinking', thinking: action.thinking.thinking, signature: action.thinking.signature });
    if (pieces.length) blocks.push({ type: 'text', text: pieces.join('') });
    calls.forEach((c, i) => blocks.push({ type: 'tool_use', id: toolId(i), name: c.name, input: c.input }));
    if (!body.stream) {
        return {
            status: 200,
            json: { id, type: 'message', role: 'assistant', model, content: blocks, stop_reason: stopReason, stop_sequence: stopSequence, usage },
        };
    }
    const ev = (type, obj) => `event: ${type}\ndata: ${JSON.stringify({ type, ...obj })}\n\n`;
    const lead = [
        ev('message_start', { message: { id, type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage: { ...usage, output_tokens: 1 } } }),
        ev('ping', {}),
    ];
    const content = [];
    let index = 0;
    if (action.thinking) {
        content.push(ev('content_block_start', { index, content_block: { type: 'thinking', thinking: '', signature: '' } }));
        for (const t of splitText(action.thinking.thinking, 3)) content.push(ev('content_block_delta', { index, delta: { type: 'thinking_delta', thinking: t } }));
        content.push(ev('content_block_delta', { index, delta: { type: 'signature_delta', signature: action.thinking.signature } }));
        content.push(ev('content_block_stop', { index }));
        index++;
    }
    if (pieces.length) {
        content.push(ev('content_block_start', { index, content_block: { type: 'text', text: '' } }));
        for (const p of pieces) content.push(ev('content_block_delta', { index, delta: { type: 'text_delta', text: p } }));
        content.push(ev('content_block_stop', { index }));
        index++;
    }
    calls.forEach((c, i) => {
        content.push(ev('content_block_start', { index, content_block: { type: 'tool_use', id: toolId(i), name: c.name, input: {} } }));
        for (const a of splitText(JSON.stringify(c.input), 3)) content.push(ev('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: a } }));
        content.push(ev('content_block_stop', { index }));
        index++;
    });
    const tail = [
        ev('message_delta', { delta: { stop_reason: stopReason, stop_sequence: stopSequence }, usage: { output_tokens: usage.output_tokens } }),
        ev('message_stop', {}),
    ];
    return { status: 200, stream: true, format: 'sse', lead, content, tail };
}

/** Prompt "tokens" of a Responses request: words of a string input, or of every text part. */
function promptTokensResponses(body) {
    if (typeof body.input === 'string') return Math.max(wordCount(body.input), 1);
    let n = wordCount(body.instructions);
    for (const item of Array.isArray(body.input) ? body.input : []) {
        if (typeof item?.content === 'string') n += wordCount(item.content);
        else if (Array.isArray(item?.content)) for (const p of item.content) n += wordCount(p?.text);
    }
    return Math.max(n, 1);
}

/**
 * POST /v1/responses, the Responses API answered natively (OpenAI's own shape and event
 * order: response.created, response.in_progress, output_item.added, content_part.added,
 * output_text.delta..., output_text.done, content_part.done, output_item.done,
 * response.completed). The Response echoes the request's parameters as OpenAI's does
 * (instructions, previous_response_id, store, reasoning, tools, metadata, ...), so a test
 * sees what reached the engine in the answer too. Actions: chunks, usage {cached,
 * reasoning} (input_tokens_details.cached_tokens, output_tokens_details.reasoning_tokens),
 * error_after_chunks N (an `error` event after N deltas, then EOF), fail_early (a stream:
 * response.created, response.in_progress, then response.failed; whole: status "failed").
 */
function openaiResponses(ctx) {
    const { body, action, seq } = ctx;
    const model = body.model ?? 'mock-model';
    const { n } = pieceCount(action, body.max_output_tokens);
    const pieces = contentPieces(model, n);
    const text = pieces.join('');
    const id = `resp_mock_${seq}`;
    const msgId = `msg_mock_${seq}`;
    const input = promptTokensResponses(body);
    const cached = action.usage?.cached ?? 0;
    const reasoning = action.usage?.reasoning ?? 0;
    const usage = {
        input_tokens: input, input_tokens_details: { cached_tokens: cached },
        output_tokens: n + reasoning, output_tokens_details: { reasoning_tokens: reasoning },
        total_tokens: input + n + reasoning,
    };
    const echo = (k, dflt) => (body[k] !== undefined ? body[k] : dflt);
    const response = (status, output, u, error = null) => ({
        id, object: 'response', created_at: nowSec(), status, background: false, error,
        incomplete_details: null, instructions: echo('instructions', null),
        max_output_tokens: echo('max_output_tokens', null), model, output,
        parallel_tool_calls: echo('parallel_tool_calls', true),
        previous_response_id: echo('previous_response_id', null),
        reasoning: echo('reasoning', { effort: null, summary: null }), store: echo('store', true),
        temperature: echo('temperature', 1), text: echo('text', { format: { type: 'text' } }),
        tool_choice: echo('tool_choice', 'auto'), tools: echo('tools', []), top_p: echo('top_p', 1),
        truncation: echo('truncation', 'disabled'), usage: u, user: echo('user', null),
        metadata: echo('metadata', {}),
    });
    const part = (t) => ({ type: 'output_text', annotations: [], logprobs: [], text: t });
    const message = { id: msgId, type: 'message', status: 'completed', role: 'assistant', content: [part(text)] };
    const failure = { code: 'server_error', message: 'mock: the response failed' };
    if (!body.stream) {
        if (action.fail_early) return { status: 200, json: response('failed', [], null, failure) };
        return { status: 200, json: response('completed', [message], usage) };
    }
    let sequence = 0;
    const ev = (type, obj) => `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence++, ...obj })}\n\n`;
    const lead = [
        ev('response.created', { response: response('in_progress', [], null) }),
        ev('response.in_progress', { response: response('in_progress', [], null) }),
    ];
    if (action.fail_early) {
        lead.push(ev('response.failed', { response: response('failed', [], null, failure) }));
        return { status: 200, stream: true, format: 'sse', lead, content: [], tail: [] };
    }
    const where = { item_id: msgId, output_index: 0, content_index: 0 };
    lead.push(ev('response.output_item.added', { output_index: 0, item: { ...message, status: 'in_progress', content: [] } }));
    lead.push(ev('response.content_part.added', { ...where, part: part('') }));
    const cut = action.error_after_chunks;
    const content = [];
    for (let i = 0; i < pieces.length && (cut === undefined || i < cut); i++)
        content.push(ev('response.output_text.delta', { ...where, delta: pieces[i], logprobs: [], obfuscation: 'mock' }));
    if (cut !== undefined) {
        content.push(ev('error', { code: 'server_error', message: 'mock: the stream failed', param: null }));
        return { status: 200, stream: true, format: 'sse', lead, content, tail: [] };
    }
    const tail = [
        ev('response.output_text.done', { ...where, text, logprobs: [] }),
        ev('response.content_part.done', { ...where, part: part(text) }),
        ev('response.output_item.done', { output_index: 0, item: message }),
        ev('response.completed', { response: response('completed', [message], usage) }),
    ];
    return { status: 200, stream: true, format: 'sse', lead, content, tail };
}

/** Prompt "tokens" of a Messages request: words of the system prompt and every text block. */
function promptTokensAnthropic(body) {
    let n = 0;
    const text = (c) => {
        if (typeof c === 'string') n += wordCount(c);
        else if (Array.isArray(c)) for (const b of c) n += wordCount(b?.text);
    };
    text(body?.system);
    for (const m of Array.isArray(body?.messages) ? body.messages : []) text(m?.content);
    return Math.max(n, 1);
}

/**
 * Triton's generate extension (POST /v2/models/{model}/generate and generate_stream), as a
 * TensorRT-LLM ensemble answers it: {model_name, model_version, text_output}; the stream is
 * one SSE `data:` answer per piece and simply ends (no end marker). action.finish_reason /
 * action.token_counts add the vLLM backend's optional finish_reason and num_*_tokens outputs
 * (on the last piece of a stream). max_tokens below the piece count cuts the answer.
 * action.error_after_chunks: a stream's {"error": ...} event after that many pieces.
 */
function tritonGenerate(ctx) {
    const { body, action, model } = ctx;
    const { n } = pieceCount(action, body.max_tokens);
    const pieces = contentPieces(model, n);
    const base = { model_name: model, model_version: '1' };
    const counts = (i) => (action.token_counts
        ? { num_input_tokens: wordCount(String(body.text_input ?? '')) || 1, num_output_tokens: i } : {});
    const finish = (last) => (last && action.finish_reason ? { finish_reason: action.finish_reason } : {});
    if (!ctx.stream) {
        return { status: 200, json: { ...base, text_output: pieces.join(''), ...finish(true), ...counts(n) } };
    }
    const content = pieces.map((p, i) => {
        const last = i === pieces.length - 1;
        return `data: ${JSON.stringify({ ...base, text_output: p, ...finish(last), ...(last ? counts(n) : {}) })}\n\n`;
    });
    if (action.error_after_chunks !== undefined) {
        content.splice(action.error_after_chunks, content.length,
            `data: ${JSON.stringify({ error: 'mock triton: inference failed' })}\n\n`);
    }
    return { status: 200, stream: true, format: 'sse', lead: [], content, tail: [] };
}

/** The model of a Triton path (/v2/models/{model}/...), or null. */
function tritonModel(path) {
    const m = /^\/v2\/models\/([^/]+)\/(generate|generate_stream)$/.exec(path);
    return m ? { model: decodeURIComponent(m[1]), stream: m[2] === 'generate_stream' } : null;
}

const ROUTES = {
    'GET /v2/health/ready': () => ({ status: 200, text: '', contentType: 'text/plain' }),
    'POST /v1/messages': anthropicMessages,
    'POST /v1/responses': openaiResponses,
    'GET /v1/models': openaiModels,
    'GET /metrics': vllmMetrics,
    'GET /slots': llamaSlots,
    'GET /api/ps': ollamaPs,
    'POST /v1/chat/completions': openaiChat,
    'POST /v1/completions': openaiCompletion,
    'POST /v1/embeddings': openaiEmbeddings,
    'POST /api/chat': ollamaChat,
    'POST /api/generate': ollamaGenerate,
    'POST /api/embed': ollamaEmbed,
    'POST /api/embeddings': ollamaEmbed,
    'GET /api/tags': ollamaTags,
};

function isOllamaPath(path) {
    return path.startsWith('/api/') || path.startsWith('/v2/'); /* Triton's errors: {"error": text} too */
}

/** An error body in the shape the path's wire uses. */
function errorBody(path, status, message) {
    if (isOllamaPath(path)) return { error: message };
    if (path === '/v1/messages') {
        const type = status === 429 ? 'rate_limit_error' : status === 529 ? 'overloaded_error'
            : status === 401 ? 'authentication_error' : status >= 500 ? 'api_error' : 'invalid_request_error';
        return { type: 'error', error: { type, message } };
    }
    const type = status === 429 ? 'rate_limit_error'
        : status === 401 ? 'authentication_error'
        : status >= 500 ? 'server_error' : 'invalid_request_error';
    const code = status === 429 ? 'rate_limit_exceeded' : status === 401 ? 'invalid_api_key' : null;
    return { error: { message, type, param: null, code } };
}

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

/**
 * Create a mock engine. Returns { server, listen(port, host) -> Promise<port>, close() }.
 * Options: { log: function(line) } for debug output (default none).
 */
export function createMock(options = {}) {
    const state = { seq: 0, ruleSeq: 0, rules: [], records: [], live: new Set(), load: defaultLoad(),
                    holds: new Map() }; // hold name -> { open, waiting: [resolve] }
    const server = http.createServer({ keepAlive: true, noDelay: true, requestTimeout: 0, headersTimeout: 60000 });
    server.keepAliveTimeout = 60000;
    server.maxRequestsPerSocket = 0;

    server.on('request', (req, res) => {
        const chunks = [];
        req.on('data', (c) => chunks.push(c));
        req.on('end', () => {
            const raw = Buffer.concat(chunks);
            const url = new URL(req.url, 'http://mock');
            if (url.pathname.startsWith(CONTROL_PREFIX)) {
                handleControl(state, req, res, url, raw);
                return;
            }
            handleEngine(state, req, res, url, raw);
        });
        req.on('error', () => {});
    });
    server.on('clientError', (err, socket) => {
        if (socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n');
        else socket.destroy();
    });

    // Triton's metrics port: GET /metrics only, on a listener of its own (listenMetrics)
    const metricsServer = http.createServer((req, res) => {
        const path = new URL(req.url, 'http://mock').pathname;
        req.resume();
        if (req.method !== 'GET' || path !== '/metrics') {
            res.writeHead(404, { 'Content-Type': 'text/plain' });
            res.end('404 page not found\n');
            return;
        }
        const text = tritonMetrics(state.load);
        res.writeHead(200, { 'Content-Type': 'text/plain; charset=utf-8', 'Content-Length': Buffer.byteLength(text) });
        res.end(text);
    });

    return {
        server,
        state,
        /** Start Triton's metrics port (GET /metrics in Triton's text, from the load). */
        listenMetrics(port = 0, host = '127.0.0.1') {
            return new Promise((resolve, reject) => {
                metricsServer.once('error', reject);
                metricsServer.listen(port, host, () => resolve(metricsServer.address().port));
            });
        },
        listen(port = 0, host = '127.0.0.1') {
            return new Promise((resolve, reject) => {
                server.once('error', reject);
                server.listen(port, host, () => resolve(server.address().port));
            });
        },
        close() {
            for (const t of state.live) t.cancel();
            server.closeAllConnections?.();
            metricsServer.closeAllConnections?.();
            if (metricsServer.listening) metricsServer.close();
            return new Promise((resolve) => server.close(() => resolve()));
        },
    };
}

function sendJson(res, status, obj, headers = {}) {
    const s = JSON.stringify(obj);
    res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(s), ...headers });
    res.end(s);
}

function handleControl(state, req, res, url, raw) {
    const what = `${req.method} ${url.pathname}`;
    if (what === 'POST /__mock/script') {
        let spec;
        try {
            spec = JSON.parse(raw.toString('utf8') || '{}');
        } catch {
            sendJson(res, 400, { error: 'script body is not JSON' });
            return;
        }
        const list = Array.isArray(spec) ? spec : [spec];
        const ids = [];
        for (const r of list) {
            const rule = {
                id: ++state.ruleSeq,
                model: r.model,
                path: r.path,
                method: r.method,
                times: Number.isInteger(r.times) ? r.times : Infinity,
                used: 0,
                action: r.action ?? {},
            };
            state.rules.push(rule);
            ids.push(rule.id);
        }
        sendJson(res, 200, { ok: true, ids });
        return;
    }
    if (what === 'GET /__mock/requests') {
        const since = Number(url.searchParams.get('since') ?? 0);
        const path = url.searchParams.get('path');
        const list = state.records.filter((r) => r.seq > since && (!path || r.path === path));
        sendJson(res, 200, list);
        return;
    }
    if (what === 'GET /__mock/rules') {
        sendJson(res, 200, state.rules.map((r) => ({ ...r, times: r.times === Infinity ? null : r.times })));
        return;
    }
    if (what === 'POST /__mock/release') {
        let spec;
        try {
            spec = JSON.parse(raw.toString('utf8') || '{}');
        } catch {
            spec = null;
        }
        if (typeof spec?.hold !== 'string' || !spec.hold) {
            sendJson(res, 400, { error: 'release needs {"hold": "name"}' });
            return;
        }
        const h = holdOf(state, spec.hold);
        h.open = true;
        const waiting = h.waiting.splice(0);
        for (const resolve of waiting) resolve();
        sendJson(res, 200, { ok: true, released: waiting.length });
        return;
    }
    if (what === 'POST /__mock/reset') {
        for (const h of state.holds.values()) for (const resolve of h.waiting.splice(0)) resolve();
        state.holds = new Map();
        state.rules = [];
        state.records = [];
        state.load = defaultLoad();
        sendJson(res, 200, { ok: true });
        return;
    }
    if (what === 'POST /__mock/load' || what === 'GET /__mock/load') {
        if (req.method === 'POST') {
            let spec;
            try {
                spec = JSON.parse(raw.toString('utf8') || '{}');
            } catch {
                sendJson(res, 400, { error: 'load body is not JSON' });
                return;
            }
            for (const k of ['running', 'waiting', 'kv_cache', 'slots']) {
                if (spec?.[k] === undefined) continue;
                if (typeof spec[k] !== 'number' || !(spec[k] >= 0)) {
                    sendJson(res, 400, { error: `load.${k} must be a number >= 0` });
                    return;
                }
                state.load[k] = spec[k];
            }
        }
        sendJson(res, 200, state.load);
        return;
    }
    sendJson(res, 404, { error: `unknown control endpoint ${what}` });
}

function holdOf(state, name) {
    if (!state.holds.has(name)) state.holds.set(name, { open: false, waiting: [] });
    return state.holds.get(name);
}

function matchRule(state, method, path, model) {
    for (const r of state.rules) {
        if (r.used >= r.times) continue;
        if (r.path !== undefined && r.path !== path) continue;
        if (r.method !== undefined && r.method !== method) continue;
        if (r.model !== undefined && r.model !== model) continue;
        r.used++;
        return r;
    }
    return null;
}

/** A request in flight: timers that die with the connection, and its record. */
class Task {
    constructor(state, req, res, record) {
        this.state = state;
        this.req = req;
        this.res = res;
        this.record = record;
        this.timers = new Set();
        this.dead = false;
        this.byMock = false;
        state.live.add(this);
        res.on('finish', () => this.finish());
        res.on('close', () => {
            if (!this.record.finished && !this.byMock) this.record.closed_early = true;
            this.end();
        });
    }

    finish() {
        this.record.finished = true;
        this.end();
    }

    end() {
        if (this.record.ended_at === null) this.record.ended_at = Date.now();
        this.cancel();
    }

    cancel() {
        this.dead = true;
        for (const t of this.timers) clearTimeout(t);
        this.timers.clear();
        this.state.live.delete(this);
    }

    /** Resolves when the response's socket takes more, or when the connection died. */
    drained() {
        if (this.dead) return Promise.resolve();
        return new Promise((resolve) => {
            const done = () => {
                this.res.off('drain', done);
                this.res.off('close', done);
                resolve();
            };
            this.res.on('drain', done);
            this.res.on('close', done);
        });
    }

    /** Resolves when hold `name` is released (at once if it was), or when the connection died. */
    hold(name) {
        const h = holdOf(this.state, name);
        if (h.open || this.dead) return Promise.resolve();
        this.record.held = true;
        return new Promise((resolve) => {
            const done = () => {
                this.record.held = false;
                this.res.off('close', done);
                resolve();
            };
            h.waiting.push(done);
            this.res.on('close', done);
        });
    }

    /** Resolves after ms, or never when the connection died meanwhile (callers check dead). */
    sleep(ms) {
        if (!ms || ms <= 0) return Promise.resolve();
        return new Promise((resolve) => {
            const t = setTimeout(() => {
                this.timers.delete(t);
                resolve();
            }, ms);
            this.timers.add(t);
        });
    }

    /**
     * Destroy the socket on purpose (a reset the mock was told to do). By default the socket is
     * closed (FIN) without finishing the response, as when an engine process dies; with rst
     * a TCP RST is sent instead (the peer may then lose data it had not read yet).
     */
    reset(rst = false) {
        this.byMock = true;
        this.record.reset_by_mock = true;
        const sock = this.res.socket;
        if (rst && sock?.resetAndDestroy) sock.resetAndDestroy();
        else sock?.destroy();
        this.res.destroy();
    }
}

async function handleEngine(state, req, res, url, raw) {
    const path = url.pathname;
    const text = raw.toString('utf8');
    let body = text.length ? text : null;
    let parsed = null;
    if (text.length) {
        try {
            parsed = JSON.parse(text);
            body = parsed;
        } catch {
            parsed = null;
        }
    }
    const triton = tritonModel(path);
    const model = triton ? triton.model : parsed && typeof parsed === 'object' ? parsed.model : undefined;
    const rule = matchRule(state, req.method, path, model);
    const record = {
        seq: ++state.seq,
        method: req.method,
        path,
        query: url.search,
        headers: req.headers,
        body,
        raw: text.length <= 65536 ? text : undefined, // the bytes, for what JSON.parse loses (64-bit integers)
        rule: rule ? rule.id : null,
        closed_early: false,
        finished: false,
        started_at: Date.now(),
        ended_at: null,
    };
    state.records.push(record);
    const task = new Task(state, req, res, record);
    const action = rule ? rule.action : {};
    try {
        await respond(task, action, path, parsed, text, req.method);
    } catch (err) {
        if (!task.dead) {
            if (!res.headersSent) sendJson(res, 500, errorBody(path, 500, `mock error: ${err.message}`));
            else res.destroy();
        }
    }
}

async function respond(task, action, path, parsed, text, method) {
    const { res } = task;
    if (action.hang) return; // never answer; the record shows closed_early when the client leaves
    if (typeof action.hold === 'string') {
        await task.hold(action.hold);
        if (task.dead) return;
    }
    if (action.reset) {
        await task.sleep(action.delay_first_byte_ms);
        if (!task.dead) task.reset(action.rst === true);
        return;
    }
    await task.sleep(action.delay_first_byte_ms);
    if (task.dead) return;

    const extra = action.headers ?? {};
    if (typeof action.fixture === 'string') {
        await sendFixture(task, action, extra);
        return;
    }
    if (Array.isArray(action.body)) {
        await sendParts(task, action, extra);
        return;
    }
    if (action.status !== undefined || action.body !== undefined) {
        const status = action.status ?? 200;
        let body = action.body;
        if (body === undefined) body = status >= 400 ? errorBody(path, status, `mock scripted status ${status}`) : {};
        const s = typeof body === 'string' ? body : JSON.stringify(body);
        res.writeHead(status, {
            'Content-Type': typeof body === 'string' ? 'text/plain' : 'application/json',
            'Content-Length': Buffer.byteLength(s),
            ...extra,
        });
        res.end(s);
        return;
    }

    const triton = method === 'POST' ? tritonModel(path) : null;
    const builder = triton ? (ctx) => tritonGenerate({ ...ctx, ...triton }) : ROUTES[`${method} ${path}`];
    if (!builder) {
        const known = Object.keys(ROUTES).some((k) => k.endsWith(' ' + path));
        const status = known ? 405 : 404;
        sendJson(res, status, errorBody(path, status, `mock: no route ${method} ${path}`), extra);
        return;
    }
    if (method === 'POST' && (parsed === null || typeof parsed !== 'object')) {
        sendJson(res, 400, errorBody(path, 400, 'mock: request body is not a JSON object'), extra);
        return;
    }
    const plan = builder({ body: parsed ?? {}, action, seq: task.record.seq, load: task.state.load });

    if (action.garbage && !plan.stream) {
        const g = '<html>this is not json</html>\n';
        res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(g), ...extra });
        res.end(g);
        return;
    }
    if (plan.text !== undefined) {
        res.writeHead(plan.status, { 'Content-Type': plan.contentType, 'Content-Length': Buffer.byteLength(plan.text), ...extra });
        res.end(plan.text);
        return;
    }
    if (!plan.stream) {
        await sendWhole(task, plan, action, extra);
        return;
    }
    await sendStream(task, plan, action, extra);
}

/** A fixed raw answer in parts (chunked), each part its own write, chunk_delay_ms apart. */
async function sendParts(task, action, extra) {
    const { res } = task;
    res.writeHead(action.status ?? 200, { 'Content-Type': 'text/plain', ...extra });
    res.flushHeaders();
    const gap = action.chunk_delay_ms ?? 20;
    for (let i = 0; i < action.body.length; i++) {
        if (i > 0) await task.sleep(gap);
        if (task.dead) return;
        res.write(String(action.body[i]));
    }
    res.end();
}

/** A recorded fixture file's bytes: what the file holds, only cut into its frames (the
 * mock adds nothing, so a test sees exactly what the recorded server sent). */
export function fixtureFrames(name) {
    const file = nodePath.resolve(FIXTURES_DIR, name);
    if (!file.startsWith(FIXTURES_DIR + nodePath.sep)) throw new Error(`fixture outside tests/fixtures: ${name}`);
    const text = fs.readFileSync(file, 'utf8');
    if (name.endsWith('.sse')) return { type: 'text/event-stream; charset=utf-8', frames: text.split(/(?<=\n\n)/) };
    if (name.endsWith('.ndjson')) return { type: 'application/x-ndjson', frames: text.split(/(?<=\n)/) };
    if (name.endsWith('.json')) return { type: 'application/json', whole: text };
    return { type: 'text/plain; version=0.0.4; charset=utf-8', whole: text };
}

async function sendFixture(task, action, extra) {
    const { res } = task;
    const f = fixtureFrames(action.fixture);
    const status = action.status ?? 200;
    if (f.whole !== undefined) {
        res.writeHead(status, { 'Content-Type': f.type, 'Content-Length': Buffer.byteLength(f.whole), ...extra });
        res.end(f.whole);
        return;
    }
    res.writeHead(status, { 'Content-Type': f.type, 'Cache-Control': 'no-cache', ...extra });
    res.flushHeaders();
    const gap = action.chunk_delay_ms ?? 20;
    for (let i = 0; i < f.frames.length; i++) {
        if (i > 0) await task.sleep(gap);
        if (task.dead) return;
        res.write(f.frames[i]);
    }
    res.end();
}

/** A non-stream answer, possibly cut: reset/truncate send the first half of the JSON. */
async function sendWhole(task, plan, action, extra) {
    const { res } = task;
    const s = JSON.stringify(plan.json);
    if (action.reset_after_chunks !== undefined || action.truncate_after_chunks !== undefined) {
        res.writeHead(plan.status, { 'Content-Type': 'application/json', ...extra });
        res.write(s.slice(0, Math.floor(s.length / 2)));
        await task.sleep(action.chunk_delay_ms ?? 20);
        if (task.dead) return;
        if (action.reset_after_chunks !== undefined) task.reset(action.rst === true);
        else res.end();
        return;
    }
    res.writeHead(plan.status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(s), ...extra });
    res.end(s);
}

async function sendStream(task, plan, action, extra) {
    const { res } = task;
    const sseFormat = plan.format === 'sse';
    res.writeHead(plan.status, {
        'Content-Type': sseFormat ? 'text/event-stream; charset=utf-8' : 'application/x-ndjson',
        'Cache-Control': 'no-cache',
        ...extra,
    });
    res.flushHeaders();
    const garbageLine = sseFormat ? 'data: {this is not json\n\n' : '{this is not json\n';
    const garbageAt = action.garbage ? 0 : action.garbage_after_chunks;
    const gap = action.chunk_delay_ms ?? 0;
    let sentAny = false;
    let frames = 0;
    const injectAt = typeof action.inject_frame === 'string' ? (action.inject_after_frames ?? 0) : -1;
    const write = async (frame, delay) => {
        if (sentAny || action.delay_first_chunk_ms) await task.sleep(sentAny ? delay : action.delay_first_chunk_ms);
        if (task.dead) return false;
        if (frames++ === injectAt) res.write(action.inject_frame);
        // a full socket blocks the producer, as an engine's would: a client that does not
        // read (or a gateway that paused) stops the stream instead of filling our memory
        if (!res.write(frame)) await task.drained();
        sentAny = true;
        return !task.dead;
    };

    if (garbageAt === 0) {
        if (!(await write(garbageLine, gap))) return;
        res.end();
        return;
    }
    for (const f of plan.lead) if (!(await write(f, gap))) return;
    for (let i = 0; i < plan.content.length; i++) {
        if (action.reset_after_chunks === i) {
            await task.sleep(gap);
            if (!task.dead) task.reset(action.rst === true);
            return;
        }
        if (action.truncate_after_chunks === i) {
            await task.sleep(gap);
            if (!task.dead) res.end();
            return;
        }
        if (garbageAt === i) {
            if (!(await write(garbageLine, gap))) return;
            res.end();
            return;
        }
        if (!(await write(plan.content[i], gap))) return;
    }
    const n = plan.content.length;
    if (action.reset_after_chunks !== undefined && action.reset_after_chunks >= n) {
        await task.sleep(gap);
        if (!task.dead) task.reset(action.rst === true);
        return;
    }
    if (action.truncate_after_chunks !== undefined && action.truncate_after_chunks >= n) {
        await task.sleep(gap);
        if (!task.dead) res.end();
        return;
    }
    if (garbageAt !== undefined && garbageAt >= n) {
        if (!(await write(garbageLine, gap))) return;
        res.end();
        return;
    }
    for (const f of plan.tail) {
        if (action.no_done && f === 'data: [DONE]\n\n') continue;
        if (!(await write(f, gap))) return;
    }
    res.end();
}

// ---------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------

const USAGE = `usage: node tests/mock/engine.mjs [--port N] [--host 127.0.0.1] [--demo]

A scriptable mock model engine (OpenAI wire under /v1, Ollama API under /api).
  --port N     port to listen on (0 = any free port; default 0)
  --host H     address to bind (default 127.0.0.1)
  --demo       say loudly on stderr that this is a demo engine with canned answers
  --exit-with-stdin  exit when standard input closes (for test harnesses)
  --metrics-port N   also listen there as Triton's metrics port (GET /metrics in Triton's
               Prometheus text, from the load; 0 = any free port)
On start it prints one JSON line to stdout: {"mock":"listening","port":N} (with
"metrics_port":M when --metrics-port was given).
Control API: POST /__mock/script, GET /__mock/requests, GET /__mock/rules, POST /__mock/reset,
POST /__mock/load.`;

function parseArgs(argv) {
    const opts = { port: 0, host: '127.0.0.1', demo: false, exitWithStdin: false, metricsPort: null };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        if (a === '--port') opts.port = Number(argv[++i]);
        else if (a.startsWith('--port=')) opts.port = Number(a.slice(7));
        else if (a === '--host') opts.host = argv[++i];
        else if (a.startsWith('--host=')) opts.host = a.slice(7);
        else if (a === '--demo') opts.demo = true;
        else if (a === '--exit-with-stdin') opts.exitWithStdin = true;
        else if (a === '--metrics-port') opts.metricsPort = Number(argv[++i]);
        else if (a === '--help' || a === '-h') {
            process.stdout.write(USAGE + '\n');
            process.exit(0);
        } else {
            process.stderr.write(`mock: unknown argument ${a}\n${USAGE}\n`);
            process.exit(2);
        }
    }
    if (!Number.isInteger(opts.port) || opts.port < 0 || opts.port > 65535) {
        process.stderr.write(`mock: bad --port\n`);
        process.exit(2);
    }
    return opts;
}

async function main() {
    const opts = parseArgs(process.argv.slice(2));
    const mock = createMock();
    let port;
    try {
        port = await mock.listen(opts.port, opts.host);
    } catch (err) {
        process.stderr.write(`mock: cannot listen on ${opts.host}:${opts.port}: ${err.message}\n`);
        process.exit(1);
    }
    if (opts.demo) {
        const bar = '='.repeat(72);
        process.stderr.write(
            `\n${bar}\n` +
            '  DEMO ENGINE - this is moongate\'s mock engine, NOT a language model.\n' +
            '  Every answer is canned and deterministic (it echoes the model name).\n' +
            `  OpenAI wire: http://${opts.host}:${port}/v1\n` +
            `  Ollama API:  http://${opts.host}:${port}\n` +
            `${bar}\n\n`);
    }
    let metricsPort;
    if (opts.metricsPort !== null) {
        try {
            metricsPort = await mock.listenMetrics(opts.metricsPort, opts.host);
        } catch (err) {
            process.stderr.write(`mock: cannot listen on ${opts.host}:${opts.metricsPort}: ${err.message}\n`);
            process.exit(1);
        }
    }
    process.stdout.write(JSON.stringify({ mock: 'listening', port, ...(metricsPort ? { metrics_port: metricsPort } : {}) }) + '\n');
    const stop = () => {
        mock.close().then(() => process.exit(0));
        setTimeout(() => process.exit(0), 500).unref();
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
    if (opts.exitWithStdin) {
        // the parent holds the other end: when it goes away (even killed), so does the mock
        process.stdin.on('end', stop);
        process.stdin.on('error', stop);
        process.stdin.resume();
    }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) main();
