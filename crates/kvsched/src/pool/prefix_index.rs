//! The prefix index: `hash → BlockRef`, split into shards behind short mutexes (which a step
//! holding the pool's [`Exclusive`](super::Exclusive) mode skips), and the pool operations
//! that use it — [`register`](BlockPool::register),
//! [`lookup`](BlockPool::lookup), [`contains_hash`](BlockPool::contains_hash) and
//! [`evict`](BlockPool::evict). (The reclaim path drops a claimed block's entry with
//! [`remove_index_entry`](BlockPool::remove_index_entry).)
//!
//! The index only names candidates: an entry counts while its block is `CACHED` at the
//! entry's generation, checked under the shard lock of the entry's hash. `CACHED` is set and
//! cleared only under that lock (by [`register`](BlockPool::register) and
//! [`evict`](BlockPool::evict)) or together with a generation bump (a reclaim), so stale
//! entries are recognised and removed when met.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

use super::exclusive::ModeLock;
use super::state::State;
use super::{transition, BlockHash, BlockPool, BlockRef};
use crate::rules::geometry::BlockId;
use crate::sync::{spin_hint, Ordering};

/// Shards of the prefix index (a power of two).
#[cfg(not(kvsched_loom))]
const INDEX_SHARD_BITS: u32 = 3;
#[cfg(kvsched_loom)]
const INDEX_SHARD_BITS: u32 = 3;
const INDEX_SHARDS: usize = 1 << INDEX_SHARD_BITS;

/// How often [`BlockPool::evict`] re-reads a slot whose hash word does not match the index
/// (a registration in flight on another thread) before giving up.
#[cfg(not(kvsched_loom))]
const EVICT_RETRIES: u32 = 1 << 12;
#[cfg(kvsched_loom)]
const EVICT_RETRIES: u32 = 3;

/// Entries the index makes room for up front: a larger pool's index grows past it.
const PRESIZED_ENTRIES: usize = 1 << 20;

/// One shard's map.
type Map = FxHashMap<BlockHash, Entered>;

/// The block an index entry names: a [`BlockRef`] in one word, the id in the high 32 bits
/// and the generation in the low 32, so a bucket of the map takes 16 bytes rather than 24
/// (the index is the pool's largest table, probed on every registration, lookup and
/// reclaim). Only a current block of the pool is entered, and a pool's ids fit in 32 bits
/// (it has at most `u32::MAX` slots: [`BlockPool::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entered(u64);

impl Entered {
    /// `r` in one word; `r.id` must be below 2³² (every id a slot lookup accepted is).
    #[inline]
    fn new(r: BlockRef) -> Self {
        Entered((r.id << 32) | u64::from(r.generation))
    }

    #[inline]
    fn get(self) -> BlockRef {
        BlockRef {
            id: self.0 >> 32,
            generation: self.0 as u32,
        }
    }
}

/// The prefix index, sharded by hash.
pub(super) struct PrefixIndex {
    shards: Box<[ModeLock<Map>]>,
}

impl PrefixIndex {
    /// An empty index with room for an entry per block of a pool of `num_blocks` (up to
    /// [`PRESIZED_ENTRIES`]), so registering never rehashes into fresh memory while the
    /// cache fills.
    pub(super) fn new(num_blocks: usize) -> Self {
        let per_shard = num_blocks.min(PRESIZED_ENTRIES) / INDEX_SHARDS;
        let shards = (0..INDEX_SHARDS)
            .map(|_| {
                ModeLock::new(FxHashMap::with_capacity_and_hasher(
                    per_shard,
                    Default::default(),
                ))
            })
            .collect();
        PrefixIndex { shards }
    }

