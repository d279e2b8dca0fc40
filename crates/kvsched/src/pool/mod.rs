//! **Internal, not part of the stable API.** Public only under feature `internals`, for the
//! project's own tools, tests and benchmarks (`kvsched-cli`, the Python package, the tests,
//! the mechanism benches); crate-private in a normal build. Anything here may change or
//! disappear in any release, outside any semver promise.
//!
//! The block pool shared by every shard and cache group of the runtime (docs/runtime.md).
//!
//! A [`BlockPool`] owns `num_blocks` slots; slot 0 is the null block and is never handed out.
//! Each usable slot carries one packed state word — generation, reference count and three
//! flags — so every ownership change is a single compare-and-swap on one word (a single store
//! while one thread has the pool to itself: [`BlockPool::exclusive`]):
//!
//! * **Free list** — a lock-free Treiber stack of slot indices whose head packs an ABA tag with
//!   the top index. A slot is on it exactly when its count is 0 and it is not cached.
//! * **Reclaim queue** — a ring of cached, unreferenced slots in release order behind a short
//!   mutex, consumed with a second-chance (CLOCK) rule, i.e. an approximate LRU. A slot has at
//!   most one entry, so the ring (one place per slot) never fills. Only the release that
//!   leaves a cached block unreferenced and the reclaim path of
//!   [`allocate`](BlockPool::allocate) touch it.
//! * **Prefix index** — `hash → BlockRef`, split into shards behind short mutexes. Only
//!   [`register`](BlockPool::register), [`lookup`](BlockPool::lookup),
//!   [`evict`](BlockPool::evict) and the reclaim path of [`allocate`](BlockPool::allocate)
//!   touch it; [`retain`](BlockPool::retain) and [`release`](BlockPool::release) never take its
//!   locks, and allocation from the free list takes none at all.
//!
//! A step that holds the pool exclusively ([`BlockPool::exclusive`]) takes neither lock.
//!
//! Every allocation bumps the slot's [`Generation`], so a [`BlockRef`] names one *use* of a
//! slot: a report about a block that was freed and reused is recognised as stale.
//!
//! One mechanism per file:
//!
//! * `state` — the packed per-slot state word and its pure transitions;
//! * `free_list` — the tagged Treiber stack;
//! * `reclaim` — the reclaim queue and the reclaim half of allocation;
//! * `exclusive` — the exclusive mode of inline steps, and the transition helper;
//! * `prefix_index` — the sharded index and the operations that use it;
//! * `census` — the slot classification;
//! * `hash`, `block_ref`, `error` — the types the pool's callers see.
//!
//! This file ties them together: the slots, the [`BlockPool`] and its lock-free core
//! (allocate, retain, release, the queries).

mod block_ref;
mod census;
mod error;
mod exclusive;
mod fill;
mod free_list;
mod hash;
mod prefix_index;
mod reclaim;
mod state;

pub use block_ref::{BlockRef, Generation};
pub use census::Census;
pub use error::PoolError;
#[cfg_attr(not(feature = "internals"), allow(unused_imports))] // named by loom models
pub use exclusive::{Exclusive, Shared};
pub use hash::{chain_hash, BlockHash};
pub use state::MAX_REF_COUNT;

use exclusive::{transition, Mode};
use free_list::FreeList;
use prefix_index::PrefixIndex;
use reclaim::{ReclaimQueue, StaleEntries};
use state::{AfterRelease, Refused, State};

use crate::rules::geometry::BlockId;
use crate::sync::{AtomicU64, Ordering};

/// Success ordering of the CAS in [`BlockPool::release`]: Release. The planted bug
/// `release-relaxed` (loom demonstration, `loom-tests/plants.sh`) weakens it to Relaxed.
const RELEASE_ORDER: Ordering = if planted!("release-relaxed") {
    Ordering::Relaxed
} else {
    Ordering::Release
};

/// One slot of the pool: its state word. The hash it is cached under is kept apart
/// ([`BlockPool::hash_word`]): every transition reads the state word, only registration,
/// eviction and reclaim the hash, so the state words of eight slots share a cache line.
#[derive(Debug)]
struct Slot {
    /// The packed [`State`].
    state: AtomicU64,
}

