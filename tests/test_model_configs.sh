#!/usr/bin/env bash
# test_model_configs.sh PENTATRON: the training configs of published models (configs/llama3.1_8b.ini,
# llama3.1_70b.ini, qwen2.5_7b.ini, mixtral_8x7b.ini):
#   - their architecture has the published parameter count: the planner's count (the trainer's own
#     parameter table, one fp32 rank: 4 bytes a parameter) within 0.5% of the figure the model's
#     publisher gives, and equal to the total of its published checkpoint; the trainer's own count
#     (its memory check's line) the same;
#   - the trainer accepts every key: `train` gets past the configuration's and the model's checks
#     to its memory check before allocating (refused there with a limit of 1 byte, one message);
#   - its architecture is the published config.json's, as the trainer reads a Hugging Face
#     config.json (model.init_from: an explicit architecture key that contradicts it is refused):
#     each config.json below is transcribed from the source the config cites;
#   - its [model] section is its planning case's (configs/plan/), so that the two cannot drift;
#   - the layouts it lists (one per GPU count, as flags) are each `plan --search`'s first at that
#     count on hardware/h100_sxm.ini, fit with the search's headroom, plan at the figures written
#     beside them, and the config's own [parallel] section is the one for its GPU count; a count
#     written "no layout fits" has none;
#   - its data globs are what `pentatron prepare --out DIR --val-documents N` writes
#     (DIR/train_*.bin and DIR/val_*.bin), the DIR of the prepare command its comments give.
set -u
bin="$1"
src="${PT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"
PY="${PT_PYTHON:-/usr/bin/python3}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
hw="$src/hardware/h100_sxm.ini"

# the published config.json of each model (the sources each training config cites: mlc-ai/mlc-llm
# python/mlc_llm/model/model_preset.py at 79d603f for Llama 3.1 and Mixtral, its keys as there;
# Lightning-AI/litgpt litgpt/config.py at 2685705 for Qwen 2.5 7B, its values under config.json's
# names)
published_config() { # CONFIG: config.json to stdout
  case "$1" in
  llama3.1_8b.ini|llama3.1_70b.ini)
    local h=4096 l=32 heads=32 ffn=14336
    [ "$1" = llama3.1_70b.ini ] && h=8192 l=80 heads=64 ffn=28672
    cat <<JSON
{"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
 "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
 "hidden_size": $h, "initializer_range": 0.02, "intermediate_size": $ffn,
 "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
 "num_attention_heads": $heads, "num_hidden_layers": $l, "num_key_value_heads": 8,
 "pretraining_tp": 1, "rms_norm_eps": 1e-05,
 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
 "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
 "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 128256}
JSON
    ;;
  qwen2.5_7b.ini)
    cat <<JSON
{"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
 "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
 "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
 "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
 "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
 "use_sliding_window": false, "vocab_size": 152064}
JSON
    ;;
  mixtral_8x7b.ini)
    cat <<JSON
{"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
 "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
 "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
 "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
 "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
 "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
 "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
 "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000}
JSON
    ;;
  esac
}

# CONFIG PLANNING_CASE PUBLISHED CHECKPOINT_TOTAL. PUBLISHED: the publisher's figure —
# Llama 3.1 8B and 70B: Meta's model pages on Hugging Face (meta-llama/Llama-3.1-8B, -70B:
# "8.03B params", "70.6B params"); Qwen 2.5 7B: its model card (Qwen/Qwen2.5-7B: "Number of
# Parameters: 7.61B"); Mixtral 8x7B: Mistral AI's announcement ("Mixtral of experts", 2023-12-11:
# "46.7B total parameters"). CHECKPOINT_TOTAL: the parameters of the published safetensors
# checkpoint (Hugging Face's safetensors metadata of each repository).
while read -r cfg case published total; do
  c="$src/configs/$cfg"
  # the parameter count: one fp32 rank of the model, so 4 bytes a parameter
  "$bin" plan --config "$c" --hardware "$hw" --hardware.nodes=1 --parallel.dp=1 --parallel.tp=1 \
    --parallel.pp=1 --parallel.cp=1 --parallel.ep=1 --parallel.zero=0 --parallel.sp=false \
    --training.precision=fp32 --training.global_batch=1 --training.micro_batch=1 --anyway --json \
    > "$tmp/count.json" 2> "$tmp/count.err" || { bad "$cfg: plan of one rank failed: $(cat "$tmp/count.err")"; continue; }
  # the trainer: every key past its checks, to its memory check (limit 1 byte), with its count
  out="$(timeout 60 "$bin" train --config "$c" --training.memory_limit=1 2>&1)"; rc=$?
  "$PY" - "$tmp/count.json" "$cfg" "$published" "$total" "$rc" "$out" <<'PY' && ok || bad "$cfg: parameter count or the trainer's checks"
