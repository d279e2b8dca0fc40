//! The `kvsched replay` binary: output, `--bench`, exit codes and one-line error messages
//! (docs/replay.md).

mod common;
mod explain;
mod hostile;
mod inputs;
mod output;

use std::path::Path;
use std::process::Command;

use common::{assert_bad, run, temp_file, text, BIN, DOC_EXAMPLE, DOC_OUTCOME};

#[test]
fn spec_example_from_file() {
    let path = temp_file("spec_example.json", DOC_EXAMPLE);
    let out = run(&["replay", path.to_str().expect("utf-8 path")], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), DOC_OUTCOME);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn spec_example_from_stdin() {
    let out = run(&["replay", "-"], DOC_EXAMPLE.as_bytes());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), DOC_OUTCOME);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn bench_prints_median_and_leaves_stdout_unchanged() {
    let plain = run(&["replay", "-"], DOC_EXAMPLE.as_bytes());
    let out = run(&["replay", "--bench", "5", "-"], DOC_EXAMPLE.as_bytes());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(out.stdout, plain.stdout);
    let stderr = text(&out.stderr);
    let value = stderr
        .lines()
        .find_map(|l| l.strip_prefix("recovery_ns_median="))
        .unwrap_or_else(|| panic!("no recovery_ns_median= line in {stderr:?}"));
    assert!(
        !value.is_empty() && value.parse::<u64>().is_ok(),
        "median is not an integer: {value:?}"
    );
}

#[test]
fn bench_zero_is_a_usage_error() {
    let out = run(&["replay", "--bench", "0", "-"], DOC_EXAMPLE.as_bytes());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stderr).matches('\n').count(), 1);
}

#[test]
fn missing_file() {
    let out = run(&["replay", "/nonexistent/kvsched/scenario.json"], b"");
    assert_bad(&out, "FILE", "cannot read", "missing file");
}

#[test]
fn directory_instead_of_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let out = run(&["replay", dir.to_str().expect("utf-8 path")], b"");
    assert_bad(&out, "FILE", "cannot read", "directory");
}

#[test]
fn usage_errors_are_one_line() {
    for args in [&["replay"][..], &[][..], &["replay", "--nope", "-"][..]] {
        let out = run(args, b"");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.starts_with("error: ") && stderr.matches('\n').count() == 1,
            "{args:?}: {stderr:?}"
        );
    }
}

/// The runtime's claim path (`--engine runtime`, K shard threads) prints byte-identical output.
#[test]
fn cli_engine_runtime_prints_the_same_outcome() {
    let bin = BIN;
    let mut files: Vec<_> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios"))
            .expect("scenario dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| {
                p.extension().is_some_and(|e| e == "json")
                    && !p.to_string_lossy().ends_with(".expected.json")
            })
            .collect();
    files.sort();
    for f in files.into_iter().take(12) {
        let seq = Command::new(bin)
            .arg("replay")
            .arg(&f)
            .output()
            .expect("run");
        assert!(seq.status.success());
        for k in ["1", "3"] {
            let rt = Command::new(bin)
                .args(["replay", "--engine", "runtime", "--shards", k])
                .arg(&f)
                .output()
                .expect("run");
            assert!(
                rt.status.success(),
                "{}",
                String::from_utf8_lossy(&rt.stderr)
            );
            assert_eq!(rt.stdout, seq.stdout, "{} --shards {k}", f.display());
        }
    }
    let bad = Command::new(bin)
        .args(["replay", "--engine", "runtime", "--shards", "0", "x.json"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(2));
}
