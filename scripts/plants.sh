#!/usr/bin/env bash
# Proves the runtime's tests can fail: builds the test suite with each planted bug
# (`--cfg kvsched_plant="NAME"`, the plants of crates/kvsched/src/plant.rs) and asserts that the tests
# meant to catch it fail. Prints a table plant → test → caught and exits non-zero if any plant
# goes uncaught (or does not build). The loom models have their own: loom-tests/plants.sh.
#
#   scripts/plants.sh                  # every plant
#   scripts/plants.sh late-leak        # some plants
#
# Every plant builds in one target dir, target-plants/ (kept between runs): scripts/plant-rustc
# adds the plant's cfg to the workspace's own crates only, so the dependencies build once,
# and the workspace's own crates are cleaned before each plant so cargo builds them afresh (a
# wrapper's flags are not part of cargo's fingerprint: touching the sources instead trusts the
# artifacts a run interrupted mid-build left). Only the test targets a plant names are built.
set -euo pipefail
cd "$(dirname "$0")/.."

# plant → the test targets that must fail, `;`-separated: `PKG --test FILE`, `PKG --lib FILTER`,
# `kvsched-cli --bin kvsched FILTER` (the command line's unit tests) or `pytest FILE::TEST` (a
# test of bindings/python/tests against the package built with the plant by `maturin build`
# and installed into a venv of target-plants/ that the first such plant creates: it needs PyPI).
declare -A TESTS=(
  # runtime/handoff.rs + the CLI's parallel.rs: deciding before every shard has claimed.
  # (Only reports with shared blocks tell: the claim path's random shared scenarios, and in
  # the runtime a block two requests on different shards hold, the earlier one's shard
  # claiming late.)
  [decide-early]="kvsched-cli --bin kvsched tests::claim_path;kvsched --lib runtime::claim_barrier_tests"
  # runtime/claim.rs: a claim is a plain store, so the last writer wins instead of the least key.
  [claim-store]="kvsched-cli --bin kvsched tests::claim_path"
  # runtime/policy/alignment.rs: prefill chunks of a Mamba align geometry end where the
  # budget says, so the prefix a request computed is not reusable.
  [unaligned-chunks]="kvsched --test runtime_alignment"
  # shard: a late completion's parked blocks are never released.
  [late-leak]="kvsched --test runtime_faults;kvsched --test engine_hostile"
  # shard/admit.rs: compacting the deadline queue drops the entries of loads still in flight,
  # so a hung load's deadline never comes.
  [deadline-compact-in-flight]="kvsched --lib runtime::shard::deadline_tests"
  # shard/completions.rs: a load the worker finished past its deadline counts as landed when
  # its completion comes before the step that would expire it.
  [late-ok-accepted]="kvsched --test runtime_land"
  # runtime/step.rs: the workers' queue is never taken for full, so jobs pile up behind a
  # connector that never returns.
  [load-queue-unbounded]="kvsched --test runtime_liveness"
  # shard: a connector panic counts as a successful load.
  [panic-ok]="kvsched --test runtime_faults"
  # runtime: a reported block of an older generation is trusted (update's destination check
  # and the report's currency check both ignore generations).
  [trust-stale]="kvsched --test runtime_faults"
  # shard: an engine finish of a request whose load is in flight frees its blocks at once.
  [end-while-loading]="kvsched --test runtime_faults;kvsched --test engine_hostile"
  # runtime/step.rs: a stalled runtime never preempts across shards.
  [no-cross-shard-preempt]="kvsched-cli --test cli_liveness"
  # stress/prompt_sources.rs: a load that failed before any worker started it (its deadline
  # passed in the queue) is left out of "of which after a failed load".
  [failed-unstarted-load-uncounted]="kvsched-cli --test cli_stress_faults"
  # kv/saver.rs: the saves dropped off the queue (at the connector's end, or by
  # drop_queued_saves) are not counted.
  [queued-drop-uncounted]="kvsched --lib kv::saver"
  # runtime/shard/mod.rs: a shard's step result, reused from step to step, keeps an earlier
  # step's counts, which the runtime then counts again.
  [result-keeps-counts]="kvsched --test runtime_land;kvsched --test runtime_liveness"
  # runtime/discard.rs: an output's samples count as the plan's own when only their number
  # matches, so a request left out takes a token it was not sent.
  [sampled-as-planned-by-count]="kvsched --test runtime_trust"
  # shard: the list of requests a step scheduled to sample keeps every earlier step's, so a
  # plan answered as planned samples requests again (duplicates, tokens not sent).
  [sampling-kept]="kvsched --test runtime_trust"
  # rules/recovery/boundary.rs: a one-token window needs the entry of the block holding a
  # mid-block boundary, so an old-hits-only request rolls back past its own length.
  [window-one-needs-entry]="kvsched --test rules_examples"
  # shard/outputs.rs: a request whose sample the output left out has its progress confirmed
  # without it: every token computed, no sample to come, and no step schedules it again.
  [missing-sample-kept]="kvsched --test runtime_trust"
  # shard: the step applying a cross-shard preemption does not report that it held
  # admission, so an engine waiting on its empty plan sleeps while the victim could run.
  [held-admission-unannounced]="kvsched --lib runtime::stall"
  # shard/outputs.rs: a sample the engine was told to keep is dropped when recovery rolls the
  # step back (the first safe step after a switch from vllm): one token too many.
  [kept-sample-discarded]="kvsched --test runtime_discard;kvsched --test kv_lifecycle_outputs"
  # shard/schedule.rs: a request restarted at a switch to safe drops its kept sample.
  [restart-drops-kept-sample]="kvsched --test runtime_discard;kvsched --test kv_lifecycle_outputs"
  # shard/schedule.rs: a restart keeps the loss of the last step's output, so the restart's
  # first step is lost too: its kept sample asked for again, one token too many.
  # kv/disk/mod.rs: a rescan never forgets the numbers of refused packs since deleted.
  [seen-never-pruned]="kvsched --lib kv::disk::tests::refused_packs_that_are_gone_are_forgotten"
  # kv/tier_load.rs: the tier's properties asked at every load, outside the panic guard.
  [tier-properties-unguarded]="kvsched --test kv_tier_panics"
  # kv/tier_load.rs: a chunk the tier handed over and then disowned is counted loaded too.
  [disowned-chunk-counted]="kvsched --test kv_tier_panics"
  # kv/saver.rs: save threads rest on the condition variable offers notify, so an offer
  # wakes a resting thread (which rests on) instead of one waiting for work.
  # kv/drain.rs (the saver's and the prober's flush): the thread ending the last batch
  # (probe) does not wake a parked flush, which waits out its deadline. Both plants break
  # that one site, so each is caught by both queues' tests (and by loom's flush_drain).
  [saver-flush-unwoken]="kvsched --lib kv::saver::tests::a_flush_is_woken_when_the_last_batch_is_stored"
  # kv/saver.rs: a thread rests its CPU share still counted busy, so a flush waits it out;
  # kv/drain.rs: `drop_queued` does not wake a flush waiting for what it dropped.
  [saver-flush-waits-rest]="kvsched --lib kv::saver::tests::a_flush_does_not_wait_out_a_save_threads_rest"
  [drop-queued-unwoken]="kvsched --lib kv::saver::tests::a_flush_waiting_for_dropped_saves_is_woken"
  [probe-flush-unwoken]="kvsched --lib kv::prober::tests::a_flush_is_woken_when_the_last_probe_is_answered"
  [saver-rest-on-ready]="kvsched --lib kv::saver::tests::a_save_offered_while_one_thread_rests_is_stored_by_the_other"
  # kv/bounded.rs: a get starts a thread only when every thread is busy, not counting the
  # gets queued: two queued before the one thread takes the first leave the second behind it.
  [gets-grow-on-busy-alone]="kvsched --lib kv::bounded::tests::gets_queued_past_the_idle_threads_start_another"
  # shard/load_choice.rs: under a Mamba align group the cost policy loads a hit's head, and
  # probes one resume unit, ending where the tier holds no state: every one fails.
  [align-head-load]="kvsched --test runtime_load_probe"
  [restart-keeps-lost-output]="kvsched --test runtime_discard;kvsched --test kv_lifecycle_outputs"
  # bindings/python tier_jobs.rs: a memory tier's lookups answer from the index alone, which
  # cannot see what the store evicted: evicted chunks promised, kept ones missed.
  # runtime/builder.rs: a connector built for another geometry is taken.
  # kv/redis/reply.rs: a value past the bound is a protocol error even within
  # max_value_bytes: the connection dropped, the node down, the call's other keys lost.
  [redis-oversized-drops-node]="kvsched-testkit --features redis --test kv_redis_desync;pytest test_tier.py::test_a_value_the_store_holds_but_cannot_hand_back_is_not_promised_again"
  # runtime/invariants.rs: the accounting is read while Handles submit, a submit seen live
  # and not yet counted.
  [accounting-read-unheld]="kvsched --test runtime_handles invariants_hold_while_handles_submit_from_other_threads"
  [connector-geometry-unchecked]="kvsched --test kv_connector_misuse"
  [tier-memory-index-only]="pytest test_tier_bounds.py::test_a_memory_tier_answers_what_its_store_holds"
  # runtime/shard/admit.rs: a panicking connector lookup is not caught where it happens.
  [lookup-uncaught]="kvsched --test runtime_liveness"
  # runtime/handoff.rs: a panic in a shard's step escapes (the thread dies, the step hangs).
  [shard-panic-escapes]="kvsched --lib runtime::poison_tests"
  # runtime/shard/outputs.rs: Mamba entries that hold no state (mode align) are cached.
  # (kvsched stress reads their garbage in mode safe: an invariant violation, exit 1.)
  [mamba-align-cache-unwritten]="kvsched --test kv_engine;kvsched-cli --test cli_stress;kvsched-testkit --test model_exact"
  # kv/drain.rs: a flush returns while a saver thread still holds a batch it has not stored.
  [saver-flush-early]="kvsched --lib kv::saver"
  # kv/saver.rs: a load the tier answers leaves a long save pause on, so saving stays off for
  # up to `max_pause` after the store is back.
  [save-pause-outlasts-outage]="kvsched --lib kv::saver::tests::a_load_the_tier_answers"
  # runtime/shard/outputs.rs: an output applied to a request that did not run confirms its
  # computed length, so an engine finish before its sync load ran caches unwritten blocks.
  [register-unwritten]="kvsched --test kv_lifecycle;kvsched --test engine_hostile"
  # runtime/policy/lost.rs: a lost step is offered again at its pre-step length, past a sync
  # load that may never have run or a Mamba state it advanced in place.
  [reoffer-unwritten]="kvsched --test kv_lifecycle;kvsched --lib runtime::policy::lost;kvsched --test engine_hostile"
  # connector/cancel.rs: a load no worker started is never dropped; its blocks are parked
  # for a completion that never comes (a hung worker), and the pool drains.
  [park-unstarted]="kvsched --test kv_lifecycle"
  # kvsched-cli baseline/blocks.rs: the mutex baseline's pool reclaims a block revived by a
  # prefix hit without its second chance, unlike the runtime's pool. (tests::same_decisions
  # does not catch it: with this plant its runs still decide alike step by step.)
  [baseline-no-second-chance]="kvsched-cli --bin kvsched baseline::strategy_tests"
  # runtime/shard/holders.rs: a sharer's release of a shared block is not recorded, so the
  # holder index keeps a holder that no longer holds the block (the holder index's own test:
  # releases of a block shared by a thousand holders, checked one by one).
  [holder-release-unrecorded]="kvsched --lib runtime::shard::holders"
  # bindings/python tier_index.rs: the Python tier keeps answering "present" for a chunk whose
  # load failed (vLLM #49328).
  [tier-present-after-failed-load]="kvsched-python --lib tier_index;pytest test_tier.py::test_a_value_the_store_holds_but_cannot_hand_back_is_not_promised_again;pytest test_tier.py::test_a_pack_the_disk_tier_refuses_to_read_is_not_promised_again"
  # bindings/python tier_index.rs: only a chunk failing its checks is failed; a key a load did
  # not get back (a store call that erred, a value the store reports not held) is probed
  # again, and a store that says it holds the key has it promised to every request anew.
  # (A keyed chunk read without the key is read past and fails its checks, so the MAC test
  # does not tell.)
  [tier-failed-load-probed-again]="kvsched-python --lib tier_index;pytest test_tier.py::test_a_value_the_store_holds_but_cannot_hand_back_is_not_promised_again;pytest test_tier.py::test_a_pack_the_disk_tier_refuses_to_read_is_not_promised_again"
  # rules/recovery/scan.rs: the last of several cache groups is never scanned, so a request
  # whose failed load hit only that group (a window or Mamba block) is not rolled back: the
  # tiny model reads what the load never wrote and its tokens differ.
  [scan-one-group-less]="kvsched-cli --test cli_stress_model"
  # rules/recovery/decide.rs: in mode safe a request with only old hits returns to P even
  # where a Mamba group holds no state there (the discarded step advanced it in place).
  [old-hits-back-to-p]="kvsched --test rules_props"
  # rules/recovery/decide.rs: in mode safe a request with only old hits evicts nothing, so
  # the blocks its discarded step wrote after reading a failed block stay in the prefix cache.
  [old-hits-evict-nothing]="kvsched --test rules_props;kvsched --test rules_examples"
  # rules/recovery/decide.rs: mode vllm evicts a failed sync load's blocks under recompute,
  # unlike vLLM: the model test's construction of rolled-back blocks left cached (a positive
  # control, mode vllm's wrong tokens) must notice that the mechanism is gone.
  [vllm-evicts-on-recompute]="kvsched-testkit --test model_exact"
  # rules/recovery/decide.rs: an id owned by a different request in each of two groups (one
  # pool per group) is waited for with its least owner only.
  [waits-one-owner-per-id]="kvsched --test rules_examples"
  # runtime/signal.rs: only completions, submits and cancels wake an engine waiting for work,
  # so blocks freed inside a step, or a stall the next steps resolve, wait for one.
  [wait-ignores-pending-work]="kvsched --test runtime_wait"
  # runtime/signal.rs: blocks an allocation of a step was refused, allocatable at its end (two
  # shards admitting at once, each refused by the other's share), wait for an event, so a
  # waiting engine sleeps for good.
  [freed-blocks-unannounced]="kvsched --test runtime_wait"
  # runtime/stall.rs: a preemption across shards nothing came of is repeated while blocks are
  # parked for late loads, so the request it restarts recomputes its prefix step after step.
  [stall-preempts-for-nothing]="kvsched --test runtime_wait"
  # runtime/signal.rs: a step whose report recovered resets the stall count, and a stall it
  # leaves waits for an event before it is counted: a waiting engine sleeps for good.
  [recovered-stall-unannounced]="kvsched --lib runtime::stall"
  # runtime/policy/trust.rs: an async load's own blocks counted from the table's start, so a
  # failure of a load past a local prefix rolls the prefix back too.
  [load-blocks-from-zero]="kvsched --test runtime_trust"
  # kv/tier_connector.rs: a connector's drop waits for its probe thread from a deadline of
  # its own, after the save threads', so it takes up to twice drop_timeout.
  [drop-deadline-per-thread]="kvsched --test kv_connector_misuse"
  # stress/drive.rs: --lockstep waits for saves with no end, so a store that stopped answering
  # holds the run past --duration.
  [lockstep-flush-unbounded]="kvsched-cli --test cli_hung_store"
  # kv/tier_load.rs: a loaded chunk's payload is taken from after its header unverified
  # (no checksum, MAC, key or length check) and written into KV memory.
  [load-unverified]="kvsched --test kv_zero_copy"
  # kv/tier_connector.rs: a save copies the block's bytes 32 bytes early in its reused buffer
  # (under the MAC's room), so the sealed chunk holds the wrong payload.
  [save-payload-offset]="kvsched --test kv_zero_copy"
  # runtime/policy/alignment.rs: a chunk reaching the prompt's end passes its last block
  # end, so a request continuing the prompt finds no state to resume from.
  [prompt-end-state-uncached]="kvsched --test kv_mamba_reuse;kvsched --lib runtime::policy::alignment"
  # runtime/policy/alignment.rs: no branch point, so the end of a prefix shared with an
  # earlier prompt never gets its Mamba state cached.
  [branch-state-uncached]="kvsched --test runtime_alignment;kvsched --lib runtime::policy::alignment"
  # runtime/policy/state_ends.rs: a Mamba align state is looked for one block past the
  # prefix's end, so a tier offers a prefix whose state it does not hold.
  [mamba-state-one-block-late]="kvsched --test kv_mamba_reuse;kvsched --lib runtime::policy::state_ends"
  # runtime/shard/schedule.rs: a step's Mamba align state goes into an entry a failed load
  # left null, and is lost.
  [mamba-state-into-null]="kvsched --test kv_mamba_reuse"
  # runtime/shard/schedule.rs: an entry a step writes that is the null block gets a block
  # only in a Mamba align group, so a sliding-window sharer that a hand-off rolls back below
  # its prefix hit writes its window into the null block.
  [window-into-null]="kvsched --test engine_api"
  # shard/outputs.rs: an owner that passes a Mamba `align` state inside a step clears its
  # mark, so the sharers waiting for it resume from a state nobody wrote.
  [align-pass-clears-mark]="kvsched --test engine_api sharers::an_align_owner"
  # shard/claim.rs: reported blocks leave the prefix cache only with phase 3's decisions, so
  # after a live switch from vllm a shard admitting before the owner's hits them unscanned.
  [report-evicted-late]="kvsched --test engine_api sharers::requests_admitted"
  # shard/unconfirmed.rs: what mode vllm cached before it was written is never reported, so
  # after a live switch to safe it is read (a lost output's loader, its sharers, admissions).
  [unconfirmed-kept-cached]="kvsched --test engine_api sharers::what_mode_vllm_cached_unwritten"
  # shard/claim.rs: a request decided again while it waits loses its earlier waits, and reads
  # a block its owner is still recomputing.
  [waits-overwritten]="kvsched --test engine_api sharers::a_sharer_decided_again"
  # runtime/shard/schedule.rs: a request short of blocks preempts the latest running request
  # even when the step already planned it (mode vllm schedules the requests it admits after
  # the running ones): the plan names the victim's blocks in the admitted request's tables too.
  [preempt-planned]="kvsched --test runtime_plan_blocks"
  # kvsched-testkit sim/model/engine.rs: the model engine does not count a read through a
  # null entry, so the `unreadable_reads` every model test holds at 0 would read 0 anyway.
  [model-null-read-uncounted]="kvsched-testkit --test model_exact a_read_through_a_null_entry"
  # kv/tier_load.rs: a tier call that the load's own cancellation ended counts as a tier
  # error, so a run whose client cancels a loading request reports a healthy store in error.
  [cancelled-call-a-tier-error]="kvsched --test kv_tier_cancel"
  # kvsched-testkit sim/model/engine.rs: the judge does not compare K/V reads (or Mamba state
  # reads) with the request decoded alone, so a wrong read that changes no logit goes unseen.
  [model-kv-read-unjudged]="kvsched-testkit --test model_exact one_bit_flipped_in_a_loaded_value"
  [model-state-read-unjudged]="kvsched-testkit --test model_exact one_bit_flipped_in_a_loaded_value"
  # kv/tier_load.rs: a chunk that fails its checksum after the one-pass verify-and-copy wrote
  # its payload is reported invalid but left unpoisoned (its destination keeps damaged bytes).
  [failed-copy-left-unpoisoned]="kvsched --test kv_zero_copy;kvsched --test kv_fault_paths"
  # kv/tier_load.rs: a disk load read in pieces never reads (nor fails) its short last
  # piece, so those blocks are reported loaded and hold what they held before.
  [load-pieces-drop-tail]="kvsched --test kv_disk_pieces"
  # kv/host_kv_memory.rs: one 64-byte round of a long aligned write is taken as stored by
  # the vector path when it was not, so those bytes keep what the block held.
  [vector-store-skips-round]="kvsched --lib kv::host_kv_memory;kvsched --test kv_zero_copy"
  # kv/host_kv_memory.rs: a whole-block write (a load, a poison) leaves the block's write
  # epoch as it was, so the checker skips rereading bytes a late load or a poison replaced.
  [epoch-not-bumped-on-whole-block-write]="kvsched-testkit --test kv_check_epochs;kvsched --lib kv::host_kv_memory"
  # kv/prober.rs: what a background probe finds never reaches the index, so a connector never
  # offers the chunks another engine sharing its tier saved.
  [probe-hits-unindexed]="kvsched --test kv_shared_tier"
  # runtime/shard/step_order.rs: mode vllm admits every waiting request before it schedules,
  # so a sync loader the budget leaves out keeps its destinations cached and a sharer on
  # another shard reads them before the load ran.
  [vllm-admits-before-schedule]="kvsched --test runtime_step_order"
  # runtime/policy/load_cost.rs: the load cost leaves out the recompute a failed load leaves
  # behind, so the cost policy keeps loading from a tier whose loads all fail.
  [cost-ignores-failures]="kvsched --lib runtime::policy::load_cost;kvsched-cli --test cli_load_policy"
  # kv/disk/pack.rs: each value's offset in a pack's table (and the index) is one checksum's
  # width late, so a disk tier read returns the wrong bytes (and a reopen refuses the pack).
  [pack-offset-past-table]="kvsched --test kv_disk;kvsched --lib kv::disk"
  # runtime/policy/load_cost.rs: the failure share of loads is read as each token's risk, so
  # a hit on a tier that fails now and then is recomputed whole instead of loading its head.
  [failure-share-read-per-token]="kvsched --lib runtime::policy::load_cost"
  # runtime/shard/end.rs: whether another request holds a block an ending owner claimed is
  # read after the owner's release, when another shard of a parallel step may already have
  # allocated the freed block: an unrelated fresh block is handed off into the next report.
  [handoff-count-after-release]="kvsched --lib runtime::shard::release_tests"
  # runtime/inbox.rs: the inbox stays locked while a step applies its commands, so a submit
  # from another thread waits for the step.
  [inbox-apply-under-lock]="kvsched --lib runtime::inbox"
  # runtime/merge.rs: the in-place merge of two shards' lists takes the larger key first.
  # (Memory-safe: any choice keeps every entry once.)
  [merge-larger-first]="kvsched --lib runtime::merge"
  # pool/mod.rs: a release leaving a block unreferenced does not count it allocatable, so
  # admission (which skips a prompt the count says cannot fit) starves while blocks are free.
  [allocatable-release-uncounted]="kvsched --lib pool::tests;kvsched --lib pool::concurrent_tests;kvsched --test runtime_api"
  # kv/prober.rs: a lookup's offer never wakes the prober thread, so one that finds it
  # asleep is not asked until something else wakes it.
  [probe-offer-never-wakes]="kvsched --test kv_shared_tier"
  # runtime/quarantine.rs: a new deadline is not counted, so the lock-free check (count 0)
  # lets a quarantined prefix load again.
  [quarantine-deadline-uncounted]="kvsched --lib runtime::quarantine"
  # kv/held_prefix.rs: the chunk keys prepared at submit are group 0's for every group, so a
  # hybrid prompt's prepared lookup offers what a fresh one would not.
  [prompt-keys-one-group]="kvsched --test kv_lookup"
  # runtime/handle.rs: submit runs the connector's prepare under the read lock of `open`, so
  # shutdown waits for a slow one.
  [prepare-under-open-lock]="kvsched --test runtime_api"
  # runtime/policy/trust.rs: a sync destination named at a newer generation than the plan's
  # is taken for stale, so the failed load's bytes are kept.
  [sync-newer-generation-ignored]="kvsched --test runtime_discard"
  # runtime/signal.rs: wait_for_work ignores the loads' deadlines, so an idle engine sleeps
  # past a hung load's.
  [wait-past-deadline]="kvsched --test runtime_liveness"
  # runtime/handle.rs: a submit or cancel does not wake an engine idle in wait_for_work.
  [submit-wakes-nobody]="kvsched --test runtime_liveness"
  # kv/tier_call.rs: a tier's panic unwinds the connector's thread (a get thread, the save or
  # probe thread: gone for good, its busy count left up), or the loading thread.
  [tier-panic-escapes]="kvsched --test kv_tier_panics"
  # kv/tier_load.rs: a tier's "held" is taken for a chunk landed, though it never handed the
  # value over, so the block is reported loaded holding what it held before.
  [held-without-value]="kvsched --test kv_tier_panics"
  # kv/disk/scan.rs: a rescan deletes temporary files too, so a put in flight loses its file
  # before it is linked into place.
  [rescan-deletes-temps]="kvsched --test kv_disk_hostile"
  # runtime/shard/load_choice.rs: a cost probe loads what the estimate asks for, which for a
  # tier measured failing every load rounds down to nothing: the tier is never loaded again.
  [probe-rounds-to-nothing]="kvsched --test runtime_load_probe"
  # kv/disk/scan.rs: opening a tier deletes the temporary file of a put in flight in a live
  # process (another tier on the directory), whose link into place then fails.
  [open-deletes-live-temps]="kvsched --test kv_disk"
  # runtime/shard/end.rs: shutdown fires no load's cancel token; it waits out every running load.
  [shutdown-leaves-loads-running]="kvsched --test runtime_shutdown"
  # runtime/shard/land.rs: a request whose load timed out past a local prefix keeps the null
  # block at the parked positions, and reads it. (runtime_faults' loads past their deadline:
  # the invariant that a running request holds a real block where it needs one, checked
  # after every step.)
  [parked-positions-unfilled]="kvsched --test runtime_land;kvsched --test runtime_faults deadlines_alone"
  # runtime/shard/land.rs: parking a timed-out load's blocks forgets the claim of another
  # block the request owns, and keeps the parked block's: the parked block is handed off.
  [parked-claim-mismatched]="kvsched --test runtime_land a_timed_out_loads_parked_blocks_are_not_handed_off"
  # runtime/shard/land.rs: a request starting over after its load timed out takes fresh blocks
  # for the parked positions before it frees them all, evicting a cached prefix on a full pool.
  [restart-fills-holes]="kvsched --test runtime_land a_timed_out_load_from_token_zero_reclaims_no_cached_block"
  # bindings/python (pytest on the extension built with the plant): the vLLM secondary tier's
  # fork, drop and bounded-memory guarantees.
  # tier_jobs.rs: a forked child takes itself for the parent, queues jobs for workers it does
  # not have and joins threads it never had.
  # bindings/python/python/kvsched/recovery.py: a Mamba `align` state a sharer waits for counts as
  # rewritten once its owner is past it, though only a step ending there writes it.
  # bindings/python/python/kvsched/vllm.py: an older vLLM's async loader, at 0 tokens until
  # its load lands, is scanned over nothing, so its failed load goes unnoticed.
  [legacy-loader-at-zero]="pytest test_vllm.py::test_the_one_argument_signature_finds_a_loader_vllm_has_not_counted_yet"
  [align-wait-inexact]="pytest test_vllm.py::test_an_owner_past_an_align_state_it_never_ended_a_step_at_hands_it_over"
  # bindings/python recovery.py: a wait ends at the owner's first entry of the id in any
  # group, though with one pool per group that entry is another block.
  [wait-any-group]="pytest test_hostile.py::test_with_one_pool_per_group_a_wait_ends_where_the_owner_rewrites_the_sharers_group"
  [tier-fork-unchecked]="pytest test_tier_lifecycle.py::test_a_forked_child_fails_every_job_at_once_and_exits_cleanly"
  # bindings/python tier_jobs.rs: a shutdown drops queued jobs unreported.
  [tier-stop-drops-queued]="pytest test_tier_lifecycle.py::test_shutdown_reports_every_job_once_queued_ones_failed"
  # bindings/python tier_jobs.rs: idle workers wait in parking_lot's process-wide table, which
  # a forked child inherits: a tier the child makes crashes or hangs at its first wait.
  [tier-pool-parks-globally]="pytest test_tier_lifecycle.py::test_a_tier_made_in_a_forked_child_runs_while_the_parents_tier_idles"
  # tier.rs: dropping the tier joins its store with the GIL held; other threads stop while the
  # store waits on a silent server.
  [tier-drop-holds-gil]="pytest test_tier_lifecycle.py::test_dropping_a_tier_with_a_stuck_store_lets_other_threads_run"
  # tier.rs: drain_jobs handles no signal until the jobs end, so Ctrl-C waits out a hung store.
  [wait-ignores-signals]="pytest test_tier_lifecycle.py::test_a_signal_interrupts_drain_jobs_while_a_store_hangs"
  # tier_bounded.rs: the index's key sets keep every key ever stored or asked.
  [tier-index-unbounded]="kvsched-python --lib tier_bounded;pytest test_tier_bounds.py::test_the_present_set_stays_bounded_as_the_store_evicts;pytest test_tier_bounds.py::test_the_absent_set_stays_bounded_over_keys_asked_once"
  # kv/redis/node.rs: a connection is used again whatever it shows (a stray reply waiting,
  # bytes after the last reply, a reply of the wrong kind), so a stray reply answers the
  # next command in its place: another key's value.
  [redis-stray-kept]="kvsched-testkit --features redis --test kv_redis_desync"
  # kv/redis/node.rs: pipelines go without their closing ECHO, so a stray read where a
  # value was due, nothing left over, is returned as that value.
  [redis-no-closing-echo]="kvsched-testkit --features redis --test kv_redis_desync"
  # kv/redis/node.rs: the callers' largest value (Tier::expect_values_up_to) is not used.
  # kv/tier_connector.rs: chunk keys carry the config's tag alone, not the layout, so a
  # dense engine's chunks load into a hybrid engine's blocks that fit them.
  [layout-not-in-key]="kvsched --test kv_shared_tier"
  # kv/bounded.rs: a get whose caller gave up is not cancelled, so it keeps a get thread
  # until the tier's own read ends.
  [gave-up-get-uncancelled]="kvsched --lib kv::bounded"
  # kv/disk/read.rs: a read of a value longer than the callers store is not refused.
  [disk-value-bound-ignored]="kvsched --test kv_disk_hostile"
  # kv/disk/read.rs, mod.rs: a pack number names whatever file sits at its path now, so a
  # tier reads another's pack at its own offsets and deletes it as its own.
  [disk-pack-identity-unchecked]="kvsched --test kv_disk_hostile"
  # kv/disk/write.rs: temporary files named `<n>.<pid>.tmp`, which a co-tenant foresees.
  [disk-temp-names-foreseeable]="kvsched --test kv_disk_hostile"
  # panics.rs: a caught panic's payload is dropped unguarded, so a payload whose drop panics
  # unwinds past the catch (a worker, a step, the tier's threads).
  [panic-payload-dropped-bare]="kvsched --test runtime_panicking_drops;kvsched --test kv_tier_panics;kvsched --lib panics"
  # panics.rs: a value `prepare` handed over is dropped unguarded in the step.
  [connector-value-dropped-bare]="kvsched --test runtime_panicking_drops;kvsched --lib panics"
  # runtime/handoff.rs: a shard thread that finished its part of a parallel step does not
  # wake the parked engine; the engine does not wake parked shard threads for a step.
  [handoff-engine-unpark-dropped]="kvsched --test runtime_parallel_wakeups"
  [handoff-shard-unpark-dropped]="kvsched --test runtime_parallel_wakeups"
  # runtime/shutdown.rs: completions drained while the workers stop go back into their
  # queues once; what does not fit is counted stale instead of applied.
  [shutdown-refill-once]="kvsched --test runtime_shutdown"
  [redis-value-bound-ignored]="kvsched-testkit --features redis --test kv_redis_desync"
  # kv/redis/node.rs: any error reply to the closing ECHO turns the in-step check off.
  [redis-echo-off-on-any-error]="kvsched-testkit --features redis --test kv_redis_desync"
  # kv/redis/rounds.rs: a call failing on a node never refreshes the slot map, so a failover
  # (a dead node sends no MOVED) is followed only when the dead node comes back.
  [cluster-no-refresh-on-node-failure]="kvsched-testkit --features redis --test kv_redis_cluster"
  # kv/redis/cluster.rs: a refresh asks the nodes in the map's order, each with the whole
  # time left, so a hung first seed keeps the map from the others.
  [cluster-refresh-asks-in-order]="kvsched-testkit --features redis --test kv_redis_cluster"
  # kv/redis/cluster.rs, node.rs: a refresh after a call's failure runs on the call's spent
  # time, and each node it asks with none left is marked down (healthy nodes too), so a
  # failover away from a hung node is never followed.
  [redis-refresh-on-spent-time]="kvsched-testkit --features redis --test kv_redis_cluster"
  # kv/redis/pool.rs: a caller giving up mid-connect (its token, its deadline) marks a
  # healthy node down, so the calls after it fail without being tried.
  [redis-gave-up-marks-down]="kvsched-testkit --features redis --test kv_redis_hostile"
  # kv/redis/resolve.rs: a node's host name is looked up on the caller's thread, which waits
  # for a hung resolver past its deadline.
  [redis-resolve-unbounded]="kvsched --features redis --lib kv::redis::resolve"
  # kv/redis/resolve.rs: a lookup's end wakes none of the calls waiting for it (they sleep
  # to their deadline); a call waiting for a lookup wakes every 20 ms to look again.
  [resolve-end-wakes-nobody]="kvsched --features redis --lib kv::redis::resolve"
  [resolve-wait-polls]="kvsched --features redis --lib kv::redis::resolve"
  # kv/redis/conn.rs: TLS reads and the handshake go through rustls's own loops, which wait
  # for a whole record however slowly its bytes come, past the call's deadline.
  [redis-tls-whole-records]="kvsched-testkit --features redis --test kv_redis_tls_trickle"
  # kv/redis/cluster.rs: a CLUSTER SLOTS reply whose ranges overlap is taken, its slots
  # written again and again under the refresh lock past the call's deadline.
  [cluster-slots-overlap-accepted]="kvsched-testkit --features redis --test kv_redis_hostile;kvsched --features redis --lib kv::redis::cluster"
  # sync/thread_group.rs: a thread ending does not wake the join of the saver's, the prober's
  # or the bounded gets' threads, which waits out its deadline.
  [thread-end-unwoken]="kvsched --lib joining_is_woken_when;kvsched --lib kv::bounded::tests::a_join_wakes_when_the_threads_end"
  # connector/cancel.rs: a token's firing wakes none of the threads watching it, so a caller
  # waiting for a tier get sleeps on to its deadline.
  [cancel-wakes-nobody]="kvsched --lib kv::bounded;kvsched --lib connector::cancel;kvsched --features redis --lib kv::redis::resolve"
  # runtime/completion_queue.rs: a pop wakes none of the workers parked on the full queue.
  [pop-wakes-no-pusher]="kvsched --lib runtime::worker_tests"
  # runtime/worker.rs: a worker's exit does not wake the shutdown waiting for it.
  [worker-exit-silent]="kvsched --lib runtime::worker_tests"
  # runtime/shard/admit.rs: a step that began with any room in the workers' queue dispatches
  # a load for every request it admits, past the queue's bound.
  [load-room-whole-step]="kvsched --test runtime_liveness"
  # kv/memory_tier.rs: a read's use is recorded after its callback, so a panicking one leaves
  # a stale order entry and the key's next value is evicted first.
  # kv/tier_connector.rs: the save queue is bounded in chunks only, so behind a stalled store
  # it holds `save_queue` copies of blocks whatever their size.
  [save-queue-bytes-ignored]="kvsched --test kv_connector_misuse"
  # kv/disk: a rescan indexes a pack this tier deleted during its walk (and deletes the live
  # one); a put behind other writers never skips past their numbers (gives up after 64); a
  # get whose key was saved again meanwhile answers "not held".
  [rescan-indexes-deleted-packs]="kvsched --lib kv::disk::tests::a_rescan_never_indexes_a_pack_this_tier_saved_over_during_its_walk"
  [disk-link-never-skips-ahead]="kvsched --lib kv::disk::tests::a_put_behind_another_writer_skips_past_its_numbers"
  [disk-get-misses-moved-key]="kvsched --lib kv::disk::tests::a_get_racing_a_reput_of_its_key_reads_the_new_pack;kvsched --test kv_disk_races"
  # bindings/python kvsched/vllm.py: an owner vLLM freed and gave new blocks is still waited
  # for (its sharer released to read the old block unrewritten); under async scheduling the
  # pre-step length counts the step scheduled ahead; a request has ended only by a list of
  # status names (FINISHED_REPETITION missing).
  [owner-freed-still-waited-for]="pytest test_vllm_sim.py::test_an_owner_whose_blocks_vllm_freed_hands_the_block_to_its_sharer"
  [async-pre-step-counts-next-step]="pytest test_vllm_sim.py::test_under_async_scheduling_the_pre_step_length_leaves_out_the_step_scheduled_ahead"
  [ended-by-status-list]="pytest test_vllm_sim.py::test_an_owner_finished_with_any_finished_status_hands_the_block_over"
  # rules/recovery/decide.rs: mode safe evicts nothing from the boundary on, so a prefix hit
  # reaches a Mamba all block a rolled-back request is rewriting mid-block.
  [safe-evicts-nothing]="kvsched-testkit --test model_exact"
  [lru-order-after-read]="kvsched --lib kv::memory_tier::tests::a_panicking_read_callback_leaves_the_lru_order_consistent"
  # kv/redis/cluster.rs: a refresh waits on another call's refresh for as long as it takes,
  # past its own call's deadline.
  [refresh-waits-on-lock]="kvsched-testkit --features redis --test kv_redis_desync"
  # kv/redis/node.rs: an error where the ECHO's reply is due counts toward taking the node to
  # refuse ECHO while the data commands err too (a server loading its data turns it off).
  [echo-refusal-counts-server-errors]="kvsched-testkit --features redis --test kv_redis_desync"
  # tier_ops.rs: a store job is handed to the store as one batch, its encoded size held at once.
  [tier-store-one-batch]="pytest test_tier_bounds.py::test_a_long_store_jobs_memory_is_bounded"
  # tier_ops.rs: a load job asks the store for all its values in one call, and holds them all.
  [tier-load-one-batch]="pytest test_tier_bounds.py::test_a_long_load_jobs_memory_is_bounded"
)
ORDER=(decide-early claim-store late-leak deadline-compact-in-flight late-ok-accepted load-queue-unbounded panic-ok trust-stale end-while-loading no-cross-shard-preempt lookup-uncaught shard-panic-escapes
  mamba-align-cache-unwritten saver-flush-early register-unwritten reoffer-unwritten park-unstarted baseline-no-second-chance holder-release-unrecorded unaligned-chunks prompt-end-state-uncached
  branch-state-uncached mamba-state-one-block-late mamba-state-into-null window-into-null model-null-read-uncounted cancelled-call-a-tier-error model-kv-read-unjudged model-state-read-unjudged tier-present-after-failed-load tier-failed-load-probed-again scan-one-group-less load-unverified save-payload-offset epoch-not-bumped-on-whole-block-write failed-copy-left-unpoisoned load-pieces-drop-tail vector-store-skips-round
  probe-hits-unindexed vllm-admits-before-schedule cost-ignores-failures pack-offset-past-table failure-share-read-per-token
  handoff-count-after-release inbox-apply-under-lock merge-larger-first probe-offer-never-wakes allocatable-release-uncounted
  old-hits-back-to-p old-hits-evict-nothing vllm-evicts-on-recompute waits-one-owner-per-id wait-ignores-pending-work freed-blocks-unannounced stall-preempts-for-nothing recovered-stall-unannounced
  load-blocks-from-zero drop-deadline-per-thread lockstep-flush-unbounded
  quarantine-deadline-uncounted prompt-keys-one-group prepare-under-open-lock sync-newer-generation-ignored
  wait-past-deadline submit-wakes-nobody tier-panic-escapes held-without-value
  rescan-deletes-temps probe-rounds-to-nothing open-deletes-live-temps
  shutdown-leaves-loads-running parked-positions-unfilled parked-claim-mismatched restart-fills-holes
  tier-fork-unchecked tier-drop-holds-gil wait-ignores-signals tier-index-unbounded tier-store-one-batch tier-load-one-batch
  redis-stray-kept redis-no-closing-echo redis-value-bound-ignored layout-not-in-key gave-up-get-uncancelled
  disk-value-bound-ignored disk-pack-identity-unchecked disk-temp-names-foreseeable
  panic-payload-dropped-bare connector-value-dropped-bare shutdown-refill-once
  redis-echo-off-on-any-error cluster-no-refresh-on-node-failure cluster-refresh-asks-in-order
  handoff-engine-unpark-dropped handoff-shard-unpark-dropped redis-refresh-on-spent-time
  failed-unstarted-load-uncounted queued-drop-uncounted result-keeps-counts
  sampled-as-planned-by-count sampling-kept window-one-needs-entry
  missing-sample-kept held-admission-unannounced kept-sample-discarded restart-drops-kept-sample
  restart-keeps-lost-output tier-pool-parks-globally wait-any-group tier-stop-drops-queued
  seen-never-pruned tier-properties-unguarded disowned-chunk-counted saver-rest-on-ready
  gets-grow-on-busy-alone align-head-load
  tier-memory-index-only connector-geometry-unchecked legacy-loader-at-zero
  redis-oversized-drops-node accounting-read-unheld
  refresh-waits-on-lock echo-refusal-counts-server-errors save-pause-outlasts-outage
  align-pass-clears-mark report-evicted-late align-wait-inexact unconfirmed-kept-cached
  waits-overwritten preempt-planned saver-flush-unwoken probe-flush-unwoken
  saver-flush-waits-rest drop-queued-unwoken redis-gave-up-marks-down lru-order-after-read
  save-queue-bytes-ignored rescan-indexes-deleted-packs disk-link-never-skips-ahead disk-get-misses-moved-key
  owner-freed-still-waited-for async-pre-step-counts-next-step ended-by-status-list
  safe-evicts-nothing redis-resolve-unbounded resolve-end-wakes-nobody resolve-wait-polls redis-tls-whole-records cluster-slots-overlap-accepted
  thread-end-unwoken cancel-wakes-nobody pop-wakes-no-pusher worker-exit-silent
  load-room-whole-step)

