//! The report rendered: as JSON ([`render_json`]) and as a human-readable table
//! ([`render_human`]), section by section.

use std::fmt::Write as _;

use super::config::{StressConfig, HANG_DEADLINES};
use super::faults::FAULT_NAMES;
use super::figures::{Figure, FigureSection, Format, Stats};
use super::report::{RunReport, StressReport};
use super::values::Rate;
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
/// Added keys: `finished_per_s`, `output_tokens`, `output_tokens_per_s`,
/// `cpu.{user_s,sys_s,per_wall_s,us_per_finished,engine_thread_s}` (`cpu` is `null` where
/// `getrusage` is unavailable), `engine.{client_cancels,client_cancels_skipped,
/// samples_after_cancel,fault_cancels_after_end,late_cancels_ended}`, `config.repeat`, and
/// `figures`: every row of the human table keyed by its value's path in a run, each with
/// `section`, `label`, `better` (`higher`, `lower` or `null`), `kvsched` and `baseline` as
/// `{median,min,max,runs}` and, for a ranked figure with a baseline, `ratio` likewise and
/// `ratio_crosses_1`. With `--repeat`, the top level and `baseline` are the medians of the
/// runs ([`RunReport::median`](super::report::RunReport::median)) and `ratios` the medians of
/// the per-pair ratios. `docs/stress.md` documents every key.
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

