// End-to-end harness: a mock engine process, a generated YAML config in a temp dir, the
// real moongate binary, its JSON log lines, signals, raw HTTP over node:net, SSE reading.
// Every wait is bounded; every child process is killed by close() and, as a last resort,
// when the test process exits.

import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const MOCK_SCRIPT = path.join(REPO_ROOT, 'tests/mock/engine.mjs');
export const TEST_KEY_ENV = 'MOONGATE_E2E_MOCK_KEY';
export const TEST_KEY = 'sk-e2e-secret-0123456789abcdef';

/** Path of the gateway binary: $MOONGATE_BIN or build/moongate. */
export function gatewayBin() {
    const p = process.env.MOONGATE_BIN || path.join(REPO_ROOT, 'build/moongate');
    return path.isAbsolute(p) ? p : path.resolve(REPO_ROOT, p);
}

// ---------------------------------------------------------------------------
// small utilities
// ---------------------------------------------------------------------------

export function sleep(ms) {
    return new Promise((r) => setTimeout(r, ms));
}

/** Reject with a clear message when `p` does not settle within ms. */
export function withTimeout(p, ms, what = 'operation') {
    let t;
    const timeout = new Promise((_, reject) => {
        t = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
    });
    return Promise.race([p, timeout]).finally(() => clearTimeout(t));
}

