//! Wake-ups for an idle engine: workers count every delivered completion, and submits and
//! cancels every queued command, and unpark the engine thread; [`Runtime::poll_work`] /
//! [`Runtime::wait_for_work`] compare that count with the one read when the last
//! [`Runtime::schedule`] began draining, end at the earliest deadline of a load in flight,
//! and return at once when the last step left the next one work no event announces.
//!
//! A delivery costs one atomic add and one swap of the engine's parker state; it takes a lock
//! only when the engine is actually asleep in `wait_for_work` (or waiting for its shards).

use std::time::{Duration, Instant};

use crate::runtime::plan::StepPlan;
use crate::runtime::stall::Progress;
use crate::runtime::step::Runtime;
use crate::sync::{AtomicU64, Ordering, Unparker};

/// Wake-ups for an idle engine: bumped on every delivered completion, submit and cancel.
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

    /// The engine thread's unparker.
    pub(super) fn engine(&self) -> &Unparker {
        &self.engine
    }

    pub(super) fn notify(&self) {
        // Release: pairs with the Acquire loads in `poll_work` / `wait_for_work`.
        self.events.fetch_add(1, Ordering::Release);
        self.engine.unpark();
    }
}

impl Runtime {
    /// Non-blocking: whether a step now has something new to do — a load completed, or a
    /// request was submitted or cancelled, since the last [`Runtime::schedule`] began
    /// draining, or the deadline of a load in flight has passed, or the last step left the
    /// next one work (see [`Runtime::wait_for_work`]).
    pub fn poll_work(&self) -> bool {
        // Acquire: pairs with the Release increment in `WorkSignal::notify`.
        self.pending_work()
            || self.signal.events.load(Ordering::Acquire) != self.events_at_schedule
            || self.next_deadline().is_some_and(|d| Instant::now() >= d)
    }

    /// Waits until a step has something new to do, or `timeout` passes; returns whether it
    /// has. Something new is a completed load, a request submitted or cancelled (from any
    /// thread) since the last [`Runtime::schedule`] began draining — so one that came
    /// between `schedule` and this call returns at once: an idle engine never sleeps past
    /// work — or the deadline of a load in flight passing (the next `schedule` fails it):
    /// the wait ends there whatever `timeout` says, so a load that never completes cannot
    /// keep an idle engine asleep past its deadline.
    ///
    /// It also returns `true` at once when the last step left the next one work that no
    /// event announces: a request that ended in that step (at its length cap, after the
    /// step's admissions), or a report it recovered (a stall it left is counted from the
    /// next step), while others wait or run, blocks freed after a shard that left
    /// requests waiting or running had taken what it could (a failed load's blocks, freed by
    /// a shard that stepped after it), blocks handed over to a waiter (taken up in the next
    /// step's report), a stall across shards the next steps resolve by preempting, or the
    /// preempted request's admission, which that step held back.
    ///
    /// A `timeout` too large to represent as an instant waits until one of those happens.
    pub fn wait_for_work(&self, timeout: Duration) -> bool {
        if self.pending_work() {
            return true;
        }
        let before = self.events_at_schedule;
        // Planted bug `wait-past-deadline` (scripts/plants.sh): the wait ignores the loads'
        // deadlines, so an idle engine sleeps past a hung load's.
        let next_deadline = self
            .next_deadline()
            .filter(|_| !planted!("wait-past-deadline"));
        let until = match (Instant::now().checked_add(timeout), next_deadline) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        };
        loop {
            // Acquire: pairs with the Release increment in `WorkSignal::notify`. Checked before
            // every park, and a notify that lands first leaves the parker notified, so no
            // wake-up is lost.
            if self.signal.events.load(Ordering::Acquire) != before {
                return true;
            }
            match until {
                None => self.engine_parker.park(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return next_deadline.is_some_and(|n| now >= n);
                    }
                    self.engine_parker.park_timeout(d - now);
                }
            }
        }
    }

    /// Whether the step that planned `plan` (its shards' `progress`; `stall_resolves`: the
    /// next steps go on resolving a stall) left the next one work that no completion, submit
    /// or cancel announces: a request ending in it (after the admissions, at its length cap,
    /// or on another shard than a request that could not grow: its blocks, its place among
    /// `max_seqs`), or a report recovered (the stall count starts over: a stall the step left
    /// is counted from the next one), while other requests wait or run; as many blocks
    /// allocatable at the step's end as an allocation of the step was refused (freed after the
    /// refusal — a failed load's, a recovery's, on a shard that stepped after it — or taken for
    /// a moment by another shard's allocation that failed too: two shards admitting at once
    /// can each take part of the pool, fail, and give it back); hand-offs for the next report;
    /// a stall the next steps resolve by preempting; admission a preemption held back. The
    /// pool is read after every shard's step: nothing frees blocks between steps. A refusal
    /// records what the allocation needed, so a pool still short of it at the step's end
    /// (nothing freed) announces nothing: no step is taken for nothing.
    pub(super) fn work_left(
        &self,
        plan: &StepPlan,
        progress: &Progress,
        stall_resolves: bool,
    ) -> bool {
        let others_live = progress.waiting > 0 || progress.latest.is_some();
        // Planted bug `freed-blocks-unannounced` (scripts/plants.sh): blocks a refused
        // allocation wanted, there at the step's end, wait for an event.
        let freed_since = progress
            .blocks_wanted
            .is_some_and(|n| self.inner.pool.allocatable() >= n)
            && !planted!("freed-blocks-unannounced");
        // Planted bug `recovered-stall-unannounced` (scripts/plants.sh): a stall left by a
        // step that recovered waits for an event before it is counted.
        let recovered =
            !plan.recovery.report.is_empty() && !planted!("recovered-stall-unannounced");
        stall_resolves
            || progress.admission_held
            || freed_since
            || !self.handoffs.is_empty()
            || (others_live && (!plan.ended.is_empty() || recovered))
    }

    /// Whether the last step left the next one work that no event announces.
    fn pending_work(&self) -> bool {
        // Planted bug `wait-ignores-pending-work` (scripts/plants.sh): only events wake the
        // engine, so blocks freed inside a step, or a stall to resolve, wait for one.
        self.work_pending && !planted!("wait-ignores-pending-work")
    }

    /// The earliest deadline of an async load in flight, over the shards. Between steps no
    /// shard thread holds a shard's state (the engine thread starts every step and waits for
    /// it), so the locks are free; a wait pays them, a step never does.
    fn next_deadline(&self) -> Option<Instant> {
        self.inner
            .shards
            .iter()
            .filter_map(|slot| slot.state.lock().next_deadline())
            .min()
    }
}
