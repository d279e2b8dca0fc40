//! Hostile inputs: memory and time in proportion to the input. Each runs the binary in a child
//! under a virtual-memory limit (`ulimit -v` through `sh -c`) with a hang guard: a child still
//! running after the guard is killed and the test fails. No timing is asserted.

use std::path::Path;
use std::process::{Command, Stdio};

use super::common::{assert_bad, run, temp_file, text, BIN, DOC_EXAMPLE};

/// The outcome of a guarded run.
pub struct Guarded {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

/// Runs `kvsched ARGS` under `ulimit -v LIMIT_KIB`, with `stdin` as its standard input (a
/// file, or nothing), killed after `guard`.
pub fn run_guarded(
    limit_kib: u64,
    guard: std::time::Duration,
    args: &[&str],
    stdin: Option<&Path>,
) -> Guarded {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"ulimit -v "$1" || exit 99; shift; exec "$@""#)
        .arg("sh")
        .arg(limit_kib.to_string())
        .arg(BIN)
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match stdin {
        Some(p) => cmd.stdin(std::fs::File::open(p).expect("stdin file")),
        None => cmd.stdin(Stdio::null()),
    };
    let mut child = cmd.spawn().expect("spawn sh");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut v).ok();
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut v).ok();
        v
    });
    let deadline = std::time::Instant::now() + guard;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvsched {args:?} still running after {guard:?}: killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stdout = reader.join().expect("stdout reader");
    let stderr = text(&err_reader.join().expect("stderr reader"));
    assert_ne!(status.code(), Some(99), "ulimit -v failed: {stderr}");
    Guarded {
        code: status.code(),
        stdout,
        stderr,
    }
}

pub const GUARD: std::time::Duration = std::time::Duration::from_secs(120);

