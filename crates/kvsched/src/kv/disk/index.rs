//! The disk tier's index: key → (pack, offset, length), each pack's file length, keys and
//! last use, packs oldest first, and the bytes held (the packs' file lengths).

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use super::ChunkKey;

/// How long a capacity lowered by a full file system holds before the configured one is
/// tried again.
#[cfg(not(test))]
pub(super) const FULL_HOLDS: std::time::Duration = std::time::Duration::from_secs(60);
#[cfg(test)]
pub(super) const FULL_HOLDS: std::time::Duration = std::time::Duration::from_millis(300);

/// Which file a path names: its device, inode and birth time in nanoseconds (0 where the
/// file system keeps none). The birth time tells a new file from a deleted one whose inode
/// number it reuses, as file systems do at once. `None` where the platform has no inodes,
/// and then every file matches.
pub(super) type FileId = Option<(u64, u64, u128)>;

/// The [`FileId`] of the file `meta` describes.
pub(super) fn file_id(meta: &std::fs::Metadata) -> FileId {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let born = meta
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        Some((meta.dev(), meta.ino(), born))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// Whether two [`FileId`]s may name the same file (either unknown: yes).
pub(super) fn same_file(a: FileId, b: FileId) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// Where a chunk's value lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Place {
    pub pack: u64,
    pub off: u64,
    pub len: u64,
}

/// One pack file.
#[derive(Debug)]
pub(super) struct Pack {
    /// The file's length.
    pub bytes: u64,
    /// Every key written in it (some may since live in a later pack, or be removed).
    pub keys: Vec<ChunkKey>,
    /// Keys the map places in it.
    pub live: usize,
    /// Last-use tick.
    tick: u64,
}

#[derive(Default)]
pub(super) struct Index {
    pub(super) map: FxHashMap<ChunkKey, Place>,
    pub(super) packs: FxHashMap<u64, Pack>,
    /// The pack numbers a rescan skips: those indexed or found and left alone since open
    /// whose files this tier has not deleted, less those a rescan no longer finds (so at most
    /// the packs in the directory at the last rescan and this tier's own).
    pub(super) seen: FxHashSet<u64>,
    /// The file each pack number named when this tier wrote or indexed it (its device and
    /// inode, on Unix): another tier on the directory may put a pack of its own under a
    /// number whose file this one deleted, and a read or a delete must not take that file
    /// for this tier's pack. Kept until the tier deletes the file (or finds it replaced).
    pub(super) files: FxHashMap<u64, FileId>,
    /// Last-use tick → pack, oldest first.
    order: BTreeMap<u64, u64>,
    next_tick: u64,
    pub(super) bytes: u64,
    /// The bytes held when the file system was last found full, and when: the capacity for
    /// [`FULL_HOLDS`] from then (a full file system may be another writer's doing, and free
    /// space come back; the next write that finds it full lowers it again).
    full_at: Option<(u64, std::time::Instant)>,
}

impl Index {
    /// The capacity in force: `configured`, or less once the file system was found full.
    pub(super) fn capacity(&self, configured: u64) -> u64 {
        match self.full_at {
            Some((bytes, when)) if when.elapsed() < FULL_HOLDS => bytes.min(configured),
            _ => configured,
        }
    }

    /// The file system is full: what is held now is all it takes, for [`FULL_HOLDS`].
    pub(super) fn lower_capacity(&mut self, configured: u64) {
        self.full_at = Some((
            self.bytes.min(self.capacity(configured)),
            std::time::Instant::now(),
        ));
    }

    /// Indexes pack `id` of `bytes` bytes holding `entries` (key, offset, length; a later
    /// entry of a key wins), as the most recently used. Returns the packs left without a
    /// live key (their keys now live in this one): no longer indexed, their files to delete.
    pub(super) fn insert_pack(
        &mut self,
        id: u64,
        bytes: u64,
        entries: impl IntoIterator<Item = (ChunkKey, u64, u64)>,
    ) -> Vec<u64> {
        self.next_tick += 1;
        self.seen.insert(id);
        let mut keys = Vec::new();
        let mut emptied = Vec::new();
        let mut live = 0;
        for (key, off, len) in entries {
            let place = Place { pack: id, off, len };
            keys.push(key);
            match self.map.insert(key, place) {
                Some(old) if old.pack == id => {}
                Some(old) => {
                    live += 1;
                    if self.unlink(old.pack) {
                        emptied.push(old.pack);
                    }
                }
                None => live += 1,
            }
        }
        self.packs.insert(
            id,
            Pack {
                bytes,
                keys,
                live,
                tick: self.next_tick,
            },
        );
        self.order.insert(self.next_tick, id);
        self.bytes += bytes;
        if live == 0 {
            self.drop_pack(id);
            emptied.push(id);
        }
        emptied
    }

