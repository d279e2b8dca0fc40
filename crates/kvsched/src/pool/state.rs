//! The packed per-slot state word and its transitions.
//!
//! Every ownership change of a slot is one compare-and-swap on this word. The transitions
//! here are pure: they compute the next word (or refuse), and the caller installs it.

use super::Generation;

/// The largest reference count a block can hold (2²⁸ − 1).
pub const MAX_REF_COUNT: u32 = State::RC_MAX as u32;

/// A slot's state word: `generation (32) | ref count (28) | FILLING | TOUCHED | QUEUED | CACHED`.
///
/// * `CACHED` — the slot is in the prefix index under the hash in `Slot::hash`.
/// * `QUEUED` — the slot has an entry in the reclaim queue (or one is being pushed/handled).
///   It may outlive the slot's generation: the entry is then discarded when popped.
/// * `TOUCHED` — the slot went back to count 0 after its queue entry was pushed, so the entry
///   is older than the slot's last release: the popper gives it a second chance.
/// * `FILLING` — an asynchronous load owns the slot's bytes: only that load's worker may write
///   them, nobody may read them, and the slot cannot be cached or freed until the load's
///   completion is applied and the flag cleared.
///
/// Transitions are pure functions returning the next word; callers install it with one CAS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct State(pub(super) u64);

/// Why [`State::retain`] / [`State::release`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Different generation (the slot's current one).
    Stale(Generation),
    /// Count already 0.
    Unreferenced,
    /// Count at [`State::RC_MAX`].
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // only `retain` refuses so
    Overflow,
    /// The last reference of a slot whose load still owns its bytes.
    Filling,
}

/// What the releaser must do after installing [`State::release`]'s word.
#[must_use = "a slot left at count 0 must be pushed where its next owner finds it"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AfterRelease {
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
pub(super) enum ReclaimStep {
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
    const FILLING: u64 = 1 << 3;
    const FLAGS: u64 = Self::CACHED | Self::QUEUED | Self::TOUCHED | Self::FILLING;
    pub(super) const RC_SHIFT: u32 = 4;
    pub(super) const RC_MAX: u64 = (1 << 28) - 1;
    const RC_ONE: u64 = 1 << Self::RC_SHIFT;
    const GEN_SHIFT: u32 = 32;

    /// Generation 0, count 0, no flags: a slot on the free list of a new pool.
    pub(super) const INITIAL: State = State(0);

    pub(super) fn generation(self) -> Generation {
        (self.0 >> Self::GEN_SHIFT) as Generation
    }

    pub(super) fn ref_count(self) -> u32 {
        ((self.0 >> Self::RC_SHIFT) & Self::RC_MAX) as u32
    }

    pub(super) fn is_cached(self) -> bool {
        self.0 & Self::CACHED != 0
    }

    fn is_queued(self) -> bool {
        self.0 & Self::QUEUED != 0
    }

    fn is_touched(self) -> bool {
        self.0 & Self::TOUCHED != 0
    }

    pub(super) fn is_filling(self) -> bool {
        self.0 & Self::FILLING != 0
    }

    /// A load takes the slot's bytes: sets `FILLING` on a referenced, uncached slot of
    /// generation `gen` that no other load owns.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    pub(super) fn begin_fill(self, gen: Generation) -> Option<State> {
        (self.generation() == gen
            && self.ref_count() > 0
            && !self.is_cached()
            && !self.is_filling())
        .then(|| self.with_flags(Self::FILLING, 0))
    }

    /// The load's completion was applied: clears `FILLING` on a slot of generation `gen`.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    pub(super) fn end_fill(self, gen: Generation) -> Option<State> {
        (self.generation() == gen && self.is_filling()).then(|| self.with_flags(0, Self::FILLING))
    }

    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    fn with_flags(self, set: u64, clear: u64) -> State {
        State((self.0 & !clear) | set)
    }

    /// A fresh use of the slot: generation + 1, count 1, uncached. `QUEUED` is kept (a queue
    /// entry of an older generation may still be pending and owns that bit), `TOUCHED` cleared.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    pub(super) fn fresh_use(self) -> State {
        let gen = self.generation().wrapping_add(1) as u64;
        let queued = self.0 & Self::QUEUED;
        State((gen << Self::GEN_SHIFT) | Self::RC_ONE | queued)
    }

    /// Free-list pop → owned: requires count 0 and uncached (always true for a slot on the
    /// free list; `None` would mean the free list is corrupt).
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    pub(super) fn claim_free(self) -> Option<State> {
        (self.ref_count() == 0 && !self.is_cached()).then(|| self.fresh_use())
    }

    /// The decision for a popped reclaim-queue entry.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    pub(super) fn reclaim(self) -> ReclaimStep {
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
    pub(super) fn retain(self, gen: Generation) -> Result<State, Refused> {
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
    pub(super) fn release(self, gen: Generation) -> Result<(State, AfterRelease), Refused> {
        if self.generation() != gen {
            return Err(Refused::Stale(self.generation()));
        }
        match self.ref_count() {
            0 => Err(Refused::Unreferenced),
            // Planted bug `fill-release-unguarded` (loom-tests/plants.sh): a filling block is
            // freed by its last release while its load may still write it.
            1 if self.is_filling() && !planted!("fill-release-unguarded") => Err(Refused::Filling),
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
    pub(super) fn revive(self, gen: Generation) -> Option<State> {
        (self.generation() == gen && self.is_cached() && u64::from(self.ref_count()) < Self::RC_MAX)
            .then(|| State(self.0 + Self::RC_ONE))
    }

    /// Registration: sets `CACHED` on a referenced, uncached slot of generation `gen` whose
    /// bytes no load owns.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    pub(super) fn mark_cached(self, gen: Generation) -> Option<State> {
        (self.generation() == gen
            && self.ref_count() > 0
            && !self.is_cached()
            && !self.is_filling())
        .then(|| self.with_flags(Self::CACHED, 0))
    }

    /// Eviction: clears `CACHED` on a cached slot of generation `gen`; the flag says whether
    /// the slot is now free (count 0) and must be pushed on the free list.
    #[must_use = "a transition takes effect only once installed with a CAS on the state word"]
    pub(super) fn clear_cached(self, gen: Generation) -> Option<(State, bool)> {
        (self.generation() == gen && self.is_cached())
            .then(|| (self.with_flags(0, Self::CACHED), self.ref_count() == 0))
    }
}

// Compile-time layout checks: the fields do not overlap and fill the word.
const _: () = {
    assert!(State::FLAGS < State::RC_ONE);
    assert!((State::RC_MAX << State::RC_SHIFT) >> State::GEN_SHIFT == 0);
    assert!(State::RC_SHIFT + 28 == State::GEN_SHIFT);
};
