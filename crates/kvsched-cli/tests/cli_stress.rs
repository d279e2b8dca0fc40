//! `kvsched stress`: exit codes, the human report's sections, the documented JSON keys, the
//! baseline comparison, the KV bytes it moves and verifies (on the sim, memory and disk
//! stores, with every fault) and one-line errors for bad flags. Small settings keep it fast in
//! debug builds.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn stress(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .arg("stress")
        .args(args)
        .output()
        .expect("run kvsched")
}

/// Runs `kvsched stress ARGS`, killing it if it has not exited after `limit` (a hang guard
/// against a run that never ends, not a timing assertion: the limit is many times what the
/// run needs).
fn stress_guarded(args: &[&str], limit: Duration) -> Output {
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
fn assert_refused(args: &[&str], flag: &str, needle: &str) {
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

/// The faults on a real store's bytes.
const STORE_FAULTS: [&str; 4] = ["corrupt", "truncate", "evict", "slow"];

/// The KV counters of every run (`kv.*`), all counts.
const KV_COUNTS: [&str; 16] = [
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
    "units_read",
];

/// The garbage counters (`kv.*`): counts with `--verify on`, `null` with `--verify off`.
const KV_GARBAGE: [&str; 3] = ["garbage_reads", "garbage_reads_discarded", "null_reads"];

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
        "finished requests/s",
        "output tokens/s",
        "load completions/s",
        "CPU-s per wall-s",
        "CPU µs per finished request",
        "throughput — higher is better",
        "step overhead (µs) — lower is better",
        "p99.9",
        "submit → first schedule (µs)",
        "completion → runnable (µs)",
        "invariants",
    ] {
        assert!(text.contains(section), "missing {section:?} in:\n{text}");
    }
    assert!(!text.contains("VIOLATED"), "{text}");
    // Each counter named for what it counts: no bare "completions/s".
    for line in text.lines().filter(|l| l.contains("completions/s")) {
        assert!(line.contains("load completions/s"), "{line}");
    }
    // Without a baseline there is no ratio column nor legend.
    assert!(!text.contains("ratio >"), "{text}");
    let header = text
        .lines()
        .find(|l| l.trim() == "kvsched")
        .unwrap_or_else(|| panic!("no column header in:\n{text}"));
    assert!(!header.contains("ratio"), "{header}");
    assert!(!text.contains('×'), "{text}");
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
    // Every ranked figure has a ratio, oriented so that > 1 means kvsched is better.
    let figures = get(&v, "figures").as_object().expect("figures");
    let mut ranked = 0;
    for (key, f) in figures {
        let Some(better) = f["better"].as_str() else {
            assert!(
                f.get("ratio").is_none(),
                "{key}: an unranked count has a ratio"
            );
            continue;
        };
        ranked += 1;
        let (k, b) = (
            f["kvsched"]["median"].as_f64().expect("kvsched"),
            f["baseline"]["median"].as_f64().expect("baseline"),
        );
        let divisor = if better == "higher" { b } else { k };
        if divisor == 0.0 {
            continue;
        }
        let want = if better == "higher" { k / b } else { b / k };
        let got = f["ratio"]["median"].as_f64().expect("ratio");
        assert!(
            (got - want).abs() <= 0.011 + 0.005 * want,
            "{key}: ratio {got}, expected {want} ({better} is better)"
        );
    }
    assert!(ranked >= 16, "{ranked} ranked figures");
    let r = |k: &str| get(&v, &format!("ratios.{k}")).as_f64();
    assert_eq!(
        r("completions_per_s"),
        get(&v, "figures")["completions_per_s"]["ratio"]["median"].as_f64()
    );
    assert_eq!(
        r("step_overhead_p99"),
        get(&v, "figures")["step_overhead_us.p99"]["ratio"]["median"].as_f64()
    );
}

#[test]
fn human_report_with_a_baseline_has_a_ratio_legend() {
    let out = small(&["--baseline", "mutex"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("ratio > 1: kvsched better, < 1: mutex better"),
        "{text}"
    );
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("kvsched") && l.contains("ratio"))
        .unwrap_or_else(|| panic!("no column header in:\n{text}"));
    assert!(header.contains("mutex"), "{header}");
    // A ratio on every throughput, CPU and latency row.
    for label in [
        "finished requests/s",
        "output tokens/s",
        "load completions/s",
        "CPU-s per wall-s",
        "p50",
        "p99",
    ] {
        for line in text.lines().filter(|l| l.trim_start().starts_with(label)) {
            assert!(
                line.trim_end().ends_with('×') || line.trim_end().ends_with("n/a"),
                "no ratio on {line:?}"
            );
        }
    }
}