    /// The number of the shard holding `hash`.
    fn shard_number(hash: BlockHash) -> usize {
        // Fibonacci hashing: callers' hashes may vary mostly in their low bits.
        let i = (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - INDEX_SHARD_BITS)) as usize;
        i & (INDEX_SHARDS - 1)
    }

    /// Calls `f` on the map of `hash`'s shard, as [`ModeLock::with`] does.
    #[inline]
    fn with<R>(&self, hash: BlockHash, exclusive: bool, f: impl FnOnce(&mut Map) -> R) -> R {
        self.shards[Self::shard_number(hash)].with(exclusive, f)
    }

    /// Calls `f(map, i)` for each `i` in `0..hashes.len()` with `map` the shard of
    /// `hashes[i]`, reaching each shard (taking its lock unless `exclusive`) once per group of
    /// up to [`GROUP`] consecutive entries rather than once per entry. Within a shard the
    /// entries come in their order; between shards the order is the shards' first appearance.
    /// When `exclusive` no lock is taken, so there is nothing to group: the entries come in
    /// their order, each reaching its shard directly.
    fn for_each_grouped(
        &self,
        exclusive: bool,
        hashes: impl Fn(usize) -> BlockHash,
        n: usize,
        mut f: impl FnMut(&mut Map, usize),
    ) {
        if exclusive {
            for i in 0..n {
                self.with(hashes(i), true, |map| f(map, i));
            }
            return;
        }
        let mut start = 0;
        while start < n {
            let m = (n - start).min(GROUP);
            let mut shard_of = [0u8; GROUP];
            for (j, s) in shard_of.iter_mut().enumerate().take(m) {
                // Fits: INDEX_SHARDS ≤ 256.
                *s = Self::shard_number(hashes(start + j)) as u8;
            }
            // Bit j: entry `start + j` not visited yet.
            let mut left: u64 = if m == GROUP { u64::MAX } else { (1 << m) - 1 };
            while left != 0 {
                let s = shard_of[left.trailing_zeros() as usize];
                self.shards[usize::from(s)].with(exclusive, |map| {
                    let mut rest = left;
                    while rest != 0 {
                        let j = rest.trailing_zeros() as usize;
                        rest &= rest - 1;
                        if shard_of[j] == s {
                            f(map, start + j);
                            left &= !(1 << j);
                        }
                    }
                });
            }
            start += m;
        }
    }
}

/// Entries [`PrefixIndex::for_each_grouped`] sorts by shard at a time (one bit each of a
/// `u64`).
const GROUP: usize = 64;

impl BlockPool {
    /// Registers `r` in the prefix index under `hash` and marks it cached.
    ///
    /// Returns `true` if it did: `hash` was absent (or named a block no longer cached under
    /// it), `r` is current, referenced and not already cached. Otherwise `false`, with no
    /// change.
    ///
    /// # Guarantees
    ///
    /// The caller's writes to the block before this call happen-before any
    /// [`lookup`](Self::lookup) hit on it. The caller must hold a reference to `r` for the
    /// duration of the call (as it must to write the block); a registration racing with the
    /// block's last release may leave a stale index entry, which lookups discard.
    pub fn register(&self, hash: BlockHash, r: BlockRef) -> bool {
        self.index.with(hash, self.is_exclusive(), |map| {
            self.register_locked(map, hash, r)
        })
    }

    /// Registers each `(hash, r)` of `entries` as [`register`](Self::register) does, taking
    /// each index shard's lock once for the entries it holds instead of once per entry
    /// (under [`exclusive`](Self::exclusive), which takes no lock, in their order).
    /// Entries in one shard are registered in their order; a hash that appears twice is
    /// registered once, under its first block.
    ///
    /// # Guarantees
    ///
    /// Those of [`register`](Self::register), for every entry. Another thread may see a later
    /// entry registered before an earlier one of another shard (each is visible from its own
    /// registration on, as with separate calls racing a lookup).
    pub fn register_all(&self, entries: &[(BlockHash, BlockRef)]) {
        self.index.for_each_grouped(
            self.is_exclusive(),
            |i| entries[i].0,
            entries.len(),
            |map, i| {
                let (hash, r) = entries[i];
                self.register_locked(map, hash, r);
            },
        );
    }

    /// The body of [`register`](Self::register), under the lock of `hash`'s shard (`map`).
    fn register_locked(&self, map: &mut Map, hash: BlockHash, r: BlockRef) -> bool {
        let (Some(slot), Some(hash_word)) = (self.slot(r.id), self.hash_word(r.id)) else {
            return false;
        };
        // One probe of the map for the check and the insert.
        let entry = map.entry(hash);
        if let Entry::Occupied(e) = &entry {
            if self.is_registered(e.get().get()) {
                return false;
            }
        }
        // Release: pairs with the Acquire CAS in `lookup`, publishing the block's contents
        // to prefix hits (the shard lock orders the index entry itself).
        let marked = transition(&slot.state, self.is_exclusive(), Ordering::Release, |cur| {
            State(cur)
                .mark_cached(r.generation)
                .map(|n| (n.0, ()))
                .ok_or(())
        });
        if marked.is_err() {
            return false;
        }
        // Relaxed: we alone may write it (we set CACHED, and only the registration that sets
        // CACHED writes the word); readers reach it through this shard's lock (`evict`) or
        // through the caller's later release (the reclaim path).
        hash_word.store(hash, Ordering::Relaxed);
        entry.insert_entry(Entered::new(r));
        true
    }

