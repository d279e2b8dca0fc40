//! `kvsched stress --store redis://…` against a store that stops answering (feature `redis`):
//! a fake server here answers the tool's `PING` and never any data command, and the URL's
//! `timeout_ms=60000` lets each call wait a minute. `--duration` still bounds the run, with
//! `--lockstep` too, and the report comes a few seconds after it. Each child runs under a hang
//! guard (killed after three minutes); the bounds asserted are several times what is
//! expected, far below what the waits were before.

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvsched_testkit::redis::resp::{bulk, read_command};
use serde_json::Value;

/// A loopback server that answers each `PING` with `+PONG` and each `ECHO` (which closes
/// every pipeline the tier sends) with its argument, and swallows everything else
/// unanswered: a Redis whose data commands hang. Runs until the test process ends.
fn silent_store() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            std::thread::spawn(move || swallow(conn));
        }
    });
    format!("redis://{addr}?timeout_ms=60000")
}

fn swallow(conn: TcpStream) {
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    while let Some(cmd) = read_command(&mut r) {
        let reply = match cmd.first().map(|c| c.to_ascii_uppercase()).as_deref() {
            Some(b"PING") => b"+PONG\r\n".to_vec(),
            Some(b"ECHO") if cmd.len() == 2 => bulk(&cmd[1]),
            // A data command: never answered (nor is the rest of its pipeline).
            _ => {
                let mut rest = Vec::new();
                let _ = r.read_to_end(&mut rest);
                return;
            }
        };
        if w.write_all(&reply).is_err() {
            return;
        }
    }
}

/// Runs `kvsched stress ARGS --json`: the report and the wall time, killing the child if it
/// has not exited within three minutes.
fn stress_guarded(args: &[&str]) -> (Value, Duration) {
    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .arg("stress")
        .args(args)
        .args(["--json", "--verify", "off"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvsched");
    let deadline = t + Duration::from_secs(180);
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("kvsched {args:?}: hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall = t.elapsed();
    let out = child.wait_with_output().expect("output");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: exit {:?}, stderr {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (report, wall)
}

fn elapsed(v: &Value) -> Duration {
    Duration::from_secs_f64(v["elapsed_s"].as_f64().expect("elapsed_s"))
}

/// `--lockstep` waits before each step for the saves offered to be stored: at most until
/// `--duration` is up. Before, it waited for them however long the store took: a run of
/// `--duration 3` lasted over a minute (the URL's call timeout), with no bound on a store
/// without one.
#[test]
fn lockstep_ends_at_duration_on_a_store_that_stopped_answering() {
    let url = silent_store();
    let (v, _) = stress_guarded(&[
        "--store",
        &url,
        "--lockstep",
        "--requests",
        "20000",
        "--duration",
        "3",
    ]);
    assert_eq!(v["timed_out"], true, "{}", v["elapsed_s"]);
    let took = elapsed(&v);
    assert!(took < Duration::from_secs(20), "the run took {took:?}");
}

/// After the run, the saves get 2 s to be stored and a save thread stuck in the store 2 s
/// more: the report comes about 4 s after the run's end. Before, the connector's drop waited
/// the library's 10 s for the save thread and then 10 s more for the probe thread (22 s).
#[test]
fn a_store_that_stopped_answering_holds_the_report_a_few_seconds() {
    let url = silent_store();
    let (v, wall) = stress_guarded(&["--store", &url, "--requests", "20000", "--duration", "3"]);
    let after = wall.saturating_sub(elapsed(&v));
    assert!(
        after < Duration::from_secs(9),
        "the report came {after:?} after the run ({wall:?} in all)"
    );
}
