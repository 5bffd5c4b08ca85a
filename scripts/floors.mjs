#!/usr/bin/env node
// The floor rule of core/ (core/README.md): a file includes headers of its own floor and of
// the floors below it, never above. Prints every include that runs upward and exits 1 when
// there is one; `node scripts/floors.mjs` from anywhere in the checkout.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

// bottom to top; '' is the root (main.c, server.c)
export const FLOORS = ['base', 'token', 'store', 'conf', 'cluster', 'net', 'upstream', 'sched', 'luavm', 'route',
    'tenancy', 'obs', 'session', 'pipeline', 'admin', 'api', ''];

const core = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'core');
const floorOf = (rel) => (rel.includes('/') ? rel.split('/')[0] : '');
const problems = [];
function walk(dir) {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
        const p = path.join(dir, e.name);
        if (e.isDirectory()) walk(p);
        else if (/\.[ch]$/.test(e.name)) check(p);
    }
}
function check(p) {
    const rel = path.relative(core, p);
    const mine = FLOORS.indexOf(floorOf(rel));
    if (mine < 0) problems.push(`${rel}: folder ${floorOf(rel)} is not a floor (scripts/floors.mjs)`);
    for (const m of fs.readFileSync(p, 'utf8').matchAll(/#include "([^"]+)"/g)) {
        const inc = m[1];
        if (!fs.existsSync(path.join(core, inc))) {
            if (!inc.includes('/')) problems.push(`${rel}: #include "${inc}" names no floor`);
            continue;
        }
        if (FLOORS.indexOf(floorOf(inc)) > mine) problems.push(`${rel}: #include "${inc}" runs upward`);
    }
}
walk(core);
for (const p of problems) console.log(p);
console.log(problems.length ? `${problems.length} problem(s)` : 'every include runs down or across');
process.exit(problems.length ? 1 : 0);
