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
/// Memory is bounded: a shard that reaches its share of the capacity forgets half its keys
/// (arbitrary ones), so the index costs at most `capacity` keys.
#[derive(Debug)]
pub(crate) struct KeyIndex {
    shards: Box<[Mutex<FxHashSet<u128>>]>,
    per_shard: usize,
}

impl KeyIndex {
    pub(crate) fn new(capacity: usize) -> KeyIndex {
        KeyIndex {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(FxHashSet::default()))
                .collect(),
            per_shard: (capacity / SHARDS).max(1),
        }
    }

    fn shard(&self, k: ChunkKey) -> &Mutex<FxHashSet<u128>> {
        &self.shards[(k.0 as usize) % SHARDS]
    }

    pub(crate) fn contains(&self, k: ChunkKey) -> bool {
        self.shard(k).lock().contains(&k.0)
    }

    pub(crate) fn insert(&self, k: ChunkKey) {
        let mut s = self.shard(k).lock();
        if s.len() >= self.per_shard {
            let keep = self.per_shard / 2;
            let mut n = 0;
            s.retain(|_| {
                n += 1;
                n <= keep
            });
        }
        s.insert(k.0);
    }

    pub(crate) fn remove(&self, k: ChunkKey) {
        self.shard(k).lock().remove(&k.0);
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
        let held: usize = ix.shards.iter().map(|s| s.lock().len()).sum();
        assert!(held <= 64, "{held} keys held");
        ix.remove(ChunkKey(9_999));
        assert!(!ix.contains(ChunkKey(9_999)));
    }
}
