//! The block pool shared by every shard and cache group of the runtime (SPEC §7).
//!
//! A [`BlockPool`] owns `num_blocks` slots; slot 0 is the null block and is never handed out.
//! Each usable slot carries one packed state word — generation, reference count and three
//! flags — so every ownership change is a single compare-and-swap on one word:
//!
//! * **Free list** — a lock-free Treiber stack of slot indices whose head packs an ABA tag with
//!   the top index. A slot is on it exactly when its count is 0 and it is not cached.
//! * **Reclaim queue** — an MPMC queue of cached, unreferenced slots in release order, consumed
//!   with a second-chance (CLOCK) rule, i.e. an approximate LRU. A slot has at most one entry.
//! * **Prefix index** — `hash → BlockRef`, split into shards behind short mutexes. Only
//!   [`register`](BlockPool::register), [`lookup`](BlockPool::lookup),
//!   [`evict`](BlockPool::evict) and the reclaim path of [`allocate`](BlockPool::allocate)
//!   touch it; [`retain`](BlockPool::retain) and [`release`](BlockPool::release) never take a
//!   lock, and allocation from the free list takes none either.
//!
//! Every allocation bumps the slot's [`Generation`], so a [`BlockRef`] names one *use* of a
//! slot: a report about a block that was freed and reused is recognised as stale.

use rustc_hash::FxHashMap;
use thiserror::Error;

use crate::rules::geometry::BlockId;
use crate::sync::{spin_hint, AtomicU32, AtomicU64, Mutex, Ordering, SegQueue};

/// How many times a slot has been allocated (wrapping). Part of every [`BlockRef`].
pub type Generation = u32;

/// A hash naming a block's contents in the prefix index. Callers mix the cache-group index
/// and the parent block's hash into it, so one index serves every group.
pub type BlockHash = u64;

/// The prefix-cache hash of one full block of `tokens` in cache group `group`, chained on the
/// hash of the blocks before it (`parent`, 0 for the first), so equal hashes mean equal
/// prefixes (up to 64-bit collisions).
pub fn chain_hash(parent: BlockHash, group: usize, tokens: &[u32]) -> BlockHash {
    let mut h = parent ^ (group as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        h = (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3);
        h ^= h >> 29;
    }
    h
}

/// One use of a pool slot: its id and the generation it had when it was handed out.
///
/// # Guarantees
///
/// Two `BlockRef`s to the same slot taken from different allocations differ in
/// `generation` (modulo 2³² reuses of that one slot), so the pool recognises a reference that
/// outlived its allocation ([`PoolError::Stale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockRef {
    /// The slot, `1..num_blocks`.
    pub id: BlockId,
    /// The slot's generation when this reference was handed out.
    pub generation: Generation,
}

/// Why a pool operation was refused. No pool operation panics on its input.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum PoolError {
    /// [`BlockPool::new`] needs the null block and at least one usable block.
    #[error(
        "a block pool needs at least 2 blocks (the null block and one usable), got {num_blocks}"
    )]
    TooSmall {
        /// The requested size.
        num_blocks: usize,
    },
    /// [`BlockPool::new`] addresses slots with 32-bit indices.
    #[error("a block pool holds at most {max} blocks, got {num_blocks}", max = u32::MAX)]
    TooLarge {
        /// The requested size.
        num_blocks: usize,
    },
    /// The id is not a slot of this pool.
    #[error("block {0} is out of range for this pool")]
    OutOfRange(BlockId),
    /// The null block is never allocated, retained or released.
    #[error("block {0} is the null block")]
    NullBlock(BlockId),
    /// The reference's generation is not the slot's current one: the block was freed and
    /// reused since the reference was handed out.
    #[error("stale reference {block:?}: block {} is now at generation {current}", block.id)]
    Stale {
        /// The stale reference.
        block: BlockRef,
        /// The slot's current generation.
        current: Generation,
    },
    /// A release of a block whose reference count is already 0.
    #[error("block {0} released with a reference count of 0 (double free)")]
    DoubleFree(BlockId),
    /// A retain of a block nobody references (it is free or only cached).
    #[error("block {0} is not referenced; retain needs a live reference")]
    NotReferenced(BlockId),
    /// The reference count would exceed [`MAX_REF_COUNT`].
    #[error("block {0} reference count would exceed {max}", max = MAX_REF_COUNT)]
    RefCountOverflow(BlockId),
}

/// The largest reference count a block can hold (2²⁹ − 1).
pub const MAX_REF_COUNT: u32 = State::RC_MAX as u32;

