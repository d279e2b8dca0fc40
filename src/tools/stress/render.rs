//! The report rendered: as JSON ([`render_json`]) and as a human-readable table
//! ([`render_human`]), section by section.

use std::fmt::Write as _;

use super::config::StressConfig;
use super::faults::FAULT_NAMES;
use super::report::{Ratios, RunReport, StressReport};
use crate::rules::recovery::{Mode, Policy};

/// The report as JSON (one object, pretty-printed, newline-terminated).
///
/// Stable keys: `requests.{submitted,finished,failed,cancelled}`, `loads.{ok,failed,stale}`,
/// `tokens_recomputed`, `claims`, `handoffs`, `completions_per_s`,
/// `step_overhead_us.{p50,p90,p99,p999,max}`, `submit_to_schedule_us.{p50,p99,p999,max}`,
/// `completion_to_runnable_us.{p50,p99,p999,max}`, `invariants.ok`, `invariants.reconciled`,
/// `invariants.violations`, `faults_injected.{deadline,panic,late,duplicate,stale,cancel}`,
/// `events.{deadlines_expired,late_completions,connector_panics,stale_completions,stale_blocks,
/// unknown_commands,duplicate_commands,loads_expired_unrun,retry_budget_skips,quarantine_skips,
/// prefixes_quarantined,handoffs}`,
/// `config` (every setting; `config.faults` is `null` without `--faults`, and
/// `config.load_deadline_ms` is the deadline used, `null` for none); with `--baseline mutex` also `baseline` (the same keys but
/// `config`, for the baseline run) and `ratios.{completions_per_s,step_overhead_p99}`
/// (kvsched ÷ baseline for throughput, baseline ÷ kvsched for latency: > 1 means kvsched is
/// better; `null` when a divisor is 0). Additional keys (`scheduler`, `preemptions`, `steps`,
/// `elapsed_s`, `timed_out`, `loads.{dispatched,stale_blocks,sync_run}`, `count` in each
/// latency object) are informative.
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
///   requests; a cancel may find its request already ended).
///
/// `events` are the scheduler's counters at the end
/// ([`Metrics`](crate::runtime::Metrics)): how it absorbed them (`deadlines_expired`,
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

