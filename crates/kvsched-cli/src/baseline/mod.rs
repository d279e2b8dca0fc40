//! The mutex baseline of `kvsched stress --baseline mutex`: the same engine-facing API as
//! [`Runtime`](kvsched::runtime::Runtime), built the straightforward way, so one process can
//! compare the two on the same seeded workload.
//!
//! **The same algorithm.** The decisions are the shards' own: the baseline calls the pure
//! functions of `runtime::policy` (local prefix search, how far an admission's load reaches,
//! growth, the step budget, length cap and preemption victim, which blocks a failure may roll
//! back) and takes its inputs in a shard's order — commands, then completions, then recovery,
//! outputs, landed loads, admission, scheduling; loads landed and outputs applied in admission
//! order; the pool's second-chance reclaim. So the two differ only in how they synchronise:
//! on the same input, one shard and the baseline make the same decisions at every step
//! (`tools/tests/same_decisions.rs`). The mechanisms it lacks are load deadlines, the retry
//! budget and quarantine, catching a panicking `lookup`, lost-output detection and counting
//! duplicate commands.
//!
//! * **One global lock.** Every piece of scheduler state — requests, the block allocator (a
//!   `Vec` free list with plain reference counts), the prefix cache (a `HashMap`) and the
//!   pending-recompute marks — lives behind one [`kvsched::sync::Mutex`]. A step runs on the
//!   calling thread only.
//! * **Channel completions.** Worker threads take jobs from an `mpsc` channel (its receiver
//!   shared behind a mutex) and send completions back on another `mpsc` channel, drained at the
//!   start of every step.
//! * **Sequential recovery.** When a step's report is not empty, every loading and running
//!   request is scanned, those with hits are gathered in canonical order and handed to
//!   [`recovery::recover`] — the same rules as the runtime, ownership from marked sets.
//!
//! # Guarantees
//!
//! The same lifecycle rules as the runtime: every submitted request ends in exactly one of
//! finished, failed, cancelled; every completion is applied once or counted stale; sharers
//! (mode `safe`, policy `recompute`) are not scheduled while a block they wait for is pending,
//! and an owner that ends first hands its blocks off through the next step's report.
//!
//! # Limits
//!
//! Meant for comparison, not production: `O(live requests)` work per step under one lock.
//!
//! # Layout
//!
//! [`scheduler`] (the API, each call under the lock) over [`state`] (everything behind the
//! lock and the bookkeeping shared by the mechanisms, one step phase by phase), [`request`]
//! (one request) and [`blocks`] (allocator and prefix cache); the step's phases:
//! [`completions`] (drained into the report, loads landed), [`recovery`], [`outputs`] (the
//! engine's output recorded and applied), [`admission`], [`scheduling`]; [`invariants`]; the
//! [`workers`]; [`config`].
//!
//! [`recovery::recover`]: kvsched::rules::recovery::recover

mod admission;
mod blocks;
mod completions;
mod config;
mod invariants;
mod outputs;
mod recovery;
mod request;
mod scheduler;
mod scheduling;
mod state;
mod workers;

pub use config::BaselineConfig;
pub use scheduler::MutexScheduler;
