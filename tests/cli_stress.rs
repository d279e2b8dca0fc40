//! `kvsched stress`: exit codes, the human report's sections, the documented JSON keys, the
//! baseline comparison and one-line errors for bad flags. Small settings keep it fast in debug
//! builds.

use std::process::{Command, Output};

use serde_json::Value;

fn stress(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .arg("stress")
        .args(args)
        .output()
        .expect("run kvsched")
}

const SMALL: &[&str] = &[
    "--requests",
    "300",
    "--duration",
    "5",
    "--rate",
    "3000",
    "--model-us",
    "50",
];

fn small(extra: &[&str]) -> Output {
    let mut args = SMALL.to_vec();
    args.extend_from_slice(extra);
    stress(&args)
}

fn json_of(out: &Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

const FAULTS: [&str; 6] = ["deadline", "panic", "late", "duplicate", "stale", "cancel"];

const EVENTS: [&str; 10] = [
    "deadlines_expired",
    "late_completions",
    "connector_panics",
    "stale_completions",
    "stale_blocks",
    "unknown_commands",
    "retry_budget_skips",
    "quarantine_skips",
    "prefixes_quarantined",
    "handoffs",
];

fn get<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| {
        v.get(k).unwrap_or_else(|| panic!("missing key {path}"))
    })
}

fn assert_run_keys(v: &Value) {
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
    for k in FAULTS {
        assert!(
            get(v, &format!("faults_injected.{k}")).is_u64(),
            "faults_injected.{k}"
        );
    }
    for k in EVENTS {
        assert!(get(v, &format!("events.{k}")).is_u64(), "events.{k}");
    }
    let r = get(v, "requests");
    let n = |k: &str| r[k].as_u64().unwrap_or(0);
    assert_eq!(n("submitted"), 300);
    assert_eq!(n("finished") + n("failed") + n("cancelled"), n("submitted"));
}

