#!/usr/bin/env bash
# gpu_check.sh [--dry-run] [--out DIR] [--debs DIR] [--build DIR] [--jobs N] [--budget S]
# The GPU check (issues 31 and 33), one script for a machine with one H100 or H200 (CUDA 13 + nvcc,
# CMake, Python with PyTorch on CUDA and NCCL in the nvidia-nccl package, none of our Debian
# packages, no network), prepared and dry-run here.
#   env        logs the machine: nvidia-smi, nvcc, the compiler, CMake, ninja, Python and torch
#   unpack     checks the carried .debs (.gpu-debs/MANIFEST: names, sizes, sha256; fetched by
#              scripts/gpu_debs.sh) and unpacks them with dpkg-deb -x, or a small Python ar+tar
#              reader where dpkg-deb is missing, into a prefix under /tmp; rewrites the .pc files
#              and sets PKG_CONFIG_LIBDIR (only the prefix), CMAKE_PREFIX_PATH, LD_LIBRARY_PATH,
#              PATH (mpicc, mpirun) and OPAL_PREFIX/PMIX_INSTALL_PREFIX (OpenMPI relocated)
#   configure  CMake with -DPT_CUDA=ON (ninja when present); NCCL's header from the toolkit or the
#              nvidia-nccl Python package (PT_NCCL_INCLUDE), its library on LD_LIBRARY_PATH
#   build      pentatron, the tests, bench_gemm
#   tests      ctest -R 'test_gpu_|test_cuda_host_' (not test_gpu_model): the slots against the CPU
#              (test_gpu_nccl among them: the NCCL comm backend on one rank, every operation)
#   model      tests/test_gpu_model.sh through ctest: training on the GPU against the CPU backend
#   nccl_abort test_gpu_nccl with PT_GPU_NCCL_HANG=1: a receive nobody sends, whose wait times out,
#              aborts the communicator (ncclCommAbort) and ends the job naming the group
#   layouts    tests/gpu_layouts.sh: the 5D matrix's layouts on 4 and 8 ranks sharing the GPU
#              (comm.backend = mpi) against the one-process GPU run, the CPU matrix's tolerances;
#              over NCCL too where the machine has a GPU a rank (dry run: the list on CPUs)
#   measure    pentatron plan --measure --device cuda --precision bf16: the hardware file
#              (OUT/gpu_measured.ini; dry run: the refusal without a device)
#   bench      bench/gpu_bench.sh: the 1B Llama and a small MoE against PyTorch eager/compile,
#              attention against SDPA, GEMMs against torch.matmul
#   plan       the planner's step for the bench's 1B model on OUT/gpu_measured.ini against the step
#              pentatron measured in the bench (tokens a step / tokens per second)
#   memcheck   compute-sanitizer --tool memcheck over the slot test at small sizes
#   racecheck  compute-sanitizer --tool racecheck, the same
# Every step is time-boxed (timeout) and the script goes on after a failure; the whole run keeps
# within --budget seconds (default 470, under the 8 minutes asked). Writes to --out (default $OUT,
# else /tmp/gpu_check_out): gpu_check.json (every step: status, seconds, key figures),
# gpu_check.md (the table) and gpu_check_logs.tar.gz (every log), and bench.json when the bench
# ran. Exit 0 when no step failed (skipped steps do not fail), 1 otherwise.
#
# --dry-run (a machine without a GPU, e.g. this one): the same steps; what needs a GPU reports
# "skipped: no GPU" (the GPU tests must exit 77 = skipped). As root with unshare(1), the configure,
# build and tests run in a private mount namespace where this system's own copies of every carried
# package are hidden (each file bound over by /dev/null), and pkg-config looks only in the prefix:
# proof that the unpacked packages alone suffice. --jobs defaults to the core count (16 there).
#
# Environment: GPU_CHECK_CUDA_ARCHS (CMAKE_CUDA_ARCHITECTURES, default: the project's, 80;90),
# GPU_CHECK_KEEP_BUILD=1 (reuse --build instead of starting afresh), GPU_CHECK_SLOT_TEST (the slot test's name, default the first built of test_gpu_slots,
# test_gpu_backend, test_gpu_ops), GPU_CHECK_BENCH_ARGS (extra bench/gpu_bench.sh options).
# The slot test is run under compute-sanitizer with PT_GPU_TEST_SMALL=1 (small sizes).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
self="$root/scripts/gpu_check.sh"
dry=0; out="${OUT:-/tmp/gpu_check_out}"; debs="$root/.gpu-debs"; build="$root/build-gpucheck"
jobs="$(nproc 2>/dev/null || echo 4)"; budget=470
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --out) out="$2"; shift ;;
    --debs) debs="$2"; shift ;;
    --build) build="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
