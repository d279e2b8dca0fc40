//! `kvsched stress --plot`: an SVG of both distributions per run, and an unwritable path
//! refused before the run.

mod stress_common;
use stress_common::*;

#[test]
fn plot_writes_an_svg_of_both_distributions_per_run() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli_stress_plot.svg");
    let _ = std::fs::remove_file(&path);
    let p = path.to_str().expect("utf-8 path");
    let out = stress(&[
        "--requests",
        "200",
        "--duration",
        "5",
        "--rate",
        "3000",
        "--model-us",
        "50",
        "--baseline",
        "mutex",
        "--repeat",
        "2",
        "--plot",
        p,
        // The warmed sim store of the small runs, so that every run loads (a completion →
        // runnable line per run).
        "--hit-ratio",
        "0.75",
        "--prefixes",
        "16",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&path).expect("the plot was written");
    assert!(
        svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{svg}"
    );
    assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    for text in [
        "latency percentiles",
        "step overhead: schedule() + update() per step",
        "load completion → request runnable",
        "kvsched (2 runs)",
        "mutex (2 runs)",
        "p50",
        "p99",
        "latency (log scale)",
        "percentile",
        " µs<",
    ] {
        assert!(svg.contains(text), "missing {text:?}");
    }
    // One line per run of each scheduler in each of the two panels.
    assert_eq!(svg.matches("<path d=\"M").count(), 2 * (2 + 2), "{svg}");
    assert_eq!(svg.matches("<svg").count(), 1);
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
}

#[test]
fn plot_to_an_unwritable_path_is_refused_before_the_run() {
    assert_refused(
        &[
            "--plot",
            "/nonexistent-kvsched-dir/plot.svg",
            "--duration",
            "60",
        ],
        "--plot",
        "cannot create /nonexistent-kvsched-dir/plot.svg",
    );
}
