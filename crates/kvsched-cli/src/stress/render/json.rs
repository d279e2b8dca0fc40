//! The report as JSON: the serialized [`StressReport`], and what its keys mean.

use crate::stress::report::StressReport;

/// The report as JSON (one object, pretty-printed, newline-terminated).
///
/// Stable keys: `requests.{submitted,finished,failed,cancelled}`, `loads.{ok,failed,stale}`,
/// `tokens_recomputed`, `claims`, `handoffs`, `completions_per_s`,
/// `step_overhead_us.{p50,p90,p99,p999,max}`, `submit_to_schedule_us.{p50,p99,p999,max}`,
/// `completion_to_runnable_us.{p50,p99,p999,max}`, `invariants.ok`, `invariants.reconciled`,
/// `invariants.violations`, `faults_injected.{deadline,panic,late,duplicate,stale,cancel}`,
/// `events.{deadlines_expired,late_completions,connector_panics,stale_completions,stale_blocks,
/// unknown_commands,duplicate_commands,loads_expired_unrun,retry_budget_skips,quarantine_skips,
/// load_queue_skips,prefixes_quarantined,handoffs}`,
/// `config` (every setting; `config.faults` is `null` without `--faults`, and
/// `config.load_deadline_ms` is the deadline used, `null` for none); with `--baseline mutex` also `baseline` (the same keys but
/// `config`, for the baseline run) and `ratios.{completions_per_s,step_overhead_p99}`
/// (kvsched ÷ baseline for throughput, baseline ÷ kvsched for latency: > 1 means kvsched is
/// better; `null` when a divisor is 0). Additional keys (`scheduler`, `preemptions`, `steps`,
/// `elapsed_s`, `timed_out`, `loads.{dispatched,stale_blocks,sync_run}`, `count` in each
/// latency object) are informative.
///
/// Added keys: `finished_per_s`, `output_tokens`, `output_tokens_per_s`,
/// `cpu.{user_s,sys_s,per_wall_s,us_per_finished,engine_thread_s}` (`cpu` is `null` where
/// `getrusage` is unavailable), `step_cpu_us.{p50,p90,p99,p999,max}` (the engine thread's CPU
/// in `schedule()` + `update()` per step),
/// `cost.{step_wall_s,step_cpu_s,step_cpu_us_per_finished,engine_cpu_s,other_threads_cpu_s}`,
/// `engine.{client_cancels,client_cancels_skipped,
/// samples_after_cancel,fault_cancels_after_end,late_cancels_ended,arrivals_held_back,
/// stale_named_in_sync_step}`, `config.repeat`,
/// `kv.*` (the KV bytes loaded, saved and verified, the garbage reads — `null` with
/// `--verify off` — and the connector's integrity counters, see
/// [`KvCounts`](crate::stress::report::KvCounts)),
/// `faults_injected.{corrupt,truncate,evict,slow}`, `config.{store,store_capacity,
/// redis_cluster,redis_maxmemory,kv_bytes_per_token,mamba_state_bytes,verify}`, and
/// `figures`: every row of the human table keyed by its value's path in a run, each with
/// `section`, `label`, `better` (`higher`, `lower` or `null`), `kvsched` and `baseline` as
/// `{median,min,max,runs}` and, for a ranked figure with a baseline, `ratio` likewise and
/// `ratio_crosses_1`. With `--repeat`, the top level and `baseline` are the medians of the
/// runs ([`RunReport::median`](crate::stress::report::RunReport::median)) and
/// `ratios` the medians of the per-pair ratios. `docs/stress.md` documents every key.
///
/// `faults_injected` counts what `--faults` injected, exactly (all 0 without it):
///
/// * `deadline`: asynchronous loads the connector hung for 4× the load deadline
///   (`deadline=R`: share R of loads, per request and attempt);
/// * `panic`: asynchronous loads that panicked in the connector (`panic=R`);
/// * `late`: requests the engine cancelled right after the step that dispatched their
///   asynchronous load (`late=R`: share R of requests offered one), so that load's completion
///   arrives for a cancelled request (the runtime applies it, then ends the request);
/// * `duplicate`: steps whose output the engine reported twice — every sampled and finished
///   id and every failed sync-load block (`duplicate=R`: share R of steps with output);
/// * `stale`: stale blocks the engine named among a step's failed blocks — a block of an
///   earlier sync load with a wrong generation, or an id past the pool (`stale=R`: share R of
///   steps);
/// * `cancel`: client cancels issued at a random later step (`cancel=R`: share R of
///   requests; a cancel may find its request already ended);
/// * `corrupt`, `truncate`: stored chunks damaged at rest — a bit flipped, the value cut
///   short (`corrupt=R`, `truncate=R`: share R of chunk keys; memory, disk and private Redis stores);
/// * `evict`: chunks deleted between lookup and load (`evict=R`: share R of chunk reads);
/// * `slow`: loads delayed 4× the load deadline (`slow=R`: share R of chunk reads).
///
/// `events` are the scheduler's counters at the end
/// ([`Metrics`](kvsched::runtime::Metrics)): how it absorbed them (`deadlines_expired`,
/// `late_completions` ⊆ `stale_completions`, `connector_panics`, `stale_blocks`,
/// `unknown_commands`, and the retry-budget / quarantine / hand-off counts).
/// `invariants.reconciled` is whether submitted = finished + failed + cancelled (and the
/// engine's submissions = the scheduler's); it is part of `invariants.ok`.
pub fn render_json(report: &StressReport) -> String {
    let mut s =
        serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}
