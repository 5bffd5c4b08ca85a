// moongate dashboard: one Alpine.js component for the whole page (no build step).
//
// Security: the admin token is typed into the sign-in form and sent once to
// /api/dashboard/login; the gateway answers with an HttpOnly session cookie and a CSRF token.
// The page keeps the CSRF token in memory only (never localStorage or sessionStorage) and sends
// it as X-CSRF-Token on every state-changing call. Any 401 returns to the sign-in page.
//
// Live data comes from one EventSource on /api/dashboard/stream (snapshot and request
// events); history (trends, usage, the stored request log) from /api/v2/stats/* and
// /api/v2/usage/*, which answer 404 on a gateway without usage metering: those panels then
// say so and the live parts go on working.
'use strict';

const REQUEST_BUFFER = 200; // live request rows kept in the page

function fmtNum(v, digits = 0) {
    if (v === null || v === undefined || Number.isNaN(v)) return '–';
    return Number(v).toLocaleString(undefined, { maximumFractionDigits: digits });
}

function fmtPct(v) {
    return v === null || v === undefined ? '–' : `${(v * 100).toFixed(1)} %`;
}

function fmtMs(v) {
    return v === null || v === undefined ? '–' : `${Math.round(v)} ms`;
}

function fmtTime(ms) {
    return ms ? new Date(ms).toLocaleTimeString() : '–';
}

