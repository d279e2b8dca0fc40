//! `--plot FILE.svg`: the step-overhead and completion → runnable distributions as percentile
//! plots (log-scale latency against log-scale tail: p50, p90, p99, p99.9, …), kvsched and the
//! baseline overlaid, one line per run, drawn from the same hdrhistogram data as the report.
//! A small hand-written SVG writer: no plotting dependency.

use std::fmt::Write as _;

use super::histograms::Curve;
use super::report::{RunReport, StressReport};
use super::values::Rate;

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 470.0;
/// Each panel's plot area: left and top margins, size.
const PANEL_LEFT: [f64; 2] = [78.0, 578.0];
const PANEL_TOP: f64 = 92.0;
const PANEL_W: f64 = 392.0;
const PANEL_H: f64 = 300.0;
const COLORS: [&str; 2] = ["#1f63b4", "#d8431b"];
const FONT: &str = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";

/// Which of a run's curves a panel draws.
type CurveOf = fn(&RunReport) -> &Curve;

/// The plot of `report` as an SVG document.
pub fn render_svg(report: &StressReport) -> String {
    let schedulers: Vec<&[RunReport]> = [&report.runs[..], &report.baseline_runs[..]]
        .into_iter()
        .filter(|r| !r.is_empty())
        .collect();
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" {FONT}>"#
    );
    let _ = writeln!(
        o,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        o,
        r##"<text x="{}" y="30" text-anchor="middle" font-size="19" font-weight="bold" fill="#222">kvsched stress: latency percentiles{}</text>"##,
        WIDTH / 2.0,
        if report.baseline_runs.is_empty() {
            String::new()
        } else {
            " — kvsched vs the mutex baseline".to_owned()
        }
    );
    let _ = writeln!(
        o,
        r##"<text x="{}" y="54" text-anchor="middle" font-size="13" fill="#555">{}</text>"##,
        WIDTH / 2.0,
        escape(&subtitle(report))
    );
    let panels: [(&str, &str, CurveOf); 2] = [
        (
            "step overhead: schedule() + update() per step",
            "no step was timed in this run",
            |r| &r.curves.step,
        ),
        (
            "load completion → request runnable",
            "no load completed in this run: nothing to draw",
            |r| &r.curves.runnable,
        ),
    ];
    for (i, (title, empty, curve)) in panels.into_iter().enumerate() {
        let curves: Vec<Vec<&Curve>> = schedulers
            .iter()
            .map(|runs| runs.iter().map(curve).collect())
            .collect();
        panel(&mut o, PANEL_LEFT[i], title, empty, &curves, &schedulers);
    }
    o.push_str("</svg>\n");
    o
}

/// The most characters of a trace's file name the subtitle shows.
const MAX_TRACE_NAME: usize = 40;

/// The line under the title: the geometry, shards, workers, the arrivals (the rate, or the
/// trace and its speed-up), the requests and the runs.
fn subtitle(report: &StressReport) -> String {
    let c = &report.config;
    let runs = report.runs.len();
    let arrivals = match (&c.trace.trace, c.rate) {
        (Some(t), _) => {
            // The file's name, cut to fit the line (the header has the whole path).
            let name = t.file_name().unwrap_or(t.as_os_str()).to_string_lossy();
            let shown: String = if name.chars().count() > MAX_TRACE_NAME {
                name.chars()
                    .take(MAX_TRACE_NAME - 1)
                    .chain(std::iter::once('…'))
                    .collect()
            } else {
                name.into_owned()
            };
            format!("trace {shown} at {}× speed", c.trace.trace_speed)
        }
        (None, Rate::Max) => format!("rate max ({} live)", c.live),
        (None, r) => format!("rate {r}"),
    };
    format!(
        "{} · {} shards · {} workers · {arrivals} · {} request{}{} · lower is better",
        c.groups.name(),
        c.shards,
        c.workers,
        c.requests,
        if c.requests == 1 { "" } else { "s" },
        if runs > 1 {
            format!(" · {runs} runs each, one line per run")
        } else {
            String::new()
        }
    )
}

