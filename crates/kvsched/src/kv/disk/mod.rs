//! [`DiskTier`]: one file per chunk in a directory, bounded in bytes, crash-safe for a killed
//! process (write to a temporary file, then rename), its index rebuilt by a scan at open
//! (`scan`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::tier::check_into_lens;
use super::{ChunkKey, Tier, TierError};
use crate::connector::CancelToken;
use crate::sync::{AtomicU64, Mutex, Ordering};

mod config;
mod index;
mod read;
mod scan;

pub use config::DiskConfig;
use index::Index;

const CHUNK_EXT: &str = "chunk";
const TEMP_EXT: &str = "tmp";

/// What a [`DiskTier`] has done since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskCounts {
    /// Keys `get` found.
    pub hits: u64,
    /// Keys `get` did not find.
    pub misses: u64,
    /// Chunk files deleted to make room (at open too, if the directory was over capacity).
    pub evictions: u64,
    /// Bytes of chunk files held now.
    pub bytes: u64,
    /// Chunk files held now.
    pub entries: u64,
    /// Temporary files of an earlier process removed at open.
    pub stale_temps_removed: u64,
    /// Files at a chunk's path that the tier could never have written (longer than the
    /// largest value): left alone at open, not indexed nor counted against the capacity.
    pub oversized_ignored: u64,
    /// Reads refused because the chunk's path held no regular file of at most the largest
    /// value (a symbolic link, a FIFO, a device, an oversized file): each read as absent.
    pub refused_reads: u64,
    /// Chunk writes that found the file system full (`ENOSPC`, `EDQUOT`) before the tier's
    /// capacity. Each lowers the capacity in force to the bytes held then and evicts the
    /// oldest chunks to make room, then writes once more.
    pub full_writes: u64,
    /// Puts of a chunk that failed (nothing stored for it): the write after a full file
    /// system's eviction failed too, or another I/O error (a read-only file system, …).
    pub write_errors: u64,
    /// The capacity in force: [`DiskConfig::capacity_bytes`], or less once the file system
    /// was found full (see `full_writes`).
    pub capacity_bytes: u64,
}

/// Chunks as files under a root directory: `ROOT/ab/<32 hex digits of the key>.chunk`, where
/// `ab` is the key's first pair of hex digits, so 256 subdirectories (made as needed) share
/// the files, 1/256 of them each on average. (One level, not two: a second level of 65,536
/// directories made one directory per chunk for the first tens of thousands of chunks, and
/// on ext4 a `mkdir` costs as much as the chunk's own file.)
///
/// **Crash safety.** A put writes `…/<key>.<pid>.<n>.tmp` in the chunk's own directory, then
/// renames it over `<key>.chunk`: a reader sees the old file or the new one, whole. A
/// process killed mid-put leaves at most a temporary file, which the next [`open`] deletes.
/// Torn or cut files (a power loss without [`DiskConfig::fsync`], damage at rest) are returned
/// as they are: the chunk codec's length and checksum checks refuse them at load.
///
/// **Index and eviction.** [`open`] scans the directory and rebuilds the index (key → file
/// length) and the byte count, so a fresh process finds what the last one saved. Eviction is
/// least recently used within a process (puts and get hits are uses) and oldest
/// modification time first for what was found at open. Renames, index updates and eviction
/// deletes happen under one lock, so the index and the files agree; file contents are written
/// and read outside it.
///
/// **Threads.** All I/O runs on the calling thread. One `DiskTier` per directory at a time:
/// a second process opening the same directory would delete the first one's temporary files
/// and count capacity separately (not checked).
///
/// [`open`]: DiskTier::open
pub struct DiskTier {
    root: PathBuf,
    cfg: DiskConfig,
    index: Mutex<Index>,
    seq: AtomicU64,
    pid: u32,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    refused_reads: AtomicU64,
    full_writes: AtomicU64,
    write_errors: AtomicU64,
    stale_temps_removed: u64,
    oversized_ignored: u64,
    /// Tests: a file system that holds this many bytes of chunk files (writes past it fail
    /// with `ENOSPC`), or that is read-only (`u64::MAX - 1`: every write fails with `EROFS`).
    #[cfg(test)]
    test_fs: AtomicU64,
}