/** Poll fn() (sync or async) until it returns a truthy value; bounded by timeoutMs. */
export async function waitFor(fn, { timeoutMs = 5000, intervalMs = 50, what = 'condition' } = {}) {
    const deadline = Date.now() + timeoutMs;
    let last;
    for (;;) {
        try {
            last = await fn();
            if (last) return last;
        } catch (err) {
            last = err;
        }
        if (Date.now() > deadline) {
            const detail = last instanceof Error ? `: ${last.message}` : '';
            throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail}`);
        }
        await sleep(intervalMs);
    }
}

/** A port that nothing listens on (bound then released; connection refused afterwards). */
/** A port nothing listens on, for "connection refused". Drawn below Linux's ephemeral range
 * (32768-60999), which every listen(0) of the tests running beside this one and every
 * outgoing connection take their ports from: a port freed from there could be handed to
 * another test's mock a moment later (a "dead" route then answered 200). */
export async function deadPort() {
    for (let i = 0; i < 200; i++) {
        const port = 20000 + Math.floor(Math.random() * 12000);
        const refused = await new Promise((resolve) => {
            const s = net.connect({ port, host: '127.0.0.1' });
            s.once('connect', () => { s.destroy(); resolve(false); });
            s.once('error', (e) => resolve(e.code === 'ECONNREFUSED'));
        });
        if (refused) return port;
    }
    throw new Error('no free port below the ephemeral range');
}

const live = new Set();

function killAll() {
    for (const c of live) {
        try {
            c.kill('SIGKILL');
        } catch {
            /* already gone */
        }
    }
}

// Last resort: children die with the test process, also when it is interrupted.
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) {
    process.once(sig, () => {
        killAll();
        process.exit(128 + (sig === 'SIGINT' ? 2 : 15));
    });
}

/** Read a child's stream as lines; calls onLine(line) for each complete line. */
function lines(stream, onLine) {
    let buf = '';
    stream.setEncoding('utf8');
    stream.on('data', (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
            onLine(buf.slice(0, i));
            buf = buf.slice(i + 1);
        }
    });
    stream.on('end', () => {
        if (buf) onLine(buf);
        buf = '';
    });
}

/** Resolve with {code, signal} when the child exits (immediately if it already did). */
function exited(child) {
    if (child.exitCode !== null || child.signalCode !== null)
        return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
    return new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
}

async function killChild(child, graceMs = 2000) {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGTERM');
    try {
        await withTimeout(exited(child), graceMs, 'child exit');
    } catch {
        child.kill('SIGKILL');
        await withTimeout(exited(child), 2000, 'child exit after SIGKILL').catch(() => {});
    }
}

// ---------------------------------------------------------------------------
// mock engine
// ---------------------------------------------------------------------------

/** Start tests/mock/engine.mjs on a free port. */
export async function startMock({ timeoutMs = 10000, tritonMetrics = false } = {}) {
    // stdin is a pipe the mock watches: if this process dies, even by SIGKILL, the mock exits too
    // tritonMetrics: also Triton's metrics port (a listener of its own: mock.metricsPort)
    const args = [MOCK_SCRIPT, '--port', '0', '--exit-with-stdin', ...(tritonMetrics ? ['--metrics-port', '0'] : [])];
    const child = spawn(process.execPath, args,
        { stdio: ['pipe', 'pipe', 'pipe'] });
    live.add(child);
    child.once('exit', () => live.delete(child));
    let stderr = '';
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d) => (stderr += d));
    let metricsPort;
    const port = await withTimeout(
        new Promise((resolve, reject) => {
            lines(child.stdout, (l) => {
                try {
                    const j = JSON.parse(l);
                    if (j.mock === 'listening') metricsPort = j.metrics_port;
                    if (j.mock === 'listening') resolve(j.port);
                } catch {
                    /* ignore */
                }
            });
            child.once('exit', (code) => reject(new Error(`mock exited early (${code}): ${stderr}`)));
        }),
        timeoutMs, 'mock engine start');
    const base = `http://127.0.0.1:${port}`;
    const ctl = async (method, p, body) => {
        const r = await fetch(base + p, {
            method,
            headers: body === undefined ? {} : { 'content-type': 'application/json' },
            body: body === undefined ? undefined : JSON.stringify(body),
            signal: AbortSignal.timeout(5000),
        });
        const j = await r.json();
        if (!r.ok) throw new Error(`mock control ${method} ${p} -> ${r.status} ${JSON.stringify(j)}`);
        return j;
    };
    return {
        port,
        base,
        metricsPort,
        child,
        get stderr() {
            return stderr;
        },
        /** Push one rule (or an array of rules). */
        script: (rule) => ctl('POST', '/__mock/script', rule),
        reset: () => ctl('POST', '/__mock/reset', {}),
        /** Answer the requests held under `name` (action.hold) and let later ones through. */
        release: (name) => ctl('POST', '/__mock/release', { hold: name }),
        rules: () => ctl('GET', '/__mock/rules'),
        /** Every request seen, optionally filtered by a predicate. */
        async requests(filter) {
            const all = await ctl('GET', '/__mock/requests');
            return filter ? all.filter(filter) : all;
        },
        /** Wait until some recorded request satisfies pred; returns it. */
        waitRequest(pred, { timeoutMs: t = 5000, what = 'mock request' } = {}) {
            return waitFor(async () => (await this.requests()).find(pred), { timeoutMs: t, what });
        },
        close: () => killChild(child),
    };
}

// ---------------------------------------------------------------------------
// config
// ---------------------------------------------------------------------------

function yamlScalar(v) {
    if (v === null || v === undefined) return 'null';
    if (typeof v === 'number' || typeof v === 'boolean') return String(v);
    const s = String(v);
    const ambiguous = /^(true|false|yes|no|on|off|null|~|[-+]?[0-9.]+([eE][-+]?[0-9]+)?)$/i.test(s);
    if (!ambiguous && /^[A-Za-z0-9_./:${}@-][A-Za-z0-9_./:${}@ -]*$/.test(s) && !s.endsWith(' ')) return s;
    return JSON.stringify(s);
}

/** A small YAML emitter for plain objects/arrays/scalars (block style). */
export function toYaml(v, indent = 0) {
    const pad = ' '.repeat(indent);
    if (Array.isArray(v)) {
        if (!v.length) return `${pad}[]\n`;
        return v.map((item) => {
            if (item !== null && typeof item === 'object') {
                const inner = toYaml(item, indent + 2);
                return `${pad}- ${inner.slice(indent + 2)}`;
            }
            return `${pad}- ${yamlScalar(item)}\n`;
        }).join('');
    }
    if (v !== null && typeof v === 'object') {
        const keys = Object.keys(v).filter((k) => v[k] !== undefined);
        if (!keys.length) return `${pad}{}\n`;
        return keys.map((k) => {
            const val = v[k];
            const key = yamlScalar(k);
            if (val !== null && typeof val === 'object') {
                if (Array.isArray(val) ? !val.length : !Object.keys(val).length)
                    return `${pad}${key}: ${Array.isArray(val) ? '[]' : '{}'}\n`;
                return `${pad}${key}:\n${toYaml(val, indent + 2)}`;
            }
            return `${pad}${key}: ${yamlScalar(val)}\n`;
        }).join('');
    }
    return `${pad}${yamlScalar(v)}\n`;
}

/** The default providers: all point at the mock, except "dead". */
export function defaultProviders(mockPort, dead) {
    const m = `http://127.0.0.1:${mockPort}`;
    return [
        { id: 'mock-openai', adapter: 'openai', base_url: `${m}/v1`, api_key: `\${${TEST_KEY_ENV}}` },
        { id: 'mock-openai-b', adapter: 'openai', base_url: `${m}/v1` },
        { id: 'mock-ollama', adapter: 'ollama', base_url: m },
        { id: 'dead', adapter: 'openai', base_url: `http://127.0.0.1:${dead}/v1` },
    ];
}

/** The default logical models (name -> upstream routes). */
export function defaultModels() {
    return {
        chat: { routes: [{ provider: 'mock-openai', model: 'up-chat' }] },
        embed: { routes: [{ provider: 'mock-openai', model: 'up-embed' }] },
        'ollama-chat': { routes: [{ provider: 'mock-ollama', model: 'up-ollama-chat' }] },
        'ollama-embed': { routes: [{ provider: 'mock-ollama', model: 'up-ollama-embed' }] },
        failover: {
            routes: [
                { provider: 'mock-openai', model: 'up-fail-1' },
                { provider: 'mock-openai-b', model: 'up-fail-2', priority: 1 },
            ],
        },
        'dead-first': {
            routes: [
                { provider: 'dead', model: 'up-dead' },
                { provider: 'mock-openai-b', model: 'up-after-dead', priority: 1 },
            ],
        },
    };
}

/**
 * The config object for a test. opts: { server, timeouts, upstream, log, providers (replace),
 * extraProviders, models (replace), extraModels, lua: {policies, adapters, lib} }.
 */
export function buildConfig(dir, mockPort, dead, opts = {}) {
    return {
        server: {
            listen: '127.0.0.1:0',
            metrics_listen: '127.0.0.1:0',
            ...(opts.server ?? {}),
        },
        storage: { path: path.join(dir, 'moongate.db') },
        auth: { enabled: false },
        lua: opts.lua,
        log: { level: 'info', ...(opts.log ?? {}) },
        upstream: { max_retries: 3, ...(opts.upstream ?? {}) },
        timeouts: opts.timeouts,
        scheduler: opts.scheduler,
        idempotency: opts.idempotency,
        applications: opts.applications,
        users: opts.users,
        providers: [...(opts.providers ?? defaultProviders(mockPort, dead)), ...(opts.extraProviders ?? [])],
        models: { ...(opts.models ?? defaultModels()), ...(opts.extraModels ?? {}) },
    };
}

// ---------------------------------------------------------------------------
// gateway
// ---------------------------------------------------------------------------

/**
 * Start the gateway with `-c configPath`; resolves once the "listening" line appeared.
 * `wrap` is a command line the binary runs under, one that execs it (e.g. ['prlimit',
 * '--nofile=128:128']): the child's pid stays the gateway's.
 */
export async function startGateway(configPath, { env = {}, timeoutMs = 15000, cwd = REPO_ROOT, wrap = [] } = {}) {
    const bin = gatewayBin();
    if (!fs.existsSync(bin)) {
        throw new Error(`gateway binary not found at ${bin}: build it (cmake --build build) or set MOONGATE_BIN`);
    }
    const argv = [...wrap, bin, '-c', configPath];
    const child = spawn(argv[0], argv.slice(1), {
        cwd,
        env: { ...process.env, [TEST_KEY_ENV]: TEST_KEY, ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
    });
    live.add(child);
    const gw = new Gateway(child, configPath);
    child.once('exit', () => live.delete(child));
    const listening = await withTimeout(
        Promise.race([
            gw.waitLog((l) => l.msg === 'listening', { timeoutMs }),
            exited(child).then(({ code, signal }) => {
                throw new Error(`gateway exited before listening (code ${code}, signal ${signal})\n` +
                    `stdout:\n${gw.stdoutText()}\nstderr:\n${gw.stderr}`);
            }),
        ]),
        timeoutMs + 500, 'gateway "listening" log line').catch(async (err) => {
        await killChild(child);
        throw err;
    });
    gw.port = portOf(listening.listen);
    gw.metricsPort = listening.metrics_listen ? portOf(listening.metrics_listen) : null;
    gw.adminPort = listening.admin_listen ? portOf(listening.admin_listen) : null; // server.admin_listen
    if (!gw.port) throw new Error(`cannot read port from listening line ${JSON.stringify(listening)}`);
    gw.base = `http://127.0.0.1:${gw.port}`;
    return gw;
}

function portOf(hostport) {
    const m = /:(\d+)$/.exec(String(hostport ?? ''));
    return m ? Number(m[1]) : null;
}

export class Gateway {
    constructor(child, configPath) {
        this.child = child;
        this.configPath = configPath;
        this.logs = []; // parsed JSON lines
        this.rawLines = []; // every stdout line, parsed or not
        this.stderr = '';
        this.waiters = new Set();
        lines(child.stdout, (l) => {
            this.rawLines.push(l);
            let j;
            try {
                j = JSON.parse(l);
            } catch {
                return;
            }
            if (j && typeof j === 'object') {
                this.logs.push(j);
                for (const w of this.waiters) w(j);
            }
        });
        child.stderr.setEncoding('utf8');
        child.stderr.on('data', (d) => (this.stderr += d));
        // MOONGATE_E2E_STDERR=1 shows the gateway's stderr live (sanitizer reports)
        if (process.env.MOONGATE_E2E_STDERR) child.stderr.on('data', (d) => process.stderr.write(d));
        this.exit = exited(child);
    }

    get pid() {
        return this.child.pid;
    }

    stdoutText() {
        return this.rawLines.join('\n');
    }

    /** Lines that are not JSON objects (the contract says there should be none). */
    nonJsonLines() {
        return this.rawLines.filter((l) => {
            if (!l.trim()) return false;
            try {
                const j = JSON.parse(l);
                return !(j && typeof j === 'object' && !Array.isArray(j));
            } catch {
                return true;
            }
        });
    }

    /**
     * Resolve with the first log object (at index >= from) matching pred; bounded by timeoutMs.
     */
    waitLog(pred, { timeoutMs = 5000, from = 0, what = 'log line' } = {}) {
        for (let i = from; i < this.logs.length; i++) if (pred(this.logs[i])) return Promise.resolve(this.logs[i]);
        let w;
        const p = new Promise((resolve) => {
            w = (j) => {
                if (pred(j)) resolve(j);
            };
            this.waiters.add(w);
        });
        return withTimeout(p, timeoutMs, what).finally(() => this.waiters.delete(w));
    }

    /** The per-request log line of request_id. */
    requestLog(requestId, timeoutMs = 5000) {
        return this.waitLog((l) => l.msg === 'request' && l.request_id === requestId,
            { timeoutMs, what: `request log line for ${requestId}` });
    }

    hup() {
        this.child.kill('SIGHUP');
    }

    /** SIGHUP and wait for the resulting "reload" line. */
    async reload(timeoutMs = 10000) {
        const from = this.logs.length;
        this.hup();
        return this.waitLog((l) => l.msg === 'reload', { timeoutMs, from, what: 'reload log line' });
    }

    term() {
        this.child.kill('SIGTERM');
    }

    /** Wait for the process to exit; resolves {code, signal}. */
    waitExit(timeoutMs = 10000) {
        return withTimeout(this.exit, timeoutMs, 'gateway exit');
    }

    get exited() {
        return this.child.exitCode !== null || this.child.signalCode !== null;
    }

    /** GET a JSON endpoint of the API listener. */
    async getJson(p, port = this.port) {
        const r = await fetch(`http://127.0.0.1:${port}${p}`, { signal: AbortSignal.timeout(5000) });
        const text = await r.text();
        let json = null;
        try {
            json = JSON.parse(text);
        } catch {
            /* not JSON */
        }
        return { status: r.status, headers: r.headers, text, json };
    }

    /** The text of GET /metrics on the metrics listener. */
    async metrics() {
        return (await this.getJson('/metrics', this.metricsPort)).text;
    }

    /** Stop the gateway; under a sanitizer build (make asan) a report on its stderr (an error,
     * a leak at exit) fails the test file that ran it. */
    async close() {
        await killChild(this.child, 3000);
        const report = SANITIZER_REPORT.exec(this.stderr);
        if (report) throw new Error(`the gateway's sanitizer report:\n${this.stderr.slice(report.index, report.index + 4000)}`);
    }
}

const SANITIZER_REPORT = /(ERROR: (Address|Leak)Sanitizer|runtime error: |UndefinedBehaviorSanitizer)/;

// ---------------------------------------------------------------------------
// the whole environment of one test file
// ---------------------------------------------------------------------------

async function copyDir(src, dst) {
    await fsp.mkdir(dst, { recursive: true });
    if (fs.existsSync(src)) await fsp.cp(src, dst, { recursive: true });
}

/**
 * Start a mock and a gateway for one test file.
 * opts: buildConfig options plus { copyLua: bool (copies policies/ and adapters/ into the temp
 * dir), env, wrap (see startGateway), configure(config, env) -> config (env has mock,
 * deadPort, dir) }.
 * Returns { dir, mock, gw, config, configPath, base, api, writeConfig(config), close() }.
 */
export async function startEnv(opts = {}) {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-e2e-'));
    const env = { dir, mock: null, gw: null };
    env.close = async () => {
        if (env.gw) await env.gw.close().catch(() => {});
        if (env.mock) await env.mock.close().catch(() => {});
        if (!process.env.MOONGATE_E2E_KEEP) await fsp.rm(dir, { recursive: true, force: true }).catch(() => {});
    };
    try {
        env.mock = await startMock();
        env.deadPort = await deadPort();
        let lua = {
            policies: path.join(REPO_ROOT, 'policies'),
            adapters: path.join(REPO_ROOT, 'adapters'),
            lib: path.join(REPO_ROOT, 'lua'),
        };
        if (opts.copyLua) {
            lua = { policies: path.join(dir, 'policies'), adapters: path.join(dir, 'adapters'), lib: lua.lib };
            await copyDir(path.join(REPO_ROOT, 'policies'), lua.policies);
            await copyDir(path.join(REPO_ROOT, 'adapters'), lua.adapters);
        }
        env.lua = lua;
        let config = buildConfig(dir, env.mock.port, env.deadPort, { lua, ...opts });
        if (opts.configure) config = opts.configure(config, env) ?? config;
        env.configPath = path.join(dir, 'moongate.yaml');
        env.writeConfig = (c) => {
            env.config = c;
            fs.writeFileSync(env.configPath, toYaml(c));
        };
        env.writeConfig(config);
        env.gw = await startGateway(env.configPath, { env: opts.env ?? {}, wrap: opts.wrap ?? [] });
        env.base = env.gw.base;
        env.api = `${env.gw.base}/v1`;
        return env;
    } catch (err) {
        await env.close();
        throw err;
    }
}

// ---------------------------------------------------------------------------
// HTTP helpers (fetch)
// ---------------------------------------------------------------------------

/** A fetch response read whole: { status, headers, text, json } (json null when not JSON). */
export async function readAnswer(r) {
    const text = await r.text();
    let json = null;
    try {
        json = JSON.parse(text);
    } catch {
        /* not JSON */
    }
    return { status: r.status, headers: r.headers, text, json };
}

/** One SQL query on a database file, rows as objects (the sqlite3 shell's -json mode). */
export function sqliteRows(db, sql) {
    const out = execFileSync('sqlite3', ['-json', '-cmd', '.timeout 5000', db, sql], { encoding: 'utf8', timeout: 10000 });
    return out.trim() ? JSON.parse(out) : [];
}

/** A call of the admin API (/api/v2/<p>) with a Bearer token: { status, text, json }
 * (json null when the body is not JSON). */
export async function adminCall(base, token, method, p, body, { timeoutMs = 10000 } = {}) {
    const r = await fetch(`${base}/api/v2/${p}`, {
        method,
        headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
    });
    return readAnswer(r);
}

/** POST JSON with fetch; returns { status, headers, text, json }. */
export async function postJson(url, body, { headers = {}, timeoutMs = 10000, signal } = {}) {
    const r = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: typeof body === 'string' ? body : JSON.stringify(body),
        signal: signal ?? AbortSignal.timeout(timeoutMs),
    });
    return readAnswer(r);
}

