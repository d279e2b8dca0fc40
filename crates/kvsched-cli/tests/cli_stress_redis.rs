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
    let out = Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .args(["stress", "--json", "--store", "redis"])
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
