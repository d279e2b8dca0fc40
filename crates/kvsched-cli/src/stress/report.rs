//! The report of a stress run: counts, percentiles, faults injected, the scheduler's fault
//! events and the invariant verdict, per scheduler, with the ratios against the baseline.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::StressConfig;
use super::cpu::CpuReport;
use super::figures::Figures;
use super::histograms::Curves;
pub use super::prompt_sources::PromptTokens;
use super::scheduler::Mechanisms;
use super::stats::median_value;
use super::step_cost::StepCost;
use kvsched::runtime::Metrics;

/// Request counts.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RequestCounts {
    /// Accepted by `submit`.
    pub submitted: u64,
    /// Ended finished.
    pub finished: u64,
    /// Ended failed (policy `fail`).
    pub failed: u64,
    /// Ended cancelled (by the client, or by shutdown at the end of `--duration`).
    pub cancelled: u64,
    /// Of `cancelled`, those still live at shutdown (a run `--duration` ended).
    #[serde(default)]
    pub cancelled_at_shutdown: u64,
}

/// Load counts.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LoadCounts {
    /// Asynchronous loads completed ok and applied.
    pub ok: u64,
    /// Asynchronous loads completed failed and applied.
    pub failed: u64,
    /// Completions ignored as stale (ended, superseded or unknown loads).
    pub stale: u64,
    /// Loads dispatched, asynchronous and synchronous.
    pub dispatched: u64,
    /// Reported blocks ignored as stale (freed and reused since).
    pub stale_blocks: u64,
    /// Synchronous loads run by the simulated engine.
    pub sync_run: u64,
}

/// Percentiles in microseconds (`p90` only for step overhead).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Maximum.
    pub max: f64,
    /// Number of samples.
    pub count: u64,
}

impl Percentiles {
    /// `v`, one of these percentiles, or `None` when there was no sample (the table shows
    /// `n/a`, not 0).
    pub(super) fn sampled(&self, v: f64) -> Option<f64> {
        (self.count > 0).then_some(v)
    }
}

/// Faults injected by `--faults` (exact counts).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FaultCounts {
    /// Asynchronous loads the connector hung past the load deadline.
    pub deadline: u64,
    /// Asynchronous loads that panicked in the connector.
    pub panic: u64,
    /// Requests the engine cancelled right after their asynchronous load was dispatched.
    pub late: u64,
    /// Steps whose output the engine reported twice.
    pub duplicate: u64,
    /// Stale blocks the engine named among the failed blocks.
    pub stale: u64,
    /// Cancels issued by the `cancel` fault (some may name a request already ended).
    pub cancel: u64,
    /// Stored chunks the `corrupt` fault flipped a bit of, at rest.
    pub corrupt: u64,
    /// Stored chunks the `truncate` fault cut short, at rest.
    pub truncate: u64,
    /// Chunks the `evict` fault deleted between lookup and load.
    pub evict: u64,
    /// Loads the `slow` fault delayed.
    pub slow: u64,
}