#[test]
fn human_report_has_every_section_and_exits_0() {
    let out = small(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {text}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for section in [
        "requests",
        "loads",
        "tokens recomputed",
        "blocks claimed",
        "hand-offs",
        "completions/s",
        "step overhead (µs)",
        "p99.9",
        "submit → first schedule (µs)",
        "completion → runnable (µs)",
        "invariants",
    ] {
        assert!(text.contains(section), "missing {section:?} in:\n{text}");
    }
    assert!(!text.contains("VIOLATED"), "{text}");
}

#[test]
fn json_report_has_every_documented_key() {
    let out = small(&[
        "--json",
        "--groups",
        "hybrid-mamba",
        "--failure-rate",
        "0.2",
        "--seed",
        "7",
    ]);
    let v = json_of(&out);
    assert_run_keys(&v);
    let cfg = get(&v, "config");
    assert_eq!(cfg["seed"], 7);
    assert_eq!(cfg["groups"], "hybrid-mamba");
    assert_eq!(cfg["requests"], 300);
    assert_eq!(cfg["rate"], 3000.0);
    assert_eq!(cfg["mode"], "safe");
    assert_eq!(cfg["policy"], "recompute");
    assert!(cfg["failure_rate"].is_number() && cfg["shards"].is_u64() && cfg["workers"].is_u64());
    assert!(v.get("baseline").is_none() && v.get("ratios").is_none());
}

#[test]
fn baseline_mutex_adds_baseline_and_ratios() {
    let out = stress(&[
        "--requests",
        "300",
        "--duration",
        "5",
        "--model-us",
        "50",
        "--json",
        "--baseline",
        "mutex",
        "--rate",
        "max",
        "--live",
        "64",
        "--policy",
        "fail",
    ]);
    let v = json_of(&out);
    assert_run_keys(&v);
    assert_run_keys(get(&v, "baseline"));
    assert!(
        get(&v, "ratios.completions_per_s").is_number()
            || get(&v, "ratios.completions_per_s").is_null()
    );
    assert!(
        get(&v, "ratios.step_overhead_p99").is_number()
            || get(&v, "ratios.step_overhead_p99").is_null()
    );
    assert_eq!(get(&v, "config.baseline"), "mutex");
    assert_eq!(get(&v, "config.rate"), "max");
}

#[test]
fn every_preset_mode_and_policy_runs_clean() {
    for (groups, mode, policy) in [
        ("dense", "vllm", "fail"),
        ("hybrid-swa", "vllm", "recompute"),
        ("mixed-16-32-64", "safe", "fail"),
    ] {
        let out = stress(&[
            "--requests",
            "150",
            "--duration",
            "5",
            "--rate",
            "max",
            "--live",
            "48",
            "--model-us",
            "0",
            "--failure-rate",
            "0.3",
            "--groups",
            groups,
            "--mode",
            mode,
            "--policy",
            policy,
            "--json",
            "--shards",
            "3",
            "--workers",
            "3",
        ]);
        let v = json_of(&out);
        assert_eq!(
            get(&v, "invariants.ok"),
            &Value::Bool(true),
            "{groups} {mode} {policy}: {v}"
        );
    }
}

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

const ALL_FAULTS: &str = "deadline=0.05,panic=0.05,late=0.05,duplicate=0.2,stale=0.2,cancel=0.05";

#[test]
fn faults_are_injected_counted_and_absorbed() {
    // Enough workers that a hung load (4 × the 20 ms deadline) does not stall all the others.
    let out = stress(&[
        "--requests",
        "400",
        "--duration",
        "10",
        "--rate",
        "1000",
        "--workers",
        "8",
        "--model-us",
        "50",
        "--faults",
        ALL_FAULTS,
        "--json",
    ]);
    let v = json_of(&out);
    let n = |path: &str| {
        get(&v, path)
            .as_u64()
            .unwrap_or_else(|| panic!("{path} is not a count: {v}"))
    };
    assert_eq!(get(&v, "invariants.ok"), &Value::Bool(true), "{v}");
    assert_eq!(get(&v, "invariants.reconciled"), &Value::Bool(true), "{v}");
    assert_eq!(n("requests.submitted"), 400);
    assert_eq!(
        n("requests.finished") + n("requests.failed") + n("requests.cancelled"),
        400
    );
    for k in FAULTS {
        assert!(
            n(&format!("faults_injected.{k}")) > 0,
            "faults_injected.{k}: {v}"
        );
    }
    for k in EVENTS {
        get(&v, &format!("events.{k}"));
    }
    for k in [
        "deadlines_expired",
        "late_completions",
        "connector_panics",
        "stale_completions",
        "stale_blocks",
        "unknown_commands",
    ] {
        assert!(n(&format!("events.{k}")) > 0, "events.{k}: {v}");
    }
    // Exact accounting of the connector-side faults.
    assert_eq!(
        n("events.connector_panics"),
        n("faults_injected.panic"),
        "{v}"
    );
    assert!(
        n("events.deadlines_expired") >= n("faults_injected.deadline") / 2,
        "{v}"
    );
    assert!(
        n("events.late_completions") <= n("events.deadlines_expired"),
        "{v}"
    );
    // An injected stale block names no sync load's destination in its step: it is counted
    // as foreign (ignored) or, when it happens to be one, as stale (wrong generation).
    assert!(
        n("events.stale_blocks") + n("events.foreign_blocks") >= n("faults_injected.stale"),
        "{v}"
    );
    let cfg = get(&v, "config");
    assert_eq!(cfg["load_deadline_ms"], 20);
    assert_eq!(cfg["faults"]["duplicate"], 0.2);
    assert_eq!(cfg["faults"]["cancel"], 0.05);
}

#[test]
fn human_report_has_a_faults_section_with_faults() {
    let out = small(&[
        "--faults",
        "cancel=0.1,stale=0.5",
        "--load-deadline-ms",
        "100",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for section in [
        "faults: stale=0.5,cancel=0.1 · load deadline 100 ms",
        "faults injected",
        "fault events",
        "stale blocks",
        "unknown commands",
        "kvsched reconciled",
    ] {
        assert!(text.contains(section), "missing {section:?} in:\n{text}");
    }
    assert!(!text.contains("VIOLATED"), "{text}");
    let plain = small(&[]);
    let plain = String::from_utf8_lossy(&plain.stdout);
    assert!(!plain.contains("faults injected"), "{plain}");
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