/// The report as a human-readable table, newline-terminated: the settings, a legend, one
/// section per group of figures (kvsched, the baseline and their ratio side by side; with
/// `--repeat`, each cell the median and min–max of the runs), a note under the figures that
/// need one, what each injected fault caused, and the invariants.
pub fn render_human(report: &StressReport) -> String {
    let c = &report.config;
    let mut o = String::new();
    settings(c, &mut o);
    let baseline = report.baseline.as_ref();
    let several = report.runs.len() > 1;
    legend(report, &mut o);
    let mut table = Table::new(baseline.map(|b| b.scheduler));
    let mut crossing = 0;
    let mut lacking = false;
    for sec in &report.figures.0 {
        let events = sec.title == "events";
        let figures: Vec<&Figure> = sec
            .figures
            .iter()
            .filter(|f| !events || c.faults.is_some() || nonzero(f))
            .collect();
        if events && figures.is_empty() {
            continue;
        }
        let title = if events && c.faults.is_some() {
            "fault events"
        } else {
            sec.title
        };
        table.title(title);
        for f in figures {
            let ratio = f.ratio.as_ref().map(|r| {
                let crosses = several && r.crosses_1();
                crossing += usize::from(crosses);
                format!(
                    "{}{}",
                    cell(r, Format::Fixed(2), several, "×"),
                    if crosses { " *" } else { "" }
                )
            });
            let ratio = match (ratio, f.better, baseline) {
                (Some(r), _, _) => r,
                (None, Some(_), Some(_)) => "n/a".to_owned(),
                _ => String::new(),
            };
            table.row(
                f.label,
                [
                    f.kvsched.as_ref().map(|s| cell(s, f.format, several, "")),
                    baseline.map(|_| match &f.baseline {
                        Some(Some(s)) => cell(s, f.format, several, ""),
                        _ => {
                            lacking = true;
                            "—".to_owned()
                        }
                    }),
                ],
                ratio,
            );
        }
        for note in notes(sec, report) {
            table.note(note);
        }
        if std::mem::take(&mut lacking) {
            if let Some(b) = baseline {
                table.note(format!(
                    "—: {} has no such mechanism{}",
                    b.scheduler,
                    lacks(b)
                ));
            }
        }
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
    if c.faults.is_some() {
        faults_caused(report, &mut o);
    }
    invariants(report, &mut o);
    o
}

/// Whether any run of either scheduler has a nonzero value of `f`.
fn nonzero(f: &Figure) -> bool {
    f.kvsched
        .iter()
        .chain(f.baseline.iter().flatten())
        .any(|s| s.runs.iter().any(|&x| x != 0.0))
}

/// A table: titled sections of rows (label, kvsched, baseline, ratio) and notes, with columns
/// as wide as their widest cell.
struct Table {
    baseline: Option<&'static str>,
    lines: Vec<Line>,
}

enum Line {
    Title(&'static str),
    Row(&'static str, [Option<String>; 2], String),
    Note(String),
}

impl Table {
    fn new(baseline: Option<&'static str>) -> Self {
        Table {
            baseline,
            lines: Vec::new(),
        }
    }
    fn title(&mut self, t: &'static str) {
        self.lines.push(Line::Title(t));
    }
    fn row(&mut self, label: &'static str, cells: [Option<String>; 2], ratio: String) {
        self.lines.push(Line::Row(label, cells, ratio));
    }
    fn note(&mut self, n: String) {
        self.lines.push(Line::Note(n));
    }

    fn render(&self) -> String {
        let rows = || {
            self.lines.iter().filter_map(|l| match l {
                Line::Row(label, cells, ratio) => Some((label, cells, ratio)),
                _ => None,
            })
        };
        let label_w = rows().map(|(l, _, _)| l.chars().count()).max().unwrap_or(0) + 4;
        let width = |i: usize, title: &str| {
            rows()
                .filter_map(|(_, c, _)| c[i].as_ref().map(|s| s.chars().count()))
                .chain([title.chars().count()])
                .max()
                .unwrap_or(0)
                + 3
        };
        let kw = width(0, "kvsched");
        let bw = self.baseline.map_or(0, |b| width(1, b));
        let rw = self.baseline.map_or(0, |_| {
            rows()
                .map(|(_, _, r)| r.chars().count())
                .chain([5])
                .max()
                .unwrap_or(0)
                + 3
        });
        let pad =
            |s: &str, w: usize| format!("{}{s}", " ".repeat(w.saturating_sub(s.chars().count())));
        let mut o = String::new();
        let mut header = format!("{}{}", " ".repeat(label_w), pad("kvsched", kw));
        if let Some(b) = self.baseline {
            header.push_str(&pad(b, bw));
            header.push_str(&pad("ratio", rw));
        }
        let _ = writeln!(o, "\n{}", header.trim_end());
        for l in &self.lines {
            match l {
                Line::Title(t) => {
                    let _ = writeln!(o, "{t}");
                }
                Line::Row(label, cells, ratio) => {
                    let mut line = format!("  {label}");
                    line.push_str(&" ".repeat(label_w.saturating_sub(line.chars().count())));
                    line.push_str(&pad(cells[0].as_deref().unwrap_or("n/a"), kw));
                    if self.baseline.is_some() {
                        line.push_str(&pad(cells[1].as_deref().unwrap_or("n/a"), bw));
                        line.push_str(&pad(ratio, rw));
                    }
                    let _ = writeln!(o, "{}", line.trim_end());
                }
                Line::Note(n) => wrap(n, "  · ", "    ", &mut o),
            }
        }
        o
    }
}

/// The width notes are wrapped to.
const WRAP: usize = 100;

/// Writes `text` wrapped at [`WRAP`] columns, the first line after `first`, the others after
/// `rest`.
fn wrap(text: &str, first: &str, rest: &str, o: &mut String) {
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split(' ') {
        if !empty && line.chars().count() + 1 + word.chars().count() > WRAP {
            let _ = writeln!(o, "{line}");
            line = rest.to_owned();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    let _ = writeln!(o, "{line}");
}

/// A number written in `format`, with thousands separators.
fn num(x: f64, format: Format) -> String {
    let text = match format {
        Format::Count => format!("{:.0}", x.round()),
        Format::Fixed(d) => format!("{x:.d$}"),
    };
    let (sign, digits) = text.strip_prefix('-').map_or(("", &*text), |t| ("-", t));
    let (int, frac) = digits
        .split_once('.')
        .map_or((digits, None), |(i, f)| (i, Some(f)));
    let mut grouped = String::new();
    for (i, ch) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// `n` and the noun for it: `1 sample`, `2 samples`.
fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

/// A count with thousands separators.
fn count(n: u64) -> String {
    num(n as f64, Format::Count)
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

/// One cell: the median, and with several runs that differ, `[min–max]`; `unit` after the
/// median. A figure of 1,000 or more is written without decimals, a ratio of 10 or more with
/// one.
fn cell(s: &Stats, format: Format, several: bool, unit: &str) -> String {
    let format = match format {
        Format::Fixed(_) if s.median.abs() >= 1000.0 => Format::Fixed(0),
        Format::Fixed(2) if unit == "×" && s.median.abs() >= 10.0 => Format::Fixed(1),
        f => f,
    };
    let median = num(s.median, format);
    if several && num(s.min, format) != num(s.max, format) {
        format!(
            "{median}{unit} [{}–{}]",
            num(s.min, format),
            num(s.max, format)
        )
    } else {
        format!("{median}{unit}")
    }
}

/// The settings line, and the faults line with `--faults`.
fn settings(c: &StressConfig, o: &mut String) {
    let line = format!(
        "kvsched stress: {} · {} shards · {} workers · rate {} · {} requests · mode {} · policy {} · failure rate {} · seed {}",
        c.groups.name(),
        c.shards,
        c.workers,
        match c.rate {
            Rate::Max => format!("max (closed loop, {} live)", c.live),
            r => format!("{r} (open loop)"),
        },
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
    wrap(&line, "", "  ", o);
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

/// What the cells and the ratio column mean.
fn legend(report: &StressReport, o: &mut String) {
    let n = report.runs.len();
    if n > 1 {
        wrap(
            &format!(
                "{n} runs of each scheduler, interleaved: each cell is the median [min–max] of the runs{}",
                if report.baseline.is_some() {
                    ", each ratio the median [min–max] of the ratios of run i of each"
                } else {
                    ""
                }
            ),
            "",
            "",
            o,
        );
    }
    if let Some(b) = &report.baseline {
        wrap(
            &format!(
                "ratio > 1: kvsched better, < 1: {0} better (kvsched ÷ {0} where higher is better, {0} ÷ kvsched where lower is); counts are not ranked",
                b.scheduler
            ),
            "",
            "",
            o,
        );
    }
}

/// The notes under a section, where a figure needs one.
fn notes(sec: &FigureSection, report: &StressReport) -> Vec<String> {
    let c = &report.config;
    let mut notes = Vec::new();
    match sec.title {
        t if t.starts_with("throughput") => {
            if let Rate::PerSecond(rate) = c.rate {
                notes.push(format!(
                    "open loop: requests arrive at {rate}/s whatever the scheduler does, so finished requests/s follows that rate unless a scheduler falls behind"
                ));
            }
            notes.push("load completions/s counts asynchronous KV loads applied (ok + failed), not requests".to_owned());
        }
        t if t.starts_with("CPU") => notes.push(
            "user + system time, first step to end of run: the simulated engine (its model wait spins the last 80 µs; idle, it polls every 200 µs) and the scheduler's threads".to_owned(),
        ),
        t if t.starts_with("step overhead") => notes.push(
            "schedule() + update() wall time per step, on the engine thread; the simulated model excluded".to_owned(),
        ),
        t if t.starts_with("submit") => notes.push(match c.rate {
            Rate::Max if c.live.min(c.requests as usize) > c.max_seqs => format!(
                "closed loop: up to {} requests live at once but at most {} scheduled per step (--max-seqs): mostly queueing behind max_seqs, not scheduler latency",
                count(c.live.min(c.requests as usize) as u64),
                count(c.max_seqs as u64)
            ),
            Rate::Max => "closed loop: from submission; includes the request's asynchronous KV load, if it has one".to_owned(),
            Rate::PerSecond(_) => format!(
                "from the scheduled arrival (no coordinated omission); includes the request's asynchronous KV load, if it has one ({}–{} µs)",
                c.load_latency_us.min_us, c.load_latency_us.max_us
            ),
        }),
        t if t.starts_with("completion") => notes.push(
            "a load completion landing → the step that makes its request runnable".to_owned(),
        ),
        "events" => {
            let runs: Vec<&RunReport> = std::iter::once(&report.run)
                .chain(report.baseline.as_ref())
                .collect();
            let unknown = runs.iter().any(|r| r.events.unknown_commands > 0);
            let all_samples = runs
                .iter()
                .all(|r| r.events.unknown_commands == r.engine.samples_after_cancel);
            if unknown && all_samples {
                notes.push("unknown commands: each a sample of a request the client had just cancelled (the cancel reached the scheduler first), ignored as it should be".to_owned());
            } else if unknown {
                notes.extend(runs.iter().filter_map(|r| unknown_commands_note(r)));
            }
            if runs.iter().any(|r| r.engine.client_cancels_skipped > 0) {
                notes.push("client cancels (--cancel-ratio) fall 1–64 steps after submission; one falling after its request ended is not sent".to_owned());
            }
            if std::iter::once(&report.run)
                .chain(report.baseline.as_ref())
                .any(|r| r.events.stale_blocks > 0)
            {
                notes.push(if c.fault_rates().stale > 0.0 {
                    "stale blocks: blocks a report named after they had been freed and reused (or ids past the pool), dropped: the stale fault's, plus hand-offs and failed blocks whose holders ended first".to_owned()
                } else {
                    "stale blocks: hand-offs or failed blocks freed before the report named them (their last holder ended first), dropped as they should be".to_owned()
                });
            }
        }
        _ => {}
    }
    notes
}

/// What one run's unknown commands were, as far as the engine can tell.
fn unknown_commands_note(r: &RunReport) -> Option<String> {
    let unknown = r.events.unknown_commands;
    if unknown == 0 {
        return None;
    }
    let e = &r.engine;
    let mut parts = Vec::new();
    if e.samples_after_cancel > 0 {
        parts.push(format!(
            "{} of a request the client cancelled just before (the cancel arrived first)",
            counted(e.samples_after_cancel, "sample", "samples")
        ));
    }
    if e.fault_cancels_after_end > 0 {
        parts.push(format!(
            "{} for a request already ended",
            counted(e.fault_cancels_after_end, "cancel fault", "cancel faults")
        ));
    }
    let known = e.samples_after_cancel + e.fault_cancels_after_end;
    if unknown > known {
        parts.push(format!(
            "{} crossing its request's end",
            counted(unknown - known, "other command", "other commands")
        ));
    }
    Some(format!(
        "{}: {} naming no live request, ignored: {}",
        r.scheduler,
        counted(unknown, "unknown command", "unknown commands"),
        parts.join("; ")
    ))
}

/// A line per injected fault: what it injects, and per scheduler what it caused.
fn faults_caused(report: &StressReport, o: &mut String) {
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
    type Caused = fn(&RunReport) -> String;
    let lines: [(f64, String, Caused); 6] = [
        (
            f.deadline,
            format!(
                "a load hangs {} ms, {HANG_DEADLINES}× its {deadline_ms} ms deadline",
                u64::from(HANG_DEADLINES) * deadline_ms
            ),
            |r| {
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
            },
        ),
        (
            f.panic,
            "a load panics inside the connector".to_owned(),
            |r| {
                format!(
                    "{} loads panicked; {} panics caught by the workers, each a failed load of all its blocks",
                    count(r.faults_injected.panic),
                    count(r.events.connector_panics)
                )
            },
        ),
        (
            f.late,
            "the engine cancels a request right after its async load is dispatched".to_owned(),
            |r| {
                format!(
                    "{} requests cancelled with their load in flight; {} of them ended cancelled once the load landed",
                    count(r.faults_injected.late),
                    count(r.engine.late_cancels_ended)
                )
            },
        ),
        (
            f.duplicate,
            "the engine sends a step's output twice".to_owned(),
            |r| {
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
            },
        ),
        (
            f.stale,
            "the engine names a stale block among a step's failed blocks".to_owned(),
            |r| {
                format!(
                    "{} stale blocks named; {} stale blocks dropped from reports in all",
                    count(r.faults_injected.stale),
                    count(r.events.stale_blocks)
                )
            },
        ),
        (
            f.cancel,
            "the client cancels a request at a random later step".to_owned(),
            |r| {
                format!(
                    "{} cancels sent; {} found their request already ended (unknown commands)",
                    count(r.faults_injected.cancel),
                    count(r.engine.fault_cancels_after_end)
                )
            },
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

/// The invariants section: per scheduler, whether its accounts reconciled and its verdict
/// (over every run), with every violation.
fn invariants(report: &StressReport, o: &mut String) {
    let _ = writeln!(o, "invariants");
    let n = report.runs.len();
    let of = if n > 1 {
        format!(" ({n} runs)")
    } else {
        String::new()
    };
    for runs in [&report.runs, &report.baseline_runs] {
        let Some(name) = runs.first().map(|r| r.scheduler) else {
            continue;
        };
        let reconciled = runs.iter().all(|r| r.invariants.reconciled);
        let ok = runs.iter().all(|r| r.invariants.ok);
        let _ = writeln!(
            o,
            "  {:<24}{}{of}",
            format!("{name} reconciled"),
            if reconciled { "yes" } else { "NO" }
        );
        let _ = writeln!(o, "  {name:<24}{}{of}", if ok { "ok" } else { "VIOLATED" });
        for (i, r) in runs.iter().enumerate() {
            for v in &r.invariants.violations {
                if n > 1 {
                    let _ = writeln!(o, "    - run {}: {v}", i + 1);
                } else {
                    let _ = writeln!(o, "    - {v}");
                }
            }
        }
    }
}
