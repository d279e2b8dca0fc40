//! The human report's section on `--faults`: a line per injected fault saying what it
//! injects, and per scheduler what it caused, one sentence-writer per fault kind.

use std::fmt::Write as _;

use super::cells::count;
use super::table::wrap;
use crate::stress::config::HANG_DEADLINES;
use crate::stress::faults::FAULT_NAMES;
use crate::stress::report::{RunReport, StressReport};

/// What a fault caused in one run, as a sentence.
type Caused = fn(&RunReport) -> String;

/// A line per injected fault: what it injects, and per scheduler what it caused.
pub(super) fn faults_caused(report: &StressReport, o: &mut String) {
    let c = &report.config;
    let f = c.fault_rates();
    let runs: Vec<&RunReport> = std::iter::once(&report.run)
        .chain(report.baseline.as_ref())
        .collect();
    let name_w = runs.iter().map(|r| r.scheduler.len()).max().unwrap_or(0);
    let median = if report.runs.len() > 1 {
        " (medians of the runs)"
    } else {
        ""
    };
    let _ = writeln!(o, "faults injected — what each caused{median}");
    let deadline_ms = c.load_deadline_ms.unwrap_or(0);
    let slow_ms = c.slow_for().as_millis();
    let lines: [(f64, String, Caused); 10] = [
        (
            f.deadline,
            format!(
                "a load hangs {} ms, {HANG_DEADLINES}× its {deadline_ms} ms deadline",
                u64::from(HANG_DEADLINES) * deadline_ms
            ),
            deadline_caused,
        ),
        (
            f.panic,
            "a load panics inside the connector".to_owned(),
            panic_caused,
        ),
        (
            f.late,
            "the engine cancels a request right after its async load is dispatched".to_owned(),
            late_caused,
        ),
        (
            f.duplicate,
            "the engine sends a step's output twice".to_owned(),
            duplicate_caused,
        ),
        (
            f.stale,
            "the engine names a stale block among a step's failed blocks".to_owned(),
            stale_caused,
        ),
        (
            f.cancel,
            "the client cancels a request at a random later step".to_owned(),
            cancel_caused,
        ),
        (
            f.corrupt,
            "a stored chunk gets one bit flipped at rest".to_owned(),
            corrupt_caused,
        ),
        (
            f.truncate,
            "a stored chunk is cut short at rest".to_owned(),
            truncate_caused,
        ),
        (
            f.evict,
            "a chunk is deleted between lookup and load".to_owned(),
            evict_caused,
        ),
        (
            f.slow,
            format!(
                "a chunk read delays its load {slow_ms} ms, past its {deadline_ms} ms deadline"
            ),
            slow_caused,
        ),
    ];
    for ((rate, what, caused), name) in lines.into_iter().zip(FAULT_NAMES) {
        if rate > 0.0 {
            let _ = writeln!(o, "  {name}={rate}: {what}");
            for r in &runs {
                let first = format!("    {:<name_w$}  ", r.scheduler);
                let rest = " ".repeat(first.chars().count());
                wrap(&caused(r), &first, &rest, o);
            }
        }
    }
}

/// `deadline`: the hung loads, and (with load deadlines) the deadlines they and the loads
/// behind them passed.
fn deadline_caused(r: &RunReport) -> String {
    let (hung, e) = (r.faults_injected.deadline, &r.events);
    if !r.has.load_deadlines {
        return format!(
            "{} hung loads held their workers; no load deadline, so their requests waited out every hang",
            count(hung)
        );
    }
    format!(
        "{} hung loads held their workers; {} loads passed their deadline, the hung ones and loads queued behind them ({} handed back unrun by a worker); {} late completions dropped",
        count(hung),
        count(e.deadlines_expired),
        count(e.loads_expired_unrun),
        count(e.late_completions)
    )
}

/// `panic`: the loads that panicked, and the panics the workers caught.
fn panic_caused(r: &RunReport) -> String {
    format!(
        "{} loads panicked; {} panics caught by the workers, each a failed load of all its blocks",
        count(r.faults_injected.panic),
        count(r.events.connector_panics)
    )
}

/// `late`: the requests cancelled with a load in flight, and those that ended cancelled.
fn late_caused(r: &RunReport) -> String {
    format!(
        "{} requests cancelled with their load in flight; {} of them ended cancelled once the load landed",
        count(r.faults_injected.late),
        count(r.engine.late_cancels_ended)
    )
}

/// `duplicate`: the step outputs sent twice, and (where counted) the repeated commands.
fn duplicate_caused(r: &RunReport) -> String {
    if !r.has.counts_duplicates {
        return format!(
            "{} step outputs sent twice; each repeated command applied once, uncounted",
            count(r.faults_injected.duplicate)
        );
    }
    format!(
        "{} step outputs sent twice; {} repeated sample/finish commands applied once",
        count(r.faults_injected.duplicate),
        count(r.events.duplicate_commands)
    )
}

/// `stale`: the stale blocks named, where the runtime counted them (an older generation of
/// one of the step's sync-load destinations: stale; anything else: foreign), and every stale
/// and foreign block dropped.
fn stale_caused(r: &RunReport) -> String {
    let named = r.faults_injected.stale;
    let in_sync = r.engine.stale_named_in_sync_step.min(named);
    format!(
        "{} stale blocks named: {} at an older generation of the step's own sync-load destination (counted stale), {} in steps with no sync load of that block or past the pool (counted foreign); dropped from reports in all: {} stale blocks (hand-offs and failed blocks whose holders ended first included), {} foreign blocks",
        count(named),
        count(in_sync),
        count(named - in_sync),
        count(r.events.stale_blocks),
        count(r.events.foreign_blocks)
    )
}

/// `cancel`: the cancels sent, and those that found their request ended.
fn cancel_caused(r: &RunReport) -> String {
    format!(
        "{} cancels sent; {} found their request already ended (unknown commands)",
        count(r.faults_injected.cancel),
        count(r.engine.fault_cancels_after_end)
    )
}

/// `corrupt`: the chunks damaged at rest, and the checks that caught them.
fn corrupt_caused(r: &RunReport) -> String {
    format!(
        "{} stored chunks damaged; {} checksum failures at load, each a failed block (a flipped bit in the header is a format error instead)",
        count(r.faults_injected.corrupt),
        count(r.kv.checksum_failures)
    )
}

/// `truncate`: the chunks cut short, and the format errors they caused.
fn truncate_caused(r: &RunReport) -> String {
    format!(
        "{} stored chunks cut short; {} format errors at load (truncations and damaged headers), each a failed block",
        count(r.faults_injected.truncate),
        count(r.kv.format_errors)
    )
}

/// `evict`: the chunks deleted, and the misses at load.
fn evict_caused(r: &RunReport) -> String {
    format!(
        "{} chunks deleted after their lookup; {} chunks missing at load, each a failed block",
        count(r.faults_injected.evict),
        count(r.kv.missing_chunks)
    )
}

/// `slow`: the loads delayed, and what their deadline did.
fn slow_caused(r: &RunReport) -> String {
    if !r.has.load_deadlines {
        return format!(
            "{} loads delayed; no load deadline, so each held its worker and its request until it ended",
            count(r.faults_injected.slow)
        );
    }
    format!(
        "{} loads delayed (sync ones stall their step); {} loads passed their deadline, {} loads stopped early on their fired cancellation",
        count(r.faults_injected.slow),
        count(r.events.deadlines_expired),
        count(r.kv.loads_cancelled)
    )
}