/// The percentile ticks: x in nines, label.
const X_TICKS: [(f64, &str); 8] = [
    (0.0, "min"),
    (std::f64::consts::LOG10_2, "p50"),
    (1.0, "p90"),
    (2.0, "p99"),
    (3.0, "p99.9"),
    (4.0, "p99.99"),
    (5.0, "p99.999"),
    (6.0, "p99.9999"),
];

/// One panel at `left`: the axes, the grid, one line per run of each scheduler, a legend;
/// or, when no run has a point to draw, the axes and `empty` in their middle.
fn panel(
    o: &mut String,
    left: f64,
    title: &str,
    empty: &str,
    curves: &[Vec<&Curve>],
    schedulers: &[&[RunReport]],
) {
    let axes = Axes::fitting(left, curves);
    frame(o, &axes, title);
    y_grid(o, &axes);
    x_grid(o, &axes);
    axis_titles(o, &axes);
    if curves.iter().flatten().all(|c| c.is_empty()) {
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14" fill="#555">{}</text>"##,
            axes.left + PANEL_W / 2.0,
            axes.top + PANEL_H / 2.0,
            escape(empty)
        );
        return;
    }
    lines(o, &axes, curves);
    legend(o, &axes, schedulers);
}

/// A panel's plot area and scales: x in nines of the tail (linear), latency in µs (log).
struct Axes {
    /// The plot area's left, top and bottom edges.
    left: f64,
    top: f64,
    bottom: f64,
    /// The rightmost x, in nines.
    x_max: f64,
    /// The lowest and highest decade, as powers of 10 µs.
    y_lo: f64,
    y_hi: f64,
}

impl Axes {
    /// The scales of a panel at `left` holding every point of `curves`: x up to 3% past the
    /// rightmost point (at least p99), y over the decades spanning the nonzero latencies
    /// (1 µs to 10 µs if there is none).
    fn fitting(left: f64, curves: &[Vec<&Curve>]) -> Self {
        let points = || curves.iter().flatten().flat_map(|c| c.iter());
        let x_max = points().map(|p| p.0).fold(2.0_f64, f64::max) * 1.03;
        let lo = points()
            .map(|p| p.1)
            .filter(|&v| v > 0.0)
            .fold(f64::MAX, f64::min);
        let hi = points().map(|p| p.1).fold(0.0_f64, f64::max);
        let (lo, hi) = if lo <= hi && hi > 0.0 {
            (lo, hi)
        } else {
            (1.0, 10.0)
        };
        let y_lo = lo.log10().floor();
        let y_hi = hi.log10().ceil().max(y_lo + 1.0);
        let top = PANEL_TOP;
        Axes {
            left,
            top,
            bottom: top + PANEL_H,
            x_max,
            y_lo,
            y_hi,
        }
    }

    /// The pixel column of `x` nines.
    fn x_of(&self, x: f64) -> f64 {
        self.left + x / self.x_max * PANEL_W
    }

    /// The pixel row of a latency of `us` µs.
    fn y_of(&self, us: f64) -> f64 {
        self.bottom - (us.max(1e-3).log10() - self.y_lo) / (self.y_hi - self.y_lo) * PANEL_H
    }
}

/// The panel's title and the plot area's background and border.
fn frame(o: &mut String, a: &Axes, title: &str) {
    let (left, top) = (a.left, a.top);
    let _ = writeln!(
        o,
        r##"<text x="{}" y="{}" text-anchor="middle" font-size="14" font-weight="bold" fill="#222">{}</text>"##,
        left + PANEL_W / 2.0,
        top - 12.0,
        escape(title)
    );
    let _ = writeln!(
        o,
        r##"<rect x="{left}" y="{top}" width="{PANEL_W}" height="{PANEL_H}" fill="#fafafa" stroke="#888"/>"##
    );
}