/// Why [`DiskTier::write_temp`] failed: whether the file system is full, and the error.
struct WriteFailed {
    full: bool,
    err: TierError,
}

/// Whether `e` says the file system (or the user's quota) is full.
fn is_full(e: &io::Error) -> bool {
    #[cfg(unix)]
    if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
        return true;
    }
    e.kind() == io::ErrorKind::StorageFull
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("root", &self.root)
            .field("cfg", &self.cfg)
            .field("stats", &self.counts())
            .finish()
    }
}

fn io_err(what: &str, path: &Path, e: io::Error) -> TierError {
    TierError::Unavailable(format!("disk tier: {what} {}: {e}", path.display()))
}

fn sync_dir(path: &Path) -> Result<(), TierError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("sync directory", path, e))
}

impl DiskTier {
    /// Opens (creating it if needed) the tier in `root`: deletes stale temporary files,
    /// indexes every chunk file, and evicts the oldest if they exceed the capacity. Entries
    /// that are not the tier's are left alone and not counted.
    pub fn open(root: impl Into<PathBuf>, cfg: DiskConfig) -> Result<DiskTier, TierError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| io_err("create directory", &root, e))?;
        let limit = cfg.max_value_bytes.min(cfg.capacity_bytes);
        let scan::Scan {
            mut found,
            stale,
            oversized,
        } = scan::scan(&root, limit)?;
        found.sort_unstable();
        let mut index = Index::default();
        for (_, key, len) in found {
            index.insert(key, len);
        }
        if stale > 0 && cfg.fsync {
            sync_dir(&root)?;
        }
        let tier = DiskTier::unscanned(root, cfg, stale, oversized);
        tier.evict_to_fit(&mut index, None, 0);
        *tier.index.lock() = index;
        Ok(tier)
    }

    /// The tier with an empty index, its open's counts `stale` and `oversized`.
    fn unscanned(root: PathBuf, cfg: DiskConfig, stale: u64, oversized: u64) -> DiskTier {
        DiskTier {
            root,
            cfg,
            index: Mutex::new(Index::default()),
            seq: AtomicU64::new(0),
            pid: std::process::id(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            refused_reads: AtomicU64::new(0),
            full_writes: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            stale_temps_removed: stale,
            oversized_ignored: oversized,
            #[cfg(test)]
            test_fs: AtomicU64::new(u64::MAX),
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file that holds (or would hold) the chunk of `key`.
    pub fn chunk_path(&self, key: ChunkKey) -> PathBuf {
        // One formatting of the key and one allocation of the path (a load makes one per
        // chunk).
        let hex = key.to_string();
        let mut s = std::ffi::OsString::with_capacity(
            self.root.as_os_str().len() + hex.len() + CHUNK_EXT.len() + 5,
        );
        s.push(self.root.as_os_str());
        let mut p = PathBuf::from(s);
        p.push(&hex[0..2]);
        p.push(&hex);
        // The name is hex digits: no dot for `set_extension` to replace.
        p.set_extension(CHUNK_EXT);
        p
    }

    fn chunk_dir(&self, key: ChunkKey) -> PathBuf {
        let hex = key.to_string();
        let mut p = self.root.clone();
        p.push(&hex[0..2]);
        p
    }

    /// Every key indexed now, in no particular order.
    pub fn keys(&self) -> Vec<ChunkKey> {
        self.index.lock().map.keys().copied().collect()
    }

    /// Counters so far, and what the index holds now.
    pub fn counts(&self) -> DiskCounts {
        let (bytes, entries, capacity_bytes) = {
            let i = self.index.lock();
            (
                i.bytes,
                i.map.len() as u64,
                i.capacity(self.cfg.capacity_bytes),
            )
        };
        // Relaxed: statistics only.
        DiskCounts {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bytes,
            entries,
            stale_temps_removed: self.stale_temps_removed,
            oversized_ignored: self.oversized_ignored,
            refused_reads: self.refused_reads.load(Ordering::Relaxed),
            full_writes: self.full_writes.load(Ordering::Relaxed),
            write_errors: self.write_errors.load(Ordering::Relaxed),
            capacity_bytes,
        }
    }

    /// Deletes the least recently used files (never `keep`) until the index, with `room`
    /// bytes more, fits the capacity in force. Called with the index lock held (or on the
    /// index before it is shared).
    fn evict_to_fit(&self, index: &mut Index, keep: Option<ChunkKey>, room: u64) {
        let cap = index.capacity(self.cfg.capacity_bytes);
        while index.bytes.saturating_add(room) > cap {
            let Some(&victim) = index.order.values().next() else {
                break;
            };
            if Some(victim) == keep {
                // Only the newest value is left, and it fits by the put's size check.
                break;
            }
            index.remove(victim);
            // Relaxed: statistics only.
            self.evictions.fetch_add(1, Ordering::Relaxed);
            let path = self.chunk_path(victim);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "disk tier: evict"),
            }
        }
    }

    /// Writes `value` to a new temporary file in `dir`, flushed if configured; a file that
    /// could not be written whole is removed.
    fn write_temp(&self, dir: &Path, key: ChunkKey, value: &[u8]) -> Result<PathBuf, WriteFailed> {
        let failed = |what: &str, path: &Path, e: io::Error| WriteFailed {
            full: is_full(&e),
            err: io_err(what, path, e),
        };
        #[cfg(test)]
        if let Some(e) = self.test_write_error(value.len() as u64) {
            return Err(failed("write", dir, e));
        }
        // Relaxed: only uniqueness of the name matters.
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{key}.{}.{n}.{TEMP_EXT}", self.pid));
        let mut f = match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(dir).map_err(|e| failed("create directory", dir, e))?;
                if self.cfg.fsync {
                    sync_dir(&self.root).map_err(|err| WriteFailed { full: false, err })?;
                }
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)
                    .map_err(|e| failed("create", &tmp, e))?
            }
            Err(e) => return Err(failed("create", &tmp, e)),
        };
        let written = f.write_all(value).and_then(|()| {
            if self.cfg.fsync {
                f.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(e) = written {
            drop(f);
            let _ = fs::remove_file(&tmp);
            return Err(failed("write", &tmp, e));
        }
        Ok(tmp)
    }

    /// Writes `value` as the chunk of `key`. A file system full before the capacity makes
    /// the bytes held now the capacity in force (the index counts file contents, the file
    /// system blocks and directories too): the oldest chunks are evicted to make room and the
    /// write is tried once more. The index counts a chunk only once its file is in place.
    fn put_one(&self, key: ChunkKey, value: &[u8]) -> Result<(), TierError> {
        let dir = self.chunk_dir(key);
        let tmp = match self.write_temp(&dir, key, value) {
            Ok(tmp) => tmp,
            Err(WriteFailed { full: true, .. }) => {
                // Relaxed: statistics only.
                self.full_writes.fetch_add(1, Ordering::Relaxed);
                {
                    let mut index = self.index.lock();
                    index.lower_capacity(self.cfg.capacity_bytes);
                    self.evict_to_fit(&mut index, None, value.len() as u64);
                }
                self.write_temp(&dir, key, value).map_err(|f| {
                    // Relaxed: statistics only.
                    self.write_errors.fetch_add(1, Ordering::Relaxed);
                    f.err
                })?
            }
            Err(f) => {
                // Relaxed: statistics only.
                self.write_errors.fetch_add(1, Ordering::Relaxed);
                return Err(f.err);
            }
        };
        let path = self.chunk_path(key);
        {
            let mut index = self.index.lock();
            if let Err(e) = fs::rename(&tmp, &path) {
                drop(index);
                let _ = fs::remove_file(&tmp);
                // Relaxed: statistics only.
                self.write_errors.fetch_add(1, Ordering::Relaxed);
                return Err(io_err("rename into", &path, e));
            }
            index.insert(key, value.len() as u64);
            self.evict_to_fit(&mut index, Some(key), 0);
        }
        if self.cfg.fsync {
            sync_dir(&dir)?;
        }
        Ok(())
    }

    /// The failure a test set for a write of `len` bytes (see `test_fs`).
    #[cfg(test)]
    fn test_write_error(&self, len: u64) -> Option<io::Error> {
        let fs = self.test_fs.load(Ordering::Relaxed);
        if fs == u64::MAX - 1 {
            return Some(io::Error::from_raw_os_error(libc::EROFS));
        }
        let held = self.index.lock().bytes;
        (held.saturating_add(len) > fs).then(|| io::Error::from_raw_os_error(libc::ENOSPC))
    }

    /// The largest value accepted and file read.
    fn limit(&self) -> u64 {
        self.cfg.max_value_bytes.min(self.cfg.capacity_bytes)
    }
}

impl Tier for DiskTier {
    fn name(&self) -> &str {
        "disk"
    }

    /// An open, a `statx` and a read per chunk whatever the batch: nothing to save by
    /// batching, so a load reads it piece by piece and copies each piece out of cache.
    fn costs_per_call(&self) -> bool {
        false
    }

    /// From the index alone (no I/O): a hint, as the trait says.
    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        if cancel.is_cancelled() {
            return Err(TierError::Cancelled);
        }
        let index = self.index.lock();
        Ok(keys.iter().map(|k| index.map.contains_key(k)).collect())
    }

    /// Reads each key's file on the calling thread, checking `cancel` before each.
    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        let mut out = Vec::with_capacity(keys.len());
        for &k in keys {
            if cancel.is_cancelled() {
                return Err(TierError::Cancelled);
            }
            let mut buf = Vec::new();
            let got = self.get_one(k, cancel, &mut buf)?;
            out.push(got.then_some(buf));
        }
        Ok(out)
    }

    /// Reads each key's file into its buffer on the calling thread (the buffer's capacity
    /// reused: the kernel copies from the page cache straight into it), checking `cancel`
    /// before each.
    fn get_into(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
        bufs: &mut [Vec<u8>],
        held: &mut [bool],
    ) -> Result<(), TierError> {
        check_into_lens(keys.len(), bufs.len(), held.len())?;
        for ((&k, buf), h) in keys.iter().zip(bufs.iter_mut()).zip(held.iter_mut()) {
            if cancel.is_cancelled() {
                return Err(TierError::Cancelled);
            }
            *h = self.get_one(k, cancel, buf)?;
        }
        Ok(())
    }

    /// Writes each value (temporary file, then rename), evicting as needed. Stops at the
    /// first I/O error, with the earlier values stored. A value over the capacity is
    /// skipped and reported as [`TierError::Refused`] after the rest are stored.
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        let mut refused = None;
        for (k, v) in chunks {
            if v.len() as u64 > self.limit() {
                refused.get_or_insert((*k, v.len()));
                continue;
            }
            self.put_one(*k, v)?;
        }
        match refused {
            None => Ok(()),
            Some((k, len)) => Err(TierError::Refused(format!(
                "value for key {k}: {len} bytes, more than the disk tier's largest value ({} \
                 bytes)",
                self.limit()
            ))),
        }
    }
}

