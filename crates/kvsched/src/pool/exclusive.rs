//! The pool's exclusive mode: while one thread is the pool's only mutator, its state
//! transitions are a load and a store instead of a compare-and-swap.
//!
//! Every mutation of the pool is made by a shard's step. A step the runtime runs inline —
//! every shard on the engine thread, as every step below `parallel_step_work` is — has the
//! pool to itself: it takes [`BlockPool::exclusive`] for the step. A step run in parallel
//! takes [`BlockPool::shared`] on each shard thread. Both are one `RwLock` (write and read):
//! an exclusive step never overlaps a parallel one, and a parallel step's shards never see
//! the flag set.
//!
//! While [`Exclusive`] is held, the hot transitions — allocation from the free list and by
//! reclaim, release, registration, revival, the fill flags and the free list's head —
//! install their next word with a plain store, keeping the orderings the compare-and-swap
//! had (its Acquire on the load, its Release on the store), so every happens-before edge the
//! lock-free protocol names still holds: a locked instruction is what an uncontended CAS
//! costs over a store, and nothing contends. The other transitions (eviction, retain) keep
//! their compare-and-swap, which is correct in both modes. The parts of the pool behind a
//! short lock — the prefix index's shards and the reclaim queue, each a [`ModeLock`] — are
//! reached without it. Readers of the slot words that are not
//! mutators — a load's worker checking its fill flag, the census — read them atomically as
//! before.
//!
//! # Contract
//!
//! While an [`Exclusive`] is held, no other thread mutates the pool or reaches its prefix
//! index (`register`, `lookup`, `contains_hash`, `evict`, allocation by reclaim); a holder of
//! [`Shared`] never overlaps it, so the runtime, which holds one guard or the other for every
//! step and touches the pool nowhere else but in shutdown (which no step overlaps), keeps it.
//! Tests, benches and loom models that never take [`Exclusive`] may use the pool without
//! either guard: the flag is then never set, every transition is a CAS and every index access
//! takes its shard's lock. [`BlockPool::exclusive`] is `unsafe` because breaking the contract
//! is a data race on the index.

use super::BlockPool;
use crate::sync::{
    AtomicBool, AtomicU64, Mutex, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard, UnsafeCell,
};

/// The mode's lock and flag.
#[derive(Debug, Default)]
pub(super) struct Mode {
    /// Write: an exclusive step; read: one shard of a parallel step.
    steps: RwLock<()>,
    /// Set while an [`Exclusive`] is held (by its holder, after taking the write lock).
    exclusive: AtomicBool,
}

/// The pool held by one mutator: see the module docs. Dropping it ends the mode.
#[must_use = "the mode ends when the guard drops"]
pub struct Exclusive<'a> {
    pool: &'a BlockPool,
    _step: Held<'a>,
}

/// The lock an [`Exclusive`] holds: the write lock (a read lock only in the planted bug).
enum Held<'a> {
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
    #[allow(dead_code)]
    Read(RwLockReadGuard<'a, ()>),
}

/// One shard's share of a parallel step: see the module docs.
#[must_use = "the share ends when the guard drops"]
pub struct Shared<'a> {
    _step: RwLockReadGuard<'a, ()>,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        // Relaxed: read only by this thread until the write lock is released (whose Release
        // orders it before any later guard holder's reads).
        self.pool.mode.exclusive.store(false, Ordering::Relaxed);
    }
}

impl BlockPool {
    /// Makes the caller the pool's only mutator until the guard drops; waits for parallel
    /// steps' shards to let go of theirs.
    ///
    /// # Safety
    ///
    /// Until the guard drops, no other thread may mutate the pool or reach its prefix index
    /// without holding [`shared`](Self::shared) (see the module's contract): the holder reaches
    /// the index without its locks.
    pub unsafe fn exclusive(&self) -> Exclusive<'_> {
        // Planted bug (loom-tests/plants.sh): the flag is set under a read lock, which keeps
        // no parallel mutator out.
        let step = if planted!("exclusive-unguarded") {
            Held::Read(self.mode.steps.read())
        } else {
            Held::Write(self.mode.steps.write())
        };
        // Relaxed: read by this thread (program order); other threads are kept out by the
        // write lock until the flag is cleared.
        self.mode.exclusive.store(true, Ordering::Relaxed);
        Exclusive {
            pool: self,
            _step: step,
        }
    }

    /// A shard's share of a parallel step: other shards may mutate the pool meanwhile, so
    /// every transition is a CAS; waits while an [`Exclusive`] is held.
    pub fn shared(&self) -> Shared<'_> {
        Shared {
            _step: self.mode.steps.read(),
        }
    }

    /// Whether the calling mutator holds [`Exclusive`] (only its holder ever reads `true`).
    #[inline]
    pub(super) fn is_exclusive(&self) -> bool {
        // Relaxed: see `exclusive`; a shard of a parallel step holds the read lock, which
        // the writer's clear happens-before.
        self.mode.exclusive.load(Ordering::Relaxed)
    }
}