pfx="${GPU_CHECK_PREFIX:-/tmp/pt-gpudeps}"     # the unpacked packages: $pfx/root/usr/...
work="${GPU_CHECK_WORK:-/tmp/gpu_check_work}"  # logs and step records (tarred into $out)
logs="$work/logs"; steps="$work/steps"

if [ -z "${GPU_CHECK_INNER:-}" ]; then
  rm -rf "$work"; mkdir -p "$logs" "$steps" "$out" || { echo "gpu_check: cannot create $work or $out" >&2; exit 2; }
  : > "$work/order"
  date +%s > "$work/t0"
fi
t0="$(cat "$work/t0")"
now() { echo $(( $(date +%s) - t0 )); }
say() { echo "[gpu_check $(printf '%4d' "$(now)")s] $*" | tee -a "$logs/gpu_check.log"; }

# record NAME STATUS SECONDS NOTE: one step's outcome (STATUS ok | failed | timeout | skipped)
record() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" > "$steps/$1.tsv"
  grep -qx "$1" "$work/order" || echo "$1" >> "$work/order"
  say "step $1: $2 (${3}s)${4:+ — $4}"
}
skip() { record "$1" skipped 0 "$2"; }
# run_step NAME LIMIT CMD...: CMD under timeout, its output in $logs/NAME.log; the limit is cut to
# what is left of the budget (keeping 15 s for the report); a step with under 10 s left is skipped
run_step() {
  local name="$1" limit="$2"; shift 2
  local left=$(( budget - 15 - $(now) ))
  if [ "$left" -lt 10 ]; then skip "$name" "no time left in the ${budget}s budget"; return 1; fi
  [ "$limit" -gt "$left" ] && limit="$left"
  say "step $name: running (limit ${limit}s): $*"
  local s=$SECONDS rc
  timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1; rc=$?
  local d=$(( SECONDS - s ))
  case $rc in
    0) record "$name" ok "$d" ;;
    77) record "$name" skipped "$d" "$(tail -1 "$logs/$name.log")" ;;
    124|137) record "$name" timeout "$d" "killed after ${limit}s: $(tail -1 "$logs/$name.log")" ;;
    *) record "$name" failed "$d" "exit $rc: $(tail -1 "$logs/$name.log")" ;;
  esac
  return $rc
}
status_of() { cut -f2 "$steps/$1.tsv" 2>/dev/null || echo none; }

have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then have_gpu=1; fi

# ---------------------------------------------------------------------------------------- env
if [ -z "${GPU_CHECK_INNER:-}" ]; then
  say "gpu_check: root $root, out $out, build $build, jobs $jobs, budget ${budget}s, dry run $dry, GPU $have_gpu"
  {
    echo "== date"; date -u
    echo "== uname"; uname -a
    echo "== os-release"; cat /etc/os-release 2>/dev/null
    echo "== nvidia-smi"; nvidia-smi 2>&1 || echo "(no nvidia-smi)"
    echo "== nvidia-smi -L"; nvidia-smi -L 2>&1
    echo "== nvidia-smi query"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv 2>&1
    echo "== nvcc"; (command -v nvcc || ls /usr/local/cuda/bin/nvcc) 2>&1; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1
    echo "== compute-sanitizer"; (command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer) 2>&1
    echo "== ncu"; (command -v ncu || ls /usr/local/cuda/bin/ncu) 2>&1
    echo "== gcc"; gcc --version 2>&1 | head -1; g++ --version 2>&1 | head -1
    echo "== cmake"; cmake --version 2>&1 | head -1
    echo "== ninja"; ninja --version 2>&1
    echo "== dpkg-deb"; command -v dpkg-deb 2>&1 || echo "(none: the Python unpacker is used)"
    echo "== python3"; command -v python3; ls -l /usr/bin/python3 2>&1; python3 --version 2>&1
    echo "== torch"
    python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1
    echo "== nccl (nvidia-nccl-cu13)"
    python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(s.submodule_search_locations if s else "not found")' 2>&1
    echo "== cores / memory"; nproc; free -g 2>&1 | head -2
  } > "$logs/env.log" 2>&1
  gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  record env ok 0 "GPU: ${gpu_name:-none}; nvcc $( (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | grep -o 'release [0-9.]*' | head -1); torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
  [ -x /usr/local/cuda/bin/nvcc ] && case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) export PATH="$PATH:/usr/local/cuda/bin" ;; esac
  # the tests' CMake environment names /usr/bin/python3 (PT_PYTHON, tests/parallel_common.sh): on
  # a machine whose python3 lives elsewhere, root links it there (logged)
  if [ ! -x /usr/bin/python3 ] && command -v python3 >/dev/null && [ "$(id -u)" = 0 ]; then
    ln -s "$(command -v python3)" /usr/bin/python3 && say "linked /usr/bin/python3 -> $(command -v python3)"
  fi
