//! `kvsched stress` refuses bad flags with one line naming the flag and exit 2: values out of
//! range, bad `--faults`, hostile sizes, tiny rates that must saturate instead of panicking.

mod stress_common;
use std::process::Command;
use stress_common::*;

#[test]
fn bad_flags_exit_2_with_one_line() {
    for (args, needle) in [
        (vec!["--groups", "sparse"], "--groups"),
        (vec!["--rate", "0"], "--rate"),
        (vec!["--rate", "fast"], "--rate"),
        (vec!["--mode", "fast"], "--mode"),
        (vec!["--policy", "retry"], "--policy"),
        (vec!["--baseline", "rwlock"], "--baseline"),
        (vec!["--prefix-share", "1.5"], "--prefix-share"),
        (vec!["--shards", "0"], "--shards"),
        (vec!["--duration", "0"], "--duration"),
        (vec!["--load-latency-us", "9..1"], "--load-latency-us"),
        (vec!["--pool-blocks", "8"], "--pool-blocks"),
        (vec!["--no-such-flag"], "--no-such-flag"),
    ] {
        let out = stress(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err:?}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: {err} does not name {needle}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn bad_faults_exit_2_with_one_line() {
    for (faults, needle) in [
        ("deadline", "missing `=`"),
        ("panic=0.1,late", "missing `=`"),
        ("bogus=0.1", "unknown fault `bogus`"),
        ("panic=1.5", "from 0 to 1"),
        ("panic=-0.1", "from 0 to 1"),
        ("stale=often", "from 0 to 1"),
        ("cancel=NaN", "from 0 to 1"),
        ("", "empty"),
        ("late=0.1,late=0.2", "twice"),
    ] {
        let out = stress(&["--faults", faults]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{faults:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{faults:?}: not one line: {err:?}");
        assert!(err.starts_with("error: "), "{faults:?}: {err}");
        assert!(
            err.contains("--faults"),
            "{faults:?}: {err} does not name --faults"
        );
        assert!(
            err.contains(needle),
            "{faults:?}: {err} does not say {needle:?}"
        );
        assert!(out.stdout.is_empty(), "{faults:?}");
    }
    let out = stress(&["--load-deadline-ms", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--load-deadline-ms"), "{err}");
}

#[test]
fn tiny_rates_saturate_instead_of_panicking() {
    // The gap to the second arrival overflows a Duration (or f64): that arrival is never
    // reached, the run ends at --duration with one request submitted, and nothing panics.
    for rate in ["1e-20", "1e-300", "5e-324"] {
        let out = stress_guarded(
            &[
                "--rate",
                rate,
                "--requests",
                "3",
                "--duration",
                "0.3",
                "--model-us",
                "0",
                "--json",
            ],
            Duration::from_secs(60),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "--rate {rate}: {err}");
        let v = json_of(&out);
        assert_eq!(get(&v, "requests.submitted"), 1, "--rate {rate}: {v}");
        assert_eq!(
            get(&v, "timed_out"),
            &Value::Bool(true),
            "--rate {rate}: {v}"
        );
        assert_eq!(
            get(&v, "invariants.ok"),
            &Value::Bool(true),
            "--rate {rate}: {v}"
        );
    }
}

#[test]
fn float_flags_out_of_range_name_the_flag() {
    for (args, flag, needle) in [
        (vec!["--rate", "1e-400"], "--rate", "positive"),
        (vec!["--rate", "inf"], "--rate", "positive"),
        (vec!["--rate", "NaN"], "--rate", "positive"),
        (vec!["--rate", "-5"], "--rate", "positive"),
        (vec!["--duration", "1e300"], "--duration", "86400"),
        (vec!["--duration", "-1"], "--duration", "86400"),
        (vec!["--duration", "inf"], "--duration", "86400"),
        (vec!["--duration", "1e-400"], "--duration", "86400"),
        (
            vec!["--load-deadline-ms", "3600001"],
            "--load-deadline-ms",
            "3600000",
        ),
        (
            vec!["--load-latency-us", "0..1000001"],
            "--load-latency-us",
            "1000000",
        ),
        (
            vec!["--load-latency-us", "-5..3"],
            "--load-latency-us",
            "MIN..MAX",
        ),
        (
            vec!["--faults", "deadline=1e-400x"],
            "--faults",
            "from 0 to 1",
        ),
    ] {
        assert_refused(&args, flag, needle);
    }
}

#[test]
fn hostile_sizes_are_refused_against_the_caps() {
    for (args, flag, needle) in [
        (
            vec!["--pool-blocks", "4294967295"],
            "--pool-blocks",
            "16777216",
        ),
        (
            vec!["--pool-blocks", "16777217"],
            "--pool-blocks",
            "16777216",
        ),
        (
            vec!["--pool-blocks", "18446744073709551616"],
            "--pool-blocks",
            "16777216",
        ),
        (vec!["--pool-blocks", "-1"], "--pool-blocks", "16777216"),
        (vec!["--shards", "65"], "--shards", "1 to 64"),
        (vec!["--workers", "257"], "--workers", "1 to 256"),
        (vec!["--workers", "0"], "--workers", "1 to 256"),
        (vec!["--live", "1048577"], "--live", "1048576"),
        (vec!["--max-seqs", "1048577"], "--max-seqs", "1048576"),
        (vec!["--requests", "100000001"], "--requests", "100000000"),
        (vec!["--prefixes", "0"], "--prefixes", "16777216"),
        (vec!["--seed", "-1"], "--seed", "an integer of at least 0"),
        (
            vec!["--requests", "1e3"],
            "--requests",
            "from 1 to 100000000",
        ),
        (
            vec!["--token-budget", "-1"],
            "--token-budget",
            "from 1 to 4294967296",
        ),
    ] {
        assert_refused(&args, flag, needle);
    }
}

#[test]
fn negative_and_out_of_range_shares_name_the_flag_and_range() {
    for flag in [
        "--failure-rate",
        "--prefix-share",
        "--hit-ratio",
        "--async-ratio",
        "--cancel-ratio",
    ] {
        for value in ["-0.1", "1.5", "-1e300", "NaN"] {
            // `--flag -0.1`, with a space: the value, not an unknown flag `-0`.
            assert_refused(&[flag, value], flag, "from 0 to 1");
            assert_refused(&[&format!("{flag}={value}")], flag, "from 0 to 1");
        }
    }
    for (flag, value, needle) in [
        ("--model-us", "-5", "--model-us"),
        ("--token-budget", "-1", "--token-budget"),
        ("--check-every", "-3", "--check-every"),
        ("--prompt-tokens", "-8", "--prompt-tokens"),
    ] {
        assert_refused(&[flag, value], flag, needle);
    }
}

/// Output that cannot be written is not bad input (exit 1, one line, as `replay`): a closed
/// stdout is found before the run (no run's report is lost), a full disk when the report is
/// written; `> /dev/null` is a choice, not an error.
#[test]
fn a_report_that_cannot_be_written_is_an_output_error() {
    let run = |redirect: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                r#"exec "$0" stress --requests 100 --duration 2 --verify off {redirect}"#
            ))
            .arg(env!("CARGO_BIN_EXE_kvsched"))
            .output()
            .expect("run sh")
    };
    let out = run(">&-");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err, "error: stdout: closed (the report would be lost)\n");
    if std::path::Path::new("/dev/full").exists() {
        let out = run("> /dev/full");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.starts_with("error: stdout: ") && err.lines().count() == 1,
            "{err}"
        );
    }
    let out = run("> /dev/null");
    assert_eq!(out.status.code(), Some(0));
}

/// A flag nothing would read is refused, naming it, rather than dropped without a word.
#[test]
fn flags_nothing_reads_are_refused() {
    let mut cases = vec![
        (
            vec!["--trace-speed", "2"],
            "--trace-speed: unused without --trace",
        ),
        (
            vec!["--trace-requests", "5"],
            "--trace-requests: unused without --trace",
        ),
        (
            vec!["--engine-index", "0"],
            "--engine-index: set by --engines",
        ),
        (vec!["--store", "disk="], "the path is empty"),
    ];
    if cfg!(feature = "redis") {
        cases.extend([
            (
                vec!["--store", "redis://127.0.0.1:1", "--store-capacity", "1G"],
                "--store-capacity",
            ),
            (vec!["--store", "redis://"], "host 1: empty host"),
            (
                vec!["--store", "redis://127.0.0.1:1?tag=mine"],
                "tag (`?tag=…`) is not used",
            ),
        ]);
    }
    for (args, needle) in cases {
        let out = stress(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err:?}");
        assert!(
            err.contains(needle),
            "{args:?}: {err} does not say {needle}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
