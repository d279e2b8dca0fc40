//! The claim table: decides, without a global lock, which request recomputes each invalid
//! block of a step, so that the outcome equals the sequential rules in canonical order
//! whatever the thread interleaving and the number of shards (docs/runtime.md).
//!
//! # Protocol (one step)
//!
//! 1. **Publish.** Every block in the step's report has its claim word reset to
//!    [`RequestKey::EMPTY`] by whoever publishes it ([`ClaimTable::reset`]).
//! 2. *Barrier.* No claim starts before every reset is done.
//! 3. **Claim.** Every hit does one wait-free `fetch_min` of its request's [`RequestKey`] on the
//!    block's word ([`ClaimTable::claim`]). The least key — the earliest request in canonical
//!    order — survives, whatever order the `fetch_min`s run in.
//! 4. *Barrier.* No decision starts before every claim is done.
//! 5. **Decide.** A request owns a block iff the word holds its own key
//!    ([`ClaimTable::winner`]); otherwise the word names the owner.
//!
//! Mode `vllm` runs the async and the sync scan with separate marked sets, so the table keeps
//! one word per scan ([`Scan`]); mode `safe` uses the async word for both.
//!
//! # Waiting for owners
//!
//! The table also holds, per block, the key of the request that must recompute it
//! ([`ClaimTable::set_pending`]). Sharers do not read the block until the owner clears the mark
//! with a `Release` store after recomputing it ([`ClaimTable::clear_pending`]); they test it
//! with an `Acquire` load ([`ClaimTable::pending_owner`]).
//!
//! # Guarantees and limits
//!
//! * Claims are wait-free (one `fetch_min` each); resets and decisions are plain loads and
//!   stores. Nothing on this path takes a lock.
//! * Correctness needs the two barriers: a decision taken before every shard has claimed can
//!   see a later-superseded key (the loom model `claim_decide_after_all_claimed` checks this).
//! * Block ids index the table directly: ids must be below the capacity given at construction.

use crate::rules::geometry::BlockId;
use crate::sync::{AtomicU64, Ordering};

/// Which marked set a claim belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scan {
    /// Mode `vllm`'s async scan, and mode `safe`'s only scan.
    Async,
    /// Mode `vllm`'s sync scan.
    Sync,
}

/// A request's canonical position, packed so that a smaller key is earlier in canonical order:
/// class (async before sync) | priority (lower first) | admission sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey(u64);

const SEQ_BITS: u32 = 47;
const PRIO_BITS: u32 = 16;

impl RequestKey {
    /// The value of an unclaimed word: greater than every real key.
    pub const EMPTY: u64 = u64::MAX;
    /// Largest admission sequence number a key can hold. Sequence numbers start at 1, so no
    /// key is 0 (a clear pending mark) or `u64::MAX` ([`RequestKey::EMPTY`], or the claim table's orphan mark).
    pub const MAX_SEQ: u64 = (1 << SEQ_BITS) - 2;
    const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

    /// Packs a key. `seq` must be in `1..=MAX_SEQ`.
    #[inline]
    pub fn new(sync: bool, priority: i16, seq: u64) -> Self {
        let prio = (priority as i32 - i16::MIN as i32) as u64; // order-preserving bias
        debug_assert!(seq <= Self::MAX_SEQ);
        RequestKey(
            (u64::from(sync) << (SEQ_BITS + PRIO_BITS))
                | (prio << SEQ_BITS)
                | (seq & Self::SEQ_MASK),
        )
    }

    /// The raw word.
    #[inline]
    pub fn raw(self) -> u64 {
        self.0
    }

    /// A key from a raw word (e.g. read back from the table).
    #[inline]
    pub fn from_raw(raw: u64) -> Self {
        RequestKey(raw)
    }

    /// The admission sequence number.
    #[inline]
    pub fn seq(self) -> u64 {
        self.0 & Self::SEQ_MASK
    }

    /// The priority it was packed with.
    #[inline]
    pub fn priority(self) -> i16 {
        (((self.0 >> SEQ_BITS) & ((1 << PRIO_BITS) - 1)) as i32 + i16::MIN as i32) as i16
    }

    /// Whether it is the sync-class (running) key.
    #[inline]
    pub fn is_sync(self) -> bool {
        self.0 >> (SEQ_BITS + PRIO_BITS) & 1 == 1
    }

