#!/usr/bin/env bash
# The public API of each published package as a user sees it (Redis feature included), one
# line per item, method, field, variant and implemented trait, from rustdoc's HTML output:
# docs/public-api/kvsched.txt (the library an engine embeds) and
# docs/public-api/kvsched-testkit.txt (the test kit).
#
#   scripts/public-api.sh           # regenerate docs/public-api/*.txt
#   scripts/public-api.sh --check   # fail (exit 1, with the diff) if one differs from its file
#
# Growing or changing an API is a decision: it shows as a diff of its file.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}/public-api"
mkdir -p docs/public-api
status=0
for pkg in kvsched kvsched-testkit; do
  crate=${pkg//-/_}
  # Only the package's own features: `internals` is no API.
  RUSTDOCFLAGS="" cargo doc -p "$pkg" --features redis --no-deps --quiet --target-dir "$target"
  new=$(python3 scripts/public-api.py "$target/doc/$crate" "$crate")
  file="docs/public-api/$pkg.txt"
  if [ "${1:-}" = "--check" ]; then
    if ! diff -u "$file" <(printf '%s\n' "$new"); then
      echo "public API of $pkg changed: run scripts/public-api.sh and commit $file" >&2
      status=1
    else
      echo "public API of $pkg: $(grep -c '^[a-z]' "$file") items, unchanged"
    fi
  else
    printf '%s\n' "$new" > "$file"
    echo "$file: $(grep -c '^[a-z]' "$file") items"
  fi
done
exit $status