/// The block pool: reference-counted, generation-tagged blocks, a lock-free free list, an
/// approximate-LRU reclaim queue and a sharded prefix-cache index. `Send + Sync`; share it
/// behind an `Arc`.
///
/// # Guarantees
///
/// * **Exclusive hand-out.** [`allocate`](Self::allocate) returns a block with count 1 that
///   no other live [`BlockRef`] of the same generation names; a block is handed to a second
///   owner only after its count returned to 0. The previous holders' writes to the block
///   happen-before the new owner's allocation returns (Release on every decrement, Acquire on
///   every claim).
/// * **Generations.** Every allocation bumps the slot's generation; operations with an older
///   [`BlockRef`] fail with [`PoolError::Stale`] (up to 2³² reuses of one slot).
/// * **Lock freedom.** [`allocate`](Self::allocate) (from the free list),
///   [`retain`](Self::retain) and the queries never take a lock, nor does
///   [`release`](Self::release) unless it leaves a cached block unreferenced: that one queues
///   the block for reclaim under the reclaim queue's short lock. Reclaiming a cached block
///   takes that lock and one index-shard lock to drop its hash. Under
///   [`exclusive`](Self::exclusive) no operation takes a lock.
/// * **Prefix hits are consistent.** [`lookup`](Self::lookup) returns a block only while it
///   is still registered under that hash at that generation; a block being reclaimed or
///   evicted concurrently is a miss.
/// * **Conservation.** Every slot is, at every instant, exactly one of null, free, cached and
///   unreferenced, or referenced ([`census`](Self::census) is exact when no operation is in
///   flight), and when quiescent every count-0 slot can be allocated again (no leaks).
/// * **No panics** on any input: bad ids and references are [`PoolError`]s, `false` or `None`.
///
/// Not guaranteed: [`allocate`](Self::allocate) may return `None` while another thread's
/// [`release`](Self::release) has dropped the count to 0 but not yet published the slot; and
/// the reclaim order is least-recently-released only approximately (second chance).
pub struct BlockPool {
    slots: Box<[Slot]>,
    /// Per slot, the hash it is registered under; meaningful while `CACHED` is set. Written
    /// only by the registration that set `CACHED` (under that hash's index-shard lock).
    hashes: Box<[AtomicU64]>,
    /// Slots with count 0 that are not cached.
    free: FreeList,
    /// Cached, unreferenced slots, oldest release first; at most one entry per slot.
    reclaim: ReclaimQueue,
    /// The prefix index, sharded by hash.
    index: PrefixIndex,
    /// Whether one mutator has the pool to itself ([`exclusive`]).
    mode: Mode,
    /// Slots with count 0 (free, or cached and unreferenced), as a wrapping count: every
    /// transition to or from count 0 adds or takes one ([`allocatable`](Self::allocatable)).
    allocatable: AtomicU64,
    double_frees: AtomicU64,
    stale_releases: AtomicU64,
    invariant_violations: AtomicU64,
}

impl std::fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockPool")
            .field("num_blocks", &self.num_blocks())
            .field("double_frees", &self.double_frees())
            .field("stale_releases", &self.stale_releases())
            .field("invariant_violations", &self.invariant_violations())
            .finish_non_exhaustive()
    }
}

impl BlockPool {
    /// A pool of `num_blocks` slots: the null block (id 0) and usable ids `1..num_blocks`, all
    /// free, at generation 0. Allocation hands out ids in increasing order at first.
    ///
    /// # Errors
    ///
    /// [`PoolError::TooSmall`] below 2 slots, [`PoolError::TooLarge`] above `u32::MAX`.
    pub fn new(num_blocks: usize) -> Result<Self, PoolError> {
        if num_blocks < 2 {
            return Err(PoolError::TooSmall { num_blocks });
        }
        let Ok(n) = u32::try_from(num_blocks) else {
            return Err(PoolError::TooLarge { num_blocks });
        };
        let slots = (0..num_blocks)
            .map(|_| Slot {
                state: AtomicU64::new(State::INITIAL.0),
            })
            .collect();
        let hashes = (0..num_blocks).map(|_| AtomicU64::new(0)).collect();
        Ok(BlockPool {
            slots,
            hashes,
            free: FreeList::new(n),
            reclaim: ReclaimQueue::new(num_blocks),
            index: PrefixIndex::new(num_blocks),
            mode: Mode::default(),
            allocatable: AtomicU64::new(u64::from(n - 1)),
            double_frees: AtomicU64::new(0),
            stale_releases: AtomicU64::new(0),
            invariant_violations: AtomicU64::new(0),
        })
    }

