// Validate what the gateway returns against the official OpenAI OpenAPI schemas
// (tests/conformance/openai-schemas.json: the schemas the tests use, extracted with their
// source commit and licence; see tests/conformance/README.md).
// The document still carries OpenAPI 3.0 `nullable: true`: it is rewritten to add null to the
// type (and to the enum). A missing document is an error, never a skip.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { REPO_ROOT } from './harness.mjs';

export const OPENAPI_PATH = process.env.MOONGATE_OPENAPI ||
    path.join(REPO_ROOT, 'tests/conformance/openai-schemas.json');

export const SCHEMAS = [
    'CreateChatCompletionResponse',
    'CreateChatCompletionStreamResponse',
    'CreateCompletionResponse',
    'CreateEmbeddingResponse',
    'ListModelsResponse',
    'ErrorResponse',
];

const DOC_ID = 'https://moongate.test/openai-openapi.json';

/** Rewrite `nullable: true` (OpenAPI 3.0) into JSON Schema 2020-12, in place, recursively. */
export function convertNullable(node) {
    if (Array.isArray(node)) {
        for (let i = 0; i < node.length; i++) node[i] = convertNullable(node[i]);
        return node;
    }
    if (!node || typeof node !== 'object') return node;
    for (const k of Object.keys(node)) node[k] = convertNullable(node[k]);
    if (node.nullable !== true) {
        if ('nullable' in node) delete node.nullable;
        return node;
    }
    delete node.nullable;
    if (Array.isArray(node.enum) && !node.enum.includes(null)) node.enum.push(null);
    if (typeof node.type === 'string') {
        node.type = [node.type, 'null'];
        return node;
    }
    if (Array.isArray(node.type)) {
        if (!node.type.includes('null')) node.type.push('null');
        return node;
    }
    for (const key of ['anyOf', 'oneOf']) {
        if (Array.isArray(node[key])) {
            if (!node[key].some((s) => s && s.type === 'null')) node[key].push({ type: 'null' });
            return node;
        }
    }
    if (node.$ref || node.allOf) {
        // wrap: the referenced schema itself must not be changed (other users are not nullable)
        const inner = {};
        for (const k of ['$ref', 'allOf']) {
            if (k in node) {
                inner[k] = node[k];
                delete node[k];
            }
        }
        node.anyOf = [inner, { type: 'null' }];
        return node;
    }
    // no type at all: anything goes already, null included
    return node;
}

let cached = null;

function load() {
    if (cached) return cached;
    if (!fs.existsSync(OPENAPI_PATH)) {
        throw new Error(`conformance: the OpenAI schemas are missing at ${OPENAPI_PATH} ` +
            '(it must be present: conformance tests never skip)');
    }
    const doc = JSON.parse(fs.readFileSync(OPENAPI_PATH, 'utf8'));
    const schemas = doc?.components?.schemas;
    if (!schemas) throw new Error(`conformance: ${OPENAPI_PATH} has no components.schemas`);
    convertNullable(schemas);
    const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: true, logger: false });
    addFormats(ajv);
    // OpenAPI formats that JSON Schema does not know: accept them (they only annotate).
    const known = new Set(Object.keys(ajv.formats));
    const seen = new Set();
    (function walk(n) {
        if (Array.isArray(n)) n.forEach(walk);
        else if (n && typeof n === 'object') {
            if (typeof n.format === 'string') seen.add(n.format);
            for (const v of Object.values(n)) walk(v);
        }
    })(schemas);
    for (const f of seen) if (!known.has(f)) ajv.addFormat(f, true);
    ajv.addSchema({ $id: DOC_ID, components: { schemas } });
    const validators = {};
    for (const name of SCHEMAS) {
        if (!schemas[name]) throw new Error(`conformance: schema ${name} not found in ${OPENAPI_PATH}`);
        const v = ajv.getSchema(`${DOC_ID}#/components/schemas/${name}`);
        if (!v) throw new Error(`conformance: cannot compile ${name}`);
        validators[name] = v;
    }
    cached = { ajv, validators, schemas };
    return cached;
}

/** Validate obj against a component schema; returns { ok, errors: [strings] }. */
export function validate(name, obj) {
    const { validators, ajv } = load();
    let v = validators[name];
    if (!v) {
        v = ajv.getSchema(`${DOC_ID}#/components/schemas/${name}`);
        if (!v) throw new Error(`conformance: unknown schema ${name}`);
        validators[name] = v;
    }
    const ok = v(obj);
    const errors = ok ? [] : (v.errors ?? []).map((e) => `${e.instancePath || '/'} ${e.message}` +
        (e.params && Object.keys(e.params).length ? ` ${JSON.stringify(e.params)}` : ''));
    return { ok, errors };
}

/** Assert that obj conforms to the named OpenAI schema, with a readable failure. */
export function assertConforms(name, obj, what = '') {
    const { ok, errors } = validate(name, obj);
    assert.ok(ok, `${what || 'object'} does not conform to OpenAI ${name}:\n  ` +
        errors.slice(0, 15).join('\n  ') + `\nobject: ${JSON.stringify(obj).slice(0, 2000)}`);
}
