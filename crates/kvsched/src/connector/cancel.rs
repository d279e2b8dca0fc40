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

use crate::sync::{Arc, AtomicU32, Ordering};

/// The token was fired: stop, the result is ignored.
const CANCELLED: u32 = 1;
/// A worker started the load (it may write its destinations until it completes).
const STARTED: u32 = 2;
/// The shard dropped the load before any worker started it: it never runs.
const DROPPED: u32 = 4;

/// A shared, one-way flag: once [`cancel`](Self::cancel)led it stays cancelled. Cloning shares
/// the flag. Checking it is one atomic load; firing it never blocks.
#[derive(Clone, Debug, Default)]
pub struct CancelToken {
    state: Arc<AtomicU32>,
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
        self.state.fetch_or(CANCELLED, Ordering::Release);
    }

    /// Whether the token was fired. A load that sees `true` should stop and report its
    /// unfinished blocks as invalid; its result is discarded by the runtime anyway.
    pub fn is_cancelled(&self) -> bool {
        // Acquire: pairs with the Release update in `cancel` / `drop_unstarted`.
        self.state.load(Ordering::Acquire) & (CANCELLED | DROPPED) != 0
    }

    /// Marks the load started, unless it was dropped first: `false` means it must not run.
    pub(crate) fn start(&self) -> bool {
        // AcqRel: pairs with the AcqRel update in `drop_unstarted`; whichever comes first in
        // the word's modification order decides, and the other sees it.
        let prev = self.state.fetch_or(STARTED, Ordering::AcqRel);
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
            let cur = self.state.load(Ordering::Acquire);
            crate::sync::spin_hint();
            self.state
                .store(cur | DROPPED | CANCELLED, Ordering::Release);
            return cur & STARTED == 0;
        }
        // Acquire: pairs with the AcqRel `fetch_or` in `start` (as the loop's failed CAS does).
        #[cfg_attr(kvsched_plant = "drop-check-then-set", allow(unreachable_code))]
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let next = if cur & STARTED == 0 {
                cur | DROPPED | CANCELLED
            } else {
                cur | CANCELLED
            };
            // AcqRel: pairs with the AcqRel `fetch_or` in `start`.
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return cur & STARTED == 0 || cur & DROPPED != 0,
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
}
