#!/usr/bin/env bash
# Proves the loom models can fail: builds kvsched with each planted bug
# (`--cfg kvsched_plant="NAME"`, see the table below and the plants of crates/kvsched/src/plant.rs) and
# asserts that loom reports a failure in the model(s) meant to catch it. Prints a table
# plant → model → bound → caught and exits non-zero if any plant goes uncaught (or does not
# build).
#
#   loom-tests/plants.sh                     # every plant, each model at its bound in run.sh
#   loom-tests/plants.sh release-relaxed     # some plants
#   loom-tests/plants.sh --sweep [PLANT…]    # the smallest bound (0–4) at which each row catches
#
# Every plant builds in one target dir, target-loom/plants/shared (see below), its logs in
# target-loom/plants/NAME. A row runs at its model's bound in loom-tests/run.sh, so
# a plant is shown caught exactly as CI runs the model; LOOM_MAX_PREEMPTIONS overrides every
# row, and a row may pin its own bound (`@N`, see MODELS).
set -euo pipefail
cd "$(dirname "$0")/.."

sweep=0
if [ "${1:-}" = "--sweep" ]; then
  sweep=1
  shift
fi
override="${LOOM_MAX_PREEMPTIONS:-}"
declare -A BOUND=()
while read -r m b; do
  BOUND[$m]=$b
done < <(bash loom-tests/run.sh --bounds)

