//! The engine's own invariant checks: on every plan, and the reconciliation of the accounts at
//! shutdown.

use rustc_hash::FxHashSet;

use super::report::FaultCounts;
use kvsched::rules::recovery::{Mode, RequestClass};
use kvsched::runtime::{Report, StepPlan};

/// Checks one plan: nobody scheduled in the step that told it to wait; every claimed block is
/// in the report and claimed once per marked set.
pub(super) fn check_plan(mode: Mode, plan: &StepPlan, violations: &mut Vec<String>) {
    let rec = &plan.recovery;
    if rec.recovered.is_empty() {
        return;
    }
    let waiting: FxHashSet<&str> = rec
        .recovered
        .iter()
        .filter(|r| !r.decision.waits_for.is_empty())
        .map(|r| &*r.id)
        .collect();
    if !waiting.is_empty() {
        for s in &plan.scheduled {
            if waiting.contains(&*s.id) {
                violations.push(format!(
                    "step {}: request {} scheduled while waiting for an owner",
                    plan.step, s.id
                ));
            }
        }
    }
    let mut claimed = FxHashSet::default();
    for r in &rec.recovered {
        let set = mode == Mode::Vllm && r.class == RequestClass::Sync;
        for &b in &r.decision.claimed_blocks {
            if rec.report.binary_search(&b).is_err() {
                violations.push(format!(
                    "step {}: block {b} claimed by {} but not in the report",
                    plan.step, r.id
                ));
            }
            if !claimed.insert((set, b)) {
                violations.push(format!(
                    "step {}: block {b} claimed by more than one request",
                    plan.step
                ));
            }
        }
    }
}

/// The most violations a run reports.
pub(super) const MAX_VIOLATIONS: usize = 50;

/// What the engine counted over a run, to reconcile with the scheduler's accounts.
pub(super) struct EngineCounts {
    /// Submissions the scheduler accepted.
    pub(super) submitted: u64,
    /// Submissions the scheduler refused.
    pub(super) rejected: u64,
    /// Synchronous loads the engine ran.
    pub(super) sync_run: u64,
}

/// Reconciles the scheduler's shutdown `report` with what the engine counted and `injected`,
/// pushing what does not add up onto `violations` (the shutdown's own violations first).
/// Returns whether the request accounts reconcile: submitted (by the engine and as counted by
/// the scheduler) = finished + failed + cancelled.
pub(super) fn reconcile(
    name: &str,
    report: &Report,
    engine: &EngineCounts,
    injected: &FaultCounts,
    violations: &mut Vec<String>,
) -> bool {
    violations.extend(report.violations.iter().map(|v| format!("shutdown: {v}")));
    let reconciled = reconcile_requests(report, engine.submitted, violations);
    reconcile_loads(report, engine.sync_run, violations);
    let fm = &report.metrics;
    if name == "kvsched" && fm.connector_panics != injected.panic {
        violations.push(format!(
            "panics: {} injected, {} caught by the workers",
            injected.panic, fm.connector_panics
        ));
    }
    if !report.census.conserved() || report.census.referenced != 0 {
        violations.push(format!("pool after shutdown: {:?}", report.census));
    }
    if engine.rejected > 0 {
        violations.push(format!("{} submissions refused", engine.rejected));
    }
    if fm.no_progress_steps > 0 {
        violations.push(format!(
            "no progress: {} steps with live requests, nothing to run and nothing to preempt",
            fm.no_progress_steps
        ));
    }
    reconciled
}

/// Submitted (by the engine and as counted by the scheduler) = finished + failed + cancelled.
fn reconcile_requests(report: &Report, submitted: u64, violations: &mut Vec<String>) -> bool {
    let fm = &report.metrics;
    if fm.submitted != submitted {
        violations.push(format!(
            "accounting: the engine submitted {submitted}, the scheduler counted {}",
            fm.submitted
        ));
    }
    let reconciled =
        fm.submitted == submitted && fm.finished + fm.failed + fm.cancelled == fm.submitted;
    if fm.finished + fm.failed + fm.cancelled != fm.submitted {
        violations.push(format!(
            "accounting: submitted {} != finished {} + failed {} + cancelled {}",
            fm.submitted, fm.finished, fm.failed, fm.cancelled
        ));
    }
    reconciled
}

/// Completions applied, stale or cancelled (a load past its deadline counted once) plus the
/// sync loads run never exceed the loads dispatched; late completions never exceed expired
/// deadlines.
fn reconcile_loads(report: &Report, sync_run: u64, violations: &mut Vec<String>) {
    let fm = &report.metrics;
    // A load past its deadline is counted failed when it expires, and again when its
    // completion lands (late, in stale) or, still queued at shutdown, in cancelled: count it
    // once.
    let late = fm.late_completions.min(fm.stale_completions);
    let expired_unlanded = fm
        .deadlines_expired
        .saturating_sub(late)
        .min(report.loads_cancelled);
    let applied = fm.loads_ok
        + fm.loads_failed
        + (fm.stale_completions - late)
        + (report.loads_cancelled - expired_unlanded);
    if applied + sync_run > fm.loads_dispatched {
        violations.push(format!(
            "completions: {applied} applied, stale or cancelled + {sync_run} sync loads run > {} dispatched",
            fm.loads_dispatched
        ));
    }
    if fm.late_completions > fm.deadlines_expired {
        violations.push(format!(
            "deadlines: {} late completions > {} deadlines expired",
            fm.late_completions, fm.deadlines_expired
        ));
    }
}
