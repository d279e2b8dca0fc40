//! [`Lock`] and [`Wake`]: std's futex-based mutex and condition variable, which keep their
//! whole state in their own words — for the threads of a process that may fork.
//!
//! A parking_lot lock or condition variable lists each thread parked on it in one
//! process-wide table. A forked child inherits that table with the entries of the parent's
//! parked threads, which the child does not have and whose stacks it reuses: the Python tier's
//! worker pool, whose idle workers were parked there at a fork, made the first waits of a new
//! tier's workers in the child crash or hang. The pool's threads wait only on these, so an
//! idle pool leaves nothing in that table. (A fork while a job runs inside a store, which may
//! park on the store's own locks, still can: fork while the tiers are idle, or start the
//! child with `spawn`.) Only the binding uses them (feature `internals`).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// A mutex whose poisoning is ignored: a panicking holder (none is expected: the pool's
/// critical sections are pushes, pops and swaps) leaves data as consistent as its last write.
#[derive(Debug, Default)]
pub struct Lock<T>(Mutex<T>);

impl<T> Lock<T> {
    /// A lock holding `v`.
    pub fn new(v: T) -> Self {
        Lock(Mutex::new(v))
    }

    /// Locks, waiting for the holder.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The guard if the lock is free now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// A condition variable over a [`Lock`].
#[derive(Debug, Default)]
pub struct Wake(Condvar);

impl Wake {
    /// A condition variable.
    pub fn new() -> Self {
        Wake(Condvar::new())
    }

    /// Releases `guard`, sleeps until notified (or spuriously), and locks again.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// Like [`wait`](Self::wait), but gives up at `deadline` (`None`: never); returns whether
    /// it timed out.
    pub fn wait_until<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, T>, bool) {
        let Some(deadline) = deadline else {
            return (self.wait(guard), false);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (guard, true);
        }
        let (g, r) = self
            .0
            .wait_timeout(guard, left)
            .unwrap_or_else(PoisonError::into_inner);
        (g, r.timed_out())
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}