    /// The same request's key in the other class.
    #[inline]
    pub fn with_sync(self, sync: bool) -> Self {
        let mask = 1u64 << (SEQ_BITS + PRIO_BITS);
        RequestKey(if sync { self.0 | mask } else { self.0 & !mask })
    }
}

/// Per-block claim words and pending-recompute marks.
#[derive(Debug)]
pub struct ClaimTable {
    async_words: Box<[AtomicU64]>,
    sync_words: Box<[AtomicU64]>,
    pending: Box<[AtomicU64]>,
}

/// Success ordering of [`ClaimTable::clear_pending`]: Release. The planted bug
/// `clear-pending-relaxed` (loom demonstration, `loom-tests/plants.sh`) weakens it to Relaxed.
const CLEAR_ORDER: Ordering = if planted!("clear-pending-relaxed") {
    Ordering::Relaxed
} else {
    Ordering::Release
};

/// `pending` value of a block nobody has to recompute.
const NOT_PENDING: u64 = 0;
/// `pending` value of a block whose owner left before recomputing it; it is reported again and
/// re-claimed in the next step, and nobody may read it meanwhile.
pub const ORPHANED: u64 = u64::MAX;

impl ClaimTable {
    /// A table for block ids `0..capacity`.
    pub fn new(capacity: usize) -> Self {
        let words = |v| {
            (0..capacity)
                .map(|_| AtomicU64::new(v))
                .collect::<Box<[_]>>()
        };
        ClaimTable {
            async_words: words(RequestKey::EMPTY),
            sync_words: words(RequestKey::EMPTY),
            pending: words(NOT_PENDING),
        }
    }

    #[inline]
    fn word(&self, id: BlockId, scan: Scan) -> Option<&AtomicU64> {
        let words = match scan {
            Scan::Async => &self.async_words,
            Scan::Sync => &self.sync_words,
        };
        usize::try_from(id).ok().and_then(|i| words.get(i))
    }

    /// Publish phase: clears both claim words of `id`. Out-of-range ids are ignored (the pool
    /// never hands them out).
    #[inline]
    pub fn reset(&self, id: BlockId) {
        for scan in [Scan::Async, Scan::Sync] {
            if let Some(w) = self.word(id, scan) {
                // Relaxed: ordered before every claim of this step by the publish barrier
                // (its Release arrive pairs with the claimers' Acquire departure).
                w.store(RequestKey::EMPTY, Ordering::Relaxed);
            }
        }
    }

    /// Claim phase: offers `key` for `id`; the least key wins.
    #[inline]
    pub fn claim(&self, id: BlockId, scan: Scan, key: RequestKey) {
        if let Some(w) = self.word(id, scan) {
            if planted!("claim-store") {
                // Planted bug for the loom demonstration: a plain store lets the last writer
                // win.
                w.store(key.raw(), Ordering::Relaxed);
            } else {
                // Relaxed: every claim is an RMW on the same word, so they are totally
                // ordered; the claim barrier (Release arrive / Acquire depart) orders them all
                // before every `winner` load.
                w.fetch_min(key.raw(), Ordering::Relaxed);
            }
        }
    }

    /// Decide phase: the winning key of `id` in `scan`, `None` if nobody claimed it.
    #[inline]
    pub fn winner(&self, id: BlockId, scan: Scan) -> Option<RequestKey> {
        // Relaxed: the claim barrier orders every claim before this load (see `claim`).
        let raw = self.word(id, scan)?.load(Ordering::Relaxed);
        (raw != RequestKey::EMPTY).then_some(RequestKey(raw))
    }

    /// Marks `id` as awaiting recompute by `owner`.
    #[inline]
    pub fn set_pending(&self, id: BlockId, owner: RequestKey) {
        if let Some(w) = usize::try_from(id).ok().and_then(|i| self.pending.get(i)) {
            // Relaxed: waiters learn of the mark through the step barrier that follows the
            // decide phase, not through this word; only the clear publishes data.
            w.store(owner.raw(), Ordering::Relaxed);
        }
    }

