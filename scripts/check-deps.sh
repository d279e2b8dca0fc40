#!/usr/bin/env bash
# The library without its default `cli` feature must not compile the tools' dependencies:
# an embedder's `kvsched = { default-features = false }` gets the runtime alone.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(cargo tree -e normal -p kvsched --no-default-features --prefix none --format '{p}')
bad=$(printf '%s\n' "$tree" | grep -E '^(clap|indicatif|mimalloc|libmimalloc-sys|hdrhistogram|serde|serde_json) ' || true)
if [ -n "$bad" ]; then
  echo "the library without 'cli' depends on tool crates:" >&2
  printf '  %s\n' $bad >&2
  exit 1
fi
echo "library dependencies without 'cli': $(printf '%s\n' "$tree" | sort -u | grep -vc '^kvsched ') crates, none of the tools'"
