//! [`Index`]: what the tier answers to vLLM's `lookup` without touching the store (lookups must
//! not block), and how job results change that answer.
//!
//! A key is, from the tier's point of view:
//!
//! * **storing** — a store job for it is in flight: `lookup` answers `None` (retry later);
//! * **present** — this tier stored it, or a probe of the store found it: `True`;
//! * **failed** — a load of it found a damaged or forged chunk: `False` until a store of this
//!   tier writes it again. A tier that failed to load a chunk never answers "present" for it
//!   again (vLLM #49328: otherwise every later request would be promised the block, fail its
//!   load and recompute, forever);
//! * **probing** — unknown, and the tier is shared with other engines (disk, Redis): `lookup`
//!   starts an existence probe on the tier's threads and answers `None`; the probe's answer
//!   makes the key present, or *absent* — answered `False` once, then forgotten so that a
//!   later lookup probes again (another engine may store it meanwhile);
//! * otherwise **unknown**: `False`.
//!
//! A load that misses (the chunk was evicted, or the store lost it) makes the key unknown
//! again; a load that finds a bad chunk makes it failed.

use std::collections::{HashMap, HashSet};

use kvsched::kv::ChunkKey;

/// The answer of a lookup, and whether it asks for a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Present and ready.
    Hit,
    /// Not here.
    Miss,
    /// Being transferred or probed: ask again later.
    Retry,
    /// Unknown: the caller must enqueue a probe, then answer `Retry`.
    Probe,
}

/// Why a key of a load did not load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoadMiss {
    /// The store does not hold it (evicted, lost) or could not be asked.
    Absent,
    /// The store holds a chunk that failed its checksum, MAC, key or length check.
    Bad,
}

/// The tier's knowledge of its keys (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Index {
    present: HashSet<ChunkKey>,
    failed: HashSet<ChunkKey>,
    storing: HashMap<ChunkKey, u32>,
    probing: HashSet<ChunkKey>,
    absent: HashSet<ChunkKey>,
    probe_unknown: bool,
}

impl Index {
    /// An empty index; `probe_unknown`: probe the store for keys it does not know.
    pub(crate) fn new(probe_unknown: bool) -> Index {
        Index {
            probe_unknown,
            ..Index::default()
        }
    }

    /// The answer for `key`; on [`Lookup::Probe`] the key is marked probing.
    pub(crate) fn lookup(&mut self, key: ChunkKey) -> Lookup {
        if self.storing.contains_key(&key) || self.probing.contains(&key) {
            return Lookup::Retry;
        }
        if self.present.contains(&key) {
            return Lookup::Hit;
        }
        if self.failed.contains(&key) || self.absent.remove(&key) || !self.probe_unknown {
            return Lookup::Miss;
        }
        self.probing.insert(key);
        Lookup::Probe
    }

    /// Whether a store of `key` is needed (it is neither present nor being stored); if so, it
    /// is marked storing.
    pub(crate) fn begin_store(&mut self, key: ChunkKey) -> bool {
        if self.present.contains(&key) || self.storing.contains_key(&key) {
            return false;
        }
        *self.storing.entry(key).or_insert(0) += 1;
        true
    }

    /// A store of `key` ended (`ok`: the store accepted it).
    pub(crate) fn end_store(&mut self, key: ChunkKey, ok: bool) {
        if let Some(n) = self.storing.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.storing.remove(&key);
            }
        }
        if ok {
            self.failed.remove(&key);
            self.absent.remove(&key);
            self.present.insert(key);
        }
    }

    /// A probe of `key` answered `exists`.
    pub(crate) fn end_probe(&mut self, key: ChunkKey, exists: bool) {
        self.probing.remove(&key);
        if self.failed.contains(&key) {
            return;
        }
        if exists {
            self.present.insert(key);
        } else {
            self.absent.insert(key);
        }
    }

    /// A load of `key` did not deliver it.
    pub(crate) fn load_missed(&mut self, key: ChunkKey, why: LoadMiss) {
        // The plant `tier-present-after-failed-load` (scripts/plants.sh; `planted!` of
        // crates/kvsched/src/plant.rs, spelled out here as the macro is the library's own):
        // vLLM #49328, a tier that keeps answering "present" for a chunk it failed to load.
        if cfg!(kvsched_plant = "tier-present-after-failed-load") {
            return;
        }
        self.present.remove(&key);
        if why == LoadMiss::Bad {
            self.failed.insert(key);
        }
    }

    /// Keys answered present.
    pub(crate) fn present_len(&self) -> usize {
        self.present.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: ChunkKey = ChunkKey(7);

    #[test]
    fn a_failed_load_is_never_present_again_until_restored() {
        let mut ix = Index::new(true);
        assert_eq!(ix.lookup(K), Lookup::Probe);
        assert_eq!(ix.lookup(K), Lookup::Retry);
        ix.end_probe(K, true);
        assert_eq!(ix.lookup(K), Lookup::Hit);
        ix.load_missed(K, LoadMiss::Bad);
        for _ in 0..3 {
            assert_eq!(ix.lookup(K), Lookup::Miss);
        }
        assert!(ix.begin_store(K));
        assert_eq!(ix.lookup(K), Lookup::Retry);
        ix.end_store(K, true);
        assert_eq!(ix.lookup(K), Lookup::Hit);
    }

    #[test]
    fn absent_is_answered_once_then_probed_again() {
        let mut ix = Index::new(true);
        assert_eq!(ix.lookup(K), Lookup::Probe);
        ix.end_probe(K, false);
        assert_eq!(ix.lookup(K), Lookup::Miss);
        assert_eq!(ix.lookup(K), Lookup::Probe);
        let mut private = Index::new(false);
        assert_eq!(private.lookup(K), Lookup::Miss);
        assert!(private.begin_store(K));
        assert!(!private.begin_store(K));
        private.end_store(K, false);
        assert_eq!(private.lookup(K), Lookup::Miss);
    }
}
