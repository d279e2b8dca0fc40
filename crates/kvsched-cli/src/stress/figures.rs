//! The figures of a report: every row of the human table, its value in each run, the median
//! and min–max over the runs (`--repeat`), and — where both schedulers have a value and one
//! direction is better — the ratio kvsched vs the baseline, per run pair (JSON and table).

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use super::figure_rows::{c, cost_sections, oc};
use super::report::RunReport;
use super::scheduler::Mechanisms;
pub use super::stats::Stats;

/// Which direction of a figure is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// More is better (throughput): the ratio is kvsched ÷ baseline.
    Higher,
    /// Less is better (latency, CPU): the ratio is baseline ÷ kvsched.
    Lower,
}

/// How a figure's cells are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    /// An integer count, with thousands separators.
    Count,
    /// A number with this many decimals.
    Fixed(usize),
    /// A number of bytes, written in the binary unit that suits the median (B, KiB, MiB, GiB).
    Bytes,
}

/// One row: where its value is in a run's JSON object, its label, and what is better.
pub(super) struct Row {
    /// The value's path in a run's JSON object (`step_overhead_us.p99`): the figure's key.
    pub(super) key: &'static str,
    pub(super) label: &'static str,
    pub(super) format: Format,
    /// `None`: a count of the workload or of events, not ranked.
    pub(super) better: Option<Better>,
    pub(super) value: fn(&RunReport) -> Option<f64>,
    /// The mechanism a scheduler needs for the figure to mean anything (a scheduler without
    /// it has no value).
    pub(super) needs: Option<fn(&Mechanisms) -> bool>,
}

/// One section of rows.
pub(super) struct Section {
    pub(super) title: &'static str,
    pub(super) rows: Vec<Row>,
}

macro_rules! row {
    ($key:literal, $label:literal, $format:expr, $better:expr, |$r:ident| $value:expr) => {
        Row {
            key: $key,
            label: $label,
            format: $format,
            better: $better,
            value: |$r: &RunReport| $value,
            needs: None,
        }
    };
    ($key:literal, $label:literal, latency $field:ident . $p:ident) => {
        Row {
            key: $key,
            label: $label,
            format: Format::Fixed(1),
            better: Some(Better::Lower),
            value: |r: &RunReport| r.$field.sampled(r.$field.$p),
            needs: None,
        }
    };
    ($key:literal, $label:literal, needs $m:ident, |$r:ident| $value:expr) => {
        Row {
            key: $key,
            label: $label,
            format: Format::Count,
            better: None,
            value: |$r: &RunReport| $value,
            needs: Some(|m: &Mechanisms| m.$m),
        }
    };
}

pub(super) use row;

/// The title of the KV bytes section.
pub(super) const KV_SECTION: &str = "KV bytes";