/// The KV bytes of a run: what moved between the store and KV memory, what the engine
/// verified, and every integrity counter of the connector.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct KvCounts {
    /// Payload bytes loads wrote into KV memory (verified chunks only).
    pub kv_bytes_loaded: u64,
    /// Encoded bytes the write-behind stored in the tier.
    pub kv_bytes_saved: u64,
    /// Bytes the engine read and compared against their reference (0 with `--verify off`).
    pub kv_bytes_verified: u64,
    /// Bytes the engine wrote for the tokens it computed.
    pub kv_bytes_written: u64,
    /// Read units (a token of an attention group, a Mamba state) that differed from their
    /// reference or came through a null entry, in steps whose output was kept; `null` with
    /// `--verify off`. Must be 0 in mode `safe`.
    pub garbage_reads: Option<u64>,
    /// Garbage read units in steps whose output the scheduler said to discard.
    pub garbage_reads_discarded: Option<u64>,
    /// Of all garbage units, those read through a null entry.
    pub null_reads: Option<u64>,
    /// Read units the engine's steps made (checked now, or unchanged since checked).
    pub units_read: u64,
    /// Of `units_read`, those not compared again: they matched at an earlier read of the
    /// same request and no write has reached their block since (see the `KvChecker`).
    #[serde(default)]
    pub units_skipped: u64,
    /// Chunks verified and written into KV memory.
    pub chunks_loaded: u64,
    /// Of those, chunks this run's connector had not saved itself (an earlier run's).
    pub chunks_loaded_from_others: u64,
    /// Chunks the write-behind stored.
    pub chunks_saved: u64,
    /// Chunks stored before their request's submit to warm the sim store (`--hit-ratio`).
    pub chunks_warmed: u64,
    /// Wall time of that warming, on the engine thread between steps, ms.
    pub warm_ms: f64,
    /// Chunks whose bytes changed after they were written (checksum).
    pub checksum_failures: u64,
    /// Chunks the store no longer had at load time.
    pub missing_chunks: u64,
    /// Intact chunks of another key or group.
    pub key_mismatches: u64,
    /// Chunks with a missing or wrong MAC.
    pub mac_failures: u64,
    /// Chunks truncated or with a bad header.
    pub format_errors: u64,
    /// Tier calls that failed as a whole.
    pub tier_errors: u64,
    /// Save offers dropped: the write-behind queue was full, or they were still queued when
    /// the run ended (`saves_dropped_at_end` of them).
    pub saves_dropped: u64,
    /// Saves still queued 2 s after the run ended, dropped then (counted in `saves_dropped`
    /// too): the store took the saves more slowly than the run offered them.
    pub saves_dropped_at_end: u64,
    /// Tier `put` calls that failed (batches).
    pub save_errors: u64,
    /// Chunks of those puts the store does not hold: saves that failed, one per chunk.
    pub saves_failed: u64,
    /// Chunks not tried while saving was paused after puts kept failing.
    pub saves_skipped: u64,
    /// Pauses of saving started.
    pub save_pauses: u64,
    /// The last failed put's error; `null` if none failed.
    pub save_error: Option<String>,
    /// Disk: the capacity in force once the file system was found full (the bytes held
    /// then; the oldest chunks are evicted to make room); `null` if it never was, or for
    /// other stores.
    pub store_full_at: Option<u64>,
    /// Loads that found their cancellation fired (a deadline passed, the request ended).
    pub loads_cancelled: u64,
    /// Destinations a load was no longer allowed to write: left alone.
    pub writes_refused: u64,
    /// Chunks the sim store damaged in transfer (`--failure-rate`).
    pub transfer_damage: u64,
    /// Redis: connections to the store lost and made again (successful connections beyond
    /// those open at the end); `null` for other stores.
    pub reconnects: Option<u64>,
    /// Redis: connection attempts that failed (a server down or restarting); `null` for
    /// other stores.
    pub connect_failures: Option<u64>,
    /// Redis: the tier's round trips, redirects, slot map reloads, timeouts and refused
    /// replies; `null` for other stores.
    #[serde(default)]
    pub redis: Option<super::redis_traffic::RedisTraffic>,
    /// How fast loads moved bytes out of the store (`kv_bytes_loaded` over the time in loads).
    #[serde(default)]
    pub load_bandwidth: super::load_bandwidth::LoadBandwidth,
}

/// What the scheduler did about faults (its counters at the end of the run).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Events {
    /// Asynchronous loads that passed their deadline (failed for all their blocks).
    pub deadlines_expired: u64,
    /// Completions of loads that had passed their deadline (also in `stale_completions`).
    pub late_completions: u64,
    /// Connector panics caught by workers.
    pub connector_panics: u64,
    /// Completions ignored as stale (ended, superseded, unknown or late loads).
    pub stale_completions: u64,
    /// Reported blocks ignored as stale (wrong generation or out of range).
    pub stale_blocks: u64,
    /// Commands (sampled, finish, cancel) naming no live request, ignored.
    pub unknown_commands: u64,
    /// Sampled / finish commands repeated within a step, applied once.
    pub duplicate_commands: u64,
    /// Queued loads past their deadline that a worker handed back without running.
    pub loads_expired_unrun: u64,
    /// Admissions offered no external load because the request's retry budget was spent.
    pub retry_budget_skips: u64,
    /// Admissions offered no external load because the prefix was quarantined.
    pub quarantine_skips: u64,
    /// Admissions whose asynchronous load was not dispatched: the workers' queue was full.
    pub load_queue_skips: u64,
    /// Times a prefix entered quarantine.
    pub prefixes_quarantined: u64,
    /// Owned blocks handed off because their owner ended first.
    pub handoffs: u64,
    /// Reported blocks that were not the reporting load's own (or no sync load's
    /// destination in the step): ignored.
    pub foreign_blocks: u64,
    /// Samples for requests the step did not schedule to sample: ignored.
    pub unexpected_samples: u64,
    /// Samples the step asked for and the output left out: that request's step taken as lost.
    pub missing_samples: u64,
    /// Connector lookups that panicked (also in `connector_panics`).
    pub lookup_panics: u64,
    /// Plans whose output never came back (their work re-offered).
    pub lost_outputs: u64,
    /// Requests of a lost plan restarted from the prefix cache instead (a sync load or a
    /// Mamba state the lost step may have left unwritten or advanced).
    #[serde(default)]
    pub lost_output_restarts: u64,
    /// Queued loads dropped before any worker started them (deadline passed or request
    /// ended): their blocks freed at once.
    #[serde(default)]
    pub loads_dropped_unstarted: u64,
    /// Requests preempted in another shard to end a stall.
    pub cross_shard_preemptions: u64,
    /// Steps that found no progress possible and nothing to preempt (an invariant
    /// violation in a stress run).
    pub no_progress_steps: u64,
    /// The same stalls while blocks were parked for late loads: the pool waited for them.
    #[serde(default)]
    pub late_load_stalls: u64,
    /// Prompt tokens prefill chunks gave back to the budget to end on a block end (a Mamba
    /// `align` group: `runtime::policy::alignment`).
    #[serde(default)]
    pub aligned_chunk_tokens: u64,
    /// Steps run in parallel on the shard threads (the others ran inline on the engine
    /// thread).
    #[serde(default)]
    pub parallel_steps: u64,
}

