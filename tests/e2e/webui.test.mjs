// The WebUI in a real browser (issue 22): Debian's headless Chromium driven by playwright-core
// (pinned in tests/package.json; scripts/setup installs chromium). Sign in through the password
// field, the cookie's flags as the browser stores them, nothing in localStorage, live numbers
// moving as traffic flows, a 429 at the mock turning a provider card to "cooling down" with a
// countdown that moves, clearing it, the request just made in the live tail, adding a provider
// (its test result shown) and disabling it, a write without the CSRF token refused, a tenant
// admin seeing only its tenant, a 401 returning to the sign-in page, sign-out. Screenshots of
// each page go to build/webui-screenshots/.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { gatewayBin, startEnv, postJson, waitFor } from './lib/harness.mjs';
import { withSession } from './lib/dashboard.mjs';

const ADMIN_TOKEN = 'adm-webui-e2e-token-93be';
const CHROMIUM = process.env.MOONGATE_CHROMIUM || '/usr/bin/chromium';
const SHOTS = path.join(path.dirname(gatewayBin()), 'webui-screenshots'); // under the build folder
const messages = [{ role: 'user', content: 'browser' }];

let env;
let browser;
let key;
let tenantA;
let tenantB;
let tenantToken;

function bearer(method, p, body) {
    return withSession(env.base, method, p, { body, headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
}

function chat(k = key) {
    return postJson(`${env.api}/chat/completions`, { model: 'chat', messages }, { headers: { authorization: `Bearer ${k}` } });
}

async function shot(page, name) {
    fs.mkdirSync(SHOTS, { recursive: true });
    await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
}

/** A new browser context and page; console errors other than failed loads are collected. */
async function newPage(viewport = { width: 1280, height: 900 }) {
    const context = await browser.newContext({ viewport });
    const page = await context.newPage();
    page.errors = [];
    page.on('pageerror', (e) => page.errors.push(e.message));
    return { context, page };
}

async function signInAs(page, token) {
    await page.goto(`${env.base}/`);
    assert.equal(new URL(page.url()).pathname, '/api/dashboard', 'GET / redirects to the dashboard');
    await page.locator('#signin').waitFor({ state: 'visible', timeout: 10000 });
    await page.fill('#token', token);
    await page.click('#signin button[type=submit]');
    await page.locator('#who').filter({ hasText: /admin/ }).waitFor({ timeout: 10000 });
}

/** Text of a locator once pred(text) holds (bounded). */
async function textWhen(locator, pred, what, timeoutMs = 8000) {
    return waitFor(async () => {
        const t = (await locator.count()) ? await locator.first().textContent() : null;
        return t !== null && pred(t) ? t : null;
    }, { timeoutMs, what });
}

before(async () => {
    assert.ok(fs.existsSync(CHROMIUM), `${CHROMIUM} is missing: scripts/setup installs Debian's chromium`);
    env = await startEnv({
        configure: (c) => ({
            ...c, auth: { enabled: true }, health: { probes: false },
            dashboard: { stream_interval_ms: 250 },
        }),
        env: { MOONGATE_ADMIN_TOKEN: ADMIN_TOKEN, MOONGATE_ENCRYPTION_KEY: 'ab'.repeat(32) },
    });
    tenantA = (await bearer('POST', '/api/v2/tenants', { name: 'browser-a' })).json.id;
    tenantB = (await bearer('POST', '/api/v2/tenants', { name: 'browser-b' })).json.id;
    key = (await bearer('POST', '/api/v2/keys', { tenant_id: tenantA, name: 'key-a' })).json.key;
    await bearer('POST', '/api/v2/keys', { tenant_id: tenantB, name: 'key-b' });
    tenantToken = (await bearer('POST', '/api/v2/admin-tokens', { tenant_id: tenantA, name: 'browser' })).json.token;
    assert.ok(key && tenantToken);
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
});

after(async () => {
    await browser?.close().catch(() => {});
    await env?.close();
});

describe('the dashboard in Chromium', { timeout: 120000 }, () => {
    let ctx;
    let page;

    before(async () => {
        ({ context: ctx, page } = await newPage());
    });
    after(async () => {
        await ctx?.close();
    });

    test('sign in with the admin token: an HttpOnly SameSite=Strict cookie with an expiry, nothing in storage', async () => {
        await signInAs(page, ADMIN_TOKEN);
        assert.equal(await page.locator('#who').textContent(), 'platform admin');
        await textWhen(page.locator('#stream-state'), (t) => t === 'stream: live', 'the stream live');
        const cookies = await ctx.cookies();
        const c = cookies.find((x) => x.name === 'mg_session');
        assert.ok(c, 'the session cookie is set');
        assert.equal(c.httpOnly, true);
        assert.equal(c.sameSite, 'Strict');
        assert.equal(c.path, '/');
        assert.ok(c.expires > Date.now() / 1000 + 3600, 'it expires, in the future');
        const seen = await page.evaluate(() => ({
            cookie: document.cookie,
            local: Object.keys(localStorage).length,
            session: Object.keys(sessionStorage).length,
            field: document.querySelector('#token').value,
        }));
        assert.ok(!seen.cookie.includes('mg_session'), 'scripts cannot read the cookie');
        assert.equal(seen.local, 0, 'nothing in localStorage');
        assert.equal(seen.session, 0, 'nothing in sessionStorage');
        assert.equal(seen.field, '', 'the password field was emptied');
        assert.ok(!(await page.content()).includes(ADMIN_TOKEN), 'the token is nowhere in the page');
        await page.locator('[data-provider="mock-openai"].card').waitFor({ timeout: 8000 });
        assert.equal(await page.locator('.card').count(), 4);
        await shot(page, 'overview');
    });

    test('live numbers move within the stream interval as traffic flows', async () => {
        const cell = page.locator('[data-provider="mock-openai"].card .requests');
        const before = Number((await cell.textContent()).replace(/\D/g, ''));
        for (let i = 0; i < 3; i++) assert.equal((await chat()).status, 200);
        await textWhen(cell, (t) => Number(t.replace(/\D/g, '')) >= before + 3, 'the request count to grow by 3');
    });

    test('a 429 at the mock turns the card to "cooling down" with a countdown that moves; Clear ends it', async () => {
        await env.mock.script({ model: 'up-chat', action: { status: 429 }, times: 1 });
        const r = await chat();
        assert.ok(r.status >= 400);
        const card = page.locator('[data-provider="mock-openai"].card');
        await textWhen(card.locator('.state-text'), (t) => t === 'cooling down', 'the card cooling down');
        assert.match(await card.getAttribute('class'), /\bbad\b/);
        const first = await textWhen(card.locator('.countdown'), (t) => /\d+:\d\d/.test(t), 'a countdown');
        await textWhen(card.locator('.countdown'), (t) => t !== first, 'the countdown to move');
        const item = page.locator('#cooldowns li[data-provider="mock-openai"]');
        await item.waitFor({ timeout: 5000 });
        await textWhen(page.locator('.timeline li'), (t) => /mock-openai/.test(t) && /HTTP 429/.test(t), 'the cooldown in the history');
        await shot(page, 'cooldown');
        await item.locator('button').click();
        await textWhen(card.locator('.state-text'), (t) => t === 'active', 'the card active again');
        await page.locator('#no-cooldowns').waitFor({ state: 'visible', timeout: 5000 });
    });

    test('the request just made is in the live tail', async () => {
        const r = await chat();
        assert.equal(r.status, 200);
        const rid = r.headers.get('x-request-id');
        await page.click('a[data-page="requests"]');
        const row = page.locator(`#live-requests tr[data-request-id="${rid}"]`);
        await row.waitFor({ timeout: 8000 });
        assert.match(await row.textContent(), /mock-openai/);
        await row.click();
        assert.match(await page.locator('.diag pre').textContent(), new RegExp(rid));
        // the tail's filters are the gateway's: errors only drops the 200, a name brings it back
        await page.check('#live-errors');
        await row.waitFor({ state: 'detached', timeout: 8000 });
        await page.uncheck('#live-errors');
        await page.fill('#live-provider', 'mock-openai');
        await page.press('#live-provider', 'Enter');
        await page.locator('#live-provider').blur();
        await row.waitFor({ timeout: 8000 });
        assert.ok((await page.locator('#live-requests tbody tr td:nth-child(4)').allTextContents()).every((t) => t === 'mock-openai'));
        await page.fill('#live-provider', '');
        await page.locator('#live-provider').blur();
        await shot(page, 'requests');
    });

    test('history pages say plainly when the gateway has no usage metering', async () => {
        for (const p of ['trends', 'usage']) {
            await page.click(`a[data-page="${p}"]`);
            const msg = page.locator(`#page-${p} .history-unavailable`);
            const status = (await bearer('GET', p === 'trends' ? '/api/v2/stats/tokens' : '/api/v2/usage/analytics?group_by=model')).status;
            if (status === 404) await textWhen(msg, (t) => /usage metering/.test(t), `${p}: the 404 explained`);
            await shot(page, p);
        }
    });

    test('add a provider (its key test result shows), disable it, enable it', async () => {
        await page.click('a[data-page="providers"]');
        await page.locator('#providers-table').waitFor({ timeout: 5000 });
        const form = page.locator('#page-providers form');
        await form.locator('input').nth(0).fill('browser-added');
        await form.locator('input[type=url]').fill(`${env.mock.base}/v1`);
        await form.locator('input[type=password]').fill('sk-browser-added-secret-1234');
        await form.locator('button[type=submit]').click();
        const result = await textWhen(page.locator('#last-action'), (t) => /^Add browser-added: /.test(t) && !t.endsWith('…'), 'the add result');
        assert.match(result, /: (ok|added)/, result);
        const row = page.locator('#providers-table tr', { hasText: 'browser-added' });
        await row.waitFor({ timeout: 5000 });
        assert.ok(!(await page.content()).includes('sk-browser-added-secret-1234'), 'the key is shown masked only');
        await row.locator('button', { hasText: 'Disable' }).click();
        await textWhen(row.locator('.status'), (t) => t === 'disabled', 'the provider disabled');
        await row.locator('button', { hasText: 'Enable' }).click();
        await textWhen(row.locator('.status'), (t) => t === 'active', 'the provider enabled');
        await shot(page, 'providers');
    });

    test('a write from the page without the CSRF token is refused', async () => {
        const r = await page.evaluate(async () => {
            const res = await fetch('/api/v2/tenants', {
                method: 'POST', credentials: 'same-origin',
                headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ name: 'no-csrf' }),
            });
            return { status: res.status, body: await res.json() };
        });
        assert.equal(r.status, 403);
        assert.equal(r.body.error.code, 'CSRF_FAILED');
    });

    test('keys and config pages render; a key created is shown once', async () => {
        await page.click('a[data-page="keys"]');
        await page.locator('#tenants li').first().waitFor({ timeout: 5000 });
        const form = page.locator('#page-keys form').last();
        await form.locator('input').nth(0).fill(String(tenantB));
        await form.locator('input').nth(1).fill('made-in-browser');
        await form.locator('button').click();
        const shown = await textWhen(page.locator('#shown-key'), (t) => t.length > 20, 'the new key');
        await page.locator('#page-keys .shown-key button').click();
        assert.ok(!(await page.content()).includes(shown), 'gone from the page once saved');
        await shot(page, 'keys');
        await page.click('a[data-page="config"]');
        await shot(page, 'config');
    });

    test('tasks: a background task in flight is listed and cancelled from the page', async () => {
        await env.mock.script({ model: 'up-chat', action: { delay_first_byte_ms: 20000 }, times: 1 });
        const sub = await postJson(`${env.api}/tasks`, { model: 'chat', messages }, { headers: { authorization: `Bearer ${key}` } });
        assert.equal(sub.status, 202, sub.text);
        await page.click('a[data-page="tasks"]');
        const row = page.locator(`#tasks-table tr[data-task="${sub.json.task_id}"]`);
        await row.waitFor({ timeout: 5000 });
        await row.locator('button', { hasText: 'Cancel' }).click();
        await textWhen(row.locator('.status'), (t) => /CANCELLED/.test(t), 'the task cancelled');
        await shot(page, 'tasks');
        assert.deepEqual(page.errors, [], 'no script errors');
    });

    test('trends, usage and drill-down agree with the gateway after real traffic', async () => {
        // traffic on a second provider and from a key in a project, and one cancelled request
        const proj = (await bearer('POST', '/api/v2/projects', { tenant_id: tenantA, name: 'browser-proj' })).json.id;
        const projKey = (await bearer('POST', '/api/v2/keys', { tenant_id: tenantA, project_id: proj, name: 'key-p' })).json.key;
        assert.ok(proj && projKey);
        for (let i = 0; i < 2; i++) assert.equal((await chat(projKey)).status, 200);
        const ol = await postJson(`${env.api}/chat/completions`, { model: 'ollama-chat', messages }, { headers: { authorization: `Bearer ${key}` } });
        assert.equal(ol.status, 200, ol.text);
        const st = await postJson(`${env.api}/chat/completions`, { model: 'chat', messages, stream: true }, { headers: { authorization: `Bearer ${key}` } });
        assert.equal(st.status, 200);
        const all = await waitFor(async () => {
            const r = await bearer('GET', '/api/v2/usage/events?limit=1000');
            const d = r.json?.data ?? [];
            const ok = d.some((e) => e.status === 'cancelled') && d.some((e) => e.provider === 'mock-ollama') && d.some((e) => e.project_id === proj);
            return ok ? d : null;
        }, { timeoutMs: 10000, what: 'the events stored (a cancelled one among them)' });
        assert.ok(all.some((e) => e.status === 'failed'), 'a failed request too (the 429)');
        const tokens = all.reduce((n, e) => n + e.input_tokens + e.cached_read_tokens + e.cache_write_tokens + e.output_tokens, 0);
        const outTokens = all.reduce((n, e) => n + e.output_tokens, 0);
        assert.ok(outTokens > 0, 'the mock reports output tokens');
        const good = all.filter((e) => e.status === 'succeeded').length;

        // trends: each chart has one point per bucket of the gateway's answer, totals as stored
        const answer = page.waitForResponse((r) => r.url().includes('/api/v2/stats/tokens'));
        const shares = page.waitForResponse((r) => r.url().includes('/api/v2/usage/analytics?group_by=provider'));
        await page.click('a[data-page="trends"]');
        const series = await (await answer).json();
        const an = (await (await shares).json()).data; // the same range, from the same page
        await page.locator('#page-trends .charts').waitFor({ state: 'visible', timeout: 8000 });
        const charts = await waitFor(async () => {
            const c = await page.evaluate(() => Object.fromEntries(['tokens', 'calls', 'cost', 'success', 'share'].map((n) => {
                const ch = window.Chart.getChart(`chart-${n}`);
                return [n, ch ? { labels: ch.data.labels.length, sets: ch.data.datasets.map((d) => d.data) } : null];
            })));
            return Object.values(c).every(Boolean) ? c : null;
        }, { timeoutMs: 8000, what: 'the five charts drawn' });
        const points = series.data.length;
        assert.ok(points >= 24, `24 hours by hour: ${points} buckets`);
        for (const n of ['tokens', 'calls', 'cost', 'success']) {
            assert.equal(charts[n].labels, points, `${n}: one label per bucket`);
            for (const d of charts[n].sets) assert.equal(d.length, points, `${n}: one point per bucket`);
        }
        const sum = (a) => a.reduce((x, y) => x + (y ?? 0), 0);
        assert.equal(sum(charts.tokens.sets[0]), tokens, 'tokens = in (with cache) + out');
        assert.equal(sum(charts.calls.sets[0]), all.length, 'calls = the stored requests');
        const anReq = sum(an.map((g) => g.requests));
        const anRate = sum(an.map((g) => g.success_rate * g.requests)) / anReq;
        const calls = charts.calls.sets[0];
        const chartRate = sum(charts.success.sets[0].map((v, i) => (v ?? 0) * calls[i])) / sum(calls);
        assert.ok(Math.abs(chartRate - anRate) < 1e-9, `success rate: chart ${chartRate}, analytics ${anRate}`);
        assert.ok(Math.abs(chartRate - good / all.length) < 1e-9, 'succeeded / requests (failed and cancelled excluded)');
        await shot(page, 'trends-traffic');

        // usage: latency and TTFT percentiles shown
        await page.click('a[data-page="usage"]');
        await page.selectOption('#page-usage select >> nth=0', 'model');
        const chatRow = page.locator('#usage-table tr[data-group="chat"]');
        await chatRow.waitFor({ timeout: 8000 });
        const cells = await chatRow.locator('td').allTextContents();
        const head = await page.locator('#usage-table thead th').allTextContents();
        for (const h of ['P50', 'P95', 'TTFT P50', 'TTFT P95'])
            assert.match(cells[head.indexOf(h)], /^\d+ ms$/, `${h} shown: ${cells[head.indexOf(h)]}`);

        // drill-down by provider and by project filters the request log
        const drill = async (by, group, want) => {
            await page.click('a[data-page="usage"]');
            await page.selectOption('#page-usage select >> nth=0', by);
            const row = page.locator(`#usage-table tr[data-group="${group}"]`);
            await row.waitFor({ timeout: 8000 });
            const asked = page.waitForResponse((r) => r.url().includes('/api/v2/usage/events'));
            await row.locator('button').click();
            const got = await (await asked).json();
            await page.locator('#history-table').waitFor({ state: 'visible', timeout: 8000 });
            const expect = all.filter(want).map((e) => e.request_id).slice(0, 50);
            assert.deepEqual(got.data.map((e) => e.request_id), expect, `${by} ${group}: only its requests`);
            const shown = await page.locator('#history-table tbody tr').evaluateAll((rs) => rs.map((r) => r.dataset.requestId));
            assert.deepEqual(shown, expect);
            assert.ok(expect.length < all.length, `${by}: the filter leaves some out`);
        };
        await drill('provider', 'mock-ollama', (e) => e.provider === 'mock-ollama');
        await drill('project', String(proj), (e) => e.project_id === proj);
        await drill('project', '(no project)', (e) => !e.project_id);
        await shot(page, 'usage-drill');
        assert.deepEqual(page.errors, [], 'no script errors');
    });

    test('a phone-width screen shows the same page', async () => {
        const { context, page: phone } = await newPage({ width: 390, height: 844 });
        try {
            await signInAs(phone, ADMIN_TOKEN);
            await phone.locator('.card').first().waitFor({ timeout: 8000 });
            const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
            assert.ok(overflow <= 1, `no sideways scrolling (${overflow} px)`);
            await shot(phone, 'overview-phone');
        } finally {
            await context.close();
        }
    });

    test('sign out: back to the sign-in page, the cookie gone, the session refused', async () => {
        await page.click('#signout');
        await page.locator('#signin').waitFor({ state: 'visible', timeout: 5000 });
        const cookies = await ctx.cookies();
        assert.ok(!cookies.some((c) => c.name === 'mg_session'), 'the cookie is cleared');
        const status = await page.evaluate(async () => (await fetch('/api/dashboard/session')).status);
        assert.equal(status, 401);
        assert.equal(await page.evaluate(() => Object.keys(localStorage).length), 0);
    });
});

