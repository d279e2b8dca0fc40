#!/usr/bin/env bash
# Every Rust source file tracked by git (sources, tests, benches, examples, loom models) has
# at most 600 lines: one mechanism per file. Lists the files over the limit and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=600
over=$(git ls-files -z -- '*.rs' | xargs -0 wc -l | awk -v l="$limit" '$2 != "total" && $1 > l { print "  " $1 " " $2 }')
if [ -n "$over" ]; then
  echo "Rust files over $limit lines:" >&2
  printf '%s\n' "$over" >&2
  exit 1
fi
echo "every Rust file has at most $limit lines ($(git ls-files -- '*.rs' | wc -l) files)"
