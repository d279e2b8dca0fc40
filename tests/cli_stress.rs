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
    assert_eq!(get(v, "invariants.violations"), &Value::Array(Vec::new()));
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
