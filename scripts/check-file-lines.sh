#!/usr/bin/env bash
# Every Rust file tracked by git (sources, tests, benches, examples, loom models) has at most
# 600 lines: one mechanism per file. Lists the files over the limit and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=600
over=()
while read -r n path; do
  [ "$path" = total ] && continue
  if [ "$n" -gt "$limit" ]; then
    over+=("  $n $path")
  fi
done < <(git ls-files -z -- '*.rs' | xargs -0 wc -l)
if [ "${#over[@]}" -gt 0 ]; then
  echo "Rust files over $limit lines:" >&2
  printf '%s\n' "${over[@]}" >&2
  exit 1
fi
echo "every Rust file has at most $limit lines ($(git ls-files -- '*.rs' | wc -l) files)"
