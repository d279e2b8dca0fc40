#!/usr/bin/env bash
# Runs every loom model of loom-tests/tests/, one test binary at a time, and times each.
#
#   loom-tests/run.sh                 # every model, LOOM_MAX_PREEMPTIONS=2
#   LOOM_MAX_PREEMPTIONS=3 loom-tests/run.sh claim_table handoff_owner_abort
#
# Builds in release mode with debug assertions under `--cfg kvsched_loom`, in `target-loom/`
# at the repository root (CARGO_TARGET_DIR overrides). Extra RUSTFLAGS from the environment
# are appended (plants.sh uses that). Exits non-zero if any model fails.
set -euo pipefail
cd "$(dirname "$0")/.."

export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export RUSTFLAGS="--cfg kvsched_loom -C debug-assertions${RUSTFLAGS:+ $RUSTFLAGS}"
target_dir="${CARGO_TARGET_DIR:-target-loom}"
cargo_test=(cargo test -p kvsched-loom-tests --release --target-dir "$target_dir")

if [ "$#" -gt 0 ]; then
  models=("$@")
else
  models=()
  for f in loom-tests/tests/*.rs; do
    models+=("$(basename "$f" .rs)")
  done
fi

echo "loom: LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS RUSTFLAGS='$RUSTFLAGS' target=$target_dir"
build_start=$SECONDS
"${cargo_test[@]}" --no-run --quiet
echo "build: $((SECONDS - build_start))s"

failed=()
total_ms=0
for m in "${models[@]}"; do
  start=$(date +%s%N)
  if "${cargo_test[@]}" --quiet --test "$m" -- --nocapture --test-threads=1 >"$target_dir/loom-$m.log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$m")
  fi
  ms=$((($(date +%s%N) - start) / 1000000))
  total_ms=$((total_ms + ms))
  printf '%-36s %-7s %4d.%01ds\n' "$m" "$status" $((ms / 1000)) $((ms % 1000 / 100))
  grep -o "loom-model .*" "$target_dir/loom-$m.log" | sed "s/^loom-model /    /" || true
  if [ "$status" = FAILED ]; then
    tail -n 40 "$target_dir/loom-$m.log" | sed 's/^/    /'
  fi
done
printf '%-36s %-7s %4d.%01ds\n' "total (bound $LOOM_MAX_PREEMPTIONS)" "" \
  $((total_ms / 1000)) $((total_ms % 1000 / 100))

if [ "${#failed[@]}" -gt 0 ]; then
  echo "loom: FAILED: ${failed[*]} (logs in $target_dir/loom-NAME.log)" >&2
  exit 1
fi
echo "loom: all ${#models[@]} models passed"
