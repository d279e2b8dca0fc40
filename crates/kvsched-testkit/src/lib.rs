//! # kvsched-testkit
//!
//! What kvsched's tests, tools and benchmarks drive the library with, kept out of the library
//! an engine embeds:
//!
//! * [`SimEngine`] — a simulated serving engine: answers each [`StepPlan`](kvsched::StepPlan)
//!   with the [`StepOutput`](kvsched::StepOutput) a real engine would send, without a model;
//!   [`KvChecker`] — the verifying memory model that runs a step's reads and writes on real
//!   KV bytes and counts every byte read that differs from its reference; [`ModelEngine`] —
//!   a tiny hand-written hybrid model ([`TinyModel`]) run on the plan, every kept sample
//!   judged against the request decoded alone;
//! * [`SimConnector`] — a seeded, in-memory [`KvConnector`](kvsched::KvConnector) with
//!   configurable latency, failures, panics and hangs; [`SimTier`] — a memory tier behind the
//!   same kinds of seeded faults;
//! * [`FaultyTier`] — seeded damage at rest to what a library tier stores ([`FaultTarget`]:
//!   implemented here for [`MemoryTier`](kvsched::kv::MemoryTier),
//!   [`DiskTier`](kvsched::kv::DiskTier) and, with feature `redis`, `RedisTier`, over each
//!   tier's public `edit_stored` / `remove`);
//! * [`SplitMix64`], [`hash_str`] — the seeded randomness every simulated decision draws from;
//! * `redis` (feature `redis`) — `LocalRedis` and `LocalCluster`, local `redis-server`
//!   processes for tests and benchmarks.
//!
//! Not meant for production: it computes nothing.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod faults;
pub mod process;
#[cfg(feature = "redis")]
pub mod redis;
mod rng;
mod sim;
mod sim_connector;
mod sim_tier;

pub use faults::{FaultConfig, FaultConfigError, FaultCounts, FaultTarget, FaultyTier};
pub use rng::{hash_str, SplitMix64};
pub use sim::{
    KvCheckCounts, KvChecker, ModelCounts, ModelEngine, ModelShape, ModelStep, SimCounts,
    SimEngine, StepCheck, TinyModel, WrongTokenCauses,
};
pub use sim_connector::{SimConfig, SimConnector, SimulatedPanic};
pub use sim_tier::{SimTier, SimTierConfig, SimTierCounts};
