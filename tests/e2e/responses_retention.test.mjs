// Stored Responses on disk (issue 20): protocols.responses_retention_seconds sets how long a
// stored Response is kept (a reload applies to the next ones); a stored Response survives a
// restart (GET and previous_response_id after it), one past its retention is 404 and pruned
// at start-up; the rows are keyed by the time-ordered number in the id (store migration 22).
// Driven by the official openai SDK; the rows are read with the sqlite3 shell.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { sqliteRows, startEnv, startGateway, waitFor } from './lib/harness.mjs';

let env;
let client;
let db;

before(async () => {
    env = await startEnv({
        configure(config) {
            config.protocols = { ...(config.protocols ?? {}), responses_retention_seconds: 120 };
            return config;
        },
    });
    db = env.config.storage.path;
    client = new OpenAI({ baseURL: env.api, apiKey: 'sk-retention', maxRetries: 0, timeout: 15000 });
});

after(async () => {
    await env?.close();
});

const rowOf = (id) => sqliteRows(db, `SELECT rid, created_at, expires_at, id FROM responses WHERE id = '${id}'`)[0];
const committed = (id) => waitFor(async () => rowOf(id), { timeoutMs: 5000, intervalMs: 50, what: `row of ${id}` });

test('the configured retention, a reload\'s for the next Responses, restarts and expiry', async () => {
    const first = await client.responses.create({ model: 'chat', input: 'remember the number 7' });
    let row = await committed(first.id);
    assert.equal(row.expires_at - row.created_at, 120, 'protocols.responses_retention_seconds');
    assert.equal(BigInt(row.rid), BigInt('0x' + first.id.slice(5, 21)), 'the row key is the id\'s first 16 hex digits');

    env.writeConfig({ ...env.config, protocols: { ...env.config.protocols, responses_retention_seconds: 7200 } });
    await env.gw.reload();
    const second = await client.responses.create({ model: 'chat', input: 'and the number 8', previous_response_id: first.id });
    row = await committed(second.id);
    assert.equal(row.expires_at - row.created_at, 7200, 'the reload\'s retention');
    assert.ok(BigInt(row.rid) > BigInt(rowOf(first.id).rid), 'keys grow in time order');
    assert.equal(rowOf(first.id).expires_at - rowOf(first.id).created_at, 120, 'stored ones keep theirs');

    // a restart on the same database: both are still there; the first made to have expired
    await env.gw.close();
    sqliteRows(db, `UPDATE responses SET expires_at = created_at - 1 WHERE id = '${first.id}'`);
    env.gw = await startGateway(env.configPath);
    client = new OpenAI({ baseURL: `${env.gw.base}/v1`, apiKey: 'sk-retention', maxRetries: 0, timeout: 15000 });
    const again = await client.responses.retrieve(second.id);
    assert.equal(again.id, second.id);
    assert.equal(again.output_text, second.output_text);
    const third = await client.responses.create({ model: 'chat', input: 'what numbers?', previous_response_id: second.id });
    const items = await client.responses.inputItems.list(third.id);
    assert.ok(items.data.length >= 1);
    await assert.rejects(client.responses.retrieve(first.id), (e) => e.status === 404, 'past its retention: 404');
    await waitFor(async () => !rowOf(first.id), { timeoutMs: 5000, intervalMs: 50, what: 'the expired row pruned at start-up' });
    assert.ok(rowOf(second.id), 'the live one is kept');
});
