//! Shutdown: stop the workers, apply what landed, cancel everyone, release every block,
//! report ([`Runtime::shutdown`]); dropping a runtime only stops its shard threads.

#[cfg(doc)]
use crate::runtime::builder::Builder;
use crate::runtime::claim::RequestKey;
use crate::runtime::report::Report;
use crate::runtime::shard::EndState;
use crate::runtime::step::Runtime;
use crate::runtime::worker::Completion;
use crate::sync::Ordering;

impl Runtime {
    /// Stops the workers, waiting at most [`Builder::shutdown_timeout`] for the loads in
    /// flight (those that finish are applied), cancels every live request and queued load,
    /// releases every block and reports. Loads still running at the timeout are abandoned:
    /// their requests are cancelled, but their blocks stay held (a detached worker may still
    /// write them) and are counted in [`Report::loads_abandoned`] / [`Report::blocks_abandoned`],
    /// their ids listed in [`Report::abandoned_block_ids`].
    ///
    /// "Held" is held in this runtime's pool, which ends here. A detached worker may still
    /// write those blocks' bytes in the engine's KV memory until its connector call returns
    /// (a hung store: possibly never). With loads abandoned, do not hand the same KV memory
    /// to a new runtime: its pool would give out the same block ids, and the old write could
    /// land in them. Give the new runtime fresh KV memory, at least for the ids in
    /// [`Report::abandoned_block_ids`], or wait until the connector's calls have returned.
    /// Dropping a runtime without `shutdown` is the same, without a report: its workers are
    /// waited for one second, then detached.
    pub fn shutdown(mut self) -> Report {
        // Closed under the write lock: a submit holding the read lock has pushed its
        // command before this returns, so the last step below sees it.
        *self.inner.open.write() = false;
        let mut loads_cancelled = 0;
        let mut workers_finished = true;
        let mut never_started = rustc_hash::FxHashSet::default();
        let mut parked: Vec<std::collections::VecDeque<Completion>> = Vec::new();
        // Loads in flight are told to stop: cooperative connectors return early, so the wait
        // below is short.
        for s in &self.inner.shards {
            s.state.lock().cancel_loads();
        }
        if let Some(w) = self.workers.take() {
            self.expired_unrun_at_shutdown = w.counts().expired_unrun.load(Ordering::Relaxed);
            let inner = &self.inner;
            parked.resize_with(inner.shards.len(), Default::default);
            let (left, finished) = w.shutdown(
                || {
                    for (i, s) in inner.shards.iter().enumerate() {
                        while let Some(c) = s.completions.pop() {
                            parked[i].push_back(c);
                        }
                    }
                },
                self.shutdown_timeout,
            );
            workers_finished = finished;
            // A queued load whose deadline has passed is the last step's expired load
            // (`deadlines_expired`), not a load shutdown cancelled.
            let now = std::time::Instant::now();
            loads_cancelled = left
                .iter()
                .filter(|j| j.deadline.is_none_or(|d| d > now))
                .count() as u64;
            never_started = left
                .iter()
                .map(|j| (RequestKey::from_raw(j.owner.key).seq(), j.attempt))
                .collect();
        }
        // Last steps apply the completions that landed (as a step would) and the pending
        // commands, admitting and scheduling nothing; then everyone is cancelled. The
        // completions drained while the workers stopped go back into their queues as many at
        // a time as fit, a step for each fill, so none is lost to a small queue.
        self.inner.draining.store(true, Ordering::Relaxed);
        let mut ended_at_shutdown: Vec<(String, EndState)> = Vec::new();
        let mut step_failed = false;
        loop {
            let mut refilled = false;
            for (i, cs) in parked.iter_mut().enumerate() {
                while let Some(c) = cs.pop_front() {
                    match self.inner.shards[i].completions.push(c) {
                        Ok(()) => refilled = true,
                        Err(c) => {
                            cs.push_front(c);
                            break;
                        }
                    }
                }
            }
            match self.schedule() {
                Ok(plan) => ended_at_shutdown.extend(
                    plan.ended
                        .into_iter()
                        .map(|(id, state)| (id.to_string(), state)),
                ),
                Err(_) => {
                    step_failed = true;
                    break;
                }
            }
            // Planted bug `shutdown-refill-once` (scripts/plants.sh): the queues are refilled
            // once, and what did not fit is counted stale.
            if parked.iter().all(|cs| cs.is_empty()) || planted!("shutdown-refill-once") {
                break;
            }
            if !refilled {
                // A queue that takes nothing (never, for a queue a step just emptied).
                break;
            }
        }
        // Only if a step failed (a poisoned runtime: what went back into the queues is
        // applied by no step either) or a queue took nothing.
        if step_failed {
            for s in &self.inner.shards {
                while s.completions.pop().is_some() {
                    self.metrics.stale_completions += 1;
                }
            }
        }
        for cs in parked {
            self.metrics.stale_completions += cs.len() as u64;
        }
        let mut cancelled_ids = Vec::new();
        let mut abandoned_ids = Vec::new();
        let mut violations = Vec::new();
        if let Some(e) = self.poisoned() {
            violations.push(e.to_string());
        }
        for (i, s) in self.inner.shards.iter().enumerate() {
            let env = self.inner.env(i);
            // A poisoned shard's state may be half-updated: a second panic is reported, not
            // propagated.
            let res = match crate::panics::caught(|| {
                s.state
                    .lock()
                    .cancel_all(&env, workers_finished, &never_started)
            }) {
                Ok(res) => res,
                Err(message) => {
                    violations.push(format!("shard {i} panicked at shutdown: {message}"));
                    continue;
                }
            };
            self.metrics += &res.counters;
            abandoned_ids.extend(s.state.lock().abandoned_ids());
            for (id, _) in &res.ended {
                cancelled_ids.push(id.to_string());
                self.metrics.cancelled += 1;
            }
            s.ids.lock().clear();
        }
        self.stop_shards();
        violations.extend(self.invariant_violations());
        let census = self.inner.pool.census();
        abandoned_ids.sort_unstable();
        abandoned_ids.dedup();
        let load_estimate = self.load_estimate();
        Report {
            loads_abandoned: self.metrics.loads_abandoned,
            blocks_abandoned: census.referenced as u64,
            abandoned_block_ids: abandoned_ids,
            metrics: self.metrics(),
            loads_cancelled,
            census,
            cancelled_at_shutdown: cancelled_ids,
            ended_at_shutdown,
            violations,
            load_estimate,
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // No step runs again: handles must not queue what none will take (`Handle`).
        *self.inner.open.write() = false;
        self.stop_shards();
    }
}
