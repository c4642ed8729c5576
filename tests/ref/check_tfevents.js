// check_tfevents.js: reads a TensorBoard event file with reference readers and checks it against
// the run's metrics (JSON lines), for tests/test_tensorboard.sh.
//   node check_tfevents.js EVENTS METRICS FIRST_STEP T0 T1 [partial]
// The TFRecord framing is read with @roboflow/tfrecords' helpers (its CRC-32C, its mask, its
// little-endian length), each record decoded by protobufjs against TensorBoard's own event.proto
// (tests/ref/tensorboard_proto). Checked: every record's two CRCs; the first record is
// file_version "brain.Event:2" and nothing else; then one Event per metrics line, steps FIRST_STEP,
// FIRST_STEP + 1, ... as the lines', wall times within [T0, T1] (unix seconds) and not
// decreasing; every scalar of each line equals its tag's simple_value as float32 (the line's
// printed digits allowed for), and every tag is one of a line's scalars or a documented extra.
// With "partial" (a run killed mid-step): the file may end inside a record, and the events may
// stop one step short of the metrics (a step's line is written before its event).
// Prints one summary line; exits 1 with the failures listed.
'use strict';
const fs = require('fs');
const path = require('path');
const deps = path.join(process.env.PT_DEPS_DIR || path.join(__dirname, '../../.deps'), 'node_modules');
const tfr = require(path.join(deps, '@roboflow/tfrecords/src/tensorFlowHelpers'));
const protobuf = require(path.join(deps, 'protobufjs'));

const [eventsPath, metricsPath, firstArg, t0Arg, t1Arg, mode] = process.argv.slice(2);
const partial = mode === 'partial';
const fails = [];
const fail = (m) => { if (fails.length < 20) fails.push(m); };

// TensorBoard's schema, its imports resolved from tests/ref/tensorboard_proto
const protoRoot = path.join(__dirname, 'tensorboard_proto');
const root = new protobuf.Root();
root.resolvePath = (origin, target) =>
  path.isAbsolute(target) ? target : path.join(protoRoot, target);
root.loadSync('tensorboard/compat/proto/event.proto', { keepCase: true });
const Event = root.lookupType('tensorboard.Event');

// the records: [len u64][masked crc32c(len)][data][masked crc32c(data)]
const buf = fs.readFileSync(eventsPath);
const events = [];
let pos = 0, tail = 0;
while (pos < buf.length) {
  if (buf.length - pos < 12) { tail = buf.length - pos; break; }
  const lenBuf = buf.slice(pos, pos + 8);
  const n = tfr.readInt64(lenBuf);
  if (tfr.maskCrc(tfr.crc32c(lenBuf)) !== buf.readUInt32LE(pos + 8)) {
    fail(`record ${events.length} at byte ${pos}: the length's CRC does not match`);
    break;
  }
  if (buf.length - pos < 12 + n + 4) { tail = buf.length - pos; break; }
  const data = buf.slice(pos + 12, pos + 12 + n);
  if (tfr.maskCrc(tfr.crc32c(data)) !== buf.readUInt32LE(pos + 12 + n)) {
    fail(`record ${events.length} at byte ${pos}: the data's CRC does not match`);
    break;
  }
  events.push(Event.toObject(Event.decode(data), { longs: Number, defaults: false }));
  pos += 12 + n + 4;
}
if (tail && !partial) fail(`the file ends inside a record (${tail} bytes after the last one)`);

// a metrics line with its numbers kept as written ("#1.25e-3"), for the digits they carry
function rawJSON(line) {
  let out = '';
  for (let i = 0; i < line.length;) {
    if (line[i] === '"') {
      let j = i + 1;
      while (line[j] !== '"') j += line[j] === '\\' ? 2 : 1;
      out += line.slice(i, j + 1); i = j + 1;
    } else if (/[-0-9]/.test(line[i])) {
      let j = i;
      while (j < line.length && /[-+0-9.eE]/.test(line[j])) j++;
      out += '"#' + line.slice(i, j) + '"'; i = j;
    } else out += line[i++];
  }
  return JSON.parse(out);
}