#[test]
fn repeat_interleaves_runs_and_reports_median_and_range() {
    let out = stress_guarded(
        &[
            "--requests",
            "200",
            "--duration",
            "5",
            "--rate",
            "max",
            "--live",
            "32",
            "--model-us",
            "0",
            "--baseline",
            "mutex",
            "--repeat",
            "3",
            "--json",
        ],
        Duration::from_secs(300),
    );
    let v = json_of(&out);
    assert_eq!(get(&v, "config.repeat"), 3);
    assert_eq!(get(&v, "requests.submitted"), 200);
    assert_eq!(get(&v, "baseline.requests.submitted"), 200);
    assert_eq!(get(&v, "invariants.ok"), &Value::Bool(true), "{v}");
    let figures = get(&v, "figures").as_object().expect("figures");
    for (key, f) in figures {
        for who in ["kvsched", "baseline", "ratio"] {
            let Some(s) = f.get(who).filter(|s| !s.is_null()) else {
                continue;
            };
            let runs: Vec<f64> = s["runs"]
                .as_array()
                .expect("runs")
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            assert_eq!(runs.len(), 3, "{key}.{who}: {s}");
            let (lo, hi) = runs
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            let (min, med, max) = (
                s["min"].as_f64().expect("min"),
                s["median"].as_f64().expect("median"),
                s["max"].as_f64().expect("max"),
            );
            assert_eq!((min, max), (lo, hi), "{key}.{who}: {s}");
            let mut sorted = runs.clone();
            sorted.sort_by(f64::total_cmp);
            assert!((med - sorted[1]).abs() <= 0.006, "{key}.{who}: {s}");
        }
        if let Some(r) = f.get("ratio") {
            let crosses = r["min"].as_f64() < Some(1.0) && r["max"].as_f64() > Some(1.0);
            assert_eq!(f["ratio_crosses_1"], Value::Bool(crosses), "{key}: {f}");
        }
    }
    // The top level carries the medians.
    let p99 = &figures["step_overhead_us.p99"]["kvsched"]["median"];
    assert_eq!(get(&v, "step_overhead_us.p99").as_f64(), p99.as_f64());
    assert_eq!(
        get(&v, "ratios.step_overhead_p99").as_f64(),
        figures["step_overhead_us.p99"]["ratio"]["median"].as_f64()
    );
}

