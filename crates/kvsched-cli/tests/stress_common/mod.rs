//! What the `kvsched stress` CLI tests share: running the binary (with a hang guard), the
//! small settings that keep debug runs fast, and the documented JSON keys.
#![allow(dead_code)] // each test file uses some of these

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Instant;

pub use serde_json::Value;
pub use std::process::Output;
pub use std::time::Duration;

pub fn stress(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .arg("stress")
        .args(args)
        .output()
        .expect("run kvsched")
}

/// Runs `kvsched stress ARGS`, killing it if it has not exited after `limit` (a hang guard
/// against a run that never ends, not a timing assertion: the limit is many times what the
/// run needs).
pub fn stress_guarded(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .arg("stress")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kvsched");
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for kvsched") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvsched stress {args:?} still running after {limit:?}: hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// Asserts that `args` are refused with exit 2, one line on stderr naming `flag` and saying
/// `needle`, and nothing on stdout.
pub fn assert_refused(args: &[&str], flag: &str, needle: &str) {
    let out = stress_guarded(args, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err:?}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(err.contains(flag), "{args:?}: {err} does not name {flag}");
    assert!(
        err.contains(needle),
        "{args:?}: {err} does not say {needle:?}"
    );
    assert!(out.stdout.is_empty(), "{args:?}");
}

pub const SMALL: &[&str] = &[
    "--requests",
    "300",
    "--duration",
    "5",
    "--rate",
    "3000",
    "--model-us",
    "50",
];

/// The workload the small runs keep unless a test sets it: 16 shared prefixes held by the
/// device pool, the sim store (not another) warmed with three quarters of each prompt, so that 300 requests
/// load (the default workload's tier hits come from its own saves coming back after the pool
/// evicted them, which takes more requests than a debug run should).
pub const SMALL_WORKLOAD: &[(&str, &str)] = &[
    ("--hit-ratio", "0.75"),
    ("--prefixes", "16"),
    ("--pool-blocks", "131072"),
];

pub fn small(extra: &[&str]) -> Output {
    let mut args = SMALL.to_vec();
    // Warming is the sim store's (`--hit-ratio` is refused with another store).
    let real_store = extra.windows(2).any(|w| w[0] == "--store" && w[1] != "sim");
    for &(flag, value) in SMALL_WORKLOAD {
        let given = extra.contains(&flag);
        let unused = real_store && flag == "--hit-ratio";
        if !(given || unused) {
            args.extend([flag, value]);
        }
    }
    args.extend_from_slice(extra);
    stress(&args)
}

pub fn json_of(out: &Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

pub const FAULTS: [&str; 6] = ["deadline", "panic", "late", "duplicate", "stale", "cancel"];

/// The faults on a real store's bytes.
pub const STORE_FAULTS: [&str; 4] = ["corrupt", "truncate", "evict", "slow"];

/// The KV counters of every run (`kv.*`), all counts.
pub const KV_COUNTS: [&str; 18] = [
    "kv_bytes_loaded",
    "kv_bytes_saved",
    "kv_bytes_verified",
    "kv_bytes_written",
    "chunks_loaded",
    "chunks_loaded_from_others",
    "chunks_saved",
    "chunks_warmed",
    "checksum_failures",
    "missing_chunks",
    "key_mismatches",
    "mac_failures",
    "format_errors",
    "tier_errors",
    "saves_dropped",
    "saves_dropped_at_end",
    "units_read",
    "units_skipped",
];

/// The garbage counters (`kv.*`): counts with `--verify on`, `null` with `--verify off`.
pub const KV_GARBAGE: [&str; 3] = ["garbage_reads", "garbage_reads_discarded", "null_reads"];

pub const EVENTS: [&str; 11] = [
    "deadlines_expired",
    "late_completions",
    "connector_panics",
    "stale_completions",
    "stale_blocks",
    "unknown_commands",
    "retry_budget_skips",
    "quarantine_skips",
    "load_queue_skips",
    "prefixes_quarantined",
    "handoffs",
];

pub fn get<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| {
        v.get(k).unwrap_or_else(|| panic!("missing key {path}"))
    })
}

/// The number at `path` (a panic naming it and the report otherwise).
pub fn num(v: &Value, path: &str) -> f64 {
    get(v, path)
        .as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number: {v}"))
}

