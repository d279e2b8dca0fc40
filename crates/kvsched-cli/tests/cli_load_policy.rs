//! `kvsched stress --load-policy`: `never` loads no hit, `always` every one, and `cost` stops
//! loading from a tier whose loads fail and keeps loading from one whose loads pay; the JSON's
//! `load_policy` section says what was recomputed; bad values exit 2 naming the flag.

mod stress_common;
use stress_common::*;

/// A small run on the sim store (three quarters of each prompt held) under `policy`, its
/// engine recomputing `rate` tokens a second, with `extra` flags. Arrivals are slow enough
/// (200 requests over 2 s, four workers) that loads do not queue behind each other.
fn run(policy: &str, rate: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "--json",
        "--requests",
        "200",
        "--rate",
        "100",
        "--duration",
        "60",
        "--model-us",
        "50",
        "--workers",
        "4",
        "--load-policy",
        policy,
        "--compute-rate",
        rate,
        // The warmed workload: 16 prefixes in a large pool, the sim store holding three
        // quarters of each prompt, so every request has a hit to load.
        "--hit-ratio",
        "0.75",
        "--prefixes",
        "16",
        "--pool-blocks",
        "131072",
    ];
    args.extend_from_slice(extra);
    let v = json_of(&stress_guarded(&args, Duration::from_secs(300)));
    assert_eq!(
        get(&v, "invariants.ok"),
        &Value::Bool(true),
        "{policy}: {v}"
    );
    for k in [
        "declined_requests",
        "declined_tokens",
        "probes",
        "estimate_samples",
    ] {
        count(&v, &format!("load_policy.{k}"));
    }
    assert!(get(&v, "load_policy.time_to_first_token_us.p99").is_number());
    v
}

#[test]
fn never_loads_nothing_and_says_what_it_recomputed() {
    let v = run("never", "1000000", &[]);
    assert_eq!(count(&v, "loads.dispatched"), 0);
    assert!(count(&v, "load_policy.declined_requests") > 0, "{v}");
    assert!(count(&v, "load_policy.declined_tokens") > 0, "{v}");
    assert_eq!(count(&v, "load_policy.probes"), 0);
}

#[test]
fn cost_stops_loading_from_a_failing_tier_and_always_does_not() {
    // Every sim-store load damages a chunk: each failed load leaves its tokens to recompute.
    // With a slow engine (10 ms a token) the load time itself is cheap: only the failures make
    // loading cost more than recomputing. (Planted bug `cost-ignores-failures` loads them.)
    let failing = ["--failure-rate", "1"];
    let always = run("always", "100", &failing);
    let cost = run("cost", "100", &failing);
    assert_eq!(count(&always, "load_policy.declined_requests"), 0);
    assert!(count(&always, "loads.failed") > 0, "{always}");
    assert!(count(&cost, "load_policy.estimate_samples") > 0, "{cost}");
    assert!(
        get(&cost, "load_policy.estimate_failure").as_f64() > Some(0.5),
        "{cost}"
    );
    assert!(count(&cost, "load_policy.declined_requests") > 0, "{cost}");
    assert!(
        count(&cost, "loads.dispatched") < count(&always, "loads.dispatched"),
        "cost {cost}\nalways {always}"
    );
}

#[test]
fn cost_loads_every_hit_of_a_tier_that_pays() {
    // 10 ms a token to recompute against sim loads of at most 500 µs (and what a loaded
    // machine adds to them): every load pays.
    let v = run("cost", "100", &["--failure-rate", "0"]);
    assert!(count(&v, "loads.dispatched") > 0, "{v}");
    assert_eq!(count(&v, "load_policy.declined_requests"), 0, "{v}");
    assert_eq!(count(&v, "load_policy.probes"), 0, "{v}");
}

#[test]
fn bad_values_are_refused_naming_the_flag() {
    assert_refused(&["--load-policy", "sometimes"], "--load-policy", "always");
    assert_refused(&["--compute-rate", "0"], "--compute-rate", "≥ 0.001");
    assert_refused(&["--compute-rate", "inf"], "--compute-rate", "≥ 0.001");
    assert_refused(&["--compute-rate", "1e-300"], "--compute-rate", "≥ 0.001");
}
