#!/usr/bin/env bash
# run_bench.sh [--quick] [--precision fp32|bf16] [--out DIR] [--steps-gpt2 N] [--steps-small N]
#              [--threads "1 2"] [--configs "gpt2-small small"]
#
# Speed benchmark: trains the same Llama model on the same batches (a synthetic llm.c shard,
# rows in order, no shuffle) in pentatron and in PyTorch (bench/torch_llama.py), and prints
# per config x threads: tokens/s of both (median over the steps after 2 warmup steps), their
# ratio, pentatron's MFU and the GEMM peak pentatron measured at start of the same run.
#
#   default          GPT-2-small size (dim 768, 12 layers) and small (dim 256, 4 layers), 1 and 2 threads
#   --quick          small config only, fewer steps
#   --precision bf16 mixed precision: per config x threads, four runs: pentatron
#                    --training.precision=bf16, pentatron fp32, PyTorch fp32 (best BLAS, as in the
#                    fp32 mode) and PyTorch autocast bf16 (torch_llama.py --autocast-bf16); prints
#                    tokens/s of each, pentatron-bf16 / torch-fp32, pentatron-bf16 / torch-bf16,
#                    pentatron bf16 / fp32, and pentatron's MFU against the bf16 GEMM peak it
#                    measured at start of that run
#   --configs        which configurations (default both; --quick: small)
#
# Runs are strictly sequential (never two timed things at once). Needs /usr/bin/python3 with
# numpy and torch (Debian python3-torch). PyTorch gets its best settings: the faster of
# Debian's OpenBLAS builds (pthread / openmp, probed here), the fastest OPENBLAS_CORETYPE the CPU
# allows, probed (Debian's 0.3.21 does not recognise recent Xeons and falls back to Prescott),
# thread counts pinned, jemalloc preloaded when available (installed if apt-get can); with
# --precision bf16 also both ATen vector ISAs (its default AVX2 and ATEN_CPU_CAPABILITY=avx512).
#
# env: PT_BENCH_BIN  the pentatron binary (default $root/build/pentatron, built if missing)
#      BENCH_WAIT (s, default 180), BENCH_BUSY (cores, default 0.15): wait for a quiet machine
#      BENCH_RETRY (default 1): run a timed run again when other work used >= BENCH_BUSY cores
#                  during it
#      BENCH_TORCH_CAPS: ATen vector ISAs PyTorch is tried with ("default" = its own choice,
#                  "avx512", ...); default "default" (fp32 mode), "default avx512" (bf16 mode)
#      BENCH_CORETYPES: OPENBLAS_CORETYPEs the probe tries (default: a preset one, then the CPU flags')
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=/usr/bin/python3
out="${BENCH_OUT:-/tmp/pentatron_bench}"
quick=0; steps_gpt2=8; steps_small=20; threads_list="1 2"; warmup=2; precision=fp32; configs_sel=""
while [[ $# -gt 0 ]]; do
    case "$1" in
    --quick) quick=1; steps_small=8 ;;
    --precision) precision="$2"; shift ;;
    --configs) configs_sel="$2"; shift ;;
    --out) out="$2"; shift ;;
    --steps-gpt2) steps_gpt2="$2"; shift ;;
    --steps-small) steps_small="$2"; shift ;;
    --threads) threads_list="$2"; shift ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "run_bench.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
[[ $precision == fp32 || $precision == bf16 ]] || { echo "run_bench.sh: --precision fp32|bf16" >&2; exit 2; }
if [[ -z $configs_sel ]]; then configs_sel="gpt2-small small"; [[ $quick == 1 ]] && configs_sel=small; fi
caps_list="${BENCH_TORCH_CAPS:-$([[ $precision == bf16 ]] && echo "default avx512" || echo default)}"
mkdir -p "$out"
bin="${PT_BENCH_BIN:-$root/build/pentatron}"
if [[ ! -x "$bin" ]]; then
    [[ -n ${PT_BENCH_BIN:-} ]] && { echo "run_bench.sh: PT_BENCH_BIN=$bin is not executable" >&2; exit 2; }
    "$root/scripts/build.sh" >/dev/null
