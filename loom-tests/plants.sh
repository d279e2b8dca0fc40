#!/usr/bin/env bash
# Proves the loom models can fail: builds kvsched with each planted bug
# (`--cfg kvsched_plant="NAME"`, see the table below and the `kvsched_plant` cfgs in src/) and
# asserts that loom reports a failure in the model(s) meant to catch it. Prints a table
# plant → model → caught and exits non-zero if any plant goes uncaught (or does not build).
#
#   loom-tests/plants.sh                     # every plant
#   loom-tests/plants.sh release-relaxed     # some plants
#
# Each plant builds in its own target dir, target-loom/plants/NAME (kept between runs, so only
# the first run pays the cold build). LOOM_MAX_PREEMPTIONS defaults to 2 as in run.sh; a row
# may pin its own bound (see MODELS).
set -euo pipefail
cd "$(dirname "$0")/.."

export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"

# plant → the models that must catch it: `file` (every test of loom-tests/tests/file.rs) or
# `file::test`, optionally `@N` to run that row at LOOM_MAX_PREEMPTIONS=N instead.
declare -A MODELS=(
  # runtime/claim.rs: a claim is a plain store, so the last writer wins instead of the least key.
  [claim-store]="claim_table::two_claimants_one_block claim_decide_after_all_claimed"
  # sync/barrier.rs: PhaseBarrier waiters depart with a Relaxed load instead of Acquire.
  # (loom's bounded DPOR reaches the stale decision in claim_decide_after_all_claimed only
  # from bound 3 — 30–50 executions; stale_completion catches it at bound 2.)
  [barrier-relaxed]="stale_completion claim_decide_after_all_claimed@3 park_lost_wakeup::barrier_sleepers_wake"
  # runtime/claim.rs: clear_pending succeeds with Relaxed instead of Release.
  [clear-pending-relaxed]="handoff_owner_abort::waiter_reads_recomputed_contents handoff_owner_abort::owner_aborts_while_sharer_waits"
  # pool/free_list.rs: the free-list head's ABA tag is never bumped.
  [free-list-no-tag]="free_list_aba::aba_pop_against_pop_pop_push"
  # pool/mod.rs: the release CAS is Relaxed instead of Release.
  [release-relaxed]="pool_release_allocate::last_release_races_allocate pool_release_allocate::cached_release_races_reclaim_and_lookup"
  # sync/park.rs: unpark signals the condition variable without taking the lock.
  [unpark-no-lock]="park_lost_wakeup::unpark_before_or_during_park"
)
ORDER=(claim-store barrier-relaxed clear-pending-relaxed free-list-no-tag release-relaxed unpark-no-lock)

if [ "$#" -gt 0 ]; then
  plants=("$@")
else
  plants=("${ORDER[@]}")
fi

rows=()
bad=0
for plant in "${plants[@]}"; do
  if [ -z "${MODELS[$plant]:-}" ]; then
    echo "unknown plant '$plant' (known: ${ORDER[*]})" >&2
    exit 2
  fi
  dir="target-loom/plants/$plant"
  mkdir -p "$dir"
  flags="--cfg kvsched_loom -C debug-assertions --cfg kvsched_plant=\"$plant\""
  cargo_test=(cargo test -p kvsched-loom-tests --release --target-dir "$dir")
  echo "== plant $plant: building ($dir)"
  if ! RUSTFLAGS="$flags" "${cargo_test[@]}" --no-run --quiet >"$dir/build.log" 2>&1; then
    tail -n 30 "$dir/build.log" >&2
    rows+=("$plant|(build)|-|BUILD FAILED")
    bad=1
    continue
  fi
  for entry in ${MODELS[$plant]}; do
    spec="${entry%@*}"
    bound="$LOOM_MAX_PREEMPTIONS"
    if [ "$entry" != "$spec" ]; then
      bound="${entry#*@}"
    fi
    file="${spec%%::*}"
    filter=()
    if [ "$spec" != "$file" ]; then
      filter=("${spec#*::}" --exact)
    fi
    log="$dir/$file${filter:+-${filter[0]}}.log"
    start=$SECONDS
    if LOOM_MAX_PREEMPTIONS="$bound" RUSTFLAGS="$flags" \
      "${cargo_test[@]}" --quiet --test "$file" -- "${filter[@]}" >"$log" 2>&1; then
      verdict="NOT CAUGHT"
      bad=1
    elif grep -q "test result: FAILED" "$log" || grep -q "^deadlock; threads" "$log"; then
      # (A deadlock found by loom aborts the test binary while unwinding, so it may print no
      # test result: the deadlock report is the failure.)
      # The first panic message names what loom saw (assertion, causality violation, ...).
      why=$(grep -m1 -A1 "panicked at" "$log" | tail -n 1 | cut -c1-90)
      verdict="caught ($((SECONDS - start))s): $why"
    else
      verdict="ERROR (no test failure reported, see $log)"
      bad=1
    fi
    rows+=("$plant|$spec|$bound|$verdict")
    echo "   $spec (bound $bound): $verdict"
  done
done

echo
printf '%-22s | %-62s | %-5s | %s\n' plant model bound caught
printf '%s\n' "$(printf -- '-%.0s' {1..140})"
for r in "${rows[@]}"; do
  IFS='|' read -r p m b v <<<"$r"
  printf '%-22s | %-62s | %-5s | %s\n' "$p" "$m" "$b" "$v"
done
if [ "$bad" -ne 0 ]; then
  echo "plants: some plant was not caught (or did not build)" >&2
  exit 1
fi
echo "plants: every plant caught"