describe('a tenant admin in Chromium', { timeout: 60000 }, () => {
    test('sees only its tenant, and a 401 (its token revoked) returns to the sign-in page', async () => {
        const { context, page } = await newPage();
        try {
            await signInAs(page, tenantToken);
            assert.equal(await page.locator('#who').textContent(), `tenant admin · tenant ${tenantA}`);
            assert.equal(await page.locator('.card').count(), 0, 'no provider cards');
            await page.click('a[data-page="keys"]');
            await page.locator('#keys-table tbody tr').first().waitFor({ timeout: 5000 });
            const tenants = await page.locator('#keys-table tbody tr td:nth-child(2)').allTextContents();
            assert.ok(tenants.length >= 1);
            assert.ok(tenants.every((t) => t === String(tenantA)), `only tenant ${tenantA}'s keys: ${tenants}`);
            const listed = await page.locator('#tenants li').allTextContents();
            assert.deepEqual(listed.map((t) => t.split(' · ')[0]), [String(tenantA)]);
            // its request tail shows its own requests only
            const rid = (await chat()).headers.get('x-request-id');
            await page.click('a[data-page="requests"]');
            await page.locator(`#live-requests tr[data-request-id="${rid}"]`).waitFor({ timeout: 8000 });
            await page.click('a[data-page="providers"]');
            assert.match(await page.locator('#page-providers').textContent(), /platform admin/);
            await shot(page, 'tenant');
            assert.equal(await page.evaluate(() => Object.keys(localStorage).length), 0);
            // revoke its token: the next call answers 401 and the page goes back to sign-in
            const list = await bearer('GET', '/api/v2/admin-tokens');
            const id = list.json.data.find((t) => t.tenant_id === tenantA).id;
            assert.equal((await bearer('DELETE', `/api/v2/admin-tokens/${id}`)).status, 200);
            await page.click('a[data-page="keys"]');
            await page.locator('#signin').waitFor({ state: 'visible', timeout: 5000 });
            assert.match(await page.locator('#signin .notice').textContent(), /session ended/);
        } finally {
            await context.close();
        }
    });
});
