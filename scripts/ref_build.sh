# ref_build.sh: sourced by scripts/bitcheck.sh and bench/compare_bench.sh, to build an older commit
# of pentatron next to the working tree and to build the working tree itself.
#
#   ref_build [REF]   builds REF (default: the tag pre-redesign, or baa7fd8 where tags did not
#                     travel with the clone) in a git worktree $BITCHECK_DIR/src (default
#                     BITCHECK_DIR=/tmp/pt-bitcheck), into $BITCHECK_DIR/build, and sets
#                     REF_SHA, REF_BIN. The worktree and its build are reused between runs: they
#                     are moved and rebuilt only when REF resolves to another commit.
#   new_build         builds the working tree into build/ (incremental, warnings as errors as
#                     scripts/test.sh builds it) and sets NEW_BIN.
#
# Both use scripts/build.sh (Release; PT_NATIVE's default -march=native for both, so that the two
# binaries differ by their sources only). Build output goes to $BITCHECK_DIR/*.build.log; a
# failed build prints its tail and returns non-zero. Needs $root (the repository root).
BITCHECK_DIR="${BITCHECK_DIR:-/tmp/pt-bitcheck}"

ref_build() {
  local ref="${1:-}" wt="$BITCHECK_DIR/src" stamp="$BITCHECK_DIR/build/.built_from"
  if [[ -z $ref ]]; then
    if git -C "$root" rev-parse -q --verify 'pre-redesign^{commit}' >/dev/null; then ref=pre-redesign
    else ref=baa7fd8; fi
  fi
  REF_SHA="$(git -C "$root" rev-parse -q --verify "$ref^{commit}")" ||
    { echo "ref_build: '$ref' is not a commit of $root" >&2; return 1; }
  mkdir -p "$BITCHECK_DIR"
  # a worktree of another clone (or a removed one) is not ours to reuse: start it afresh
  if [[ -e $wt ]] && [[ "$(git -C "$wt" rev-parse --path-format=absolute --git-common-dir 2>/dev/null)" != \
                         "$(git -C "$root" rev-parse --path-format=absolute --git-common-dir)" ]]; then
    echo "ref_build: $wt is not a worktree of $root; making a new one" >&2
    rm -rf "$wt" "$BITCHECK_DIR/build"
  fi
  git -C "$root" worktree prune
  if [[ ! -e $wt ]]; then
    git -C "$root" worktree add -q --detach "$wt" "$REF_SHA" || return 1
  elif [[ "$(git -C "$wt" rev-parse HEAD)" != "$REF_SHA" ]]; then
    git -C "$wt" checkout -q --detach --force "$REF_SHA" || return 1
  fi
  REF_BIN="$BITCHECK_DIR/build/pentatron"
  if [[ -x $REF_BIN && -f $stamp && "$(cat "$stamp")" == "$REF_SHA" ]]; then
    echo "ref: $ref = ${REF_SHA:0:10}, built already ($REF_BIN)" >&2
    return 0
  fi
  echo "ref: building $ref = ${REF_SHA:0:10} in $wt ..." >&2
  rm -f "$stamp"
  if ! "$wt/scripts/build.sh" "$BITCHECK_DIR/build" -DPT_WERROR=OFF > "$BITCHECK_DIR/ref.build.log" 2>&1; then
    tail -20 "$BITCHECK_DIR/ref.build.log" >&2; echo "ref_build: building $ref failed" >&2; return 1
  fi
  echo "$REF_SHA" > "$stamp"
}

new_build() {
  NEW_BIN="$root/build/pentatron"
  mkdir -p "$BITCHECK_DIR"
  echo "new: building the working tree ($(git -C "$root" rev-parse --short HEAD)$(
        [[ -n "$(git -C "$root" status --porcelain -- src include CMakeLists.txt)" ]] && echo ', modified')) into $root/build ..." >&2
  if ! "$root/scripts/build.sh" "$root/build" -DPT_WERROR=ON > "$BITCHECK_DIR/new.build.log" 2>&1; then
    tail -20 "$BITCHECK_DIR/new.build.log" >&2; echo "new_build: building the working tree failed" >&2; return 1
  fi
}
