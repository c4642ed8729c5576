#!/usr/bin/env bash
# gpu_debs.sh [DIR]: fetches, here (Debian 12, apt), the .deb files our build needs on a GPU machine
# that has none of our Debian packages and no network (scripts/gpu_check.sh unpacks them there with
# `dpkg-deb -x`, or a small Python ar+tar reader, into a prefix under /tmp; nothing is installed).
# DIR defaults to .gpu-debs/ in the source tree (ignored through .git/info/exclude, so that the
# device tool carries it: carry [".gpu-debs"]). Writes DIR/MANIFEST (package, version, file, size,
# sha256; a "fallback" mark on runtime libraries the GPU machine's own system normally has, which
# gpu_check.sh puts on the library path only where the system lacks them) and prints the total,
# which must stay well under the 64 MiB the device tool carries (limit here: 48 MiB).
#   What is fetched: the runtime and development packages of what CMakeLists.txt finds (OpenMPI 4.1
#   with its PMIx, hwloc, libevent and the transports its plugins open, oneDNN with its OpenCL ICD
#   loader, inih, jansson, cmocka, PCRE2 (8-bit), utf8proc, zlib's headers) and pkgconf. Not fetched:
#   the compiler, libc, libstdc++/libgomp (every machine with nvcc has them), docs packages, the
#   16/32-bit PCRE2 libraries, ibverbs-providers (RDMA drivers: one process on one GPU uses none).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/.gpu-debs}"
limit_mib=48

main_pkgs=(
  # OpenMPI 4.1 (libmpi, mpicc/mpirun/orted, headers, wrapper data, help files) and what it loads
  libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common
  libpmix2 libhwloc15 libhwloc-plugins libevent-core-2.1-7 libevent-pthreads-2.1-7 libmunge2
  libfabric1 libucx0 libpsm2-2 libpsm-infinipath1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
  # oneDNN (the CPU backend's GEMMs) and its OpenCL loader dependency
  libdnnl2 libdnnl-dev ocl-icd-libopencl1
  # the small libraries found through pkg-config
  libinih1 libinih-dev libjansson4 libjansson-dev libcmocka0 libcmocka-dev
  libpcre2-8-0 libpcre2-dev libutf8proc2 libutf8proc-dev zlib1g-dev
  # pkg-config itself (CMake's FindPkgConfig needs the program)
  pkgconf pkgconf-bin libpkgconf3
)
# runtime libraries an Ubuntu 24.04 machine normally has (newer there): used only where missing
fallback_pkgs=(zlib1g libudev1 libnuma1 libatomic1 libuuid1)

mkdir -p "$dir" || exit 1
# the folder must travel as an ignored path (carry), never be committed
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  ex="$(git -C "$root" rev-parse --git-path info/exclude)"
  case "$ex" in /*) ;; *) ex="$root/$ex" ;; esac
  mkdir -p "$(dirname "$ex")"
  grep -qxF '/.gpu-debs/' "$ex" 2>/dev/null || echo '/.gpu-debs/' >> "$ex"
fi

cd "$dir" || exit 1
rm -f ./*.deb MANIFEST
fail=0
fetch() { # fetch MARK PKG...
  local mark="$1"; shift
  for p in "$@"; do
    if ! apt-get download -q=2 "$p" >/dev/null 2>"$p.err"; then
      echo "gpu_debs: apt-get download $p failed: $(head -2 "$p.err")" >&2; fail=1
    fi
    rm -f "$p.err"
    local f; f="$(ls -t "${p}"_*.deb 2>/dev/null | head -1)"
    [ -n "$f" ] || continue
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$p" "$(dpkg-deb -f "$f" Version)" "$f" "$(stat -c %s "$f")" \
      "$(sha256sum "$f" | cut -d' ' -f1)" "$mark" >> MANIFEST
  done
}
fetch main "${main_pkgs[@]}"
fetch fallback "${fallback_pkgs[@]}"

n=$(ls ./*.deb 2>/dev/null | wc -l)
bytes=$(cat ./*.deb 2>/dev/null | wc -c)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "gpu_debs: $n packages, $mib MiB in $dir (carry limit 64 MiB for everything; ours ${limit_mib})"
if [ "$n" -ne $(( ${#main_pkgs[@]} + ${#fallback_pkgs[@]} )) ]; then
  echo "gpu_debs: expected $(( ${#main_pkgs[@]} + ${#fallback_pkgs[@]} )) packages" >&2; fail=1
fi
if [ "$bytes" -gt $((limit_mib * 1048576)) ]; then echo "gpu_debs: over ${limit_mib} MiB" >&2; fail=1; fi
exit $fail