/// A part of the pool behind its own short lock, which the holder of [`Exclusive`] skips: a
/// shard of the prefix index, and the reclaim queue. Its value is reached only through
/// [`with`](Self::with).
pub(super) struct ModeLock<T> {
    /// Held for every access to `value`, except by the holder of the pool's `Exclusive`.
    lock: Mutex<()>,
    value: UnsafeCell<T>,
}

// SAFETY: `value` is reached only in `ModeLock::with`, which holds `lock` unless its caller
// holds the pool's `Exclusive`; and while `Exclusive` is held no other thread reaches the
// pool's locked parts (its contract, which `BlockPool::exclusive`'s callers promise). So at
// most one thread reaches the value at a time, and each hand-off between threads goes
// through `lock` or through the pool's step lock, whose release and acquire order the
// accesses. `T: Send`: the value is used from whichever thread holds it.
unsafe impl<T: Send> Sync for ModeLock<T> {}

impl<T> ModeLock<T> {
    pub(super) fn new(value: T) -> Self {
        ModeLock {
            lock: Mutex::new(()),
            value: UnsafeCell::new(value),
        }
    }

    /// Calls `f` on the value, under the lock unless `exclusive` (the caller holds the pool's
    /// `Exclusive`). `f` must not reach this `ModeLock` again.
    #[inline]
    pub(super) fn with<R>(&self, exclusive: bool, f: impl FnOnce(&mut T) -> R) -> R {
        let _held = (!exclusive).then(|| self.lock.lock());
        self.value.with_mut(|value| {
            // SAFETY: no other thread reaches the value meanwhile: we hold `lock`, which every
            // other access holds too unless it is the `Exclusive` holder's, and no thread
            // holds `Exclusive` while another, with or without a guard, reaches the pool's
            // locked parts (see the `Sync` impl); or we hold `Exclusive` ourselves. This
            // thread makes no other reference to it while `f` runs (`f` does not reach it).
            f(unsafe { &mut *value })
        })
    }
}

impl<T> std::fmt::Debug for ModeLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModeLock").finish_non_exhaustive()
    }
}

/// Installs `step(current)` on `word` and returns the word it replaced with `step`'s
/// result, or `step`'s refusal with nothing changed: a CAS loop whose success ordering is
/// `success`, or, when `exclusive` (the caller holds [`Exclusive`]), a load and a store that
/// carry the CAS's orderings — its Acquire on the load, its Release on the store.
#[inline]
pub(super) fn transition<T, E>(
    word: &AtomicU64,
    exclusive: bool,
    success: Ordering,
    mut step: impl FnMut(u64) -> Result<(u64, T), E>,
) -> Result<(u64, T), E> {
    if exclusive {
        let (load, store) = split(success);
        let cur = word.load(load);
        let (next, t) = step(cur)?;
        word.store(next, store);
        return Ok((cur, t));
    }
    let mut cur = word.load(Ordering::Relaxed);
    loop {
        let (next, t) = step(cur)?;
        match word.compare_exchange_weak(cur, next, success, Ordering::Relaxed) {
            Ok(_) => return Ok((cur, t)),
            Err(actual) => cur = actual,
        }
    }
}

/// A read-modify-write ordering as the orderings of a load and a store.
fn split(rmw: Ordering) -> (Ordering, Ordering) {
    match rmw {
        Ordering::Acquire => (Ordering::Acquire, Ordering::Relaxed),
        Ordering::Release => (Ordering::Relaxed, Ordering::Release),
        Ordering::AcqRel => (Ordering::Acquire, Ordering::Release),
        Ordering::SeqCst => (Ordering::SeqCst, Ordering::SeqCst),
        _ => (Ordering::Relaxed, Ordering::Relaxed),
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use crate::pool::tests::{conserved, pool};
    use crate::pool::{BlockPool, BlockRef};

    /// A fixed mix of every transition, returning what each call returned.
    fn churn(p: &BlockPool) -> Vec<String> {
        let mut log = Vec::new();
        let mut held: Vec<BlockRef> = Vec::new();
        for round in 0..40u64 {
            let mut fresh = Vec::new();
            log.push(format!("{}", p.allocate_n(3, &mut fresh)));
            let entries: Vec<_> = fresh.iter().map(|&r| (round * 7 + r.id, r)).collect();
            p.register_all(&entries);
            log.push(format!("{fresh:?}"));
            if let Some(hit) = p.lookup(round.saturating_sub(1) * 7 + 1) {
                held.push(hit);
            }
            for r in fresh {
                log.push(format!("{:?}", p.release(r)));
            }
            if round % 3 == 0 {
                if let Some(r) = held.pop() {
                    log.push(format!("{:?}", p.release(r)));
                }
            }
        }
        log
    }

    #[test]
    fn an_exclusive_holder_sees_what_compare_and_swap_gives() {
        let shared = pool(8);
        let exclusive = pool(8);
        let expected = churn(&shared);
        let got = {
            // SAFETY: no other thread has the pool.
            let _only = unsafe { exclusive.exclusive() };
            assert!(exclusive.is_exclusive());
            churn(&exclusive)
        };
        assert!(!exclusive.is_exclusive(), "the mode ends with its guard");
        assert_eq!(got, expected);
        assert_eq!(conserved(&exclusive), conserved(&shared));
        let _step = exclusive.shared();
        assert!(!exclusive.is_exclusive());
    }
}
