//! `kvsched stress` under pool pressure across shards: two shards sharing a 41-block pool
//! (shared prefixes make each hold part of it) must finish every request. Before cross-shard
//! preemption the run finished 24 of 300 and timed out. The child runs under a hang guard
//! (killed after two minutes), never a timing assertion.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Runs `kvsched ARGS`, killing it if it has not exited within two minutes.
fn run_guarded(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kvsched");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            return (
                status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            );
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("kvsched {args:?}: hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_shards_on_a_small_pool_finish_every_request() {
    // Several seeds, in lockstep (every load lands before the next step, so whether the shards
    // stall depends on the seed alone, not on when workers finish). Which seeds stall depends
    // on which shard each request id lands on (with xxh3-64 routing and server-shaped ids,
    // seeds 8 and 10 of these do), so the test counts the stalls it met: seeds that stall
    // nowhere would no longer test cross-shard preemption.
    let preempted: u64 = (1..=10)
        .map(|seed| two_shards_finish(&seed.to_string()))
        .sum();
    assert!(
        preempted > 0,
        "no seed stalled the two shards: the workload no longer needs cross-shard preemption"
    );
}

/// Runs the workload on `seed` and returns its cross-shard preemptions.
fn two_shards_finish(seed: &str) -> u64 {
    let args = [
        "stress",
        "--seed",
        seed,
        "--lockstep",
        "--requests",
        "300",
        "--pool-blocks",
        "41",
        "--shards",
        "2",
        "--cancel-ratio",
        "0",
        "--duration",
        "60",
        // Liveness, not bytes: the KV bytes still move, unread (a debug build verifies slowly).
        "--verify",
        "off",
        "--json",
    ];
    let (code, out) = run_guarded(&args);
    assert_eq!(code, Some(0), "seed {seed}: {out}");
    let v: Value = serde_json::from_str(&out).expect("json report");
    assert_eq!(v["requests"]["submitted"], 300);
    assert_eq!(
        v["requests"]["finished"], 300,
        "seed {seed}: {}",
        v["requests"]
    );
    assert_eq!(v["timed_out"], false);
    assert_eq!(v["invariants"]["ok"], true);
    v["events"]["cross_shard_preemptions"]
        .as_u64()
        .expect("cross_shard_preemptions")
}

/// `--duration` bounds the whole run: loads held up by a slow store (`slow=1`: every chunk
/// read delayed 4× a 60 s load deadline) stop waiting when the duration is up, and the
/// human report says the run hit it. Before, the run lasted the load deadline (60 s).
#[test]
fn duration_bounds_a_run_whose_loads_wait_on_a_slow_store() {
    for (deadline, store) in [("60000", "memory"), ("5000", "memory")] {
        let t = Instant::now();
        let (code, out) = run_guarded(&[
            "stress",
            "--store",
            store,
            "--faults",
            "slow=1",
            "--load-deadline-ms",
            deadline,
            "--duration",
            "2",
        ]);
        let wall = t.elapsed();
        assert_eq!(code, Some(0), "{out}");
        assert!(
            wall < Duration::from_millis(4500),
            "--load-deadline-ms {deadline}: {wall:?} for --duration 2"
        );
        let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat.contains("the run hit --duration 2 s"), "{out}");
    }
}
