#!/usr/bin/env node
// The tokenizer beside the npm tiktoken package (WASM), on the same inputs in the same run:
// mixed text, code, CJK, and the worst cases (one letter repeated, a long run without
// whitespace). Prints MB/s (10^6 bytes per second, one thread) of both and their ratio, and
// checks on each input that both give the same number of tokens.
// tiktoken is quadratic on the worst cases (its issues #195, #391): it gets a 20 KB prefix of
// them (the figure stays comparable as a rate), moongate gets 20 KB and the full size.
//   node bench/token.mjs [ENCODING]      (make bench runs it through bench/micro)
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const root = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(path.join(root, 'tests', 'package.json'));
const { get_encoding } = require('tiktoken');
const ENC = process.argv[2] || 'o200k_base';
const BENCH = process.env.TOKEN_BENCH || path.join(root, 'build', 'token_bench');
const DATA = path.join(root, 'data', 'tokenizer');
const out = fs.mkdtempSync(path.join(os.tmpdir(), 'mg-token-bench-'));

let seed = 42;
const rnd = () => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed / 0x80000000;
};
const pick = (a) => a[Math.floor(rnd() * a.length)];
const WORDS = ('the of and to in is that for it with as was on be by this are from at or an which ' +
    'gateway model token request provider route stream usage cost tenant policy latency queue ' +
    'answer upstream limit budget record account numbers cache prompt reply engine local cloud ' +
    "don't it's we'll they're Moongate OpenAI Anthropic JSON HTTP API 2025 42 3.14 1,000 e.g.").split(' ');
function prose(bytes) {
    let s = '';
    while (s.length < bytes) {
        let sent = pick(WORDS);
        sent = sent[0].toUpperCase() + sent.slice(1);
        for (let k = 4 + Math.floor(rnd() * 14); k > 0; k--) sent += ' ' + pick(WORDS);
        s += sent + pick(['. ', '. ', ', ', '? ', '!\n', '.\n\n']);
    }
    return s;
}
function code(bytes) {
    const ids = ['req', 'ctx', 'buf', 'len', 'n', 'i', 'provider', 'route_id', 'tokens', 'mg_call_t'];
    const lines = [
        () => `    for (size_t ${pick(ids)} = 0; ${pick(ids)} < ${pick(ids)}->${pick(ids)}; ${pick(ids)}++) {`,
        () => `        if (${pick(ids)} == NULL) return -${Math.floor(rnd() * 100)};`,
        () => `def ${pick(ids)}(${pick(ids)}, ${pick(ids)}=None):\n    return [x for x in ${pick(ids)} if x]`,
        () => `const ${pick(ids)} = await fetch(\`/v1/${pick(ids)}\`, { method: 'POST', body: JSON.stringify(${pick(ids)}) });`,
        () => `    }\n}\n`,
        () => `// ${prose(40).trim()}`,
        () => `\tfmt.Printf("%d %s\\n", ${pick(ids)}, ${pick(ids)})`,
    ];
    let s = '';
    while (s.length < bytes) s += pick(lines)() + '\n';
    return s;
}
function cjk(bytes) {
    const zh = '的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴切府'.split('');
    const ja = 'あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテト日本語東京大阪'.split('');
    let s = '';
    while (Buffer.byteLength(s) < bytes) {
        for (let k = 5 + Math.floor(rnd() * 20); k > 0; k--) s += pick(rnd() < 0.7 ? zh : ja);
        s += pick(['，', '。', '、', '！', '？\n', ' ']);
    }
    return s;
}
const SIZE = 2_000_000;
const english = prose(SIZE), src = code(SIZE), asian = cjk(SIZE);
let mixed = '';
while (mixed.length < SIZE) {
    const r = rnd(), at = Math.floor(rnd() * (SIZE - 3000));
    const from = r < 0.7 ? english : r < 0.85 ? src : asian;
    mixed += from.slice(at, at + 200 + Math.floor(rnd() * 2000));
}
let nospace = '';
for (let i = 0; i < 1_000_000; i++) nospace += String.fromCharCode(97 + Math.floor(rnd() * 26));
const inputs = [
    { name: 'mixed', text: mixed },
    { name: 'english', text: english },
    { name: 'code', text: src },
    { name: 'cjk', text: asian },
    { name: 'worst: "a" x 20k', text: 'a'.repeat(20_000) },
    { name: 'worst: no whitespace 20k', text: nospace.slice(0, 20_000) },
    { name: 'worst: "a" x 1M', text: 'a'.repeat(1_000_000), moongateOnly: true },
    { name: 'worst: no whitespace 1M', text: nospace, moongateOnly: true },
    { name: 'worst: "a" x 10M', text: 'a'.repeat(10_000_000), moongateOnly: true },
];
const files = inputs.map((x, i) => {
    const f = path.join(out, `${i}.txt`);
    fs.writeFileSync(f, x.text);
    return f;
});
const res = spawnSync(BENCH, [DATA, ENC, ...files], { maxBuffer: 1 << 26 });
if (res.status !== 0) {
    console.error(`token_bench failed: ${res.stderr}`);
    process.exit(1);
}
const lines = res.stdout.toString().trim().split('\n').map((l) => JSON.parse(l));
const load = lines.shift();
const enc = get_encoding(ENC);
const rate = (text) => {
    const bytes = Buffer.byteLength(text);
    let runs = 0, n = 0;
    const t0 = process.hrtime.bigint();
    let t;
    do {
        n = enc.encode(text, [], []).length;
        runs++;
        t = Number(process.hrtime.bigint() - t0) / 1e9;
    } while (t < 0.3);
    return { mbps: (bytes * runs) / t / 1e6, n };
};
console.log(`tokenizer ${ENC}: moongate (C, this build) vs npm tiktoken ${JSON.parse(fs.readFileSync(path.join(root, 'tests', 'node_modules', 'tiktoken', 'package.json'), 'utf8')).version} (WASM), MB/s, one thread`);
console.log(`moongate load of the encoding: ${load.load_ms} ms`);
const pad = (s, n) => String(s).padEnd(n);
console.log(`${pad('input', 28)}${pad('MB', 7)}${pad('count', 9)}${pad('encode', 9)}${pad('tiktoken', 10)}ratio (encode/tiktoken)`);
let mismatch = 0;
inputs.forEach((x, i) => {
    const m = lines[i];
    let tk = '-', ratio = '-';
    if (!x.moongateOnly) {
        const r = rate(x.text);
        if (r.n !== m.tokens) mismatch++;
        tk = r.mbps.toFixed(1);
        ratio = `${(m.encode_mbps / r.mbps).toFixed(1)}x`;
    }
    console.log(`${pad(x.name, 28)}${pad((m.bytes / 1e6).toFixed(2), 7)}${pad(m.count_mbps.toFixed(1), 9)}` +
        `${pad(m.encode_mbps.toFixed(1), 9)}${pad(tk, 10)}${ratio}`);
});
fs.rmSync(out, { recursive: true, force: true });
if (mismatch) {
    console.error(`${mismatch} input(s) where the token counts differ`);
    process.exit(1);
}