    /// A prefix-cache lookup: on a hit, takes a reference to the block (reviving a cached,
    /// unreferenced one) and returns it.
    ///
    /// # Guarantees
    ///
    /// A hit is a block registered under `hash` at the returned generation, now referenced by
    /// the caller; the registrant's writes happen-before this returns. A block being
    /// reclaimed or evicted concurrently is a miss, never a block of another generation or
    /// hash. Stale index entries met on the way are removed.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockRef> {
        let exclusive = self.is_exclusive();
        // Planted bug (loom-tests/plants.sh): the entry is read under one hold of the lock and
        // revived under another, so an eviction and a registration under another hash fit in
        // between.
        if planted!("lookup-revive-unlocked") {
            let r = self
                .index
                .with(hash, exclusive, |map| map.get(&hash).map(|e| e.get()))?;
            return self
                .index
                .with(hash, exclusive, |map| self.revive_locked(map, hash, r));
        }
        self.index.with(hash, exclusive, |map| {
            let r = map.get(&hash)?.get();
            self.revive_locked(map, hash, r)
        })
    }

    /// The rest of [`lookup`](Self::lookup) once the entry `hash → r` is found, under the
    /// lock of `hash`'s shard (`map`).
    fn revive_locked(&self, map: &mut Map, hash: BlockHash, r: BlockRef) -> Option<BlockRef> {
        let Some(slot) = self.slot(r.id) else {
            map.remove(&hash);
            return None;
        };
        // The revive CAS runs under the shard lock: `evict` clears CACHED only under the lock
        // of the block's hash, so while we hold it a CACHED flag at `r.generation` still means
        // "cached under `hash`" (not: evicted and re-registered under another hash).
        // Acquire: pairs with the Release CAS in `register` (and in `release`), so the
        // registrant's writes to the block happen-before the hit is returned.
        let revived = transition(&slot.state, self.is_exclusive(), Ordering::Acquire, |cur| {
            State(cur)
                .revive(r.generation)
                .map(|next| (next.0, ()))
                .ok_or(State(cur))
        });
        match revived {
            Ok((cur, ())) => {
                if State(cur).ref_count() == 0 {
                    self.count_allocatable(-1, self.is_exclusive());
                }
                Some(r)
            }
            Err(s) => {
                if s.generation() != r.generation || !s.is_cached() {
                    // Reclaimed (its claimer will also try to remove it) or stale.
                    map.remove(&hash);
                }
                None
            }
        }
    }

    /// Whether `hash` names a block currently registered in the prefix index — a peek that,
    /// unlike [`lookup`](Self::lookup), takes no reference.
    ///
    /// # Guarantees
    ///
    /// Exact at the instant the shard lock is held; the block may be reclaimed or evicted
    /// right after, so a `true` is a hint, not a reservation.
    pub fn contains_hash(&self, hash: BlockHash) -> bool {
        self.index.with(hash, self.is_exclusive(), |map| {
            map.get(&hash).is_some_and(|e| self.is_registered(e.get()))
        })
    }

    /// Removes the block from the prefix index and clears its cached mark; its reference
    /// count is untouched. An unreferenced block becomes free. Returns whether the block was
    /// cached and is now evicted; `false` for uncached, null and out-of-range ids.
    ///
    /// # Guarantees
    ///
    /// After `true`, no [`lookup`](Self::lookup) returns this block until it is registered
    /// again. `false` may also mean a registration of the block was still in flight on
    /// another thread and did not settle within a bounded number of retries.
    pub fn evict(&self, id: BlockId) -> bool {
        let (Some(slot), Some(hash_word)) = (self.slot(id), self.hash_word(id)) else {
            return false;
        };
        let exclusive = self.is_exclusive();
        for _ in 0..EVICT_RETRIES {
            let s = State(slot.state.load(Ordering::Relaxed));
            if !s.is_cached() {
                return false;
            }
            let r = BlockRef {
                id,
                generation: s.generation(),
            };
            // Relaxed: only a hint for which shard to lock; validated against the index under
            // that lock below.
            let hash = hash_word.load(Ordering::Relaxed);
            let evicted = self.index.with(hash, exclusive, |map| {
                // Planted bug `evict-hint-unchecked` (loom-tests/plants.sh): the hint's entry is
                // taken for the block's own, whoever it names.
                if map.get(&hash).map(|e| e.get()) != Some(r) && !planted!("evict-hint-unchecked") {
                    // A registration is between its CAS and its hash store; let it finish.
                    return None;
                }
                // Under this lock with `hash → r` in the index, CACHED at `r.generation` can
                // only be cleared by us or by a reclaim (which bumps the generation).
                let mut cur = slot.state.load(Ordering::Relaxed);
                let now_free = loop {
                    let Some((next, now_free)) = State(cur).clear_cached(r.generation) else {
                        map.remove(&hash); // reclaimed meanwhile; drop its entry
                        return Some(None);
                    };
                    // Planted bug `evict-cas-store` (loom-tests/plants.sh): a plain store,
                    // which loses a lock-free release's or retain's count change.
                    if planted!("evict-cas-store") {
                        slot.state.store(next.0, Ordering::Relaxed);
                        break now_free;
                    }
                    // Relaxed: an RMW, so it continues the release sequence of the `release`
                    // that dropped the count to 0; the next claim's Acquire still pairs with
                    // it.
                    match slot.state.compare_exchange_weak(
                        cur,
                        next.0,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => break now_free,
                        Err(actual) => cur = actual,
                    }
                };
                map.remove(&hash);
                Some(Some(now_free))
            });
            match evicted {
                None => spin_hint(),
                Some(None) => return false,
                Some(Some(now_free)) => {
                    if now_free {
                        self.free.push(id as u32, false); // in range: `slot` succeeded
                    }
                    return true;
                }
            }
        }
        false
    }

    /// Whether `r` is cached at its generation (called under the lock of its hash's shard).
    pub(super) fn is_registered(&self, r: BlockRef) -> bool {
        self.load(r.id)
            .is_some_and(|s| s.generation() == r.generation && s.is_cached())
    }

    /// Drops `hash → old` from the index if it is still there.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // as `allocate`
    pub(super) fn remove_index_entry(&self, hash: BlockHash, old: BlockRef) {
        self.index.with(hash, self.is_exclusive(), |map| {
            remove_if_names(map, hash, old)
        });
    }

    /// [`remove_index_entry`](Self::remove_index_entry) for each entry, each index shard's
    /// lock taken once for the entries it holds.
    pub(super) fn remove_index_entries(&self, entries: &[(BlockHash, BlockRef)]) {
        self.index.for_each_grouped(
            self.is_exclusive(),
            |i| entries[i].0,
            entries.len(),
            |map, i| remove_if_names(map, entries[i].0, entries[i].1),
        );
    }
}

