//! The [`Scheduler`] trait the simulated engine drives, and its two implementations: the
//! [`Runtime`] and the [`MutexScheduler`] baseline.

use std::sync::Arc;
use std::time::Duration;

use crate::baseline::MutexScheduler;
use kvsched::runtime::{
    Metrics, Report, Runtime, RuntimeError, StepOutput, StepPlan, SubmitRequest,
};

/// Which of the runtime's fault-handling mechanisms a scheduler has: the report shows the
/// counters of a mechanism a scheduler lacks as absent, not as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mechanisms {
    /// Asynchronous loads fail at a deadline (`deadlines_expired`, `late_completions`,
    /// `loads_expired_unrun`).
    pub load_deadlines: bool,
    /// A request's external loads stop after a retry budget (`retry_budget_skips`), and a
    /// prefix whose loads keep failing is quarantined (`quarantine_skips`,
    /// `prefixes_quarantined`).
    pub retry_budget_and_quarantine: bool,
    /// Repeated sampled / finish commands are counted (`duplicate_commands`).
    pub counts_duplicates: bool,
}

/// What the stress loop needs from a scheduler: the engine-facing API of [`Runtime`], also
/// implemented by the [`MutexScheduler`] baseline.
pub trait Scheduler {
    /// The fault-handling mechanisms it has.
    const MECHANISMS: Mechanisms;
    /// Queues a request.
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError>;
    /// Cancels a request.
    fn cancel(&self, id: &str);
    /// Runs one step (an error: the scheduler can take no more).
    fn schedule(&mut self) -> Result<StepPlan, RuntimeError>;
    /// Applies the engine's output of the last step; returns the outputs to discard (the
    /// requests whose step read a block one of its sync loads failed to fill).
    fn update(&mut self, out: StepOutput) -> Vec<Arc<str>>;
    /// Counters so far.
    fn metrics(&self) -> Metrics;
    /// invariants of docs/runtime.md ("Invariants") checkable between steps; the violations.
    fn check_invariants(&self) -> Vec<String>;
    /// Waits until a load completes or `timeout` passes.
    fn wait_for_work(&self, timeout: Duration) -> bool;
    /// Asynchronous loads dispatched whose completion has not been delivered yet.
    fn loads_in_flight(&self) -> u64;
    /// Stops, cancels everything live and reports.
    fn shutdown(self) -> Report
    where
        Self: Sized;
}

impl Scheduler for Runtime {
    const MECHANISMS: Mechanisms = Mechanisms {
        load_deadlines: true,
        retry_budget_and_quarantine: true,
        counts_duplicates: true,
    };
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        Runtime::submit(self, req)
    }
    fn cancel(&self, id: &str) {
        Runtime::cancel(self, id)
    }
    fn schedule(&mut self) -> Result<StepPlan, RuntimeError> {
        Runtime::schedule(self)
    }
    fn update(&mut self, out: StepOutput) -> Vec<Arc<str>> {
        Runtime::update(self, out)
    }
    fn metrics(&self) -> Metrics {
        Runtime::metrics(self)
    }
    fn check_invariants(&self) -> Vec<String> {
        Runtime::check_invariants(self)
    }
    fn wait_for_work(&self, timeout: Duration) -> bool {
        Runtime::wait_for_work(self, timeout)
    }
    fn loads_in_flight(&self) -> u64 {
        Runtime::loads_in_flight(self)
    }
    fn shutdown(self) -> Report {
        Runtime::shutdown(self)
    }
}

impl Scheduler for MutexScheduler {
    /// The baseline waits for every load however long it takes and offers external loads
    /// whatever failed before; it runs the runtime's shard, so it counts repeated commands.
    const MECHANISMS: Mechanisms = Mechanisms {
        load_deadlines: false,
        retry_budget_and_quarantine: false,
        counts_duplicates: true,
    };
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        MutexScheduler::submit(self, req)
    }
    fn cancel(&self, id: &str) {
        MutexScheduler::cancel(self, id)
    }
    fn schedule(&mut self) -> Result<StepPlan, RuntimeError> {
        Ok(MutexScheduler::schedule(self))
    }
    fn update(&mut self, out: StepOutput) -> Vec<Arc<str>> {
        MutexScheduler::update(self, out)
    }
    fn metrics(&self) -> Metrics {
        MutexScheduler::metrics(self)
    }
    fn check_invariants(&self) -> Vec<String> {
        MutexScheduler::check_invariants(self)
    }
    fn wait_for_work(&self, timeout: Duration) -> bool {
        MutexScheduler::wait_for_work(self, timeout)
    }
    fn loads_in_flight(&self) -> u64 {
        MutexScheduler::loads_in_flight(self)
    }
    fn shutdown(self) -> Report {
        MutexScheduler::shutdown(self)
    }
}
