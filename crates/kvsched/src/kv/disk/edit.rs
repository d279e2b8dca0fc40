//! Editing or removing one stored value in place: what a repair tool or the test kit's fault
//! injection (`kvsched_testkit::FaultyTier`) uses to change a pack at rest exactly as real
//! damage would.

use std::fs::File;
use std::path::Path;

use super::index::Place;
use super::pack::{self, Entry};
use super::read::{read_at, safe_open, write_at, Opened};
use super::scan::read_table;
use super::{io_err, DiskTier};
use crate::kv::{ChunkKey, TierError};
use crate::sync::Ordering;

impl DiskTier {
    /// Reads the value of `key`, lets `edit` change its bytes, and writes them back into its
    /// pack (no atomic rename: this is damage at rest, not a store): over the old bytes when
    /// no longer than they were, else at the pack's end; a new length or place is written
    /// into the pack's table too (resealed), so a reopen reads the edited value as well.
    /// Returns what `edit` returned, or `false` when no value is held.
    ///
    /// # Errors
    ///
    /// An I/O error, or [`TierError::Refused`] when the edited value would be longer than
    /// the largest value or make the pack longer than the largest pack.
    pub fn edit_stored(
        &self,
        key: ChunkKey,
        edit: impl FnOnce(&mut Vec<u8>) -> bool,
    ) -> Result<bool, TierError> {
        let mut index = self.index.lock();
        let Some(place) = index.map.get(&key).copied() else {
            return Ok(false);
        };
        // Relaxed: a bound, as the reads take it.
        let bound = self.expected_max.load(Ordering::Relaxed);
        if bound > 0 && place.len > bound {
            return Ok(false); // no value of the callers' (see `read_into`)
        }
        let path = self.path_of(place.pack);
        let Opened::File(f, meta) = safe_open(&path, true, self.pack_limit())? else {
            return Ok(false);
        };
        if !self.is_own_file(&index, place.pack, &meta) {
            // Another tier's pack under a number this one's file had: not this key's.
            index.forget_replaced(place.pack);
            return Ok(false);
        }
        let file_len = meta.len();
        let mut v = vec![0u8; place.len.min(self.limit()) as usize];
        let n = read_at(&f, &mut v, place.off).map_err(|e| io_err("edit", &path, e))?;
        v.truncate(n);
        if !edit(&mut v) {
            return Ok(false);
        }
        let len = v.len() as u64;
        let off = if len <= place.len {
            place.off
        } else {
            file_len
        };
        let end = off.saturating_add(len);
        if len > self.limit() || end > self.pack_limit() {
            return Err(TierError::Refused(format!(
                "edit of key {key}: {len} bytes, more than the disk tier takes there"
            )));
        }
        write_at(&f, &v, off).map_err(|e| io_err("edit", &path, e))?;
        let moved = Place { off, len, ..place };
        if moved != place {
            self.rewrite_entry(&f, &path, file_len.max(end), (key, place), Some(moved))?;
        }
        index.edited(key, moved, file_len.max(end));
        Ok(true)
    }

    /// Deletes the value of `key`: its pack's file when it held no other, else a tombstone
    /// in the pack's table (so a reopen does not find it); `false` if none was held.
    pub fn remove(&self, key: ChunkKey) -> Result<bool, TierError> {
        let mut index = self.index.lock();
        let Some((place, emptied)) = index.remove(key) else {
            return Ok(false);
        };
        let path = self.path_of(place.pack);
        if emptied {
            let now = std::fs::symlink_metadata(&path).ok();
            let own = now
                .as_ref()
                .is_none_or(|m| self.is_own_file(&index, place.pack, m));
            index.files.remove(&place.pack);
            index.seen.remove(&place.pack);
            if !own {
                return Ok(false); // another tier's pack now: left alone
            }
            return match std::fs::remove_file(&path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(io_err("remove", &path, e)),
            };
        }
        let Opened::File(f, meta) = safe_open(&path, true, self.pack_limit())? else {
            return Ok(false);
        };
        if !self.is_own_file(&index, place.pack, &meta) {
            index.forget_replaced(place.pack);
            return Ok(false);
        }
        self.rewrite_entry(&f, &path, meta.len(), (key, place), None)?;
        Ok(true)
    }

    /// Rewrites the table of the pack `f` (at `path`, `file_len` bytes once edited): the
    /// entry of `key` at `was` now says `now`, or is a tombstone. A table that no longer reads as a
    /// pack's is left as it is (the pack is refused at the next open either way).
    fn rewrite_entry(
        &self,
        f: &File,
        path: &Path,
        file_len: u64,
        (key, was): (ChunkKey, Place),
        now: Option<Place>,
    ) -> Result<(), TierError> {
        let read = read_table(f, file_len, self.limit()).map_err(|e| io_err("edit", path, e))?;
        let Some(mut entries) = read else {
            return Ok(());
        };
        for e in entries
            .iter_mut()
            .filter(|e| e.key == key && e.off == was.off && e.len == was.len)
        {
            *e = match now {
                Some(p) => Entry {
                    key: e.key,
                    off: p.off,
                    len: p.len,
                },
                None => Entry {
                    key: e.key,
                    off: pack::REMOVED,
                    len: 0,
                },
            };
        }
        write_at(f, &pack::encode(&entries), 0).map_err(|e| io_err("edit", path, e))
    }
}
