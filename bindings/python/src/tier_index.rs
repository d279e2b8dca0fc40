//! [`Index`]: what the tier answers to vLLM's `lookup` without touching the store (lookups must
//! not block), and how job results change that answer.
//!
//! A key is, from the tier's point of view:
//!
//! * **storing** — a store job for it is in flight: `lookup` answers `None` (retry later);
//! * **present** — this tier stored it, or a probe of the store found it: `True`. A memory
//!   store, which says at once what it holds, is asked instead ([`Index::lookup_held`]): it
//!   evicts its least recently read chunks behind the index's back, so only its own answer
//!   says whether a key is still there;
//! * **failed** — a load of it failed, whatever the reason (a damaged or forged chunk, a value
//!   the store no longer holds or cannot hand back, a store call that failed): `False`, and
//!   never probed, until a store of this tier writes it again. A tier that failed to load a
//!   chunk never answers "present" for it again (vLLM #49328: otherwise every later request
//!   would be promised the block, fail its load and recompute, forever). A probe cannot tell
//!   a value the store lost or cannot return from one it holds: the store's `EXISTS` or
//!   index answers "held" for a Redis value longer than the chunk bound or of the wrong type,
//!   or a disk pack its reads refuse (a symbolic link, a FIFO, a directory, an oversized
//!   file), so a key re-found by a probe after a failed load would be promised and fail again
//!   on every request. The engine recomputes the block once and stores it again, which
//!   overwrites the bad value and makes the key present;
//! * **probing** — unknown, and the tier is shared with other engines (disk, Redis): `lookup`
//!   starts an existence probe on the tier's threads and answers `None`; the probe's answer
//!   makes the key present, or *absent* — answered `False` once, then forgotten so that a
//!   later lookup probes again (another engine may store it meanwhile);
//! * otherwise **unknown**: `False`.
//!
//! A load that fails makes each key it could not deliver failed (see above). A load stopped
//! by the tier's shutdown changes nothing: the tier answers no lookup after it.
//!
//! # Memory
//!
//! The present and failed sets each hold at most `cap` keys ([`BoundedSet`]; the tier sizes
//! `cap` from its capacity, [`Index::cap_for`]), the absent set at most `cap` or
//! [`Index::ABSENT_CAP`], whichever is less (an absent answer is only kept until the retry
//! that follows its probe), each dropping the oldest first: the store evicts
//! behind the index's back, and an absent key need never be asked again, so neither set can
//! be pruned by what happens to its keys alone. Dropping a key only makes it unknown, which is
//! always a correct state: a private tier answers `False` (a lost hit, recomputed), a shared
//! one probes the store again; a failed key dropped is probed again too, and a probe that
//! finds the bad chunk still present costs one more failed load, never wrong KV (every load is
//! checked). The storing set holds only keys of jobs in flight (the caller's own jobs). The
//! probing set, whose probes no caller asked for, holds at most [`Index::PROBING_CAP`] keys:
//! while it is full, a lookup of an unknown key answers a miss (`False`: a lookup is a hint,
//! never a wait) and starts no probe, so lookups faster than the store answers grow neither
//! the set nor the probe queue.

use std::collections::{HashMap, HashSet};

use kvsched::kv::ChunkKey;

use crate::tier_bounded::BoundedSet;

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

/// Why a key of a load did not load (each is counted apart in `stats()`; every one makes the
/// key failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoadMiss {
    /// The store answered that it does not hold it (evicted, lost, or a value the store
    /// refuses to read, such as a disk pack that is no regular file).
    Absent,
    /// The store holds a chunk that failed its checksum, MAC, key or length check.
    Bad,
    /// The store's call for it failed as a whole (an error reply such as Redis's WRONGTYPE, a
    /// value past the chunk bound, a lost connection, a timeout): nothing was read.
    Unreadable,
}

/// The tier's knowledge of its keys (see the module docs).
#[derive(Debug)]
pub(crate) struct Index {
    present: BoundedSet,
    failed: BoundedSet,
    storing: HashMap<ChunkKey, u32>,
    probing: HashSet<ChunkKey>,
    absent: BoundedSet,
    probe_unknown: bool,
}

/// The lengths of an [`Index`]'s key sets, for `stats()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexLens {
    pub present: usize,
    pub failed: usize,
    pub absent: usize,
}

impl Index {
    /// The fewest keys each set may hold, whatever the capacity.
    pub(crate) const MIN_CAP: usize = 1024;

