// The SDK suite's common ground (tests/e2e/sdk_*.test.mjs): one gateway and mock for a test
// file, a logical model per adapter, the mock's expected answers, and the faults scripted
// the same way for every SDK. Each SDK's file makes the same calls through its own client.

import { contentFor, embeddingFor } from '../../mock/engine.mjs';
import { startEnv, waitFor } from './harness.mjs';

export { contentFor, embeddingFor };

// The adapters under test: a logical chat and embedding model each, one route apiece.
export const ADAPTERS = {
    openai: { chat: 'sdk-openai', up: 'up-sdk-openai', embed: 'sdk-openai-embed', upEmbed: 'up-sdk-openai-embed' },
    ollama: { chat: 'sdk-ollama', up: 'up-sdk-ollama', embed: 'sdk-ollama-embed', upEmbed: 'up-sdk-ollama-embed' },
};

// A whole (non-stream) answer slower than the first-byte timeout must still arrive.
export const FIRST_BYTE_MS = 1500; // roomy: a loaded machine must not time out a normal stream
export const SLOW_ANSWER_MS = 2200;

export const PNG_DATA_URL = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
export const IMAGE_URL = 'https://example.invalid/cat.png';

/** Start the mock and the gateway for one SDK's file. */
export async function startSdkEnv() {
    const models = {};
    for (const a of Object.values(ADAPTERS)) {
        const provider = a === ADAPTERS.openai ? 'mock-openai' : 'mock-ollama';
        models[a.chat] = { routes: [{ provider, model: a.up }] };
        models[a.embed] = { routes: [{ provider, model: a.upEmbed }] };
    }
    const env = await startEnv({ extraModels: models, timeouts: { first_byte_ms: FIRST_BYTE_MS } });
    env.api = `${env.gw.base}/v1`;
    return env;
}

/** The path the adapter's engine serves chat on. */
export function chatPath(adapter) {
    return adapter === 'openai' ? '/v1/chat/completions' : '/api/chat';
}

/** Script the mock for the next chat request of the adapter's model. */
export function scriptChat(env, adapter, action, times = 1) {
    return env.mock.script({ model: ADAPTERS[adapter].up, times, action });
}

/** The upstream's own 400, in its wire shape (OpenAI: code and param; Ollama: a message). */
export function upstream400(adapter) {
    return adapter === 'openai'
        ? { status: 400, body: { error: { message: 'This model\'s maximum context length is 8 tokens.',
            type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' } } }
        : { status: 400, body: { error: 'model context length exceeded' } };
}

/** The requests of a logical model the gateway refused (encode refusals) so far; with
 * atLeast, once that many were logged (a client throws after its last try, so every try it
 * made is logged by then). */
export async function refusedRequests(env, model, atLeast = 0) {
    const count = () => env.gw.logs.filter((l) => l.msg === 'request' && l.model === model &&
        l.fail_reason === 'refused').length;
    await waitFor(() => count() >= atLeast, { timeoutMs: 5000, what: `${atLeast} refused requests` });
    return count();
}


/** Chat requests the mock saw for the adapter's model. */
export async function upstreamChats(env, adapter) {
    return env.mock.requests((r) => r.path === chatPath(adapter) && r.body?.model === ADAPTERS[adapter].up);
}

/** Wait until the mock saw the last chat request of the adapter's model closed early. */
export function waitUpstreamClosed(env, adapter) {
    return waitFor(async () => (await upstreamChats(env, adapter)).at(-1)?.closed_early === true,
        { timeoutMs: 5000, what: 'the upstream request closed by the gateway' });
}

export const TOOLS_JSON = {
    weather: { description: 'The weather in a city', parameters: { type: 'object',
        properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false } },
    clock: { description: 'The time in a city', parameters: { type: 'object',
        properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false } },
};
export const TOOL_ARGS = { weather: { city: 'Paris' }, clock: { city: 'Oslo' } };