/// A classification of every slot, from [`BlockPool::census`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Slots in the pool, the null block included.
    pub total: usize,
    /// The null block (always 1).
    pub null: usize,
    /// Reference count 0, not in the prefix index.
    pub free: usize,
    /// Reference count 0, still in the prefix index (reclaimable, or revivable by a lookup).
    pub cached_unreferenced: usize,
    /// Reference count > 0 (cached or not).
    pub referenced: usize,
}

impl Census {
    /// Whether every slot is accounted for exactly once:
    /// `free + cached_unreferenced + referenced + null == total` (SPEC §7 invariants).
    pub fn conserved(&self) -> bool {
        self.free
            .checked_add(self.cached_unreferenced)
            .and_then(|s| s.checked_add(self.referenced))
            .and_then(|s| s.checked_add(self.null))
            == Some(self.total)
    }
}

// ---------------------------------------------------------------------------------------------
// The packed slot state.
// ---------------------------------------------------------------------------------------------

/// A slot's state word: `generation (32) | ref count (29) | TOUCHED | QUEUED | CACHED`.
///
/// * `CACHED` — the slot is in the prefix index under the hash in `Slot::hash`.
/// * `QUEUED` — the slot has an entry in the reclaim queue (or one is being pushed/handled).
///   It may outlive the slot's generation: the entry is then discarded when popped.
/// * `TOUCHED` — the slot went back to count 0 after its queue entry was pushed, so the entry
///   is older than the slot's last release: the popper gives it a second chance.
///
/// Transitions are pure functions returning the next word; callers install it with one CAS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State(u64);

/// Why [`State::retain`] / [`State::release`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    /// Different generation (the slot's current one).
    Stale(Generation),
    /// Count already 0.
    Unreferenced,
    /// Count at [`State::RC_MAX`].
    Overflow,
}

/// What the releaser must do after installing [`State::release`]'s word.
#[must_use = "a slot left at count 0 must be pushed where its next owner finds it"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterRelease {
    /// Other references remain (or the slot already has a reclaim-queue entry).
    Nothing,
    /// The count reached 0 on an uncached slot: push it on the free list.
    PushFree,
    /// The count reached 0 on a cached slot without a queue entry: push one.
    PushReclaim,
}

/// What the allocator does with a slot whose reclaim-queue entry it popped.
#[must_use = "the step's word must be installed with a CAS"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReclaimStep {
    /// Cached, unreferenced, not touched since queued: take it (new generation, count 1).
    Claim(State),
    /// Cached and unreferenced but released again since queued: re-queue it at the tail.
    SecondChance(State),
    /// Referenced again or no longer cached: drop the entry.
    Dequeue(State),
}

impl State {
    const CACHED: u64 = 1 << 0;
    const QUEUED: u64 = 1 << 1;
    const TOUCHED: u64 = 1 << 2;
    const FLAGS: u64 = Self::CACHED | Self::QUEUED | Self::TOUCHED;
    const RC_SHIFT: u32 = 3;
    const RC_MAX: u64 = (1 << 29) - 1;
    const RC_ONE: u64 = 1 << Self::RC_SHIFT;
    const GEN_SHIFT: u32 = 32;

    /// Generation 0, count 0, no flags: a slot on the free list of a new pool.
    const INITIAL: State = State(0);

    fn generation(self) -> Generation {
        (self.0 >> Self::GEN_SHIFT) as Generation
    }

    fn ref_count(self) -> u32 {
        ((self.0 >> Self::RC_SHIFT) & Self::RC_MAX) as u32
    }

    fn is_cached(self) -> bool {
        self.0 & Self::CACHED != 0
    }

    fn is_queued(self) -> bool {
        self.0 & Self::QUEUED != 0
    }

    fn is_touched(self) -> bool {
        self.0 & Self::TOUCHED != 0
    }

    fn with_flags(self, set: u64, clear: u64) -> State {
        State((self.0 & !clear) | set)
    }

    /// A fresh use of the slot: generation + 1, count 1, uncached. `QUEUED` is kept (a queue
    /// entry of an older generation may still be pending and owns that bit), `TOUCHED` cleared.
    fn fresh_use(self) -> State {
        let gen = self.generation().wrapping_add(1) as u64;
        let queued = self.0 & Self::QUEUED;
        State((gen << Self::GEN_SHIFT) | Self::RC_ONE | queued)
    }

    /// Free-list pop → owned: requires count 0 and uncached (always true for a slot on the
    /// free list; `None` would mean the free list is corrupt).
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    fn claim_free(self) -> Option<State> {
        (self.ref_count() == 0 && !self.is_cached()).then(|| self.fresh_use())
    }

