//! [`BoundedSet`]: a set of chunk keys that holds at most `cap` of them, dropping the oldest
//! insertion first — the memory bound of each of the tier's key sets ([`Index`]).
//!
//! A key re-inserted moves to the newest end. Removal is lazy: the insertion order is a queue
//! of `(key, generation)` whose stale entries (removed or re-inserted keys) are skipped when
//! they reach its front and swept out whenever the queue grows past twice the set, so the
//! queue is never more than about twice the set's length and every operation is amortized
//! O(1).
//!
//! [`Index`]: crate::tier_index::Index

use std::collections::{HashMap, VecDeque};

use kvsched::kv::ChunkKey;

/// A set of at most `cap` keys, the oldest dropped first.
#[derive(Debug)]
pub(crate) struct BoundedSet {
    /// Each key and the generation of its latest insertion.
    keys: HashMap<ChunkKey, u64>,
    /// Insertions in order; an entry is live while `keys` holds its key at its generation.
    order: VecDeque<(ChunkKey, u64)>,
    next: u64,
    cap: usize,
}

impl BoundedSet {
    /// An empty set of at most `cap` keys (at least 1).
    pub(crate) fn new(cap: usize) -> BoundedSet {
        BoundedSet {
            keys: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
            cap: cap.max(1),
        }
    }

    /// Whether `key` is held.
    pub(crate) fn contains(&self, key: &ChunkKey) -> bool {
        self.keys.contains_key(key)
    }

    /// Inserts `key` as the newest, dropping the oldest keys beyond the bound.
    pub(crate) fn insert(&mut self, key: ChunkKey) {
        let generation = self.next;
        self.next += 1;
        self.keys.insert(key, generation);
        self.order.push_back((key, generation));
        // The plant `tier-index-unbounded` (scripts/plants.sh): the set keeps every key it is
        // given, and the tier's index grows with every key ever stored or asked.
        while self.keys.len() > self.cap && !cfg!(kvsched_plant = "tier-index-unbounded") {
            let Some((old, g)) = self.order.pop_front() else {
                break;
            };
            if self.keys.get(&old) == Some(&g) {
                self.keys.remove(&old);
            }
        }
        self.sweep();
    }

    /// Removes `key`; whether it was held.
    pub(crate) fn remove(&mut self, key: &ChunkKey) -> bool {
        let held = self.keys.remove(key).is_some();
        self.sweep();
        held
    }

    /// The most keys held.
    #[cfg(test)]
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Number of keys held.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Drops the queue's stale entries once they outnumber the live ones.
    fn sweep(&mut self) {
        if self.order.len() > 2 * self.keys.len() + 16 {
            let keys = &self.keys;
            self.order.retain(|(k, g)| keys.get(k) == Some(g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_at_most_cap_keys_and_drops_the_oldest() {
        let mut s = BoundedSet::new(3);
        for i in 0..10 {
            s.insert(ChunkKey(i));
            assert!(s.len() <= 3);
            assert!(s.order.len() <= 2 * s.len() + 16);
        }
        assert!(s.contains(&ChunkKey(9)) && s.contains(&ChunkKey(7)));
        assert!(!s.contains(&ChunkKey(6)));
        // A re-inserted key is the newest again.
        s.insert(ChunkKey(7));
        s.insert(ChunkKey(10));
        s.insert(ChunkKey(11));
        assert!(s.contains(&ChunkKey(7)) && !s.contains(&ChunkKey(8)));
        assert!(s.remove(&ChunkKey(7)) && !s.remove(&ChunkKey(7)));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn removals_and_reinsertions_do_not_grow_the_queue() {
        let mut s = BoundedSet::new(1000);
        for i in 0..100_000 {
            s.insert(ChunkKey(i % 7));
            s.remove(&ChunkKey((i + 3) % 7));
            assert!(
                s.order.len() <= 2 * s.len() + 16,
                "{} for {}",
                s.order.len(),
                s.len()
            );
        }
    }
}
