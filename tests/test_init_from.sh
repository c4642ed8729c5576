#!/usr/bin/env bash
# test_init_from.sh PENTATRON: model.init_from together with explicit model.* keys (INI file or
# command line), on a small mixture-of-experts model exported with router_aux_loss_coef = 0:
#   - an explicit training-time key wins over the checkpoint's config.json and is logged once:
#     --model.aux_loss_coef=0.5 (and the same key in an INI file) gives, step for step, the
#     losses of a run whose config.json itself says 0.5 (the reference), not those of 0;
#   - an explicit architecture key that contradicts the checkpoint fails before any work with
#     one message naming both values and a non-zero exit, on one process and on 2 ranks;
#   - an explicit architecture key that agrees changes nothing (the same losses as without it).
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
moe=(--model.n_layers=2 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.aux_loss_coef=0 --training.micro_batch=8)
run 1 src "${moe[@]}" --training.steps=1 --checkpoint.dir="$tmp/ck" || bad "source run failed"
"$bin" export --checkpoint "$tmp/ck/step_00000001" --out "$tmp/hf" > "$tmp/export.log" 2>&1 ||
  bad "export failed: $(tail -2 "$tmp/export.log")"
grep -q '"router_aux_loss_coef": 0' "$tmp/hf/config.json" || bad "the export's aux coefficient is not 0"
# the reference: the same directory whose config.json says 0.5
cp -r "$tmp/hf" "$tmp/hf05"
sed -i 's/"router_aux_loss_coef": 0[.0]*,/"router_aux_loss_coef": 0.5,/' "$tmp/hf05/config.json"
grep -q '"router_aux_loss_coef": 0.5' "$tmp/hf05/config.json" || bad "could not write the reference config"

# metrics lines without the timing fields: loss, grad_norm, aux_loss, z_loss per step
losses() { /usr/bin/python3 -c '
import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    print(m["step"], m["loss"], m["grad_norm"], m["aux_loss"], m["z_loss"])' "$1"; }
same() { # A B WHAT: the two runs' per-step figures are identical
  if cmp -s <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl"); then ok
  else bad "$3: $1 and $2 differ: $(diff <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl") | head -4)"; fi
}
tiny+=(--training.steps=3 --training.micro_batch=8)

run 1 plain --model.init_from="$tmp/hf" || bad "init_from failed: $(tail -2 "$tmp/plain.log")"
run 1 ref05 --model.init_from="$tmp/hf05" || bad "init_from (0.5) failed: $(tail -2 "$tmp/ref05.log")"
run 1 cli05 --model.init_from="$tmp/hf" --model.aux_loss_coef=0.5 ||
  bad "init_from with an explicit aux coefficient failed: $(tail -2 "$tmp/cli05.log")"
same ref05 cli05 "the explicit --model.aux_loss_coef=0.5"
msg="model.aux_loss_coef = 0.5 (explicit) overrides the checkpoint's 0"
n=$(grep -cF "$msg" "$tmp/cli05.log")
[ "$n" -eq 1 ] && ok || bad "'$msg' logged $n times: $(head -5 "$tmp/cli05.log")"
/usr/bin/python3 -c '
import json, sys
a = [json.loads(l)["aux_loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["aux_loss"] for l in open(sys.argv[2])]
print("aux_loss per step: checkpoint 0:", a, "explicit 0.5:", b)
sys.exit(0 if all(x == 0 for x in a) and all(y > 0.4 for y in b) else 1)' \
  "$tmp/plain.jsonl" "$tmp/cli05.jsonl" && ok || bad "the aux loss is not 0 without the key and on with it"
printf '[model]\naux_loss_coef = 0.5\ninit_from = %s\n' "$tmp/hf" > "$tmp/run.ini"
run 1 ini05 --config "$tmp/run.ini" || bad "INI run failed: $(tail -2 "$tmp/ini05.log")"
same ref05 ini05 "aux_loss_coef = 0.5 in the INI file"
# max_seq_len is training-time too (the rotary table's size)
run 1 seq --model.init_from="$tmp/hf" --model.max_seq_len=48 || bad "explicit max_seq_len failed"
grep -qF "model.max_seq_len = 48 (explicit) overrides the checkpoint's 32" "$tmp/seq.log" && ok ||
  bad "max_seq_len override not logged: $(head -3 "$tmp/seq.log")"
same plain seq "an explicit larger max_seq_len"

# an architecture key that agrees with the checkpoint: nothing changes, nothing is logged
run 1 agree --model.init_from="$tmp/hf" --model.dim=32 --model.n_experts=4 --model.top_k=2 ||
  bad "agreeing architecture keys failed: $(tail -2 "$tmp/agree.log")"
same plain agree "agreeing architecture keys"
grep -q "(explicit)" "$tmp/agree.log" && bad "agreeing keys logged an override" || ok

# one that contradicts it: one message naming both values, a non-zero exit, before any step
contradicts() { # NP NEEDLE ARGS...
  local np="$1" needle="$2"; shift 2
  local out rc launcher=()
  [ "$np" -gt 1 ] && launcher=(timeout 60 mpiexec -np "$np")
  out="$("${launcher[@]}" "$bin" train "${tiny[@]}" --model.init_from="$tmp/hf" "$@" 2>&1)"; rc=$?
  local n; n=$(grep -cF -- "$needle" <<<"$out")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] && ! grep -q "^step" <<<"$out"; then ok
  else bad "np $np $*: exit $rc, '$needle' printed $n times: $(head -3 <<<"$out")"; fi
}
contradicts 1 "model.dim = 64 (explicit) contradicts the checkpoint's 32" --model.dim=64
contradicts 1 "model.n_experts = 8 (explicit) contradicts the checkpoint's 4" --model.n_experts=8
contradicts 1 "model.tied_embeddings = true (explicit) contradicts the checkpoint's false" \
  --model.tied_embeddings=true
contradicts 1 "model.rope_theta = 500000 (explicit) contradicts the checkpoint's 10000" \
  --model.rope_theta=500000
contradicts 2 "model.top_k = 1 (explicit) contradicts the checkpoint's 2" --model.top_k=1 --parallel.dp=2 \
  --training.micro_batch=4

echo "test_init_from: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