    /// Pack `id`'s number names another file now (another tier's pack): forgets the pack
    /// and the number, so that a rescan indexes the file now there.
    pub(super) fn forget_replaced(&mut self, id: u64) {
        self.drop_pack(id);
        self.files.remove(&id);
        self.seen.remove(&id);
    }

    /// One key of `pack` is gone: whether the pack has none left (then it is dropped).
    fn unlink(&mut self, pack: u64) -> bool {
        let Some(p) = self.packs.get_mut(&pack) else {
            return false;
        };
        p.live = p.live.saturating_sub(1);
        if p.live > 0 {
            return false;
        }
        self.drop_pack(pack);
        true
    }

    /// Forgets pack `id` and every key it places; how many keys it placed.
    pub(super) fn drop_pack(&mut self, id: u64) -> usize {
        let Some(p) = self.packs.remove(&id) else {
            return 0;
        };
        self.order.remove(&p.tick);
        self.bytes -= p.bytes;
        let mut placed = 0;
        for k in p.keys {
            if self.map.get(&k).is_some_and(|pl| pl.pack == id) {
                self.map.remove(&k);
                placed += 1;
            }
        }
        placed
    }

    /// Forgets `key`; its place, and whether its pack has no key left (then it is dropped).
    pub(super) fn remove(&mut self, key: ChunkKey) -> Option<(Place, bool)> {
        let place = self.map.remove(&key)?;
        Some((place, self.unlink(place.pack)))
    }

    /// The least recently used pack.
    pub(super) fn oldest(&self) -> Option<u64> {
        self.order.values().next().copied()
    }

    /// A use of `key`'s pack.
    pub(super) fn touch(&mut self, key: ChunkKey) {
        if let Some(pack) = self.map.get(&key).map(|p| p.pack) {
            self.use_pack(pack);
        }
    }

    /// A use of pack `pack`: the most recently used now.
    pub(super) fn use_pack(&mut self, pack: u64) {
        self.next_tick += 1;
        let tick = self.next_tick;
        if let Some(p) = self.packs.get_mut(&pack) {
            let old = std::mem::replace(&mut p.tick, tick);
            self.order.remove(&old);
            self.order.insert(tick, pack);
        }
    }

    /// Pack `id`'s file is now `bytes` long, and `key`'s value lies at `place`.
    pub(super) fn edited(&mut self, key: ChunkKey, place: Place, bytes: u64) {
        if let Some(p) = self.packs.get_mut(&place.pack) {
            self.bytes = self.bytes - p.bytes + bytes;
            p.bytes = bytes;
            self.map.insert(key, place);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pack_whose_keys_all_moved_is_dropped() {
        let mut i = Index::default();
        assert!(i
            .insert_pack(1, 100, [(ChunkKey(1), 10, 5), (ChunkKey(2), 15, 5)])
            .is_empty());
        assert!(i.insert_pack(2, 50, [(ChunkKey(1), 10, 5)]).is_empty());
        assert_eq!((i.bytes, i.packs[&1].live), (150, 1));
        assert_eq!(i.insert_pack(3, 40, [(ChunkKey(2), 10, 5)]), vec![1]);
        assert_eq!(i.bytes, 90);
        assert_eq!(i.map[&ChunkKey(1)].pack, 2);
        assert_eq!(i.oldest(), Some(2));
        i.touch(ChunkKey(1));
        assert_eq!(i.oldest(), Some(3));
        assert_eq!(i.remove(ChunkKey(2)).map(|(_, e)| e), Some(true));
        assert_eq!((i.bytes, i.map.len(), i.packs.len()), (50, 1, 1));
        assert_eq!(i.drop_pack(2), 1);
        assert_eq!((i.bytes, i.map.len()), (0, 0));
    }
}
