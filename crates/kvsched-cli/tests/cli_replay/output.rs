//! Output that cannot be written is not bad input: a closed stdout, a full disk, a file-size
//! limit, a reader that goes away.

use std::path::Path;
use std::process::{Command, Output};

use super::common::{sc, temp_file, text, BIN, DOC_EXAMPLE, G1};

/// Runs `kvsched replay FILE` through `sh -c` with the given redirection of stdout.
pub fn run_redirected(redirect: &str) -> Output {
    let doc = temp_file("redirect.json", DOC_EXAMPLE);
    Command::new("sh")
        .arg("-c")
        .arg(format!(r#"exec "$0" replay "$1" {redirect}"#))
        .arg(BIN)
        .arg(doc)
        .output()
        .expect("run sh")
}

#[test]
fn closed_stdout_is_an_output_error() {
    let out = run_redirected(">&-");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        "error: stdout: closed (the output would be lost)\n"
    );
    // `> /dev/null` is a choice, not an error.
    let out = run_redirected("> /dev/null");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn full_disk_is_an_output_error() {
    if !Path::new("/dev/full").exists() {
        return;
    }
    let out = run_redirected("> /dev/full");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error: stdout: ") && stderr.matches('\n').count() == 1,
        "{stderr}"
    );
    assert!(stderr.contains("No space left"), "{stderr}");
}

/// A file-size limit (`ulimit -f`) on the file stdout goes to: the write past it fails like
/// any failed write, one `error:` line and exit 1. Before, `SIGXFSZ` killed the process (exit
/// 153, no message, the output cut short).
#[test]
fn a_file_size_limit_is_an_output_error() {
    let path = temp_file("fsize.json", &big_scenario());
    let out_file = path.with_extension("out");
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -f 1 && exec "$0" replay "$1" > "$2""#)
        .arg(BIN)
        .arg(&path)
        .arg(&out_file)
        .output()
        .expect("run sh");
    assert_eq!(out.status.code(), Some(1), "{:?}", out.status);
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error: stdout: ") && stderr.matches('\n').count() == 1,
        "{stderr}"
    );
    assert!(stderr.contains("too large"), "{stderr}");
}

/// A scenario of 3,000 requests: its outcome is larger than a pipe's buffer.
fn big_scenario() -> String {
    let requests = (0..3_000)
        .map(|i| {
            format!(
                r#"{{"id":"request-{i}","class":"async","num_computed_tokens":32,"block_tables":[[{},{}]]}}"#,
                2 * i + 1,
                2 * i + 2
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    sc(G1, &format!("[{requests}]"), r#","invalid_blocks":[]"#)
}

/// A reader that goes away (`| head -c 10`): exit 141, quietly.
#[test]
fn broken_pipe_exits_quietly() {
    // An outcome larger than a pipe's buffer, so the write meets the closed pipe.
    let path = temp_file("broken_pipe.json", &big_scenario());
    // kvsched's own status, from inside the pipeline.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"{ "$0" replay "$1"; echo "kvsched=$?" >&2; } | head -c 10 > /dev/null"#)
        .arg(BIN)
        .arg(&path)
        .output()
        .expect("run sh");
    let stderr = text(&out.stderr);
    assert_eq!(stderr.trim_end(), "kvsched=141", "{stderr}");
}
