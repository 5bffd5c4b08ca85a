// /api/v2/usage/events, the dashboard's request log (issue 22): each filter alone and in
// combination returns exactly the events that match, newest first, and paging with the
// cursor (with full pages and with the short pages of a small scan window) covers them once.
//
// The events are written straight into the gateway's store with the sqlite3 shell (a known
// set: every mix of tenant, key, project, model, provider and status, one second apart), and
// every answer is checked against the same filter applied in JavaScript, so a filter the
// query builder (core/store/sqlq.h, core/admin/stats.c) dropped or mis-bound fails here.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { adminCall, startEnv } from './lib/harness.mjs';

const ADMIN_TOKEN = 'adm-usage-events-token-77c1';
const STATUSES = ['succeeded', 'failed', 'cancelled', 'timed_out'];
const BASE_MS = Date.UTC(2026, 0, 10, 12, 0, 0);
let env;
const events = []; // as inserted, oldest first

const admin = (p) => adminCall(env.base, ADMIN_TOKEN, 'GET', p);

before(async () => {
    env = await startEnv({
        configure: (c) => ({ ...c, auth: { enabled: true }, health: { probes: false }, usage: { retention_days: 3650 } }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN },
    });
    const rows = [];
    for (let i = 0; i < 240; i++) {
        const e = {
            request_id: `evt-${i}`,
            at_ms: BASE_MS + i * 1000,
            tenant_id: [7, 8][i % 2],
            key_id: [null, 1, 2, 3][i % 4],
            project_id: [null, 10, 11][i % 3],
            logical_model: ['m-a', 'm-b', 'm-c', null, 'm-a'][i % 5],
            provider_id: ['p-x', 'p-y', 'p-z'][(i >> 1) % 3],
            // mostly succeeded, as in traffic; every other status present
            status: i % 7 === 3 ? STATUSES[1 + (i % 3)] : 'succeeded',
        };
        events.push(e);
        const v = (x) => (x === null ? 'NULL' : typeof x === 'number' ? String(x) : `'${x}'`);
        rows.push(`(${v(e.request_id)}, ${e.at_ms}, 'chat', ${v(e.tenant_id)}, ${v(e.project_id)}, ${v(e.key_id)},`
            + ` ${v(e.logical_model)}, ${v(e.provider_id)}, ${v(e.status)})`);
    }
    execFileSync('sqlite3', ['-cmd', '.timeout 5000', env.config.storage.path,
        'INSERT INTO usage_events(request_id, at_ms, endpoint, tenant_id, project_id, key_id, logical_model,'
        + ` provider_id, status) VALUES ${rows.join(',')};`]);
});

after(async () => {
    await env?.close();
});

/** Every page of the listing with query q: the request ids in order, and the pages. */
async function all(q, limit) {
    const ids = [];
    let cursor = null;
    let pages = 0;
    for (;;) {
        const r = await admin(`usage/events?${q}&limit=${limit}${cursor ? `&cursor=${cursor}` : ''}`);
        assert.equal(r.status, 200, r.text);
        assert.ok(r.json.data.length <= limit);
        ids.push(...r.json.data.map((e) => e.request_id));
        pages++;
        assert.ok(pages < 500, 'paging ends');
        if (!r.json.has_more) {
            assert.equal(r.json.next_cursor, null);
            return { ids, pages };
        }
        assert.ok(r.json.next_cursor, 'has_more comes with a cursor');
        cursor = r.json.next_cursor;
    }
}

/** The events the filters select, newest first (what the listing must answer). */
function expected(f) {
    const idEq = (want, got) => (String(want) === '0' ? got === null : got === Number(want));
    return events.filter((e) =>
        (f.tenant_id === undefined || e.tenant_id === Number(f.tenant_id))
        && (f.key_id === undefined || idEq(f.key_id, e.key_id))
        && (f.project_id === undefined || idEq(f.project_id, e.project_id))
        && (f.model === undefined || e.logical_model === f.model)
        && (f.provider === undefined || e.provider_id === f.provider)
        && (f.status === undefined || e.status === f.status)
        && (f.request_id === undefined || e.request_id === f.request_id)
        && (f.from === undefined || e.at_ms >= f.from * 1000)
        && (f.to === undefined || e.at_ms < f.to * 1000))
        .map((e) => e.request_id).reverse();
}

const qs = (f) => new URLSearchParams(Object.entries(f).map(([k, v]) => [k, String(v)])).toString();
const t = (i) => Math.floor((BASE_MS + i * 1000) / 1000);

const cases = [
    {},
    { tenant_id: 8 },
    { key_id: 2 }, { key_id: 0 },
    { project_id: 11 }, { project_id: 0 },
    { model: 'm-a' }, { model: 'm-c' }, { model: 'nope' },
    { provider: 'p-y' },
    ...STATUSES.map((status) => ({ status })),
    { request_id: 'evt-117' }, { request_id: 'evt-none' },
    { from: t(50) }, { to: t(50) }, { from: t(100), to: t(130) },
    { key_id: 1, model: 'm-a' },
    { tenant_id: 7, project_id: 10, provider: 'p-z' },
    { status: 'failed', key_id: 0 }, { status: 'succeeded', model: 'm-b', provider: 'p-x' },
    { key_id: 3, project_id: 0, model: 'm-b', provider: 'p-x', status: 'succeeded', tenant_id: 8, from: t(10), to: t(230) },
];

describe('usage/events filters', () => {
    test('the inserted events are all there, newest first', async () => {
        const r = await all('', 1000);
        assert.deepEqual(r.ids, expected({}));
        assert.equal(r.ids.length, 240);
    });

    for (const f of cases) {
        test(`filter ${qs(f) || '(none)'}: exactly the matching events, in pages`, async () => {
            const want = expected(f);
            // one page holding them all, pages of 7, and pages of 5 over a scan window of 13
            assert.deepEqual((await all(qs(f), 1000)).ids, want, 'one page');
            const seven = await all(qs(f), 7);
            assert.deepEqual(seven.ids, want, 'pages of 7');
            assert.equal(seven.pages, Math.max(1, Math.ceil(want.length / 7)), 'full pages: no empty last page');
            assert.deepEqual((await all(`${qs(f)}&scan=13`, 5)).ids, want, 'pages of 5, 13 events examined a page');
        });
    }

    test('a rare filter under a small scan window: short pages that go on, none lost', async () => {
        const r = await admin('usage/events?request_id=evt-3&scan=1');
        assert.deepEqual(r.json.data.map((e) => e.request_id), ['evt-3'], 'one request is found whatever the window');
        const first = await admin('usage/events?model=m-c&limit=50&scan=10');
        assert.equal(first.status, 200);
        assert.ok(first.json.data.length <= 2, 'at most the matches of the newest 10 events');
        assert.equal(first.json.has_more, true);
        assert.match(first.json.next_cursor, /^\d+$/);
    });

    test('bad parameters are 400s', async () => {
        for (const q of ['status=ok', 'limit=0', 'limit=1001', 'scan=0', 'scan=100001', 'scan=x', 'key_id=abc', 'from=yesterday']) {
            const r = await admin(`usage/events?${q}`);
            assert.equal(r.status, 400, `${q}: ${r.text}`);
            assert.equal(r.json.error.code, 'INVALID_REQUEST');
        }
    });
});