/** Split an SSE body into the data payloads of its events. */
export function sseData(text) {
    const out = [];
    for (const block of text.split(/\r?\n\r?\n/)) {
        const data = block.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, ''));
        if (data.length) out.push(data.join('\n'));
    }
    return out;
}

/**
 * POST a streaming request and read the whole SSE body (bounded). Returns
 * { status, headers, text, data: [payload strings], events: [parsed JSON or '[DONE]'], error }.
 * `error` is set when the connection failed before a clean end.
 */
export async function postStream(url, body, { timeoutMs = 15000, headers = {} } = {}) {
    const r = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
    });
    let text = '';
    let error = null;
    try {
        const dec = new TextDecoder();
        for await (const chunk of r.body) text += dec.decode(chunk, { stream: true });
    } catch (err) {
        error = err;
    }
    const data = sseData(text);
    const events = data.map((d) => {
        if (d === '[DONE]') return d;
        try {
            return JSON.parse(d);
        } catch {
            return { __unparsed: d };
        }
    });
    return { status: r.status, headers: r.headers, text, data, events, error };
}

// ---------------------------------------------------------------------------
// raw HTTP over node:net
// ---------------------------------------------------------------------------

/**
 * Parse one HTTP/1.1 response from the front of buf. Returns { response, rest } or null when
 * incomplete. If `eof` is true, a response without length ends at the end of buf.
 */
