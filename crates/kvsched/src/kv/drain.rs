//! [`Drain`]: what a flush of a work queue served by background threads waits for —
//! nothing queued and no batch held by a thread — and the wake-ups that end that wait. The
//! write-behind's queue ([`Saver`](super::saver)) and the probe queue
//! ([`Prober`](super::prober)) keep this state ([`Backlog`]) under their own lock, beside
//! their other fields, and every change that can leave it drained goes through here, under
//! that lock: a flush checks and parks under it, so a wake-up cannot fall between the two.

use std::time::Instant;

use crate::sync::condvar::{Condvar, Guard};

/// Batches threads have taken off a queue and not yet ended (under the queue's lock).
#[derive(Debug, Default)]
pub struct Held(usize);

impl Held {
    /// Whether a thread holds a batch.
    pub fn any(&self) -> bool {
        self.0 > 0
    }
}

/// A queue's state, under its lock: what [`Drain`] reads and counts.
pub trait Backlog {
    /// Whether nothing is queued (every piece of work was taken by a thread, or dropped).
    fn nothing_queued(&self) -> bool;
    /// The batches held.
    fn held(&mut self) -> &mut Held;
}

/// Where flushes wait for a [`Backlog`] to drain: parked, until the change that drains it
/// wakes them.
#[derive(Debug, Default)]
pub struct Drain {
    drained: Condvar,
}

impl Drain {
    /// No flush waiting.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `q` is drained: nothing queued, no batch held.
    fn drained<T: Backlog>(q: &mut T) -> bool {
        // (Planted bug `saver-flush-early`, scripts/plants.sh: a batch a thread has taken but
        // not ended yet is not waited for.)
        let idle = planted!("saver-flush-early") || !q.held().any();
        q.nothing_queued() && idle
    }

    /// A thread took a batch off the queue (under the lock it took it under).
    pub fn take<T: Backlog>(&self, q: &mut T) {
        let h = q.held();
        h.0 = h.0.saturating_add(1);
    }

    /// A thread ended the batch it took (its work done): wakes every flush if that drained
    /// the queue.
    pub fn end<T: Backlog>(&self, q: &mut T) {
        let h = q.held();
        debug_assert!(h.any(), "a batch ended that was not taken");
        h.0 = h.0.saturating_sub(1);
        // (Planted bugs `saver-flush-unwoken` and `probe-flush-unwoken`, scripts/plants.sh:
        // the end of the last batch does not wake a flush, which waits out its deadline. The
        // write-behind and the prober share this code, so either plant breaks both; each has
        // its own row for its own queue's test.)
        if Self::drained(q) && !planted!("saver-flush-unwoken", "probe-flush-unwoken") {
            self.drained.notify_all();
        }
    }

    /// Queued work was dropped (or the queue stopped): wakes every flush if no thread holds
    /// a batch (else the thread ending the last one does).
    pub fn dropped<T: Backlog>(&self, q: &mut T) {
        // (Planted bug `drop-queued-unwoken`, scripts/plants.sh: a flush waiting for the
        // dropped work is not woken, and waits out its deadline.)
        if Self::drained(q) && !planted!("drop-queued-unwoken") {
            self.drained.notify_all();
        }
    }

    /// Waits, parked, with `q` the queue's lock, until it is drained or `deadline` passed
    /// (`None`: for good; under loom, which has no clock, always for good); whether it was
    /// drained.
    pub fn flush_until<T: Backlog>(&self, mut q: Guard<'_, T>, deadline: Option<Instant>) -> bool {
        loop {
            if Self::drained(&mut *q) {
                return true;
            }
            // Parked until a batch's end or a drop drains the queue: each notifies under the
            // lock held here, so the wake-up cannot fall between the check and the wait.
            let (g, timed_out) = self.drained.wait_until(q, deadline);
            q = g;
            if timed_out {
                return Self::drained(&mut *q);
            }
        }
    }
}
