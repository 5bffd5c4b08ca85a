// A throw-away PostgreSQL cluster for the e2e tests: Debian's server binaries (initdb, pg_ctl)
// into a temp dir, trust auth, loopback only (a unix socket in the same dir), on a free port;
// removed at the end. Never a system service.
//
// initdb and postgres refuse to run as root: when the tests run as root (this machine, a fresh
// CI box), the server runs as `nobody` (the spawn's uid/gid) in a directory handed to it.

import { execFileSync, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { deadPort } from './harness.mjs';

const PG_BIN = process.env.MOONGATE_PG_BIN ?? '/usr/lib/postgresql/15/bin';
const USER = 'moongate';

/** Whether the server binaries are here (the tests skip with a reason otherwise). */
export function postgresAvailable() {
    return fs.existsSync(path.join(PG_BIN, 'initdb')) && fs.existsSync(path.join(PG_BIN, 'pg_ctl'));
}

function asServerUser() {
    if (process.getuid?.() !== 0) return {};
    return { uid: 65534, gid: 65534 }; // nobody:nogroup
}

function run(bin, args, what) {
    const r = spawnSync(path.join(PG_BIN, bin), args, {
        ...asServerUser(),
        encoding: 'utf8',
        timeout: 60000,
        env: { PATH: process.env.PATH, LC_ALL: 'C', TZ: 'UTC' },
        cwd: '/',
    });
    if (r.status !== 0) throw new Error(`${what}: ${r.error?.message ?? ''} ${r.stdout} ${r.stderr}`);
    return r.stdout;
}

export class Postgres {
    constructor(dir, port) {
        this.dir = dir;
        this.data = path.join(dir, 'data');
        this.port = port;
        this.url = `postgresql://${USER}@127.0.0.1:${port}/postgres`;
    }

    start() {
        run('pg_ctl', ['start', '-w', '-t', '60', '-D', this.data, '-l', path.join(this.dir, 'server.log'),
            '-o', `-k ${this.dir} -p ${this.port} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60`],
            'pg_ctl start');
    }

    /** A fast shutdown: open connections are cut, as in a restart of the server. */
    stop() {
        run('pg_ctl', ['stop', '-w', '-t', '60', '-m', 'fast', '-D', this.data], 'pg_ctl stop');
    }

    /** One SQL statement through psql (as root is fine: a client); the rows as objects. */
    rows(sql) {
        const out = execFileSync('psql', ['-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', '-h', '127.0.0.1', '-p', String(this.port),
            '-U', USER, '-d', 'postgres', '-c', `SELECT COALESCE(json_agg(t), '[]') FROM (${sql}) t`],
        { encoding: 'utf8', timeout: 20000 });
        return JSON.parse(out.trim());
    }

    /** A statement without rows (or whose rows are not wanted). */
    exec(sql) {
        execFileSync('psql', ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', '127.0.0.1', '-p', String(this.port), '-U', USER,
            '-d', 'postgres', '-c', sql], { encoding: 'utf8', timeout: 20000 });
    }

    /** Run sql in a psql of its own, in the background; resolves when it ended. */
    hold(sql) {
        return new Promise((resolve, reject) => {
            const c = spawn('psql', ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', '127.0.0.1', '-p', String(this.port), '-U', USER,
                '-d', 'postgres', '-c', sql], { stdio: ['ignore', 'ignore', 'pipe'] });
            let err = '';
            c.stderr.on('data', (d) => (err += d));
            const timer = setTimeout(() => c.kill('SIGKILL'), 30000);
            c.on('exit', (code) => {
                clearTimeout(timer);
                if (code === 0) resolve();
                else reject(new Error(`psql: ${err}`));
            });
        });
    }

    async close() {
        try {
            this.stop();
        } catch {
            /* not running */
        }
        if (!process.env.MOONGATE_E2E_KEEP) await fsp.rm(this.dir, { recursive: true, force: true }).catch(() => {});
    }
}

/** initdb into a new temp dir and start it on a free loopback port. */
export async function startPostgres() {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'moongate-pg-'));
    const owner = asServerUser();
    if (owner.uid !== undefined) fs.chownSync(dir, owner.uid, owner.gid);
    const pg = new Postgres(dir, await deadPort());
    try {
        run('initdb', ['-D', pg.data, '-U', USER, '--auth=trust', '--no-locale', '-E', 'UTF8', '--no-sync'], 'initdb');
        pg.start();
        return pg;
    } catch (err) {
        await pg.close();
        throw err;
    }
}