/// Every section of the table, in order; the `events` section holds the scheduler's and the
/// engine's event counters (the human table shows the rows that are not 0).
pub(super) fn sections() -> Vec<Section> {
    use Better::{Higher, Lower};
    use Format::{Bytes, Count, Fixed};
    let mut all = vec![
        Section {
            title: "requests",
            rows: vec![
                row!("requests.submitted", "submitted", Count, None, |r| c(r
                    .requests
                    .submitted)),
                row!("requests.finished", "finished", Count, None, |r| c(r
                    .requests
                    .finished)),
                row!("requests.failed", "failed", Count, None, |r| c(r
                    .requests
                    .failed)),
                row!("requests.cancelled", "cancelled", Count, None, |r| c(r
                    .requests
                    .cancelled)),
            ],
        },
        Section {
            title: "loads",
            rows: vec![
                row!("loads.ok", "async loads completed ok", Count, None, |r| c(
                    r.loads.ok
                )),
                row!(
                    "loads.failed",
                    "async loads completed failed",
                    Count,
                    None,
                    |r| c(r.loads.failed)
                ),
                row!(
                    "loads.stale",
                    "stale completions (ignored)",
                    Count,
                    None,
                    |r| c(r.loads.stale)
                ),
                row!(
                    "loads.sync_run",
                    "sync loads run in a step",
                    Count,
                    None,
                    |r| c(r.loads.sync_run)
                ),
            ],
        },
        Section {
            title: "recovery",
            rows: vec![
                row!(
                    "tokens_recomputed",
                    "tokens recomputed",
                    Count,
                    None,
                    |r| c(r.tokens_recomputed)
                ),
                row!("claims", "blocks claimed", Count, None, |r| c(r.claims)),
                row!("handoffs", "hand-offs", Count, None, |r| c(r.handoffs)),
                row!("preemptions", "preemptions", Count, None, |r| c(
                    r.preemptions
                )),
            ],
        },
        Section {
            title: KV_SECTION,
            rows: vec![
                row!(
                    "kv.kv_bytes_loaded",
                    "bytes loaded into KV memory",
                    Bytes,
                    None,
                    |r| c(r.kv.kv_bytes_loaded)
                ),
                row!(
                    "kv.kv_bytes_saved",
                    "bytes saved to the store",
                    Bytes,
                    None,
                    |r| c(r.kv.kv_bytes_saved)
                ),
                row!(
                    "kv.kv_bytes_verified",
                    "bytes verified",
                    Bytes,
                    None,
                    |r| c(r.kv.kv_bytes_verified)
                ),
                row!(
                    "kv.garbage_reads",
                    "garbage reads, output kept",
                    Count,
                    None,
                    |r| oc(r.kv.garbage_reads)
                ),
                row!(
                    "kv.garbage_reads_discarded",
                    "garbage reads, output discarded",
                    Count,
                    None,
                    |r| oc(r.kv.garbage_reads_discarded)
                ),
                row!(
                    "kv.null_reads",
                    "of which through a null entry",
                    Count,
                    None,
                    |r| oc(r.kv.null_reads)
                ),
                row!("kv.chunks_loaded", "chunks loaded", Count, None, |r| c(r
                    .kv
                    .chunks_loaded)),
                row!(
                    "kv.chunks_loaded_from_others",
                    "of which saved by an earlier run",
                    Count,
                    None,
                    |r| c(r.kv.chunks_loaded_from_others)
                ),
                row!("kv.chunks_saved", "chunks saved", Count, None, |r| c(r
                    .kv
                    .chunks_saved)),
                row!(
                    "kv.chunks_warmed",
                    "chunks warmed before submit",
                    Count,
                    None,
                    |r| c(r.kv.chunks_warmed)
                ),
                row!(
                    "kv.checksum_failures",
                    "checksum failures",
                    Count,
                    None,
                    |r| c(r.kv.checksum_failures)
                ),
                row!("kv.missing_chunks", "missing chunks", Count, None, |r| c(r
                    .kv
                    .missing_chunks)),
                row!("kv.key_mismatches", "key mismatches", Count, None, |r| c(r
                    .kv
                    .key_mismatches)),
                row!("kv.mac_failures", "MAC failures", Count, None, |r| c(r
                    .kv
                    .mac_failures)),
                row!("kv.format_errors", "format errors", Count, None, |r| c(r
                    .kv
                    .format_errors)),
                row!("kv.tier_errors", "tier errors", Count, None, |r| c(r
                    .kv
                    .tier_errors)),
                row!(
                    "kv.saves_dropped",
                    "saves dropped (queue full or at the end)",
                    Count,
                    None,
                    |r| c(r.kv.saves_dropped)
                ),
            ]
            .into_iter()
            .chain(super::load_bandwidth::rows())
            .collect(),
        },
        super::figures_prompt::prompt_section(),
        Section {
            title: "throughput — higher is better",
            rows: vec![
                row!(
                    "finished_per_s",
                    "finished requests/s",
                    Fixed(1),
                    Some(Higher),
                    |r| Some(r.finished_per_s)
                ),
                row!(
                    "output_tokens_per_s",
                    "output tokens/s",
                    Fixed(0),
                    Some(Higher),
                    |r| { Some(r.output_tokens_per_s) }
                ),
                row!(
                    "completions_per_s",
                    "load completions/s",
                    Fixed(0),
                    Some(Higher),
                    |r| { Some(r.completions_per_s) }
                ),
            ],
        },
        super::figures_prompt::run_section(),
        Section {
            title: "CPU, whole process — lower is better",
            rows: vec![
                row!(
                    "cpu.per_wall_s",
                    "CPU-s per wall-s",
                    Fixed(3),
                    Some(Lower),
                    |r| r.cpu.as_ref().map(|c| c.per_wall_s)
                ),
                row!(
                    "cpu.us_per_finished",
                    "CPU µs per finished request",
                    Fixed(0),
                    Some(Lower),
                    |r| r.cpu.as_ref().and_then(|c| c.us_per_finished)
                ),
                row!("cpu.user_s", "user (s)", Fixed(2), None, |r| r
                    .cpu
                    .as_ref()
                    .map(|c| c.user_s)),
                row!("cpu.sys_s", "system (s)", Fixed(2), None, |r| r
                    .cpu
                    .as_ref()
                    .map(|c| c.sys_s)),
                row!(
                    "cpu.engine_thread_s",
                    "of which engine thread (s)",
                    Fixed(2),
                    None,
                    |r| r.cpu.as_ref().and_then(|c| c.engine_thread_s)
                ),
            ],
        },
        Section {
            title: "step overhead (µs) — lower is better",
            rows: vec![
                row!("step_overhead_us.p50", "p50", latency step_overhead_us.p50),
                row!("step_overhead_us.p90", "p90", Fixed(1), Some(Lower), |r| r
                    .step_overhead_us
                    .p90
                    .filter(|_| r.step_overhead_us.count > 0)),
                row!("step_overhead_us.p99", "p99", latency step_overhead_us.p99),
                row!("step_overhead_us.p999", "p99.9", latency step_overhead_us.p999),
                row!("step_overhead_us.max", "max", latency step_overhead_us.max),
            ],
        },
        Section {
            title: "submit → first schedule (µs) — lower is better",
            rows: vec![
                row!("submit_to_schedule_us.p50", "p50", latency submit_to_schedule_us.p50),
                row!("submit_to_schedule_us.p99", "p99", latency submit_to_schedule_us.p99),
                row!("submit_to_schedule_us.p999", "p99.9", latency submit_to_schedule_us.p999),
                row!("submit_to_schedule_us.max", "max", latency submit_to_schedule_us.max),
            ],
        },
        Section {
            title: "completion → runnable (µs) — lower is better",
            rows: vec![
                row!("completion_to_runnable_us.p50", "p50", latency completion_to_runnable_us.p50),
                row!("completion_to_runnable_us.p99", "p99", latency completion_to_runnable_us.p99),
                row!("completion_to_runnable_us.p999", "p99.9", latency completion_to_runnable_us.p999),
                row!("completion_to_runnable_us.max", "max", latency completion_to_runnable_us.max),
            ],
        },
        Section {
            title: "events",
            rows: vec![
                row!("events.deadlines_expired", "loads past their deadline", needs load_deadlines, |r| c(
                    r.events.deadlines_expired
                )),
                row!("events.loads_expired_unrun", "expired in the queue, unrun", needs load_deadlines, |r| c(
                    r.events.loads_expired_unrun
                )),
                row!("events.late_completions", "late completions (dropped)", needs load_deadlines, |r| c(
                    r.events.late_completions
                )),
                row!("events.late_load_stalls", "stalls waiting for late loads", needs load_deadlines, |r| c(
                    r.events.late_load_stalls
                )),
                row!(
                    "events.connector_panics",
                    "connector panics caught",
                    Count,
                    None,
                    |r| c(r.events.connector_panics)
                ),
                row!(
                    "events.stale_blocks",
                    "stale blocks (dropped)",
                    Count,
                    None,
                    |r| c(r.events.stale_blocks)
                ),
                row!(
                    "events.foreign_blocks",
                    "foreign blocks (dropped)",
                    Count,
                    None,
                    |r| c(r.events.foreign_blocks)
                ),
                row!(
                    "events.unknown_commands",
                    "unknown commands (ignored)",
                    Count,
                    None,
                    |r| c(r.events.unknown_commands)
                ),
                row!("events.duplicate_commands", "duplicate commands (ignored)", needs counts_duplicates, |r| c(
                    r.events.duplicate_commands
                )),
                row!("events.retry_budget_skips", "admissions, retry budget spent", needs retry_budget_and_quarantine, |r| c(
                    r.events.retry_budget_skips
                )),
                row!("events.quarantine_skips", "admissions, prefix quarantined", needs retry_budget_and_quarantine, |r| c(
                    r.events.quarantine_skips
                )),
                row!("events.load_queue_skips", "admissions, load queue full", needs retry_budget_and_quarantine, |r| c(
                    r.events.load_queue_skips
                )),
                row!("events.prefixes_quarantined", "prefixes quarantined", needs retry_budget_and_quarantine, |r| c(
                    r.events.prefixes_quarantined
                )),
                row!(
                    "engine.client_cancels",
                    "client cancels sent",
                    Count,
                    None,
                    |r| c(r.engine.client_cancels)
                ),
                row!(
                    "engine.client_cancels_skipped",
                    "client cancels skipped (ended)",
                    Count,
                    None,
                    |r| c(r.engine.client_cancels_skipped)
                ),
            ],
        },
    ];
    // The scheduler's own cost, right after its step overhead.
    let at = all
        .iter()
        .position(|s| s.title.starts_with("step overhead"));
    let at = at.map_or(all.len(), |i| i + 1);
    all.splice(at..at, cost_sections());
    all
}

