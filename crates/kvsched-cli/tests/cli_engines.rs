//! `kvsched stress --engines N` against a Redis server: engines load the chunks other
//! engines saved, every engine accounts for every request, a server restart in the middle
//! is ridden out, the engines die with the parent, and combinations with nothing to share
//! are refused. Skipped (with a message) without `redis-server`, unless `CI` is set. Small
//! runs keep it fast in debug builds.

#[path = "../../kvsched-testkit/tests/redis_common/mod.rs"]
mod redis_common;

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use redis_common::{eventually, missing};
use serde_json::Value;

/// A hang guard, many times what a run here needs; not a timing assertion.
const LIMIT: Duration = Duration::from_secs(120);

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .arg("stress")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kvsched")
}

/// Runs `kvsched stress ARGS` to its end (killed and failed after [`LIMIT`]).
fn stress(args: &[&str]) -> Output {
    let mut child = spawn(args);
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvsched stress {args:?} still running after {LIMIT:?}: hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    }
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The JSON report of `kvsched stress ARGS`, which must have succeeded.
fn succeeded(args: &[&str]) -> Value {
    let out = stress(args);
    let r = json(&out);
    assert!(
        out.status.success(),
        "{:?}: {r:#}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    r
}

/// Each engine's requests add up, and the parent says so.
fn assert_accounted(r: &Value, engines: usize, requests: u64) {
    assert_eq!(r["every_request_accounted"], Value::Bool(true), "{r:#}");
    let rows = r["per_engine"].as_array().expect("per_engine");
    assert_eq!(rows.len(), engines);
    for row in rows {
        let n = |k: &str| row[k].as_u64().unwrap_or_else(|| panic!("{k} in {row}"));
        assert_eq!(n("submitted"), requests, "{row}");
        assert_eq!(
            n("finished") + n("failed") + n("cancelled"),
            requests,
            "{row}"
        );
        assert_eq!(row["accounted"], Value::Bool(true));
        assert_eq!(row["exit_code"], Value::from(0));
    }
}

/// A small closed-loop run whose pool (256 blocks) holds fewer requests than are live (128),
/// so admissions wait and are looked up again, and cached prefixes are evicted: the lookups
/// that find another engine's chunks. (With a pool that holds the whole run, each engine's
/// own prefix cache answers and the shared store is barely read.)
const SMALL: &[&str] = &[
    "--requests",
    "400",
    "--rate",
    "max",
    "--live",
    "128",
    "--model-us",
    "0",
    "--prompt-tokens",
    "128",
    "--pool-blocks",
    "256",
    "--duration",
    "60",
];

/// Engines load what other engines saved, and each accounts for every request. On a user's
/// server (`redis://`, never flushed), a first run of two engines saves its chunks; the next
/// run's engines start with empty pools, probe the store and load what the first run saved.
/// (The two engines of one run compute the same seeded prompts at the same moments, so
/// whether one finds the other's chunks before computing them itself is a race: a run
/// after another is not.)
#[test]
fn engines_load_the_chunks_other_engines_saved_and_account_for_every_request() {
    if missing("redis-server") {
        return;
    }
    use kvsched_testkit::redis::{LocalRedis, LocalRedisOptions};
    let server = LocalRedis::start(LocalRedisOptions::new()).expect("start redis-server");
    let url = server.url();
    let run = || {
        let mut args = vec!["--store", url.as_str(), "--engines", "2", "--json"];
        args.extend(SMALL);
        let r = succeeded(&args);
        assert_accounted(&r, 2, 400);
        assert_eq!(r["invariants"]["ok"], Value::Bool(true));
        assert_eq!(r["server"]["owned"], Value::Bool(false));
        r
    };
    run();
    let r = run();
    let hits = r["sum"]["cross_engine_hits"]
        .as_u64()
        .expect("cross_engine_hits");
    assert!(hits > 0, "no engine loaded a chunk another saved: {r:#}");
    let per: u64 = r["per_engine"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| row["cross_engine_hits"].as_u64().expect("hits"))
        .sum();
    assert_eq!(per, hits);
}

#[test]
fn the_engines_ride_out_a_server_restart() {
    if missing("redis-server") {
        return;
    }
    // An open-loop run of about 2 s, so the restart comes in the middle of it.
    let args = [
        "--store",
        "redis",
        "--engines",
        "2",
        "--redis-restarts",
        "1",
        "--json",
        "--requests",
        "600",
        "--rate",
        "300",
        "--model-us",
        "0",
        "--prompt-tokens",
        "128",
        "--pool-blocks",
        "256",
        "--duration",
        "60",
    ];
    let r = succeeded(&args);
    assert_eq!(r["redis_restarts"]["requested"], Value::from(1));
    assert_eq!(r["redis_restarts"]["done"], Value::from(1), "{r:#}");
    assert_accounted(&r, 2, 600);
    // Each engine kept using the store after the restart (its saves run all along), so each
    // lost its connections to the old process and made new ones.
    for row in r["per_engine"].as_array().expect("rows") {
        assert!(
            row["reconnects"].as_u64().expect("reconnects") >= 1,
            "{row}"
        );
    }
}

#[test]
fn the_engines_die_with_the_parent() {
    if missing("redis-server") {
        return;
    }
    // A seed no other test uses marks this run's engines in the process table.
    let seed = "918273645";
    /// Kills the parent if the test fails before it does.
    struct Parent(Child);
    impl Drop for Parent {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut parent = Parent(spawn(&[
        "--store",
        "redis",
        "--engines",
        "2",
        "--requests",
        "1000000",
        "--rate",
        "50",
        "--duration",
        "600",
        "--seed",
        seed,
    ]));
    let engines = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .filter(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.contains(&&b"--engine-index"[..])
                    && args
                        .windows(2)
                        .any(|w| w == [&b"--seed"[..], seed.as_bytes()])
            })
            .count()
    };
    // The parent's server runs in its directory, whose name names the parent.
    let prefix = format!("kvsched-redis-{}-", parent.0.id());
    let servers = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path().join("cwd")).ok())
            .filter(|d| {
                d.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
            })
            .count()
    };
    eventually("both engines running", LIMIT, || {
        (engines() == 2).then_some(())
    });
    assert_eq!(servers(), 1, "the parent's server");
    parent.0.kill().expect("kill the parent");
    parent.0.wait().expect("reap the parent");
    eventually("the engines gone with their parent", LIMIT, || {
        (engines() == 0).then_some(())
    });
    eventually("the server gone with its parent", LIMIT, || {
        (servers() == 0).then_some(())
    });
    // A parent killed this way leaves the server's directory behind (nothing ran its
    // drop): remove it.
    for e in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[test]
fn nothing_to_share_is_refused_in_one_line() {
    if missing("redis-server") {
        return;
    }
    for (args, flag) in [
        (&["--engines", "2"][..], "--engines: "),
        (&["--engines", "2", "--store", "memory"][..], "--engines: "),
        (
            &["--store", "redis://127.0.0.1:1", "--redis-restarts", "1"][..],
            "--redis-restarts: ",
        ),
        (
            &["--engines", "17", "--store", "redis"][..],
            "invalid value '17' for '--engines <N>'",
        ),
    ] {
        let out = stress(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("error: {flag}")),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty());
    }
}