    /// The most keys the absent set holds, whatever the capacity.
    pub(crate) const ABSENT_CAP: usize = 1 << 16;

    /// The most keys being probed at once (each one probe job queued or running).
    pub(crate) const PROBING_CAP: usize = 1024;

    /// An empty index whose present and failed sets hold at most `cap` keys each, and its
    /// absent set at most `cap` or [`Self::ABSENT_CAP`]; `probe_unknown`: probe the store for
    /// keys it does not know.
    pub(crate) fn new(probe_unknown: bool, cap: usize) -> Index {
        Index {
            present: BoundedSet::new(cap),
            failed: BoundedSet::new(cap),
            storing: HashMap::new(),
            probing: HashSet::new(),
            absent: BoundedSet::new(cap.min(Self::ABSENT_CAP)),
            probe_unknown,
        }
    }

    /// The bound of each key set for a store of `capacity_bytes` holding chunks of
    /// `chunk_bytes`: as many keys as the store can hold chunks, at least [`Self::MIN_CAP`].
    pub(crate) fn cap_for(capacity_bytes: u64, chunk_bytes: u64) -> usize {
        let chunks = capacity_bytes / chunk_bytes.max(1);
        usize::try_from(chunks)
            .unwrap_or(usize::MAX)
            .max(Self::MIN_CAP)
    }

    /// The answer for `key`; on [`Lookup::Probe`] the key is marked probing. An unknown key
    /// while [`Self::PROBING_CAP`] keys are being probed is a [`Lookup::Miss`].
    pub(crate) fn lookup(&mut self, key: ChunkKey) -> Lookup {
        if self.storing.contains_key(&key) || self.probing.contains(&key) {
            return Lookup::Retry;
        }
        if self.present.contains(&key) {
            return Lookup::Hit;
        }
        if self.failed.contains(&key)
            || self.absent.remove(&key)
            || !self.probe_unknown
            || self.probing.len() >= Self::PROBING_CAP
        {
            return Lookup::Miss;
        }
        self.probing.insert(key);
        Lookup::Probe
    }

    /// [`lookup`](Self::lookup) for a store that says at once whether it holds `key`
    /// (`held`: the memory tier, which evicts behind the index's back): being stored, retry;
    /// failed, a miss (never promised again until stored); otherwise what the store holds —
    /// a hit, kept present, or a miss, forgotten, so that a store writes it again.
    pub(crate) fn lookup_held(&mut self, key: ChunkKey, held: bool) -> Lookup {
        if self.storing.contains_key(&key) {
            return Lookup::Retry;
        }
        if self.failed.contains(&key) {
            return Lookup::Miss;
        }
        if held {
            self.present.insert(key);
            Lookup::Hit
        } else {
            self.present.remove(&key);
            Lookup::Miss
        }
    }

