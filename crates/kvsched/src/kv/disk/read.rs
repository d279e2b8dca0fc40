//! The disk tier's reads: a chunk's file opened safely (no symbolic link followed, no FIFO
//! waited for, checked on the open descriptor) and read into the caller's buffer.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::{io_err, DiskTier};
use crate::connector::CancelToken;
use crate::kv::{ChunkKey, TierError};
use crate::sync::Ordering;

impl DiskTier {
    /// Reads the file of `key` into `buf`: its length set to the file's (its capacity and
    /// bytes reused, so a buffer that held a chunk of this size takes the next without
    /// allocating or zeroing), then filled by reads of exactly the bytes `fstat` gave, at
    /// most 4 MiB each with `cancel` checked before each — an open, a `statx` and one read
    /// per chunk of up to 4 MiB, no read past the end to find it. `false`, the buffer empty,
    /// if there is no such file, or if what sits at its path is not a regular file of at
    /// most [`limit`](Self::limit) bytes (see [`safe_open`]): such a file is not one the tier
    /// wrote. A file cut while it is read gives the bytes read (its decode then fails); one
    /// that grows gives its first `fstat` length of bytes, never more than the limit.
    pub(super) fn read_into(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        buf: &mut Vec<u8>,
    ) -> Result<bool, TierError> {
        let path = self.chunk_path(key);
        let (mut f, len) = match safe_open(&path, false, self.limit())? {
            Opened::File(f, len) => (f, len),
            Opened::Absent => {
                buf.clear();
                return Ok(false);
            }
            Opened::Refused => {
                buf.clear();
                // Relaxed: statistics only.
                self.refused_reads.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
        };
        // `len` ≤ the limit, a `u64` the tier could allocate when it wrote the file.
        let len = usize::try_from(len).map_err(|_| {
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
            match f.read(&mut buf[at..end]) {
                Ok(0) => break,
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    buf.clear();
                    return Err(io_err("read", &path, e));
                }
            }
        }
        buf.truncate(at);
        Ok(true)
    }

    /// Reads `key` into `buf` and keeps the index and counters: a hit is a use; a miss of an
    /// indexed key whose file is gone forgets it.
    pub(super) fn get_one(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        buf: &mut Vec<u8>,
    ) -> Result<bool, TierError> {
        let got = self.read_into(key, cancel, buf)?;
        if got {
            self.index.lock().touch(key);
            // Relaxed: statistics only.
            self.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            let mut index = self.index.lock();
            // Deleted behind the tier's back: forget it (unless a put just re-created it).
            if index.map.contains_key(&key) && !self.chunk_path(key).exists() {
                index.remove(key);
            }
            drop(index);
            // Relaxed: statistics only.
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        Ok(got)
    }

    /// Opens the file of `key` for an edit; `None` if absent.
    pub(super) fn open_stored(
        &self,
        key: ChunkKey,
    ) -> Result<Option<(File, u64, PathBuf)>, TierError> {
        let path = self.chunk_path(key);
        match safe_open(&path, true, self.limit())? {
            Opened::File(f, len) => Ok(Some((f, len, path))),
            Opened::Absent | Opened::Refused => Ok(None),
        }
    }
}

/// What [`safe_open`] found at a chunk's path.
enum Opened {
    /// A regular file and its length.
    File(File, u64),
    /// Nothing.
    Absent,
    /// Something the tier never writes: a symbolic link, a FIFO, a device, a directory, a
    /// file longer than the limit.
    Refused,
}

/// Opens the chunk file at `path` without following a symbolic link and without blocking
/// (a FIFO opens at once instead of waiting for a writer), then checks on the open file
/// itself (no race with a rename) that it is a regular file of at most `limit` bytes.
fn safe_open(path: &Path, write: bool, limit: u64) -> Result<Opened, TierError> {
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
        // ELOOP: a symbolic link; ENXIO: a FIFO without a reader opened for writing.
        #[cfg(unix)]
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENXIO)) => {
            return Ok(Opened::Refused)
        }
        Err(e) => return Err(io_err("open", path, e)),
    };
    let meta = f.metadata().map_err(|e| io_err("stat", path, e))?;
    if !meta.is_file() || meta.len() > limit {
        return Ok(Opened::Refused);
    }
    Ok(Opened::File(f, meta.len()))
}
