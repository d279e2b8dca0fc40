//! The [`Scheduler`] trait the simulated engine drives, and its two implementations: the
//! [`Runtime`] and the [`MutexScheduler`] baseline.

use std::time::Duration;

use crate::runtime::{Metrics, Report, Runtime, RuntimeError, StepOutput, StepPlan, SubmitRequest};
use crate::tools::baseline::MutexScheduler;

/// What the stress loop needs from a scheduler: the engine-facing API of [`Runtime`], also
/// implemented by the [`MutexScheduler`] baseline.
pub trait Scheduler {
    /// Queues a request.
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError>;
    /// Cancels a request.
    fn cancel(&self, id: &str);
    /// Runs one step (an error: the scheduler can take no more).
    fn schedule(&mut self) -> Result<StepPlan, RuntimeError>;
    /// Applies the engine's output of the last step.
    fn update(&mut self, out: StepOutput);
    /// Counters so far.
    fn metrics(&self) -> Metrics;
    /// SPEC §7 invariants checkable between steps; the violations.
    fn check_invariants(&self) -> Vec<String>;
    /// Waits until a load completes or `timeout` passes.
    fn wait_for_work(&self, timeout: Duration) -> bool;
    /// Stops, cancels everything live and reports.
    fn shutdown(self) -> Report
    where
        Self: Sized;
}

impl Scheduler for Runtime {
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        Runtime::submit(self, req)
    }
    fn cancel(&self, id: &str) {
        Runtime::cancel(self, id)
    }
    fn schedule(&mut self) -> Result<StepPlan, RuntimeError> {
        Runtime::schedule(self)
    }
    fn update(&mut self, out: StepOutput) {
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
    fn shutdown(self) -> Report {
        Runtime::shutdown(self)
    }
}

impl Scheduler for MutexScheduler {
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        MutexScheduler::submit(self, req)
    }
    fn cancel(&self, id: &str) {
        MutexScheduler::cancel(self, id)
    }
    fn schedule(&mut self) -> Result<StepPlan, RuntimeError> {
        Ok(MutexScheduler::schedule(self))
    }
    fn update(&mut self, out: StepOutput) {
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
    fn shutdown(self) -> Report {
        MutexScheduler::shutdown(self)
    }
}