/// One figure of the report (an entry of the JSON `figures` object, keyed by [`Row::key`]).
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    /// The title of the row's section in the human table.
    pub section: &'static str,
    /// The row's label in the human table.
    pub label: &'static str,
    /// Which direction is better (`null`: a count, not ranked).
    pub better: Option<Better>,
    /// kvsched's runs.
    pub kvsched: Option<Stats>,
    /// The baseline's runs (absent without `--baseline`, `null` for a counter of a
    /// mechanism the baseline does not have).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Option<Stats>>,
    /// The ratio per run pair (> 1: kvsched better), rounded to 0.01 (absent when the
    /// figure is not ranked, without a baseline, or when no pair has a nonzero divisor).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<Stats>,
    /// Whether the ratio's min–max crosses 1: no consistent winner over the runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_crosses_1: Option<bool>,
    #[serde(skip)]
    pub(super) key: &'static str,
    #[serde(skip)]
    pub(super) format: Format,
}

/// The figures of one section.
#[derive(Clone, Debug)]
pub struct FigureSection {
    /// The section's title in the human table.
    pub title: &'static str,
    /// Its figures, in order.
    pub figures: Vec<Figure>,
}

/// Every figure, by section (JSON: one object keyed by each figure's path in a run).
#[derive(Clone, Debug, Default)]
pub struct Figures(pub Vec<FigureSection>);

