//! The only module that names atomics, locks, threads and queues.
//!
//! Everything concurrent in kvsched imports from here. Normally these are `std` atomics,
//! `parking_lot` locks, `std::thread` and crossbeam queues; under `--cfg kvsched_loom` they are
//! loom's, crossbeam's queues are replaced by a loom-visible model with the same interface,
//! and default capacities shrink so models stay small.

#[cfg(not(kvsched_loom))]
mod imp {
    pub use parking_lot::{Condvar, Mutex, MutexGuard};
    pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use std::sync::Arc;
    pub use std::thread;

    pub use crossbeam_utils::sync::{Parker, Unparker};
    pub use crossbeam_utils::Backoff;

    /// Spin-loop hint.
    #[inline]
    pub fn spin_hint() {
        std::hint::spin_loop();
    }

    /// A bounded MPMC queue (crossbeam's `ArrayQueue`).
    pub use crossbeam_queue::ArrayQueue;
    /// An unbounded MPMC queue (crossbeam's `SegQueue`).
    pub use crossbeam_queue::SegQueue;
}

#[cfg(kvsched_loom)]
mod imp {
    pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use loom::sync::Arc;
    pub use loom::thread;

    /// Under loom a spin must yield so the model can schedule the thread being waited for.
    #[inline]
    pub fn spin_hint() {
        loom::thread::yield_now();
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

    /// Loom-visible model of crossbeam's `ArrayQueue`: same interface, a loom mutex inside,
    /// so loom explores every interleaving of pushes and pops.
    #[derive(Debug)]
    pub struct ArrayQueue<T> {
        inner: loom::sync::Mutex<std::collections::VecDeque<T>>,
        cap: usize,
    }
    impl<T> ArrayQueue<T> {
        /// A queue holding at most `cap` items.
        pub fn new(cap: usize) -> Self {
            ArrayQueue {
                inner: loom::sync::Mutex::new(std::collections::VecDeque::new()),
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
            Ok(())
        }
        /// Pops the oldest item.
        pub fn pop(&self) -> Option<T> {
            self.q().pop_front()
        }
        /// Number of items.
        pub fn len(&self) -> usize {
            self.q().len()
        }
        /// Whether empty.
        pub fn is_empty(&self) -> bool {
            self.q().is_empty()
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

/// Ordering of a waiter's departure load in [`PhaseBarrier::wait`]: Acquire. The planted bug
/// `barrier-relaxed` (loom demonstration, `loom-tests/plants.sh`) weakens it to Relaxed.
#[cfg(not(kvsched_plant = "barrier-relaxed"))]
const BARRIER_DEPART: Ordering = Ordering::Acquire;
#[cfg(kvsched_plant = "barrier-relaxed")]
const BARRIER_DEPART: Ordering = Ordering::Relaxed;

/// A reusable barrier for the `n` participants of a step's phases: each `wait` returns once all
/// `n` have arrived. Waiters spin briefly, then yield (under loom: yield at once).
///
/// Memory: everything a participant did before `wait` happens-before everything every
/// participant does after it (Release on arrival, Acquire on departure).
#[derive(Debug)]
pub struct PhaseBarrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
}

impl PhaseBarrier {
    /// A barrier for `n` participants (`n ≤ 1`: `wait` returns at once).
    pub fn new(n: usize) -> Self {
        PhaseBarrier {
            n,
            count: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    /// Arrives and waits for the others.
    pub fn wait(&self) {
        if self.n <= 1 {
            return;
        }
        // Acquire: pairs with the Release increment below, so a thread reads the generation
        // of the round it joins.
        let gen = self.generation.load(Ordering::Acquire);
        // AcqRel: the Release half publishes this thread's phase work to the last arriver;
        // the Acquire half lets the last arriver see everyone's.
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Relaxed);
            // Release: pairs with the Acquire loads of the waiters below; carries every
            // arriver's work (acquired by the fetch_add above) to them.
            self.generation.fetch_add(1, Ordering::Release);
        } else {
            let mut spins = 0u32;
            // Acquire: pairs with the Release increment by the last arriver.
            while self.generation.load(BARRIER_DEPART) == gen {
                if spins < 64 {
                    spins += 1;
                    spin_hint();
                } else {
                    thread::yield_now();
                }
            }
        }
    }
}
