//! # kvsched
//!
//! The scheduler core an LLM serving engine embeds to run asynchronous external KV-cache loads
//! and to recover correctly when they fail — on hybrid models too (several cache groups with
//! their own block sizes and null-block placeholders).
//!
//! An engine builds a [`Runtime`] with a [`Builder`], plugs in a [`KvConnector`], submits
//! requests ([`SubmitRequest`], from any thread through a [`Handle`]), and then loops:
//! [`Runtime::update`] with the last [`StepOutput`], [`Runtime::schedule`] for the next
//! [`StepPlan`], run the model on it. See the [`Runtime`] docs for the loop as a doctest.
//!
//! What an embedder uses:
//!
//! * the crate root: the runtime ([`Runtime`], [`Handle`], [`Builder`], [`Settings`]), what
//!   goes in and out of a step ([`SubmitRequest`], [`StepPlan`], [`ScheduledRequest`],
//!   [`StepOutput`]), what comes back at the end ([`Report`], [`Metrics`]), errors
//!   ([`RuntimeError`]), and the common rule and geometry types ([`CacheGroup`],
//!   [`MambaMode`], [`Mode`], [`Policy`], [`BlockRef`]);
//! * [`connector`]: the [`KvConnector`] trait an engine implements to reach its KV store, the
//!   [`LoadJob`] it runs and the [`LoadResult`] it returns;
//! * [`kv`]: the data plane — [`kv::KvMemory`] (the engine's KV bytes per block), the chunk
//!   format, the [`kv::Tier`] trait with memory, disk and Redis tiers, and
//!   [`kv::TierConnector`], which joins a tier to KV memory (verified loads, write-behind
//!   saves, [`kv::completed_prompt_blocks`] for what a kept step can save);
//! * [`rules`]: the pure recovery rules (mode `vllm` and mode `safe`), usable without the
//!   runtime.
//!
//! The simulated engine, connector and tiers, fault injection and local Redis servers the
//! tests and tools use are in the `kvsched-testkit` crate, the command line in `kvsched-cli`.
//!
//! The rules are specified in the repository's `docs/rules.md`, the runtime's guarantees and
//! limits in `docs/runtime.md`.
//!
//! Layers, bottom up (each imports only from layers below it): `sync` (the only place naming
//! atomics, locks and threads) and `rng`; [`rules`] (pure); `pool` and [`connector`]
//! (resources); `runtime`; [`kv`], the data plane, beside the runtime (it implements
//! [`KvConnector`]).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

// The planted bugs' switch, first so that every module sees `planted!`.
#[macro_use]
mod plant;
#[macro_use]
mod setters;
// Under loom only the workers' `caught` is used.
#[cfg_attr(kvsched_loom, allow(dead_code))]
mod panics;

// Internal modules are crate-private in a normal build and public only to the loom models
// (`cfg(kvsched_loom)`) and, under feature `internals`, to the command line, the Python package,
// the tests and the mechanism benchmarks. Each says so in its rustdoc: none is API.
pub mod connector;
pub mod kv;
#[cfg(any(kvsched_loom, feature = "internals"))]
pub mod pool;
#[cfg(not(any(kvsched_loom, feature = "internals")))]
pub(crate) mod pool;
#[cfg(any(kvsched_loom, feature = "internals"))]
pub mod rng;
#[cfg(not(any(kvsched_loom, feature = "internals")))]
pub(crate) mod rng;
pub mod rules;
#[cfg(any(kvsched_loom, feature = "internals"))]
pub mod runtime;
#[cfg(not(any(kvsched_loom, feature = "internals")))]
pub(crate) mod runtime;
#[cfg(any(kvsched_loom, feature = "internals"))]
pub mod sync;
#[cfg(not(any(kvsched_loom, feature = "internals")))]
pub(crate) mod sync;

pub use connector::{KvConnector, LoadJob, LoadResult};
pub use pool::{BlockRef, Census, Generation, PoolError};
pub use rules::geometry::{BlockId, CacheGroup, GeometryError, GroupKind, MambaMode};
pub use rules::recovery::{Mode, Policy};
#[cfg(not(kvsched_loom))]
pub use runtime::{
    BlockTable, Builder, EndState, Handle, LoadPolicy, Metrics, RecoveredRequest, Report,
    RequestOrder, Runtime, RuntimeError, ScannedRequest, ScheduledRequest, Settings, StepOutput,
    StepPlan, StepRecovery, SubmitRequest, TierEstimate,
};

/// Compiles and runs the Rust examples of README.md as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