import json, re, sys
p = json.loads(open(sys.argv[1]).readline())
cfg, published, total, rc, out = sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
n = p["memory_per_stage"][0]["params"] / 4
refusals = out.count("this rank needs at least")
m = re.search(r"([\d.]+e\+\d+) parameters", out)
trainer = float(m.group(1)) if m else float("nan")
digits = len(m.group(1).split("e")[0].replace(".", "")) if m else 0
print(f"{cfg}: {n:,.0f} parameters planned ({n / published - 1:+.3%} from the published "
      f"{published / 1e9:g}B; checkpoint {total:,}); the trainer: exit {rc}, {refusals} memory "
      f"refusal, {m.group(1) if m else 'no count'} parameters")
sys.exit(0 if abs(n / published - 1) <= 0.005 and n == total and rc == 2 and refusals == 1 and
         len(out.strip().splitlines()) == 1 and abs(trainer / n - 1) <= 0.5 * 10 ** (1 - digits) else 1)
PY

  # the architecture is the published config.json's: the trainer reads it as model.init_from's and
  # refuses an explicit architecture key that contradicts it; agreeing, it goes on to its memory
  # check (the weights are read only after it)
  mkdir -p "$tmp/hf" && published_config "$cfg" > "$tmp/hf/config.json"
  out="$(timeout 60 "$bin" train --config "$c" --model.init_from="$tmp/hf" --training.memory_limit=1 2>&1)"; rc=$?
  # (model.max_seq_len, a training key, overrides config.json's context: one line saying so)
  if [ $rc -eq 2 ] && [ "$(grep -c "this rank needs at least" <<<"$out")" -eq 1 ] &&
     [ "$(grep -vc "this rank needs at least\|^model.max_seq_len = [0-9]* (explicit) overrides" <<<"$out")" -eq 0 ]; then ok
  else bad "$cfg: not the published config.json's architecture: exit $rc: $(grep -v "(explicit) overrides" <<<"$out")"; fi

  # the [model] section is the planning case's
  "$PY" - "$c" "$src/configs/plan/$case" <<'PY' && ok || bad "$cfg: [model] differs from configs/plan/$case"
import configparser, sys
def model(path):
    p = configparser.ConfigParser(comment_prefixes=(";", "#"), inline_comment_prefixes=None)
    p.read(path)
    return dict(p["model"])
a, b = model(sys.argv[1]), model(sys.argv[2])
diff = {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
print("[model] against the planning case:", diff or "the same")
sys.exit(1 if diff else 0)
PY

  # the data globs: what prepare --out DIR --val-... writes, DIR as in the comments' prepare command
  for which in train val; do
    glob="$(sed -n "s/^$which = \"\(.*\)\"$/\1/p" "$c")"
    dir="${glob%/${which}_\*.bin}"
    if [ -n "$glob" ] && [ "$dir" != "$glob" ] && grep -qE "^;.*--out $dir --val-(documents|fraction) " "$c"; then ok
    else bad "$cfg: data.$which = '$glob' is not DIR/${which}_*.bin of a prepare --out DIR --val-... in its comments"; fi
  done

  # the layouts: each listed one is the search's first at its count, fits, and plans at the
  # figures written; the config's own layout is the one for its GPU count
  own="$(sed -n 's/^; .* pretrained on \([0-9]*\) H100s.*/\1/p' "$c")"
  "$PY" - "$c" > "$tmp/layouts" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