// A countdown "1:05" from ms left; "0:00" once past.
function fmtCountdown(msLeft) {
    const s = Math.max(0, Math.ceil(msLeft / 1000));
    return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

// Rows of a stats answer whatever its wrapper: an array, or {data|series|buckets|points|rows}.
function rowsOf(j) {
    if (Array.isArray(j)) return j;
    for (const k of ['data', 'series', 'buckets', 'points', 'rows', 'groups', 'events', 'providers'])
        if (j && Array.isArray(j[k])) return j[k];
    return [];
}

// A row's time in ms: unix seconds or ms, or an ISO date / datetime.
function rowTime(r) {
    for (const k of ['hour', 'bucket', 't', 'time', 'start', 'day', 'date', 'at_ms', 'at']) {
        const v = r[k];
        if (v === undefined || v === null) continue;
        if (typeof v === 'number') return v < 1e12 ? v * 1000 : v;
        const d = Date.parse(v);
        if (!Number.isNaN(d)) return d;
    }
    return null;
}

function pick(r, ...keys) {
    for (const k of keys) if (typeof r[k] === 'number') return r[k];
    return null;
}

// Tokens in and out. The gateway's rows carry tokens_in (input incl. cache read and write)
// and tokens_out; the other names are for rows from elsewhere.
function rowTokens(r) {
    const t = pick(r, 'total_tokens', 'tokens');
    if (t !== null) return t;
    if (typeof r.tokens_in === 'number' || typeof r.tokens_out === 'number') return (r.tokens_in ?? 0) + (r.tokens_out ?? 0);
    const i = pick(r, 'input_tokens', 'prompt_tokens') ?? 0;
    const o = pick(r, 'output_tokens', 'completion_tokens') ?? 0;
    return i + o + (pick(r, 'cached_read_tokens') ?? 0) + (pick(r, 'cache_write_tokens') ?? 0);
}

function rowRequests(r) {
    return pick(r, 'requests', 'request_count', 'calls', 'total_requests') ?? 0;
}

function rowCost(r) {
    const m = pick(r, 'cost_micros', 'total_cost_micros');
    if (m !== null) return m / 1e6;
    return pick(r, 'cost', 'total_cost') ?? 0;
}

// The share of requests that succeeded: neither failed nor cancelled, the definition of
// /api/v2/usage/analytics' success_rate, so the trends chart and the usage table agree.
function rowSuccess(r) {
    const s = pick(r, 'success_rate');
    if (s !== null) return s;
    const n = rowRequests(r);
    const e = pick(r, 'errors', 'error_count', 'total_errors') ?? 0;
    const c = pick(r, 'cancelled') ?? 0;
    return n ? (n - e - c) / n : null;
}

// A percentile of a row: nested ({latency_ms: {p50}}) as the gateway answers, or flat;
// a negative value means "no sample".
function rowMs(r, nest, p, ...flat) {
    const o = r[nest];
    const v = o && typeof o === 'object' && typeof o[p] === 'number' ? o[p] : pick(r, ...flat);
    return v === null || v < 0 ? null : v;
}

// The state a provider card shows: a word (never colour alone) and a colour class.
function providerState(p, cooling) {
    if (p.status === 'disabled') return { text: 'disabled', cls: 'bad' };
    if (cooling) return { text: 'cooling down', cls: 'bad' };
    if (p.health === 'down') return { text: 'down', cls: 'bad' };
    if (p.breaker === 'open') return { text: 'breaker open', cls: 'bad' };
    if (p.health === 'degraded' || p.breaker === 'half_open') return { text: p.health === 'degraded' ? 'degraded' : 'half open', cls: 'warn' };
    return { text: 'active', cls: 'ok' };
}

document.addEventListener('alpine:init', () => {
    window.Alpine.data('dashboard', () => ({
        view: 'loading', // loading | signin | app
        page: 'overview',
        pages: [
            ['overview', 'Overview'], ['trends', 'Trends'], ['usage', 'Usage'], ['requests', 'Requests'],
            ['providers', 'Providers'], ['keys', 'Keys and tenants'], ['tasks', 'Tasks'], ['config', 'Config'],
        ],
        session: null, // {role, tenant_id, csrf_token, expires_at}: memory only
        signinError: '',
        signinBusy: false,
        notice: '',
        snapshot: null,
        clockSkew: 0, // server time - browser time, from the last snapshot
        cooldownsSeen: 0, // cooldowns applied, summed: a change reloads the history
        now: Date.now(),
        live: [], // request events, newest first, at most REQUEST_BUFFER
        missed: 0,
        streamState: 'off',
        es: null,
        timer: null,
        charts: {},
        trends: { bucket: 'hour', range: 24, state: 'idle', message: '' },
        usage: { groupBy: 'model', range: 24, state: 'idle', message: '', rows: [] },
        history: { state: 'idle', message: '', rows: [], cursor: null, filters: { model: '', status: '', key_id: '', project_id: '', provider: '' } },
        liveFilter: { model: '', provider: '', errorsOnly: false },
        selected: null, // one request's diagnostic JSON
        admin: { providers: [], tenants: [], keys: [], spend: {}, tasks: [], config: null, cooldownHistory: [], shownKey: null },
        form: { provider: { name: '', endpoint_url: '', api_key: '', pool: 'main', rpm_limit: 60, adapter: 'openai' }, key: { tenant_id: '', name: '' }, tenant: { name: '' } },
        lastAction: '',

        // ---- lifecycle --------------------------------------------------------------------------

        async init() {
            this.timer = setInterval(() => (this.now = Date.now()), 250);
            window.addEventListener('hashchange', () => this.go(location.hash.slice(1)));
            const r = await fetch('/api/dashboard/session', { credentials: 'same-origin' });
            if (r.ok) this.enter(await r.json());
            else this.view = 'signin';
        },

        go(page) {
            if (!this.pages.some(([p]) => p === page)) page = 'overview';
            this.page = page;
            if (location.hash.slice(1) !== page) history.replaceState(null, '', `#${page}`);
            this.loadPage();
        },

        enter(session) {
            this.session = session;
            this.view = 'app';
            this.signinError = '';
            this.openStream();
            this.go(location.hash.slice(1) || 'overview');
        },

        get isPlatform() {
            return this.session && this.session.role === 'platform';
        },

        async signin(ev) {
            const field = ev.target.querySelector('input[name=token]');
            const token = field.value;
            field.value = ''; // the token lives nowhere in the page after this
            this.signinBusy = true;
            this.signinError = '';
            try {
                const r = await fetch('/api/dashboard/login', {
                    method: 'POST',
                    credentials: 'same-origin',
                    headers: { 'Content-Type': 'application/json' },
                    body: JSON.stringify({ token }),
                });
                if (r.ok) this.enter(await r.json());
                else this.signinError = r.status === 401 ? 'That token was not accepted.' : `Sign-in failed (${r.status}).`;
            } catch {
                this.signinError = 'The gateway cannot be reached.';
            } finally {
                this.signinBusy = false;
            }
        },

        async signout() {
            await this.call('POST', '/api/dashboard/logout');
            this.signedOut('Signed out.');
        },

        signedOut(message) {
            this.closeStream();
            this.session = null;
            this.snapshot = null;
            this.live = [];
            this.admin.shownKey = null;
            for (const c of Object.values(this.charts)) c.destroy();
            this.charts = {};
            this.notice = message;
            this.view = 'signin';
        },

        // ---- API calls --------------------------------------------------------------------------

        // fetch with the session cookie and, for writes, the CSRF token. A 401 ends the session.
        async call(method, path, body) {
            const headers = {};
            if (method !== 'GET') headers['X-CSRF-Token'] = this.session ? this.session.csrf_token : '';
            if (body !== undefined) headers['Content-Type'] = 'application/json';
            let r;
            try {
                r = await fetch(path, { method, headers, credentials: 'same-origin', body: body === undefined ? undefined : JSON.stringify(body) });
            } catch {
                return { status: 0, json: null };
            }
            let json = null;
            try {
                json = await r.json();
            } catch {
                /* no body */
            }
            if (r.status === 401 && path !== '/api/dashboard/logout') this.signedOut('Your session ended: sign in again.');
            return { status: r.status, json };
        },

        errorText(res) {
            return res.json && res.json.error ? `${res.json.error.code}: ${res.json.error.message}` : `HTTP ${res.status}`;
        },

        // ---- the live stream -------------------------------------------------------------------

        openStream() {
            this.closeStream();
            // the live tail's filters are applied by the gateway (exact model / provider names)
            const q = new URLSearchParams();
            if (this.liveFilter.model) q.set('model', this.liveFilter.model);
            if (this.liveFilter.provider) q.set('provider', this.liveFilter.provider);
            if (this.liveFilter.errorsOnly) q.set('errors', '1');
            const es = new EventSource(`/api/dashboard/stream${q.size ? `?${q}` : ''}`);
            this.es = es;
            this.streamState = 'connecting';
            es.onopen = () => (this.streamState = 'live');
            es.addEventListener('snapshot', (e) => {
                const s = JSON.parse(e.data);
                this.clockSkew = s.server_time_ms - Date.now();
                const cooldowns = (s.providers || []).reduce((n, p) => n + p.cooldowns_total, 0);
                if (this.snapshot && cooldowns !== this.cooldownsSeen && this.page === 'overview') this.loadCooldownHistory();
                this.cooldownsSeen = cooldowns;
                this.snapshot = s;
            });
            es.addEventListener('request', (e) => {
                this.live.unshift(JSON.parse(e.data));
                if (this.live.length > REQUEST_BUFFER) this.live.length = REQUEST_BUFFER;
            });
            es.addEventListener('gap', (e) => (this.missed += JSON.parse(e.data).missed));
            es.addEventListener('signed_out', () => this.signedOut('Your session ended: sign in again.'));
            es.onerror = async () => {
                if (es.readyState !== EventSource.CLOSED) {
                    this.streamState = 'reconnecting'; // the browser retries with Last-Event-ID
                    return;
                }
                this.streamState = 'off';
                const r = await this.call('GET', '/api/dashboard/session');
                if (r.status === 200 && this.es === es) setTimeout(() => this.view === 'app' && this.openStream(), 3000);
            };
        },

        closeStream() {
            if (this.es) this.es.close();
            this.es = null;
            this.streamState = 'off';
        },

        // ---- what the overview shows -----------------------------------------------------------

        serverNow() {
            return this.now + this.clockSkew;
        },

        get providers() {
            return this.snapshot && this.snapshot.providers ? this.snapshot.providers : [];
        },

        cooling(p) {
            return p.cooldown_until_ms && p.cooldown_until_ms > this.serverNow();
        },

        stateOf(p) {
            return providerState(p, this.cooling(p));
        },

        // the full logging window (the snapshot's `logging`), while it is open
        get fullLogging() {
            const l = this.snapshot && this.snapshot.logging;
            return l && l.mode === 'full' && l.until_ms > this.serverNow() ? l : null;
        },

        fmtCountdown,

        countdown(p) {
            return fmtCountdown(p.cooldown_until_ms - this.serverNow());
        },

        get coolingProviders() {
            return this.providers.filter((p) => this.cooling(p));
        },

        rpmShare(p) {
            return p.rpm_limit ? Math.min(1, p.current_rpm / p.rpm_limit) : 0;
        },

        get pools() {
            const p = this.snapshot && this.snapshot.pools;
            return p ? Object.entries(p) : [];
        },

        get queue() {
            const s = this.snapshot && this.snapshot.scheduler;
            return s ? Object.entries(s.queued_by_priority) : [];
        },

        get filteredLive() {
            return this.live;
        },

        // New filters: a new stream (its replay: the ring's last requests that match).
        refilter() {
            this.live = [];
            this.missed = 0;
            this.openStream();
        },

        fmtNum, fmtPct, fmtMs, fmtTime,

        // ---- pages that load on entry ---------------------------------------------------------

        loadPage() {
            if (this.view !== 'app') return;
            if (this.page === 'trends') this.loadTrends();
            else if (this.page === 'usage') this.loadUsage();
            else if (this.page === 'requests') this.loadHistory(true);
            else if (this.page === 'providers' && this.isPlatform) this.loadProviders();
            else if (this.page === 'keys') this.loadKeys();
            else if (this.page === 'config' && this.isPlatform) this.loadConfig();
            else if (this.page === 'tasks' && this.isPlatform) this.loadTasks();
            else if (this.page === 'overview' && this.isPlatform) this.loadCooldownHistory();
        },

        rangeParams(hours) {
            const to = Math.floor(Date.now() / 1000);
            return `from=${to - hours * 3600}&to=${to}`;
        },

        // A history endpoint: 404 means this gateway has no usage metering (yet).
        async history404(res, holder) {
            if (res.status === 404) {
                holder.state = 'unavailable';
                holder.message = 'History needs the gateway\'s usage metering (/api/v2/stats and /api/v2/usage), which this gateway does not serve. The live views work without it.';
                return true;
            }
            if (res.status !== 200) {
                holder.state = 'error';
                holder.message = this.errorText(res);
                return true;
            }
            return false;
        },

        async loadTrends() {
            const t = this.trends;
            t.state = 'loading';
            const res = await this.call('GET', `/api/v2/stats/tokens?bucket=${t.bucket}&${this.rangeParams(t.range)}`);
            if (await this.history404(res, t)) return this.clearCharts();
            const rows = rowsOf(res.json).map((r) => ({ t: rowTime(r), tokens: rowTokens(r), requests: rowRequests(r), cost: rowCost(r), success: rowSuccess(r) }))
                .filter((r) => r.t !== null).sort((a, b) => a.t - b.t);
            t.state = rows.length ? 'ready' : 'empty';
            let sum = 0;
            const labels = rows.map((r) => new Date(r.t).toLocaleString(undefined, t.bucket === 'hour' ? { hour: '2-digit', minute: '2-digit', day: 'numeric' } : { month: 'short', day: 'numeric' }));
            this.chart('tokens', 'line', labels, [{ label: 'tokens', data: rows.map((r) => r.tokens) }]);
            this.chart('calls', 'bar', labels, [{ label: 'calls', data: rows.map((r) => r.requests) }]);
            this.chart('cost', 'line', labels, [{ label: 'cost', data: rows.map((r) => r.cost) }, { label: 'cumulative', data: rows.map((r) => (sum += r.cost)) }]);
            this.chart('success', 'line', labels, [{ label: 'success rate', data: rows.map((r) => r.success) }]);
            const share = await this.call('GET', `/api/v2/usage/analytics?group_by=provider&${this.rangeParams(t.range)}`);
            const groups = share.status === 200 ? rowsOf(share.json) : [];
            this.chart('share', 'pie', groups.map((g) => g.provider_id ?? g.provider ?? g.group ?? g.key ?? '?'), [{ label: 'requests', data: groups.map(rowRequests) }]);
        },

        chart(name, type, labels, datasets) {
            const canvas = document.getElementById(`chart-${name}`);
            if (!canvas || !window.Chart) return;
            if (this.charts[name]) this.charts[name].destroy();
            this.charts[name] = new window.Chart(canvas, {
                type, data: { labels, datasets },
                options: { animation: false, responsive: true, maintainAspectRatio: false, plugins: { legend: { display: datasets.length > 1 || type === 'pie' } } },
            });
        },

        clearCharts() {
            for (const c of Object.values(this.charts)) c.destroy();
            this.charts = {};
        },

        async loadUsage() {
            const u = this.usage;
            u.state = 'loading';
            const res = await this.call('GET', `/api/v2/usage/analytics?group_by=${u.groupBy}&${this.rangeParams(u.range)}`);
            if (await this.history404(res, u)) return;
            u.rows = rowsOf(res.json).map((r) => ({
                // null: requests without a key / project (or model); drill-down asks for id 0
                value: r[`${u.groupBy}_id`] ?? r[u.groupBy] ?? r.group ?? null,
                group: String(r[`${u.groupBy}_id`] ?? r[u.groupBy] ?? r.group ?? `(no ${u.groupBy})`),
                requests: rowRequests(r), success: rowSuccess(r), tokens: rowTokens(r), cost: rowCost(r),
                cacheHit: pick(r, 'cache_hit_rate') ?? (pick(r, 'cache_hits') !== null && rowRequests(r) ? r.cache_hits / rowRequests(r) : null),
                p50: rowMs(r, 'latency_ms', 'p50', 'latency_p50_ms', 'p50_ms'),
                p95: rowMs(r, 'latency_ms', 'p95', 'latency_p95_ms', 'p95_ms'),
                ttft50: rowMs(r, 'ttft_ms', 'p50', 'ttft_p50_ms'),
                ttft95: rowMs(r, 'ttft_ms', 'p95', 'ttft_p95_ms'),
            }));
            u.state = u.rows.length ? 'ready' : 'empty';
        },

        // The request log filtered to one group (/api/v2/usage/events takes each group_by's
        // column; key_id / project_id 0 are the events without one).
        drill(row) {
            const f = this.history.filters;
            const by = this.usage.groupBy;
            const id = row.value === null ? '0' : String(row.value);
            f.model = by === 'model' ? (row.value ?? '') : '';
            f.key_id = by === 'key' ? id : '';
            f.project_id = by === 'project' ? id : '';
            f.provider = by === 'provider' ? (row.value ?? '') : '';
            this.go('requests');
        },

        async loadHistory(fresh) {
            const h = this.history;
            if (fresh) h.cursor = null;
            h.state = 'loading';
            const q = new URLSearchParams({ limit: '50' });
            for (const [k, v] of Object.entries(h.filters)) if (v) q.set(k, v);
            if (h.cursor) q.set('cursor', h.cursor);
            const res = await this.call('GET', `/api/v2/usage/events?${q}`);
            if (await this.history404(res, h)) return;
            const rows = rowsOf(res.json);
            h.rows = fresh ? rows : h.rows.concat(rows);
            h.cursor = res.json.next_cursor ?? res.json.cursor ?? null;
            // a rare filter's page may be short, even empty, with older events still to look
            // at (the server examines a bounded number a page): "More" goes on
            h.state = h.rows.length ? 'ready' : h.cursor ? 'partial' : 'empty';
        },

        // ---- admin ------------------------------------------------------------------------------

        async act(label, method, path, body) {
            this.lastAction = `${label}…`;
            const res = await this.call(method, path, body);
            this.lastAction = res.status >= 200 && res.status < 300 ? `${label}: done` : `${label}: ${this.errorText(res)}`;
            return res;
        },

        async setProviderEnabled(p, on) {
            await this.act(`${on ? 'Enable' : 'Disable'} ${p.id}`, 'POST', `/api/v2/providers/${encodeURIComponent(p.id)}/${on ? 'enable' : 'disable'}`);
            if (this.page === 'providers') this.loadProviders();
        },

        async clearCooldown(p) {
            await this.act(`Clear the cooldown of ${p.id}`, 'DELETE', `/api/v2/cooldowns/${encodeURIComponent(p.id)}`);
            this.loadCooldownHistory();
        },

        async testProvider(p) {
            const res = await this.act(`Test ${p.id}`, 'POST', `/api/v2/providers/${encodeURIComponent(p.id)}/test`);
            if (res.json && res.json.test_result) this.lastAction = `Test ${p.id}: ${res.json.test_result}${res.json.test_latency_ms !== undefined ? ` (${res.json.test_latency_ms} ms)` : ''}`;
        },

        async deleteProvider(p) {
            if (!confirm(`Delete provider ${p.id}?`)) return;
            await this.act(`Delete ${p.id}`, 'DELETE', `/api/v2/providers/${encodeURIComponent(p.id)}`);
            this.loadProviders();
        },

        async addProvider() {
            const f = { ...this.form.provider, rpm_limit: Number(this.form.provider.rpm_limit) };
            if (!f.api_key) delete f.api_key;
            const res = await this.act(`Add ${f.name}`, 'POST', '/api/v2/providers', f);
            this.form.provider.api_key = ''; // the key is not kept in the page
            if (res.status === 201 || res.status === 200) {
                this.lastAction = `Add ${f.name}: ${res.json.test_result ?? 'added'}${res.json.test_latency_ms !== undefined ? ` (${res.json.test_latency_ms} ms)` : ''}`;
                this.loadProviders();
            }
        },

        async loadProviders() {
            const res = await this.call('GET', '/api/v2/providers');
            if (res.status === 200) this.admin.providers = res.json.providers;
        },

        async loadCooldownHistory() {
            const res = await this.call('GET', '/api/v2/cooldowns/history?limit=50');
            this.admin.cooldownHistory = res.status === 200 ? rowsOf(res.json) : [];
        },

        async loadKeys() {
            const [t, k, u] = await Promise.all([this.call('GET', '/api/v2/tenants'), this.call('GET', '/api/v2/keys'), this.call('GET', '/api/v2/usage')]);
            this.admin.tenants = t.status === 200 ? rowsOf(t.json) : [];
            this.admin.keys = k.status === 200 ? rowsOf(k.json) : [];
            // metered spend per key for this UTC month ("m:YYYY-MM"), from GET /api/v2/usage
            const month = `m:${new Date().toISOString().slice(0, 7)}`;
            const spend = {};
            for (const r of u.status === 200 ? rowsOf(u.json) : []) if (r.scope === 'key' && r.period === month) spend[r.id] = r.spent_micros;
            this.admin.spend = spend;
        },

        keyLimits(k) {
            const f = (v) => (v ? fmtNum(v) : '∞');
            const money = (v) => (v ? fmtNum(v / 1e6, 2) : '∞');
            return `${f(k.rpm_limit)} / ${f(k.tpm_limit)} / ${money(k.daily_limit_micros)} / ${money(k.monthly_limit_micros)}`;
        },

        keySpend(k) {
            const m = this.admin.spend[k.id];
            return m === undefined ? '0' : fmtNum(m / 1e6, 4);
        },

        async addTenant() {
            const res = await this.act(`Add tenant ${this.form.tenant.name}`, 'POST', '/api/v2/tenants', { name: this.form.tenant.name });
            if (res.status === 201) this.loadKeys();
        },

        async addKey() {
            const body = { tenant_id: Number(this.form.key.tenant_id || this.session.tenant_id) };
            if (this.form.key.name) body.name = this.form.key.name;
            const res = await this.act('Create a key', 'POST', '/api/v2/keys', body);
            if (res.status === 201) {
                this.admin.shownKey = res.json.key; // shown this once, never stored
                this.loadKeys();
            }
        },

        async keyAction(k, verb) {
            const res = await this.act(`${verb} key ${k.id}`, 'POST', `/api/v2/keys/${k.id}/${verb}`);
            if (verb === 'rotate' && res.status === 200) this.admin.shownKey = res.json.key;
            this.loadKeys();
        },

        // Async tasks (POST /v1/tasks), newest first; in-flight ones can be cancelled.
        async loadTasks() {
            const res = await this.call('GET', '/v1/tasks?limit=100');
            this.admin.tasks = res.status === 200 ? rowsOf(res.json) : [];
        },

        async cancelTask(t) {
            await this.act(`Cancel ${t.task_id}`, 'DELETE', `/v1/tasks/${encodeURIComponent(t.task_id)}`);
            this.loadTasks();
        },

        taskOpen(t) {
            return !['SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT', 'REJECTED'].includes(t.status);
        },

        async loadConfig() {
            const res = await this.call('GET', '/api/v2/config');
            this.admin.config = res.status === 200 ? res.json : null;
        },

        configText() {
            return this.admin.config ? JSON.stringify(this.admin.config, null, 2) : '';
        },

        diagnostic(r) {
            this.selected = JSON.stringify(r, null, 2);
        },
    }));
});