    /// Slots in the pool, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.slots.len()
    }

    /// Blocks an allocation could take now: those with count 0, free or cached and
    /// unreferenced. Exact when no operation is in flight; while other threads allocate and
    /// release it may be off by their operations in flight, so it is a hint: an
    /// [`allocate_n`](Self::allocate_n) of more blocks than this would most likely fail.
    pub fn allocatable(&self) -> usize {
        // Relaxed: a count, read as a hint.
        let n = self.allocatable.load(Ordering::Relaxed) as i64;
        usize::try_from(n).unwrap_or(0)
    }

    /// Adds `delta` to the allocatable count: by a store under `exclusive` (no other
    /// mutator), else by an atomic add.
    #[inline]
    fn count_allocatable(&self, delta: i64, exclusive: bool) {
        let delta = delta as u64;
        // Relaxed (all three): a count nothing is ordered by; under `exclusive` no other
        // thread changes it.
        if exclusive {
            let n = self.allocatable.load(Ordering::Relaxed);
            self.allocatable
                .store(n.wrapping_add(delta), Ordering::Relaxed);
        } else {
            self.allocatable.fetch_add(delta, Ordering::Relaxed);
        }
    }

    /// The null block's id (always 0).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // the baseline and benches
    pub fn null_block(&self) -> BlockId {
        0
    }

    /// Allocates a block: count 1, uncached, generation bumped.
    ///
    /// Takes a slot from the free list; if that is empty, reclaims the least recently released
    /// cached, unreferenced block (approximately: a block released again since it was queued
    /// gets a second chance), dropping its hash from the prefix index.
    ///
    /// # Guarantees
    ///
    /// The returned block is referenced by the caller alone. `None` means every block was
    /// referenced (or in the middle of being released) during the call.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // tests, benches, loom models
    pub fn allocate(&self) -> Option<BlockRef> {
        self.allocate_free().or_else(|| self.allocate_reclaimed())
    }

    /// The free-list half of [`allocate`](Self::allocate).
    fn allocate_free(&self) -> Option<BlockRef> {
        let exclusive = self.is_exclusive();
        while let Some(index) = self.free.pop(exclusive) {
            let slot = &self.slots[index as usize];
            // Acquire: pairs with the Release CAS in `release` (or `evict`) that made the
            // slot free, so the previous holders' writes happen-before the new owner's.
            let claimed = transition(&slot.state, exclusive, Ordering::Acquire, |cur| {
                State(cur).claim_free().map(|next| (next.0, next)).ok_or(())
            });
            match claimed {
                Ok((_, next)) => {
                    self.count_allocatable(-1, exclusive);
                    return Some(BlockRef {
                        id: BlockId::from(index),
                        generation: next.generation(),
                    });
                }
                // Unreachable while the free-list invariant holds. Never hand out a slot
                // that is not free: count the corruption and try the next one.
                Err(()) => {
                    self.invariant_violations.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        None
    }

    /// Allocates `n` blocks, all or nothing: on success appends them to `out` and returns
    /// `true`; on failure releases whatever it took, leaves `out` unchanged and returns `false`.
    ///
    /// # Guarantees
    ///
    /// As [`allocate`](Self::allocate) for each block. Cached blocks reclaimed before a
    /// failure lose their prefix-index entry even though the call fails.
    ///
    /// The prefix-index entries of the cached blocks it reclaims are dropped a group at a time,
    /// each index shard locked once per group, before it returns (each at once under
    /// [`exclusive`](Self::exclusive), which takes no lock).
    pub fn allocate_n(&self, n: usize, out: &mut Vec<BlockRef>) -> bool {
        if n >= self.num_blocks() {
            return false; // more than the usable blocks; also bounds the reservation below
        }
        let mark = out.len();
        out.reserve(n);
        // Made at the first reclaim: an allocation served by the free list fills no batch.
        // An exclusive holder takes no index locks, so it drops each entry at once.
        let exclusive = self.is_exclusive();
        let mut stale: Option<StaleEntries> = None;
        // Under `exclusive` nothing pushes on the free list while this runs: once it is
        // found empty, the rest come from the reclaim queue without asking it again.
        let mut free_empty = false;
        for _ in 0..n {
            let free = if free_empty {
                None
            } else {
                self.allocate_free()
            };
            free_empty = exclusive && free.is_none();
            let got = free.or_else(|| {
                let (r, (hash, old)) = self.reclaim_one()?;
                if exclusive {
                    self.remove_index_entry(hash, old);
                } else {
                    stale
                        .get_or_insert_with(StaleEntries::default)
                        .push(self, (hash, old));
                }
                Some(r)
            });
            match got {
                Some(r) => out.push(r),
                None => {
                    if let Some(stale) = stale.as_mut() {
                        stale.flush(self);
                    }
                    for r in out.drain(mark..) {
                        // Cannot fail: we hold the only reference, at its generation.
                        let _ = self.release(r);
                    }
                    return false;
                }
            }
        }
        if let Some(stale) = stale.as_mut() {
            stale.flush(self);
        }
        true
    }

    /// Adds a reference to a block the caller already references.
    ///
    /// # Errors
    ///
    /// [`PoolError::NullBlock`], [`PoolError::OutOfRange`], [`PoolError::Stale`] (generation
    /// differs), [`PoolError::NotReferenced`] (count 0), [`PoolError::RefCountOverflow`].
    ///
    /// # Guarantees
    ///
    /// Lock-free; on error nothing changed.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // the baseline and benches
    pub fn retain(&self, r: BlockRef) -> Result<(), PoolError> {
        let slot = self.checked_slot(r.id)?;
        let mut cur = slot.state.load(Ordering::Relaxed);
        loop {
            let next = State(cur).retain(r.generation).map_err(|e| match e {
                Refused::Unreferenced => PoolError::NotReferenced(r.id),
                e => refusal(e, r),
            })?;
            // Relaxed: the caller already holds a reference, so no data is handed over (as in
            // `Arc::clone`); the CAS only needs atomicity.
            match slot.state.compare_exchange_weak(
                cur,
                next.0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Drops one reference. At count 0 a cached block becomes reclaimable (queued in release
    /// order, still revivable by [`lookup`](Self::lookup)); an uncached one goes to the free
    /// list.
    ///
    /// # Errors
    ///
    /// [`PoolError::NullBlock`], [`PoolError::OutOfRange`]; [`PoolError::Stale`] if the
    /// generation differs and [`PoolError::DoubleFree`] if the count is already 0 — these two
    /// are also counted ([`stale_releases`](Self::stale_releases),
    /// [`double_frees`](Self::double_frees)).
    ///
    /// # Guarantees
    ///
    /// Lock-free, except that leaving a cached block unreferenced queues it under the reclaim
    /// queue's short lock (none under [`exclusive`](Self::exclusive)); on error nothing
    /// changed. The caller's writes to the block happen-before the block's next allocation.
    pub fn release(&self, r: BlockRef) -> Result<(), PoolError> {
        self.release_in(r, self.is_exclusive())
    }

    /// Drops one reference to each block `(ids[i], generations[i])` (pairs up to the shorter
    /// slice), skipping the entries that are `null` (the tables' null block): as
    /// [`release`](Self::release) on each in turn, whose refusals are counted as it counts
    /// them and otherwise ignored — the release of a table whose blocks the caller holds.
    ///
    /// # Guarantees
    ///
    /// Those of [`release`](Self::release), for each block.
    pub fn release_each(&self, ids: &[BlockId], generations: &[Generation], null: BlockId) {
        let exclusive = self.is_exclusive();
        for (&id, &generation) in ids.iter().zip(generations) {
            if id != null {
                let _ = self.release_in(BlockRef { id, generation }, exclusive);
            }
        }
    }

    /// [`release`](Self::release), with the mode read by the caller.
    #[inline(always)]
    fn release_in(&self, r: BlockRef, exclusive: bool) -> Result<(), PoolError> {
        let slot = self.checked_slot(r.id)?;
        // Release: pairs with the Acquire CAS that next claims the slot (`allocate` or
        // `allocate_reclaimed`), so this holder's writes happen-before the next owner's.
        let released = transition(&slot.state, exclusive, RELEASE_ORDER, |cur| {
            State(cur)
                .release(r.generation)
                .map(|(next, after)| (next.0, after))
        });
        let after = match released {
            Ok((cur, after)) => {
                // Planted bug (scripts/plants.sh): a block left unreferenced is not counted
                // allocatable, so admission comes to think the pool full while it is not.
                if State(cur).ref_count() == 1 && !planted!("allocatable-release-uncounted") {
                    self.count_allocatable(1, exclusive);
                }
                after
            }
            Err(e) => {
                let counter = match e {
                    Refused::Stale(_) => &self.stale_releases,
                    Refused::Filling => &self.invariant_violations,
                    _ => &self.double_frees,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                return Err(refusal(e, r));
            }
        };
        match after {
            AfterRelease::Nothing => {}
            // In range: checked above.
            AfterRelease::PushFree => self.free.push(r.id as u32, exclusive),
            AfterRelease::PushReclaim => {
                if !self.reclaim.push(r.id, exclusive) {
                    self.invariant_violations.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// Whether `r` names the slot's current generation (it may be referenced or not).
    /// `false` for the null block and out-of-range ids.
    pub fn is_current(&self, r: BlockRef) -> bool {
        self.generation(r.id) == Some(r.generation)
    }

    /// The slot's current generation; `None` for the null block and out-of-range ids.
    pub fn generation(&self, id: BlockId) -> Option<Generation> {
        self.load(id).map(State::generation)
    }

    /// The block's reference count (0 for the null block and out-of-range ids).
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.load(id).map_or(0, State::ref_count)
    }

    /// Whether the block is in the prefix index (`false` for null and out-of-range ids).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // the baseline and benches
    pub fn is_cached(&self, id: BlockId) -> bool {
        self.load(id).is_some_and(State::is_cached)
    }

    /// Releases refused because the count was already 0.
    pub fn double_frees(&self) -> u64 {
        self.double_frees.load(Ordering::Relaxed)
    }

    /// Releases refused because the reference's generation was not current.
    pub fn stale_releases(&self) -> u64 {
        self.stale_releases.load(Ordering::Relaxed)
    }

    /// Internal-invariant violations the pool detected and contained: a free-list pop that
    /// yielded a slot which was not free (it is skipped, never handed out), or a last release
    /// of a block whose load still owns its bytes (it is kept, never freed), or a cached block
    /// the reclaim queue had no room for (a slot queued twice). Always 0 unless
    /// the pool itself has a bug; stress tests and shutdown checks assert it.
    pub fn invariant_violations(&self) -> u64 {
        self.invariant_violations.load(Ordering::Relaxed)
    }

    // --- internals -------------------------------------------------------------------------

    /// The slot of a usable id (not null, in range).
    fn slot(&self, id: BlockId) -> Option<&Slot> {
        if id == 0 {
            return None;
        }
        usize::try_from(id).ok().and_then(|i| self.slots.get(i))
    }

    /// The hash word of slot `id` (see [`BlockPool::hashes`]): `None` where [`slot`](Self::slot)
    /// is.
    fn hash_word(&self, id: BlockId) -> Option<&AtomicU64> {
        if id == 0 {
            return None;
        }
        usize::try_from(id).ok().and_then(|i| self.hashes.get(i))
    }

    fn checked_slot(&self, id: BlockId) -> Result<&Slot, PoolError> {
        if id == 0 {
            return Err(PoolError::NullBlock(id));
        }
        self.slot(id).ok_or(PoolError::OutOfRange(id))
    }

    fn load(&self, id: BlockId) -> Option<State> {
        self.slot(id)
            .map(|s| State(s.state.load(Ordering::Relaxed)))
    }
}

/// Maps a refused transition to the caller-facing error (count 0 reads as a double free:
/// `retain` maps it to [`PoolError::NotReferenced`] itself).
fn refusal(e: Refused, r: BlockRef) -> PoolError {
    match e {
        Refused::Stale(current) => PoolError::Stale { block: r, current },
        Refused::Unreferenced => PoolError::DoubleFree(r.id),
        Refused::Overflow => PoolError::RefCountOverflow(r.id),
        Refused::Filling => PoolError::Filling(r.id),
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests;

#[cfg(all(test, not(kvsched_loom)))]
mod concurrent_tests;
