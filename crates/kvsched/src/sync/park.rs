//! Parking a thread until another wakes it, at no cost when nobody sleeps.
//!
//! One state word per parker — empty, parked or notified — in the manner of std's and tokio's
//! parkers: [`Unparker::unpark`] on a thread that is not parked is one atomic swap (no lock,
//! no system call), and leaves a notification that the next [`Parker::park`] consumes at
//! once, so a wake-up that arrives before its sleeper parks is never lost. Only an unpark
//! that finds the thread parked takes the lock and signals the condition variable.
//!
//! Under `cfg(kvsched_loom)` the lock and condition variable are loom's, and a timed park
//! waits untimed (loom has no clock): models must not rely on a timeout to make progress.

use std::time::Duration;
#[cfg(not(kvsched_loom))]
use std::time::Instant;

use super::condvar::Condvar;
use super::{Arc, AtomicUsize, Mutex, Ordering};

const EMPTY: usize = 0;
const PARKED: usize = 1;
const NOTIFIED: usize = 2;

#[derive(Debug)]
struct Slot {
    state: AtomicUsize,
    lock: Mutex<()>,
    cvar: Condvar,
}

/// The parking side, owned by the thread that sleeps.
#[derive(Debug)]
pub struct Parker {
    slot: Arc<Slot>,
}

/// The waking side: cloneable, for any thread.
#[derive(Clone, Debug)]
pub struct Unparker {
    slot: Arc<Slot>,
}

impl Default for Parker {
    fn default() -> Self {
        Self::new()
    }
}

impl Parker {
    /// A parker with no pending notification.
    pub fn new() -> Self {
        Parker {
            slot: Arc::new(Slot {
                state: AtomicUsize::new(EMPTY),
                lock: Mutex::new(()),
                cvar: Condvar::new(),
            }),
        }
    }

    /// A handle that wakes this parker.
    pub fn unparker(&self) -> Unparker {
        Unparker {
            slot: Arc::clone(&self.slot),
        }
    }

    /// Sleeps until [`Unparker::unpark`] (returns at once when a notification is pending).
    /// Everything the unparking thread did before `unpark` is visible after it returns.
    pub fn park(&self) {
        self.park_inner(None);
    }

    /// Like [`park`](Parker::park), but returns after `timeout` at the latest (a timeout too
    /// large to represent waits untimed). Under loom: untimed.
    pub fn park_timeout(&self, timeout: Duration) {
        self.park_inner(Some(timeout));
    }

    fn park_inner(&self, timeout: Option<Duration>) {
        let s = &*self.slot;
        // Acquire: pairs with the Release swap in `unpark`, consuming its notification.
        if s.state
            .compare_exchange(NOTIFIED, EMPTY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        let mut guard = s.lock.lock();
        // Relaxed on success: the lock orders the PARKED store before any unparker's lock.
        // Acquire on failure: pairs with the Release swap in `unpark` (NOTIFIED).
        if let Err(seen) =
            s.state
                .compare_exchange(EMPTY, PARKED, Ordering::Relaxed, Ordering::Acquire)
        {
            debug_assert_eq!(seen, NOTIFIED, "one parker per thread");
            // A swap, not a store: an unpark landing after the failed exchange must be
            // consumed (and acquired) here, not erased. Acquire: pairs with the Release swap
            // in `unpark`.
            s.state.swap(EMPTY, Ordering::Acquire);
            return;
        }
        #[cfg(not(kvsched_loom))]
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        #[cfg(kvsched_loom)]
        let _ = timeout;
        loop {
            #[cfg(not(kvsched_loom))]
            let timed_out = {
                let (g, timed_out) = s.cvar.wait_until(guard, deadline);
                guard = g;
                timed_out
            };
            #[cfg(kvsched_loom)]
            let timed_out = {
                guard = s.cvar.wait(guard);
                false
            };
            // Acquire: pairs with the Release swap in `unpark`.
            if s.state
                .compare_exchange(NOTIFIED, EMPTY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
            if timed_out {
                // Acquire: pairs with the Release swap of an unpark racing the timeout, whose
                // notification is consumed here rather than left for the next park.
                s.state.swap(EMPTY, Ordering::Acquire);
                return;
            }
            // A spurious wake-up: still PARKED, wait again.
        }
    }
}

impl Unparker {
    /// Wakes the parker, or makes its next park return at once. Takes the lock only when the
    /// parker is asleep.
    pub fn unpark(&self) {
        let s = &*self.slot;
        // Release: pairs with the Acquire loads in `park_inner`; publishes what this thread
        // did before waking the other.
        match s.state.swap(NOTIFIED, Ordering::Release) {
            EMPTY | NOTIFIED => return,
            _ => {}
        }
        // The sleeper holds the lock from its PARKED store until it waits, so taking the lock
        // here orders this notification after its wait began: it cannot be missed. (The
        // planted bug `unpark-no-lock` skips it; loom-tests/plants.sh shows the lost wake-up.)
        if !planted!("unpark-no-lock") {
            drop(s.lock.lock());
        }
        s.cvar.notify_one();
    }
}

// How many times this thread went to sleep waiting for an event (a tier get, a host-name
// lookup): the tests' count of wake-ups, which a wait woken by its event keeps to one or two.
#[cfg(all(test, not(kvsched_loom)))]
thread_local! {
    static WAITS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one sleep of this thread in the tests' count ([`waits`]); nothing outside tests.
#[cfg_attr(kvsched_loom, allow(dead_code))]
pub(crate) fn count_wait() {
    #[cfg(all(test, not(kvsched_loom)))]
    WAITS.with(|w| w.set(w.get() + 1));
}

/// How many sleeps this thread has counted ([`count_wait`]).
#[cfg(all(test, not(kvsched_loom)))]
pub(crate) fn waits() -> usize {
    WAITS.with(std::cell::Cell::get)
}
