//! What every `kvsched replay` test uses: the binary run on arguments and standard input,
//! the annotated example of docs/replay.md and its outcome, temporary files, and the
//! assertion that an input is refused with one line naming its field.

use std::io::Write;
use std::process::{Command, Output, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_kvsched");

/// The annotated example scenario of docs/replay.md, verbatim.
pub const DOC_EXAMPLE: &str = r#"{
  "mode": "vllm",
  "policy": "recompute",
  "null_block_id": 0,
  "scheduler_block_size": 16,
  "groups": [ {"kind": "full_attention", "block_size": 16},
              {"kind": "mamba", "block_size": 16, "mamba_mode": "align"} ],
  "requests": [
    {"id": "a", "class": "async", "num_computed_tokens": 144,
     "block_tables": [[101,102,103,104,105,106,107,108,109], [0,0,0,0,0,0,0,0,201]]},
    {"id": "s", "class": "sync", "num_computed_tokens": 48, "num_scheduled_tokens": 16,
     "block_tables": [[1,2,3], [0,0,9]]}
  ],
  "invalid_blocks": [104]
}
"#;

/// Its outcome, as the tool prints it (pretty, 2-space indent, trailing newline).
pub const DOC_OUTCOME: &str = r#"{
  "affected": [
    "a"
  ],
  "skip": [],
  "failed": [],
  "failed_recving": [
    "a"
  ],
  "total_affected_tokens": 96,
  "evicted_blocks": [],
  "requests": [
    {
      "id": "a",
      "affected": true,
      "num_computed_tokens": 48,
      "affected_tokens": 96,
      "claimed_blocks": [
        104
      ],
      "waits_for": [],
      "num_computed_tokens_in": 144,
      "pre_step_tokens": 144
    },
    {
      "id": "s",
      "affected": false,
      "num_computed_tokens": 48,
      "affected_tokens": 0,
      "claimed_blocks": [],
      "waits_for": [],
      "num_computed_tokens_in": 48,
      "pre_step_tokens": 32
    }
  ]
}
"#;

pub fn run(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvsched");
    {
        let mut input = child.stdin.take().expect("stdin");
        // The binary may exit before reading everything (e.g. on a bad argument).
        let _ = input.write_all(stdin);
    }
    child.wait_with_output().expect("wait for kvsched")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes `contents` to `name` in this run's scratch directory, under cargo's target dir (so
/// nothing is left in the system's temporary directory).
pub fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    // A directory per call: tests run in parallel, and two writing the same name would
    // truncate the file under each other's child process.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kvsched-cli-replay-{}", std::process::id()))
        .join(call.to_string());
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write temp file");
    path
}

/// Asserts exit code 2, empty stdout and exactly one stderr line `error: {field}: …problem…`.
pub fn assert_bad(out: &Output, field: &str, problem: &str, what: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{what}: expected exit code 2, got {:?}; stderr: {stderr}",
        out.status
    );
    assert!(out.stdout.is_empty(), "{what}: stdout not empty");
    assert!(
        stderr.ends_with('\n') && stderr.matches('\n').count() == 1,
        "{what}: stderr is not exactly one line: {stderr:?}"
    );
    let line = stderr.trim_end();
    let prefix = format!("error: {field}: ");
    assert!(
        line.starts_with(&prefix),
        "{what}: expected the message to start with {prefix:?}, got {line:?}"
    );
    assert!(
        line[prefix.len()..].contains(problem),
        "{what}: expected the problem to mention {problem:?}, got {line:?}"
    );
    assert!(!line.contains("panicked"), "{what}: {line}");
}

pub const G1: &str = r#"[{"kind":"full_attention","block_size":16}]"#;
pub const G2: &str =
    r#"[{"kind":"full_attention","block_size":16},{"kind":"full_attention","block_size":16}]"#;
pub const R1: &str =
    r#"[{"id":"a","class":"async","num_computed_tokens":32,"block_tables":[[1,2]]}]"#;
pub const REPORT: &str = r#","invalid_blocks":[1]"#;

/// A scenario with the given groups, requests and trailing top-level fields.
pub fn sc(groups: &str, requests: &str, tail: &str) -> String {
    format!(r#"{{"groups":{groups},"requests":{requests}{tail}}}"#)
}

pub fn group(g: &str) -> String {
    sc(&format!("[{g}]"), "[]", REPORT)
}

pub fn request(r: &str) -> String {
    sc(G1, &format!("[{r}]"), REPORT)
}

/// `text` as UTF-16 little-endian, with or without a byte order mark.
pub fn utf16(text: &str, bom: bool) -> Vec<u8> {
    let mut out = if bom { vec![0xff, 0xfe] } else { vec![] };
    for unit in text.encode_utf16() {
        out.extend_from_slice(&unit.to_le_bytes());
    }
    out
}
