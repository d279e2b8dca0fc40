//! What a step exchanges with the engine: the [`StepPlan`] to run, with its
//! [`StepRecovery`], and the [`StepOutput`] the engine answers it with.

use std::sync::Arc as StdArc;

use crate::pool::BlockRef;
use crate::rules::geometry::BlockId;
#[cfg(doc)]
use crate::runtime::builder::Builder;
#[cfg(doc)]
use crate::runtime::shard::Metrics;
use crate::runtime::shard::{EndState, RecoveredRequest, ScannedRequest, ScheduledRequest};

/// What the engine reports after running a step.
///
/// `step` must echo the [`StepPlan::step`] of the plan the output answers — the latest one
/// (build it with [`StepOutput::for_plan`]). `sampled` and `invalid_blocks` belong to that
/// step: in an output naming any other step they are ignored and the output, if it carried
/// any, is counted in [`Metrics::stale_outputs`]. `finished` is not tied to a step and always
/// applies.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// The step this output answers ([`StepPlan::step`]).
    pub step: u64,
    /// Requests that sampled a token (those scheduled with `samples`).
    pub sampled: Vec<StdArc<str>>,
    /// Requests the engine finished (stop token, client gone, …).
    pub finished: Vec<StdArc<str>>,
    /// Blocks that sync loads in the step failed to fill.
    pub invalid_blocks: Vec<BlockRef>,
}

impl StepOutput {
    /// An empty output answering `plan`.
    pub fn for_plan(plan: &StepPlan) -> Self {
        StepOutput {
            step: plan.step,
            ..StepOutput::default()
        }
    }

    /// An output answering `plan` in which every request scheduled to sample did (those with
    /// [`ScheduledRequest::samples`]): what an engine whose forward pass ran reports, before it
    /// adds the requests it finished and the blocks its sync loads failed to fill.
    pub fn all_sampled(plan: &StepPlan) -> Self {
        StepOutput {
            step: plan.step,
            sampled: plan
                .scheduled
                .iter()
                .filter(|s| s.samples)
                .map(|s| s.id.clone())
                .collect(),
            ..StepOutput::default()
        }
    }
}

/// A step's recovery.
#[derive(Clone, Debug, Default)]
pub struct StepRecovery {
    /// The step's report: ids, ascending.
    pub report: Vec<BlockId>,
    /// Every affected request's decision, in canonical order.
    pub recovered: Vec<RecoveredRequest>,
    /// Blocks whose prefix-cache entries were cleared, ascending.
    pub evicted_blocks: Vec<BlockId>,
    /// Every scanned request's inputs, in canonical order (only with
    /// [`Builder::record_recovery_inputs`]).
    pub scanned: Vec<ScannedRequest>,
}

/// What to run in a step.
#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    /// Step number, from 1; the engine echoes it in [`StepOutput::step`].
    pub step: u64,
    /// Requests to compute, in canonical order.
    pub scheduled: Vec<ScheduledRequest>,
    /// The step's recovery.
    pub recovery: StepRecovery,
    /// Requests that ended during the step.
    pub ended: Vec<(StdArc<str>, EndState)>,
    /// Load completion → runnable, per request that became runnable (ns).
    pub runnable_latency_ns: Vec<u64>,
    /// Submit → first scheduled, per request scheduled for the first time (ns).
    pub first_schedule_latency_ns: Vec<u64>,
}
