//! The cancellation token a load carries: the runtime fires it when the load's deadline passes
//! or its request ends, and a cooperative connector or tier checks it between batches to stop
//! early.
//!
//! The token also settles, once and atomically, whether a load ever starts: the worker that
//! takes a job [starts](CancelToken::start) it before running it, and the shard that stops
//! waiting for a job [drops](CancelToken::drop_unstarted) it if no worker has. Exactly one of
//! the two wins, so a load the shard dropped is known never to write its destinations, and
//! their blocks can be freed at once instead of being held for a completion that may never
//! come.
//!
//! A thread that sleeps until the token fires (a caller waiting for a tier get) is
//! woken by the firing itself: it never polls the token.

use crate::sync::park::Unparker;
use crate::sync::{Arc, AtomicU32, Mutex, Ordering};

/// The token was fired: stop, the result is ignored.
const CANCELLED: u32 = 1;
/// A worker started the load (it may write its destinations until it completes).
const STARTED: u32 = 2;
/// The shard dropped the load before any worker started it: it never runs.
const DROPPED: u32 = 4;
/// A thread [watches](CancelToken::watch) the token (or did): the firing takes the watchers'
/// lock to wake them. Never cleared; a token nobody watched fires with one atomic update.
const WATCHED: u32 = 8;

/// A shared, one-way flag: once [`cancel`](Self::cancel)led it stays cancelled. Cloning shares
/// the flag. Checking it is one atomic load; firing it is one atomic update, plus a short lock
/// and an unpark per watcher when a thread inside the library (a caller waiting for a tier
/// get) watches it; it never waits for anything else.
#[derive(Clone, Debug, Default)]
pub struct CancelToken {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    state: AtomicU32,
    watchers: Mutex<Watchers>,
}

/// The threads to wake when the token fires, each with its registration's number.
#[derive(Debug, Default)]
struct Watchers {
    next: u64,
    list: Vec<(u64, Unparker)>,
}

/// A thread's registration with [`CancelToken::watch`]: its unparker is woken when the token
/// fires, until this is dropped.
#[derive(Debug)]
pub(crate) struct Watch<'a> {
    token: &'a CancelToken,
    id: u64,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.token
            .inner
            .watchers
            .lock()
            .list
            .retain(|(id, _)| *id != self.id);
    }
}

impl CancelToken {
    /// A token not yet cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the token. Idempotent.
    pub fn cancel(&self) {
        // Release: pairs with the Acquire load in `is_cancelled`, so a tier that sees the
        // token fired also sees what the runtime did before firing it.
        let prev = self.inner.state.fetch_or(CANCELLED, Ordering::Release);
        self.wake_watchers(prev);
    }

    /// Wakes the threads watching the token, when `prev` (the word before this firing) says
    /// some watch and no earlier firing woke them. A watcher registered after the firing's
    /// update sees the token fired before it sleeps; one registered before it is listed when
    /// the firing takes the lock (it listed itself under the lock before setting `WATCHED`).
    fn wake_watchers(&self, prev: u32) {
        if prev & WATCHED == 0 || prev & (CANCELLED | DROPPED) != 0 {
            return;
        }
        // Planted bug `cancel-wakes-nobody` (scripts/plants.sh): the firing wakes no
        // watcher, so a caller waiting for a tier get sleeps until its deadline.
        if planted!("cancel-wakes-nobody") {
            return;
        }
        for (_, u) in &self.inner.watchers.lock().list {
            u.unpark();
        }
    }

