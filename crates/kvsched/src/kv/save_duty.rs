//! [`Duty`]: a save thread's duty cycle, the CPU share it may spend storing.

use std::time::{Duration, Instant};

use super::saver::{Queue, Shared};
use crate::sync::condvar::Guard;

/// A save thread's duty cycle: after storing for `t` it owes `t · (1/share − 1)` of rest,
/// paid in sleeps of at least 1 ms, so that a store whose writes cost CPU (a disk tier's file
/// creations are kernel work) takes at most `share` of a core per save thread and the
/// engine's threads keep theirs — the write-behind falls behind and drops (counted) instead
/// of the step waiting for a core. A share of 1 never sleeps.
pub(super) struct Duty {
    rest_per_work: f64,
    owed: Duration,
}

impl Duty {
    pub(super) fn new(share: f64) -> Duty {
        let share = if share.is_finite() {
            share.clamp(0.01, 1.0)
        } else {
            1.0
        };
        Duty {
            rest_per_work: 1.0 / share - 1.0,
            owed: Duration::ZERO,
        }
    }

    /// Counts `t` of work.
    pub(super) fn worked(&mut self, t: Duration) {
        self.owed += t.mul_f64(self.rest_per_work);
    }

    /// Rests what is owed once it reaches 1 ms (cut short when the saver stops), with the
    /// queue's lock `q` released meanwhile.
    pub(super) fn rest<'a>(
        &mut self,
        mut q: Guard<'a, Queue>,
        shared: &Shared,
    ) -> Guard<'a, Queue> {
        if self.owed < Duration::from_millis(1) {
            return q;
        }
        let until = Instant::now() + std::mem::take(&mut self.owed);
        // (Planted bug `saver-rest-on-ready`, scripts/plants.sh: rests where threads wait for
        // work, so an offer may wake this one, which rests on, instead of an idle one.)
        let cv = if planted!("saver-rest-on-ready") {
            &shared.ready
        } else {
            &shared.rest
        };
        while !q.stop && Instant::now() < until {
            q = cv.wait_until(q, Some(until)).0;
        }
        q
    }
}