/// One row of the table: its label and its cell for one run.
type Row = (&'static str, fn(&RunReport) -> String);

/// One section of the table: its title and rows.
type Section = (&'static str, Vec<Row>);

/// The report as a human-readable table (kvsched and, with a baseline, the baseline and the
/// ratio side by side), newline-terminated.
pub fn render_human(report: &StressReport) -> String {
    let c = &report.config;
    let mut o = String::new();
    settings(c, &mut o);
    let runs: Vec<&RunReport> = std::iter::once(&report.run)
        .chain(report.baseline.as_ref())
        .collect();
    column_header(&runs, report.ratios.is_some(), &mut o);
    let mut sections: Vec<Section> = vec![
        requests(),
        loads(),
        recovery(),
        throughput(),
        step_overhead(),
        submit_to_schedule(),
        completion_to_runnable(),
    ];
    if c.faults.is_some() {
        sections.push(faults_injected());
        sections.push(fault_events());
    }
    for (title, rows) in sections {
        let _ = writeln!(o, "{title}");
        for (label, f) in rows {
            let mut line = format!("  {label:<32}");
            for r in &runs {
                let _ = write!(line, "{:>14}", f(r));
            }
            if let Some(ratios) = &report.ratios {
                if let Some(x) = ratio_of(ratios, title, label) {
                    let _ = write!(
                        line,
                        "{:>10}",
                        x.map_or("n/a".to_owned(), |x| format!("{x:.2}×"))
                    );
                }
            }
            let _ = writeln!(o, "{}", line.trim_end());
        }
    }
    invariants(&runs, &mut o);
    o
}

/// The settings line, and the faults line with `--faults`.
fn settings(c: &StressConfig, o: &mut String) {
    let _ = writeln!(
        o,
        "kvsched stress: {} · {} shards · {} workers · rate {} · {} requests · mode {} · policy {} · failure rate {} · seed {}",
        c.groups.name(),
        c.shards,
        c.workers,
        c.rate,
        c.requests,
        match c.mode {
            Mode::Safe => "safe",
            Mode::Vllm => "vllm",
        },
        match c.policy {
            Policy::Recompute => "recompute",
            Policy::Fail => "fail",
        },
        c.failure_rate,
        c.seed
    );
    if let Some(f) = &c.faults {
        let list: Vec<String> = FAULT_NAMES
            .iter()
            .zip(f.rates())
            .filter(|(_, r)| *r > 0.0)
            .map(|(n, r)| format!("{n}={r}"))
            .collect();
        let _ = writeln!(
            o,
            "faults: {} · load deadline {}",
            if list.is_empty() {
                "none".to_owned()
            } else {
                list.join(",")
            },
            c.load_deadline_ms
                .map_or("none".to_owned(), |ms| format!("{ms} ms"))
        );
    }
}

/// The column titles: one per run, and `ratio` with a baseline.
fn column_header(runs: &[&RunReport], ratio: bool, o: &mut String) {
    let mut header = format!("{:<34}", "");
    for r in runs {
        let _ = write!(header, "{:>14}", r.scheduler);
    }
    if ratio {
        let _ = write!(header, "{:>10}", "ratio");
    }
    let _ = writeln!(o, "\n{}", header.trim_end());
}

/// The ratio shown on the row `label` of section `title`, if that row has one.
fn ratio_of(ratios: &Ratios, title: &str, label: &str) -> Option<Option<f64>> {
    match (title, label) {
        ("throughput", "completions/s") => Some(ratios.completions_per_s),
        ("step overhead (µs)", "p99") => Some(ratios.step_overhead_p99),
        _ => None,
    }
}

fn requests() -> Section {
    (
        "requests",
        vec![
            ("submitted", |r| r.requests.submitted.to_string()),
            ("finished", |r| r.requests.finished.to_string()),
            ("failed", |r| r.requests.failed.to_string()),
            ("cancelled", |r| r.requests.cancelled.to_string()),
        ],
    )
}

fn loads() -> Section {
    (
        "loads",
        vec![
            ("ok", |r| r.loads.ok.to_string()),
            ("failed", |r| r.loads.failed.to_string()),
            ("stale", |r| r.loads.stale.to_string()),
        ],
    )
}

fn recovery() -> Section {
    (
        "recovery",
        vec![
            ("tokens recomputed", |r| r.tokens_recomputed.to_string()),
            ("blocks claimed", |r| r.claims.to_string()),
            ("hand-offs", |r| r.handoffs.to_string()),
            ("preemptions", |r| r.preemptions.to_string()),
        ],
    )
}

fn throughput() -> Section {
    (
        "throughput",
        vec![
            ("completions/s", |r| format!("{:.0}", r.completions_per_s)),
            ("steps", |r| r.steps.to_string()),
            ("run time (s)", |r| format!("{:.2}", r.elapsed_s)),
        ],
    )
}

fn step_overhead() -> Section {
    (
        "step overhead (µs)",
        vec![
            ("p50", |r| format!("{:.1}", r.step_overhead_us.p50)),
            ("p90", |r| {
                format!("{:.1}", r.step_overhead_us.p90.unwrap_or(0.0))
            }),
            ("p99", |r| format!("{:.1}", r.step_overhead_us.p99)),
            ("p99.9", |r| format!("{:.1}", r.step_overhead_us.p999)),
            ("max", |r| format!("{:.1}", r.step_overhead_us.max)),
        ],
    )
}

fn submit_to_schedule() -> Section {
    (
        "submit → first schedule (µs)",
        vec![
            ("p50", |r| format!("{:.1}", r.submit_to_schedule_us.p50)),
            ("p99", |r| format!("{:.1}", r.submit_to_schedule_us.p99)),
            ("p99.9", |r| format!("{:.1}", r.submit_to_schedule_us.p999)),
            ("max", |r| format!("{:.1}", r.submit_to_schedule_us.max)),
        ],
    )
}

fn completion_to_runnable() -> Section {
    (
        "completion → runnable (µs)",
        vec![
            ("p50", |r| format!("{:.1}", r.completion_to_runnable_us.p50)),
            ("p99", |r| format!("{:.1}", r.completion_to_runnable_us.p99)),
            ("p99.9", |r| {
                format!("{:.1}", r.completion_to_runnable_us.p999)
            }),
            ("max", |r| format!("{:.1}", r.completion_to_runnable_us.max)),
        ],
    )
}

fn faults_injected() -> Section {
    (
        "faults injected",
        vec![
            ("deadline (loads hung)", |r| {
                r.faults_injected.deadline.to_string()
            }),
            ("panic (loads panicked)", |r| {
                r.faults_injected.panic.to_string()
            }),
            ("late (cancelled in load)", |r| {
                r.faults_injected.late.to_string()
            }),
            ("duplicate (steps)", |r| {
                r.faults_injected.duplicate.to_string()
            }),
            ("stale (blocks)", |r| r.faults_injected.stale.to_string()),
            ("cancel (cancels)", |r| r.faults_injected.cancel.to_string()),
        ],
    )
}

fn fault_events() -> Section {
    (
        "fault events",
        vec![
            ("deadlines expired", |r| {
                r.events.deadlines_expired.to_string()
            }),
            ("late completions", |r| {
                r.events.late_completions.to_string()
            }),
            ("connector panics", |r| {
                r.events.connector_panics.to_string()
            }),
            ("stale completions", |r| {
                r.events.stale_completions.to_string()
            }),
            ("stale blocks", |r| r.events.stale_blocks.to_string()),
            ("unknown commands", |r| {
                r.events.unknown_commands.to_string()
            }),
            ("duplicate commands", |r| {
                r.events.duplicate_commands.to_string()
            }),
            ("expired loads not run", |r| {
                r.events.loads_expired_unrun.to_string()
            }),
            ("retry budget skips", |r| {
                r.events.retry_budget_skips.to_string()
            }),
            ("quarantine skips", |r| {
                r.events.quarantine_skips.to_string()
            }),
            ("prefixes quarantined", |r| {
                r.events.prefixes_quarantined.to_string()
            }),
            ("hand-offs", |r| r.events.handoffs.to_string()),
        ],
    )
}

/// The invariants section: per run, whether its accounts reconciled and its verdict, with
/// every violation.
fn invariants(runs: &[&RunReport], o: &mut String) {
    let _ = writeln!(o, "invariants");
    for r in runs {
        let _ = writeln!(
            o,
            "  {:<32}{:>14}",
            format!("{} reconciled", r.scheduler),
            if r.invariants.reconciled { "yes" } else { "NO" }
        );
        if r.invariants.ok {
            let _ = writeln!(o, "  {:<32}{:>14}", r.scheduler, "ok");
        } else {
            let _ = writeln!(o, "  {:<32}{:>14}", r.scheduler, "VIOLATED");
            for v in &r.invariants.violations {
                let _ = writeln!(o, "    - {v}");
            }
        }
    }
}
