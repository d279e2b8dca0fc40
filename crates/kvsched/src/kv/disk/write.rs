//! The disk tier's writes: a put's chunks split into packs, each written whole to a
//! temporary file (its table, then its values, in one vectored write), then hard-linked
//! into place under a number no pack has, and indexed under the index lock.

use std::fs::{self, OpenOptions};
use std::io::{self, IoSlice, Write};
use std::path::{Path, PathBuf};

use super::{io_err, is_full, pack, sync_dir, DiskTier, PACK_EXT, TEMP_EXT};
use crate::kv::{ChunkKey, TierError};
use crate::sync::Ordering;
use rustc_hash::FxHashSet;

/// Why [`DiskTier::write_temp`] failed: whether the file system is full, and the error.
struct WriteFailed {
    full: bool,
    /// The name is another writer's.
    taken: bool,
    err: TierError,
}

/// Pack numbers found taken in a row before a put lists the directory to skip past them all.
const SKIP_AFTER: u32 = 4;
/// Pack numbers found taken before a put gives up (a directory listed every [`SKIP_AFTER`]
/// of them; more are taken only by other writers linking as fast as it lists).
const MAX_TAKEN: u32 = 64;

/// Writes every byte of `bufs` (`write_vectored` may write part of them).
fn write_all_vectored(f: &mut fs::File, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !bufs.is_empty() {
        match f.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl DiskTier {
    /// Stores `chunks` (each at most the largest value) in as few packs as the bounds
    /// allow, in order; stops at the first pack that fails, the earlier ones stored.
    pub(super) fn put_chunks(&self, chunks: &[(ChunkKey, &[u8])]) -> Result<(), TierError> {
        let budget = self.pack_budget();
        let mut start = 0;
        while start < chunks.len() {
            let mut end = start;
            let mut bytes = 0u64;
            while end < chunks.len() && end - start < pack::MAX_ENTRIES {
                let len = chunks[end].1.len() as u64;
                if end > start && bytes + len > budget {
                    break;
                }
                bytes += len;
                end += 1;
            }
            self.put_pack(&chunks[start..end])?;
            start = end;
        }
        Ok(())
    }

    /// Writes `values` as one pack. A file system full before the capacity makes the bytes
    /// held now the capacity in force (the index counts file contents; the file system
    /// blocks and directories too): the oldest packs are evicted to make room and the write
    /// is tried once more. The index counts a pack only once its file is in place.
    fn put_pack(&self, values: &[(ChunkKey, &[u8])]) -> Result<(), TierError> {
        let entries = pack::layout(values);
        let table = pack::encode(&entries);
        let len = table.len() as u64 + values.iter().map(|v| v.1.len() as u64).sum::<u64>();
        let tmp = self.write_retrying(&table, values, len)?;
        // The file this put wrote (the link below names the same one).
        let file = fs::symlink_metadata(&tmp)
            .ok()
            .as_ref()
            .and_then(super::index::file_id);
        // Published under a number no pack has: a hard link fails rather than replace
        // another `DiskTier`'s pack of the same number, and a number taken is skipped. A tier
        // behind the others on the directory (they wrote since its open or last rescan) meets
        // their numbers one after the other: every few taken in a row, it lists the directory
        // and goes on from the first number no file there has.
        let mut index = self.index.lock();
        let mut taken = 0;
        let id = loop {
            // Relaxed: only uniqueness of the number matters.
            let id = self.next_pack.fetch_add(1, Ordering::Relaxed);
            let path = self.path_of(id);
            match fs::hard_link(&tmp, &path) {
                Ok(()) => break id,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && taken < MAX_TAKEN => {
                    taken += 1;
                    // (Planted bug `disk-link-never-skips-ahead`, scripts/plants.sh: a put
                    // behind by more than `MAX_TAKEN` packs fails.)
                    if taken % SKIP_AFTER == 0 && !planted!("disk-link-never-skips-ahead") {
                        self.skip_taken_numbers();
                    }
                }
                Err(e) => {
                    drop(index);
                    let _ = fs::remove_file(&tmp);
                    // Relaxed: statistics only.
                    self.write_errors.fetch_add(1, Ordering::Relaxed);
                    return Err(io_err("link into", &path, e));
                }
            }
        };
        if let Err(e) = fs::remove_file(&tmp) {
            tracing::warn!(path = %tmp.display(), error = %e, "disk tier: remove temporary");
        }
        index.files.insert(id, file);
        let placed = entries.iter().map(|e| (e.key, e.off, e.len));
        for old in index.insert_pack(id, len, placed) {
            self.delete_pack(&mut index, old);
        }
        self.evict_to_fit(&mut index, Some(id), 0);
        drop(index);
        if self.cfg.fsync {
            sync_dir(&self.root)?;
        }
        Ok(())
    }

    /// Raises the next pack's number to the first one from it that no file in the directory
    /// has (one it cannot list leaves the number as it is: the next link tells). The first
    /// free one, not past the highest: a file named with a number near `u64::MAX` sends no
    /// tier there.
    fn skip_taken_numbers(&self) {
        let Ok(dir) = fs::read_dir(&self.root) else {
            return;
        };
        let taken: FxHashSet<u64> = dir
            .filter_map(|f| pack_number(f.ok()?.file_name().to_str()?))
            .collect();
        // Relaxed: only uniqueness of the number matters.
        let mut next = self.next_pack.load(Ordering::Relaxed);
        while taken.contains(&next) {
            next = next.wrapping_add(1);
        }
        // Relaxed: as above.
        self.next_pack.fetch_max(next, Ordering::Relaxed);
    }

    /// Writes the pack to a new temporary file (a name no other writer holds), once more
    /// after a full file system's eviction; its path.
    fn write_retrying(
        &self,
        table: &[u8],
        values: &[(ChunkKey, &[u8])],
        len: u64,
    ) -> Result<PathBuf, TierError> {
        let mut tries = 0;
        let mut evicted = false;
        loop {
            // Relaxed: only uniqueness of the name matters.
            let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
            let tmp = self.root.join(self.temp_name(n));
            match self.write_temp(&tmp, table, values, len) {
                Ok(()) => return Ok(tmp),
                Err(WriteFailed { taken: true, .. }) if tries < 64 => tries += 1,
                Err(WriteFailed { full: true, .. }) if !evicted => {
                    evicted = true;
                    // Relaxed: statistics only.
                    self.full_writes.fetch_add(1, Ordering::Relaxed);
                    let mut index = self.index.lock();
                    index.lower_capacity(self.cfg.capacity_bytes);
                    self.evict_to_fit(&mut index, None, len);
                }
                Err(f) => {
                    // Relaxed: statistics only.
                    self.write_errors.fetch_add(1, Ordering::Relaxed);
                    return Err(f.err);
                }
            }
        }
    }

    /// The name of the `n`th temporary file (`n` counts this tier's own, apart from the pack
    /// numbers): `<n>.<r>.<pid>.tmp`, `r` a keyed hash of `n`
    /// whose key never leaves the process, so that a co-tenant of the directory who sees
    /// every earlier name still cannot create the next one first and make puts fail.
    fn temp_name(&self, n: u64) -> String {
        use std::hash::BuildHasher;
        if planted!("disk-temp-names-foreseeable") {
            // Planted bug (scripts/plants.sh): the names of earlier builds, `<n>.<pid>.tmp`.
            return format!("{n:016x}.{}.{TEMP_EXT}", self.pid);
        }
        let r = self.temp_names.hash_one(n);
        format!("{n:016x}.{r:016x}.{}.{TEMP_EXT}", self.pid)
    }

    /// Writes a pack (`table`, then `values`, `len` bytes in all) to the new file `tmp`,
    /// flushed if configured; a file that could not be written whole is removed.
    fn write_temp(
        &self,
        tmp: &Path,
        table: &[u8],
        values: &[(ChunkKey, &[u8])],
        len: u64,
    ) -> Result<(), WriteFailed> {
        let failed = |what: &str, path: &Path, e: io::Error| WriteFailed {
            full: is_full(&e),
            taken: e.kind() == io::ErrorKind::AlreadyExists,
            err: io_err(what, path, e),
        };
        #[cfg(test)]
        if let Some(e) = self.test_write_error(len) {
            return Err(failed("write", tmp, e));
        }
        #[cfg(not(test))]
        let _ = len;
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
            .map_err(|e| failed("create", tmp, e))?;
        let mut bufs: Vec<IoSlice<'_>> = Vec::with_capacity(values.len() + 1);
        bufs.push(IoSlice::new(table));
        bufs.extend(values.iter().map(|(_, v)| IoSlice::new(v)));
        let written = write_all_vectored(&mut f, &mut bufs).and_then(|()| {
            if self.cfg.fsync {
                f.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(e) = written {
            drop(f);
            let _ = fs::remove_file(tmp);
            return Err(failed("write", tmp, e));
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
}

/// Whether `name` is a pack's file name (`<16 lowercase hex digits>.pack`), and its number.
pub(super) fn pack_number(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(PACK_EXT)?.strip_suffix('.')?;
    if hex.len() != 16 || !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}