// a line's scalars by TensorBoard tag (docs/guide.md, "TensorBoard")
const top = {
  loss: 'loss', lr: 'lr', grad_norm: 'grad_norm', tokens: 'tokens', seconds: 'step_seconds',
  tokens_per_s: 'tokens_per_s', mfu: 'mfu', mfu_datasheet: 'mfu_datasheet',
  peak_rss_bytes: 'memory/peak_rss_bytes', device_peak_bytes: 'memory/device_peak_bytes',
  allocs: 'allocs', skipped: 'skipped', val_loss: 'val_loss', val_tokens: 'val_tokens',
  aux_loss: 'moe/aux_loss', z_loss: 'moe/z_loss', comm_steps: 'comm/steps',
  comm_bytes: 'comm/bytes', comm_wait_s: 'comm/blocked_s',
};
const arrays = { // key -> (index, element) -> tag
  ep_rows: (i) => ['moe/ep_rows_sent', 'moe/ep_rows_received'][i],
  pp_idle: (i) => `pp/stage${i}/idle`, pp_busy: (i) => `pp/stage${i}/busy_s`,
  pp_head: (i) => `pp/stage${i}/head_s`, cp_attn_pairs: (i) => `cp/rank${i}/attn_pairs`,
};
const objects = { // key -> (name, index or -1) -> tag
  data_share: (k) => `data_share/${k}`,
  expert_load: (k, i) => `moe/layer${k}/${['load_min', 'load_max', 'load_mean', 'load_max_over_mean'][i]}`,
  comm: (k, i) => `comm_op/${k}/${['calls', 'bytes', 'blocked_s'][i]}`,
  comm_groups: (k) => `comm/${k}/bytes`, comm_wait_groups: (k) => `comm/${k}/blocked_s`,
  mem: (k) => `memory/${k}_bytes`,
};
function scalars(r) {
  const out = new Map();
  for (const [k, v] of Object.entries(r)) {
    if (k === 'step') continue;
    if (k in top) out.set(top[k], v);
    else if (k in arrays) v.forEach((x, i) => out.set(arrays[k](i), x));
    else if (k in objects)
      for (const [name, x] of Object.entries(v))
        if (Array.isArray(x)) x.forEach((y, i) => out.set(objects[k](name, i), y));
        else out.set(objects[k](name, -1), x);
    else fail(`step ${r.step['#'] ?? r.step}: the metrics key "${k}" has no TensorBoard tag`);
  }
  return out;
}

// x the float32 of the value that text stands for: within half its last digit, then rounded
function same(text, x) {
  if (text === null) return !Number.isFinite(x); // JSON's null: a loss or norm not finite
  const t = text.slice(1), v = Number(t);
  const [mant, exp = '0'] = t.toLowerCase().split('e');
  const frac = mant.includes('.') ? mant.split('.')[1].length : 0;
  const unit = Math.pow(10, Number(exp) - frac);
  return Math.fround(v) === x || Math.abs(x - v) <= unit / 2 * (1 + 1e-9) + Math.abs(v) * Math.pow(2, -24);
}

const lines = fs.readFileSync(metricsPath, 'utf8').split('\n').filter((l) => l.trim());
const rows = lines.map(rawJSON);
const first = Number(firstArg), t0 = Number(t0Arg), t1 = Number(t1Arg);
const ev0 = events[0] || {};
if (ev0.file_version !== 'brain.Event:2' || ev0.summary)
  fail(`the first record is not file_version "brain.Event:2" alone: ${JSON.stringify(ev0)}`);
const steps = events.slice(1);
const want = rows.filter((r) => Number(r.step.slice(1)) >= first);
if (partial ? steps.length < want.length - 1 || steps.length > want.length : steps.length !== want.length)
  fail(`${steps.length} step events for ${want.length} metrics lines from step ${first}`);
let prevWall = t0, nValues = 0;
steps.forEach((e, i) => {
  const r = want[i];
  if (!r) return;
  const step = Number(r.step.slice(1));
  if (e.step !== first + i || e.step !== step) fail(`event ${i + 1}: step ${e.step}, its metrics line's ${step}`);
  if (!(e.wall_time >= prevWall && e.wall_time <= t1))
    fail(`step ${e.step}: wall time ${e.wall_time} outside [${prevWall}, ${t1}]`);
  prevWall = e.wall_time;
  const got = new Map((e.summary?.value || []).map((v) => [v.tag, v.simple_value ?? 0]));
  const exp = scalars(r);
  for (const [tag, text] of exp) {
    if (!got.has(tag)) fail(`step ${step}: no tag ${tag} (metrics ${text})`);
    else if (!same(text, got.get(tag))) fail(`step ${step}: ${tag} = ${got.get(tag)}, metrics ${text}`);
    nValues++;
  }
  for (const [tag, x] of got) {
    if (exp.has(tag)) continue;
    // what the line leaves out: the validation's seconds (the log's), a step not skipped, and
    // a group that did not communicate in the window
    const extra = (tag === 'val_seconds' && exp.has('val_loss') && x > 0) ||
      (tag === 'skipped' && x === 0) ||
      (/^comm\/[^/]+\/(bytes|blocked_s)$/.test(tag) && exp.has('comm/steps') && x === 0);
    if (!extra) fail(`step ${step}: tag ${tag} = ${x} is not in the metrics line`);
  }
});
const tags = new Set(steps.flatMap((e) => (e.summary?.value || []).map((v) => v.tag)));
console.log(`${path.basename(eventsPath)}: ${events.length} records (steps ` +
  `${steps.length ? steps[0].step + '-' + steps[steps.length - 1].step : 'none'}), ${nValues} values ` +
  `checked against the metrics, ${tags.size} tags${tail ? `, ${tail} bytes of an unfinished record` : ''}`);
if (process.env.PT_TB_TAGS) console.log([...tags].sort().join(' '));
if (fails.length) {
  fails.forEach((m) => console.log('  ' + m));
  process.exit(1);
}