/// The horizontal grid: a line per decade (labelled), lighter ones at 2× and 5×.
fn y_grid(o: &mut String, a: &Axes) {
    let left = a.left;
    let mut d = a.y_lo;
    while d <= a.y_hi {
        let y = a.y_of(10f64.powf(d));
        let _ = writeln!(
            o,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#d0d0d0"/>"##,
            left + PANEL_W
        );
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="12" fill="#333">{}</text>"##,
            left - 6.0,
            y + 4.0,
            duration_label(10f64.powf(d))
        );
        for m in [2.0, 5.0] {
            let v = m * 10f64.powf(d);
            if d < a.y_hi && v < 10f64.powf(a.y_hi) {
                let y = a.y_of(v);
                let _ = writeln!(
                    o,
                    r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ececec"/>"##,
                    left + PANEL_W
                );
            }
        }
        d += 1.0;
    }
}

/// The vertical grid and the percentile labels, as far as the x axis reaches.
fn x_grid(o: &mut String, a: &Axes) {
    let (top, bottom) = (a.top, a.bottom);
    for (x, label) in X_TICKS.iter().filter(|(x, _)| *x <= a.x_max) {
        let px = a.x_of(*x);
        let _ = writeln!(
            o,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{bottom}" stroke="#e2e2e2"/>"##
        );
        let _ = writeln!(
            o,
            r##"<text x="{px:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="#333">{label}</text>"##,
            bottom + 17.0
        );
    }
}

/// The titles of the x and y axes.
fn axis_titles(o: &mut String, a: &Axes) {
    let (left, top, bottom) = (a.left, a.top, a.bottom);
    let _ = writeln!(
        o,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="#444">percentile (log scale of the tail: each step right is 10× rarer)</text>"##,
        left + PANEL_W / 2.0,
        bottom + 38.0
    );
    let _ = writeln!(
        o,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="#444" transform="rotate(-90 {:.1} {:.1})">latency (log scale)</text>"##,
        left - 58.0,
        top + PANEL_H / 2.0,
        left - 58.0,
        top + PANEL_H / 2.0
    );
}

/// The lines, one per run, the baseline's first so kvsched's are on top.
fn lines(o: &mut String, a: &Axes, curves: &[Vec<&Curve>]) {
    for (s, runs) in curves.iter().enumerate().rev() {
        for c in runs {
            if c.is_empty() {
                continue;
            }
            let pixels: Vec<(f64, f64)> =
                c.iter().map(|&(x, us)| (a.x_of(x), a.y_of(us))).collect();
            let _ = writeln!(
                o,
                r#"<path d="{}" fill="none" stroke="{}" stroke-width="1.8" stroke-opacity="0.85" stroke-linejoin="round"/>"#,
                path(&pixels),
                COLORS[s % 2]
            );
        }
    }
}

/// The SVG path through `pixels`, leaving out the points inside a horizontal run (they add
/// nothing to the line).
fn path(pixels: &[(f64, f64)]) -> String {
    let mut path = String::new();
    for (i, &(px, py)) in pixels.iter().enumerate() {
        let flat = |j: usize| pixels.get(j).is_some_and(|p| (p.1 - py).abs() < 0.05);
        if i > 0 && i + 1 < pixels.len() && flat(i - 1) && flat(i + 1) {
            continue;
        }
        let _ = write!(path, "{}{px:.1},{py:.1}", if i == 0 { "M" } else { " L" });
    }
    path
}