impl Events {
    pub(super) fn of(m: &Metrics) -> Self {
        Events {
            deadlines_expired: m.deadlines_expired,
            late_completions: m.late_completions,
            connector_panics: m.connector_panics,
            stale_completions: m.stale_completions,
            stale_blocks: m.stale_blocks,
            unknown_commands: m.unknown_commands,
            duplicate_commands: m.duplicate_commands,
            loads_expired_unrun: m.loads_expired_unrun,
            retry_budget_skips: m.retry_budget_skips,
            quarantine_skips: m.quarantine_skips,
            load_queue_skips: m.load_queue_skips,
            prefixes_quarantined: m.prefixes_quarantined,
            handoffs: m.handoffs,
            foreign_blocks: m.foreign_blocks,
            unexpected_samples: m.unexpected_samples,
            missing_samples: m.missing_samples,
            lookup_panics: m.lookup_panics,
            lost_outputs: m.lost_outputs,
            lost_output_restarts: m.lost_output_restarts,
            loads_dropped_unstarted: m.loads_dropped_unstarted,
            cross_shard_preemptions: m.cross_shard_preemptions,
            no_progress_steps: m.no_progress_steps,
            late_load_stalls: m.late_load_stalls,
            aligned_chunk_tokens: m.aligned_chunk_tokens,
            parallel_steps: m.parallel_steps,
        }
    }
}

/// What the simulated engine itself did that the scheduler's counters do not show.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct EngineEvents {
    /// Client cancels sent (`--cancel-ratio`).
    pub client_cancels: u64,
    /// Client cancels not sent because the request had already ended (a client does not
    /// cancel a request it has its answer for).
    pub client_cancels_skipped: u64,
    /// `cancel` faults sent for a request that had already ended: each is an unknown command
    /// to the scheduler.
    pub fault_cancels_after_end: u64,
    /// Requests cancelled by the `late` fault that ended cancelled (once their load landed).
    pub late_cancels_ended: u64,
    /// Cancels sent for a request whose sampled token from the last step was still to be
    /// applied: the cancel reaches the scheduler first, so the sample is an unknown command.
    pub samples_after_cancel: u64,
    /// Requests whose arrival waited because the live requests' prompts held
    /// `MAX_LIVE_PROMPT_TOKENS` (67,108,864) tokens, the driver's memory bound.
    #[serde(default)]
    pub arrivals_held_back: u64,
    /// Stale blocks the `stale` fault named at an older generation of a destination of the
    /// step's own sync loads: the runtime counts each in `events.stale_blocks`. The fault's
    /// other blocks (steps with no sync load, ids past the pool) name no destination of the
    /// step's sync loads: the runtime counts each in `events.foreign_blocks`.
    #[serde(default)]
    pub stale_named_in_sync_step: u64,
}

/// The invariant verdict.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Invariants {
    /// Whether every invariant held (`reconciled` included).
    pub ok: bool,
    /// Whether the request accounts reconcile: submitted (by the engine and as counted by
    /// the scheduler) = finished + failed + cancelled.
    pub reconciled: bool,
    /// What was violated, one line each.
    pub violations: Vec<String>,
}

