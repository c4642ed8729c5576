#!/usr/bin/env bash
# test_config_doc.sh PENTATRON: docs/config.md is what the code's key table says.
set -euo pipefail
bin="$1"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/scripts" "$tmp/docs"
cp "$PT_SOURCE_DIR/scripts/gen_config_doc.sh" "$tmp/scripts/"
bash "$tmp/scripts/gen_config_doc.sh" "$bin"
if diff -u "$PT_SOURCE_DIR/docs/config.md" "$tmp/docs/config.md"; then
  echo "1 passed, 0 failed"
else
  echo "docs/config.md is stale: run scripts/gen_config_doc.sh"; echo "0 passed, 1 failed"; exit 1
fi
