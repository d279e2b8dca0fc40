//! The walk of a disk tier's directory at open: which files are packs (their tables read
//! and checked), which are stale temporary files (deleted), and what is left alone.

use std::fs;
use std::io;
use std::path::Path;
use std::time::SystemTime;

use super::index::{file_id, FileId};
use super::pack::{self, Entry};
use super::read::{open_checked, read_at, Opened};
use super::write::pack_number;
use super::{io_err, TEMP_EXT};
use crate::kv::TierError;
use rustc_hash::FxHashSet;

/// A pack found.
pub(super) struct Found {
    pub mtime: SystemTime,
    pub id: u64,
    /// The file's length.
    pub len: u64,
    /// Its table's entries, tombstones included.
    pub entries: Vec<Entry>,
    /// The file it is.
    pub file: FileId,
}

/// What the walk found.
#[derive(Default)]
pub(super) struct Scan {
    /// Each intact pack, unordered.
    pub found: Vec<Found>,
    /// Temporary files deleted.
    pub stale: u64,
    /// Pack-named files longer than the largest pack, left alone and not listed.
    pub oversized: u64,
    /// Pack-named files whose table is not a pack's, or that could not be opened or read,
    /// left alone and not listed.
    pub refused: u64,
    /// The numbers of the pack-named files left alone (oversized or refused).
    pub ignored: Vec<u64>,
    /// The number of every pack-named file listed, looked at or skipped.
    pub listed: FxHashSet<u64>,
}

/// Elsewhere than on Unix every temporary file is taken for a dead process's.
#[cfg(not(unix))]
fn writer_alive(_name: &str) -> bool {
    false
}

/// Whether the temporary file `name` (`<n>.<r>.<pid>.tmp`, as a put names it) belongs to a
/// process that is still running: its put may be in flight. A name without a pid is no
/// put's.
#[cfg(unix)]
fn writer_alive(name: &str) -> bool {
    let Some(pid) = name
        .strip_suffix(TEMP_EXT)
        .and_then(|n| n.strip_suffix('.'))
        .and_then(|n| n.rsplit_once('.'))
        .and_then(|(_, pid)| pid.parse::<libc::pid_t>().ok())
        .filter(|&pid| pid > 0)
    else {
        return false;
    };
    // SAFETY: `kill` with signal 0 sends nothing; it only checks that `pid` names a process
    // (a positive pid: one process, never a group).
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Walks `ROOT`: deletes every `*.tmp` file it can but those of live processes, puts in
/// flight (one it cannot — a directory of that name, another user's file — is left: no pack,
/// nothing reads it), lists every
/// `<16 hex digits>.pack` regular file of at most `pack_limit` bytes (a longer one the tier
/// never wrote: counted in `oversized`) whose table is intact, each value inside the file
/// and at most `limit` bytes (else counted in `refused`), and skips anything else (the
/// `ROOT/ab/` subdirectories of the earlier one-file-per-chunk layout among them).
///
/// A rescan (`seen` the packs already looked at) leaves temporary files alone (another
/// `DiskTier` on the directory may be writing them) and skips the packs in `seen`.
pub(super) fn scan(
    root: &Path,
    pack_limit: u64,
    limit: u64,
    seen: Option<&FxHashSet<u64>>,
) -> Result<Scan, TierError> {
    let mut s = Scan::default();
    let dir = fs::read_dir(root).map_err(|e| io_err("read directory", root, e))?;
    for f in dir {
        let f = f.map_err(|e| io_err("read directory", root, e))?;
        let path = f.path();
        let name = f.file_name();
        let Some(name) = name.to_str() else { continue };
        if name
            .strip_suffix(TEMP_EXT)
            .is_some_and(|n| n.ends_with('.'))
        {
            // Planted bug `rescan-deletes-temps` (scripts/plants.sh): a rescan deletes the
            // temporary file of a put in flight, whose link into place then fails. At open,
            // a temporary file of a live process (another `DiskTier` on the directory, this
            // process's included) is a put in flight too, and left alone.
            let in_flight = if seen.is_none() {
                writer_alive(name) && !planted!("open-deletes-live-temps")
            } else {
                !planted!("rescan-deletes-temps")
            };
            if !in_flight {
                match fs::remove_file(&path) {
                    Ok(()) => s.stale += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "stale temporary left");
                    }
                }
            }
            continue;
        }
        let Some(id) = pack_number(name) else {
            continue;
        };
        s.listed.insert(id);
        if seen.is_some_and(|s| s.contains(&id)) {
            continue;
        }
        let (file, meta) = match open_checked(&path, false, u64::MAX) {
            Ok(Opened::File(file, meta)) => (file, meta),
            Ok(Opened::Absent | Opened::Refused) => continue,
            Err((what, e)) => {
                unreadable(&mut s, id, &path, what, e)?;
                continue;
            }
        };
        if meta.len() > pack_limit {
            s.oversized += 1;
            s.ignored.push(id);
            continue;
        }
        let table = match read_table(&file, meta.len(), limit) {
            Ok(table) => table,
            Err(e) => {
                unreadable(&mut s, id, &path, "read", e)?;
                continue;
            }
        };
        match table {
            Some(entries) => s.found.push(Found {
                mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                id,
                len: meta.len(),
                entries,
                file: file_id(&meta),
            }),
            None => {
                s.refused += 1;
                s.ignored.push(id);
            }
        }
    }
    Ok(s)
}