export function parseResponse(buf, eof = false) {
    const headEnd = buf.indexOf('\r\n\r\n');
    if (headEnd < 0) return null;
    const head = buf.subarray(0, headEnd).toString('latin1');
    const [statusLine, ...headerLines] = head.split('\r\n');
    const m = /^HTTP\/(\d\.\d) (\d{3})(?: (.*))?$/.exec(statusLine);
    if (!m) throw new Error(`bad status line: ${JSON.stringify(statusLine)}`);
    const headers = {};
    const rawHeaders = [];
    for (const l of headerLines) {
        const i = l.indexOf(':');
        if (i < 0) continue;
        const k = l.slice(0, i).trim().toLowerCase();
        const v = l.slice(i + 1).trim();
        rawHeaders.push([k, v]);
        headers[k] = k in headers ? `${headers[k]}, ${v}` : v;
    }
    const status = Number(m[2]);
    let pos = headEnd + 4;
    let body;
    const noBody = status === 204 || status === 304 || (status >= 100 && status < 200);
    if (noBody) {
        body = Buffer.alloc(0);
    } else if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
        const parts = [];
        for (;;) {
            const lineEnd = buf.indexOf('\r\n', pos);
            if (lineEnd < 0) return null;
            const size = parseInt(buf.subarray(pos, lineEnd).toString('latin1').split(';')[0], 16);
            if (Number.isNaN(size)) throw new Error('bad chunk size');
            pos = lineEnd + 2;
            if (size === 0) {
                // trailers until an empty line
                for (;;) {
                    const e = buf.indexOf('\r\n', pos);
                    if (e < 0) return null;
                    const empty = e === pos;
                    pos = e + 2;
                    if (empty) break;
                }
                break;
            }
            if (buf.length < pos + size + 2) return null;
            parts.push(buf.subarray(pos, pos + size));
            pos += size + 2;
        }
        body = Buffer.concat(parts);
    } else if (headers['content-length'] !== undefined) {
        const n = Number(headers['content-length']);
        if (buf.length < pos + n) return null;
        body = buf.subarray(pos, pos + n);
        pos += n;
    } else {
        if (!eof) return null;
        body = buf.subarray(pos);
        pos = buf.length;
    }
    const text = body.toString('utf8');
    const response = {
        httpVersion: m[1], status, statusText: m[3] ?? '', headers, rawHeaders, body, text,
        json() {
            return JSON.parse(text);
        },
    };
    return { response, rest: buf.subarray(pos) };
}