/// The legend, top left inside the plot area: a swatch and name per scheduler.
fn legend(o: &mut String, a: &Axes, schedulers: &[&[RunReport]]) {
    let top = a.top;
    let lx = a.left + 12.0;
    let box_w = 150.0;
    let box_h = 10.0 + 20.0 * schedulers.len() as f64;
    let _ = writeln!(
        o,
        r##"<rect x="{lx}" y="{:.1}" width="{box_w}" height="{box_h}" fill="#ffffff" fill-opacity="0.9" stroke="#bbb"/>"##,
        top + 10.0
    );
    for (s, runs) in schedulers.iter().enumerate() {
        let y = top + 25.0 + 20.0 * s as f64;
        let name = runs.first().map_or("", |r| r.scheduler);
        let n = runs.len();
        let _ = writeln!(
            o,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="3"/>"#,
            lx + 10.0,
            lx + 34.0,
            COLORS[s % 2]
        );
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{:.1}" font-size="13" fill="#222">{}{}</text>"##,
            lx + 42.0,
            y + 4.5,
            escape(name),
            if n > 1 {
                format!(" ({n} runs)")
            } else {
                String::new()
            }
        );
    }
}

/// A latency in µs as an axis label: `1 µs`, `100 µs`, `1 ms`, `10 s`.
fn duration_label(us: f64) -> String {
    let (v, unit) = if us >= 1e6 {
        (us / 1e6, "s")
    } else if us >= 1e3 {
        (us / 1e3, "ms")
    } else {
        (us, "µs")
    };
    if v >= 1.0 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v} {unit}")
    }
}

/// `s` with XML's special characters escaped.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_escapes() {
        assert_eq!(duration_label(1.0), "1 µs");
        assert_eq!(duration_label(100.0), "100 µs");
        assert_eq!(duration_label(1000.0), "1 ms");
        assert_eq!(duration_label(1e7), "10 s");
        assert_eq!(duration_label(0.1), "0.1 µs");
        assert_eq!(escape("a < b & \"c\""), "a &lt; b &amp; &quot;c&quot;");
    }

    /// A trace run's subtitle names the trace and its speed-up, not the unused `--rate`.
    #[test]
    fn a_trace_runs_subtitle_names_the_trace_and_its_speed() {
        let mut cfg = crate::stress::config::StressConfig::default();
        let report = |cfg: &crate::stress::config::StressConfig| {
            StressReport::of(vec![RunReport::default()], Vec::new(), cfg.clone())
                .expect("a report of one run")
        };
        assert!(subtitle(&report(&cfg)).contains(" · rate 2000/s · "));
        cfg.trace.trace = Some("traces/t.jsonl".into());
        cfg.trace.trace_speed = 50.0;
        let line = subtitle(&report(&cfg));
        assert!(line.contains(" · trace t.jsonl at 50× speed · "), "{line}");
        assert!(!line.contains("rate"), "{line}");
        assert!(render_svg(&report(&cfg)).contains(&escape(&line)));
        cfg.trace.trace = Some(format!("{}.jsonl", "x".repeat(60)).into());
        let line = subtitle(&report(&cfg));
        assert!(
            line.contains(&format!(" · trace {}… at 50× speed · ", "x".repeat(39))),
            "{line}"
        );
    }

    /// A panel with no point to draw says so in words rather than showing empty axes, and
    /// one request is not "1 requests".
    #[test]
    fn an_empty_panel_says_why_and_one_request_is_singular() {
        let cfg = crate::stress::config::StressConfig {
            requests: 1,
            ..Default::default()
        };
        let mut run = RunReport::default();
        run.curves.step = vec![(0.0, 5.0), (1.0, 9.0)];
        let report = StressReport::of(vec![run], Vec::new(), cfg).expect("a report of one run");
        let svg = render_svg(&report);
        assert!(svg.contains("no load completed in this run"), "{svg}");
        assert!(!svg.contains("no step was timed"), "{svg}");
        assert!(
            subtitle(&report).contains(" · 1 request · "),
            "{}",
            subtitle(&report)
        );
        // The panel with points has its legend; the empty one has none.
        assert_eq!(svg.matches("stroke-width=\"3\"").count(), 1, "{svg}");
    }
}
