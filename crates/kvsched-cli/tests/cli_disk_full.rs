//! `kvsched stress --store disk=DIR` on a file system that fills up or is read-only (a small
//! tmpfs; skipped with a message where it cannot be mounted): a full disk makes the tier
//! evict to what fits and saves go on; a read-only one makes saves fail, counted per chunk,
//! shown in the human report, and saving pauses instead of trying every chunk. Under a
//! file-size limit (`ulimit -f`) writes past it fail like any other, never the process.

use std::path::Path;
use std::process::Command;

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let opts = format!("size={size}");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
            .arg(dir.path())
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!("skipped: cannot mount a tmpfs (needs root)");
            return None;
        }
        Some(Tmpfs(dir))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn read_only(&self) {
        let o = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(self.path())
            .output()
            .expect("remount");
        assert!(o.status.success(), "{o:?}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).output();
    }
}

fn stress(dir: &Path, json: bool) -> (std::process::Output, String) {
    let store = format!("disk={}", dir.display());
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvsched"));
    c.args(["stress", "--store", &store]);
    if json {
        // Ended by its requests, not the clock: thousands of chunks saved however slow the
        // machine.
        c.args([
            "--json",
            "--requests",
            "1500",
            "--rate",
            "max",
            "--duration",
            "120",
        ]);
    } else {
        c.args(["--duration", "2"]);
    }
    let out = c.output().expect("run kvsched");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

#[test]
fn a_full_disk_evicts_to_what_fits_and_a_read_only_one_pauses_saving() {
    let Some(fs) = Tmpfs::mount("2m") else {
        return;
    };
    // 2 MiB holds 512 files of one 4 KiB page each, whatever --store-capacity (1 GiB) says.
    let (out, text) = stress(fs.path(), true);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let kv = &v["kv"];
    assert!(kv["store_full_at"].as_u64().is_some(), "{kv}");
    let saved = kv["chunks_saved"].as_u64().unwrap_or(0);
    assert!(saved > 2000, "saving went on past the full disk: {kv}");
    assert!(
        kv["saves_failed"].as_u64().unwrap_or(u64::MAX) * 10 < saved,
        "the tier evicted instead of failing: {kv}"
    );

    fs.read_only();
    let (out, text) = stress(fs.path(), false);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kv = text
        .split("\nKV bytes\n")
        .nth(1)
        .and_then(|t| t.split("\nthroughput").next())
        .unwrap_or_else(|| panic!("no KV bytes section: {text}"));
    let flat = kv.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("saves failed "), "{kv}");
    assert!(flat.contains("Read-only file system"), "{kv}");
    assert!(flat.contains("saving paused "), "{kv}");
    assert!(flat.contains("chunks not tried"), "{kv}");
}

/// `kvsched stress --store disk=DIR ARGS` under `ulimit -f 16` (8 KiB in `sh`), stdout
/// redirected as `redirect` says (`$1` is a file in `dir`).
fn stress_limited(dir: &Path, redirect: &str) -> std::process::Output {
    let script = format!(
        r#"ulimit -f 16 && exec "$0" stress --store "disk=$1/store" --requests 300 --rate max --duration 60 --verify off --json {redirect}"#
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_kvsched"))
        .arg(dir)
        .output()
        .expect("run sh")
}

/// Files under `dir` (at any depth) whose name ends in `.tmp`.
fn temporaries(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            found.extend(temporaries(&p));
        } else if p.extension().is_some_and(|x| x == "tmp") {
            found.push(p);
        }
    }
    found
}

/// Under a file-size limit a disk store's pack writes past it fail (`EFBIG`), counted as
/// failed saves, each removing its temporary file; a report that cannot be written whole is one
/// `error:` line and exit 1. Before, `SIGXFSZ` killed the process at the first write past
/// the limit: exit 153, no message, the report cut short, a `*.tmp` pack left in the store.
#[test]
fn a_file_size_limit_fails_the_writes_past_it_not_the_process() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The report to a pipe (no limit there): the run's saves failed, nothing left behind.
    let out = stress_limited(dir.path(), "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{:?}: {stderr}", out.status);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let kv = &v["kv"];
    assert!(kv["save_errors"].as_u64().unwrap_or(0) > 0, "{kv}");
    assert!(
        kv["save_error"]
            .as_str()
            .is_some_and(|e| e.contains("too large")),
        "{kv}"
    );
    assert_eq!(temporaries(dir.path()), Vec::<std::path::PathBuf>::new());
    // The report to a file under the limit: one `error:` line, exit 1.
    let out = stress_limited(dir.path(), r#"> "$1/report.json""#);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    assert!(
        stderr.starts_with("error: stdout: ") && stderr.matches('\n').count() == 1,
        "{stderr}"
    );
    assert!(stderr.contains("too large"), "{stderr}");
    assert_eq!(temporaries(dir.path()), Vec::<std::path::PathBuf>::new());
}