# plant → the models that must catch it: `file` (every test of loom-tests/tests/file.rs) or
# `file::test`, optionally `@N` to run that row at LOOM_MAX_PREEMPTIONS=N instead.
declare -A MODELS=(
  # connector/cancel.rs: a drop checks the started bit, then sets its own with a plain store.
  [drop-check-then-set]="cancel_start_vs_drop::exactly_one_side_wins"
  # connector/cancel.rs: a token's firing wakes none of the threads watching it.
  [cancel-wakes-nobody]="cancel_watch_wakeup"
  # runtime/claim.rs: a claim is a plain store, so the last writer wins instead of the least key.
  [claim-store]="claim_table::two_claimants_one_block claim_decide_after_all_claimed"
  # sync/barrier.rs: PhaseBarrier waiters depart with a Relaxed load instead of Acquire.
  [barrier-relaxed]="stale_completion claim_decide_after_all_claimed claim_table::reset_between_steps park_lost_wakeup::barrier_sleepers_wake pending_mark_set_and_read_same_step"
  # runtime/claim.rs: clear_pending succeeds with Relaxed instead of Release.
  [clear-pending-relaxed]="handoff_owner_abort::waiter_reads_recomputed_contents handoff_owner_abort::owner_aborts_while_sharer_waits pending_mark_set_and_read_same_step"
  # pool/free_list.rs: the free-list head's ABA tag is never bumped.
  [free-list-no-tag]="free_list_aba::aba_pop_against_pop_pop_push"
  # pool/state.rs: the last release of a block whose load still owns its bytes frees it.
  [fill-release-unguarded]="fill_late_load_vs_reuse::late_load_never_lands_in_a_reused_block"
  # pool/mod.rs: the release CAS is Relaxed instead of Release.
  [release-relaxed]="pool_release_allocate::last_release_races_allocate pool_release_allocate::cached_release_races_reclaim_and_lookup"
  # pool/exclusive.rs: the exclusive mode takes a read lock, so a parallel shard's CAS races
  # the exclusive holder's plain stores and its unlocked index accesses.
  [exclusive-unguarded]="pool_exclusive_step::exclusive_and_shared_never_hand_out_one_block_twice pool_exclusive_step::exclusive_and_shared_index_accesses_are_ordered pool_exclusive_step::exclusive_and_shared_reclaim_queue_accesses_are_ordered"
  # pool/prefix_index.rs: lookup revives the entry it found under a second hold of the lock.
  [lookup-revive-unlocked]="prefix_index_evict_vs_register_lookup::evict_races_lookup prefix_index_evict_vs_register_lookup::evict_races_lookup_and_register"
  # sync/park.rs: unpark signals the condition variable without taking the lock.
  [unpark-no-lock]="park_lost_wakeup::unpark_before_or_during_park work_signal_no_lost_wakeup"
  # runtime/worker.rs: a worker parks without re-checking the jobs after listing itself idle.
  [worker-no-recheck]="worker_idle_list::dispatch_races_worker_going_idle worker_idle_list::two_workers_dispatch_one_at_a_time"
  # runtime/worker.rs: no SeqCst fences between a worker's listing and its re-check of the jobs,
  # nor between a dispatch's push and its pop of the idle list.
  [worker-no-fence]="worker_idle_list::dispatch_races_worker_going_idle worker_idle_list::two_workers_dispatch_one_at_a_time"
  # runtime/worker.rs: a worker stays listed idle while it runs a load, so a dispatch wakes it
  # in an idle worker's place.
  [worker-busy-listed]="worker_idle_list::a_second_job_runs_while_the_first_hangs"
  # runtime/worker.rs: a worker drops a completion when the shard's queue is full.
  [worker-drop-on-full]="completion_queue::one_worker_full_queue completion_queue::full_queue_makes_the_producer_retry"
  # runtime/completion_queue.rs: a pop wakes none of the workers parked on the full queue.
  [pop-wakes-no-pusher]="completion_queue::full_queue_makes_the_producer_retry"
  # runtime/worker.rs: shutdown waits for the workers without draining the queues meanwhile.
  [shutdown-no-drain-while-waiting]="shutdown_drain::one_worker_two_jobs shutdown_drain::two_workers_two_jobs"
  # pool/prefix_index.rs: evict clears CACHED with a plain store, losing a lock-free release's
  # or retain's count change.
  [evict-cas-store]="evict_vs_release::evict_races_release_of_another_holder evict_vs_release::evict_races_retain_and_release"
  # pool/prefix_index.rs: evict drops the entry its hash hint names without checking that it
  # is the block's own (a re-registration between its CAS and its hash store).
  [evict-hint-unchecked]="evict_stale_hash_hint"
  # runtime/worker.rs: a completion counts as delivered before it is pushed onto its queue.
  [delivered-before-push]="loads_in_flight"
  # runtime/worker.rs: the delivered count is bumped Relaxed, not Release.
  [delivered-relaxed]="loads_in_flight"
  # sync/thread_group.rs: a thread's end does not wake the join.
  [thread-end-unwoken]="thread_group_join"
  # kv/drain.rs: the end of the last batch does not wake a flush (the two plants are one
  # site, shared by the write-behind and the prober).
  [saver-flush-unwoken]="flush_drain::save_flush_waits_for_two_threads"
  [probe-flush-unwoken]="flush_drain::probe_flush_waits_for_the_probe"
  # kv/drain.rs: dropping the queued work (drop_queued, a stop) does not wake a flush.
  [drop-queued-unwoken]="flush_drain::save_flush_woken_by_drop_queued flush_drain::probe_flush_against_a_stop"
  # kv/drain.rs: a flush does not wait for a batch a thread holds.
  [saver-flush-early]="flush_drain::save_flush_waits_for_two_threads flush_drain::probe_flush_waits_for_the_probe"
)
ORDER=(drop-check-then-set claim-store barrier-relaxed clear-pending-relaxed free-list-no-tag release-relaxed
  fill-release-unguarded exclusive-unguarded
  lookup-revive-unlocked unpark-no-lock worker-no-recheck worker-no-fence worker-busy-listed
  worker-drop-on-full shutdown-no-drain-while-waiting evict-cas-store evict-hint-unchecked
  delivered-before-push delivered-relaxed saver-flush-unwoken probe-flush-unwoken drop-queued-unwoken
  saver-flush-early thread-end-unwoken cancel-wakes-nobody pop-wakes-no-pusher)

if [ "$#" -gt 0 ]; then
  plants=("$@")
else
  plants=("${ORDER[@]}")
fi