fi

# ------------------------------------------------------------------------------------- unpack
# py_unpack DEB DEST: an ar archive (the .deb) holding data.tar.{xz,gz,bz2}, extracted with Python
py_unpack() {
  python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
b = open(deb, "rb").read()
if b[:8] != b"!<arch>\n":
    sys.exit("%s: not an ar archive" % deb)
pos, data = 8, None
while pos + 60 <= len(b):
    name = b[pos:pos + 16].decode().strip().rstrip("/")
    size = int(b[pos + 48:pos + 58].decode().strip())
    body = b[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        data = body
    pos += 60 + size + (size & 1)
if data is None:
    sys.exit("%s: no data.tar member" % deb)
with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as t:
    try:
        t.extractall(dest, filter="tar")  # Python >= 3.12 (and 3.8.17+): keeps links, refuses escapes
    except TypeError:
        t.extractall(dest)
PY
}

unpack() {
  local r="$pfx/root" ok=1
  rm -rf "$pfx"; mkdir -p "$r" "$pfx/bin" "$pfx/fallback-missing" "$pfx/fb"
  [ -f "$debs/MANIFEST" ] || { echo "no $debs/MANIFEST: run scripts/gpu_debs.sh here and carry .gpu-debs"; return 1; }
  local n=0 bytes=0
  while IFS=$'\t' read -r pkg ver file size sha mark; do
    local f="$debs/$file"
    if [ ! -f "$f" ]; then echo "MISSING $file"; ok=0; continue; fi
    if [ "$(stat -c %s "$f")" != "$size" ] || [ "$(sha256sum "$f" | cut -d' ' -f1)" != "$sha" ]; then
      echo "CORRUPT $file (size or sha256 differs from MANIFEST)"; ok=0; continue
    fi
    local dest="$r"; [ "$mark" = fallback ] && dest="$pfx/fb"
    if command -v dpkg-deb >/dev/null 2>&1 && [ -z "${GPU_CHECK_PY_UNPACK:-}" ]; then
      dpkg-deb -x "$f" "$dest" || { echo "dpkg-deb -x $file failed"; ok=0; }
    else
      py_unpack "$f" "$dest" || { echo "python unpack of $file failed"; ok=0; }
    fi
    n=$((n + 1)); bytes=$((bytes + size))
    echo "unpacked $pkg $ver ($mark)"
  done < "$debs/MANIFEST"
  echo "packages: $n, $(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }') MiB of .debs, unpacked $(du -sm "$pfx" | cut -f1) MiB"
  local lib="$r/usr/lib/x86_64-linux-gnu"
  # .pc files say prefix=/usr (and some name /usr paths directly): point them at the prefix
  find "$r" -name '*.pc' -path '*pkgconfig*' -print0 | xargs -0 -r sed -i -E "s#(^|[=[:space:]'\"]|-I|-L)/usr(/|\$)#\1$r/usr\2#g"
  # the fallback packages (zlib1g, libudev1, ...): the dev symlinks need a target; the libraries go
  # on the library path only where this system lacks them
  local fbl
  for fbl in "$pfx"/fb/usr/lib/x86_64-linux-gnu/*.so.* "$pfx"/fb/lib/x86_64-linux-gnu/*.so.*; do
    [ -e "$fbl" ] || continue
    local so; so="$(basename "$fbl")"
    case "$so" in *.so.[0-9]) ;; *) continue ;; esac   # the soname links (libz.so.1)
    if ! /sbin/ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$so "; then
      ln -sf "$fbl" "$pfx/fallback-missing/$so"; echo "fallback: $so (missing on this system)"
    fi
  done
  # dangling .so links of dev packages (libz.so -> libz.so.1.2.13 lives in fb/)
  local l
  for l in "$lib"/*.so; do
    [ -L "$l" ] && [ ! -e "$l" ] || continue
    local t; t="$(readlink "$l")"
    local cand; cand="$(ls "$pfx"/fb/usr/lib/x86_64-linux-gnu/"$(basename "$t")" "$pfx"/fb/lib/x86_64-linux-gnu/"$(basename "$t")" 2>/dev/null | head -1)"
    [ -n "$cand" ] && ln -sf "$cand" "$l" && echo "relinked $(basename "$l") -> $cand"
  done
  # the alternatives links Debian's postinst would make
  local b
  for b in mpicc mpirun mpiexec orterun; do
    [ -e "$r/usr/bin/$b.openmpi" ] && ln -sf "$r/usr/bin/$b.openmpi" "$pfx/bin/$b"
  done
  [ -e "$r/usr/bin/mpirun.openmpi" ] || [ -e "$r/usr/bin/orterun" ] && ln -sf "$r/usr/bin/orterun" "$pfx/bin/mpirun"
  [ -e "$r/usr/bin/orterun" ] && ln -sf "$r/usr/bin/orterun" "$pfx/bin/mpiexec" && ln -sf "$r/usr/bin/orterun" "$pfx/bin/mpirun"
  [ -e "$r/usr/bin/pkgconf" ] && ln -sf "$r/usr/bin/pkgconf" "$pfx/bin/pkg-config"
  # Debian's libdnnl-dev: libdnnl.so in the multiarch dir; the MCA parameter file of openmpi-common
  [ -e "$pfx/bin/mpicc" ] && [ -e "$pfx/bin/pkg-config" ] && [ -e "$lib/libdnnl.so" ] || { echo "mpicc, pkg-config or libdnnl.so missing after unpack"; ok=0; }
  [ $ok = 1 ]
}

# the environment that points our build at the prefix (set in this shell; inherited by every step)
deps_env() {
  local r="$pfx/root" lib="$pfx/root/usr/lib/x86_64-linux-gnu"
  export PATH="$pfx/bin:$r/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$lib:$lib/openmpi/lib:$pfx/fallback-missing${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$r/usr/share/pkgconfig"  # only the prefix, never /usr
  unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
  export CMAKE_PREFIX_PATH="$r/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export OPAL_PREFIX="$r/usr"                                 # OpenMPI's own relocation
  export PMIX_INSTALL_PREFIX="$lib/pmix2"                     # PMIx's (its prefix is pmix2/)
  export PMIX_MCA_mca_base_component_path="$lib/pmix2/lib/pmix"
  export OMPI_MCA_mca_base_component_path="$lib/openmpi/lib/openmpi3"
  export OMPI_MCA_mca_base_param_files="$r/etc/openmpi/openmpi-mca-params.conf"
  # one process, shared memory: no network transports (their plugins stay closed), no warnings
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_osc=^ucx OMPI_MCA_mtl=^ofi,psm,psm2
  export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
}

if [ -z "${GPU_CHECK_INNER:-}" ]; then
  s=$SECONDS
  if unpack > "$logs/unpack.log" 2>&1; then
    record unpack ok $((SECONDS - s)) "$(grep '^packages:' "$logs/unpack.log")"
  else
    record unpack failed $((SECONDS - s)) "$(grep -E 'MISSING|CORRUPT|failed|missing|no ' "$logs/unpack.log" | head -2 | tr '\n' ' ')"
  fi
fi
deps_env

# --dry-run as root: the rest inside a mount namespace with this system's copies of the carried
# packages hidden (the inner run sees GPU_CHECK_INNER=1 and goes on from here)
if [ -z "${GPU_CHECK_INNER:-}" ] && [ $dry = 1 ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null &&
   command -v dpkg-query >/dev/null && [ -z "${GPU_CHECK_NO_ISOLATE:-}" ]; then
  hide="$work/hidden_files"; : > "$hide"
  while IFS=$'\t' read -r pkg _ _ _ _ mark; do
    [ "$mark" = main ] || continue
    # regular files only: a symlink's target may be a package we share with the system (zlib1g-dev's
    # libz.so -> zlib1g's libz.so.1.2.13)
    dpkg-query -L "$pkg" 2>/dev/null | while read -r f; do [ -f "$f" ] && [ ! -L "$f" ] && echo "$f"; done >> "$hide"
  done < "$debs/MANIFEST"
  sort -u -o "$hide" "$hide"
  say "dry run: hiding $(wc -l < "$hide") files of this system's copies of the carried packages (unshare -m)"
  GPU_CHECK_INNER=1 unshare -m --propagation private bash -c '
    n=0; while read -r f; do mount --bind /dev/null "$f" 2>/dev/null && n=$((n + 1)); done < "$1"
    echo "hidden: $n files" >> "$2"
    shift 2; exec bash "$@"' _ "$hide" "$logs/isolation.log" "$self" "${args[@]}"
  rc=$?
  [ -f "$work/final_rc" ] && exit "$(cat "$work/final_rc")"
  exit $rc
fi
[ -n "${GPU_CHECK_INNER:-}" ] && say "inside the isolated namespace: $(cat "$logs/isolation.log" 2>/dev/null)"

# NCCL: the toolkit's header and library, else the nvidia-nccl Python package's (its include/ and
# lib/); libnccl.so.2 is opened at run time from the loader's path
nccl_dir="$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0] if s else "")' 2>/dev/null)"
nccl_args=()
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
  nccl_args=(-DPT_NCCL_INCLUDE="$nccl_dir/include")
fi
[ -n "$nccl_dir" ] && [ -d "$nccl_dir/lib" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl_dir/lib"
[ -z "${GPU_CHECK_INNER:-}" ] && say "NCCL: header ${nccl_args[*]:-from the toolkit}, python package ${nccl_dir:-none}"

# ---------------------------------------------------------------------------- configure, build
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake_args=(-S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DPT_CUDA=ON
            -DPKG_CONFIG_EXECUTABLE="$pfx/bin/pkg-config" -DMPI_C_COMPILER="$pfx/bin/mpicc"
            -DMPIEXEC_EXECUTABLE="$pfx/bin/mpiexec" "${nccl_args[@]}")
[ -n "${GPU_CHECK_CUDA_ARCHS:-}" ] && cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$GPU_CHECK_CUDA_ARCHS")
if [ "$(status_of unpack)" = ok ]; then
  [ -n "${GPU_CHECK_KEEP_BUILD:-}" ] || rm -rf "$build"
  run_step configure 150 cmake "${cmake_args[@]}"
else
  skip configure "the packages did not unpack"
fi
if [ "$(status_of configure)" = ok ]; then
  run_step build 300 cmake --build "$build" -j "$jobs"
  # where every library of the binary comes from (the prefix, not /usr)
  { echo "== ldd pentatron"; ldd "$build/pentatron"; echo "== pkg-config"; for m in inih jansson cmocka libpcre2-8 libutf8proc; do
      echo "$m: $(pkg-config --cflags --libs "$m" 2>&1)"; done; grep -E '^(MPI_C_|DNNL_|ZLIB_|PKG_CONFIG_EXECUTABLE|CMAKE_CUDA_COMPILER:|CMAKE_CUDA_ARCHITECTURES)' "$build/CMakeCache.txt"; } > "$logs/libs.log" 2>&1
else
  skip build "not configured"
fi
built=0; [ "$(status_of build)" = ok ] && built=1

# ---------------------------------------------------------------------------------------- smoke
# the unpacked runtime at work: a tiny CPU training in one process (MPI singleton) and over two
# ranks (mpiexec: orted, shared memory), so that a GPU failure later is not a packaging failure
smoke() {
  local d; d="$(mktemp -d)"
  python3 - "$d/train_000000.bin" <<'PY' || return 1
import struct, sys
toks = [(i * 7) % 97 for i in range(20000)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) + struct.pack("<%dH" % len(toks), *toks))
PY
  local t=(train --model.vocab_size=97 --model.dim=32 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2
           --model.ffn_dim=48 --model.max_seq_len=32 --training.seq_len=16 --training.global_batch=8
           --training.steps=3 --training.threads=1 --logging.progress=false --data.train="$d/train_*.bin")
  "$GPU_CHECK_BUILD/pentatron" "${t[@]}" --logging.metrics="$d/np1.jsonl" || return 1
  mpiexec -np 2 "$GPU_CHECK_BUILD/pentatron" "${t[@]}" --parallel.dp=2 --training.micro_batch=4 --logging.metrics="$d/np2.jsonl" || return 1
  echo "np1 losses: $(grep -o '"loss": [^,]*' "$d/np1.jsonl" | tr '\n' ' ')"
  echo "np2 losses: $(grep -o '"loss": [^,]*' "$d/np2.jsonl" | tr '\n' ' ')"
  rm -rf "$d"
}
export -f smoke; export GPU_CHECK_BUILD="$build"   # timeout runs programs: the function through bash
if [ $built = 1 ]; then run_step smoke 60 bash -c smoke; else skip smoke "not built"; fi
if [ $built = 1 ] && [ $dry = 1 ]; then
  # the GPU model test's refusal path: the binary runs, asks for a device and must skip (77)
  (export PT_GPU_TEST_FORCE_PROBE=1 PT_SOURCE_DIR="$root"; run_step probe 60 bash "$root/tests/test_gpu_model.sh" "$build/pentatron")
  case "$(status_of probe)" in
    skipped) record probe ok "$(cut -f3 "$steps/probe.tsv")" "refused as it must without a device: $(cut -f4 "$steps/probe.tsv")" ;;
    ok) record probe failed "$(cut -f3 "$steps/probe.tsv")" "exit 0: training.device = cuda not refused without a device" ;;
  esac
fi

# -------------------------------------------------------------------------------------- tests
ctest_junit() { # ctest_junit NAME REGEX EXCLUDE LIMIT: ctest with a JUnit file for the counts
  local name="$1" re="$2" ex="$3" lim="$4" exargs=()
  [ -n "$ex" ] && exargs=(-E "$ex")
  run_step "$name" "$lim" ctest --test-dir "$build" -R "$re" "${exargs[@]}" --output-on-failure \
      --timeout "$lim" --output-junit "$work/$name.junit.xml"
}
if [ $built = 1 ]; then
  ctest_junit tests 'test_gpu_|test_cuda_host_' 'test_gpu_model' 90
  ctest_junit model '^test_gpu_model$' '' 150
else
  skip tests "not built"; skip model "not built"
fi

# --------------------------------------------------------------------- NCCL, layouts, measure
nccl_abort() { # the unmatched receive: exit non-zero within seconds, the abort and the group named
  local o rc
  o="$(PT_GPU_NCCL_HANG=1 timeout 40 "$GPU_CHECK_BUILD/tests/test_gpu_nccl" 2>&1)"; rc=$?
  echo "$o"
  [ $rc -eq 77 ] && return 77
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'ncclCommAbort' <<<"$o" && grep -q 'over group "world"' <<<"$o"
}
export -f nccl_abort
if [ $built = 1 ] && [ $have_gpu = 1 ]; then
  run_step nccl_abort 45 bash -c nccl_abort
  run_step layouts 130 bash "$root/tests/gpu_layouts.sh" "$build/pentatron" cuda
  run_step measure 60 "$build/pentatron" plan --measure --device cuda --precision bf16 --out "$out/gpu_measured.ini"
elif [ $built = 1 ]; then
  skip nccl_abort "skipped: no GPU"
  # the layouts' script itself, on CPUs (two layouts of 4 ranks)
  run_step layouts 90 bash "$root/tests/gpu_layouts.sh" "$build/pentatron" cpu 2
  run_step measure 30 "$build/pentatron" plan --measure --device cuda --out "$work/gpu_measured.ini"
  [ "$(status_of measure)" = failed ] && grep -q 'no CUDA device' "$logs/measure.log" &&
    record measure ok "$(cut -f3 "$steps/measure.tsv")" "refused as it must without a device"
else
  skip nccl_abort "not built"; skip layouts "not built"; skip measure "not built"
fi

# -------------------------------------------------------------------------------------- bench
if [ $built = 1 ] && [ $have_gpu = 1 ]; then
  # shellcheck disable=SC2086
  run_step bench 140 bash "$root/bench/gpu_bench.sh" --bin "$build/pentatron" --gemm-bin "$build/bench_gemm" \
      --out "$work/bench" --budget 130 ${GPU_CHECK_BENCH_ARGS:-}
  [ -f "$work/bench/bench.json" ] && cp "$work/bench/bench.json" "$out/bench.json"
  if [ -f "$out/gpu_measured.ini" ] && [ -f "$work/bench/bench.json" ]; then
    run_step plan 30 python3 - "$build/pentatron" "$out/gpu_measured.ini" "$work/bench/bench.json" <<'PY'
import json, subprocess, sys
pt, hw, bench = sys.argv[1:4]
# the bench's 1B Llama (bench/gpu_bench.sh): batch 4 × 2048 tokens, bf16, one GPU
args = ["--model.vocab_size=128256", "--model.dim=2048", "--model.n_layers=16", "--model.n_heads=32",
        "--model.n_kv_heads=8", "--model.ffn_dim=8192", "--model.tied_embeddings=true",
        "--training.seq_len=2048", "--model.max_seq_len=2048", "--training.global_batch=4",
        "--training.micro_batch=4", "--training.precision=bf16"]
p = json.loads(subprocess.run([pt, "plan", *args, "--hardware", hw, "--json"], check=True,
                              capture_output=True, text=True).stdout)
tok_s = json.load(open(bench))["runs"]["pt_dense"]["tokens_per_s"]
measured = 4 * 2048 / tok_s
print("PLAN planned step %.4f s, measured %.4f s, error %+.1f%%" % (p["step_seconds"], measured,
      100 * (p["step_seconds"] / measured - 1)))
PY
  fi
elif [ $built = 1 ]; then
  # without a GPU the bench checks its own set-up and must say it skips (exit 77)
  run_step bench 60 bash "$root/bench/gpu_bench.sh" --bin "$build/pentatron" --gemm-bin "$build/bench_gemm" \
      --out "$work/bench" --budget 50
  [ "$(status_of bench)" = skipped ] && record bench skipped "$(cut -f3 "$steps/bench.tsv")" "$(cut -f4 "$steps/bench.tsv" | sed 's/^skipped: //; s/^/skipped: /')"
else
  skip bench "not built"
fi

# ---------------------------------------------------------------------------------- sanitizers
slot=""
for c in ${GPU_CHECK_SLOT_TEST:-} test_gpu_slots test_gpu_backend test_gpu_ops; do
  [ -x "$build/tests/$c" ] && { slot="$build/tests/$c"; break; }
done
san="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)"
for tool in memcheck racecheck; do
  if [ $have_gpu = 0 ]; then skip "$tool" "skipped: no GPU"
  elif [ -z "$slot" ]; then skip "$tool" "no slot test binary (tests/test_gpu_slots) was built"
  elif [ -z "$san" ]; then skip "$tool" "no compute-sanitizer"
  else
    # memcheck: every device buffer a cudaMalloc of its own (PT_CUDA_DIRECT_ALLOC), so that an
    # access past a buffer is outside an allocation and seen, not inside the one arena
    direct=0; [ "$tool" = memcheck ] && direct=1
    (cd "$build/tests" && PT_GPU_TEST_SMALL=1 PT_CUDA_DIRECT_ALLOC=$direct PT_SOURCE_DIR="$root" PT_BINARY_DIR="$build" \
       run_step "$tool" 60 "$san" --tool "$tool" --error-exitcode 3 --print-limit 50 "$slot")
  fi
done

# ------------------------------------------------------------------------------------- report
report() {
  python3 - "$work" "$out" "$dry" "$have_gpu" "$budget" <<'PY'
import glob, json, os, re, sys, xml.etree.ElementTree as ET
work, out, dry, gpu, budget = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1", int(sys.argv[5])
logs = os.path.join(work, "logs")
def text(name):
    try:
        return open(os.path.join(logs, name + ".log"), errors="replace").read()
    except OSError:
        return ""
steps = []
for name in open(os.path.join(work, "order")).read().split():
    p = os.path.join(work, "steps", name + ".tsv")
    if not os.path.exists(p):
        continue
    _, status, secs, note = (open(p).read().rstrip("\n").split("\t") + [""])[:4]
    s = {"step": name, "status": status, "seconds": int(secs), "note": note, "figures": {}}
    f = s["figures"]
    log = text(name)
    if status == "skipped" and name != "unpack":
        steps.append(s)
        continue
    if name == "env":
        m = re.search(r"== nvidia-smi query\n[^\n]*\n([^\n]+)", log)
        f["gpu"] = m.group(1).strip() if m and "," in m.group(1) else None
        m = re.search(r"release ([0-9.]+)", log); f["nvcc"] = m.group(1) if m else None
        m = re.search(r"^torch (\S+) cuda (\S+) available (\S+)", log, re.M)
        if m: f.update(torch=m.group(1), torch_cuda=m.group(2), torch_cuda_available=m.group(3))
    if name == "unpack":
        m = re.search(r"packages: (\d+), ([0-9.]+) MiB of .debs, unpacked (\d+) MiB", log)
        if m: f.update(packages=int(m.group(1)), debs_mib=float(m.group(2)), unpacked_mib=int(m.group(3)))
        f["unpacker"] = "dpkg-deb" if "python unpack" not in log and os.environ.get("GPU_CHECK_PY_UNPACK") is None else "python"
        iso = text("isolation")
        m = re.search(r"hidden: (\d+)", iso)
        if m: f["system_copies_hidden"] = int(m.group(1))
    if name == "build":
        m = re.findall(r"\[(\d+)/(\d+)\]", log)
        if m: f["targets"] = int(m[-1][1])
        f["cuda_sources"] = len(re.findall(r"Building CUDA object", log))
        libs = text("libs")
        f["libs_from_prefix"] = len(re.findall(r"=> /tmp/", libs))
        f["libs_from_system"] = sorted(set(re.findall(r"(\S+) => /(?:usr/)?lib", libs)))
    if name in ("tests", "model"):
        j = os.path.join(work, name + ".junit.xml")
        if os.path.exists(j):
            try:
                r = ET.parse(j).getroot()
                cases = r.iter("testcase")
                res = {}
                for c in cases:
                    st = c.get("status") or ("failed" if c.find("failure") is not None else
                                             "skipped" if c.find("skipped") is not None else "passed")
                    res[c.get("name")] = {"run": "passed", "fail": "failed", "notrun": "skipped",
                                          "disabled": "skipped"}.get(st, st)
                f["tests"] = res
                for k in ("passed", "failed", "skipped"):
                    f[k] = sum(1 for v in res.values() if v == k)
            except ET.ParseError as e:
                f["junit_error"] = str(e)
        if status == "ok" and f.get("skipped") and not f.get("passed") and not f.get("failed"):
            s["status"] = "skipped"  # ctest exits 0 when every test skipped: say so
            s["note"] = "skipped: every test exited 77 (%s)" % ("no GPU" if not gpu else "no usable device")
        f["lines"] = [l for l in log.splitlines() if re.match(r"\s*(CASE|BF16|REPEAT|RECOMPUTE|TORCH|SKIP)", l)][:60]
    if name in ("layouts", "plan", "nccl_abort", "measure"):
        f["lines"] = [l for l in log.splitlines() if re.match(r"\s*(LAYOUT|PLAN|NCCL|gpu_layouts|measured|  GEMM|  memory|  attention|.*ncclCommAbort|.*over group)", l)][:60]
    if name == "bench":
        b = os.path.join(work, "bench", "bench.json")
        if os.path.exists(b):
            try: f.update(json.load(open(b)).get("summary", {}))
            except ValueError: pass
    if name in ("memcheck", "racecheck"):
        m = re.search(r"ERROR SUMMARY: (\d+) error", log)
        if m: f["errors"] = int(m.group(1))
        m = re.search(r"RACECHECK SUMMARY: (\d+) hazard", log)
        if m: f["hazards"] = int(m.group(1))
    steps.append(s)
failed = [s["step"] for s in steps if s["status"] in ("failed", "timeout")]
doc = {"check": "pentatron GPU check (issues 31, 33)", "dry_run": dry, "gpu": gpu,
       "budget_s": budget, "steps": steps, "failed": failed,
       "verdict": "fail" if failed else ("dry run: GPU steps skipped" if not gpu else "pass")}
json.dump(doc, open(os.path.join(out, "gpu_check.json"), "w"), indent=1)
rows = ["# pentatron GPU check", "",
        "Dry run (no GPU): every GPU step reports skipped." if dry or not gpu else
        "GPU: %s" % (steps[0]["figures"].get("gpu") if steps else "?"), "",
        "| step | status | seconds | key figures / note |", "|---|---|---:|---|"]
def short(f):
    parts = []
    for k, v in f.items():
        if k in ("tests", "lines"):
            continue
        if isinstance(v, float):
            v = "%.4g" % v
        parts.append("%s=%s" % (k, v))
    return ", ".join(parts)
for s in steps:
    cell = "; ".join(x for x in (short(s["figures"]), s["note"]) if x).replace("|", "/")
    rows.append("| %s | %s | %d | %s |" % (s["step"], s["status"], s["seconds"], cell[:400]))
rows += ["", "Verdict: **%s**%s" % (doc["verdict"], (" (failed: %s)" % ", ".join(failed)) if failed else "")]
for s in steps:
    if s["figures"].get("lines"):
        rows += ["", "## %s" % s["step"], "", "```"] + s["figures"]["lines"] + ["```"]
    if s["figures"].get("tests"):
        rows += ["", "%s: %s" % (s["step"], ", ".join("%s %s" % kv for kv in sorted(s["figures"]["tests"].items())))]
b = os.path.join(work, "bench", "bench.md")
if os.path.exists(b):
    rows += ["", open(b).read()]
open(os.path.join(out, "gpu_check.md"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
sys.exit(1 if failed else 0)
PY
}
say "total $(now)s"
cp "$work"/*.junit.xml "$logs/" 2>/dev/null
[ -d "$work/bench" ] && cp -r "$work/bench" "$logs/bench" 2>/dev/null
find "$logs/bench" -name '*.bin' -delete 2>/dev/null
report > "$logs/report.log" 2>&1; rc=$?
if [ ! -s "$out/gpu_check.json" ]; then  # no Python: a bare JSON from the step records
  { echo '{"check": "pentatron GPU check (issues 31, 33)", "report_error": true, "steps": ['
    sep=""; while read -r n; do IFS=$'\t' read -r a b c d < "$steps/$n.tsv"
      printf '%s{"step": "%s", "status": "%s", "seconds": %s, "note": "%s"}' "$sep" "$a" "$b" "$c" "$(echo "$d" | tr -d '"\\')"; sep=$',\n'
    done < "$work/order"; echo ']}'; } > "$out/gpu_check.json"
  rc=1
fi
cat "$logs/report.log"
tar -C "$work" -czf "$out/gpu_check_logs.tar.gz" logs 2>/dev/null
say "wrote $out/gpu_check.json, gpu_check.md, gpu_check_logs.tar.gz ($(du -k "$out/gpu_check_logs.tar.gz" | cut -f1) KiB)"
echo "$rc" > "$work/final_rc"
exit $rc