pub fn assert_run_keys(v: &Value) {
    for k in ["submitted", "finished", "failed", "cancelled"] {
        assert!(get(v, &format!("requests.{k}")).is_u64(), "requests.{k}");
    }
    for k in ["ok", "failed", "stale"] {
        assert!(get(v, &format!("loads.{k}")).is_u64(), "loads.{k}");
    }
    for k in ["tokens_recomputed", "claims", "handoffs"] {
        assert!(get(v, k).is_u64(), "{k}");
    }
    assert!(get(v, "completions_per_s").is_number());
    for k in ["p50", "p90", "p99", "p999", "max"] {
        assert!(
            get(v, &format!("step_overhead_us.{k}")).is_number(),
            "step_overhead_us.{k}"
        );
    }
    for h in ["submit_to_schedule_us", "completion_to_runnable_us"] {
        for k in ["p50", "p99", "p999", "max"] {
            assert!(get(v, &format!("{h}.{k}")).is_number(), "{h}.{k}");
        }
    }
    assert_eq!(get(v, "invariants.ok"), &Value::Bool(true));
    assert_eq!(get(v, "invariants.reconciled"), &Value::Bool(true));
    assert_eq!(get(v, "invariants.violations"), &Value::Array(Vec::new()));
    for k in FAULTS.iter().chain(&STORE_FAULTS) {
        assert!(
            get(v, &format!("faults_injected.{k}")).is_u64(),
            "faults_injected.{k}"
        );
    }
    for k in KV_COUNTS.iter().chain(&KV_GARBAGE) {
        assert!(get(v, &format!("kv.{k}")).is_u64(), "kv.{k}: {v}");
    }
    for k in EVENTS {
        assert!(get(v, &format!("events.{k}")).is_u64(), "events.{k}");
    }
    let r = get(v, "requests");
    let n = |k: &str| r[k].as_u64().unwrap_or(0);
    assert_eq!(n("submitted"), 300);
    assert_eq!(n("finished") + n("failed") + n("cancelled"), n("submitted"));
    assert!(
        r["cancelled_at_shutdown"].as_u64() <= Some(n("cancelled")),
        "{r}"
    );
    // The finished requests' prompt tokens by source add up; the warmed sim store serves some.
    let p = get(v, "prompt_tokens");
    let t = |k: &str| {
        p[k].as_u64()
            .unwrap_or_else(|| panic!("prompt_tokens.{k}: {p}"))
    };
    assert_eq!(t("requests"), n("finished"), "{p}");
    assert_eq!(
        t("device_hit") + t("tier_hit") + t("computed"),
        t("total"),
        "{p}"
    );
    assert!(
        t("tier_hit") > 0 && t("computed_after_failed_load") <= t("computed"),
        "{p}"
    );
    // Request throughput beside load completions, and CPU.
    for k in ["finished_per_s", "output_tokens_per_s"] {
        assert!(get(v, k).as_f64().is_some_and(|x| x > 0.0), "{k}: {v}");
    }
    assert!(get(v, "output_tokens")
        .as_u64()
        .is_some_and(|t| t >= n("finished")));
    for k in [
        "user_s",
        "sys_s",
        "per_wall_s",
        "us_per_finished",
        "engine_thread_s",
    ] {
        assert!(
            get(v, &format!("cpu.{k}"))
                .as_f64()
                .is_some_and(|x| x >= 0.0),
            "cpu.{k}: {v}"
        );
    }
    let cpu = |k: &str| get(v, &format!("cpu.{k}")).as_f64().unwrap_or(0.0);
    assert!(cpu("user_s") + cpu("sys_s") > 0.0, "no CPU counted: {v}");
    assert!(
        cpu("per_wall_s") > 0.0 && cpu("us_per_finished") > 0.0,
        "{v}"
    );
    let wall = get(v, "elapsed_s").as_f64().unwrap_or(0.0);
    let per_wall = (cpu("user_s") + cpu("sys_s")) / wall;
    assert!(
        (cpu("per_wall_s") - per_wall).abs() <= 0.01 * per_wall.max(1.0),
        "cpu.per_wall_s is not (user + sys) / elapsed: {v}"
    );
    for k in [
        "client_cancels",
        "client_cancels_skipped",
        "fault_cancels_after_end",
        "late_cancels_ended",
        "samples_after_cancel",
    ] {
        assert!(get(v, &format!("engine.{k}")).is_u64(), "engine.{k}");
    }
}

/// `get(v, path)` as a count.
pub fn count(v: &Value, path: &str) -> u64 {
    get(v, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{path} is not a count: {v}"))
}