/// A pack that could not be opened or read (`what` failed with `e`): left alone like a
/// damaged one (counted in `refused`, never read again by this tier) when the error is the
/// file's — a bad sector (`EIO`), a file the kernel will not open — so that one unreadable
/// file does not make the whole store unusable; an error of the process (out of file
/// descriptors or memory) fails the scan instead, as it would fail every pack.
fn unreadable(
    s: &mut Scan,
    id: u64,
    path: &Path,
    what: &str,
    e: io::Error,
) -> Result<(), TierError> {
    #[cfg(unix)]
    if matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    ) {
        return Err(io_err(what, path, e));
    }
    if e.kind() == io::ErrorKind::OutOfMemory {
        return Err(io_err(what, path, e));
    }
    tracing::warn!(path = %path.display(), error = %e, "disk tier: {what} failed: pack left alone");
    s.refused += 1;
    s.ignored.push(id);
    Ok(())
}

/// The entries of the pack `file` (`len` bytes); `None` if its table is not a pack's.
pub(super) fn read_table(file: &fs::File, len: u64, limit: u64) -> io::Result<Option<Vec<Entry>>> {
    let mut head = [0u8; pack::HEAD_LEN as usize];
    if read_at(file, &mut head, 0)? < head.len() {
        return Ok(None);
    }
    let Ok(n) = pack::count(&head) else {
        return Ok(None);
    };
    let mut t = vec![0u8; pack::table_len(n) as usize];
    if read_at(file, &mut t, 0)? < t.len() {
        return Ok(None);
    }
    Ok(pack::parse(&t, len, limit).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_parse_only_when_exact() {
        assert_eq!(pack_number("00000000000000ff.pack"), Some(255));
        assert_eq!(pack_number("00000000000000ff.packx"), None);
        assert_eq!(pack_number("00000000000000ff0.pack"), None);
        assert_eq!(pack_number("00000000000000FF.pack"), None);
        assert_eq!(pack_number("+0000000000000ff.pack"), None);
        assert_eq!(pack_number("00000000000000ffpack"), None);
    }

    /// An I/O error of one file leaves that pack alone; one of the process fails the scan.
    #[cfg(unix)]
    #[test]
    fn an_unreadable_pack_is_left_alone_unless_the_process_is_out_of_resources() {
        let mut s = Scan::default();
        let path = Path::new("/x/0000000000000007.pack");
        for errno in [libc::EIO, libc::ESRCH, libc::EINVAL] {
            let e = io::Error::from_raw_os_error(errno);
            assert!(unreadable(&mut s, 7, path, "read", e).is_ok(), "{errno}");
        }
        assert_eq!((s.refused, s.ignored.len()), (3, 3));
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOMEM] {
            let e = io::Error::from_raw_os_error(errno);
            let got = unreadable(&mut s, 8, path, "open", e);
            assert!(
                matches!(&got, Err(TierError::Unavailable(m)) if m.contains("open /x/")),
                "{errno}: {got:?}"
            );
        }
        assert_eq!(s.refused, 3, "not counted as refused");
    }
}