    /// Marks `id` as orphaned: its owner left before recomputing it.
    #[inline]
    pub fn orphan(&self, id: BlockId, owner: RequestKey) {
        if let Some(w) = usize::try_from(id).ok().and_then(|i| self.pending.get(i)) {
            // Relaxed CAS: only the owner changes its own mark; ordering as in `set_pending`.
            let _ = w.compare_exchange(owner.raw(), ORPHANED, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// The owner recomputed `id`: sharers may read it. Only clears the owner's own mark.
    #[inline]
    pub fn clear_pending(&self, id: BlockId, owner: RequestKey) -> bool {
        match usize::try_from(id).ok().and_then(|i| self.pending.get(i)) {
            // Release on success: publishes the owner's recomputed block contents; pairs with
            // the Acquire load in `pending_owner` by the waiters.
            Some(w) => w
                .compare_exchange(owner.raw(), NOT_PENDING, CLEAR_ORDER, Ordering::Relaxed)
                .is_ok(),
            None => false,
        }
    }

    /// Clears any mark on `id` (the block was freed).
    #[inline]
    pub fn forget(&self, id: BlockId) {
        if let Some(w) = usize::try_from(id).ok().and_then(|i| self.pending.get(i)) {
            // Relaxed: a freed block has no readers.
            w.store(NOT_PENDING, Ordering::Relaxed);
        }
    }

    /// Who must recompute `id` first: `None` when it may be read, `Some(ORPHANED)` raw when its
    /// owner left.
    #[inline]
    pub fn pending_owner(&self, id: BlockId) -> Option<u64> {
        let w = usize::try_from(id).ok().and_then(|i| self.pending.get(i))?;
        // Acquire: pairs with the Release CAS in `clear_pending`, so a waiter that sees the
        // mark cleared also sees the recomputed contents.
        let v = w.load(Ordering::Acquire);
        (v != NOT_PENDING).then_some(v)
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;

    #[test]
    fn key_order_is_canonical_order() {
        let a = RequestKey::new(false, 5, 100);
        let b = RequestKey::new(false, 5, 101);
        let c = RequestKey::new(false, 6, 1);
        let d = RequestKey::new(true, i16::MIN, 0);
        let e = RequestKey::new(false, -3, 900);
        assert!(e < a && a < b && b < c && c < d);
        assert!(d.raw() < RequestKey::EMPTY);
        assert_eq!(
            RequestKey::new(true, i16::MAX, RequestKey::MAX_SEQ).seq(),
            RequestKey::MAX_SEQ
        );
        assert_eq!(a.with_sync(true).with_sync(false), a);
        assert!(a.with_sync(true) > c);
    }

    #[test]
    fn the_class_bit_is_set_or_cleared_and_the_key_space_is_used_to_its_end() {
        let a = RequestKey::new(false, 3, 9);
        let s = a.with_sync(true);
        assert!(s.is_sync() && !a.is_sync());
        // Setting the class a key already has leaves it as it is.
        assert_eq!(s.with_sync(true), s);
        assert_eq!(a.with_sync(false), a);
        // MAX_SEQ is the largest sequence number a key holds: with the latest class and
        // priority it is the last key below the unclaimed word.
        let last = RequestKey::new(true, i16::MAX, RequestKey::MAX_SEQ);
        assert_eq!(last.raw(), RequestKey::EMPTY - 1);
    }

    #[test]
    fn least_key_wins_per_scan() {
        let t = ClaimTable::new(8);
        let (k1, k2) = (RequestKey::new(false, 0, 2), RequestKey::new(false, 0, 1));
        t.reset(3);
        assert_eq!(t.winner(3, Scan::Async), None);
        t.claim(3, Scan::Async, k1);
        t.claim(3, Scan::Async, k2);
        t.claim(3, Scan::Sync, k1);
        assert_eq!(t.winner(3, Scan::Async), Some(k2));
        assert_eq!(t.winner(3, Scan::Sync), Some(k1));
        t.reset(3);
        assert_eq!(t.winner(3, Scan::Sync), None);
        // Out of range: ignored, never a panic.
        t.claim(99, Scan::Async, k1);
        assert_eq!(t.winner(99, Scan::Async), None);
    }

    #[test]
    fn pending_marks() {
        let t = ClaimTable::new(4);
        let (o, other) = (RequestKey::new(false, 0, 1), RequestKey::new(false, 0, 2));
        t.set_pending(2, o);
        assert_eq!(t.pending_owner(2), Some(o.raw()));
        assert!(!t.clear_pending(2, other));
        t.orphan(2, other);
        assert_eq!(t.pending_owner(2), Some(o.raw()));
        t.orphan(2, o);
        assert_eq!(t.pending_owner(2), Some(ORPHANED));
        t.set_pending(2, other);
        assert!(t.clear_pending(2, other));
        assert_eq!(t.pending_owner(2), None);
    }
}