    /// The decision for a popped reclaim-queue entry.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    fn reclaim(self) -> ReclaimStep {
        if self.ref_count() == 0 && self.is_cached() {
            if self.is_touched() {
                ReclaimStep::SecondChance(self.with_flags(0, Self::TOUCHED))
            } else {
                ReclaimStep::Claim(self.fresh_use().with_flags(0, Self::QUEUED))
            }
        } else {
            ReclaimStep::Dequeue(self.with_flags(0, Self::QUEUED | Self::TOUCHED))
        }
    }

    /// +1 for a holder of generation `gen`.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    fn retain(self, gen: Generation) -> Result<State, Refused> {
        if self.generation() != gen {
            Err(Refused::Stale(self.generation()))
        } else if self.ref_count() == 0 {
            Err(Refused::Unreferenced)
        } else if u64::from(self.ref_count()) >= Self::RC_MAX {
            Err(Refused::Overflow)
        } else {
            Ok(State(self.0 + Self::RC_ONE))
        }
    }

    /// −1 for a holder of generation `gen`, and what to do if that was the last reference.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    fn release(self, gen: Generation) -> Result<(State, AfterRelease), Refused> {
        if self.generation() != gen {
            return Err(Refused::Stale(self.generation()));
        }
        match self.ref_count() {
            0 => Err(Refused::Unreferenced),
            1 => {
                let zero = State(self.0 - Self::RC_ONE);
                Ok(if !zero.is_cached() {
                    (zero, AfterRelease::PushFree)
                } else if zero.is_queued() {
                    (zero.with_flags(Self::TOUCHED, 0), AfterRelease::Nothing)
                } else {
                    let next = zero.with_flags(Self::QUEUED, Self::TOUCHED);
                    (next, AfterRelease::PushReclaim)
                })
            }
            _ => Ok((State(self.0 - Self::RC_ONE), AfterRelease::Nothing)),
        }
    }

    /// A prefix hit: +1 on a cached slot of generation `gen` (reviving it if unreferenced).
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    fn revive(self, gen: Generation) -> Option<State> {
        (self.generation() == gen && self.is_cached() && u64::from(self.ref_count()) < Self::RC_MAX)
            .then(|| State(self.0 + Self::RC_ONE))
    }

    /// Registration: sets `CACHED` on a referenced, uncached slot of generation `gen`.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    fn mark_cached(self, gen: Generation) -> Option<State> {
        (self.generation() == gen && self.ref_count() > 0 && !self.is_cached())
            .then(|| self.with_flags(Self::CACHED, 0))
    }

    /// Eviction: clears `CACHED` on a cached slot of generation `gen`; the flag says whether
    /// the slot is now free (count 0) and must be pushed on the free list.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    fn clear_cached(self, gen: Generation) -> Option<(State, bool)> {
        (self.generation() == gen && self.is_cached())
            .then(|| (self.with_flags(0, Self::CACHED), self.ref_count() == 0))
    }
}

// Compile-time layout checks: the fields do not overlap and fill the word.
const _: () = {
    assert!(State::FLAGS < State::RC_ONE);
    assert!((State::RC_MAX << State::RC_SHIFT) >> State::GEN_SHIFT == 0);
    assert!(State::RC_SHIFT + 29 == State::GEN_SHIFT);
};

// ---------------------------------------------------------------------------------------------
// The pool.
// ---------------------------------------------------------------------------------------------

/// Shards of the prefix index (a power of two).
#[cfg(not(kvsched_loom))]
const INDEX_SHARD_BITS: u32 = 5;
#[cfg(kvsched_loom)]
const INDEX_SHARD_BITS: u32 = 1;
const INDEX_SHARDS: usize = 1 << INDEX_SHARD_BITS;

/// How often [`BlockPool::evict`] re-reads a slot whose hash word does not match the index
/// (a registration in flight on another thread) before giving up.
#[cfg(not(kvsched_loom))]
const EVICT_RETRIES: u32 = 1 << 12;
#[cfg(kvsched_loom)]
const EVICT_RETRIES: u32 = 3;

/// The free-list head's next ABA tag. The planted bug `free-list-no-tag` (loom demonstration,
/// `loom-tests/plants.sh`) keeps the tag unchanged, so the stack is open to ABA.
#[inline]
fn next_tag(tag: u32) -> u32 {
    if cfg!(kvsched_plant = "free-list-no-tag") {
        tag
    } else {
        tag.wrapping_add(1)
    }
}

/// Success ordering of the CAS in [`BlockPool::release`]: Release. The planted bug
/// `release-relaxed` (loom demonstration, `loom-tests/plants.sh`) weakens it to Relaxed.
#[cfg(not(kvsched_plant = "release-relaxed"))]
const RELEASE_ORDER: Ordering = Ordering::Release;
#[cfg(kvsched_plant = "release-relaxed")]
const RELEASE_ORDER: Ordering = Ordering::Relaxed;

/// Free-list head: `tag (high 32) | index (low 32)`; index 0 (the null block) = empty.
fn pack_head(tag: u32, index: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(index)
}

