//! **Internal, not part of the stable API.** Public only under feature `internals`, for the
//! project's own tools, tests and benchmarks (`kvsched-cli`, the Python package, the tests,
//! the mechanism benches); crate-private in a normal build. Anything here may change or
//! disappear in any release, outside any semver promise.
//!
//! The only module that names atomics, locks, threads and queues.
//!
//! Everything concurrent in kvsched imports from here. Normally these are `std` atomics,
//! `parking_lot` locks, `std::thread` and crossbeam queues; under `--cfg kvsched_loom` they are
//! loom's, crossbeam's queues are replaced by a loom-visible model with the same interface,
//! and default capacities shrink so models stay small. What the runtime uses and loom lacks
//! is routed through here too: `thread` (loom's threads with `JoinHandle::is_finished` and a
//! `sleep` that yields) and `Backoff` (under loom: never spins, see [`Backoff`]).

#[cfg(not(kvsched_loom))]
mod imp {
    #[cfg_attr(not(feature = "redis"), allow(unused_imports))] // `MutexGuard`: the Redis tier
    pub use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
    pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use std::sync::Arc;
    pub use std::thread;

    pub use crossbeam_utils::Backoff;

    /// Spin-loop hint.
    #[inline]
    pub fn spin_hint() {
        std::hint::spin_loop();
    }

    /// A cell whose contents are reached through a raw pointer inside a closure — loom's
    /// interface, so that under loom every access is checked for a data race.
    #[derive(Debug, Default)]
    pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        /// A new cell.
        pub fn new(v: T) -> Self {
            UnsafeCell(std::cell::UnsafeCell::new(v))
        }
        /// Calls `f` with a pointer to the contents; the caller rules out other accesses
        /// while `f` runs.
        #[inline]
        pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// A bounded MPMC queue (crossbeam's `ArrayQueue`).
    pub use crossbeam_queue::ArrayQueue;
    /// An unbounded MPMC queue (crossbeam's `SegQueue`).
    pub use crossbeam_queue::SegQueue;
}

#[cfg(kvsched_loom)]
mod imp {
    /// loom's cell: every access through `with_mut` is checked for a data race.
    pub use loom::cell::UnsafeCell;
    pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use loom::sync::Arc;

    /// Under loom a spin must yield so the model can schedule the thread being waited for.
    #[inline]
    pub fn spin_hint() {
        loom::thread::yield_now();
    }

    /// crossbeam's `Backoff` under loom: already completed, so a caller that spins before it
    /// sleeps sleeps at once, and one that snoozes yields. Spinning only repeats a check the
    /// model schedules anyway; each extra spin would multiply the interleavings to explore.
    #[derive(Debug, Default)]
    pub struct Backoff;

    impl Backoff {
        /// A backoff (stateless under loom).
        pub fn new() -> Self {
            Backoff
        }
        /// Yields.
        pub fn spin(&self) {
            loom::thread::yield_now();
        }
        /// Yields.
        pub fn snooze(&self) {
            loom::thread::yield_now();
        }
        /// Always `true`: callers go straight to their blocking path.
        pub fn is_completed(&self) -> bool {
            true
        }
        /// Nothing to reset.
        pub fn reset(&self) {}
    }