fi
echo "pentatron: $bin" >&2

# ---- quiet machine -----------------------------------------------------------------------------
# The benchmark times 1-2 thread runs; other work on the machine distorts them badly (OpenMP
# barriers spin). Before each timed run, wait (up to BENCH_WAIT s, default 180) until the other
# processes use under BENCH_BUSY cores (default 0.15), sampled over 2 s from /proc/stat.
busy_cores() {
    local a b
    a=($(head -1 /proc/stat)); sleep 2; b=($(head -1 /proc/stat))
    local tot=0 idle i
    for i in 1 2 3 4 5 6 7 8; do tot=$(( tot + b[i] - a[i] )); done
    idle=$(( b[4] - a[4] + b[5] - a[5] ))
    "$PY" -c "print('%.2f' % ($(nproc) * ($tot - $idle) / max(1, $tot)))"
}
wait_quiet() {
    local waited=0 limit="${BENCH_WAIT:-180}" thr="${BENCH_BUSY:-0.15}" b
    while :; do
        b=$(busy_cores)
        if "$PY" -c "import sys; sys.exit(0 if $b < $thr else 1)" || (( waited >= limit )); then break; fi
        waited=$(( waited + 2 ))
    done
    echo "$b"
}
ticks() {  # CPU ticks: all busy on the machine, then this shell's reaped children (the bench's runs)
    local a c
    a=($(head -1 /proc/stat)); c=($(sed 's/.*) //' /proc/$$/stat))
    echo $(( a[1] + a[2] + a[3] + a[6] + a[7] + a[8] )) $(( c[13] + c[14] ))
}
# timed NAME METRICS CMD...: waits for a quiet machine, runs CMD (in this shell, so that its CPU time
# is this shell's children's), prints "before/during" (other load in cores: before it started, and
# CPU time not spent by CMD during it / wall time) to $out/NAME.load; runs CMD again (up to
# BENCH_RETRY times) when the load during it reached BENCH_BUSY. A failing CMD is reported, not fatal.
timed() {
    local name="$1" metrics="$2" try before t0 c0 t1 c1 w0 w1 during rc; shift 2
    for ((try = 0; try <= ${BENCH_RETRY:-1}; try++)); do
        rm -f "$metrics"
        before=$(wait_quiet)
        echo "== $name [other load before: $before cores]" >&2
        read -r t0 c0 < <(ticks); w0=$(date +%s.%N)
        rc=0; "$@" || rc=$?
        read -r t1 c1 < <(ticks); w1=$(date +%s.%N)
        during=$("$PY" -c "import os, sys
w0, w1 = map(float, sys.argv[1:3]); t0, c0, t1, c1 = map(int, sys.argv[3:7])
print('%.2f' % max(0, (t1 - t0 - (c1 - c0)) / os.sysconf('SC_CLK_TCK') / max(w1 - w0, 1e-3)))" \
            "$w0" "$w1" "$t0" "$c0" "$t1" "$c1")
        echo "$before/$during" >"$out/$name.load"
        (( rc == 0 )) || echo "== $name: FAILED (exit status $rc)" >&2
        echo "== $name: $(printf '%.0f' "$("$PY" -c "print($w1 - $w0)")") s, other load during: $during cores" >&2
        "$PY" -c "import sys; sys.exit(0 if $during < ${BENCH_BUSY:-0.15} else 1)" && break
        (( try < ${BENCH_RETRY:-1} )) && echo "== $name: others ran during it; again" >&2
    done
    return 0
}

# ---- PyTorch environment -------------------------------------------------------------------
jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
if [[ ! -e $jemalloc ]] && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    apt-get install -y -qq libjemalloc2 >/dev/null 2>&1 || true
fi
[[ -e $jemalloc ]] || jemalloc=""

# OPENBLAS_CORETYPE candidates: an OPENBLAS_CORETYPE already in the environment, then what the
# CPU flags allow: Cooperlake with AVX512-BF16 (0.3.21's Cooperlake sgemm is SkylakeX's, plus
# bf16 kernels), else SkylakeX with AVX-512; and Haswell with AVX2. The probe below keeps the
# fastest (BENCH_CORETYPES overrides the list).
flags=$(grep -m1 '^flags' /proc/cpuinfo)
coretypes="${OPENBLAS_CORETYPE:-}"
if [[ $flags == *avx512_bf16* && $flags == *avx512vl* && $flags == *avx512bw* ]]; then coretypes+=" Cooperlake"
elif [[ $flags == *avx512vl* && $flags == *avx512bw* ]]; then coretypes+=" SkylakeX"; fi
if [[ $flags == *avx2* ]]; then coretypes+=" Haswell"; fi
coretypes="${BENCH_CORETYPES:-$(echo $coretypes | tr ' ' '\n' | awk '!seen[$0]++' | tr '\n' ' ')}"
coretype=""   # the one torch_env uses; set per thread count from the probe
blas_root=/usr/lib/x86_64-linux-gnu

# torch_env THREADS VARIANT CAP CMD...: runs CMD with PyTorch's settings for THREADS threads, the
# OpenBLAS build VARIANT (pthread, openmp; default: the system's) and the ATen vector ISA CAP
# (default: torch's own choice, AVX2 in 1.13; avx512: ATEN_CPU_CAPABILITY=avx512)
torch_env() {
    local th="$1" variant="$2" cap="$3"; shift 3
    local ldp=""
    [[ $variant == openmp || $variant == pthread ]] && ldp="$blas_root/openblas-$variant"
    [[ $cap == default ]] && cap=""
    env OMP_NUM_THREADS="$th" OPENBLAS_NUM_THREADS="$th" MKL_NUM_THREADS="$th" \
        ${coretype:+OPENBLAS_CORETYPE=$coretype} \
        ${cap:+ATEN_CPU_CAPABILITY=$cap} \
        ${ldp:+LD_LIBRARY_PATH=$ldp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} \
        ${jemalloc:+LD_PRELOAD=$jemalloc} \
        ${jemalloc:+MALLOC_CONF=background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1} \
        "$@"
}

# the faster OpenBLAS build for torch at THREADS threads: GEMMs of the benchmark's shapes
# (argv[2] = bf16: the same shapes in bf16 under autocast, i.e. oneDNN's bf16 matmul; for the log)
probe_py='
import sys, time, torch, torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]))
bf16 = len(sys.argv) > 2 and sys.argv[2] == "bf16"
shapes = [(1024, 768, 768), (1024, 2048, 768), (1024, 768, 2048), (1024, 4096, 768)]
tot = 0.0
for M, N, K in shapes:
    a, w = torch.randn(M, K), torch.randn(N, K)
    best = 1e9
    for i in range(6):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            t = time.perf_counter(); F.linear(a, w); dt = time.perf_counter() - t
        if i: best = min(best, dt)
    tot += 2.0 * M * N * K / best / 1e9