if [ "$#" -gt 0 ]; then plants=("$@"); else plants=("${ORDER[@]}"); fi

rows=()
bad=0
venv="$PWD/target-plants/venv"
python_built=""
# Builds the Python extension with the current plant into the plants' venv (created with
# maturin, pytest and hypothesis the first time).
python_plant_build() {
  if [ ! -x "$venv/bin/maturin" ]; then
    python3 -m venv "$venv" && "$venv/bin/python" -m pip install --quiet maturin pytest hypothesis || return 1
  fi
  # A wheel installed into the venv, as CI installs the package: nothing is written into
  # the source tree. Through the venv's own python (`-m pip`): the `pip` script of a
  # target-plants/ copied from another checkout names the original venv's python, and would
  # install there while the tests import the copy's stale wheel.
  rm -rf target-plants/wheels
  # The wheel is a release build: its crates are cleaned in that profile too.
  cargo clean --quiet --release --target-dir target-plants -p kvsched -p kvsched-replay \
    -p kvsched-python || return 1
  (cd bindings/python && CARGO_TARGET_DIR="$PWD/../../target-plants" \
    "$venv/bin/maturin" build --interpreter "$venv/bin/python" --out ../../target-plants/wheels) &&
    "$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps target-plants/wheels/*.whl
}
# Builds target `args` (the test targets' syntax above) with the current plant.
build_target() {
  if [ "${args[0]}" = pytest ]; then
    [ "$python_built" = "$plant" ] || { python_plant_build && python_built="$plant"; }
  else
    cargo test --target-dir "$dir" --quiet -p "${args[@]}" --no-run
  fi
}
# Runs target `args`: its status is the tests' (non-zero: the plant was caught).
run_target() {
  if [ "${args[0]}" = pytest ]; then
    (cd bindings/python && "$venv/bin/python" -m pytest -q -p no:cacheprovider "tests/${args[1]}")
  else
    cargo test --target-dir "$dir" --quiet -p "${args[@]}"
  fi
}
for plant in "${plants[@]}"; do
  if [ -z "${TESTS[$plant]:-}" ]; then
    echo "unknown plant '$plant' (known: ${ORDER[*]})" >&2
    exit 2
  fi
  dir="target-plants"
  logs="$dir/logs/$plant"
  mkdir -p "$logs"
  export KVSCHED_PLANT="$plant"
  export RUSTC_WRAPPER="$PWD/scripts/plant-rustc"
  cargo clean --quiet --target-dir "$dir" -p kvsched -p kvsched-testkit -p kvsched-replay \
    -p kvsched-cli -p kvsched-python
  echo "== plant $plant ($dir)"
  IFS=';' read -ra targets <<<"${TESTS[$plant]}"
  for t in "${targets[@]}"; do
    read -ra args <<<"$t"
    log="$logs/$(printf '%s' "$t" | tr -c 'A-Za-z0-9_' '_').log"
    if ! build_target >"$log.build" 2>&1; then
      tail -n 30 "$log.build" >&2
      rows+=("$plant|$t|BUILD FAILED")
      bad=1
      continue
    fi
    if run_target >"$log" 2>&1; then
      rows+=("$plant|$t|NOT CAUGHT")
      bad=1
    else
      first=$(grep -m1 -E "panicked at|assertion|^E +|Error" "$log" | cut -c1-100 || true)
      rows+=("$plant|$t|caught: ${first:-tests failed}")
    fi
  done
done
unset KVSCHED_PLANT RUSTC_WRAPPER

printf '\n%-18s %-36s %s\n' plant test result
for r in "${rows[@]}"; do
  IFS='|' read -r p t res <<<"$r"
  printf '%-18s %-36s %s\n' "$p" "$t" "$res"
done
if [ "$bad" -ne 0 ]; then
  echo "plants: some plant was not caught (logs in target-plants/logs/NAME/)" >&2
  exit 1
fi
echo "plants: all ${#plants[@]} caught"
