//! A simulated engine, for tests and tools: what a serving engine does with a
//! [`StepPlan`](kvsched::StepPlan) — run the plan's synchronous loads, compute the scheduled
//! tokens, sample, finish — without a model, answering each plan with the
//! [`StepOutput`](kvsched::StepOutput) a real engine would send. The stress tool
//! (`kvsched stress`), the mutex baseline's tests and the runtime's integration tests all
//! drive their schedulers with this one loop.
//!
//! * `engine` — [`SimEngine`], the loop's decisions (samples, finishes, sync loads);
//! * `kv_check` — [`KvChecker`], the verifying memory model: runs a step's reads and writes
//!   on real KV bytes and counts every byte read that differs from its reference;
//! * `kv_seen` — what each request already checked, at which write epoch of each block, so
//!   bytes no write touched since are not read again.
//!
//! * `model` — [`TinyModel`] and [`ModelEngine`]: a tiny hand-written hybrid model run on
//!   the plan, whose every kept sample is judged against the request decoded alone.
//!
//! Not meant for production.

mod engine;
mod kv_check;
mod kv_seen;
mod model;

pub use engine::{SimCounts, SimEngine};
pub use kv_check::{KvCheckCounts, KvChecker, StepCheck};
pub use model::{ModelCounts, ModelEngine, ModelShape, ModelStep, TinyModel, WrongTokenCauses};
