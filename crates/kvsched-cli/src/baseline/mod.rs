//! The mutex baseline of `kvsched stress --baseline mutex`: the same engine-facing API as
//! [`Runtime`](kvsched::runtime::Runtime), synchronised the straightforward way, so one process
//! can compare the two on the same seeded workload.
//!
//! **The same code, another synchronisation.** The baseline runs the runtime's own shard
//! (`kvsched::runtime::shard::Shard`): the same request state, commands, completions,
//! claiming and deciding, the last output applied, landed loads, admission and scheduling,
//! the same pure decisions of `runtime::policy`. What differs is only how the shard reaches
//! the state shards share: the shard's step is generic over a strategy
//! (`kvsched::runtime::shard::strategy`), and where the runtime plugs in its lock-free pool
//! and atomic claim table, the baseline plugs in plain ones — [`blocks`] and [`claims`] —
//! and puts the whole shard behind one lock. On the same input one shard of the runtime and
//! the baseline therefore make the same decisions at every step
//! (`tests/same_decisions.rs` checks it, across shard counts).
//!
//! * **One global lock.** Every piece of scheduler state — the shard (requests, phases,
//!   holder index), the block allocator (a `Vec` free list with plain reference counts), the
//!   prefix cache (a `HashMap`), the claim words and pending-recompute marks (plain cells),
//!   the inbox of commands and what the engine side keeps — lives behind one
//!   [`kvsched::sync::Mutex`]. A step runs on the calling thread only: the shard's three
//!   phases (publish, claim, decide and schedule) back to back.
//! * **Channel completions.** Worker threads take jobs from an `mpsc` channel (its receiver
//!   shared behind a mutex) and send completions back on another `mpsc` channel, drained at
//!   the start of every step.
//!
//! # Guarantees
//!
//! The runtime's lifecycle rules, by the runtime's code: every submitted request ends in
//! exactly one of finished, failed, cancelled; every completion is applied once or counted
//! stale; sharers (mode `safe`, policy `recompute`) are not scheduled while a block they wait
//! for is pending, and an owner that ends first hands its blocks off through the next step's
//! report; a plan left unanswered is taken as lost and its work re-offered.
//!
//! # Limits
//!
//! Meant for comparison, not production. One shard: no parallel step, no cross-shard
//! preemption or stall count. It runs without load deadlines, the retry budget and
//! quarantine (the shard's settings turn them off), and keeps no fill flags: a load's
//! destinations are not guarded against a late writer (none is late without deadlines).
//!
//! # Layout
//!
//! [`scheduler`] (the API, each call under the lock) over [`state`] (everything behind the
//! lock, the baseline's strategy and one step), [`engine`] (what the runtime's engine thread
//! does: the output checked, the shard's result made a plan), the strategy's [`blocks`] and
//! [`claims`] (checked against the runtime's pool and claim table, operation by operation,
//! in `strategy_tests`); [`invariants`]; the [`workers`]; [`config`].

mod blocks;
mod claims;
mod config;
mod engine;
mod invariants;
mod scheduler;
mod state;
#[cfg(test)]
mod strategy_tests;
mod workers;

pub use config::BaselineConfig;
pub use scheduler::MutexScheduler;
