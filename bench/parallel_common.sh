# parallel_common.sh NAME: what the parallel benchmarks share (sourced after their STEPS argument
# is read): the MPI environment for root and oversubscription, $root, $PY, $bin (built if
# missing; BENCH_BIN: another build), $out (BENCH_OUT or /tmp/pentatron_NAME_bench, created), and
#   synthetic_shard VOCAB TOKENS   path of a uniform-random token shard in $out (made once)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${BENCH_OUT:-/tmp/pentatron_$1_bench}"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
PY=/usr/bin/python3
bin="${BENCH_BIN:-$root/build/pentatron}"
[[ -x $bin ]] || "$root/scripts/build.sh" >/dev/null
synthetic_shard() {
  local f="$out/synthetic_${1}_000.bin"
  [[ -f $f ]] || "$PY" "$root/bench/make_data.py" --out "$f" --tokens "$2" --vocab "$1" --seed 0 >&2
  echo "$f"
}
