//! The notes under the recovery section, with a baseline: whether kvsched and the baseline
//! made the same decisions — every request, load and recovery count, and the number of steps —
//! and, where they did not, why. Both run the same algorithm (the shards' pure decisions are
//! shared with the baseline), so a difference has a cause in how they run, named here; one
//! without such a cause is reported as a divergence.

use super::cells::{count, counted};
use crate::stress::report::{RunReport, StressReport};
use crate::stress::values::Rate;

/// The decision totals compared, each with its label.
fn totals(r: &RunReport) -> [(&'static str, u64); 13] {
    [
        ("finished", r.requests.finished),
        ("failed", r.requests.failed),
        ("cancelled", r.requests.cancelled),
        ("loads dispatched", r.loads.dispatched),
        ("async loads ok", r.loads.ok),
        ("async loads failed", r.loads.failed),
        ("stale completions", r.loads.stale),
        ("sync loads run", r.loads.sync_run),
        ("tokens recomputed", r.tokens_recomputed),
        ("blocks claimed", r.claims),
        ("hand-offs", r.handoffs),
        ("preemptions", r.preemptions),
        ("steps", r.steps),
    ]
}

/// The totals on which kvsched (`k`) and the baseline (`b`) differ, as `label k vs b`.
pub(super) fn differences(k: &RunReport, b: &RunReport) -> Vec<String> {
    totals(k)
        .iter()
        .zip(totals(b))
        .filter(|((_, x), (_, y))| x != y)
        .map(|((label, x), (_, y))| format!("{label} {} vs {}", count(*x), count(y)))
        .collect()
}

/// Why kvsched's decisions may differ from the baseline's in this run: one line per cause
/// that applies, none when the run removed them all.
pub(super) fn causes(report: &StressReport) -> Vec<String> {
    let c = &report.config;
    let k = &report.run;
    let mut why = Vec::new();
    if c.shards > 1 {
        why.push(format!(
            "{} shards: each schedules within its share of the step's budgets ({} tokens, {} sequences) and preempts only its own requests, so a step runs other requests than the baseline's single budget does; a prefix registered by one shard is found by another only if it registers first (--shards 1 removes this)",
            c.shards,
            count(c.token_budget / c.shards as u64),
            count((c.max_seqs / c.shards) as u64),
        ));
    }
    if !c.lockstep && k.loads.ok + k.loads.failed + k.kv.chunks_saved > 0 {
        why.push(format!(
            "completion timing: loads run on worker threads ({}) and a completion is taken by whichever step follows its delivery, so each scheduler sees some completions in other steps; saves are stored behind the steps, so a lookup may or may not find a block saved just before (--lockstep waits for every load and save before each step)",
            match (c.store.is_real(), c.load_latency_us.min_us, c.load_latency_us.max_us) {
                (true, ..) => format!("at the speed of {}", c.store.shown()),
                (false, 0, 0) => "instant ones too".to_owned(),
                (false, lo, hi) => format!("{lo}–{hi} µs each"),
            }
        ));
    }
    let open_loop = match (&c.trace.trace, c.rate) {
        (Some(_), _) => Some("a trace"),
        (None, Rate::Max) => None,
        (None, _) => Some("--rate N"),
    };
    if let Some(arrivals) = open_loop {
        why.push(format!(
            "open-loop arrivals ({arrivals}): a request is submitted when the wall clock reaches its arrival, so a step of one scheduler takes in other requests than the same step of the other whenever their steps take different times (--rate max, a closed loop, removes this)"
        ));
    }
    if !c.store.is_real() && k.kv.transfer_damage > 0 {
        why.push(format!(
            "sim-store damage: --failure-rate {} damages that share of the chunks the sim store reads, in the order the reads reach it, so a load damaged in one scheduler may arrive intact in the other (--failure-rate 0 removes this)",
            c.failure_rate
        ));
    }
    let e = &k.events;
    if e.retry_budget_skips + e.quarantine_skips > 0 {
        why.push(format!(
            "kvsched's retry budget and quarantine offered {} no external load; the baseline has neither",
            counted(e.retry_budget_skips + e.quarantine_skips, "admission", "admissions")
        ));
    }
    if e.load_queue_skips > 0 {
        why.push(format!(
            "kvsched's load queue was full (4,096 jobs waiting for a worker) for {}; the baseline's has no bound",
            counted(e.load_queue_skips, "admission", "admissions")
        ));
    }
    if e.deadlines_expired > 0 {
        why.push(format!(
            "kvsched failed {} at their deadline; the baseline has no load deadline",
            counted(e.deadlines_expired, "load", "loads")
        ));
    }
    if c.faults.is_some() {
        why.push("--faults: the engine's fault draws and cancels follow the steps, so they land on other requests once the steps differ".to_owned());
    }
    why
}

/// The notes on the decisions: that they were the same, or which totals differ and why.
pub(super) fn decisions_notes(report: &StressReport, notes: &mut Vec<String>) {
    let Some(b) = &report.baseline else {
        return;
    };
    let diffs = differences(&report.run, b);
    if diffs.is_empty() {
        notes.push(format!(
            "same decisions: every request, load and recovery count above is equal, in {} steps each",
            count(b.steps)
        ));
        return;
    }
    notes.push(format!(
        "decisions differ (kvsched vs {}): {}",
        b.scheduler,
        diffs.join(", ")
    ));
    let why = causes(report);
    if why.is_empty() {
        notes.push(format!(
            "why: no known cause (one shard, --lockstep, a closed loop, no sim-store damage, no deadline, retry or quarantine event): {} has diverged from the shards' algorithm",
            b.scheduler
        ));
    }
    notes.extend(why.into_iter().map(|w| format!("why: {w}")));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stress::config::StressConfig;

    /// The causes of a one-shard, lockstep run with a baseline whose runs made no load.
    fn causes_of(edit: impl FnOnce(&mut StressConfig)) -> Vec<String> {
        let mut cfg = StressConfig {
            shards: 1,
            lockstep: true,
            ..StressConfig::default()
        };
        edit(&mut cfg);
        let run = RunReport::default();
        let report =
            StressReport::of(vec![run.clone()], vec![run], cfg).expect("a report of one run");
        causes(&report)
    }

    /// Open-loop arrivals follow the wall clock, so they are a cause; a closed loop is not.
    #[test]
    fn open_loop_arrivals_are_named_as_a_cause() {
        let rate = causes_of(|c| c.rate = Rate::PerSecond(2000.0));
        assert_eq!(rate.len(), 1, "{rate:?}");
        assert!(
            rate[0].starts_with("open-loop arrivals (--rate N)"),
            "{rate:?}"
        );
        let trace = causes_of(|c| c.trace.trace = Some("t.jsonl".into()));
        assert_eq!(trace.len(), 1, "{trace:?}");
        assert!(
            trace[0].starts_with("open-loop arrivals (a trace)"),
            "{trace:?}"
        );
        assert_eq!(causes_of(|c| c.rate = Rate::Max), Vec::<String>::new());
    }
}
