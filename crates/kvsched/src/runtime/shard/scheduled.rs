//! What a shard contributes to a step's plan: the requests it schedules, the recoveries it
//! decided, the inputs it scanned, and how its requests ended.

use std::sync::Arc as StdArc;

use crate::connector::LoadJob;
use crate::pool::BlockRef;
use crate::rules::geometry::BlockId;
use crate::rules::recovery::{Decision, RequestClass};
use crate::runtime::order::RequestOrder;

/// One cache group's block table: entry `i` is the block holding the group's KV for the
/// request's `i`-th block of tokens.
pub type BlockTable = StdArc<[BlockRef]>;

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EndState {
    /// Generated all its tokens, or the engine finished it.
    Finished,
    /// Failed by recovery under policy `fail`.
    Failed,
    /// Cancelled by the engine or by shutdown.
    Cancelled,
}

/// A request scheduled in a step.
#[derive(Clone, Debug)]
pub struct ScheduledRequest {
    /// Request id.
    pub id: StdArc<str>,
    /// Its place in canonical order.
    pub key: RequestOrder,
    /// Computed tokens before this step.
    pub num_computed_tokens: u64,
    /// Tokens to compute in this step.
    pub num_tokens: u64,
    /// Whether the step computes the sequence's last token (the engine samples one).
    pub samples: bool,
    /// The request's block table of each cache group, after this step's growth: entry `i` of
    /// group `g` holds the group's KV of tokens `[i·b, (i+1)·b)` (`b` its block size; for a
    /// Mamba group, the state after `min((i+1)·b, computed)` tokens), the null block (id 0)
    /// where the group keeps nothing. The step reads entries below `num_computed_tokens` (a
    /// sliding window only its last `w − 1` tokens, Mamba only the state at
    /// `num_computed_tokens`) and writes the entries covering `[num_computed_tokens,
    /// num_computed_tokens + num_tokens)`.
    ///
    /// Shared, not copied: the runtime rebuilds a request's tables only in a step that
    /// changed them (a new block every `b` tokens, a trim, a recovery) and otherwise hands out
    /// the same allocation as the last plan.
    pub block_tables: StdArc<[BlockTable]>,
    /// A synchronous load the engine runs in this step before computing: it fills the
    /// destinations [`LoadJob::loaded_blocks`] names, which are entries of `block_tables`.
    pub sync_load: Option<Box<LoadJob>>,
    /// Whether this is the request's first scheduling (its submit → first-schedule latency is
    /// in [`crate::runtime::StepPlan::first_schedule_latency_ns`]).
    pub first: bool,
}

/// One request's recovery in a step.
#[derive(Clone, Debug)]
pub struct RecoveredRequest {
    /// Request id.
    pub id: StdArc<str>,
    /// Its place in canonical order (in its class for this report).
    pub key: RequestOrder,
    /// Async or sync in this report.
    pub class: RequestClass,
    /// The rules' decision, owners named by their place in canonical order.
    pub decision: Decision<RequestOrder>,
}

/// A scanned request's inputs, recorded for differential checks.
#[derive(Clone, Debug)]
pub struct ScannedRequest {
    /// Request id.
    pub id: StdArc<str>,
    /// Its place in canonical order (in its class for this report).
    pub key: RequestOrder,
    /// Async or sync.
    pub class: RequestClass,
    /// Computed tokens at scan time.
    pub num_computed_tokens: u64,
    /// Tokens scheduled in the step the report belongs to.
    pub num_scheduled_tokens: u64,
    /// Block tables at scan time.
    pub block_tables: Vec<Vec<BlockId>>,
}