impl Serialize for Figures {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        for f in self.0.iter().flat_map(|sec| &sec.figures) {
            m.serialize_entry(f.key, f)?;
        }
        m.end()
    }
}

impl Figures {
    /// The figures of kvsched's `runs` and the baseline's `baseline` (paired by index: run i
    /// of each was run next to the other).
    pub(super) fn of(runs: &[RunReport], baseline: &[RunReport]) -> Figures {
        Figures(
            sections()
                .into_iter()
                .map(|sec| FigureSection {
                    title: sec.title,
                    figures: sec
                        .rows
                        .iter()
                        .map(|row| figure(sec.title, row, runs, baseline))
                        .collect(),
                })
                .collect(),
        )
    }

    /// The figure under `key`.
    pub fn get(&self, key: &str) -> Option<&Figure> {
        self.0
            .iter()
            .flat_map(|sec| &sec.figures)
            .find(|f| f.key == key)
    }
}

/// The ratio of one run pair, > 1 when kvsched is better, rounded to 0.01; `None` when the
/// divisor is 0.
pub(super) fn ratio(better: Better, kvsched: f64, baseline: f64) -> Option<f64> {
    let (a, b) = match better {
        Better::Higher => (kvsched, baseline),
        Better::Lower => (baseline, kvsched),
    };
    (b > 0.0 && a.is_finite() && b.is_finite()).then(|| (a / b * 100.0).round() / 100.0)
}

fn figure(section: &'static str, row: &Row, runs: &[RunReport], baseline: &[RunReport]) -> Figure {
    let value = |r: &RunReport| {
        if row.needs.is_some_and(|has| !has(&r.has)) {
            return None;
        }
        (row.value)(r)
    };
    let values = |rs: &[RunReport]| rs.iter().filter_map(value).collect::<Vec<_>>();
    let k = Stats::of(values(runs));
    let b = (!baseline.is_empty()).then(|| Stats::of(values(baseline)));
    let ratio = row
        .better
        .filter(|_| !baseline.is_empty())
        .and_then(|better| {
            let pairs = runs
                .iter()
                .zip(baseline)
                .filter_map(|(k, b)| ratio(better, value(k)?, value(b)?))
                .collect();
            Stats::of(pairs).map(|mut s| {
                s.median = (s.median * 100.0).round() / 100.0;
                s
            })
        });
    Figure {
        section,
        label: row.label,
        better: row.better,
        ratio_crosses_1: ratio.as_ref().map(Stats::crosses_1),
        kvsched: k,
        baseline: b,
        ratio,
        key: row.key,
        format: row.format,
    }
}

#[cfg(test)]
#[path = "figures_tests.rs"]
mod tests;
