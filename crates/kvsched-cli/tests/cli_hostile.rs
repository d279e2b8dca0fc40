//! Hostile input to `kvsched stress`: a mistyped `--store` URL never has its credentials
//! printed; bad values exit 2 with one line naming the flag.

use std::process::Command;

const SECRET: &str = "hunter2Xq";

fn stress(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .arg("stress")
        .args(args)
        .output()
        .expect("run kvsched")
}

#[test]
fn a_bad_store_url_never_prints_its_password() {
    for url in [
        format!("redis://u:{SECRET}@127.0.0.1:99999"),
        format!("redis://u:{SECRET}@bad_host!:1"),
        format!("redis://u:{SECRET}%zz@127.0.0.1:1"),
        format!("REDIS://u:{SECRET}@127.0.0.1:1"),
        format!("redis:/u:{SECRET}@127.0.0.1:1"),
        format!(" redis://u:{SECRET}@127.0.0.1:1"),
        format!("redis://{SECRET}@127.0.0.1:1"),
        format!("redis://u:a?{SECRET}@127.0.0.1:1?nope=1"),
        format!("redis://u:a/b?{SECRET}=1@127.0.0.1:1"),
        format!("redis://u:{SECRET}@127.0.0.1:1?{SECRET}=1"),
        format!("redis://u:{SECRET}"),
    ] {
        for args in [
            vec!["--store", url.as_str()],
            vec!["--store", url.as_str(), "--engines", "2"],
        ] {
            let out = stress(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            let all = format!("{err}{}", String::from_utf8_lossy(&out.stdout));
            assert!(!all.contains(SECRET), "{url:?}: {all}");
            assert!(!all.contains("Xq"), "{url:?}: {all}");
            assert_eq!(out.status.code(), Some(2), "{url:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{url:?}: not one line: {err:?}");
            assert!(err.starts_with("error: "), "{url:?}: {err}");
            assert!(err.contains("--store"), "{url:?}: {err}");
        }
    }
    // A plain word is repeated (a typo is worth seeing).
    let out = stress(&["--store", "memroy"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`memroy`"), "{err}");
}

#[test]
fn a_negative_redis_cluster_size_names_the_flag() {
    let out = stress(&["--redis-cluster", "-1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.contains("--redis-cluster"), "{err}");
}

/// `kvsched replay`'s numeric flags given a negative value: one line naming the flag, as
/// `kvsched stress` does (`--shards -3` is "invalid value '-3' for '--shards'").
#[test]
fn a_negative_replay_flag_value_names_the_flag() {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/scenarios/s5_safe_i104.json"
    );
    for (flag, value) in [
        ("--bench", "-1"),
        ("--max-input-bytes", "-1"),
        ("--shards", "-3"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvsched"))
            .args(["replay", "--engine", "runtime", flag, value, scenario])
            .output()
            .expect("run kvsched");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert_eq!(err.lines().count(), 1, "{flag} {value}: {err:?}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
}

/// `--model-us`, `--check-every` and `--parallel-step-work` out of range: one line naming the
/// flag and its range in words, as the other integer flags (not clap's "invalid digit found
/// in string" or "0 is not in 1..18446744073709551615").
#[test]
fn model_us_check_every_and_parallel_step_work_out_of_range_name_the_flag_and_range() {
    for (flag, value, range) in [
        ("--model-us", "-1", "from 0 to 1000000"),
        ("--model-us", "1000001", "from 0 to 1000000"),
        ("--check-every", "0", "at least 1"),
        ("--check-every", "-3", "at least 1"),
        ("--check-every", "18446744073709551616", "at least 1"),
        ("--parallel-step-work", "-1", "from 0 to 16777216"),
        ("--parallel-step-work", "16777217", "from 0 to 16777216"),
    ] {
        let out = stress(&[flag, value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert_eq!(err.lines().count(), 1, "{flag} {value}: {err:?}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
        assert!(err.contains(range), "{flag} {value}: {err}");
        assert!(!err.contains("invalid digit"), "{flag} {value}: {err}");
    }
}

/// `--trace -` is refused in one line saying standard input is not read (the trace is read
/// more than once, and by every engine of `--engines`), not "No such file".
#[test]
fn a_trace_on_stdin_is_refused_naming_the_flag() {
    let out = stress(&["--trace", "-"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.starts_with("error: --trace: "), "{err}");
    assert!(err.contains("standard input"), "{err}");
    assert!(out.stdout.is_empty());
}

/// Every numeric flag of `stress` given a negative number: exit 2 and one line naming the
/// flag — never clap's "unexpected argument '-1'", which reads as if the value were a flag.
#[test]
fn every_numeric_flag_given_a_negative_number_names_the_flag() {
    for flag in [
        "--requests",
        "--live",
        "--duration",
        "--shards",
        "--workers",
        "--pool-blocks",
        "--prefix-share",
        "--prefix-burst",
        "--failure-rate",
        "--seed",
        "--model-us",
        "--token-budget",
        "--max-seqs",
        "--prompt-tokens",
        "--output-tokens",
        "--hit-ratio",
        "--async-ratio",
        "--cancel-ratio",
        "--check-every",
        "--store-capacity",
        "--redis-cluster",
        "--redis-maxmemory",
        "--kv-bytes-per-token",
        "--mamba-state-bytes",
        "--load-deadline-ms",
        "--repeat",
        "--prefixes",
        "--redis-restarts",
        "--compute-rate",
        "--trace-speed",
        "--trace-requests",
        "--rate",
    ] {
        let out = stress(&[flag, "-1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} -1: {err}");
        assert_eq!(err.lines().count(), 1, "{flag} -1: {err:?}");
        assert!(err.contains(flag), "{flag} -1: {err}");
        assert!(!err.contains("unexpected argument"), "{flag} -1: {err}");
    }
}

/// `--failure-rate` with a store other than the sim store: refused in one line naming it and
/// what does damage that store's chunks (it was accepted and did nothing); 0, or the default,
/// runs.
#[test]
fn a_failure_rate_for_a_real_store_is_refused_naming_faults() {
    let out = stress(&["--store", "memory", "--failure-rate", "0.5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.starts_with("error: --failure-rate: "), "{err}");
    assert!(err.contains("--faults corrupt=R"), "{err}");
    for args in [
        &[
            "--store",
            "memory",
            "--failure-rate",
            "0",
            "--requests",
            "20",
        ][..],
        &["--store", "memory", "--requests", "20"][..],
    ] {
        let out = stress(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}

/// `--hit-ratio` with a store other than the sim store: refused in one line naming it (it
/// ran, warming nothing, with the ratio in the report's config); 0 runs.
#[test]
fn a_hit_ratio_for_a_real_store_is_refused() {
    let out = stress(&["--store", "memory", "--hit-ratio", "0.5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.starts_with("error: --hit-ratio: "), "{err}");
    assert!(err.contains("sim store only"), "{err}");
    let args = ["--store", "memory", "--hit-ratio", "0", "--requests", "20"];
    let out = stress(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
}

/// `--plot` naming a FIFO nobody reads: opening it for writing would wait before the run,
/// past any `--duration`. It is refused at once, naming the flag.
#[cfg(unix)]
#[test]
fn a_plot_fifo_without_a_reader_is_refused_not_waited_on() {
    let dir = std::env::temp_dir().join(format!("kvsched-plot-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let fifo = dir.join("plot.svg");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("no mkfifo: skipped");
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .args([
            "stress",
            "--plot",
            fifo.to_str().expect("path"),
            "--duration",
            "1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kvsched");
    // A wait on the FIFO never ends by itself: give it 30 s, then fail.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.expect("kvsched still waiting on the FIFO after 30 s");
    assert_eq!(status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.contains("--plot") && err.contains("FIFO"), "{err}");
}