/// `n` full-attention groups, no requests, each group reporting `[1, 16777215]`.
pub fn many_groups_scenario(n: usize) -> String {
    let groups = vec![r#"{"kind":"full_attention","block_size":16}"#; n].join(",");
    let lists = vec!["[1,16777215]"; n].join(",");
    format!(r#"{{"groups":[{groups}],"requests":[],"invalid_blocks_by_group":[{lists}]}}"#)
}

/// 1,000 groups each reporting two far-apart ids (55 KB of JSON) once peaked at 2.3 GB (a
/// bitmap over the id range per group, each with a copy of the flat list): now under 50 MB,
/// and 10,000 groups under 100 MB.
#[test]
fn many_reporting_groups_stay_small() {
    for (n, limit_mib) in [(1_000usize, 50u64), (10_000, 100)] {
        let path = temp_file(&format!("groups_{n}.json"), &many_groups_scenario(n));
        let out = run_guarded(
            limit_mib << 10,
            GUARD,
            &["replay", path.to_str().expect("utf-8 path")],
            None,
        );
        assert_eq!(out.code, Some(0), "{n} groups: {}", out.stderr);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON outcome");
        assert_eq!(v["requests"], serde_json::json!([]));
    }
    // With requests, and the flat list shared by every group.
    let n = 2_000;
    let groups = vec![r#"{"kind":"full_attention","block_size":16}"#; n].join(",");
    let tables = (0..n)
        .map(|g| format!("[{},{}]", 2 * g + 1, 16_777_215 - g))
        .collect::<Vec<_>>()
        .join(",");
    let lists = vec!["[3]"; n].join(",");
    let flat = (0..n)
        .map(|g| (2 * g + 1).to_string())
        .collect::<Vec<_>>()
        .join(",");
    let sc = format!(
        r#"{{"mode":"vllm","groups":[{groups}],"requests":[{{"id":"a","class":"async","num_computed_tokens":32,"block_tables":[{tables}]}}],"invalid_blocks":[{flat}],"invalid_blocks_by_group":[{lists}]}}"#
    );
    let path = temp_file("groups_union.json", &sc);
    let out = run_guarded(
        50 << 10,
        GUARD,
        &["replay", path.to_str().expect("utf-8 path")],
        None,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON outcome");
    assert_eq!(v["requests"][0]["num_computed_tokens"], 0);
    assert_eq!(
        v["requests"][0]["claimed_blocks"].as_array().map(Vec::len),
        Some(n)
    );
}

/// Mode `safe` with 60,000 groups of five new hits each (7 MB): the resumable boundary once
/// walked every hit for every group (11 s); now linear.
#[test]
fn safe_mode_with_many_groups_is_linear() {
    let n = 60_000usize;
    let groups = vec![r#"{"kind":"full_attention","block_size":16}"#; n].join(",");
    let mut tables = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(5 * n);
    for g in 0..n {
        let base = 6 * g as u64 + 1;
        tables.push(format!(
            "[{}]",
            (base..base + 6)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ));
        ids.extend((base + 1..base + 6).map(|i| i.to_string()));
    }
    let sc = format!(
        r#"{{"mode":"safe","groups":[{groups}],"requests":[{{"id":"a","class":"async","num_computed_tokens":96,"block_tables":[{}]}}],"invalid_blocks":[{}]}}"#,
        tables.join(","),
        ids.join(",")
    );
    let path = temp_file("safe_many_groups.json", &sc);
    let out = run_guarded(
        400 << 10,
        GUARD,
        &["replay", path.to_str().expect("utf-8 path")],
        None,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON outcome");
    // Earliest new hit at 16 in every group; entry 0 is real everywhere: back to 16.
    assert_eq!(v["requests"][0]["num_computed_tokens"], 16);
    assert_eq!(v["requests"][0]["affected_tokens"], 80);
}

/// An endless input (`/dev/zero`) is cut at the input limit, 256 MiB by default, and is a
/// one-line error with exit 2; so is a huge sparse file, refused before it is read.
#[test]
fn inputs_beyond_the_limit_are_refused() {
    let zero = Path::new("/dev/zero");
    if zero.exists() {
        let out = run_guarded(400 << 10, GUARD, &["replay", "/dev/zero"], None);
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert_eq!(
            out.stderr,
            "error: input: larger than the input limit of 268435456 bytes; raise it with --max-input-bytes\n"
        );
        let out = run_guarded(
            30 << 10,
            GUARD,
            &["replay", "--max-input-bytes", "1000000", "-"],
            Some(zero),
        );
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(
            out.stderr
                .starts_with("error: input: larger than the input limit of 1000000 bytes"),
            "{}",
            out.stderr
        );
    }
    let sparse = std::env::temp_dir().join(format!("kvsched-sparse-{}.json", std::process::id()));
    let f = std::fs::File::create(&sparse).expect("create sparse file");
    f.set_len(100 << 30).expect("a 100 GiB sparse file");
    drop(f);
    let out = run_guarded(
        30 << 10,
        GUARD,
        &["replay", sparse.to_str().expect("utf-8 path")],
        None,
    );
    let _ = std::fs::remove_file(&sparse);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .starts_with("error: input: larger than the input limit"),
        "{}",
        out.stderr
    );
    // The limit is exact and can be raised.
    let doc = temp_file("limit.json", DOC_EXAMPLE);
    let doc = doc.to_str().expect("utf-8 path");
    let n = DOC_EXAMPLE.len().to_string();
    let below = (DOC_EXAMPLE.len() - 1).to_string();
    let ok = run(&["replay", "--max-input-bytes", &n, doc], b"");
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    let out = run(&["replay", "--max-input-bytes", &below, doc], b"");
    assert_bad(
        &out,
        "input",
        "larger than the input limit",
        "one byte over",
    );
    let out = run(
        &["replay", "--max-input-bytes", &below, "-"],
        DOC_EXAMPLE.as_bytes(),
    );
    assert_bad(
        &out,
        "input",
        "larger than the input limit",
        "one byte over, stdin",
    );
    let out = run(&["replay", "--max-input-bytes", "0", doc], b"");
    assert_eq!(out.status.code(), Some(2));
    // The limit itself is bounded: an input is held in memory whole, so `u64::MAX` over
    // `/dev/zero` would read without end.
    let out = run(
        &[
            "replay",
            "--max-input-bytes",
            "18446744073709551615",
            "/dev/zero",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--max-input-bytes"));
}

/// A closed standard input reads as empty input.
#[test]
fn closed_stdin_is_empty_input() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"exec "$0" replay - <&-"#)
        .arg(BIN)
        .output()
        .expect("run sh");
    assert_bad(&out, "input", "empty input", "closed stdin");
}

/// `--bench N` takes 1 to 1,000,000 runs.
#[test]
fn bench_runs_are_capped() {
    let out = run(
        &["replay", "--bench", "1000001", "-"],
        DOC_EXAMPLE.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("1 to 1000000"),
        "{}",
        text(&out.stderr)
    );
}
