//! The private directory a local server runs in (`kvsched-redis-<pid>-<n>-<nanos>` under the
//! system's temporary directory, mode 0700), and the removal of those left by processes
//! killed before they could remove theirs.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::server::ServerError;

/// A private directory under the system's temporary directory. Directories of earlier
/// processes that are gone (killed before they could remove theirs) are removed first.
pub(super) fn private_dir() -> Result<PathBuf, ServerError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    remove_dead_dirs(&base);
    for _ in 0..100 {
        // Relaxed: a counter for unique names, nothing else is published through it.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = base.join(format!("kvsched-redis-{}-{n}-{nanos}", std::process::id()));
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(source) => {
                return Err(ServerError::Io {
                    what: format!("create {}", dir.display()),
                    source,
                })
            }
        }
    }
    Err(ServerError::Io {
        what: "create a temporary directory".into(),
        source: io::Error::from(io::ErrorKind::AlreadyExists),
    })
}

/// Removes `kvsched-redis-<pid>-…` directories under `base` whose process no longer runs
/// (`/proc/<pid>` is gone). Best effort: a directory it cannot read or remove (another
/// user's) stays, and a pid since reused keeps its directory until that process ends too.
fn remove_dead_dirs(base: &Path) {
    // Without a /proc to ask, every process would look gone.
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("kvsched-redis-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let gone = !Path::new(&format!("/proc/{pid}")).exists();
        if gone && pid != std::process::id() && e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_of_dead_processes_are_removed_and_live_ones_kept() {
        let base = std::env::temp_dir().join(format!("kvsched-sweep-test-{}", std::process::id()));
        fs::create_dir_all(&base).unwrap();
        // A process that has ended (reaped), this one, and init (always running).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let names = [
            format!("kvsched-redis-{dead}-0-1"),
            format!("kvsched-redis-{}-0-1", std::process::id()),
            "kvsched-redis-1-0-1".to_string(),
            "kvsched-redis-notapid-0-1".to_string(),
        ];
        for n in &names {
            fs::create_dir_all(base.join(n).join("inside")).unwrap();
        }
        remove_dead_dirs(&base);
        let left: Vec<bool> = names.iter().map(|n| base.join(n).exists()).collect();
        fs::remove_dir_all(&base).unwrap();
        assert_eq!(left, [false, true, true, true]);
    }
}
