//! The disk tier's reads: a chunk's pack opened safely (no symbolic link followed, no FIFO
//! waited for, checked on the open descriptor) and its value read at its offset into the
//! caller's buffer.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use super::index::{file_id, same_file, Place};
use super::{io_err, DiskTier};
use crate::connector::CancelToken;
use crate::kv::{ChunkKey, TierError};
use crate::sync::Ordering;

/// What [`DiskTier::read_into`] found.
enum Read {
    /// The index holds no such key.
    NotIndexed,
    /// The key's pack file is gone.
    Gone(Place),
    /// The key's pack number names another file now (another tier's pack under a number
    /// whose file this one deleted).
    Replaced(Place),
    /// Its path holds something the tier never writes.
    Refused,
    /// The value's bytes (those still in the file) are in the buffer.
    Got,
}

/// Times a read follows its key to the pack a put saved it in again meanwhile before it
/// answers "not held" (a key saved again that often while it is read).
pub(super) const MOVES: u32 = 8;

/// The pack file a batch of reads opened last: its number and descriptor.
pub(super) type OpenPack = Option<(u64, File)>;

/// Reads up to `buf.len()` bytes at `off` of `f`: fewer only at the end of the file.
pub(super) fn read_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        let mut at = 0;
        while at < buf.len() {
            match f.read_at(&mut buf[at..], off + at as u64) {
                Ok(0) => break,
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(at)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = f;
        f.seek(SeekFrom::Start(off))?;
        let mut at = 0;
        while at < buf.len() {
            match f.read(&mut buf[at..]) {
                Ok(0) => break,
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(at)
    }
}

/// Writes all of `buf` at `off` of `f`.
pub(super) fn write_at(f: &File, buf: &[u8], off: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        f.write_all_at(buf, off)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = f;
        f.seek(SeekFrom::Start(off))?;
        f.write_all(buf)
    }
}

impl DiskTier {
    /// Reads the value of `key` into `buf`: its length set to the value's (its capacity and
    /// bytes reused, so a buffer that held a chunk of this size takes the next without
    /// allocating or zeroing), then filled by reads at its offset, at most 4 MiB each with
    /// `cancel` checked before each. `open` keeps the pack file last opened, so consecutive
    /// keys of one pack pay one open. The buffer is empty unless the value was read; a refused
    /// read is one where what sits at its path is not a regular
    /// file of at most the largest pack (see [`safe_open`]): such a file is not one the tier
    /// wrote. A pack cut behind the tier's back gives the bytes still there (their decode
    /// then fails).
    fn read_into(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        buf: &mut Vec<u8>,
        open: &mut OpenPack,
    ) -> Result<Read, TierError> {
        let (place, want) = {
            let index = self.index.lock();
            let Some(place) = index.map.get(&key).copied() else {
                buf.clear();
                return Ok(Read::NotIndexed);
            };
            (place, index.files.get(&place.pack).copied().flatten())
        };
        #[cfg(test)]
        self.test_pause(super::Pause::ReadPlaced);
        // A value longer than any the tier's callers store is no value of theirs (a forged
        // table may name one of 64 MiB): refused before a byte of it is read.
        // Relaxed: a bound (see `expected_max`).
        let bound = self.expected_max.load(Ordering::Relaxed);
        if bound > 0 && place.len > bound && !planted!("disk-value-bound-ignored") {
            buf.clear();
            // Relaxed: statistics only.
            self.refused_reads.fetch_add(1, Ordering::Relaxed);
            return Ok(Read::Refused);
        }
        let path = self.path_of(place.pack);
        if open.as_ref().is_none_or(|(id, _)| *id != place.pack) {
            *open = None;
            match safe_open(&path, false, self.pack_limit())? {
                Opened::File(f, meta) => {
                    if !same_file(file_id(&meta), want) && !planted!("disk-pack-identity-unchecked")
                    {
                        buf.clear();
                        return Ok(Read::Replaced(place));
                    }
                    *open = Some((place.pack, f));
                }
                Opened::Absent => {
                    buf.clear();
                    return Ok(Read::Gone(place));
                }
                Opened::Refused => {
                    buf.clear();
                    // Relaxed: statistics only.
                    self.refused_reads.fetch_add(1, Ordering::Relaxed);
                    return Ok(Read::Refused);
                }
            }
        }
        let Some((_, f)) = open.as_ref() else {
            return Ok(Read::Gone(place));
        };
        // `place.len` ≤ the largest value, a `u64` the tier could allocate when it wrote it.
        let len = usize::try_from(place.len).map_err(|_| {
            TierError::Unavailable(format!("disk tier: read {}: too large", path.display()))
        })?;
        if buf.len() >= len {
            buf.truncate(len);
        } else {
            buf.try_reserve_exact(len - buf.len()).map_err(|e| {
                buf.clear();
                TierError::Unavailable(format!("disk tier: read {}: {e}", path.display()))
            })?;
            // Zeroes only the bytes past the old length: once per buffer, not per chunk.
            buf.resize(len, 0);
        }
        const SLICE: usize = 4 << 20;
        let mut at = 0;
        while at < len {
            if cancel.is_cancelled() {
                buf.clear();
                return Err(TierError::Cancelled);
            }
            let end = len.min(at + SLICE);
            match read_at(f, &mut buf[at..end], place.off + at as u64) {
                Ok(n) => {
                    at += n;
                    if at < end {
                        break; // the end of the file
                    }
                }
                Err(e) => {
                    buf.clear();
                    return Err(io_err("read", &path, e));
                }
            }
        }
        buf.truncate(at);
        Ok(Read::Got)
    }

    /// Reads `key` into `buf` and keeps the index and counters: a hit is a use of its pack;
    /// a key whose pack file is gone forgets the pack. A key a put saved again while it was
    /// read (the put deleted the pack the read looked for) is read again where the index
    /// places it now, up to [`MOVES`] times.
    pub(super) fn get_one(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        buf: &mut Vec<u8>,
        open: &mut OpenPack,
    ) -> Result<bool, TierError> {
        let mut moves = 0;
        let got = loop {
            let (place, replaced) = match self.read_into(key, cancel, buf, open)? {
                Read::Got => break true,
                Read::NotIndexed | Read::Refused => break false,
                Read::Gone(place) => (place, false),
                Read::Replaced(place) => (place, true),
            };
            let mut index = self.index.lock();
            let now = index.map.get(&key).copied();
            if now == Some(place) {
                if replaced {
                    // Not this tier's file any more: forget the pack, and its number, so
                    // that a rescan indexes the file now there.
                    index.forget_replaced(place.pack);
                } else if !self.path_of(place.pack).exists() {
                    // Deleted behind the tier's back: forget the pack.
                    index.drop_pack(place.pack);
                    index.files.remove(&place.pack);
                    index.seen.remove(&place.pack);
                }
                break false;
            }
            // Saved again meanwhile, in another pack: read it there. (Planted bug
            // `disk-get-misses-moved-key`, scripts/plants.sh: a miss instead.)
            if now.is_none() || moves == MOVES || planted!("disk-get-misses-moved-key") {
                break false;
            }
            moves += 1;
        };
        if got {
            self.index.lock().touch(key);
            // Relaxed: statistics only.
            self.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            // Relaxed: statistics only.
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        Ok(got)
    }
}

/// What [`safe_open`] found at a pack's path.
pub(super) enum Opened {
    /// A regular file, and what its open descriptor's `fstat` said.
    File(File, std::fs::Metadata),
    /// Nothing.
    Absent,
    /// Something the tier never writes: a symbolic link, a FIFO, a device, a directory, a
    /// file longer than the limit.
    Refused,
}

/// Opens the pack file at `path` without following a symbolic link and without blocking
/// (a FIFO opens at once instead of waiting for a writer), then checks on the open file
/// itself (no race with a rename) that it is a regular file of at most `limit` bytes.
pub(super) fn safe_open(path: &Path, write: bool, limit: u64) -> Result<Opened, TierError> {
    open_checked(path, write, limit).map_err(|(what, e)| io_err(what, path, e))
}

/// [`safe_open`] with its error as the call that failed (`open`, `stat`) and its I/O error.
pub(super) fn open_checked(
    path: &Path,
    write: bool,
    limit: u64,
) -> Result<Opened, (&'static str, io::Error)> {
    let mut open = OpenOptions::new();
    open.read(true).write(write);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        open.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let f = match open.open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Opened::Absent),
        // ELOOP: a symbolic link; ENXIO: a FIFO without a reader opened for writing;
        // EACCES, EPERM: a file this process may not read (another user's, or one whose
        // permissions were taken away) — no pack it can use, whoever wrote it.
        #[cfg(unix)]
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ELOOP | libc::ENXIO | libc::EACCES | libc::EPERM)
            ) =>
        {
            return Ok(Opened::Refused)
        }
        Err(e) => return Err(("open", e)),
    };
    let meta = f.metadata().map_err(|e| ("stat", e))?;
    if !meta.is_file() || meta.len() > limit {
        return Ok(Opened::Refused);
    }
    Ok(Opened::File(f, meta))
}
