#!/usr/bin/env bash
# Runs every loom model of loom-tests/tests/, one test binary at a time, each at its own
# preemption bound (the table below), and times each.
#
#   loom-tests/run.sh                          # every model at its bound
#   loom-tests/run.sh claim_table worker_idle_list
#   LOOM_MAX_PREEMPTIONS=3 loom-tests/run.sh   # every model at bound 3 instead
#   loom-tests/run.sh --bounds                 # prints "model bound" lines (plants.sh reads them)
#
# Builds in release mode with debug assertions under `--cfg kvsched_loom`, in `target-loom/`
# at the repository root (CARGO_TARGET_DIR overrides). Extra RUSTFLAGS from the environment
# are appended (plants.sh uses that). Exits non-zero if any model fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each model's LOOM_MAX_PREEMPTIONS. `loom-tests/plants.sh --sweep` finds the smallest bound at
# which a model catches every plant meant for it (the comments). No model runs below 2, the
# bound CI ran them all at before: a lower one would drop coverage of the bugs no plant stands
# for, and every model but the three worker-pool ones takes under half a second at 2.
# Every file in loom-tests/tests/ needs a row.
declare -A BOUND=(
  [claim_decide_after_all_claimed]=3        # plants from 1 (3 with the spinning barrier)
  [claim_table]=3                           # plants from 2 (barrier-relaxed); kept with its sibling
  [completion_queue]=2                      # plants from 0
  [fill_late_load_vs_reuse]=2               # plants from 0
  [free_list_aba]=2                         # plants from 0
  [handoff_owner_abort]=2                   # plants from 0
  [park_lost_wakeup]=2                      # plants from 2 (barrier-relaxed)
  [pending_mark_set_and_read_same_step]=2   # plants from 2 (barrier-relaxed)
  [pool_release_allocate]=2                 # plants from 2 (release-relaxed, reclaim path)
  [pool_exclusive_step]=2                   # plants from 1 (exclusive-unguarded)
  [prefix_index_evict_vs_register_lookup]=2 # plants from 2
  [shutdown_drain]=2                        # plants from 0
  [stale_completion]=2                      # plants from 2
  [work_signal_no_lost_wakeup]=2            # plants from 1
  [worker_idle_list]=2                      # plants from 0
  [cancel_start_vs_drop]=2                  # plants from 1 (drop-check-then-set)
  [cancel_watch_wakeup]=2                   # cancel-wakes-nobody
  [evict_vs_release]=2                      # evict-cas-store
  [evict_stale_hash_hint]=2                 # evict-hint-unchecked
  [loads_in_flight]=2                       # delivered-before-push, delivered-relaxed
  [thread_group_join]=2                     # thread-end-unwoken
  [flush_drain]=2                           # saver-flush-unwoken, probe-flush-unwoken, drop-queued-unwoken, saver-flush-early
)

all_models=()
for f in loom-tests/tests/*.rs; do
  all_models+=("$(basename "$f" .rs)")
done
for m in "${all_models[@]}"; do
  if [ -z "${BOUND[$m]:-}" ]; then
    echo "loom-tests/run.sh: model '$m' has no bound in the BOUND table" >&2
    exit 2
  fi
done

if [ "${1:-}" = "--bounds" ]; then
  for m in "${all_models[@]}"; do
    echo "$m ${BOUND[$m]}"
  done
  exit 0
fi

override="${LOOM_MAX_PREEMPTIONS:-}"
export RUSTFLAGS="--cfg kvsched_loom -C debug-assertions${RUSTFLAGS:+ $RUSTFLAGS}"
target_dir="${CARGO_TARGET_DIR:-target-loom}"
cargo_test=(cargo test -p kvsched-loom-tests --release --target-dir "$target_dir")

if [ "$#" -gt 0 ]; then
  models=("$@")
else
  models=("${all_models[@]}")
fi

echo "loom: bounds ${override:+all }${override:-per model} RUSTFLAGS='$RUSTFLAGS' target=$target_dir"
build_start=$SECONDS
"${cargo_test[@]}" --no-run --quiet
echo "build: $((SECONDS - build_start))s"

failed=()
total_ms=0
for m in "${models[@]}"; do
  bound="${override:-${BOUND[$m]:-}}"
  if [ -z "$bound" ]; then
    echo "unknown model '$m' (known: ${all_models[*]})" >&2
    exit 2
  fi
  start=$(date +%s%N)
  if LOOM_MAX_PREEMPTIONS="$bound" "${cargo_test[@]}" --quiet --test "$m" -- --nocapture \
    --test-threads=1 >"$target_dir/loom-$m.log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$m")
  fi
  ms=$((($(date +%s%N) - start) / 1000000))
  total_ms=$((total_ms + ms))
  printf '%-40s %-7s bound %s %4d.%01ds\n' "$m" "$status" "$bound" $((ms / 1000)) $((ms % 1000 / 100))
  grep -o "loom-model .*" "$target_dir/loom-$m.log" | sed "s/^loom-model /    /" || true
  if [ "$status" = FAILED ]; then
    tail -n 40 "$target_dir/loom-$m.log" | sed 's/^/    /'
  fi
done
printf '%-40s %-7s %8s %4d.%01ds\n' "total" "" "" $((total_ms / 1000)) $((total_ms % 1000 / 100))

if [ "${#failed[@]}" -gt 0 ]; then
  echo "loom: FAILED: ${failed[*]} (logs in $target_dir/loom-NAME.log)" >&2
  exit 1
fi
echo "loom: all ${#models[@]} models passed"