print("%.1f" % (tot / len(shapes)))'
declare -A torch_blas torch_ct
for th in $threads_list; do
    best=""; bestv=0; bestct=""
    wait_quiet >/dev/null
    for coretype in ${coretypes:-none}; do
        [[ $coretype == none ]] && coretype=""
        for v in pthread openmp; do
            [[ -e $blas_root/openblas-$v/libblas.so.3 ]] || continue
            g=$(torch_env "$th" "$v" default "$PY" -c "$probe_py" "$th" 2>/dev/null || echo 0)
            echo "torch BLAS probe: OpenBLAS-$v ${coretype:+($coretype) }at $th thread(s): $g GFLOP/s" >&2
            if "$PY" -c "import sys; sys.exit(0 if float('$g') > float('$bestv') else 1)"; then
                best=$v; bestv=$g; bestct=$coretype
            fi
        done
    done
    torch_blas[$th]="${best:-default}"; torch_ct[$th]="$bestct"; coretype="$bestct"
    echo "torch BLAS at $th thread(s): OpenBLAS-${torch_blas[$th]}${bestct:+, OPENBLAS_CORETYPE=$bestct} first" >&2
    if [[ $precision == bf16 ]]; then
        g=$(torch_env "$th" "${torch_blas[$th]}" default "$PY" -c "$probe_py" "$th" bf16 2>/dev/null || echo 0)
        echo "torch bf16 probe (autocast, oneDNN matmul) at $th thread(s): $g GFLOP/s" >&2
    fi
