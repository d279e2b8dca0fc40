//! [`KeyIndex`]: the connector's local, bounded answer to "does the tier hold this chunk?",
//! so a lookup never waits for a tier.

use rustc_hash::FxHashSet;

use super::ChunkKey;
use crate::sync::Mutex;

const SHARDS: usize = 16;

/// A bounded, sharded set of chunk keys believed held by the tier: keys this process saved or
/// loaded, and keys a background probe found. A hint: a key may be gone by the time it is
/// loaded (a failed block, recovered like any other), and a held key may be missing from the
/// index (a miss, and a probe).
///
/// Memory is bounded, and what is forgotten is what was used longest ago: each shard keeps
/// two generations of at most half its share of the capacity each. Keys are inserted into
/// the young one; a key found in the old one moves to the young one; when the young one is
/// full it becomes the old one and the old one is forgotten. So the index costs at most
/// `capacity` keys, and the keys asked for or saved within the last half of it are always
/// remembered. (Forgetting arbitrary keys instead would cut holes into the chains of long
/// prompts, and a prefix lookup stops at its first hole.)
#[derive(Debug)]
pub(crate) struct KeyIndex {
    shards: Box<[Mutex<Generations>]>,
    /// Most keys of one generation of one shard.
    per_generation: usize,
}

/// One shard's keys: the young generation and the old one.
#[derive(Debug, Default)]
struct Generations {
    young: FxHashSet<u128>,
    old: FxHashSet<u128>,
}

impl Generations {
    /// Puts `key` into the young generation, first turning a full young generation old. The
    /// forgotten generation's table is cleared and reused as the young one, so a turn
    /// allocates nothing and the young set never regrows from empty.
    fn make_young(&mut self, key: u128, per_generation: usize) {
        if self.young.contains(&key) {
            return;
        }
        if self.young.len() >= per_generation {
            std::mem::swap(&mut self.young, &mut self.old);
            self.young.clear();
        }
        self.old.remove(&key);
        self.young.insert(key);
    }
}

impl KeyIndex {
    pub(crate) fn new(capacity: usize) -> KeyIndex {
        KeyIndex {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Generations::default()))
                .collect(),
            per_generation: (capacity / SHARDS / 2).max(1),
        }
    }

    fn shard(&self, k: ChunkKey) -> &Mutex<Generations> {
        &self.shards[(k.0 as usize) % SHARDS]
    }

    /// Whether `k` is believed held; a key of the old generation becomes young again.
    pub(crate) fn contains(&self, k: ChunkKey) -> bool {
        let mut s = self.shard(k).lock();
        if s.young.contains(&k.0) {
            return true;
        }
        if s.old.contains(&k.0) {
            s.make_young(k.0, self.per_generation);
            return true;
        }
        false
    }

    pub(crate) fn insert(&self, k: ChunkKey) {
        self.shard(k).lock().make_young(k.0, self.per_generation);
    }

    pub(crate) fn remove(&self, k: ChunkKey) {
        let mut s = self.shard(k).lock();
        s.young.remove(&k.0);
        s.old.remove(&k.0);
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_exact_for_recent_keys() {
        let ix = KeyIndex::new(64);
        for i in 0..10_000u128 {
            ix.insert(ChunkKey(i));
            assert!(ix.contains(ChunkKey(i)));
        }
        let held: usize = ix
            .shards
            .iter()
            .map(|s| {
                let s = s.lock();
                s.young.len() + s.old.len()
            })
            .sum();
        assert!(held <= 64, "{held} keys held");
        ix.remove(ChunkKey(9_999));
        assert!(!ix.contains(ChunkKey(9_999)));
    }

    /// A full index forgets the keys used longest ago, never recent ones: every key of the
    /// last half of its capacity (per shard) is remembered, and so is an old key looked up
    /// again and again while new ones arrive.
    #[test]
    fn full_it_forgets_the_least_recently_used_keys() {
        let capacity = 1024;
        let ix = KeyIndex::new(capacity);
        let hot = ChunkKey(7);
        ix.insert(hot);
        for i in 1_000..1_000 + 20 * capacity as u128 {
            ix.insert(ChunkKey(i));
            if i % 64 == 0 {
                assert!(ix.contains(hot), "the hot key was forgotten at {i}");
            }
        }
        let last = 1_000 + 20 * capacity as u128;
        // Keys are spread over the shards by their low bits: the last capacity / 2 keys put
        // capacity / 2 / SHARDS = per_generation into each shard's young or old generation.
        for i in last - capacity as u128 / 2..last {
            assert!(ix.contains(ChunkKey(i)), "recent key {i} forgotten");
        }
        // And the oldest ones are gone.
        let remembered = (1_000..1_000 + capacity as u128)
            .filter(|&i| ix.contains(ChunkKey(i)))
            .count();
        assert_eq!(remembered, 0);
    }
}