#[test]
fn repeat_human_report_shows_ranges() {
    let out = stress(&[
        "--requests",
        "100",
        "--duration",
        "5",
        "--rate",
        "3000",
        "--model-us",
        "50",
        "--repeat",
        "2",
        "--baseline",
        "mutex",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("2 runs of each scheduler, interleaved"),
        "{text}"
    );
    assert!(
        text.contains("kvsched                 ok (2 runs)"),
        "{text}"
    );
    // The longest step differs between runs (to the 0.1 µs the row shows), so its row shows
    // a [min–max] range. (Step counts can be equal: a short open-loop run's steps follow its
    // arrivals.)
    let line = text
        .lines()
        .skip_while(|l| !l.starts_with("step overhead"))
        .find(|l| l.trim_start().starts_with("max"))
        .expect("step overhead max row");
    assert!(line.contains('[') && line.contains('–'), "{line}");
}

#[test]
fn every_unknown_command_of_a_run_without_faults_is_accounted_for() {
    // Client cancels race with the engine's output: a cancel sent while the request's sample
    // is still to be applied turns that sample into an unknown command, and nothing else
    // should (the engine sends no cancel for a request it has seen end).
    for rate in ["max", "3000"] {
        let out = stress(&[
            "--requests",
            "300",
            "--duration",
            "5",
            "--model-us",
            "50",
            "--cancel-ratio",
            "0.2",
            "--rate",
            rate,
            "--live",
            "64",
            "--baseline",
            "mutex",
            "--json",
        ]);
        let v = json_of(&out);
        for run in [&v, get(&v, "baseline")] {
            assert_eq!(
                get(run, "events.unknown_commands"),
                get(run, "engine.samples_after_cancel"),
                "--rate {rate}: {run}"
            );
            assert!(
                get(run, "engine.client_cancels").as_u64() > Some(0),
                "{run}"
            );
        }
    }
}

#[test]
fn every_preset_mode_and_policy_runs_clean() {
    // Mode safe must read no garbage with the output kept (a kept garbage read is an
    // invariant violation: exit 1); hybrid-mamba's Mamba entries in mode `align` hold a state
    // only at a step's end, which caching and loading must respect.
    for (groups, mode, policy) in [
        ("dense", "vllm", "fail"),
        ("hybrid-swa", "vllm", "recompute"),
        ("hybrid-mamba", "safe", "recompute"),
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
        assert!(count(&v, "kv.kv_bytes_verified") > 0, "{groups}: {v}");
        if mode == "safe" {
            assert_eq!(count(&v, "kv.garbage_reads"), 0, "{groups}: {v}");
        }
    }
}

#[test]
fn hybrid_mamba_prefixes_computed_here_are_shared_without_garbage() {
    // Nothing warmed, so every shared prefix is computed by the engine, in steps that end
    // anywhere in a block: in Mamba mode `align` only the state at a step's end is real, and
    // a request that finds the prefix cached must resume from one. Mode safe reads no garbage
    // (the plant `mamba-align-cache-unwritten`, caching the other entries, makes it read
    // garbage: exit 1, `kv: … garbage reads in mode safe`).
    let out = small(&[
        "--json",
        "--groups",
        "hybrid-mamba",
        "--hit-ratio",
        "0",
        "--baseline",
        "mutex",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    for run in [&v, get(&v, "baseline")] {
        assert_eq!(count(run, "kv.garbage_reads"), 0, "{run}");
        assert_eq!(count(run, "kv.chunks_warmed"), 0, "{run}");
        assert!(count(run, "kv.kv_bytes_verified") > 0, "{run}");
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
    // Enough workers that a hung load (4 × the 20 ms deadline) does not stall all the others;
    // short prompts and outputs keep the engine's verified reads cheap, so steps stay well
    // within the deadline and loads run (and meet their faults) on a loaded machine too.
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
        "--prompt-tokens",
        "128",
        "--output-tokens",
        "8",
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
    // Real bytes moved and verified through every fault, and none read as garbage with the
    // output kept (mode safe).
    for k in ["kv_bytes_loaded", "kv_bytes_verified", "chunks_saved"] {
        assert!(n(&format!("kv.{k}")) > 0, "kv.{k}: {v}");
    }
    assert_eq!(n("kv.garbage_reads"), 0, "{v}");
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
        "faults injected — what each caused",
        "stale=0.5: the engine names a stale block among a step's failed blocks",
        "cancel=0.1: the client cancels a request at a random later step",
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
        (vec!["--live", "16777217"], "--live", "16777216"),
        (vec!["--max-seqs", "1048577"], "--max-seqs", "1048576"),
        (vec!["--requests", "100000001"], "--requests", "100000000"),
        (vec!["--seed", "-1"], "--seed", "invalid digit"),
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

/// `get(v, path)` as a count.
fn count(v: &Value, path: &str) -> u64 {
    get(v, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{path} is not a count: {v}"))
}

#[test]
fn the_default_run_moves_and_verifies_real_bytes() {
    // The sim store, warmed to --hit-ratio before each submit: loads write verified chunks
    // into KV memory, every read is checked, computed prompt blocks are saved; mode safe, so
    // no garbage is read in a step whose output is kept — by kvsched or the baseline, which
    // runs the same engine and checks.
    let v = json_of(&small(&["--json", "--baseline", "mutex"]));
    for run in [&v, get(&v, "baseline")] {
        for k in [
            "kv_bytes_loaded",
            "kv_bytes_verified",
            "kv_bytes_saved",
            "chunks_loaded",
            "chunks_warmed",
            "units_read",
        ] {
            assert!(count(run, &format!("kv.{k}")) > 0, "kv.{k}: {run}");
        }
        assert_eq!(count(run, "kv.garbage_reads"), 0, "{run}");
        // A loaded chunk is a whole block of KV: 16 tokens × 16 bytes in the dense preset.
        assert_eq!(
            count(run, "kv.kv_bytes_loaded"),
            count(run, "kv.chunks_loaded") * 256,
            "{run}"
        );
    }
    let figures = get(&v, "figures");
    for key in [
        "kv.kv_bytes_loaded",
        "kv.garbage_reads",
        "kv.checksum_failures",
    ] {
        assert_eq!(figures[key]["section"], "KV bytes", "{key}");
        assert!(figures[key]["better"].is_null(), "{key}: a count");
    }
    assert_eq!(get(&v, "config.store"), "sim");
    assert_eq!(get(&v, "config.kv_bytes_per_token"), 16);
    assert_eq!(get(&v, "config.mamba_state_bytes"), 64);
    assert_eq!(get(&v, "config.verify"), "on");
}

#[test]
fn the_human_report_has_a_kv_bytes_section() {
    let out = small(&["--failure-rate", "0.2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for needle in [
        "KV bytes: store sim (1G), warmed to --hit-ratio 0.75",
        "\nKV bytes\n",
        "bytes loaded into KV memory",
        "bytes saved to the store",
        "bytes verified",
        "garbage reads, output kept",
        "garbage reads, output discarded",
        "checksum failures",
        "· verified: every read unit",
        "· warming (--hit-ratio 0.75)",
        "outside schedule() + update()",
        "· 0 in every run:",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let kept = text
        .lines()
        .find(|l| l.trim_start().starts_with("garbage reads, output kept"))
        .expect("garbage row");
    assert!(kept.trim_end().ends_with(" 0"), "{kept}");
}

#[test]
fn verify_off_moves_the_bytes_without_reading_them() {
    let v = json_of(&small(&["--json", "--verify", "off"]));
    assert!(count(&v, "kv.kv_bytes_loaded") > 0, "{v}");
    assert!(count(&v, "kv.kv_bytes_written") > 0, "{v}");
    assert_eq!(count(&v, "kv.kv_bytes_verified"), 0, "{v}");
    assert_eq!(count(&v, "kv.units_read"), 0, "{v}");
    for k in KV_GARBAGE {
        assert!(get(&v, &format!("kv.{k}")).is_null(), "kv.{k}: {v}");
    }
    assert_eq!(get(&v, "config.verify"), "off");
    assert_eq!(get(&v, "invariants.ok"), &Value::Bool(true), "{v}");
}

#[test]
fn the_memory_store_starts_empty_and_fills_from_what_the_engine_saves() {
    // A pool this small keeps few prefixes cached, so later requests of a shared prefix load
    // what earlier ones saved.
    let v = json_of(&small(&[
        "--json",
        "--store",
        "memory",
        "--store-capacity",
        "64M",
        "--pool-blocks",
        "300",
        "--prefix-share",
        "0.9",
        "--seed",
        "7",
    ]));
    assert_eq!(get(&v, "config.store"), "memory");
    assert_eq!(get(&v, "config.store_capacity"), 64 << 20);
    assert_eq!(
        count(&v, "kv.chunks_warmed"),
        0,
        "a real store is not warmed: {v}"
    );
    assert!(count(&v, "kv.chunks_saved") > 0, "{v}");
    assert!(count(&v, "kv.kv_bytes_loaded") > 0, "{v}");
    assert_eq!(count(&v, "kv.garbage_reads"), 0, "{v}");
    assert_eq!(count(&v, "kv.chunks_loaded_from_others"), 0, "one run: {v}");
}

/// A disk run with the store faults: `kvsched stress --store disk=DIR` and the fault mix.
fn disk_run(dir: &std::path::Path) -> Value {
    let store = format!("disk={}", dir.display());
    let out = stress_guarded(
        &[
            "--json",
            "--store",
            &store,
            "--faults",
            "corrupt=0.02,truncate=0.01,evict=0.02,slow=0.01",
            // Prefixes shared by many requests, a pool holding few of them: later requests
            // load what earlier ones saved. Seed 7's shared blocks meet every fault.
            "--requests",
            "600",
            "--rate",
            "1000",
            "--pool-blocks",
            "300",
            "--prompt-tokens",
            "512",
            "--prefix-share",
            "0.9",
            "--output-tokens",
            "4",
            "--model-us",
            "50",
            "--duration",
            "60",
            "--seed",
            "7",
        ],
        Duration::from_secs(300),
    );
    json_of(&out)
}

#[test]
fn a_faulty_disk_store_is_recovered_and_a_second_run_loads_what_the_first_saved() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = disk_run(dir.path());
    assert_eq!(get(&first, "invariants.ok"), &Value::Bool(true), "{first}");
    assert_eq!(count(&first, "kv.garbage_reads"), 0, "{first}");
    for k in [
        "kv_bytes_loaded",
        "checksum_failures",
        "missing_chunks",
        "chunks_saved",
    ] {
        assert!(count(&first, &format!("kv.{k}")) > 0, "kv.{k}: {first}");
    }
    for k in ["corrupt", "truncate", "evict"] {
        assert!(
            count(&first, &format!("faults_injected.{k}")) > 0,
            "faults_injected.{k}: {first}"
        );
    }
    assert_eq!(count(&first, "kv.chunks_loaded_from_others"), 0, "{first}");
    assert_eq!(
        get(&first, "config.load_deadline_ms"),
        20,
        "slow faults set a deadline"
    );
    assert!(
        dir.path().join("kvsched").is_dir(),
        "each scheduler has its own directory"
    );
    // A new process on the same directory: its lookups miss, probe the disk in the background,
    // and later requests load, verified, what the first run saved.
    let second = disk_run(dir.path());
    assert_eq!(
        get(&second, "invariants.ok"),
        &Value::Bool(true),
        "{second}"
    );
    assert_eq!(count(&second, "kv.garbage_reads"), 0, "{second}");
    assert!(
        count(&second, "kv.chunks_loaded_from_others") > 0,
        "{second}"
    );
}

#[test]
fn the_human_report_says_what_each_store_fault_caused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("disk={}", dir.path().display());
    let out = small(&[
        "--store",
        &store,
        "--faults",
        "corrupt=0.05,evict=0.05",
        "--pool-blocks",
        "300",
        "--prefix-share",
        "0.9",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for needle in [
        &format!("KV bytes: store {store} (1G) ·"),
        "faults: corrupt=0.05,evict=0.05",
        "corrupt=0.05: a stored chunk gets one bit flipped at rest",
        "evict=0.05: a chunk is deleted between lookup and load",
        "stored chunks damaged;",
        "chunks deleted after their lookup;",
        "· store disk=",
        "kvsched/ and mutex/",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn bad_store_values_exit_2_with_one_line() {
    for (args, flag, needle) in [
        (vec!["--store", "ssd"], "--store", "unknown store `ssd`"),
        (vec!["--store", "disk="], "--store", "empty"),
        (vec!["--store", "disk"], "--store", "disk=DIR"),
        (
            vec!["--store-capacity", "0"],
            "--store-capacity",
            "1M to 16T",
        ),
        (
            vec!["--store-capacity", "2P"],
            "--store-capacity",
            "1M to 16T",
        ),
        (
            vec!["--store-capacity", "-1G"],
            "--store-capacity",
            "1M to 16T",
        ),
        (
            vec!["--kv-bytes-per-token", "0"],
            "--kv-bytes-per-token",
            "1..=65536",
        ),
        (
            vec!["--mamba-state-bytes", "0"],
            "--mamba-state-bytes",
            "1..=1048576",
        ),
        (
            vec!["--mamba-state-bytes", "-4"],
            "--mamba-state-bytes",
            "invalid digit",
        ),
        (vec!["--verify", "maybe"], "--verify", "on or off"),
        (
            vec!["--redis-cluster", "3"],
            "--redis-cluster",
            "only with --store redis",
        ),
        (
            vec!["--redis-maxmemory", "64M"],
            "--redis-maxmemory",
            "only with --store redis",
        ),
        (vec!["--redis-cluster", "2"], "--redis-cluster", "3 to 16"),
        (
            vec!["--pool-blocks", "16777216", "--kv-bytes-per-token", "4096"],
            "--pool-blocks",
            "cap",
        ),
    ] {
        assert_refused(&args, flag, needle);
    }
    // A store directory that cannot be created.
    assert_refused(
        &[
            "--store",
            "disk=/proc/kvsched-no-such-dir",
            "--requests",
            "10",
        ],
        "--store",
        "cannot create",
    );
    #[cfg(not(feature = "redis"))]
    for store in ["redis", "redis://127.0.0.1:6379"] {
        assert_refused(&["--store", store], "--store", "--features redis");
    }
}

#[test]
fn store_faults_need_a_store_they_can_damage() {
    for (faults, needle) in [
        (
            "corrupt=0.1",
            "use them with --store memory, disk=DIR or redis",
        ),
        (
            "slow=0.1,panic=0.1",
            "the sim store has simulated damage instead",
        ),
        ("evict=2", "from 0 to 1"),
        ("truncate=-0.1", "from 0 to 1"),
        ("rot=0.1", "unknown fault `rot`"),
    ] {
        assert_refused(&["--faults", faults], "--faults", needle);
    }
    // On a real store they run.
    let v = json_of(&small(&[
        "--json",
        "--store",
        "memory",
        "--faults",
        "evict=0.5",
        "--pool-blocks",
        "300",
        "--prefix-share",
        "0.9",
        "--seed",
        "7",
    ]));
    assert_eq!(count(&v, "kv.garbage_reads"), 0, "{v}");
    assert_eq!(get(&v, "config.faults.evict"), 0.5);
}