/** A raw TCP connection to the gateway for byte-exact HTTP tests. */
export class RawConn {
    static open(port, host = '127.0.0.1', timeoutMs = 5000) {
        return withTimeout(new Promise((resolve, reject) => {
            const s = net.connect(port, host);
            s.once('connect', () => resolve(new RawConn(s)));
            s.once('error', reject);
        }), timeoutMs, `connect to ${host}:${port}`);
    }

    constructor(socket) {
        this.socket = socket;
        this.buf = Buffer.alloc(0);
        this.closed = false;
        this.error = null;
        this.notify = null;
        socket.setNoDelay(true);
        socket.on('data', (d) => {
            this.buf = Buffer.concat([this.buf, d]);
            this.notify?.();
        });
        socket.on('error', (e) => {
            this.error = e;
        });
        socket.on('close', () => {
            this.closed = true;
            this.notify?.();
        });
    }

    write(data) {
        return new Promise((resolve, reject) => this.socket.write(data, (e) => (e ? reject(e) : resolve())));
    }

    /** Wait until pred() is true, re-checking on every data/close event; bounded. */
    _until(pred, timeoutMs, what) {
        if (pred()) return Promise.resolve();
        return withTimeout(new Promise((resolve) => {
            this.notify = () => {
                if (pred()) {
                    this.notify = null;
                    resolve();
                }
            };
        }), timeoutMs, what).finally(() => {
            this.notify = null;
        });
    }