# run_row LOG BOUND FILE [FILTER…]: runs one row; sets `verdict` (and returns 0 iff caught).
run_row() {
  local log=$1 bound=$2 file=$3
  shift 3
  local start=$SECONDS
  if LOOM_MAX_PREEMPTIONS="$bound" RUSTFLAGS="$flags" \
    "${cargo_test[@]}" --quiet --test "$file" -- "$@" >"$log" 2>&1; then
    verdict="NOT CAUGHT"
    return 1
  elif grep -q "test result: FAILED" "$log" || grep -q "^deadlock; threads" "$log"; then
    # (A deadlock found by loom aborts the test binary while unwinding, so it may print no
    # test result: the deadlock report is the failure.)
    # The first panic message names what loom saw (assertion, causality violation, ...).
    local why
    why=$(grep -m1 -A1 "panicked at" "$log" | tail -n 1 | cut -c1-90)
    verdict="caught ($((SECONDS - start))s): $why"
    return 0
  else
    verdict="ERROR (no test failure reported, see $log)"
    return 2
  fi
}

rows=()
bad=0
for plant in "${plants[@]}"; do
  if [ -z "${MODELS[$plant]:-}" ]; then
    echo "unknown plant '$plant' (known: ${ORDER[*]})" >&2
    exit 2
  fi
  # One target dir for every plant: scripts/plant-rustc adds the plant's cfg to the
  # workspace's own crates only (loom and the other dependencies build once), and cleaning
  # those crates makes cargo build them afresh for each plant (the wrapper's flag is not in
  # cargo's fingerprint, so touching the sources would trust what an interrupted run left).
  dir="target-loom/plants/shared"
  logs="target-loom/plants/$plant"
  mkdir -p "$dir" "$logs"
  flags="--cfg kvsched_loom -C debug-assertions"
  export KVSCHED_PLANT="$plant"
  export RUSTC_WRAPPER="$PWD/scripts/plant-rustc"
  cargo clean --quiet --release --target-dir "$dir" -p kvsched -p kvsched-loom-tests
  cargo_test=(cargo test -p kvsched-loom-tests --release --target-dir "$dir")
  echo "== plant $plant: building ($dir)"
  if ! RUSTFLAGS="$flags" "${cargo_test[@]}" --no-run --quiet >"$logs/build.log" 2>&1; then
    tail -n 30 "$logs/build.log" >&2
    rows+=("$plant|(build)|-|BUILD FAILED")
    bad=1
    continue
  fi
  for entry in ${MODELS[$plant]}; do
    spec="${entry%@*}"
    file="${spec%%::*}"
    bound="${override:-${BOUND[$file]:-}}"
    if [ "$entry" != "$spec" ]; then
      bound="${entry#*@}"
    fi
    if [ -z "$bound" ]; then
      echo "plant $plant: no model '$file' in loom-tests/run.sh" >&2
      exit 2
    fi
    filter=()
    if [ "$spec" != "$file" ]; then
      filter=("${spec#*::}" --exact)
    fi
    log="$logs/$file${filter:+-${filter[0]}}.log"
    if [ "$sweep" -eq 1 ]; then
      found=""
      for b in 0 1 2 3 4; do
        if run_row "$log" "$b" "$file" "${filter[@]}"; then
          found=$b
          break
        fi
      done
      if [ -n "$found" ]; then
        rows+=("$plant|$spec|$found|smallest catching bound (run.sh: ${BOUND[$file]}): $verdict")
      else
        rows+=("$plant|$spec|-|not caught up to bound 4")
        bad=1
      fi
      echo "   $spec: smallest bound ${found:--}"
      continue
    fi
    run_row "$log" "$bound" "$file" "${filter[@]}" || bad=1
    rows+=("$plant|$spec|$bound|$verdict")
    echo "   $spec (bound $bound): $verdict"
  done
done

echo
printf '%-32s | %-66s | %-5s | %s\n' plant model bound caught
printf '%s\n' "$(printf -- '-%.0s' {1..150})"
for r in "${rows[@]}"; do
  IFS='|' read -r p m b v <<<"$r"
  printf '%-32s | %-66s | %-5s | %s\n' "$p" "$m" "$b" "$v"
done
if [ "$bad" -ne 0 ]; then
  echo "plants: some plant was not caught (or did not build)" >&2
  exit 1
fi
echo "plants: every plant caught"
