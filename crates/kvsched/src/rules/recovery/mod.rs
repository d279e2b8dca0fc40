//! The recovery rules of mode [`Mode::Vllm`] and mode [`Mode::Safe`] (`docs/rules.md#mode-vllm`,
//! `docs/rules.md#mode-safe`).
//!
//! Pure: plain data in, plain data out; no threads, clocks or I/O. The rules are exposed per
//! request so that both engines share them:
//!
//! 1. [`scan_request`] finds one request's *hits* against a report ([`InvalidSet`]);
//! 2. the caller decides, for each hit, whether the request owns it ([`HitOwner::Mine`]) or
//!    another request does — the sequential engine ([`recover`]) from a marked set walked in
//!    canonical order, the runtime from its claim table;
//! 3. [`decide`](fn@decide) turns the hits and their ownership into the request's [`Decision`].
//!
//! # Guarantees
//!
//! * Every boundary is a multiple of `S` and at most the pre-step length `P`.
//! * Null entries are never hits, never claimed, never evicted (in every group, as the hybrid
//!   rule says; vLLM 0.33 itself does not test for nulls).
//! * Mode `vllm` on one full-attention group is bit-exact with vLLM 0.33; on several groups it
//!   applies the hybrid rule.
//! * Mode `safe` additionally: one claim per block per report (one marked set spans both
//!   scans), `waits_for` for sharers, a boundary from which every group can resume, and
//!   eviction of everything at or past a claimant's boundary under either policy.
//!
//! # Cost
//!
//! [`scan_request`] is `O(entries scanned)` with a branch-free membership test per entry (a
//! bitmap where the report's ids are dense, else a hashed filter in front of an exact set);
//! [`decide`](fn@decide) is `O(hits)` plus, for a request with a new hit, `O(its entries)` for
//! the evictions and, in mode `safe`, the resumable boundary — however many groups there are.
//! An [`InvalidSet`] takes memory in proportion to the ids it names. Tracing
//! ([`trace`]) is free when off.
//!
//! # Layout
//!
//! This module holds the types the rules read (modes, requests, errors); one file per
//! mechanism below it:
//!
//! * `validate`: a request's bad input against the geometry;
//! * `invalid_set`: a report as per-group membership sets;
//! * `scan`: a request's hits against a report;
//! * `decide`: one request's decision from its hits and their owners;
//! * `boundary`: the resumable boundary of mode `safe`;
//! * `sequential`: the sequential engine (canonical order, marked sets) and its [`Outcome`];
//! * [`trace`]: the reasons of a decision, reported by the rules as they decide (off, and free,
//!   unless a sink asks for them).

use thiserror::Error;

use crate::rules::geometry::BlockId;

mod boundary;
mod decide;
mod invalid_set;
mod scan;
mod sequential;
pub mod trace;
mod validate;

pub use decide::{decide, decide_traced, Decision, Disposition, HitOwner};
pub use invalid_set::InvalidSet;
pub use scan::{scan_request, scan_request_traced, Hit};
pub use sequential::{
    canonical_order, outcome_from_decisions, recover, recover_explained, Outcome, RequestOutcome,
};
pub use validate::{validate_request, validate_requests};

/// Which rule set to apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// vLLM 0.33's behaviour extended by the hybrid rule (`docs/rules.md#mode-vllm`).
    Vllm,
    /// The safer rules of `docs/rules.md#mode-safe` (default).
    #[default]
    Safe,
}

/// What happens to affected requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Roll back and recompute (default).
    #[default]
    Recompute,
    /// Finish every affected request with an error.
    Fail,
}

/// Whether a request's load was asynchronous or synchronous in this report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestClass {
    /// Its external load is in flight (vLLM's `WAITING_FOR_REMOTE_KVS`).
    Async,
    /// Running; it loaded in the step whose output carries the report.
    Sync,
}

/// A borrowed view of one request, as the rules see it.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// Async or sync for this report.
    pub class: RequestClass,
    /// Computed tokens, including the ones scheduled in the step.
    pub num_computed_tokens: u64,
    /// Tokens scheduled in the step (0 for async requests).
    pub num_scheduled_tokens: u64,
    /// One block table per cache group, in group order.
    pub block_tables: &'a [Vec<BlockId>],
}

impl RequestView<'_> {
    /// The pre-step computed length `P = num_computed_tokens − num_scheduled_tokens`
    /// (saturating: [`validate_request`] rejects `num_scheduled_tokens > num_computed_tokens`).
    #[inline]
    pub fn pre_step_tokens(&self) -> u64 {
        self.num_computed_tokens
            .saturating_sub(self.num_scheduled_tokens)
    }
}

/// An owned request, for the sequential engine and the replay tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Unique id.
    pub id: String,
    /// Async or sync for this report.
    pub class: RequestClass,
    /// Computed tokens, including the ones scheduled in the step.
    pub num_computed_tokens: u64,
    /// Tokens scheduled in the step (0 for async requests).
    pub num_scheduled_tokens: u64,
    /// One block table per cache group, in group order.
    pub block_tables: Vec<Vec<BlockId>>,
}

impl Request {
    /// The rules' view of this request.
    #[inline]
    pub fn view(&self) -> RequestView<'_> {
        RequestView {
            class: self.class,
            num_computed_tokens: self.num_computed_tokens,
            num_scheduled_tokens: self.num_scheduled_tokens,
            block_tables: &self.block_tables,
        }
    }
}

/// Why a request or report was rejected.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RecoveryError {
    /// A request has a table count different from the group count.
    #[error("{} given, {} configured", count(*.given, "table"), count(*.groups, "group"))]
    TableCount {
        /// Tables in the request.
        given: usize,
        /// Groups in the geometry.
        groups: usize,
    },
    /// `num_scheduled_tokens > num_computed_tokens`.
    #[error("num_scheduled_tokens {scheduled} exceeds num_computed_tokens {computed}")]
    ScheduledExceedsComputed {
        /// Scheduled tokens.
        scheduled: u64,
        /// Computed tokens.
        computed: u64,
    },
    /// An async request with scheduled tokens.
    #[error("an async request has num_scheduled_tokens {scheduled}, must be 0")]
    AsyncWithScheduled {
        /// Scheduled tokens.
        scheduled: u64,
    },
    /// A null id inside a full-attention table below `P`.
    #[error("group {group} is full_attention but entry {index} (below P = {pre_step_tokens}) is the null block")]
    NullInFullAttention {
        /// Group index.
        group: usize,
        /// Entry index.
        index: usize,
        /// The request's pre-step length.
        pre_step_tokens: u64,
    },
    /// Two requests share an id.
    #[error("duplicate request id {id:?}")]
    DuplicateRequestId {
        /// The repeated id.
        id: String,
    },
    /// A group-qualified report whose list count is not the group count.
    #[error("{} given, {} configured", count(*.given, "list"), count(*.groups, "group"))]
    ReportGroupCount {
        /// Lists in the report.
        given: usize,
        /// Groups in the geometry.
        groups: usize,
    },
}

/// `n` and `noun`, plural unless `n` is 1: "1 group", "2 groups".
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// How many of a table's `table_len` entries lie below `blocks` blocks (all of them when
/// `blocks` does not fit in `usize`).
#[inline]
fn scan_len(blocks: u64, table_len: usize) -> usize {
    usize::try_from(blocks).map_or(table_len, |b| b.min(table_len))
}
