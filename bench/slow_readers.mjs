#!/usr/bin/env node
// Memory after a burst of slow readers (issue 16, item 5): N raw clients each ask for a large
// answer (a whole 8 MiB one, or a long stream) and read nothing; once the gateway holds
// their answers, the clients leave (close their sockets). Prints the gateway's VmRSS before,
// at the peak and 5 s after they left, as one JSON line. Run it against two builds to
// compare (MOONGATE_BIN=path); the config uses no key a build before the change lacks.
//
//   node bench/slow_readers.mjs [--clients 200] [--kind whole|stream] [--bin build/moongate]

import fs from 'node:fs';
import { startEnv, RawConn, rawRequest, sleep, waitFor } from '../tests/e2e/lib/harness.mjs';

function arg(name, dflt) {
    const i = process.argv.indexOf(`--${name}`);
    return i > 0 ? process.argv[i + 1] : dflt;
}

const N = Number(arg('clients', 200));
const KIND = arg('kind', 'whole');
if (arg('bin')) process.env.MOONGATE_BIN = arg('bin');

const rss = (pid) => Number(/VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;
const mib = (n) => Number((n / 1048576).toFixed(1));

const env = await startEnv({
    extraModels: { big: { routes: [{ provider: 'mock-openai', model: 'up-big' }] } },
    configure: (c) => ({ ...c, health: { probes: false }, log: { level: 'warn' } }),
});
try {
    const action = KIND === 'stream' ? { chunks: 4000, piece_bytes: 16384 } : { chunks: 8, piece_bytes: 1 << 20 };
    await env.mock.script({ model: 'up-big', action });
    const stream = KIND === 'stream';
    const pid = env.gw.pid;
    await sleep(500);
    const before = rss(pid);
    const clients = [];
    for (let i = 0; i < N; i++) {
        const c = await RawConn.open(env.gw.port);
        c.socket.pause();
        await c.write(rawRequest('POST', '/v1/chat/completions', {
            body: { model: 'big', stream, messages: [{ role: 'user', content: 'slow reader' }] },
        }));
        clients.push(c);
    }
    // the gateway holds them: every upstream request arrived and RSS stopped growing
    await waitFor(async () => (await env.mock.requests()).length >= N, { timeoutMs: 120000, what: 'all upstream requests' });
    let peak = rss(pid);
    for (let i = 0; i < 20; i++) {
        await sleep(250);
        peak = Math.max(peak, rss(pid));
    }
    for (const c of clients) c.destroy();
    await sleep(5000);
    const afterLeft = rss(pid);
    console.log(JSON.stringify({
        bin: process.env.MOONGATE_BIN ?? 'build/moongate', kind: KIND, clients: N,
        rss_before_mib: mib(before), rss_peak_mib: mib(peak), rss_after_left_mib: mib(afterLeft),
    }));
} finally {
    await env.close();
}
