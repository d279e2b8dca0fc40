//! `kvsched stress --store redis` (feature `redis`): the stress tool starts its own
//! `redis-server` on a free loopback port, moves and verifies real bytes through it, and
//! stops it at exit; a second scheduler (the baseline) and a cluster run the same way.
//! Skipped (with a message) without `redis-server`, unless `CI` is set.

#[path = "../../kvsched-testkit/tests/redis_common/mod.rs"]
mod redis_common;

use std::process::Command;

use redis_common::missing;
use serde_json::Value;

fn stress_json(extra: &[&str]) -> Value {
    stress_json_on("redis", extra)
}

/// [`stress_json`] on the store `store`.
fn stress_json_on(store: &str, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .args(["stress", "--json", "--store", store])
        // Prefixes shared by many requests, a pool holding few of them: later requests load
        // what earlier ones saved.
        .args([
            "--requests",
            "300",
            "--rate",
            "3000",
            "--model-us",
            "50",
            "--pool-blocks",
            "300",
            "--prefix-share",
            "0.9",
            "--prefixes",
            "16",
            "--seed",
            "7",
            "--duration",
            "30",
        ])
        .args(extra)
        .output()
        .expect("run kvsched");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

fn count(v: &Value, path: &str) -> u64 {
    path.split('.')
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path} is not a count: {v}"))
}

#[test]
fn a_private_redis_store_moves_and_verifies_real_bytes() {
    if missing("redis-server") {
        return;
    }
    let v = stress_json(&["--baseline", "mutex", "--redis-maxmemory", "64M"]);
    assert_eq!(v["config"]["store"], "redis");
    for run in [&v, &v["baseline"]] {
        assert_eq!(run["invariants"]["ok"], Value::Bool(true), "{run}");
        assert_eq!(count(run, "kv.garbage_reads"), 0, "{run}");
        for k in ["chunks_saved", "kv_bytes_loaded", "kv_bytes_verified"] {
            assert!(count(run, &format!("kv.{k}")) > 0, "kv.{k}: {run}");
        }
        // Each run starts on an emptied server, and nothing failed on the way.
        assert_eq!(count(run, "kv.chunks_loaded_from_others"), 0, "{run}");
        assert_eq!(count(run, "kv.tier_errors"), 0, "{run}");
        // The tier's own traffic: round trips, and no trouble on one healthy server.
        assert!(count(run, "kv.redis.round_trips") > 0, "{run}");
        for k in ["redirects", "slot_refreshes", "timeouts", "protocol_errors"] {
            assert_eq!(
                count(run, &format!("kv.redis.{k}")),
                0,
                "kv.redis.{k}: {run}"
            );
        }
    }
}

#[test]
fn store_faults_damage_the_redis_store_and_are_caught() {
    if missing("redis-server") {
        return;
    }
    let v = stress_json(&["--faults", "corrupt=0.2,evict=0.05"]);
    assert_eq!(v["invariants"]["ok"], Value::Bool(true), "{v}");
    assert_eq!(count(&v, "kv.garbage_reads"), 0, "{v}");
    assert!(count(&v, "faults_injected.corrupt") > 0, "{v}");
    assert!(count(&v, "faults_injected.evict") > 0, "{v}");
    // An evicted chunk is missing at its load; a damaged one is refused by its checks.
    assert!(count(&v, "kv.missing_chunks") > 0, "{v}");
    let refused = count(&v, "kv.checksum_failures")
        + count(&v, "kv.format_errors")
        + count(&v, "kv.key_mismatches");
    assert!(refused > 0, "{v}");
}

/// A user's server (`--store redis://…`) with a password, started here.
fn users_server() -> kvsched_testkit::redis::LocalRedis {
    use kvsched_testkit::redis::{LocalRedis, LocalRedisOptions};
    LocalRedis::start(LocalRedisOptions::new().requirepass("right")).expect("start redis-server")
}

/// `kvsched stress ARGS`: exit code, stderr, stdout, wall time.
fn run(args: &[&str]) -> (Option<i32>, String, String, std::time::Duration) {
    let t = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .arg("stress")
        .args(args)
        .output()
        .expect("run kvsched");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        t.elapsed(),
    )
}

#[test]
fn a_wrong_password_is_one_line_and_exit_2_with_engines_too() {
    if missing("redis-server") {
        return;
    }
    let srv = users_server();
    let url = format!("redis://u:wrong@{}", srv.addr());
    for extra in [&[][..], &["--engines", "2"][..]] {
        let mut args = vec!["--store", url.as_str(), "--duration", "5"];
        args.extend_from_slice(extra);
        let (code, err, out, _) = run(&args);
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{extra:?}: not one line: {err:?}");
        assert!(err.starts_with("error: --store: "), "{extra:?}: {err}");
        assert!(!err.contains("wrong"), "{extra:?}: {err}");
        assert!(!out.contains("invariant"), "{extra:?}: a report: {out}");
    }
}

#[test]
fn store_faults_are_refused_on_a_users_server_and_it_is_left_untouched() {
    if missing("redis-server") {
        return;
    }
    let srv = users_server();
    let url = format!("redis://:right@{}", srv.addr());
    for faults in ["corrupt=0.1", "truncate=0.1", "evict=0.1", "slow=0.1"] {
        for extra in [&[][..], &["--engines", "2"][..]] {
            let mut args = vec!["--store", url.as_str(), "--faults", faults];
            args.extend_from_slice(extra);
            let (code, err, _, _) = run(&args);
            assert_eq!(code, Some(2), "{faults} {extra:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{faults} {extra:?}: {err:?}");
            assert!(
                err.starts_with("error: --faults: "),
                "{faults} {extra:?}: {err}"
            );
        }
    }
    assert_eq!(
        srv.query(&["DBSIZE"]).as_deref(),
        Ok("0"),
        "nothing written"
    );
    // Other faults still run there, and store faults on the private server `--engines`
    // owns (its engines get a redis:// URL of it).
    let (code, err, _, _) = run(&["--store", &url, "--faults", "panic=0.01", "--duration", "1"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err, _, _) = run(&[
        "--store",
        "redis",
        "--engines",
        "2",
        "--faults",
        "evict=0.05",
        "--duration",
        "1",
    ]);
    assert_eq!(code, Some(0), "{err}");
}

/// A `redis://` URL's `max_value_bytes` holds: values over it are refused (the run's saves
/// fail, named), where the stress tool used to replace it with the largest chunk's size and
/// store them.
#[test]
fn the_urls_max_value_bytes_bounds_what_the_run_stores() {
    if missing("redis-server") {
        return;
    }
    use kvsched_testkit::redis::{LocalRedis, LocalRedisOptions};
    let server = LocalRedis::start(LocalRedisOptions::new()).expect("start redis-server");
    let url = format!("{}?max_value_bytes=64", server.url());
    let v = stress_json_on(&url, &[]);
    assert_eq!(count(&v, "kv.chunks_saved"), 0, "{v}");
    assert!(count(&v, "kv.saves_failed") > 0, "{v}");
    let why = v["kv"]["save_error"].as_str().unwrap_or_default();
    assert!(why.contains("over max_value_bytes 64"), "{why}");
}
