//! `kvsched stress --plot`: an SVG of both distributions per run, and an unwritable path
//! refused before the run; a refused run leaves an existing file as it was.

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

/// A scratch directory of its own for one test, emptied first.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn a_refused_run_leaves_the_plot_file_as_it_was() {
    let dir = scratch("cli_stress_plot_refused");
    let plot = dir.join("keep.svg");
    std::fs::write(&plot, "precious").unwrap();
    // A trace the run refuses (no request in it), after the plot's path was checked.
    let trace = dir.join("empty.jsonl");
    std::fs::write(&trace, "").unwrap();
    assert_refused(
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--plot",
            plot.to_str().unwrap(),
            "--duration",
            "5",
        ],
        "--trace",
        "no request",
    );
    assert_eq!(std::fs::read_to_string(&plot).unwrap(), "precious");
    // Nothing else is left in the directory (the plot's temporary file is removed).
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["empty.jsonl", "keep.svg"]);
}

#[test]
fn a_plot_naming_the_trace_or_a_directory_is_refused() {
    let dir = scratch("cli_stress_plot_trace");
    let trace = dir.join("t.jsonl");
    let line = r#"{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}"#;
    std::fs::write(&trace, format!("{line}\n")).unwrap();
    let t = trace.to_str().unwrap();
    assert_refused(
        &["--trace", t, "--plot", t, "--duration", "5"],
        "--plot",
        "is the --trace file",
    );
    // Through a symbolic link too: the plot would replace what the link points at.
    let link = dir.join("link.svg");
    std::os::unix::fs::symlink(&trace, &link).unwrap();
    assert_refused(
        &[
            "--trace",
            t,
            "--plot",
            link.to_str().unwrap(),
            "--duration",
            "5",
        ],
        "--plot",
        "is the --trace file",
    );
    assert_eq!(
        std::fs::read_to_string(&trace).unwrap(),
        format!("{line}\n")
    );
    assert_refused(
        &["--plot", dir.to_str().unwrap(), "--duration", "5"],
        "--plot",
        "is a directory",
    );
}
