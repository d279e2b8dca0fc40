//! Wake-ups for an idle engine: workers count every delivered completion and unpark the
//! engine thread; [`Runtime::poll_work`] / [`Runtime::wait_for_work`] compare that count
//! with the one read when the last [`Runtime::schedule`] began draining.
//!
//! A delivery costs one atomic add and one swap of the engine's parker state; it takes a lock
//! only when the engine is actually asleep in `wait_for_work` (or waiting for its shards).

use std::time::{Duration, Instant};

use crate::runtime::step::Runtime;
use crate::sync::{AtomicU64, Ordering, Unparker};

/// Wake-ups for an idle engine: bumped on every delivered completion.
#[derive(Debug)]
pub(super) struct WorkSignal {
    pub(super) events: AtomicU64,
    /// Wakes the engine thread's parker (the one `Runtime` owns).
    engine: Unparker,
}

impl WorkSignal {
    /// A signal that wakes the engine thread through `engine`.
    pub(super) fn new(engine: Unparker) -> Self {
        WorkSignal {
            events: AtomicU64::new(0),
            engine,
        }
    }

    pub(super) fn notify(&self) {
        // Release: pairs with the Acquire loads in `poll_work` / `wait_for_work`.
        self.events.fetch_add(1, Ordering::Release);
        self.engine.unpark();
    }
}

impl Runtime {
    /// Non-blocking: whether a load completed since the last [`Runtime::schedule`] began
    /// draining (so a `schedule` now has something new to apply).
    pub fn poll_work(&self) -> bool {
        // Acquire: pairs with the Release increment in `WorkSignal::notify`.
        self.signal.events.load(Ordering::Acquire) != self.events_at_schedule
    }

    /// Waits until a load completes or `timeout` passes; returns whether a completion arrived
    /// since the last [`Runtime::schedule`] began draining (so a completion that landed between
    /// `schedule` and this call returns at once: an idle engine never sleeps past work).
    ///
    /// A `timeout` too large to represent as an instant waits until a completion arrives.
    pub fn wait_for_work(&self, timeout: Duration) -> bool {
        let before = self.events_at_schedule;
        let deadline = Instant::now().checked_add(timeout);
        loop {
            // Acquire: pairs with the Release increment in `WorkSignal::notify`. Checked before
            // every park, and a notify that lands first leaves the parker notified, so no
            // wake-up is lost.
            if self.signal.events.load(Ordering::Acquire) != before {
                return true;
            }
            match deadline {
                None => self.engine_parker.park(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    self.engine_parker.park_timeout(d - now);
                }
            }
        }
    }
}
