//! Which outputs of a step the engine must discard, known before it sends them: the requests
//! whose step read a block that one of the step's sync loads failed to fill.
//!
//! This is the sync scan of the step's coming recovery (docs/rules.md, "Scanning a request": a sync request is affected when
//! a non-null entry below its pre-step length `P` is in the report), run at `update` time on
//! the report's sync-load share, so a streaming engine learns it before it emits a token. The
//! next plan's recovery puts exactly these requests in `skip` (policy `recompute`) or ends them
//! as failed (policy `fail`); `tests/runtime_discard.rs` checks that the two agree. The mutex
//! baseline of the stress tool answers its `update` with the same function.

use std::sync::Arc as StdArc;

use rustc_hash::FxHashSet;

use crate::rules::geometry::{BlockId, Geometry};
use crate::runtime::shard::BlockTable;

/// What the runtime remembers of a scheduled request to answer the question: its id, its
/// computed length before the step (`P`) and the tables the plan handed out.
#[derive(Clone, Debug)]
pub struct StepReads {
    /// The request id.
    pub id: StdArc<str>,
    /// Its computed length before the step (`P`).
    pub pre_step_tokens: u64,
    /// The tables the plan handed out.
    pub tables: StdArc<[BlockTable]>,
}

/// The requests of `reads` whose scan range holds one of `invalid` (ids of blocks the step's
/// sync loads failed to fill), in plan order.
pub fn discarded(
    geo: &Geometry,
    reads: &[StepReads],
    invalid: &FxHashSet<BlockId>,
) -> Vec<StdArc<str>> {
    if invalid.is_empty() {
        return Vec::new();
    }
    let null = geo.null_block();
    reads
        .iter()
        .filter(|r| {
            geo.groups().iter().zip(r.tables.iter()).any(|(grp, t)| {
                let n = usize::try_from(r.pre_step_tokens.div_ceil(grp.block_size.max(1)))
                    .unwrap_or(usize::MAX)
                    .min(t.len());
                t[..n]
                    .iter()
                    .any(|b| b.id != null && invalid.contains(&b.id))
            })
        })
        .map(|r| r.id.clone())
        .collect()
}

/// What the latest plan handed out, against which the engine's output is checked: which
/// blocks its sync loads wrote, what each request read, and which ids it scheduled to
/// sample. (Whether a sample is for a request scheduled to sample each shard checks of its
/// own requests.) The runtime and the mutex baseline record it the same way.
#[derive(Debug, Default)]
pub struct HandedOut {
    /// The destination blocks of each sync load (a failed block must be one of them).
    pub sync_dests: Vec<Vec<crate::pool::BlockRef>>,
    /// What each scheduled request read, for the outputs to discard; recorded only for a
    /// plan with a sync load (without one, no output is discarded).
    pub reads: Vec<StepReads>,
    /// The address of each sampling entry's id, in plan order.
    sampling: Vec<usize>,
}

/// The address of an id's text: what identifies its allocation.
#[inline]
fn address(id: &StdArc<str>) -> usize {
    StdArc::as_ptr(id).cast::<u8>() as usize
}

impl HandedOut {
    /// Records `plan` (replacing the last one); the lists keep their capacity from step to
    /// step.
    pub fn record(&mut self, plan: &crate::runtime::StepPlan) {
        self.sampling.clear();
        self.sampling.reserve(plan.scheduled.len());
        self.sync_dests.clear();
        // One pass: most entries sample, few carry a sync load.
        for s in &plan.scheduled {
            if s.samples {
                self.sampling.push(address(&s.id));
            }
            if let Some(job) = s.sync_load.as_deref() {
                self.sync_dests.push(job.all_loaded_blocks());
            }
        }
        self.reads.clear();
        if self.sync_dests.is_empty() {
            // Only a sync load's destination can be reported failed (`update` ignores every
            // other block), so nothing this plan handed out is discarded.
            return;
        }
        self.reads.extend(plan.scheduled.iter().map(|s| StepReads {
            id: s.id.clone(),
            pre_step_tokens: s.num_computed_tokens,
            tables: StdArc::clone(&s.block_tables),
        }));
    }

    /// Whether `sampled`, an output's samples for the recorded plan, are the plan's own ids
    /// (the very allocations it handed out, as `s.id.clone()` gives them) of every entry it
    /// scheduled to sample, each once, in plan order: then each shard applies them as a
    /// [`Command::SampledAll`](crate::runtime::shard::Command::SampledAll) of the requests it
    /// scheduled to sample, without a lookup by id. Anything else (a sample left out,
    /// repeated, reordered, or the same text in another allocation) is `false`, and each
    /// sample is looked up by its id.
    ///
    /// Valid until the next step begins: until then every request of the plan is live —
    /// nothing ends a request outside a step — and holds its id, so no other `Arc<str>` can
    /// sit at a recorded address, and an equal address is that request's own id.
    pub fn sampled_as_planned(&self, sampled: &[StdArc<str>]) -> bool {
        // Planted bug (scripts/plants.sh): only the count is compared.
        if planted!("sampled-as-planned-by-count") {
            return sampled.len() == self.sampling.len();
        }
        sampled.len() == self.sampling.len()
            && sampled
                .iter()
                .zip(&self.sampling)
                .all(|(id, &a)| address(id) == a)
    }
}