/// Drops `hash → old` from `map` if it is still there.
fn remove_if_names(map: &mut Map, hash: BlockHash, old: BlockRef) {
    if let Entry::Occupied(e) = map.entry(hash) {
        if e.get().get() == old {
            e.remove();
        }
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use crate::pool::tests::{alloc, conserved, pool};

    #[test]
    fn register_rules() {
        let p = pool(4);
        let a = alloc(&p);
        let b = alloc(&p);
        assert!(p.register(10, a));
        assert!(p.is_cached(a.id));
        assert!(!p.register(10, b), "hash already present");
        assert!(
            !p.register(11, a),
            "block already cached under another hash"
        );
        assert!(p.register(11, b));
        let c = alloc(&p);
        assert_eq!(p.release(c), Ok(()));
        assert!(!p.register(12, c), "unreferenced");
        conserved(&p);
    }

    #[test]
    fn lookup_revives() {
        let p = pool(3);
        let a = alloc(&p);
        assert_eq!(p.lookup(5), None);
        assert!(p.register(5, a));
        assert_eq!(p.lookup(5), Some(a));
        assert_eq!(p.ref_count(a.id), 2);
        assert_eq!(p.release(a), Ok(()));
        assert_eq!(p.release(a), Ok(()));
        let c = conserved(&p);
        assert_eq!(c.cached_unreferenced, 1);
        // Revive the unreferenced cached block.
        assert_eq!(p.lookup(5), Some(a));
        assert_eq!(p.ref_count(a.id), 1);
        let c = conserved(&p);
        assert_eq!((c.referenced, c.cached_unreferenced), (1, 0));
        // It is referenced, so allocation takes the other block and then fails; the
        // (now obsolete) queue entry is dropped on the way.
        let b = alloc(&p);
        assert_ne!(b.id, a.id);
        assert_eq!(p.allocate(), None);
        assert_eq!(p.release(a), Ok(()));
        assert_eq!(
            alloc(&p),
            BlockRef {
                id: a.id,
                generation: a.generation + 1
            }
        );
        assert_eq!(p.lookup(5), None);
    }

    #[test]
    fn evict_keeps_the_count() {
        let p = pool(3);
        let a = alloc(&p);
        assert!(!p.evict(a.id), "not cached");
        assert!(p.register(1, a));
        assert_eq!(p.retain(a), Ok(()));
        assert!(p.evict(a.id));
        assert!(!p.evict(a.id));
        assert_eq!(p.ref_count(a.id), 2);
        assert!(!p.is_cached(a.id));
        assert_eq!(p.lookup(1), None);
        conserved(&p);
        // Re-registrable under another hash, at the same generation.
        assert!(p.register(2, a));
        assert_eq!(p.lookup(2), Some(a));
        for _ in 0..3 {
            assert_eq!(p.release(a), Ok(()));
        }
        // Cached and unreferenced; evicting makes it free, and it is allocated exactly once.
        let c = conserved(&p);
        assert_eq!((c.cached_unreferenced, c.free), (1, 1));
        assert!(p.evict(a.id));
        let c = conserved(&p);
        assert_eq!((c.cached_unreferenced, c.free), (0, 2));
        let x = alloc(&p);
        let y = alloc(&p);
        assert_ne!(x.id, y.id);
        assert_eq!(
            p.allocate(),
            None,
            "the stale queue entry must not yield the block again"
        );
    }

    #[test]
    fn contains_hash_peeks_without_retaining() {
        let p = pool(2);
        let a = alloc(&p);
        assert!(!p.contains_hash(9));
        assert!(p.register(9, a));
        assert!(p.contains_hash(9));
        assert_eq!(p.ref_count(a.id), 1);
        assert_eq!(p.release(a), Ok(()));
        assert!(
            p.contains_hash(9),
            "cached and unreferenced is still in the index"
        );
        let b = alloc(&p); // reclaims it
        assert!(!p.contains_hash(9));
        assert!(p.register(9, b));
        assert!(p.evict(b.id));
        assert!(!p.contains_hash(9));
        assert_eq!(p.invariant_violations(), 0);
    }

    #[test]
    fn batches_register_and_drop_entries_as_one_by_one_calls_would() {
        batches_as_one_by_one(false);
        // An exclusive holder takes the entries one by one, without the grouping.
        batches_as_one_by_one(true);
    }

    fn batches_as_one_by_one(exclusive: bool) {
        // More entries than one group of the grouped locking (64), in every index shard.
        let p = pool(201);
        // SAFETY: no other thread has the pool.
        let _only = exclusive.then(|| unsafe { p.exclusive() });
        assert_eq!(p.is_exclusive(), exclusive);
        let blocks: Vec<BlockRef> = (0..200).map(|_| alloc(&p)).collect();
        let hash = |i: usize| (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut entries: Vec<(BlockHash, BlockRef)> = blocks
            .iter()
            .enumerate()
            .map(|(i, &r)| (hash(i), r))
            .collect();
        // A hash twice: registered once, under its first block.
        entries.push((hash(0), blocks[1]));
        p.register_all(&entries);
        for (i, &r) in blocks.iter().enumerate() {
            assert!(p.is_cached(r.id), "block {i} registered");
            assert!(p.contains_hash(hash(i)));
        }
        for &r in &blocks {
            assert_eq!(p.release(r), Ok(()));
        }
        // Reclaiming 150 cached blocks in one call drops each one's entry (in batches of 32,
        // or one by one under the exclusive mode).
        let mut out = Vec::new();
        assert!(p.allocate_n(150, &mut out));
        let reclaimed: Vec<usize> = (0..200)
            .filter(|&i| out.iter().any(|r| r.id == blocks[i].id))
            .collect();
        assert_eq!(reclaimed.len(), 150);
        for i in 0..200 {
            assert_eq!(
                p.contains_hash(hash(i)),
                !reclaimed.contains(&i),
                "entry {i}"
            );
            assert_eq!(p.lookup(hash(i)).is_some(), !reclaimed.contains(&i));
        }
        conserved(&p);
    }

    #[test]
    fn reregistration_replaces_stale_entry() {
        let p = pool(2);
        let a = alloc(&p);
        assert!(p.register(3, a));
        assert_eq!(p.release(a), Ok(()));
        let b = alloc(&p); // reclaims a, drops hash 3
        assert!(p.register(3, b));
        assert_eq!(p.lookup(3), Some(b));
        conserved(&p);
    }
}
