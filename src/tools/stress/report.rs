//! The report of a stress run: counts, percentiles, faults injected, the scheduler's fault
//! events and the invariant verdict, per scheduler, with the ratios against the baseline.

use serde::Serialize;

use super::config::StressConfig;
use crate::runtime::Metrics;

/// Request counts.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct RequestCounts {
    /// Accepted by `submit`.
    pub submitted: u64,
    /// Ended finished.
    pub finished: u64,
    /// Ended failed (policy `fail`).
    pub failed: u64,
    /// Ended cancelled (by the client, or by shutdown at the end of `--duration`).
    pub cancelled: u64,
}

/// Load counts.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
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
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
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

/// Faults injected by `--faults` (exact counts).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
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
}

/// What the scheduler did about faults (its counters at the end of the run).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
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
    /// Times a prefix entered quarantine.
    pub prefixes_quarantined: u64,
    /// Owned blocks handed off because their owner ended first.
    pub handoffs: u64,
    /// Reported blocks that were not the reporting load's own (or no sync load's
    /// destination in the step): ignored.
    pub foreign_blocks: u64,
    /// Samples for requests the step did not schedule to sample: ignored.
    pub unexpected_samples: u64,
    /// Connector lookups that panicked (also in `connector_panics`).
    pub lookup_panics: u64,
    /// Plans whose output never came back (their work re-offered).
    pub lost_outputs: u64,
    /// Requests preempted in another shard to end a stall.
    pub cross_shard_preemptions: u64,
    /// Steps that found no progress possible and nothing to preempt (an invariant
    /// violation in a stress run).
    pub no_progress_steps: u64,
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
            prefixes_quarantined: m.prefixes_quarantined,
            handoffs: m.handoffs,
            foreign_blocks: m.foreign_blocks,
            unexpected_samples: m.unexpected_samples,
            lookup_panics: m.lookup_panics,
            lost_outputs: m.lost_outputs,
            cross_shard_preemptions: m.cross_shard_preemptions,
            no_progress_steps: m.no_progress_steps,
        }
    }
}

/// The invariant verdict.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Invariants {
    /// Whether every invariant held (`reconciled` included).
    pub ok: bool,
    /// Whether the request accounts reconcile: submitted (by the engine and as counted by
    /// the scheduler) = finished + failed + cancelled.
    pub reconciled: bool,
    /// What was violated, one line each.
    pub violations: Vec<String>,
}

/// One scheduler's run.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// `kvsched` or `mutex`.
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
    /// `schedule()` + `update()` wall time per step, µs.
    pub step_overhead_us: Percentiles,
    /// Scheduled arrival → first scheduled, µs.
    pub submit_to_schedule_us: Percentiles,
    /// Load completion → runnable, µs.
    pub completion_to_runnable_us: Percentiles,
    /// Steps run.
    pub steps: u64,
    /// Run time (seconds), shutdown excluded.
    pub elapsed_s: f64,
    /// Whether `--duration` ended the run before every request ended.
    pub timed_out: bool,
    /// Faults injected (all 0 without `--faults`).
    pub faults_injected: FaultCounts,
    /// What the scheduler did about faults.
    pub events: Events,
    /// Invariants.
    pub invariants: Invariants,
}

/// kvsched ÷ baseline for throughput, baseline ÷ kvsched for latency: > 1 means kvsched is
/// better. `None` (JSON `null`) when a divisor is 0.
#[derive(Clone, Debug, Serialize)]
pub struct Ratios {
    /// kvsched completions/s ÷ baseline completions/s.
    pub completions_per_s: Option<f64>,
    /// Baseline p99 step overhead ÷ kvsched p99 step overhead.
    pub step_overhead_p99: Option<f64>,
}

/// The result of `kvsched stress` (see [`render_json`](super::render_json) for the JSON layout).
#[derive(Clone, Debug, Serialize)]
pub struct StressReport {
    /// The kvsched run (its keys are at the top level of the JSON).
    #[serde(flatten)]
    pub run: RunReport,
    /// Every setting used.
    pub config: StressConfig,
    /// The baseline run, with `--baseline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<RunReport>,
    /// kvsched/baseline ratios, with `--baseline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratios: Option<Ratios>,
}

impl StressReport {
    /// Whether every invariant held in every run.
    pub fn invariants_ok(&self) -> bool {
        self.run.invariants.ok && self.baseline.as_ref().is_none_or(|b| b.invariants.ok)
    }

    /// Every violation, prefixed by the scheduler it was found in.
    pub fn violations(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .run
            .invariants
            .violations
            .iter()
            .map(|s| format!("kvsched: {s}"))
            .collect();
        if let Some(b) = &self.baseline {
            v.extend(
                b.invariants
                    .violations
                    .iter()
                    .map(|s| format!("mutex baseline: {s}")),
            );
        }
        v
    }
}
