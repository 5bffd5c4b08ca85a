// config/grafana/moongate.json and config/prometheus/alerts.yml against the real gateway:
// the dashboard is checked against Grafana's JSON model (tests/fixtures/grafana), every
// panel query parses as PromQL (promtool check rules on them as recording rules), and every
// metric the dashboard and the alerts name is one a live gateway exposes, after traffic.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Ajv from 'ajv';
import { REPO_ROOT, startEnv, postJson, postStream } from './lib/harness.mjs';

const dashboard = JSON.parse(fs.readFileSync(path.join(REPO_ROOT, 'config/grafana/moongate.json'), 'utf8'));
const schema = JSON.parse(fs.readFileSync(path.join(REPO_ROOT, 'tests/fixtures/grafana/dashboard.schema.json'), 'utf8'));
const alerts = fs.readFileSync(path.join(REPO_ROOT, 'config/prometheus/alerts.yml'), 'utf8');

const queries = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr })));

/** A panel query with Grafana's variables replaced by what they stand for. */
function concrete(expr) {
    return expr.replaceAll('$__rate_interval', '5m').replace(/\$\{?(instance|model|provider)\}?/g, '.*');
}

/** The metric families an expression names (moongate_, sidecar_, gen_ai_). */
function metricNames(expr) {
    const names = new Set();
    for (const m of expr.matchAll(/\b((?:moongate|sidecar|gen_ai)_[a-z0-9_]+)/g))
        names.add(m[1].replace(/_(bucket|sum|count)$/, ''));
    return names;
}

let env;

before(async () => {
    env = await startEnv({});
});

after(async () => {
    await env?.close();
});

describe('grafana dashboard and alert rules', () => {
    test('the dashboard is a Grafana dashboard JSON model', () => {
        const ajv = new Ajv({ allErrors: true, strict: false });
        const validate = ajv.compile(schema);
        assert.ok(validate(dashboard), JSON.stringify(validate.errors, null, 2));
        const ids = dashboard.panels.map((p) => p.id);
        assert.equal(new Set(ids).size, ids.length, 'panel ids are unique');
        // no two panels share a grid cell, none runs past the 24 columns
        const cells = new Set();
        for (const p of dashboard.panels) {
            const g = p.gridPos;
            assert.ok(g.x + g.w <= 24, `${p.title} fits the width`);
            for (let x = g.x; x < g.x + g.w; x++)
                for (let y = g.y; y < g.y + g.h; y++) {
                    assert.ok(!cells.has(`${x},${y}`), `${p.title} overlaps another panel at ${x},${y}`);
                    cells.add(`${x},${y}`);
                }
        }
        // the variables the queries use are defined
        const vars = new Set(dashboard.templating.list.map((v) => v.name));
        for (const q of queries)
            for (const m of q.expr.matchAll(/\$\{?([A-Za-z_][A-Za-z0-9_]*)/g))
                if (!m[1].startsWith('__')) assert.ok(vars.has(m[1]), `${q.panel}: $${m[1]} is a dashboard variable`);
        // what the issue asks it to show
        const all = queries.map((q) => q.expr).join('\n');
        for (const want of ['moongate_requests_total', 'status=~"5..', 'moongate_request_duration_seconds_bucket',
            'moongate_first_token_latency_seconds_bucket', 'moongate_tokens_total', 'moongate_cost_total',
            'moongate_queue_length', 'sidecar_provider_cooldown_active', 'sidecar_provider_requests_total'])
            assert.ok(all.includes(want), `a panel shows ${want}`);
    });

    test('every panel query is valid PromQL', () => {
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moongate-dash-'));
        try {
            const rules = ['groups:', '  - name: dashboard', '    rules:'];
            queries.forEach((q, i) => {
                rules.push(`      - record: dashboard:query_${i}`);
                rules.push(`        expr: ${JSON.stringify(concrete(q.expr))}`);
            });
            const file = path.join(dir, 'queries.yml');
            fs.writeFileSync(file, rules.join('\n') + '\n');
            const r = spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8', timeout: 20000 });
            assert.equal(r.status, 0, `${r.stdout}${r.stderr}`);
            assert.match(r.stdout, new RegExp(`SUCCESS: ${queries.length} rules found`));
        } finally {
            fs.rmSync(dir, { recursive: true, force: true });
        }
    });

    test('every metric the dashboard and the alerts name is on a live gateway', async () => {
        assert.equal((await postJson(`${env.api}/chat/completions`, { model: 'chat', messages: [{ role: 'user', content: 'hi' }] })).status, 200);
        assert.equal((await postStream(`${env.api}/chat/completions`, { model: 'chat', stream: true, messages: [{ role: 'user', content: 'hi' }] })).status, 200);
        const text = await env.gw.metrics();
        const exposed = new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]));
        const named = new Set();
        for (const q of queries) for (const n of metricNames(q.expr)) named.add(n);
        for (const n of metricNames(alerts)) named.add(n);
        for (const v of dashboard.templating.list) if (typeof v.definition === 'string') for (const n of metricNames(v.definition)) named.add(n);
        assert.ok(named.size > 20, `${named.size} metrics named`);
        // gen_ai_request_model and the like are label names, not metrics
        const labelNames = new Set([...text.matchAll(/[{,]([a-zA-Z_][a-zA-Z0-9_]*)="/g)].map((m) => m[1]));
        for (const n of named) if (!labelNames.has(n)) assert.ok(exposed.has(n), `${n} is exposed`);
    });
});
