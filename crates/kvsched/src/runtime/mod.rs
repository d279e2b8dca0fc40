//! **Internal, not part of the stable API.** Public only under feature `internals`, for the
//! project's own tools, tests and benchmarks (`kvsched-cli`, the Python package, the tests,
//! the mechanism benches); crate-private in a normal build. Anything here may change or
//! disappear in any release, outside any semver promise.
//!
//! What an engine uses of the runtime is re-exported at the crate root ([`Runtime`],
//! [`Builder`], [`Settings`], …); use it from there.
//!
//! The runtime an engine embeds: [`Runtime::builder`], [`Runtime::submit`],
//! [`Runtime::schedule`] → [`StepPlan`], [`Runtime::update`] with a [`StepOutput`],
//! [`Runtime::cancel`], [`Runtime::shutdown`] → [`Report`]. The engine loop is the example
//! on [`Runtime`].
//!
//! # Threads
//!
//! * **Workers** run asynchronous loads ([`crate::runtime::worker`]) and push completions to the owning
//!   shard's bounded lock-free queue. They never touch scheduler state.
//! * **Shards** each own the requests whose id hashes to them. A step fans out to every shard
//!   in parallel: shard 0 runs on the calling (engine) thread, shards `1..K` on their own
//!   threads, woken by a parker. Phases are separated by two barriers (publish → claim →
//!   decide); the second is skipped, by every shard alike, when the step's report is empty.
//!
//! # Files
//!
//! One mechanism a file. The engine thread's side: `engine` ([`Runtime`], the step and its
//! merge into a [`StepPlan`]), `builder` ([`Builder`]), `settings` (live [`Settings`]),
//! `signal` (idle wake-ups), `invariants` and `shutdown`. Between threads: `shared` (the
//! state they share), `handoff` (the engine ↔ shard step hand-off) and `handle` (submission,
//! [`Handle`]). Exchanged with the engine: `plan` ([`StepPlan`], [`StepOutput`]), `report`
//! ([`Report`]) and `error` ([`RuntimeError`]). Beneath them: `shard` (one shard's
//! scheduling and recovery), `claim` (the claim table), `worker` (the load workers),
//! `quarantine` and `route`; `policy` holds the pure decisions of a step (prefix search,
//! admission, growth, the scheduling choice, what a report may name). The shard's step is
//! generic over how it reaches the pool and the claim table (`shard::strategy`): the mutex
//! baseline of `kvsched stress --baseline mutex` runs the very same shard code over plain,
//! unsynchronised ones under one lock.
//!
//! # Guarantees
//!
//! * **Deterministic recovery.** A step's recovery outcome equals the sequential rules of
//!   [`crate::rules::recovery::recover`] applied in canonical order (loading requests, then running
//!   ones, each by `(priority, admission sequence)`), whatever the shard count and thread
//!   interleaving: ownership comes from the claim table (`claim::ClaimTable`), never from
//!   gathering requests.
//! * **Sharers wait** (mode `safe`, policy `recompute`): a request is never scheduled while a
//!   block it waits for is pending; an owner that ends first hands its blocks off through the
//!   next step's report, so the next waiter in canonical order recomputes them.
//! * **Nothing is lost.** Every submitted request ends in exactly one of finished, failed,
//!   cancelled; every completion is applied once or counted stale; `shutdown` reports all.
//!
//! # Limits
//!
//! * `schedule`, `update` and `shutdown` take `&mut self`: one engine thread drives steps.
//!   `submit` and `cancel` take `&self` and may be called from any thread.
//! * Priorities are `i16`; at most `2^47 − 2` admissions per runtime.

#[cfg(not(kvsched_loom))]
mod builder;
#[cfg(any(kvsched_loom, feature = "internals"))]
pub mod claim;
#[cfg(not(any(kvsched_loom, feature = "internals")))]
pub(crate) mod claim;
#[cfg(all(test, not(kvsched_loom)))]
mod claim_barrier_tests;
#[cfg(any(kvsched_loom, feature = "internals"))]
pub mod completion_queue;
#[cfg(not(any(kvsched_loom, feature = "internals")))]
pub(crate) mod completion_queue;
#[cfg(all(not(kvsched_loom), feature = "internals"))]
pub mod discard;
#[cfg(all(not(kvsched_loom), not(feature = "internals")))]
pub(crate) mod discard;
#[cfg(not(kvsched_loom))]
mod error;
#[cfg(not(kvsched_loom))]
mod handle;
#[cfg(not(kvsched_loom))]
mod handoff;
#[cfg(not(kvsched_loom))]
mod inbox;
#[cfg(not(kvsched_loom))]
mod invariants;
#[cfg(all(not(kvsched_loom), feature = "internals"))]
pub mod load_estimate;
#[cfg(all(not(kvsched_loom), not(feature = "internals")))]
mod load_estimate;
#[cfg(not(kvsched_loom))]
mod merge;
#[cfg(not(kvsched_loom))]
mod plan;
#[cfg(all(test, not(kvsched_loom)))]
mod poison_tests;
#[cfg(all(not(kvsched_loom), feature = "internals"))]
pub mod policy;
#[cfg(all(not(kvsched_loom), not(feature = "internals")))]
pub(crate) mod policy;
#[cfg(all(not(kvsched_loom), feature = "internals"))]
pub mod quarantine;
#[cfg(all(not(kvsched_loom), not(feature = "internals")))]
mod quarantine;
#[cfg(not(kvsched_loom))]
mod report;
#[cfg(any(kvsched_loom, feature = "internals"))]
pub mod route;
#[cfg(not(any(kvsched_loom, feature = "internals")))]
pub(crate) mod route;
#[cfg(not(kvsched_loom))]
mod settings;
#[cfg(all(not(kvsched_loom), feature = "internals"))]
pub mod shard;
#[cfg(all(not(kvsched_loom), not(feature = "internals")))]
mod shard;
#[cfg(not(kvsched_loom))]
mod shared;
#[cfg(not(kvsched_loom))]
mod shutdown;
#[cfg(not(kvsched_loom))]
mod signal;
#[cfg(not(kvsched_loom))]
mod stall;
#[cfg(not(kvsched_loom))]
mod step;
#[cfg(not(kvsched_loom))]
mod step_mode;
#[cfg(any(kvsched_loom, feature = "internals"))]
pub mod worker;
#[cfg(not(any(kvsched_loom, feature = "internals")))]
pub(crate) mod worker;
#[cfg(all(test, not(kvsched_loom)))]
mod worker_tests;

#[cfg(not(kvsched_loom))]
pub use self::{
    builder::Builder,
    error::RuntimeError,
    handle::{Handle, SubmitRequest},
    plan::{StepOutput, StepPlan, StepRecovery},
    policy::load_cost::{LoadPolicy, TierEstimate},
    report::Report,
    settings::Settings,
    shard::{BlockTable, EndState, Metrics, RecoveredRequest, ScannedRequest, ScheduledRequest},
    step::Runtime,
};
#[cfg(not(kvsched_loom))]
mod order;
#[cfg(not(kvsched_loom))]
pub use order::RequestOrder;
