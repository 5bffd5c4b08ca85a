// The tokenizer against the npm tiktoken package itself, token for token: a corpus of
// languages, code, emoji, whitespace and digit runs, contractions, special tokens allowed
// and not, ill-formed UTF-8, random strings built from vocabulary pieces, and a sweep over
// every assigned code point (which proves the Unicode class table is the package's).
// Runs build/token_dump (TOKEN_DUMP) once over all cases; `moongate tokenize` (MOONGATE_BIN)
// for the command line. ctest: token/tiktoken.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const root = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const require = createRequire(path.join(root, 'tests', 'package.json'));
const { get_encoding } = require('tiktoken');
const DATA = process.env.TOKEN_DATA_DIR || path.join(root, 'data', 'tokenizer');
const DUMP = process.env.TOKEN_DUMP || path.join(root, 'build', 'token_dump');
const BIN = process.env.MOONGATE_BIN || path.join(root, 'build', 'moongate');
const ENCODINGS = ['o200k_base', 'cl100k_base'];
const tik = Object.fromEntries(ENCODINGS.map((e) => [e, get_encoding(e)]));
const decoder = new TextDecoder('utf-8'); // the maximal-subpart repair tiktoken's input gets

// a small deterministic generator (mulberry32), so a failure can be replayed
function rng(seed) {
    return () => {
        seed = (seed + 0x6d2b79f5) | 0;
        let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
        t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

const TEXTS = {
    english: "The quick brown fox jumps over the lazy dog. It's 5 o'clock somewhere; we'll see.\n" +
        'Gateways meter tokens, and the numbers must add up: ' + 'an accountant checks them. '.repeat(20),
    contractions: "I'm you're he's she'd we've they'll it'S DON'T Can'T WE'RE I'M 'll 'd 're ' s's " +
        "it'ſ he'ſ 'ſ x'Re x'vE O'NEIL rock'n'roll ''s '''ll",
    chinese: '人工智能网关位于应用程序和模型之间，负责路由、限流、计费与观测。今天天气很好，我们去公园散步吧！',
    japanese: '吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。カタカナ、ひらがな、漢字。ｶﾀｶﾅ',
    korean: '대한민국의 수도는 서울입니다. 한국어 문장을 토큰으로 나눕니다. 안녕하세요, 반갑습니다!',
    arabic: 'اللغة العربية جميلة جداً. مرحبا بالعالم! ٠١٢٣٤٥٦٧٨٩ السلام عليكم ورحمة الله',
    others: 'Привет, мир! Γειά σου Κόσμε. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก. Xin chào thế giới. ' +
        'ǅungla ǈubljana ǋ Ⅻ ⅻ ① ½ ² ³ ᾈ ᾼ Σίσυφος ﬁﬂ ß ẞ',
    c: '#include <stdio.h>\nint main(void) {\n\tfor (int i = 0; i < 10; i++) printf("%d\\n", i);\n' +
        '\treturn 0; // done\n}\n/* block */ x->y = &z[3] >> 2 | ~0u;\r\n',
    python: 'def f(x: int) -> list[str]:\n    """Doc."""\n    return [f"{i:03d}" for i in range(x)]\n\n\n' +
        'if __name__ == "__main__":\n    print(f(10))  # ok\n',
    js: "const a = await fetch('/v1/chat', {method:'POST'}); a?.b ?? c; x => x ** 2; `t ${x}`;\n",
    rust: 'fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![1, 2, 3];\n    println!("{:?}", v);\n    Ok(())\n}\n',
    go: 'package main\n\nimport "fmt"\n\nfunc main() {\n\tch := make(chan int, 10)\n\tgo func() { ch <- 1 }()\n\tfmt.Println(<-ch)\n}\n',
    sql_html_json: 'SELECT id, name FROM users WHERE id IN (1,2,3) ORDER BY 2 DESC;\n' +
        '<div class="a"><p>Hi&nbsp;there</p></div>\n{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}\n' +
        'https://example.com/a/b/c?d=e&f=g#h /usr/local/bin//x\n',
    emoji: '👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇺🇸 🧑🏿‍🚀 ❤️‍🔥 😀😃😄 🤷‍♀️ #️⃣ 1️⃣ ©️ ™ ✈︎ a👍b',
    marks: 'e\u0301 \u0301abc \u0301 a\u0308\u0304 \u0301\u0302\u0303x Z\u0351\u0352\u0353 \u0915\u093f',
    whitespace: 'a' + ' '.repeat(100) + 'b\t\t\n\n  \r\n \u00a0\u3000x\u2028y\u0085z  \n \n\n\n   ' +
        '\n\r\n\r\r \t \v\f  end   ',
    digits: '1234567890'.repeat(30) + ' 3.14159 1,000,000 ０１２３４５ ٣٤٥ ⅠⅡⅢ 12ab34 x1y22z333',
    special: '<|endoftext|> hello <|fim_prefix|> there <|fim_middle|> <|endofprompt|><|fim_suffix|>' +
        '<|endoftext|><|endoftext|> <|endoftext <|nope|> <| |> <|endoftext|>x',
};

function cases() {
    const out = [];
    const add = (label, buf) => {
        for (const enc of ENCODINGS)
            for (const special of [0, 1]) out.push({ label, enc, special, buf });
    };
    for (const [k, v] of Object.entries(TEXTS)) add(k, Buffer.from(v));
    add('empty', Buffer.alloc(0));
    add('nel', Buffer.from(' \u00850'));
    add('worst-a', Buffer.from('a'.repeat(20000)));
    add('worst-mixed', Buffer.from('xY'.repeat(3000) + '.'.repeat(3000)));
    add('long-space', Buffer.from(' '.repeat(5000) + 'x' + ' '.repeat(5000)));
    add('long-newlines', Buffer.from('\n'.repeat(3000) + ' \n'.repeat(1000)));
    for (const c of ['^', '0', 'a', "'s", ' ', '\n']) {
        add(`repeat ${JSON.stringify(c)}`, Buffer.from(' ' + c.repeat(2000) + '\n'));
    }
    // ill-formed UTF-8: stray continuation bytes, truncated and overlong sequences,
    // surrogates, code points past U+10FFFF, and random bytes
    const bad = [[0x80], [0xff, 0xfe], [0xc0, 0xaf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80],
        [0xf4, 0x90, 0x80, 0x80], [0xf0, 0x9f, 0x91], [0x61, 0xe4, 0xbd, 0x20], [0xc3],
        [0x20, 0xec, 0x8b, 0xa4, 0xed], [0xe2, 0x82], [0xf8, 0x88, 0x80, 0x80, 0x80]];
    bad.forEach((b, i) => add(`bad-utf8 ${i}`, Buffer.concat([Buffer.from('ab '), Buffer.from(b), Buffer.from(' cd')])));
    const r = rng(19);
    for (let i = 0; i < 40; i++) {
        const b = Buffer.alloc(1 + Math.floor(r() * 60));
        for (let j = 0; j < b.length; j++) b[j] = r() < 0.5 ? 0x61 + Math.floor(r() * 26) : Math.floor(r() * 256);
        add(`random-bytes ${i}`, b);
    }
    // random strings built from vocabulary pieces
    for (const enc of ENCODINGS) {
        const lines = fs.readFileSync(path.join(DATA, `${enc}.tiktoken`), 'utf8').trimEnd().split('\n');
        const seps = ['', '', '', ' ', '\n', "'", '  ', '1', '<|endoftext|>'];
        for (let i = 0; i < 1500; i++) {
            const parts = [];
            for (let k = 1 + Math.floor(r() * 12); k > 0; k--) {
                parts.push(Buffer.from(lines[Math.floor(r() * lines.length)].split(' ')[0], 'base64'));
                parts.push(Buffer.from(seps[Math.floor(r() * seps.length)]));
            }
            const buf = Buffer.concat(parts);
            for (const special of [0, 1]) out.push({ label: `vocab ${enc} ${i}`, enc, special, buf });
        }
    }
    // random text of code points drawn from every class
    const pools = [' ', '\n', '\r', '\t', "'", 'a', 'Z', 's', 'ſ', '1', '٣', '½', '\u0301', '中', 'ー', 'ǅ', 'ʰ',
        '👍', '\u200d', '.', '/', '\u3000', '\u00a0', 'é', 'Σ', 'ß'];
    for (let i = 0; i < 600; i++) {
        let s = '';
        for (let k = Math.floor(r() * 30); k > 0; k--) s += pools[Math.floor(r() * pools.length)];
        add(`mix ${i}`, Buffer.from(s));
    }
    return out;
}

// Every code point of planes 0-3 and 14 (all that Unicode 15 assigns), each in contexts
// that tell its class apart, 96 to a text.
function sweep() {
    const out = [];
    let s = '';
    const flush = () => {
        for (const enc of ENCODINGS) out.push({ label: `sweep ${enc}`, enc, special: 0, buf: Buffer.from(s) });
        s = '';
    };
    const ranges = [[0, 0x323af], [0xe0000, 0xe01ef]];
    let n = 0;
    for (const [lo, hi] of ranges) {
        for (let cp = lo; cp <= hi; cp++) {
            if (cp >= 0xd800 && cp <= 0xdfff) continue;
            const c = String.fromCodePoint(cp);
            s += `${c}a${c}A${c} ${c}1${c}${c}'s ${c}\n`;
            if (++n % 96 === 0) flush();
        }
    }
    flush();
    return out;
}

function runDump(all) {
    const parts = [];
    for (const c of all) parts.push(Buffer.from(`${c.enc} ${c.special} ${c.buf.length}\n`), c.buf);
    const res = spawnSync(DUMP, [DATA], { input: Buffer.concat(parts), maxBuffer: 1 << 30 });
    assert.equal(res.status, 0, `token_dump failed: ${res.stderr}`);
    const lines = res.stdout.toString().trimEnd().split('\n');
    assert.equal(lines.length, all.length);
    return lines.map((l) => JSON.parse(l));
}

function expected(c) {
    const text = decoder.decode(c.buf);
    return Array.from(tik[c.enc].encode(text, c.special ? 'all' : [], []));
}

function compare(all) {
    const got = runDump(all);
    let bad = 0;
    for (let i = 0; i < all.length; i++) {
        const want = expected(all[i]);
        if (JSON.stringify(got[i]) !== JSON.stringify(want)) {
            if (bad++ < 5) {
                console.log(`MISMATCH ${all[i].label} ${all[i].enc} special=${all[i].special}` +
                    ` text=${JSON.stringify(decoder.decode(all[i].buf).slice(0, 200))}` +
                    `\n  got  ${JSON.stringify(got[i]).slice(0, 300)}\n  want ${JSON.stringify(want).slice(0, 300)}`);
            }
        }
    }
    return bad;
}

test('equal to the npm tiktoken package on the corpus', () => {
    const all = cases();
    assert.equal(compare(all), 0);
    // specials: allowed they are one token each, not allowed never
    const sp = all.filter((c) => c.label === 'special');
    const ids = runDump(sp);
    sp.forEach((c, i) => {
        const eot = c.enc === 'o200k_base' ? 199999 : 100257;
        assert.equal(ids[i].includes(eot), c.special === 1);
    });
});

test('equal to the npm tiktoken package on every code point', () => {
    assert.equal(compare(sweep()), 0);
});

test('moongate tokenize: the count, --ids, --encoding, --special', () => {
    const text = "Hello world, it's 2025! 你好 <|endoftext|>";
    for (const enc of ENCODINGS) {
        const ids = spawnSync(BIN, ['tokenize', '--encoding', enc, '--ids', '--data-dir', DATA], { input: text });
        assert.equal(ids.status, 0, ids.stderr.toString());
        assert.deepEqual(JSON.parse(ids.stdout), Array.from(tik[enc].encode(text, [], [])));
        const count = spawnSync(BIN, ['tokenize', `--encoding=${enc}`, '--special', '--data-dir', DATA], { input: text });
        assert.equal(count.stdout.toString(), `${tik[enc].encode(text, 'all', []).length}\n`);
    }
    const dflt = spawnSync(BIN, ['tokenize'], { input: 'hello world' });
    assert.equal(dflt.stdout.toString(), '2\n');
    const bad = spawnSync(BIN, ['tokenize', '--encoding', 'p50k_base'], { input: 'x' });
    assert.equal(bad.status, 2);
    assert.match(bad.stderr.toString(), /unknown encoding 'p50k_base'/);
    const missing = spawnSync(BIN, ['tokenize', '--data-dir', '/nonexistent'], { input: 'x' });
    assert.equal(missing.status, 1);
    assert.match(missing.stderr.toString(), /o200k_base\.tiktoken/);
});
