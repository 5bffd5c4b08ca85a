// The cluster's Redis client (issue 24): state up/degraded in /status, the
// moongate_cluster_degraded{component="redis"} gauge and a log line at each change, against a
// real redis-server paused (SIGSTOP), resumed, killed and restarted; node_id shown everywhere.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { sleep, startEnv, waitFor } from './lib/harness.mjs';
import { startRedis } from './lib/redis.mjs';

async function status(env) {
    const r = await fetch(`${env.base}/status`);
    return r.json();
}

async function degradedGauge(env) {
    const t = await (await fetch(`http://127.0.0.1:${env.gw.metricsPort}/metrics`)).text();
    const m = /^moongate_cluster_degraded\{component="redis"\} (\d)$/m.exec(t);
    return m ? Number(m[1]) : null;
}

describe('cluster redis client', () => {
    let redis;
    let env;
    before(async () => {
        redis = await startRedis();
        env = await startEnv({
            configure: (c) => ({
                ...c,
                cluster: { node_id: 'edge-a', redis: { url: redis.url, timeout_ms: 100 } },
            }),
        });
    });
    after(async () => {
        if (env) await env.close();
        if (redis) await redis.stop();
    });

    test('connects: up in /status, gauge 0, node id shown', async () => {
        await waitFor(async () => (await status(env)).cluster.redis.state === 'up', { what: 'redis up' });
        const st = await status(env);
        assert.equal(st.cluster.node_id, 'edge-a');
        assert.equal(await degradedGauge(env), 0);
        const t = await (await fetch(`http://127.0.0.1:${env.gw.metricsPort}/metrics`)).text();
        assert.match(t, /^moongate_node_info\{node_id="edge-a"\} 1$/m);
    });

    test('SIGSTOP: degraded (status, gauge, one log line without the url); SIGCONT clears it', async () => {
        redis.pause();
        try {
            await waitFor(async () => (await status(env)).cluster.redis.state === 'degraded',
                { timeoutMs: 5000, what: 'redis degraded' });
            assert.equal(await degradedGauge(env), 1);
            const line = await env.gw.waitLog((l) => l.msg === 'cluster redis degraded', { timeoutMs: 2000 });
            assert.equal(line.node_id, 'edge-a');
            assert.equal(line.reason, 'timeout');
            assert.ok((await status(env)).cluster.redis.timed_out >= 1);
        } finally {
            redis.resume();
        }
        await waitFor(async () => (await status(env)).cluster.redis.state === 'up',
            { timeoutMs: 5000, what: 'redis up again' });
        assert.equal(await degradedGauge(env), 0);
        await env.gw.waitLog((l) => l.msg === 'cluster redis up', { timeoutMs: 2000 });
        assert.ok(!env.gw.stdoutText().includes(redis.url), 'the url is never logged');
    });

    test('killed then restarted on the same port: reconnects by itself', async () => {
        const port = redis.port;
        await redis.stop();
        redis = null;
        await waitFor(async () => (await status(env)).cluster.redis.state === 'degraded',
            { timeoutMs: 5000, what: 'degraded after kill' });
        const before_ = (await status(env)).cluster.redis.connects;
        redis = await startRedis({ port });
        await waitFor(async () => (await status(env)).cluster.redis.state === 'up',
            { timeoutMs: 20000, what: 'reconnected' });
        assert.ok((await status(env)).cluster.redis.connects > before_);
    });

    test('killed, kept away past refused reconnects, restarted: reconnects by itself', async () => {
        // a refused connect reports a poll error, which hiredis 0.14's own libuv adapter dropped:
        // that reconnect waited for ever (cluster/redis.c binds hiredis to libuv itself)
        const port = redis.port;
        await redis.stop();
        redis = null;
        await waitFor(async () => (await status(env)).cluster.redis.state === 'degraded',
            { timeoutMs: 5000, what: 'degraded after kill' });
        await sleep(1500);
        redis = await startRedis({ port });
        await waitFor(async () => (await status(env)).cluster.redis.state === 'up',
            { timeoutMs: 20000, what: 'reconnected' });
    });
});

describe('SIGTERM with cluster.redis', () => {
    test('exits by itself: the listening connection closes too', async () => {
        const redis = await startRedis();
        const env = await startEnv({
            configure: (c) => ({ ...c, cluster: { node_id: 'edge-t', redis: { url: redis.url } } }),
        });
        try {
            await waitFor(async () => (await status(env)).cluster.redis.state === 'up', { what: 'redis up' });
            env.gw.term();
            // the cooldown channel's connection kept the loop alive: killed after the grace
            const { code, signal } = await env.gw.waitExit(5000);
            assert.equal(signal, null);
            assert.equal(code, 0);
        } finally {
            await env.close();
            await redis.stop();
        }
    });
});

describe('no cluster section: the single-node default', () => {
    let env;
    before(async () => { env = await startEnv(); });
    after(async () => { if (env) await env.close(); });
    test('redis off, no degraded gauge', async () => {
        const st = await status(env);
        assert.equal(st.cluster.redis.state, 'off');
        assert.ok(st.cluster.node_id.length > 0);
        assert.equal(await degradedGauge(env), null);
    });
});