    /// A loom mutex with parking_lot's (non-poisoning) interface.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);
    /// Guard of [`Mutex`].
    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// A new mutex.
        pub fn new(v: T) -> Self {
            Mutex(loom::sync::Mutex::new(v))
        }
        /// Locks; loom's mutex cannot be poisoned by a model that passes.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            match self.0.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            }
        }
    }

    /// A loom reader-writer lock with parking_lot's (non-poisoning) interface.
    #[derive(Debug, Default)]
    pub struct RwLock<T>(loom::sync::RwLock<T>);
    /// Shared guard of [`RwLock`].
    pub type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
    /// Exclusive guard of [`RwLock`].
    pub type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        /// A new lock.
        pub fn new(v: T) -> Self {
            RwLock(loom::sync::RwLock::new(v))
        }
        /// Locks shared.
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            match self.0.read() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            }
        }
        /// Locks exclusively.
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            match self.0.write() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            }
        }
    }

    /// Loom-visible model of crossbeam's `ArrayQueue`: same interface, a loom mutex around the
    /// items, so loom explores every interleaving of pushes and pops.
    ///
    /// Like crossbeam's, an empty queue is seen without a write: `len`, `is_empty` and a `pop`
    /// of an empty queue read a SeqCst length word and never take the lock (crossbeam reads
    /// its head and tail with SeqCst loads). Taking the lock there would order the reader
    /// after every earlier pusher and popper — a synchronisation crossbeam does not give, which
    /// would hide a missing fence between a push and a check of another queue (the workers'
    /// idle list against the job queue, whose SeqCst fences `worker_idle_list` checks).
    #[derive(Debug)]
    pub struct ArrayQueue<T> {
        inner: loom::sync::Mutex<std::collections::VecDeque<T>>,
        /// The number of items, stored (SeqCst) under the lock after every change.
        len: AtomicUsize,
        cap: usize,
    }
    impl<T> ArrayQueue<T> {
        /// A queue holding at most `cap` items.
        pub fn new(cap: usize) -> Self {
            ArrayQueue {
                inner: loom::sync::Mutex::new(std::collections::VecDeque::new()),
                len: AtomicUsize::new(0),
                cap,
            }
        }
        fn q(&self) -> loom::sync::MutexGuard<'_, std::collections::VecDeque<T>> {
            match self.inner.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            }
        }
        /// Pushes, or gives the item back when full.
        pub fn push(&self, v: T) -> Result<(), T> {
            let mut q = self.q();
            if q.len() >= self.cap {
                return Err(v);
            }
            q.push_back(v);
            self.len.store(q.len(), Ordering::SeqCst);
            Ok(())
        }
        /// Pops the oldest item.
        pub fn pop(&self) -> Option<T> {
            if self.len.load(Ordering::SeqCst) == 0 {
                return None;
            }
            let mut q = self.q();
            let v = q.pop_front();
            self.len.store(q.len(), Ordering::SeqCst);
            v
        }
        /// Number of items.
        pub fn len(&self) -> usize {
            self.len.load(Ordering::SeqCst)
        }
        /// Whether empty.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }
        /// Capacity.
        pub fn capacity(&self) -> usize {
            self.cap
        }
    }

    /// Loom-visible model of crossbeam's `SegQueue`.
    #[derive(Debug)]
    pub struct SegQueue<T> {
        inner: ArrayQueue<T>,
    }
    impl<T> Default for SegQueue<T> {
        fn default() -> Self {
            Self::new()
        }
    }
    impl<T> SegQueue<T> {
        /// An unbounded queue.
        pub fn new() -> Self {
            SegQueue {
                inner: ArrayQueue::new(usize::MAX),
            }
        }
        /// Pushes.
        pub fn push(&self, v: T) {
            let _ = self.inner.push(v);
        }
        /// Pops the oldest item.
        pub fn pop(&self) -> Option<T> {
            self.inner.pop()
        }
        /// Number of items.
        pub fn len(&self) -> usize {
            self.inner.len()
        }
        /// Whether empty.
        pub fn is_empty(&self) -> bool {
            self.inner.is_empty()
        }
    }
}

pub use imp::*;

/// Capacity of a shard's completion queue unless configured (tiny under loom).
#[cfg(not(kvsched_loom))]
pub const DEFAULT_COMPLETION_QUEUE_CAPACITY: usize = 4096;
/// Capacity of a shard's completion queue unless configured (tiny under loom).
#[cfg(kvsched_loom)]
pub const DEFAULT_COMPLETION_QUEUE_CAPACITY: usize = 2;

mod barrier;
pub mod condvar;
#[cfg(all(feature = "internals", not(kvsched_loom)))]
pub mod fork_safe;
pub mod park;
#[cfg(kvsched_loom)]
pub mod thread;
// Public to the loom models, which drive it.
#[cfg(kvsched_loom)]
pub mod thread_group;
#[cfg(not(kvsched_loom))]
pub(crate) mod thread_group;
mod word_store;
pub use barrier::PhaseBarrier;
pub use park::{Parker, Unparker};
pub(crate) use word_store::store_words_xor;