    /** Read one complete response (pipelined responses come out one per call, in order). */
    async readResponse(timeoutMs = 5000) {
        let parsed = null;
        await this._until(() => {
            parsed = parseResponse(this.buf, this.closed);
            return parsed !== null || (this.closed && this.buf.length === 0);
        }, timeoutMs, 'an HTTP response');
        if (!parsed) throw new Error('connection closed before a response');
        this.buf = Buffer.from(parsed.rest);
        return parsed.response;
    }

    /** Wait until the received bytes contain `needle` (string); returns the text so far. */
    async waitText(needle, timeoutMs = 5000) {
        await this._until(() => this.buf.includes(needle) || this.closed, timeoutMs, `"${needle}"`);
        return this.buf.toString('utf8');
    }

    /** Resolves true when the peer closes within timeoutMs, false otherwise. */
    async waitClose(timeoutMs = 5000) {
        try {
            await this._until(() => this.closed, timeoutMs, 'connection close');
            return true;
        } catch {
            return false;
        }
    }

    /** All bytes received so far, as text. */
    text() {
        return this.buf.toString('utf8');
    }

    destroy() {
        this.socket.destroy();
    }

    close() {
        this.socket.destroy();
    }
}

/** Build a raw HTTP/1.1 request with a JSON (or string) body and Content-Length. */
export function rawRequest(method, p, { body, headers = {}, host = '127.0.0.1' } = {}) {
    const payload = body === undefined ? '' : typeof body === 'string' ? body : JSON.stringify(body);
    let h = `${method} ${p} HTTP/1.1\r\nHost: ${host}\r\n`;
    for (const [k, v] of Object.entries(headers)) h += `${k}: ${v}\r\n`;
    if (body !== undefined) {
        if (!Object.keys(headers).some((k) => k.toLowerCase() === 'content-type')) h += 'Content-Type: application/json\r\n';
        h += `Content-Length: ${Buffer.byteLength(payload)}\r\n`;
    }
    return h + '\r\n' + payload;
}

/** The usage journal drained into the database (core/store/store.h: within ~50 ms of an
 *  answer): call before reading usage_events directly. */
export async function journalDrained(gw) {
    for (let i = 0; i < 250; i++) {
        if (/^moongate_store_journal_bytes 0$/m.test(await gw.metrics())) return;
        await sleep(20);
    }
    throw new Error('the usage journal never drained');
}