fn unpack_head(head: u64) -> (u32, u32) {
    ((head >> 32) as u32, head as u32)
}

#[derive(Debug)]
struct Slot {
    /// The packed [`State`].
    state: AtomicU64,
    /// The hash the slot is registered under; meaningful while `CACHED` is set. Written only
    /// by the registration that set `CACHED` (under that hash's index-shard lock).
    hash: AtomicU64,
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
///   [`retain`](Self::retain), [`release`](Self::release) and the queries never take a lock;
///   reclaiming a cached block takes one index-shard lock to drop its hash.
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
    /// Treiber-stack links: `next[i]` is the slot below `i` while `i` is on the free list.
    next: Box<[AtomicU32]>,
    /// Packed (tag, top index) of the free list, see [`pack_head`].
    free_head: AtomicU64,
    /// Cached, unreferenced slots, oldest release first; at most one entry per slot.
    reclaim: SegQueue<BlockId>,
    /// The prefix index, sharded by hash.
    index: Box<[Mutex<FxHashMap<BlockHash, BlockRef>>]>,
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
                hash: AtomicU64::new(0),
            })
            .collect();
        // Chain 1 → 2 → … → n-1 → 0 (empty), so pops return ids in increasing order.
        let next = (0..n)
            .map(|i| {
                let below = if i == 0 || i + 1 == n { 0 } else { i + 1 };
                AtomicU32::new(below)
            })
            .collect();
        let index = (0..INDEX_SHARDS)
            .map(|_| Mutex::new(FxHashMap::default()))
            .collect();
        Ok(BlockPool {
            slots,
            next,
            free_head: AtomicU64::new(pack_head(0, 1)),
            reclaim: SegQueue::new(),
            index,
            double_frees: AtomicU64::new(0),
            stale_releases: AtomicU64::new(0),
            invariant_violations: AtomicU64::new(0),
        })
    }

    /// Slots in the pool, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.slots.len()
    }

    /// The null block's id (always 0).
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
    pub fn allocate(&self) -> Option<BlockRef> {
        while let Some(index) = self.pop_free() {
            let slot = &self.slots[index as usize];
            let mut cur = slot.state.load(Ordering::Relaxed);
            loop {
                let Some(next) = State(cur).claim_free() else {
                    // Unreachable while the free-list invariant holds. Never hand out a slot
                    // that is not free: count the corruption and try the next one.
                    self.invariant_violations.fetch_add(1, Ordering::Relaxed);
                    break;
                };
                // Acquire: pairs with the Release CAS in `release` (or `evict`) that made the
                // slot free, so the previous holders' writes happen-before the new owner's.
                match slot.state.compare_exchange_weak(
                    cur,
                    next.0,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        return Some(BlockRef {
                            id: BlockId::from(index),
                            generation: next.generation(),
                        })
                    }
                    Err(actual) => cur = actual,
                }
            }
        }
        self.allocate_reclaimed()
    }

    /// The reclaim half of [`allocate`](Self::allocate).
    fn allocate_reclaimed(&self) -> Option<BlockRef> {
        while let Some(id) = self.reclaim.pop() {
            let Some(slot) = self.slot(id) else {
                continue;
            };
            let mut cur = slot.state.load(Ordering::Relaxed);
            let step = loop {
                let step = State(cur).reclaim();
                let next = match step {
                    ReclaimStep::Claim(s)
                    | ReclaimStep::SecondChance(s)
                    | ReclaimStep::Dequeue(s) => s,
                };
                // Acquire: for a claim, pairs with the Release CAS in `release` that dropped
                // the count to 0 (and, through it, with `register`'s store of the hash word),
                // so the previous holders' writes happen-before the new owner's.
                match slot.state.compare_exchange_weak(
                    cur,
                    next.0,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break step,
                    Err(actual) => cur = actual,
                }
            };
            match step {
                ReclaimStep::Claim(next) => {
                    let old = BlockRef {
                        id,
                        generation: State(cur).generation(),
                    };
                    // Relaxed: written by `register` before the release our Acquire CAS
                    // synchronised with.
                    let hash = slot.hash.load(Ordering::Relaxed);
                    self.remove_index_entry(hash, old);
                    return Some(BlockRef {
                        id,
                        generation: next.generation(),
                    });
                }
                ReclaimStep::SecondChance(_) => self.reclaim.push(id),
                ReclaimStep::Dequeue(_) => {}
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
    pub fn allocate_n(&self, n: usize, out: &mut Vec<BlockRef>) -> bool {
        if n >= self.num_blocks() {
            return false; // more than the usable blocks; also bounds the reservation below
        }
        let mark = out.len();
        out.reserve(n);
        for _ in 0..n {
            match self.allocate() {
                Some(r) => out.push(r),
                None => {
                    for r in out.drain(mark..) {
                        // Cannot fail: we hold the only reference, at its generation.
                        let _ = self.release(r);
                    }
                    return false;
                }
            }
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
    /// Lock-free; on error nothing changed. The caller's writes to the block happen-before
    /// the block's next allocation.
    pub fn release(&self, r: BlockRef) -> Result<(), PoolError> {
        let slot = self.checked_slot(r.id)?;
        let mut cur = slot.state.load(Ordering::Relaxed);
        let after = loop {
            let (next, after) = match State(cur).release(r.generation) {
                Ok(t) => t,
                Err(e) => {
                    let counter = match e {
                        Refused::Stale(_) => &self.stale_releases,
                        _ => &self.double_frees,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    return Err(refusal(e, r));
                }
            };
            // Release: pairs with the Acquire CAS that next claims the slot (`allocate` or
            // `allocate_reclaimed`), so this holder's writes happen-before the next owner's.
            match slot
                .state
                .compare_exchange_weak(cur, next.0, RELEASE_ORDER, Ordering::Relaxed)
            {
                Ok(_) => break after,
                Err(actual) => cur = actual,
            }
        };
        match after {
            AfterRelease::Nothing => {}
            AfterRelease::PushFree => self.push_free(r.id as u32), // in range: checked above
            AfterRelease::PushReclaim => self.reclaim.push(r.id),
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
    pub fn is_cached(&self, id: BlockId) -> bool {
        self.load(id).is_some_and(State::is_cached)
    }

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
        let Some(slot) = self.slot(r.id) else {
            return false;
        };
        let mut shard = self.shard(hash).lock();
        if let Some(&existing) = shard.get(&hash) {
            if self.is_registered(existing) {
                return false;
            }
        }
        let mut cur = slot.state.load(Ordering::Relaxed);
        loop {
            let Some(next) = State(cur).mark_cached(r.generation) else {
                return false;
            };
            // Release: pairs with the Acquire CAS in `lookup`, publishing the block's contents
            // to prefix hits (the shard lock orders the index entry itself).
            match slot.state.compare_exchange_weak(
                cur,
                next.0,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        // Relaxed: we alone may write it (we set CACHED, and only the registration that sets
        // CACHED writes the word); readers reach it through this shard's lock (`evict`) or
        // through the caller's later release (the reclaim path).
        slot.hash.store(hash, Ordering::Relaxed);
        shard.insert(hash, r);
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
        let mut shard = self.shard(hash).lock();
        let r = *shard.get(&hash)?;
        let Some(slot) = self.slot(r.id) else {
            shard.remove(&hash);
            return None;
        };
        // The revive CAS runs under the shard lock: `evict` clears CACHED only under the lock
        // of the block's hash, so while we hold it a CACHED flag at `r.generation` still means
        // "cached under `hash`" (not: evicted and re-registered under another hash).
        let mut cur = slot.state.load(Ordering::Relaxed);
        loop {
            let Some(next) = State(cur).revive(r.generation) else {
                let s = State(cur);
                if s.generation() != r.generation || !s.is_cached() {
                    // Reclaimed (its claimer will also try to remove it) or stale.
                    shard.remove(&hash);
                }
                return None;
            };
            // Acquire: pairs with the Release CAS in `register` (and in `release`), so the
            // registrant's writes to the block happen-before the hit is returned.
            match slot.state.compare_exchange_weak(
                cur,
                next.0,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(r),
                Err(actual) => cur = actual,
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
        let shard = self.shard(hash).lock();
        shard.get(&hash).is_some_and(|&r| self.is_registered(r))
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
        let Some(slot) = self.slot(id) else {
            return false;
        };
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
            let hash = slot.hash.load(Ordering::Relaxed);
            let mut shard = self.shard(hash).lock();
            if shard.get(&hash) != Some(&r) {
                // A registration is between its CAS and its hash store; let it finish.
                drop(shard);
                spin_hint();
                continue;
            }
            // Under this lock with `hash → r` in the index, CACHED at `r.generation` can only
            // be cleared by us or by a reclaim (which bumps the generation).
            let mut cur = slot.state.load(Ordering::Relaxed);
            let now_free = loop {
                let Some((next, now_free)) = State(cur).clear_cached(r.generation) else {
                    shard.remove(&hash); // reclaimed meanwhile; drop its entry
                    return false;
                };
                // Relaxed: an RMW, so it continues the release sequence of the `release`
                // that dropped the count to 0; the next claim's Acquire still pairs with it.
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
            shard.remove(&hash);
            drop(shard);
            if now_free {
                self.push_free(id as u32); // in range: `slot` succeeded
            }
            return true;
        }
        false
    }

    /// Classifies every slot by one scan of the state words (exact when quiescent).
    pub fn census(&self) -> Census {
        let mut c = Census {
            total: self.num_blocks(),
            null: 1,
            ..Census::default()
        };
        for slot in self.slots.iter().skip(1) {
            let s = State(slot.state.load(Ordering::Relaxed));
            match (s.ref_count(), s.is_cached()) {
                (0, false) => c.free += 1,
                (0, true) => c.cached_unreferenced += 1,
                _ => c.referenced += 1,
            }
        }
        c
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
    /// yielded a slot which was not free (it is skipped, never handed out). Always 0 unless
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

    fn shard(&self, hash: BlockHash) -> &Mutex<FxHashMap<BlockHash, BlockRef>> {
        // Fibonacci hashing: callers' hashes may vary mostly in their low bits.
        let i = (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - INDEX_SHARD_BITS)) as usize;
        &self.index[i & (INDEX_SHARDS - 1)]
    }

    /// Whether `r` is cached at its generation (called under the lock of its hash's shard).
    fn is_registered(&self, r: BlockRef) -> bool {
        self.load(r.id)
            .is_some_and(|s| s.generation() == r.generation && s.is_cached())
    }

    /// Drops `hash → old` from the index if it is still there.
    fn remove_index_entry(&self, hash: BlockHash, old: BlockRef) {
        let mut shard = self.shard(hash).lock();
        if shard.get(&hash) == Some(&old) {
            shard.remove(&hash);
        }
    }

    /// Pops a slot index off the free list.
    fn pop_free(&self) -> Option<u32> {
        // Acquire: pairs with the Release CAS in `push_free` that installed this head, so the
        // pusher's store of `next[top]` is visible.
        let mut head = self.free_head.load(Ordering::Acquire);
        loop {
            let (tag, top) = unpack_head(head);
            if top == 0 {
                return None;
            }
            // Relaxed: ordered by the Acquire load above. If `top` was popped and pushed
            // again since, this may be stale, but then the tag moved and the CAS fails.
            let below = self.next.get(top as usize)?.load(Ordering::Relaxed);
            // Acquire (success and failure): the failure value is the next head we read
            // `next[...]` through, pairing with `push_free`'s Release CAS as above; on success
            // the new head's link was published by its pusher (a pop is an RMW and continues
            // that release sequence).
            match self.free_head.compare_exchange_weak(
                head,
                pack_head(next_tag(tag), below),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(top),
                Err(actual) => head = actual,
            }
        }
    }

    /// Pushes a slot index on the free list.
    fn push_free(&self, index: u32) {
        let Some(link) = self.next.get(index as usize) else {
            return;
        };
        let mut head = self.free_head.load(Ordering::Relaxed);
        loop {
            let (tag, top) = unpack_head(head);
            // Relaxed: published by the Release CAS below.
            link.store(top, Ordering::Relaxed);
            // Release: pairs with the Acquire load/CAS in `pop_free`, publishing `next[index]`.
            match self.free_head.compare_exchange_weak(
                head,
                pack_head(next_tag(tag), index),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }
}

/// Maps a refused transition to the caller-facing error (count 0 reads as a double free:
/// `retain` maps it to [`PoolError::NotReferenced`] itself).
fn refusal(e: Refused, r: BlockRef) -> PoolError {
    match e {
        Refused::Stale(current) => PoolError::Stale { block: r, current },
        Refused::Unreferenced => PoolError::DoubleFree(r.id),
        Refused::Overflow => PoolError::RefCountOverflow(r.id),
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;

    fn pool(n: usize) -> BlockPool {
        match BlockPool::new(n) {
            Ok(p) => p,
            Err(e) => panic!("pool({n}): {e}"),
        }
    }

    fn conserved(p: &BlockPool) -> Census {
        let c = p.census();
        assert!(c.conserved(), "{c:?}");
        c
    }

    fn alloc(p: &BlockPool) -> BlockRef {
        let r = p.allocate();
        conserved(p);
        r.unwrap_or_else(|| panic!("pool exhausted"))
    }

    #[test]
    fn pool_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<BlockPool>();
    }

    #[test]
    fn construction_limits() {
        assert_eq!(
            BlockPool::new(0).err(),
            Some(PoolError::TooSmall { num_blocks: 0 })
        );
        assert_eq!(
            BlockPool::new(1).err(),
            Some(PoolError::TooSmall { num_blocks: 1 })
        );
        #[cfg(target_pointer_width = "64")]
        {
            let n = u32::MAX as usize + 1;
            assert_eq!(
                BlockPool::new(n).err(),
                Some(PoolError::TooLarge { num_blocks: n })
            );
        }
        let p = pool(2);
        assert_eq!(p.num_blocks(), 2);
        assert_eq!(p.null_block(), 0);
        let c = conserved(&p);
        assert_eq!((c.total, c.null, c.free), (2, 1, 1));
    }

    #[test]
    fn allocation_until_exhaustion() {
        let p = pool(5);
        let got: Vec<BlockRef> = (0..4).map(|_| alloc(&p)).collect();
        let ids: Vec<BlockId> = got.iter().map(|r| r.id).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        for r in &got {
            assert_eq!(r.generation, 1);
            assert_eq!(p.ref_count(r.id), 1);
            assert!(!p.is_cached(r.id));
        }
        assert_eq!(p.allocate(), None);
        let c = conserved(&p);
        assert_eq!((c.referenced, c.free), (4, 0));
        // Free one, get exactly that one back, generation bumped.
        assert_eq!(p.release(got[2]), Ok(()));
        conserved(&p);
        let again = alloc(&p);
        assert_eq!(
            again,
            BlockRef {
                id: 3,
                generation: 2
            }
        );
        assert_eq!(p.allocate(), None);
    }

    #[test]
    fn allocate_n_is_all_or_nothing() {
        let p = pool(5);
        let mut out = vec![BlockRef {
            id: 9,
            generation: 9,
        }];
        assert!(!p.allocate_n(5, &mut out));
        assert!(!p.allocate_n(usize::MAX, &mut out));
        assert!(p.allocate_n(3, &mut out));
        assert_eq!(out.len(), 4);
        conserved(&p);
        // Only one left: asking for two takes it, gives it back, leaves `out` alone.
        assert!(!p.allocate_n(2, &mut out));
        assert_eq!(out.len(), 4);
        let c = conserved(&p);
        assert_eq!((c.referenced, c.free), (3, 1));
        assert!(p.allocate_n(1, &mut out));
        assert!(p.allocate_n(0, &mut out));
        assert_eq!(out.len(), 5);
    }

    #[test]
    fn generation_bumps_on_reuse_and_stale_is_detected() {
        let p = pool(2);
        let a = alloc(&p);
        assert!(p.is_current(a));
        assert_eq!(p.release(a), Ok(()));
        assert!(
            p.is_current(a),
            "freed but not reused: still the current generation"
        );
        let b = alloc(&p);
        assert_eq!(b.id, a.id);
        assert_eq!(b.generation, a.generation + 1);
        assert_eq!(p.generation(a.id), Some(b.generation));
        assert!(!p.is_current(a));
        let stale = PoolError::Stale {
            block: a,
            current: b.generation,
        };
        assert_eq!(p.release(a), Err(stale.clone()));
        assert_eq!(p.retain(a), Err(stale));
        assert_eq!(p.stale_releases(), 1);
        assert_eq!(p.ref_count(b.id), 1);
        assert!(!p.register(7, a));
        conserved(&p);
    }

    #[test]
    fn double_free_is_detected_and_counted() {
        let p = pool(3);
        let a = alloc(&p);
        assert_eq!(p.release(a), Ok(()));
        assert_eq!(p.release(a), Err(PoolError::DoubleFree(a.id)));
        assert_eq!(p.release(a), Err(PoolError::DoubleFree(a.id)));
        assert_eq!(p.double_frees(), 2);
        assert_eq!(p.retain(a), Err(PoolError::NotReferenced(a.id)));
        let c = conserved(&p);
        assert_eq!(c.free, 2);
        // The slot is on the free list once: two allocations give two different blocks.
        let x = alloc(&p);
        let y = alloc(&p);
        assert_ne!(x.id, y.id);
        assert_eq!(p.allocate(), None);
    }

    #[test]
    fn retain_and_release_count() {
        let p = pool(2);
        let a = alloc(&p);
        assert_eq!(p.retain(a), Ok(()));
        assert_eq!(p.retain(a), Ok(()));
        assert_eq!(p.ref_count(a.id), 3);
        for left in [2, 1, 0] {
            assert_eq!(p.release(a), Ok(()));
            assert_eq!(p.ref_count(a.id), left);
            conserved(&p);
        }
        assert_eq!(p.double_frees(), 0);
    }

    #[test]
    fn ref_count_overflow_is_an_error() {
        let p = pool(2);
        let a = alloc(&p);
        // Drive the count to the maximum directly; a loop of 2^29 retains is too slow.
        let max = State(State::INITIAL.0)
            .fresh_use()
            .0
            .wrapping_add((State::RC_MAX - 1) << State::RC_SHIFT);
        p.slots[1].state.store(max, Ordering::Relaxed);
        assert_eq!(p.ref_count(a.id), MAX_REF_COUNT);
        assert_eq!(p.retain(a), Err(PoolError::RefCountOverflow(a.id)));
        assert_eq!(p.release(a), Ok(()));
        assert_eq!(p.retain(a), Ok(()));
    }

    #[test]
    fn null_and_out_of_range_ids_never_panic() {
        let p = pool(3);
        let null = BlockRef {
            id: 0,
            generation: 0,
        };
        let far = BlockRef {
            id: 3,
            generation: 1,
        };
        let huge = BlockRef {
            id: u64::MAX,
            generation: 1,
        };
        assert_eq!(p.retain(null), Err(PoolError::NullBlock(0)));
        assert_eq!(p.release(null), Err(PoolError::NullBlock(0)));
        assert_eq!(p.retain(far), Err(PoolError::OutOfRange(3)));
        assert_eq!(p.release(huge), Err(PoolError::OutOfRange(u64::MAX)));
        for r in [null, far, huge] {
            assert!(!p.is_current(r));
            assert_eq!(p.generation(r.id), None);
            assert_eq!(p.ref_count(r.id), 0);
            assert!(!p.is_cached(r.id));
            assert!(!p.register(1, r));
            assert!(!p.evict(r.id));
        }
        assert_eq!((p.double_frees(), p.stale_releases()), (0, 0));
        assert_eq!(p.lookup(1), None);
        conserved(&p);
    }

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
    fn reclaim_order_of_cached_blocks() {
        let p = pool(4);
        let blocks: Vec<BlockRef> = (0..3).map(|_| alloc(&p)).collect();
        for (i, r) in blocks.iter().enumerate() {
            assert!(p.register(100 + i as u64, *r));
        }
        // Release in the order 2, 0, 1: that is the reclaim order.
        for &i in &[2usize, 0, 1] {
            assert_eq!(p.release(blocks[i]), Ok(()));
            conserved(&p);
        }
        let c = conserved(&p);
        assert_eq!((c.free, c.cached_unreferenced), (0, 3));
        for &i in &[2usize, 0, 1] {
            let r = alloc(&p);
            assert_eq!(r.id, blocks[i].id);
            assert_eq!(r.generation, blocks[i].generation + 1);
            assert!(!p.is_cached(r.id));
            assert_eq!(
                p.lookup(100 + i as u64),
                None,
                "reclaimed block left the index"
            );
        }
        assert_eq!(p.allocate(), None);
    }

    #[test]
    fn reclaim_prefers_free_list_and_revived_blocks_move_to_the_back() {
        let p = pool(5);
        let blocks: Vec<BlockRef> = (0..3).map(|_| alloc(&p)).collect();
        for (i, r) in blocks.iter().enumerate() {
            assert!(p.register(i as u64, *r));
            assert_eq!(p.release(*r), Ok(()));
        }
        // Revive block 0 and release it again: now the most recently released.
        assert_eq!(p.lookup(0), Some(blocks[0]));
        assert_eq!(p.release(blocks[0]), Ok(()));
        // The free block (id 4) goes first, then 1, 2, 0.
        assert_eq!(alloc(&p).id, 4);
        let order: Vec<BlockId> = (0..3).map(|_| alloc(&p).id).collect();
        assert_eq!(order, [blocks[1].id, blocks[2].id, blocks[0].id]);
        assert_eq!(p.allocate(), None);
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
    fn stale_queue_entry_never_double_allocates() {
        // Released cached (queued), revived, evicted, released uncached → free list, while its
        // old queue entry is still pending: the block must be handed out once.
        let p = pool(3);
        let a = alloc(&p);
        assert!(p.register(1, a));
        assert_eq!(p.release(a), Ok(()));
        assert_eq!(p.lookup(1), Some(a));
        assert!(p.evict(a.id));
        assert_eq!(p.release(a), Ok(()));
        let x = alloc(&p);
        let y = alloc(&p);
        assert_ne!(x.id, y.id);
        assert_eq!(p.allocate(), None);
        conserved(&p);
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

    #[test]
    fn census_conserved_through_a_sequence() {
        let p = pool(6);
        let mut held = Vec::new();
        for i in 0..5u64 {
            let r = alloc(&p);
            if i % 2 == 0 {
                assert!(p.register(i, r));
            }
            held.push(r);
            conserved(&p);
        }
        for r in held.drain(..) {
            assert_eq!(p.release(r), Ok(()));
            conserved(&p);
        }
        let c = conserved(&p);
        assert_eq!((c.free, c.cached_unreferenced, c.referenced), (2, 3, 0));
        assert!(p.evict(1));
        let c = conserved(&p);
        assert_eq!((c.free, c.cached_unreferenced), (3, 2));
        let mut all = Vec::new();
        assert!(
            p.allocate_n(5, &mut all),
            "every count-0 block is allocatable"
        );
        let c = conserved(&p);
        assert_eq!(c.referenced, 5);
    }
}

#[cfg(test)]
mod concurrent_tests;
