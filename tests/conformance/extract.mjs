// Extract the OpenAI schemas the tests validate against, with every schema they reference,
// from the official OpenAPI document into openai-schemas.json beside this file.
//
//   node tests/conformance/extract.mjs path/to/openai-openapi.json
//
// The source is the public repository openai/openai-openapi (see README.md here for the
// commit); the output keeps the schemas as they are (nullable included: the test library
// rewrites it at load).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOTS = [
    'CreateChatCompletionResponse',
    'CreateChatCompletionStreamResponse',
    'CreateCompletionResponse',
    'CreateEmbeddingResponse',
    'ListModelsResponse',
    'ErrorResponse',
    // the Responses API (POST /v1/responses and its stream)
    'CreateResponse',
    'Response',
    'ResponseStreamEvent',
    'ResponseItemList',
];

const src = process.argv[2];
if (!src) {
    console.error('usage: node tests/conformance/extract.mjs OPENAPI.json');
    process.exit(2);
}
const doc = JSON.parse(fs.readFileSync(src, 'utf8'));
const all = doc.components.schemas;
const keep = new Map();
const prefix = '#/components/schemas/';
function visit(name) {
    if (keep.has(name)) return;
    if (!all[name]) throw new Error(`schema ${name} is not in ${src}`);
    keep.set(name, all[name]);
    (function walk(n) {
        if (Array.isArray(n)) n.forEach(walk);
        else if (n && typeof n === 'object') {
            if (typeof n.$ref === 'string' && n.$ref.startsWith(prefix)) visit(n.$ref.slice(prefix.length));
            for (const v of Object.values(n)) walk(v);
        }
    })(all[name]);
}
ROOTS.forEach(visit);
const names = [...keep.keys()].sort();
const out = {
    source: 'openai/openai-openapi, commit f85dbe223d40 (2026-08-21), MIT licence: openai-openapi.LICENSE',
    roots: ROOTS,
    components: { schemas: Object.fromEntries(names.map((n) => [n, keep.get(n)])) },
};
const dest = path.join(path.dirname(fileURLToPath(import.meta.url)), 'openai-schemas.json');
fs.writeFileSync(dest, JSON.stringify(out, null, 1) + '\n');
console.log(`${names.length} schemas -> ${dest}`);
