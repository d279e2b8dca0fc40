//! Hostile input to `kvsched stress --engines N` (several engine processes on one Redis):
//! what is wrong with the input is refused up front, in one line naming the flag, before any
//! engine runs. Skipped (with a message) without `redis-server`, unless `CI` is set.

#[path = "../../kvsched-testkit/tests/redis_common/mod.rs"]
mod redis_common;

use std::process::Command;

use redis_common::missing;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../traces/mooncake_conversation_trace.jsonl"
);

/// A trace with fewer requests than engines leaves an engine nothing to replay.
#[test]
fn fewer_trace_requests_than_engines_is_one_line_naming_the_flags() {
    if missing("redis-server") {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .args([
            "stress",
            "--trace",
            TRACE,
            "--trace-requests",
            "1",
            "--store",
            "redis",
            "--engines",
            "2",
            "--verify",
            "off",
            "--duration",
            "5",
            "--json",
        ])
        .output()
        .expect("run kvsched");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err:?}");
    assert!(err.starts_with("error: "), "{err}");
    for flag in ["--trace", "--engines", "--trace-requests"] {
        assert!(err.contains(flag), "{flag}: {err}");
    }
    assert!(!err.contains("invariant"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `--baseline mutex` and `--repeat K` with `--engines N`: either refused in one line naming
/// the flag (as `--plot` and `--engine model` are), or reported; never run and dropped.
#[test]
fn a_baseline_or_repeat_with_engines_is_refused_or_reported() {
    if missing("redis-server") {
        return;
    }
    for (flag, value) in [("--baseline", "mutex"), ("--repeat", "2")] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvsched"))
            .args([
                "stress",
                "--store",
                "redis",
                "--engines",
                "2",
                flag,
                value,
                "--requests",
                "50",
                "--duration",
                "5",
                "--json",
            ])
            .output()
            .expect("run kvsched");
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(2) {
            assert_eq!(err.lines().count(), 1, "{flag}: not one line: {err:?}");
            assert!(err.contains(flag), "{flag}: {err}");
            assert!(err.contains("--engines"), "{flag}: {err}");
            continue;
        }
        assert_eq!(out.status.code(), Some(0), "{flag}: {err}");
        let text = String::from_utf8_lossy(&out.stdout);
        let what = if flag == "--baseline" {
            "baseline"
        } else {
            "repeat"
        };
        assert!(
            text.contains(&format!("\"{what}\"")),
            "{flag} {value} neither refused nor in the report: {text}"
        );
    }
}
