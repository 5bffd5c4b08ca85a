#!/usr/bin/env node
// Copy the WebUI's front-end libraries from their npm packages (tests/node_modules, pinned in
// tests/package.json) into webui/vendor/, with their licences and a VERSIONS.txt, so the
// dashboard needs no build step and no CDN. The output is checked in; run this after changing
// a pinned version. --check compares instead of writing (exit 1 when they differ).
//
//   node scripts/webui-vendor.mjs [--check]
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const MODS = path.join(ROOT, 'tests/node_modules');
const OUT = path.join(ROOT, 'webui/vendor');
const check = process.argv.includes('--check');

const pkg = (name) => JSON.parse(fs.readFileSync(path.join(MODS, name, 'package.json'), 'utf8'));

// Alpine's package ships no licence file; its package.json says MIT, by its author. Its
// browser build bundles @vue/reactivity and @vue/shared, whose own LICENSE files go along.
function mitText(holder) {
    return `MIT License\n\nCopyright (c) ${holder}\n\n` +
        'Permission is hereby granted, free of charge, to any person obtaining a copy of this ' +
        'software and associated documentation files (the "Software"), to deal in the Software ' +
        'without restriction, including without limitation the rights to use, copy, modify, ' +
        'merge, publish, distribute, sublicense, and/or sell copies of the Software, and to ' +
        'permit persons to whom the Software is furnished to do so, subject to the following ' +
        'conditions:\n\nThe above copyright notice and this permission notice shall be included ' +
        'in all copies or substantial portions of the Software.\n\nTHE SOFTWARE IS PROVIDED ' +
        '"AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED ' +
        'TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND ' +
        'NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY ' +
        'CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ' +
        'ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN ' +
        'THE SOFTWARE.\n';
}

const alpine = pkg('alpinejs');
const files = [
    { out: 'alpine.min.js', from: 'alpinejs/dist/cdn.min.js', pkg: 'alpinejs' },
    { out: 'chart.umd.min.js', from: 'chart.js/dist/chart.umd.min.js', pkg: 'chart.js' },
    { out: 'LICENSE.chart.js.md', from: 'chart.js/LICENSE.md', pkg: 'chart.js' },
    { out: 'LICENSE.alpinejs.txt', text: mitText(`${alpine.author} (package.json of alpinejs ${alpine.version}: "license": "${alpine.license}")`), pkg: 'alpinejs' },
    { out: 'LICENSE.vue-reactivity.txt', from: '@vue/reactivity/LICENSE', pkg: '@vue/reactivity' },
    { out: 'LICENSE.vue-shared.txt', from: '@vue/shared/LICENSE', pkg: '@vue/shared' },
];

const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');
const wanted = new Map();
for (const f of files) wanted.set(f.out, f.text !== undefined ? Buffer.from(f.text) : fs.readFileSync(path.join(MODS, f.from)));
let versions = 'Vendored from npm by scripts/webui-vendor.mjs (pinned in tests/package.json); do not edit.\n\n';
for (const f of files) {
    const p = pkg(f.pkg);
    versions += `${f.out}\t${f.pkg}@${p.version}\t${p.license}\t${f.from ?? '(from package.json)'}\tsha256:${sha(wanted.get(f.out))}\n`;
}
wanted.set('VERSIONS.txt', Buffer.from(versions));

let differ = 0;
if (!check) fs.mkdirSync(OUT, { recursive: true });
for (const [name, bytes] of wanted) {
    const dst = path.join(OUT, name);
    if (check) {
        const have = fs.existsSync(dst) ? fs.readFileSync(dst) : null;
        if (!have || !have.equals(bytes)) {
            console.error(`webui/vendor/${name} differs from its npm package: run node scripts/webui-vendor.mjs`);
            differ++;
        }
    } else {
        fs.writeFileSync(dst, bytes);
    }
}
if (check && differ) process.exit(1);
if (!check) console.log(`webui/vendor: ${wanted.size} files written`);
