// Reference GPT-2 encoders for test_gpt2_tokenizer.py and bench/bpe_bench.py, run under Node.js:
// gpt-3-encoder (GPT-2's encoder.py ported to JavaScript) and @dqbd/tiktoken (tiktoken's Rust core compiled to
// WebAssembly), both installed by npm into the directory given first.
//   node gpt2_reference.cjs NODE_MODULES encode IN OUT...  -> OUT = {"gpt3": [ids], "tiktoken": [ids]}
//   node gpt2_reference.cjs NODE_MODULES docs IN SEP OUT    -> OUT = {"gpt3": [[ids] per document], "tiktoken": ...},
//                                                             documents = IN cut at SEP, empty ones dropped
//   node gpt2_reference.cjs NODE_MODULES pieces IN OUT      -> OUT = [UTF-8 byte length of each regex match]
//   node gpt2_reference.cjs NODE_MODULES bench IN SECONDS   -> one JSON line per encoder: MB/s, tokens/s
// Inputs are read as UTF-8 (valid text only: Node would replace an ill-formed byte with U+FFFD).
'use strict';
const fs = require('fs');
const path = require('path');
const [modules, mode, ...args] = process.argv.slice(2);
const gpt3 = require(path.join(modules, 'gpt-3-encoder'));
const { get_encoding } = require(path.join(modules, '@dqbd/tiktoken'));
const tiktoken = get_encoding('gpt2');

// gpt-3-encoder grows its output with Array.concat once per piece (quadratic in the text), so it gets the
// text in parts of about 4 KB, each cut at "x y" (an ASCII letter on both sides of the space), where a piece
// always ends; tiktoken gets the whole text in one call, so the two agreeing also checks the cuts.
function gpt3_encode(text) {
  const out = [];
  let start = 0;
  const isLetter = (c) => /[A-Za-z]/.test(c);
  for (let k = 4096; k < text.length - 1; k++) {
    if (text[k] === ' ' && isLetter(text[k - 1]) && isLetter(text[k + 1])) {
      for (const id of gpt3.encode(text.slice(start, k))) out.push(id);
      start = k;
      k += 4096;
    }
  }
  for (const id of gpt3.encode(text.slice(start))) out.push(id);
  return out;
}

const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

if (mode === 'encode') {
  for (let i = 0; i + 1 < args.length; i += 2) {
    const text = fs.readFileSync(args[i], 'utf8');
    const ids = { gpt3: gpt3_encode(text), tiktoken: Array.from(tiktoken.encode_ordinary(text)) };
    fs.writeFileSync(args[i + 1], JSON.stringify(ids));
  }
} else if (mode === 'docs') {
  const docs = fs.readFileSync(args[0], 'utf8').split(args[1]).filter((d) => d.length > 0);
  const ids = { gpt3: docs.map(gpt3_encode), tiktoken: docs.map((d) => Array.from(tiktoken.encode_ordinary(d))) };
  fs.writeFileSync(args[2], JSON.stringify(ids));
} else if (mode === 'pieces') {
  const text = fs.readFileSync(args[0], 'utf8');
  const lens = Array.from(text.matchAll(pat)).map((m) => Buffer.byteLength(m[0], 'utf8'));
  fs.writeFileSync(args[1], JSON.stringify(lens));
} else if (mode === 'bench') {
  const text = fs.readFileSync(args[0], 'utf8');
  const bytes = Buffer.byteLength(text, 'utf8');
  const seconds = Number(args[1]);
  for (const [name, enc] of [['gpt-3-encoder', gpt3_encode], ['tiktoken', (t) => tiktoken.encode_ordinary(t)]]) {
    enc(text);  // warm-up: caches, JIT, WebAssembly compilation
    let runs = 0, tokens = 0;
    const t0 = process.hrtime.bigint();
    let dt = 0;
    do {
      tokens = enc(text).length;
      runs++;
      dt = Number(process.hrtime.bigint() - t0) / 1e9;
    } while (dt < seconds);
    console.log(JSON.stringify({ encoder: name, runs, seconds: dt, bytes, tokens,
                                 mb_per_s: (bytes * runs) / dt / 1e6, tokens_per_s: (tokens * runs) / dt }));
  }
} else {
  console.error(`gpt2_reference.cjs: unknown mode '${mode}'; expected encode, docs, pieces or bench`);
  process.exit(2);
}
tiktoken.free();