/// Editing a stored value in place: what a repair tool or the test kit's fault injection
/// (`kvsched_testkit::FaultyTier`) uses to change a file at rest exactly as real damage would.
impl DiskTier {
    /// Reads the file of `key`, lets `edit` change its bytes, and writes them back into the
    /// same file (no atomic rename: this is damage at rest, not a store). Returns what `edit`
    /// returned, or `false` when no value is held.
    pub fn edit_stored(
        &self,
        key: ChunkKey,
        edit: impl FnOnce(&mut Vec<u8>) -> bool,
    ) -> Result<bool, TierError> {
        let Some((mut f, len, path)) = self.open_stored(key)? else {
            return Ok(false);
        };
        let mut v = Vec::with_capacity(len.min(self.limit()) as usize);
        f.read_to_end(&mut v)
            .map_err(|e| io_err("edit", &path, e))?;
        if !edit(&mut v) {
            return Ok(false);
        }
        let mut index = self.index.lock();
        f.seek(SeekFrom::Start(0))
            .and_then(|_| f.write_all(&v))
            .and_then(|()| f.set_len(v.len() as u64))
            .map_err(|e| io_err("edit", &path, e))?;
        if index.map.contains_key(&key) {
            index.insert(key, v.len() as u64);
        }
        Ok(true)
    }

    /// Deletes the file of `key`; `false` if there was none.
    pub fn remove(&self, key: ChunkKey) -> Result<bool, TierError> {
        let path = self.chunk_path(key);
        let mut index = self.index.lock();
        index.remove(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("remove", &path, e)),
        }
    }
}

#[cfg(test)]
mod tests;
