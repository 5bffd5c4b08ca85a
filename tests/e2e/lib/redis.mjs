// A throw-away redis-server for the cluster tests: loopback, a free port, a temp dir, no
// persistence; never a system service. stop() at the end; pause()/resume() send SIGSTOP/SIGCONT.
import { spawn } from 'node:child_process';
import fsp from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

import { deadPort, sleep } from './harness.mjs';

async function answersPing(port) {
    return new Promise((resolve) => {
        const s = net.connect(port, '127.0.0.1');
        const done = (ok) => {
            s.destroy();
            resolve(ok);
        };
        s.setTimeout(500, () => done(false));
        s.once('error', () => done(false));
        s.once('connect', () => s.write('PING\r\n'));
        s.once('data', (d) => done(String(d).startsWith('+PONG')));
    });
}

/** Starts redis-server on port (a free one by default). */
export async function startRedis({ port } = {}) {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-redis-'));
    port = port ?? (await deadPort());
    const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1',
        '--dir', dir, '--save', '', '--appendonly', 'no', '--protected-mode', 'yes'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    const r = {
        port, dir, child,
        url: `redis://127.0.0.1:${port}/0`,
        pause: () => child.kill('SIGSTOP'),
        resume: () => child.kill('SIGCONT'),
        async stop() {
            if (child.exitCode === null && child.signalCode === null) {
                child.kill('SIGCONT');
                const gone = new Promise((res) => child.once('exit', res));
                child.kill('SIGKILL');
                await gone;
            }
            await fsp.rm(dir, { recursive: true, force: true }).catch(() => {});
        },
    };
    for (let i = 0; i < 100; i++) { // bounded: 100 x 50 ms
        if (child.exitCode !== null) break;
        if (await answersPing(port)) return r;
        await sleep(50);
    }
    await r.stop();
    throw new Error(`redis-server did not start on ${port}:\n${out}`);
}
