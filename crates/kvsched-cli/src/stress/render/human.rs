//! The report as a human-readable table: the settings and legend, one section per group of
//! figures (kvsched, the baseline and their ratio side by side), the notes, what each
//! injected fault caused, and the invariants.

use super::cells::cell;
use super::faults_caused::faults_caused;
use super::header::{legend, settings};
use super::invariants::invariants;
use super::notes::notes;
use super::table::{wrap, Table};
use crate::stress::figures::{Figure, FigureSection, Format, KV_SECTION};
use crate::stress::report::{RunReport, StressReport};

/// The report as a human-readable table, newline-terminated: the settings, a legend, one
/// section per group of figures (kvsched, the baseline and their ratio side by side; with
/// `--repeat`, each cell the median and min–max of the runs), a note under the figures that
/// need one, what each injected fault caused, and the invariants.
pub fn render_human(report: &StressReport) -> String {
    let c = &report.config;
    let mut o = String::new();
    settings(c, &mut o);
    legend(report, &mut o);
    let mut table = Table::new(report.baseline.as_ref().map(|b| b.scheduler));
    let mut crossing = 0;
    for sec in &report.figures.0 {
        crossing += section(sec, report, &mut table);
    }
    o.push_str(&table.render());
    if crossing > 0 {
        wrap(
            &format!(
                "warning: on {crossing} row(s) marked * the ratio's min–max crosses 1: the runs disagree on which scheduler is better there"
            ),
            "",
            "         ",
            &mut o,
        );
    }
    timed_out(report, &mut o);
    super::model::model(report, &mut o);
    if c.faults.is_some() {
        faults_caused(report, &mut o);
    }
    invariants(report, &mut o);
    o
}

/// A line per run that `--duration` ended with requests left (`timed_out` in JSON).
fn timed_out(report: &StressReport, o: &mut String) {
    let runs = std::iter::once(&report.run).chain(report.baseline.as_ref());
    for r in runs.filter(|r| r.timed_out) {
        wrap(
            &format!(
                "{}: the run hit --duration {} s and ended there, {} of {} requests submitted; {} still live were cancelled at shutdown, apart from the {} cancelled during the run (timed_out and requests.cancelled_at_shutdown in JSON)",
                r.scheduler,
                report.config.duration_s,
                super::cells::count(r.requests.submitted),
                super::cells::count(report.config.requests),
                super::cells::count(r.requests.cancelled_at_shutdown),
                super::cells::count(
                    r.requests
                        .cancelled
                        .saturating_sub(r.requests.cancelled_at_shutdown)
                ),
            ),
            "",
            "  ",
            o,
        );
    }
}

/// The KV counters shown only when they are not 0 in some run (a note names the others).
const KV_IF_NONZERO: [&str; 9] = [
    "kv.chunks_loaded_from_others",
    "kv.chunks_warmed",
    "kv.checksum_failures",
    "kv.missing_chunks",
    "kv.key_mismatches",
    "kv.mac_failures",
    "kv.format_errors",
    "kv.tier_errors",
    "kv.saves_dropped",
];

/// One section of figures added to `table`: its title, a row per figure, its notes and, where
/// the baseline lacks a figure's mechanism, a note saying so. Without `--faults`, the events
/// section shows only the counters that are nonzero somewhere (and is left out if none is);
/// the KV section leaves out the integrity counters that are 0 in every run and names them
/// in a note. Returns how many of its rows have a ratio whose min–max crosses 1.
fn section(sec: &FigureSection, report: &StressReport, table: &mut Table) -> usize {
    let faults = report.config.faults.is_some();
    let baseline = report.baseline.as_ref();
    let several = report.runs.len() > 1;
    let events = sec.title == "events";
    let kv = sec.title == KV_SECTION;
    let shown = |f: &Figure| {
        if events {
            faults || nonzero(f)
        } else if kv && KV_IF_NONZERO.contains(&f.key) {
            nonzero(f)
        } else {
            true
        }
    };
    let figures: Vec<&Figure> = sec.figures.iter().filter(|f| shown(f)).collect();
    let zero: Vec<&str> = sec
        .figures
        .iter()
        .filter(|f| kv && !shown(f))
        .map(|f| f.label)
        .collect();
    if events && figures.is_empty() {
        return 0;
    }
    table.title(if events && faults {
        "fault events"
    } else {
        sec.title
    });
    let mut crossing = 0;
    let mut lacking = false;
    for f in figures {
        let (ratio, crosses) = ratio_cell(f, several, baseline.is_some());
        crossing += usize::from(crosses);
        table.row(
            f.label,
            [
                Some(
                    f.kvsched
                        .as_ref()
                        .map_or_else(|| "n/a".to_owned(), |s| cell(s, f.format, several, "")),
                ),
                baseline.map(|_| match &f.baseline {
                    Some(Some(s)) => cell(s, f.format, several, ""),
                    // A latency with no sample, not a missing mechanism.
                    _ if f.key.contains("_us.") => "n/a".to_owned(),
                    _ => {
                        lacking = true;
                        "—".to_owned()
                    }
                }),
            ],
            ratio,
        );
    }
    if !zero.is_empty() {
        table.note(format!("0 in every run: {}", zero.join(", ")));
    }
    for note in notes(sec, report) {
        table.note(note);
    }
    if let Some(b) = baseline.filter(|_| lacking) {
        table.note(format!(
            "—: {} has no such mechanism{}",
            b.scheduler,
            lacks(b)
        ));
    }
    crossing
}

/// The ratio cell of `f`, marked ` *` when with several runs its min–max crosses 1 (and
/// whether it does); `n/a` for a ranked figure with a baseline but no ratio.
fn ratio_cell(f: &Figure, several: bool, baseline: bool) -> (String, bool) {
    match &f.ratio {
        Some(r) => {
            let crosses = several && r.crosses_1();
            let mark = if crosses { " *" } else { "" };
            (
                format!("{}{mark}", cell(r, Format::Fixed(2), several, "×")),
                crosses,
            )
        }
        None if f.better.is_some() && baseline => ("n/a".to_owned(), false),
        None => (String::new(), false),
    }
}

/// Whether any run of either scheduler has a nonzero value of `f`.
fn nonzero(f: &Figure) -> bool {
    f.kvsched
        .iter()
        .chain(f.baseline.iter().flatten())
        .any(|s| s.runs.iter().any(|&x| x != 0.0))
}

/// What a scheduler lacks of the runtime's fault-handling mechanisms, for the note under
/// its absent counters.
fn lacks(r: &RunReport) -> String {
    let mut v = Vec::new();
    if !r.has.load_deadlines {
        v.push("no load deadlines");
    }
    if !r.has.retry_budget_and_quarantine {
        v.push("no retry budget or quarantine");
    }
    if !r.has.counts_duplicates {
        v.push("applies duplicate commands once without counting them");
    }
    if v.is_empty() {
        String::new()
    } else {
        format!(" ({})", v.join("; "))
    }
}
