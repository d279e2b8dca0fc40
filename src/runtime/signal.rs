//! Wake-ups for an idle engine: workers count every delivered completion, and
//! [`Runtime::poll_work`] / [`Runtime::wait_for_work`] compare that count with the one read
//! when the last [`Runtime::schedule`] began draining.

use std::time::{Duration, Instant};

use crate::runtime::engine::Runtime;
use crate::sync::{AtomicU64, Condvar, Mutex, Ordering};

/// Wake-ups for an idle engine: bumped on every delivered completion.
#[derive(Debug, Default)]
pub(super) struct WorkSignal {
    pub(super) events: AtomicU64,
    pub(super) lock: Mutex<()>,
    pub(super) cv: Condvar,
}

impl WorkSignal {
    pub(super) fn notify(&self) {
        // Release: pairs with the Acquire loads in `wait_for_work`.
        self.events.fetch_add(1, Ordering::Release);
        let _g = self.lock.lock();
        self.cv.notify_all();
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
    pub fn wait_for_work(&self, timeout: Duration) -> bool {
        let s = &self.signal;
        let before = self.events_at_schedule;
        let deadline = Instant::now() + timeout;
        let mut g = s.lock.lock();
        loop {
            // Acquire: as above. Checked under the lock `notify` takes, so no wake-up is lost.
            if s.events.load(Ordering::Acquire) != before {
                return true;
            }
            if s.cv.wait_until(&mut g, deadline).timed_out() {
                return s.events.load(Ordering::Acquire) != before;
            }
        }
    }
}