for i, l in enumerate(lines):
    m = re.match(r"; (\d+) GPUs \((\d+) nodes?\): (.*)", l)
    if not m:
        continue
    flags = []
    for f in lines[i + 1:]:
        if not f.startswith(";   --"):
            break
        flags += f[1:].split()
    print(m.group(1), m.group(2), "|", m.group(3), "|", " ".join(flags))
PY
  [ -s "$tmp/layouts" ] && grep -q "^$own " "$tmp/layouts" || bad "$cfg: no layout listed for its own $own GPUs"
  while IFS='|' read -r gpus written flags; do
    read -r gpus nodes <<<"$gpus"
    "$bin" plan --config "$c" --hardware "$hw" --hardware.nodes="$nodes" --search --plan.top=1 --json \
      > "$tmp/best.json" 2> "$tmp/best.err"; search_rc=$?
    if grep -q "no layout fits" <<<"$written"; then
      [ $search_rc -eq 2 ] && [ ! -s "$tmp/best.json" ] && ok || bad "$cfg: $gpus GPUs written as none fitting, search exit $search_rc"
      continue
    fi
    [ $search_rc -eq 0 ] || { bad "$cfg: search at $gpus GPUs failed: $(cat "$tmp/best.err")"; continue; }
    # the listed flags over the config (they are words); at its own count, the config alone too
    # shellcheck disable=SC2086
    if ! "$bin" plan --config "$c" --hardware "$hw" --hardware.nodes="$nodes" $flags --json > "$tmp/listed.json" 2> "$tmp/p.err"; then
      bad "$cfg: $gpus GPUs: plan of the listed layout failed: $(cat "$tmp/p.err")"; continue
    fi
    cp "$tmp/listed.json" "$tmp/own.json"
    if [ "$gpus" = "$own" ] && ! "$bin" plan --config "$c" --hardware "$hw" --hardware.nodes="$nodes" --json > "$tmp/own.json" 2> "$tmp/p.err"; then
      bad "$cfg: plan of its own layout at $gpus GPUs failed: $(cat "$tmp/p.err")"; continue
    fi
    "$PY" - "$tmp" "$cfg $gpus GPUs" "$written" <<'PY' && ok || bad "$cfg: $gpus GPUs: the listed layout is not the search's first, or its figures differ"
import json, re, sys
t, name, written = sys.argv[1], sys.argv[2], sys.argv[3]
best, listed, own = (json.loads(open(f"{t}/{n}.json").readline()) for n in ("best", "listed", "own"))
keys = ("dp", "tp", "sp", "pp", "cp", "ep", "zero", "schedule", "chunks", "micro_batch", "recompute")
lay = lambda p: tuple(p[k] for k in keys)
m = re.match(r"\s*([\d.]+) s a step, MFU ([\d.]+)%, largest rank ([\d.]+) GB", written)
step, mfu, gb = (float(x) for x in m.groups()) if m else (0, 0, 0)
print(f"{name}: listed {dict(zip(keys, lay(listed)))}: {listed['step_seconds']:.4g} s, MFU "
      f"{100 * listed['mfu']:.1f}%, {listed['memory_bytes_max'] / 1e9:.2f} GB (written: {written.strip()})")
ok = lay(listed) == lay(best) and lay(own) == lay(listed) and \
     listed["memory_bytes_max"] <= 0.9 * 80e9 and \
     abs(listed["step_seconds"] / step - 1) <= 0.005 and abs(100 * listed["mfu"] - mfu) <= 0.051 and \
     abs(listed["memory_bytes_max"] / 1e9 - gb) <= 0.0051
sys.exit(0 if ok else 1)
PY
  done < "$tmp/layouts"
done <<'CONFIGS'
llama3.1_8b.ini llama31_8b_8h100.ini 8.03e9 8030261248
llama3.1_70b.ini llama70b_512h100.ini 70.6e9 70553706496
qwen2.5_7b.ini qwen25_7b_8h100.ini 7.61e9 7615616512
mixtral_8x7b.ini mixtral8x7b_512h100.ini 46.7e9 46702792704
CONFIGS

echo "test_model_configs: $pass passed, $fail failed"
[ $fail -eq 0 ]
