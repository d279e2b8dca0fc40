//! `kvsched stress`: exit codes, the human report's sections, the documented JSON keys, the
//! baseline comparison and `--repeat`, and every preset, mode and policy running clean.
//! Small settings keep it fast in debug builds.

mod stress_common;
use stress_common::*;

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
        // The small runs' workload (stress_common::SMALL_WORKLOAD): cheap enough per request
        // that a loaded debug build submits all 300 within --duration.
        "--hit-ratio",
        "0.75",
        "--prefixes",
        "16",
        "--pool-blocks",
        "131072",
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
            "--hit-ratio",
            "0.75",
            "--prefixes",
            "16",
            "--pool-blocks",
            "131072",
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
fn step_cpu_and_the_cost_split_add_up() {
    let out = small(&["--json"]);
    let v = json_of(&out);
    let f = |k: &str| num(&v, k);
    // One CPU sample per step, as for the wall clock.
    assert_eq!(
        get(&v, "step_cpu_us.count"),
        get(&v, "step_overhead_us.count")
    );
    assert_eq!(
        get(&v, "step_cpu_us.count").as_u64(),
        get(&v, "steps").as_u64()
    );
    // The engine thread cannot run longer than the calls last (each CPU read brackets its
    // wall interval: at most a few µs more per step), nor the calls than the whole thread.
    let steps = get(&v, "steps").as_f64().unwrap_or(0.0);
    assert!(f("cost.step_cpu_s") > 0.0, "{v}");
    assert!(
        f("cost.step_cpu_s") <= f("cost.step_wall_s") + steps * 20e-6,
        "{v}"
    );
    assert!(f("step_cpu_us.p50") <= f("step_cpu_us.max"), "{v}");
    let engine = f("cpu.engine_thread_s");
    assert!(f("cost.step_cpu_s") <= engine + 0.01, "{v}");
    // The split adds up to the process: calls + simulated engine + other threads.
    let process = f("cpu.user_s") + f("cpu.sys_s");
    let parts = f("cost.step_cpu_s") + f("cost.engine_cpu_s") + f("cost.other_threads_cpu_s");
    assert!((parts - process).abs() < 0.02, "{parts} vs {process}: {v}");
    let per = f("cost.step_cpu_us_per_finished");
    let finished = get(&v, "requests.finished").as_f64().unwrap_or(0.0);
    assert!(
        (per * finished / 1e6 - f("cost.step_cpu_s")).abs() < 0.01,
        "{v}"
    );
}

#[test]
fn requests_scheduled_per_step_is_the_plans_total_over_the_steps() {
    let out = small(&["--json"]);
    let v = json_of(&out);
    let n = |k: &str| num(&v, k);
    let (scheduled, steps) = (n("scheduled"), n("steps"));
    // Every output token is sampled in a step that scheduled its request; every request
    // scheduled at least once.
    assert!(scheduled >= n("output_tokens"), "{v}");
    assert!(scheduled >= n("requests.finished"), "{v}");
    // At most `--max-seqs` (256) a step.
    assert!(scheduled <= steps * 256.0, "{v}");
    let mean = n("scheduled_per_step");
    assert!(
        (mean - scheduled / steps).abs() <= 0.05,
        "{mean} vs {scheduled}/{steps}: {v}"
    );
    assert!((1.0..=256.0).contains(&mean), "{v}");
    assert_eq!(
        get(&v, "figures")["scheduled_per_step"]["kvsched"]["median"].as_f64(),
        Some(mean),
        "{v}"
    );
}

/// A closed loop of a second or so: 1,500 requests, no KV checks, a 50 µs model.
const SMALL_CLOSED_LOOP: &[&str] = &[
    "--rate",
    "max",
    "--requests",
    "1500",
    "--verify",
    "off",
    "--model-us",
    "50",
    "--duration",
    "30",
];

#[test]
fn parallel_step_work_decides_which_steps_run_on_the_shard_threads() {
    let run = |extra: &[&str]| {
        let mut args = vec!["--json", "--live", "512"];
        args.extend_from_slice(SMALL_CLOSED_LOOP);
        args.extend_from_slice(extra);
        let v = json_of(&stress(&args));
        let n = |k: &str| get(&v, k).as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
        (n("events.parallel_steps"), n("steps"))
    };
    // The runtime's threshold (about 1 ms of work) keeps these light steps inline; a closed
    // loop's first step, which takes every submission at once, may not be.
    let (by_default, _) = run(&[]);
    assert!(by_default <= 1, "{by_default} parallel steps");
    // 0 decides by the live count alone: every step with more than 256 live is parallel
    // (the steps of the ramp-down, with fewer live, are not).
    let (parallel, steps) = run(&["--parallel-step-work", "0"]);
    assert!(
        parallel * 4 > steps,
        "{parallel} of {steps} steps in parallel"
    );
}

/// Against a baseline in a closed loop the run section says whether the two schedulers'
/// steps were of a size — what their step percentiles compare — with the two means; not in
/// an open loop, nor with --lockstep (the same steps by construction).
#[test]
fn a_closed_loop_against_a_baseline_says_how_large_each_schedulers_steps_were() {
    let mut closed = vec!["--baseline", "mutex", "--live", "256"];
    closed.extend_from_slice(SMALL_CLOSED_LOOP);
    let note = |args: &[&str]| {
        let out = stress(args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{text}");
        let run = text
            .split("\nrun\n")
            .nth(1)
            .and_then(|s| s.split("\nCPU").next())
            .unwrap_or_else(|| panic!("no run section in:\n{text}"))
            .to_owned();
        run.contains("closed loop: kvsched's steps scheduled")
            .then_some(run)
    };
    let run = note(&closed).expect("a closed loop with a baseline has the note");
    let mean = |label: &str| -> f64 {
        let line = run
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label} row in:\n{run}"));
        line.split_whitespace()
            .last()
            .and_then(|x| x.parse().ok())
            .unwrap_or_else(|| panic!("{line}"))
    };
    // The note quotes the baseline's mean as the row shows it.
    let baseline = mean("requests scheduled per step");
    assert!(
        run.contains(&format!("against the baseline's {baseline:.1}")),
        "{run}"
    );
    let mut lockstep = closed.clone();
    lockstep.push("--lockstep");
    assert!(note(&lockstep).is_none());
    assert!(note(&[
        "--baseline",
        "mutex",
        "--requests",
        "300",
        "--model-us",
        "50"
    ])
    .is_none());
}
