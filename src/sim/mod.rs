//! A simulated engine, for tests and tools: what a serving engine does with a
//! [`StepPlan`](crate::StepPlan) — run the plan's synchronous loads, compute the scheduled
//! tokens, sample, finish — without a model, answering each plan with the
//! [`StepOutput`](crate::StepOutput) a real engine would send. The stress tool
//! (`kvsched stress`), the mutex baseline's tests and the runtime's integration tests all
//! drive their schedulers with this one loop.
//!
//! Not meant for production: it computes nothing. See [`SimEngine`].

mod engine;

pub use engine::{SimCounts, SimEngine};
