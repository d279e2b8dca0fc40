//! # kvsched
//!
//! The scheduler core an LLM serving engine embeds to run asynchronous external KV-cache loads
//! and to recover correctly when they fail — on hybrid models too (several cache groups with
//! their own block sizes and null-block placeholders).
//!
//! Layers, bottom up (each imports only from layers below it):
//!
//! * [`geometry`]: cache groups, the scheduler block size `S`, the null block;
//! * [`recovery`]: the pure recovery rules (SPEC §3 mode `vllm`, §4 mode `safe`) per request,
//!   and the sequential engine built from them;
//! * [`replay`]: the scenario format of `kvsched replay`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(not(kvsched_loom))]
pub mod baseline;
pub mod blockset;
pub mod claim;
pub mod connector;
pub mod geometry;
#[cfg(not(kvsched_loom))]
pub mod parallel;
pub mod pool;
#[cfg(not(kvsched_loom))]
pub mod quarantine;
pub mod recovery;
pub mod replay;
#[cfg(not(kvsched_loom))]
pub mod runtime;
#[cfg(not(kvsched_loom))]
mod shard;
#[cfg(not(kvsched_loom))]
pub mod stress;
pub mod sync;
pub mod worker;