    /// Has `unparker` woken when the token fires, until the returned registration is dropped.
    /// The watcher checks [`is_cancelled`](Self::is_cancelled) after this and before each
    /// park: a firing before the registration is seen there, one after it unparks.
    pub(crate) fn watch(&self, unparker: Unparker) -> Watch<'_> {
        let mut w = self.inner.watchers.lock();
        let id = w.next;
        w.next = w.next.wrapping_add(1);
        w.list.push((id, unparker));
        // Relaxed: the watchers' lock, held here, orders the listing before any firing that
        // reads `WATCHED` from this update (that firing locks after us); one that came first
        // in the word's order is seen by the watcher's own Acquire check of the token.
        self.inner.state.fetch_or(WATCHED, Ordering::Relaxed);
        drop(w);
        Watch { token: self, id }
    }

    /// Runs `f` with `unparker` [watching](Self::watch) the token (loom models: the
    /// registration is crate-private).
    #[cfg(kvsched_loom)]
    pub fn model_watch_while(&self, unparker: Unparker, f: impl FnOnce()) {
        let _watch = self.watch(unparker);
        f();
    }

    /// Whether the token was fired. A load that sees `true` should stop and report its
    /// unfinished blocks as invalid; its result is discarded by the runtime anyway.
    pub fn is_cancelled(&self) -> bool {
        // Acquire: pairs with the Release update in `cancel` / `drop_unstarted`.
        self.inner.state.load(Ordering::Acquire) & (CANCELLED | DROPPED) != 0
    }

    /// Marks the load started, unless it was dropped first: `false` means it must not run.
    pub(crate) fn start(&self) -> bool {
        // AcqRel: pairs with the AcqRel update in `drop_unstarted`; whichever comes first in
        // the word's modification order decides, and the other sees it.
        let prev = self.inner.state.fetch_or(STARTED, Ordering::AcqRel);
        prev & DROPPED == 0
    }

    /// Fires the token and, if no worker has started the load, drops it for good: `true`
    /// means the load never runs (its destinations are not written by it).
    #[cfg_attr(kvsched_loom, allow(dead_code))] // the shards, compiled out of loom builds
    pub(crate) fn drop_unstarted(&self) -> bool {
        // Planted bug `park-unstarted` (scripts/plants.sh): a load is never known unstarted, so
        // one queued behind hung workers is parked as if it might still write.
        if planted!("park-unstarted") {
            self.cancel();
            return false;
        }
        // Planted bug `drop-check-then-set` (loom-tests/plants.sh): check the started bit, then
        // set the dropped bit with a separate store, so a start between the two is missed.
        #[cfg(kvsched_plant = "drop-check-then-set")]
        {
            let cur = self.inner.state.load(Ordering::Acquire);
            crate::sync::spin_hint();
            self.inner
                .state
                .store(cur | DROPPED | CANCELLED, Ordering::Release);
            self.wake_watchers(cur);
            return cur & STARTED == 0;
        }
        // Acquire: pairs with the AcqRel `fetch_or` in `start` (as the loop's failed CAS does).
        #[cfg_attr(kvsched_plant = "drop-check-then-set", allow(unreachable_code))]
        let mut cur = self.inner.state.load(Ordering::Acquire);
        loop {
            let next = if cur & STARTED == 0 {
                cur | DROPPED | CANCELLED
            } else {
                cur | CANCELLED
            };
            // AcqRel: pairs with the AcqRel `fetch_or` in `start`.
            match self.inner.state.compare_exchange_weak(
                cur,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.wake_watchers(cur);
                    return cur & STARTED == 0 || cur & DROPPED != 0;
                }
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_of_start_and_drop_wins() {
        let t = CancelToken::new();
        assert!(t.start());
        assert!(!t.drop_unstarted(), "a started load is not dropped");
        assert!(t.is_cancelled());
        let t = CancelToken::new();
        assert!(t.drop_unstarted());
        assert!(!t.start(), "a dropped load never starts");
        assert!(t.drop_unstarted(), "dropping again still says it never ran");
    }

    /// A firing unparks the threads watching the token (the unpark is kept until the park,
    /// so parking after the firing returns at once), whichever way it fires; a registration
    /// dropped is woken no more.
    #[test]
    fn a_firing_wakes_its_watchers() {
        use crate::sync::park::Parker;
        use std::time::{Duration, Instant};
        let long = Duration::from_secs(10);
        for fire in [CancelToken::cancel, |t: &CancelToken| {
            t.drop_unstarted();
        }] {
            let t = CancelToken::new();
            let p = Parker::new();
            let w = t.watch(p.unparker());
            fire(&t);
            let at = Instant::now();
            p.park_timeout(long);
            assert!(
                at.elapsed() < Duration::from_secs(2),
                "the firing woke nobody"
            );
            drop(w);
        }
        let t = CancelToken::new();
        let (gone, kept) = (Parker::new(), Parker::new());
        drop(t.watch(gone.unparker()));
        let _w = t.watch(kept.unparker());
        assert_eq!(
            t.inner.watchers.lock().list.len(),
            1,
            "a dropped watch stays listed"
        );
        t.cancel();
        kept.park();
    }
}
