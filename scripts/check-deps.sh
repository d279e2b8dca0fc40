#!/usr/bin/env bash
# The library an engine embeds must not compile the tools' or the test kit's dependencies:
# `kvsched` (every feature but `internals`, which only the command line and the benchmarks
# turn on) has none of clap, serde, hdrhistogram, indicatif, mimalloc or kvsched-testkit in
# its normal dependency tree.
set -euo pipefail
cd "$(dirname "$0")/.."
for features in "" "--features redis"; do
  # shellcheck disable=SC2086
  tree=$(cargo tree -e normal -p kvsched $features --prefix none --format '{p}')
  bad=$(printf '%s\n' "$tree" | grep -E '^(clap|indicatif|mimalloc|libmimalloc-sys|hdrhistogram|serde|serde_json|kvsched-testkit|kvsched-cli) ' | sort -u || true)
  if [ -n "$bad" ]; then
    echo "the library (${features:-default features}) depends on tool or test-kit crates:" >&2
    printf '  %s\n' $bad >&2
    exit 1
  fi
  echo "library dependencies (${features:-default features}): $(printf '%s\n' "$tree" | sort -u | grep -vc '^kvsched ') crates, none of the tools' or the test kit's"
done