/// One scheduler's run (or, in the report's top level and `baseline`, the median of its
/// runs: see [`RunReport::median`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunReport {
    /// `kvsched` or `mutex`.
    #[serde(skip_deserializing)]
    pub scheduler: &'static str,
    /// Request counts.
    pub requests: RequestCounts,
    /// Load counts.
    pub loads: LoadCounts,
    /// Tokens rolled back by recovery.
    pub tokens_recomputed: u64,
    /// Blocks claimed for recompute.
    pub claims: u64,
    /// Owned blocks handed off because their owner ended first.
    pub handoffs: u64,
    /// Requests preempted for lack of blocks.
    pub preemptions: u64,
    /// Load completions applied per second of run time.
    pub completions_per_s: f64,
    /// Requests finished per second of run time.
    pub finished_per_s: f64,
    /// Tokens generated by the requests that finished.
    pub output_tokens: u64,
    /// `output_tokens` per second of run time.
    pub output_tokens_per_s: f64,
    /// CPU over the run (`null` where `getrusage` is unavailable).
    pub cpu: Option<CpuReport>,
    /// `schedule()` + `update()` wall time per step, µs.
    pub step_overhead_us: Percentiles,
    /// `schedule()` + `update()` CPU time of the engine thread per step, µs: the scheduler's
    /// own work there, without the waits for a core or a shard thread.
    pub step_cpu_us: Percentiles,
    /// Where the run's time went: the scheduler's calls, the simulated engine, other threads.
    pub cost: StepCost,
    /// Scheduled arrival → first scheduled, µs.
    pub submit_to_schedule_us: Percentiles,
    /// Load completion → runnable, µs.
    pub completion_to_runnable_us: Percentiles,
    /// Steps run.
    pub steps: u64,
    /// Requests the plans scheduled, summed over the steps (a request counts once per step
    /// that schedules it).
    #[serde(default)]
    pub scheduled: u64,
    /// `scheduled` over `steps`: how many requests a step scheduled on average. In a closed
    /// loop each step schedules what is runnable, so a scheduler whose loop goes round more
    /// slowly takes fewer, larger steps: compare step percentiles with this beside them.
    #[serde(default)]
    pub scheduled_per_step: f64,
    /// Run time (seconds), shutdown excluded.
    pub elapsed_s: f64,
    /// Whether `--duration` ended the run before every request ended.
    pub timed_out: bool,
    /// Faults injected (all 0 without `--faults`).
    pub faults_injected: FaultCounts,
    /// What the scheduler did about faults.
    pub events: Events,
    /// What the engine did that the scheduler's counters do not show.
    pub engine: EngineEvents,
    /// Where the finished requests' prompt tokens came from.
    #[serde(default)]
    pub prompt_tokens: PromptTokens,
    /// The KV bytes moved and verified, and the integrity counters.
    pub kv: KvCounts,
    /// `--engine model`: tokens checked against the requests decoded alone, mismatches,
    /// time to first token and the model's time (absent for the simulated engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<super::model::ModelReport>,
    /// What the load policy left to recompute, and the estimate it decided by.
    #[serde(default)]
    pub load_policy: super::load_policy::LoadPolicyReport,
    /// Invariants.
    pub invariants: Invariants,
    /// The latency distributions, for `--plot`.
    #[serde(skip)]
    pub(super) curves: Curves,
    /// The scheduler's fault-handling mechanisms.
    #[serde(skip)]
    pub(super) has: Mechanisms,
}

impl RunReport {
    /// The median of `runs` (each number the median over the runs, an even count taking the
    /// mean of the middle two, rounded for integers; `timed_out` if any run timed out;
    /// `invariants.ok` and `reconciled` only if every run's are; the violations of every run,
    /// prefixed by its number when there are several; the model judge's counts summed, so
    /// no run's wrong token is lost). The first run when there is one.
    pub(super) fn median(runs: &[RunReport]) -> Option<RunReport> {
        let first = runs.first()?;
        if runs.len() == 1 {
            return Some(first.clone());
        }
        let values: Vec<Value> = runs
            .iter()
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect();
        let refs: Vec<&Value> = values.iter().collect();
        let mut median: RunReport = serde_json::from_value(median_value("", &refs)).ok()?;
        median.scheduler = first.scheduler;
        median.has = first.has;
        super::model::sum_judged(
            &mut median.model,
            runs.iter().filter_map(|r| r.model.as_ref()),
        );
        Some(median)
    }
}

