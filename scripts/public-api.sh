#!/usr/bin/env bash
# The public API of the library as an embedder sees it (`--no-default-features`), one line per
# item, method, field, variant and implemented trait, from rustdoc's HTML output.
#
#   scripts/public-api.sh           # regenerate docs/public-api.txt
#   scripts/public-api.sh --check   # fail (exit 1, with the diff) if it differs from the file
#
# Growing or changing the API is a decision: it shows as a diff of docs/public-api.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}/public-api"
RUSTDOCFLAGS="" cargo doc -p kvsched --no-default-features --no-deps --quiet --target-dir "$target"
new=$(python3 scripts/public-api.py "$target/doc/kvsched")
if [ "${1:-}" = "--check" ]; then
  if ! diff -u docs/public-api.txt <(printf '%s\n' "$new"); then
    echo "public API changed: run scripts/public-api.sh and commit docs/public-api.txt" >&2
    exit 1
  fi
  echo "public API: $(grep -c '^[a-z]' docs/public-api.txt) items, unchanged"
else
  printf '%s\n' "$new" > docs/public-api.txt
  echo "docs/public-api.txt: $(grep -c '^[a-z]' docs/public-api.txt) items"
fi
