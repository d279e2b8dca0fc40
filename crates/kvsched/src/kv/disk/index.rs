//! The disk tier's index: key → (last use, file length), oldest first, and the bytes held.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::ChunkKey;

#[derive(Default)]
pub(super) struct Index {
    /// Key → (last-use tick, file length).
    pub(super) map: FxHashMap<ChunkKey, (u64, u64)>,
    /// Last-use tick → key, oldest first.
    pub(super) order: BTreeMap<u64, ChunkKey>,
    next_tick: u64,
    pub(super) bytes: u64,
    /// The bytes held when the file system was last found full: the capacity from then on.
    full_at: Option<u64>,
}

impl Index {
    /// The capacity in force: `configured`, or less once the file system was found full.
    pub(super) fn capacity(&self, configured: u64) -> u64 {
        self.full_at.map_or(configured, |f| f.min(configured))
    }

    /// The file system is full: what is held now is all it takes.
    pub(super) fn lower_capacity(&mut self, configured: u64) {
        self.full_at = Some(self.bytes.min(self.capacity(configured)));
    }

    pub(super) fn insert(&mut self, key: ChunkKey, len: u64) {
        self.remove(key);
        self.next_tick += 1;
        self.map.insert(key, (self.next_tick, len));
        self.order.insert(self.next_tick, key);
        self.bytes += len;
    }

    pub(super) fn remove(&mut self, key: ChunkKey) -> bool {
        let Some((tick, len)) = self.map.remove(&key) else {
            return false;
        };
        self.order.remove(&tick);
        self.bytes -= len;
        true
    }

    pub(super) fn touch(&mut self, key: ChunkKey) {
        self.next_tick += 1;
        let tick = self.next_tick;
        if let Some((t, _)) = self.map.get_mut(&key) {
            let old = std::mem::replace(t, tick);
            self.order.remove(&old);
            self.order.insert(tick, key);
        }
    }
}