/// kvsched ÷ baseline for throughput, baseline ÷ kvsched for latency: > 1 means kvsched is
/// better. `None` (JSON `null`) when a divisor is 0. With `--repeat`, the median over the run
/// pairs; every figure's ratio, with its range, is in [`StressReport::figures`].
#[derive(Clone, Debug, Serialize)]
pub struct Ratios {
    /// kvsched load completions/s ÷ baseline load completions/s.
    pub completions_per_s: Option<f64>,
    /// Baseline p99 step overhead ÷ kvsched p99 step overhead.
    pub step_overhead_p99: Option<f64>,
}

/// The result of `kvsched stress` (see [`render_json`](super::render_json) for the JSON layout).
#[derive(Clone, Debug, Serialize)]
pub struct StressReport {
    /// kvsched: its run, or the median of its runs with `--repeat` (its keys are at the top
    /// level of the JSON).
    #[serde(flatten)]
    pub run: RunReport,
    /// Every setting used.
    pub config: StressConfig,
    /// The baseline's run (or the median of its runs), with `--baseline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<RunReport>,
    /// kvsched/baseline ratios, with `--baseline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratios: Option<Ratios>,
    /// Every figure of the human table: per scheduler the median, min, max and each run's
    /// value, and the ratio likewise.
    pub figures: Figures,
    /// kvsched's runs, in order.
    #[serde(skip)]
    pub runs: Vec<RunReport>,
    /// The baseline's runs, in order (run i ran right after kvsched's run i).
    #[serde(skip)]
    pub baseline_runs: Vec<RunReport>,
}

impl StressReport {
    /// The report of kvsched's `runs` and the baseline's (none without a baseline), with
    /// the settings `config`; `None` without runs.
    pub(super) fn of(
        runs: Vec<RunReport>,
        baseline_runs: Vec<RunReport>,
        config: StressConfig,
    ) -> Option<StressReport> {
        let run = RunReport::median(&runs)?;
        let baseline = RunReport::median(&baseline_runs);
        let figures = Figures::of(&runs, &baseline_runs);
        let ratio = |key| {
            figures
                .get(key)
                .and_then(|f| f.ratio.as_ref())
                .map(|r| r.median)
        };
        let ratios = baseline.as_ref().map(|_| Ratios {
            completions_per_s: ratio("completions_per_s"),
            step_overhead_p99: ratio("step_overhead_us.p99"),
        });
        Some(StressReport {
            run,
            config,
            baseline,
            ratios,
            figures,
            runs,
            baseline_runs,
        })
    }

    /// Whether every invariant held in every run.
    pub fn invariants_ok(&self) -> bool {
        self.runs
            .iter()
            .chain(&self.baseline_runs)
            .all(|r| r.invariants.ok)
    }

    /// Every violation, prefixed by the scheduler (and, with several runs, the run) it was
    /// found in.
    pub fn violations(&self) -> Vec<String> {
        let several = self.runs.len() > 1;
        let mut v = Vec::new();
        for (who, runs) in [
            ("kvsched", &self.runs),
            ("mutex baseline", &self.baseline_runs),
        ] {
            for (i, r) in runs.iter().enumerate() {
                let run = if several {
                    format!(" run {}", i + 1)
                } else {
                    String::new()
                };
                v.extend(
                    r.invariants
                        .violations
                        .iter()
                        .map(|s| format!("{who}{run}: {s}")),
                );
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_median_of_runs_takes_each_number_and_keeps_every_verdict() {
        let runs = [
            json!({"n": 3, "x": 1.5, "timed_out": false, "invariants": {"ok": true, "violations": []}}),
            json!({"n": 1, "x": 0.5, "timed_out": true, "invariants": {"ok": false, "violations": ["bad"]}}),
            json!({"n": 2, "x": 9.0, "timed_out": false, "invariants": {"ok": true, "violations": []}}),
            json!({"n": 8, "x": null, "timed_out": false, "invariants": {"ok": true, "violations": []}}),
        ];
        let refs: Vec<&Value> = runs.iter().collect();
        let m = median_value("", &refs);
        assert_eq!(m["n"], json!(3)); // (2 + 3) / 2, rounded
        assert_eq!(m["x"], json!(1.5)); // the runs that have one
        assert_eq!(m["timed_out"], json!(true));
        assert_eq!(m["invariants"]["ok"], json!(false));
        assert_eq!(m["invariants"]["violations"], json!(["run 2: bad"]));
        assert_eq!(median_value("", &refs[..3])["n"], json!(2));
    }
}