    /// A key the store no longer holds though the index took it for present (evicted): it is
    /// forgotten, so a store writes it again.
    pub(crate) fn forget_present(&mut self, key: ChunkKey) {
        self.present.remove(&key);
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

    /// A load of `key` did not deliver it: failed, whatever `why`, until this tier stores it
    /// again ([`Self::end_store`]).
    pub(crate) fn load_missed(&mut self, key: ChunkKey, why: LoadMiss) {
        // The plant `tier-present-after-failed-load` (scripts/plants.sh; `planted!` of
        // crates/kvsched/src/plant.rs, spelled out here as the macro is the library's own):
        // vLLM #49328, a tier that keeps answering "present" for a chunk it failed to load.
        if cfg!(kvsched_plant = "tier-present-after-failed-load") {
            return;
        }
        self.present.remove(&key);
        // The plant `tier-failed-load-probed-again` (scripts/plants.sh): only a chunk that
        // failed its checks is failed; a key the store did not hand back is unknown again, so
        // the next lookup's probe finds it held and promises it again, on every request.
        if why == LoadMiss::Bad || !cfg!(kvsched_plant = "tier-failed-load-probed-again") {
            self.failed.insert(key);
        }
    }

    /// The lengths of the key sets.
    pub(crate) fn lens(&self) -> IndexLens {
        IndexLens {
            present: self.present.len(),
            failed: self.failed.len(),
            absent: self.absent.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: ChunkKey = ChunkKey(7);

    #[test]
    fn a_failed_load_is_never_present_again_until_restored() {
        let mut ix = Index::new(true, 16);
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
    fn a_load_that_failed_for_any_reason_is_not_probed_again_until_restored() {
        for why in [LoadMiss::Absent, LoadMiss::Bad, LoadMiss::Unreadable] {
            let mut ix = Index::new(true, 16);
            assert!(ix.begin_store(K));
            ix.end_store(K, true);
            assert_eq!(ix.lookup(K), Lookup::Hit);
            ix.load_missed(K, why);
            // Not promised, and not asked of the store (whose EXISTS may still say held).
            for _ in 0..3 {
                assert_eq!(ix.lookup(K), Lookup::Miss, "{why:?}");
            }
            // A probe already in flight when the load failed changes nothing either.
            ix.end_probe(K, true);
            assert_eq!(ix.lookup(K), Lookup::Miss, "{why:?}");
            assert_eq!(ix.lens().failed, 1);
            // A failed store leaves it failed; a store of this tier makes it present.
            assert!(ix.begin_store(K));
            ix.end_store(K, false);
            assert_eq!(ix.lookup(K), Lookup::Miss, "{why:?}");
            assert!(ix.begin_store(K));
            ix.end_store(K, true);
            assert_eq!(ix.lookup(K), Lookup::Hit, "{why:?}");
            assert_eq!(ix.lens().failed, 0);
        }
    }

    #[test]
    fn absent_is_answered_once_then_probed_again() {
        let mut ix = Index::new(true, 16);
        assert_eq!(ix.lookup(K), Lookup::Probe);
        ix.end_probe(K, false);
        assert_eq!(ix.lookup(K), Lookup::Miss);
        assert_eq!(ix.lookup(K), Lookup::Probe);
        let mut private = Index::new(false, 16);
        assert_eq!(private.lookup(K), Lookup::Miss);
        assert!(private.begin_store(K));
        assert!(!private.begin_store(K));
        private.end_store(K, false);
        assert_eq!(private.lookup(K), Lookup::Miss);
    }

    #[test]
    fn probes_in_flight_are_bounded_and_past_the_bound_a_lookup_misses() {
        let mut ix = Index::new(true, 16);
        for i in 0..Index::PROBING_CAP as u128 {
            assert_eq!(ix.lookup(ChunkKey(i)), Lookup::Probe);
        }
        let late = ChunkKey(1 << 40);
        assert_eq!(ix.lookup(late), Lookup::Miss);
        assert_eq!(ix.lookup(ChunkKey(0)), Lookup::Retry);
        assert_eq!(ix.probing.len(), Index::PROBING_CAP);
        // One probe answered: room for one more.
        ix.end_probe(ChunkKey(0), false);
        assert_eq!(ix.lookup(late), Lookup::Probe);
        assert_eq!(ix.lookup(ChunkKey(1 << 41)), Lookup::Miss);
    }

    #[test]
    fn the_key_sets_stay_bounded_and_a_dropped_key_is_unknown_again() {
        let mut shared = Index::new(true, 4);
        let mut private = Index::new(false, 4);
        for i in 0..1000 {
            let k = ChunkKey(i);
            for ix in [&mut shared, &mut private] {
                assert!(ix.begin_store(k));
                ix.end_store(k, true);
            }
            // Asked once, found absent, never asked again.
            let a = ChunkKey(1 << 20 | i);
            assert_eq!(shared.lookup(a), Lookup::Probe);
            shared.end_probe(a, false);
            let b = ChunkKey(1 << 21 | i);
            shared.load_missed(b, LoadMiss::Bad);
            for ix in [&shared, &private] {
                let l = ix.lens();
                assert!(l.present <= 4 && l.absent <= 4 && l.failed <= 4, "{l:?}");
            }
        }
        assert_eq!(shared.lookup(ChunkKey(999)), Lookup::Hit);
        // Dropped from present: a shared tier asks the store again, a private one says no.
        assert_eq!(shared.lookup(ChunkKey(0)), Lookup::Probe);
        assert_eq!(private.lookup(ChunkKey(0)), Lookup::Miss);
        assert_eq!(private.lookup(ChunkKey(999)), Lookup::Hit);
        assert_eq!(Index::cap_for(1 << 30, 1 << 20), Index::MIN_CAP);
        assert_eq!(Index::cap_for(1 << 30, 1 << 10), 1 << 20);
        assert_eq!(Index::cap_for(5, 0), Index::MIN_CAP);
        let big = Index::new(true, 1 << 24);
        assert_eq!(big.absent.cap(), Index::ABSENT_CAP);
        assert_eq!(big.present.cap(), 1 << 24);
    }
}