done

# ---- configurations --------------------------------------------------------------------------
# name  dim layers heads kv_heads ffn steps
configs=()
for c in "gpt2-small 768 12 12 12 2048 $steps_gpt2" "small 256 4 4 4 688 $steps_small"; do
    [[ " $configs_sel " == *" ${c%% *} "* ]] && configs+=("$c")
done
(( ${#configs[@]} )) || { echo "run_bench.sh: --configs: none of gpt2-small, small" >&2; exit 2; }
G=4; MB=4; T=256; V=50257

max_steps=0
for c in "${configs[@]}"; do read -r _ _ _ _ _ _ s <<<"$c"; (( s > max_steps )) && max_steps=$s; done
shard="$out/data/synthetic_000.bin"
mkdir -p "$out/data"
rm -f "$out"/data/*.bin
"$PY" "$root/bench/make_data.py" --out "$shard" --tokens $(( max_steps * G * T + 1 )) --vocab $V --seed 0

# pentatron_run METRICS LOG THREADS PRECISION: one pentatron run of the current configuration
pentatron_run() {
    local prec=()
    [[ $precision == bf16 ]] && prec=(--training.precision="$4")  # fp32 mode: the command as before
    "$bin" train --model.vocab_size=$V --model.dim=$dim --model.n_layers=$layers \
        --model.n_heads=$heads --model.n_kv_heads=$kvh --model.ffn_dim=$ffn \
        --model.max_seq_len=$T --model.tied_embeddings=false --data.train="$shard" \
        --training.steps=$steps --training.global_batch=$G --training.micro_batch=$MB \
        --training.seq_len=$T --training.threads=$3 --training.gemm=onednn "${prec[@]}" \
        --logging.metrics="$1" --logging.every=1 --logging.progress=false >"$2" 2>&1
}
# torch_run METRICS LOG THREADS VARIANT CAP [--autocast-bf16]: one PyTorch run of the current configuration
torch_run() {
    local m="$1" l="$2" th="$3" v="$4" cap="$5"; shift 5
    torch_env "$th" "$v" "$cap" "$PY" "$root/bench/torch_llama.py" --data "$shard" \
        --metrics "$m" --threads $th --steps $steps --global-batch $G --micro-batch $MB \
        --seq-len $T --vocab-size $V --dim $dim --n-layers $layers --n-heads $heads \
        --n-kv-heads $kvh --ffn-dim $ffn --tied 0 "$@" 2>"$l"
}

results="$out/results.tsv"
# one row per run: config, threads, steps, kind (pentatron-fp32, pentatron-bf16, torch-fp32,
# torch-bf16), variant (torch: OpenBLAS build / ATen ISA), metrics, log, other load before/during
printf 'config\tthreads\tsteps\tkind\tvariant\tmetrics\tlog\tload\n' >"$results"
row() {  # KIND VARIANT METRICS LOG NAME (PyTorch's variant gets the OpenBLAS coretype appended)
    local v="$2"; [[ $1 == torch-* && -n $coretype ]] && v="$v/$coretype"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$th" "$steps" "$1" "$v" "$3" "$4" \
        "$(cat "$out/$5.load" 2>/dev/null || echo ?)" >>"$results"
}
for c in "${configs[@]}"; do
    read -r name dim layers heads kvh ffn steps <<<"$c"
    for th in $threads_list; do
        tag="$name-t$th"
        coretype="${torch_ct[$th]}"
        pkinds=(fp32); [[ $precision == bf16 ]] && pkinds=(bf16 fp32)
        for pk in "${pkinds[@]}"; do
            sfx=""; [[ $precision == bf16 ]] && sfx=".$pk"
            pm="$out/$tag.pentatron$sfx.jsonl"; pl="$out/$tag.pentatron$sfx.log"
            timed "$tag.pentatron$sfx" "$pm" pentatron_run "$pm" "$pl" "$th" "$pk"
            row "pentatron-$pk" "-" "$pm" "$pl" "$tag.pentatron$sfx"
        done
        # PyTorch fp32 runs with each OpenBLAS build (the probe's favourite first) and each ATen ISA;
        # the report keeps the faster training run, so PyTorch gets its own best setting, measured,
        # not guessed.
        done_v=","
        for v in "${torch_blas[$th]}" pthread openmp; do
            [[ $done_v == *",$v,"* ]] && continue
            [[ $v == default || -e $blas_root/openblas-$v/libblas.so.3 ]] || continue
            done_v="$done_v$v,"
            for cap in $caps_list; do
                vc="$v"; [[ $caps_list == default ]] || vc="$v:$cap"
                n="$tag.torch.${vc/:/.}"
                timed "$n" "$out/$n.jsonl" torch_run "$out/$n.jsonl" "$out/$n.log" "$th" "$v" "$cap"
                row torch-fp32 "$vc" "$out/$n.jsonl" "$out/$n.log" "$n"
            done
            [[ $v == default ]] && break
        done
        # PyTorch autocast bf16: its GEMMs are oneDNN's (not the BLAS), so the probe's favourite
        # OpenBLAS build only; each ATen ISA
        if [[ $precision == bf16 ]]; then
            v="${torch_blas[$th]}"
            for cap in $caps_list; do
                n="$tag.torch-bf16.$v.$cap"
                timed "$n" "$out/$n.jsonl" torch_run "$out/$n.jsonl" "$out/$n.log" "$th" "$v" "$cap" --autocast-bf16
                row torch-bf16 "$v:$cap" "$out/$n.jsonl" "$out/$n.log" "$n"
            done
        fi
    done
done

# ---- report ----------------------------------------------------------------------------------
"$PY" - "$results" "$warmup" "$V" "$precision" <<'PYEOF'
import json, math, re, statistics, sys
results, warmup, V, precision = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = [l.rstrip("\n").split("\t") for l in open(results)][1:]
ln_v = math.log(V)

def steps_of(path):
    try:
        return [r for r in (json.loads(l) for l in open(path) if l.strip()) if "step" in r]
    except (OSError, ValueError):
        return []

def med(rr, key):
    return statistics.median(r[key] for r in rr[warmup:])

# group the runs by (config, threads), in order; per kind keep the fastest complete run
groups = {}
for name, th, steps, kind, variant, metrics, log, load in rows:
    g = groups.setdefault((name, th), {"steps": steps, "runs": {}, "tried": {}, "loads": []})
    g["tried"].setdefault(kind, []).append(variant)
    g["loads"].append("%s%s %s" % (kind, "" if variant == "-" else "(" + variant + ")", load))
    rr = steps_of(metrics)
    if len(rr) <= warmup:
        continue
    tps = med(rr, "tokens_per_s")
    best = g["runs"].get(kind)
    if best is None or tps > best["tps"]:
        g["runs"][kind] = {"tps": tps, "steps": rr, "variant": variant, "log": log, "load": load,
                           "mfu": med(rr, "mfu") if "mfu" in rr[0] else None}

peak_re = re.compile(r"(?:sgemm|fp32 GEMM|bf16 GEMM) peak (\d+(?:\.\d+)?) GFLOP/s")
def peak_of(log):
    try:
        m = peak_re.search(open(log).read())
    except OSError:
        return float("nan")
    return float(m.group(1)) if m else float("nan")
dnn = ""
def backend_of(log):
    global dnn
    try:
        m = re.search(r"^backend: (.*)$", open(log).read(), re.M)
    except OSError:
        return
    if m: dnn = m.group(1)

ok = True; notes = []
print()
if precision == "fp32":
    hdr = "%-11s %3s %6s %12s %12s %7s %8s %10s %9s %s" % ("config", "thr", "steps", "pentatron", "pytorch",
          "ratio", "MFU", "GEMM peak", "torch MFU", "torch BLAS")
    print(hdr); print("%-11s %3s %6s %12s %12s %7s %8s %10s %9s" % ("", "", "", "tok/s", "tok/s", "", "", "GFLOP/s", ""))
    print("-" * len(hdr))
    for (name, th), g in groups.items():
        p, t = g["runs"].get("pentatron-fp32"), g["runs"].get("torch-fp32")
        if not p or not t:
            print("%-11s %3s  incomplete run (see the logs in the output folder)" % (name, th)); ok = False; continue
        backend_of(p["log"])
        peak = peak_of(p["log"])
        fpt_over_peak = p["mfu"] / p["tps"]  # model FLOPs per token / peak
        print("%-11s %3s %6s %12.0f %12.0f %6.2fx %7.1f%% %10.0f %8.1f%% %s" % (name, th, g["steps"], p["tps"],
              t["tps"], p["tps"] / t["tps"], 100 * p["mfu"], peak, 100 * t["tps"] * fpt_over_peak,
              t["variant"] + " (of " + ",".join(g["tried"]["torch-fp32"]) + ")"))
        if p["mfu"] > 1.0:
            notes.append("  %-11s t%s: WARNING MFU > 100%%: the GEMM peak of that run (%.0f GFLOP/s) was measured "
                         "while the machine was disturbed; MFU of that row is meaningless" % (name, th, peak))
        l0p, l0t = p["steps"][0]["loss"], t["steps"][0]["loss"]
        good = abs(l0p - ln_v) < 0.5 and abs(l0t - ln_v) < 0.5
        ok &= good
        notes.append("  %-11s t%s: first-step loss pentatron %.4f, pytorch %.4f (ln V = %.4f) %s; last loss %.4f / %.4f"
                     % (name, th, l0p, l0t, ln_v, "ok" if good else "MISMATCH", p["steps"][-1]["loss"],
                        t["steps"][-1]["loss"]))
        notes.append("  %-11s t%s: other load (cores, before/during): %s" % (name, th, "; ".join(g["loads"])))
    print()
    print("tok/s: median over steps %d.. of each run; MFU: pentatron's own per-step figure (model FLOPs /" % (warmup + 1))
    print("fp32 GEMM peak measured by pentatron at start of that run); ratio = pentatron / pytorch.")
else:
    hdr = "%-11s %3s %5s %9s %9s %9s %9s %8s %8s %8s %7s %7s %7s %7s" % (
        "config", "thr", "steps", "pt bf16", "pt fp32", "tch fp32", "tch bf16", "pt16/", "pt16/", "pt16/",
        "MFU", "bf16 pk", "fp32 pk", "tch16")
    print(hdr)
    print("%-11s %3s %5s %9s %9s %9s %9s %8s %8s %8s %7s %7s %7s %7s" % (
        "", "", "", "tok/s", "tok/s", "tok/s", "tok/s", "tch fp32", "tch bf16", "pt fp32", "bf16", "GFLOP/s",
        "GFLOP/s", "MFU"))
    print("-" * len(hdr))
    verdict = []
    for (name, th), g in groups.items():
        r = g["runs"]
        need = ["pentatron-bf16", "pentatron-fp32", "torch-fp32", "torch-bf16"]
        missing = [k for k in need if k not in r]
        if "pentatron-bf16" in missing or "torch-fp32" in missing:
            print("%-11s %3s  incomplete: no complete %s run (see the logs in the output folder)"
                  % (name, th, ", ".join(missing))); ok = False; continue
        if missing:
            ok = False
            notes.append("  %-11s t%s: INCOMPLETE: no complete %s run" % (name, th, ", ".join(missing)))
        p16 = r["pentatron-bf16"]; p32 = r.get("pentatron-fp32"); t32 = r["torch-fp32"]; t16 = r.get("torch-bf16")
        backend_of(p16["log"])
        pk16 = peak_of(p16["log"]); pk32 = peak_of(p32["log"]) if p32 else float("nan")
        f = lambda x: "%9.0f" % x["tps"] if x else "%9s" % "-"
        q = lambda a, b: "%7.2fx" % (a["tps"] / b["tps"]) if a and b else "%8s" % "-"
        fpt_over_peak16 = p16["mfu"] / p16["tps"]
        print("%-11s %3s %5s %s %s %s %s %s %s %s %6.1f%% %7.0f %7.0f %s" % (
            name, th, g["steps"], f(p16), f(p32), f(t32), f(t16), q(p16, t32), q(p16, t16), q(p16, p32),
            100 * p16["mfu"], pk16, pk32, "%6.1f%%" % (100 * t16["tps"] * fpt_over_peak16) if t16 else "%7s" % "-"))
        verdict.append("  %-11s t%s: pentatron bf16 / PyTorch fp32 = %.2fx (target >= 1.6x: %s); "
                       "pentatron bf16 / PyTorch autocast bf16 = %s (target >= 2x: %s)" % (
                       name, th, p16["tps"] / t32["tps"], "met" if p16["tps"] >= 1.6 * t32["tps"] else "NOT met",
                       "%.2fx" % (p16["tps"] / t16["tps"]) if t16 else "-",
                       ("met" if p16["tps"] >= 2 * t16["tps"] else "NOT met") if t16 else "not measured"))
        notes.append("  %-11s t%s: PyTorch fp32 best of %s: %s; PyTorch bf16 best of %s: %s; pentatron fp32 MFU "
                     "%s of its fp32 peak; bf16/fp32 GEMM peak %.2fx" % (
                     name, th, ",".join(g["tried"].get("torch-fp32", [])), t32["variant"],
                     ",".join(g["tried"].get("torch-bf16", [])), t16["variant"] if t16 else "-",
                     "%.1f%%" % (100 * p32["mfu"]) if p32 else "-", pk16 / pk32))
        if p16["mfu"] > 1.0:
            notes.append("  %-11s t%s: WARNING MFU > 100%%: the bf16 GEMM peak of that run (%.0f GFLOP/s) was "
                         "measured while the machine was disturbed" % (name, th, pk16))
        l0 = {k: v["steps"][0]["loss"] for k, v in r.items()}
        good = all(abs(x - ln_v) < 0.5 for x in l0.values())
        ok &= good
        notes.append("  %-11s t%s: first-step loss %s (ln V = %.4f) %s; last loss %s" % (
            name, th, ", ".join("%s %.4f" % (k, l0[k]) for k in need if k in l0), ln_v, "ok" if good else "MISMATCH",
            ", ".join("%s %.4f" % (k, r[k]["steps"][-1]["loss"]) for k in need if k in r)))
        notes.append("  %-11s t%s: other load (cores, before/during): %s" % (name, th, "; ".join(g["loads"])))
    print()
    print("tok/s: median over steps %d.. of each run (PyTorch: its fastest run over the OpenBLAS builds and" % (warmup + 1))
    print("ATen ISAs tried); pt = pentatron, tch = PyTorch (bf16: torch.autocast(\"cpu\", bfloat16)); MFU bf16:")
    print("pentatron bf16's own per-step figure, model FLOPs / the bf16 GEMM peak it measured at start of that")
    print("run; tch16 MFU: PyTorch bf16's tok/s on the same FLOPs and peak; pk: the GEMM peaks pentatron measured")
    print("(1024^3, best of 11) at start of its bf16 and fp32 runs.")
    print("acceptance:")
    print("\n".join(verdict))
if dnn: print("pentatron backend: " + dnn)
print("sanity (all start near ln V; weights differ between the frameworks):")
print("\n".join(notes))
sys.exit(0 if ok else 1)
PYEOF
