#!/usr/bin/env node
// Extract the tokenizer's rank files from the npm tiktoken package (tests/node_modules,
// installed by scripts/setup) into data/tokenizer/<encoding>.tiktoken, in tiktoken's own text
// format ("base64-of-the-bytes rank" per line), and check each against the SHA-256 in
// scripts/tokenizer.sha256 (the digests of the files OpenAI publishes for tiktoken: the
// package's ranks are those). Nothing is fetched; a file already present and correct is kept.
//   node scripts/tokenizer-data.mjs [OUT_DIR]
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const out = process.argv[2] || path.join(root, 'data', 'tokenizer');
const pkg = path.join(root, 'tests', 'node_modules', 'tiktoken', 'encoders');
const sums = Object.fromEntries(fs.readFileSync(path.join(root, 'scripts', 'tokenizer.sha256'), 'utf8')
    .split('\n').filter((l) => /^[0-9a-f]{64}  /.test(l)).map((l) => [l.slice(66), l.slice(0, 64)]));
const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');

// The package's bpe_ranks: either tiktoken's lines, or "! <first rank> <base64> <base64> ...",
// consecutive ranks from the first.
function toTiktoken(ranks) {
    if (!ranks.startsWith('! ')) return ranks.endsWith('\n') ? ranks : ranks + '\n';
    const parts = ranks.split(' ');
    const first = Number(parts[1]);
    return parts.slice(2).map((b, i) => `${b} ${first + i}\n`).join('');
}

fs.mkdirSync(out, { recursive: true });
let bad = 0;
for (const [file, want] of Object.entries(sums)) {
    const dest = path.join(out, file);
    if (fs.existsSync(dest) && sha(fs.readFileSync(dest)) === want) continue;
    const name = file.replace(/\.tiktoken$/, '');
    const src = path.join(pkg, `${name}.json`);
    if (!fs.existsSync(src)) {
        console.error(`tokenizer-data: ${src} missing (npm ci in tests/ installs the tiktoken package)`);
        bad++;
        continue;
    }
    const text = toTiktoken(JSON.parse(fs.readFileSync(src, 'utf8')).bpe_ranks);
    const got = sha(text);
    if (got !== want) {
        console.error(`tokenizer-data: ${name}: SHA-256 ${got}, expected ${want} (scripts/tokenizer.sha256)`);
        bad++;
        continue;
    }
    fs.writeFileSync(dest + '.tmp', text);
    fs.renameSync(dest + '.tmp', dest);
    console.log(`tokenizer-data: ${dest}`);
}
process.exit(bad ? 1 : 0);
