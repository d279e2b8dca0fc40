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
    let (mut crossing, mut against) = (0, 0);
    for sec in &report.figures.0 {
        let (c, a) = section(sec, report, &mut table);
        crossing += c;
        against += a;
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
    if against > 0 {
        wrap(
            &format!(
                "warning: on {against} row(s) marked † the ratio (the median of the per-pair ratios) points the other way from the two cells (the medians of each scheduler's runs): the pairs and the medians disagree on which scheduler is better there"
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
/// in a note. Returns how many of its rows have a ratio whose min–max crosses 1, and how many
/// a ratio pointing against its cells.
fn section(sec: &FigureSection, report: &StressReport, table: &mut Table) -> (usize, usize) {
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
        return (0, 0);
    }
    table.title(if events && faults {
        "fault events"
    } else {
        sec.title
    });
    let (mut crossing, mut against) = (0, 0);
    let mut lacking = false;
    for f in figures {
        let (ratio, crosses, points_against) = ratio_cell(f, several, baseline.is_some());
        crossing += usize::from(crosses);
        against += usize::from(points_against);
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
    (crossing, against)
}

/// The ratio cell of `f`, marked ` *` when with several runs its min–max crosses 1, and ` †`
/// when the ratio (the median of the per-pair ratios) points the other way from the ratio of
/// the two cells' medians (and whether each is so); `n/a` for a ranked figure with a baseline
/// but no ratio.
fn ratio_cell(f: &Figure, several: bool, baseline: bool) -> (String, bool, bool) {
    match &f.ratio {
        Some(r) => {
            let crosses = several && r.crosses_1();
            let against = several && points_against(f, r.median);
            let mark = match (crosses, against) {
                (true, true) => " *†",
                (true, false) => " *",
                (false, true) => " †",
                (false, false) => "",
            };
            (
                format!("{}{mark}", cell(r, Format::Fixed(2), several, "×")),
                crosses,
                against,
            )
        }
        None if f.better.is_some() && baseline => ("n/a".to_owned(), false, false),
        None => (String::new(), false, false),
    }
}

/// Whether `ratio` (> 1: kvsched better) and the ratio of the two medians fall on opposite
/// sides of 1: the per-pair ratios favour one scheduler while the cells favour the other.
fn points_against(f: &Figure, ratio: f64) -> bool {
    let (Some(better), Some(k), Some(Some(b))) = (f.better, &f.kvsched, &f.baseline) else {
        return false;
    };
    crate::stress::figures::ratio(better, k.median, b.median)
        .is_some_and(|m| (m > 1.0 && ratio < 1.0) || (m < 1.0 && ratio > 1.0))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stress::figures::Better;
    use crate::stress::stats::Stats;

    /// A latency row whose per-pair ratios favour the baseline while the medians favour
    /// kvsched (kvsched 4,395 against 5,398, ratio 0.63×) is marked †; one whose ratio and
    /// medians agree is not.
    #[test]
    fn a_ratio_pointing_against_its_cells_is_marked() {
        let stats = |runs: Vec<f64>| Stats::of(runs).expect("runs");
        let figure = |k: Vec<f64>, b: Vec<f64>, ratio: Vec<f64>| Figure {
            section: "completion → runnable (µs)",
            label: "p99",
            better: Some(Better::Lower),
            kvsched: Some(stats(k)),
            baseline: Some(Some(stats(b))),
            ratio: Some(stats(ratio)),
            ratio_crosses_1: None,
            key: "completion_to_runnable_us.p99",
            format: Format::Fixed(1),
        };
        let against = figure(
            vec![4_395.0, 9_000.0, 1_000.0],
            vec![5_398.0, 1_000.0, 9_500.0],
            vec![0.63, 0.11, 1.70],
        );
        let (cell, crosses, marked) = ratio_cell(&against, true, true);
        assert!(crosses && marked, "{cell}");
        assert!(cell.ends_with(" *†"), "{cell}");
        let agreeing = figure(vec![100.0, 110.0], vec![200.0, 210.0], vec![2.0, 1.9]);
        let (cell, _, marked) = ratio_cell(&agreeing, true, true);
        assert!(!marked && !cell.contains('†'), "{cell}");
    }
}
