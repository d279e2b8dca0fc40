//! Shared by the Redis tests: the skip rule, test chunks, certificates, polling.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kvsched::kv::ChunkKey;

/// Whether a test that needs `tool` must skip: `tool` is missing and `CI` is unset (then it
/// prints that it did not run). With `CI` set a missing tool fails the test.
pub fn missing(tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if found {
        return false;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{tool} is not on PATH and CI is set: the Redis tests must run in CI");
    }
    // Straight to the process's stderr (not `eprintln!`, which the test harness captures and
    // hides for a passing test), so the run shows what did not run.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {tool} is not on PATH; this Redis test did not run"
    );
    true
}

/// `n` chunks of `size` bytes with distinct keys and contents derived from `seed`.
pub fn chunks(seed: u64, n: usize, size: usize) -> Vec<(ChunkKey, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let key = ChunkKey::chain(ChunkKey(u128::from(seed)), seed, 0, &[i as u32]);
            let mut x = key.0 as u64 | 1;
            let value = (0..size)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            (key, value)
        })
        .collect()
}

/// Calls `f` until it returns `Some`, at most until `limit` from now (then panics naming
/// `what`). A liveness bound, not a timing assertion.
pub fn eventually<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A CA and a server certificate for 127.0.0.1/localhost signed by it, made with the
/// `openssl` command in `dir`: (ca.crt, server.crt, server.key).
pub fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=kvsched test CA",
    ]);
    run(&ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    run(&csr);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write ext.cnf");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    (
        dir.join("ca.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
    )
}

/// The integer after `field:` in an `INFO` text.
pub fn info_field(info: &str, field: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}
