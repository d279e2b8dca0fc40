//! The step's report and asynchronous loads coming back: the engine's share of the report
//! (failed sync-load blocks, hand-offs), completions drained into it, and the landed loads
//! moved on (running, back to waiting, or ended as asked while they were in flight).

use std::time::Instant;

use super::request::Phase;
use super::state::State;
use kvsched::connector::LoadResult;
use kvsched::rules::geometry::BlockId;
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::policy::trust::failed_load_blocks;
use kvsched::runtime::worker::Completion;
use kvsched::runtime::StepPlan;

impl State {
    /// The engine's share of the step's report, as the runtime's engine thread takes it: the
    /// last output's failed sync-load blocks that are still current (others are counted stale
    /// and lose their pending mark) and the hand-offs still current (others are forgotten).
    pub(super) fn engine_share(&mut self) -> Vec<BlockId> {
        let mut share = Vec::new();
        for b in std::mem::take(&mut self.sync_invalid) {
            if b.id != self.null() && self.blocks.is_current(b) {
                share.push(b.id);
            } else {
                self.metrics.stale_blocks += 1;
                self.pending.remove(&b.id);
            }
        }
        for b in std::mem::take(&mut self.handoffs) {
            if self.blocks.is_current(b) {
                share.push(b.id);
            } else {
                self.pending.remove(&b.id);
            }
        }
        share
    }

    /// Takes the step's completions, as a shard does: a stale one is counted; a current one
    /// marks the load done and, when it failed, adds to `report` the blocks its failure may
    /// roll back (its own current blocks: see [`failed_load_blocks`]).
    pub(super) fn drain_completions(
        &mut self,
        completions: Vec<Completion>,
        report: &mut Vec<BlockId>,
    ) {
        for c in completions {
            self.metrics.connector_panics += u64::from(c.panicked);
            let Some(r) = self.reqs.get_mut(&c.key) else {
                self.metrics.stale_completions += 1;
                continue;
            };
            if r.phase != Phase::Loading || r.attempt != c.attempt || r.load_done.is_some() {
                self.metrics.stale_completions += 1;
                continue;
            }
            r.load_done = Some(c.finished_at);
            match c.result {
                LoadResult::Ok => self.metrics.loads_ok += 1,
                LoadResult::Failed(named) => {
                    self.metrics.loads_failed += 1;
                    let own = r.load_blocks(&self.geo);
                    let blocks = &self.blocks;
                    let ignored = failed_load_blocks(
                        &own,
                        named.into_flat(),
                        |b| blocks.is_current(b),
                        report,
                    );
                    self.metrics.foreign_blocks += ignored.foreign;
                    self.metrics.stale_blocks += ignored.stale;
                }
            }
        }
    }

    /// Loading requests whose load landed this step, in admission order (as a shard): each
    /// ends if that was asked meanwhile, else resumes at what recovery left of its load —
    /// running, or back to waiting when nothing is left.
    pub(super) fn land_loads(&mut self, now: Instant, plan: &mut StepPlan) {
        let mut keys: Vec<RequestKey> = self
            .loading
            .iter()
            .filter(|k| self.reqs.get(k).is_some_and(|r| r.load_done.is_some()))
            .copied()
            .collect();
        keys.sort_unstable_by_key(|k| k.seq());
        for key in keys {
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            let Some(finished_at) = r.load_done.take() else {
                continue;
            };
            if let Some(state) = r.end_after_load.take() {
                self.end(key, state);
                continue;
            }
            r.num_computed_tokens = r.num_computed_tokens.min(r.load_cap);
            r.load_cap = u64::MAX;
            if r.num_computed_tokens == 0 {
                r.attempt += 1;
                self.release_all(key);
                self.set_phase(key, Phase::Waiting);
                continue;
            }
            r.written = r.num_computed_tokens;
            self.register_and_trim(key);
            plan.runnable_latency_ns
                .push(now.saturating_duration_since(finished_at).as_nanos() as u64);
            self.set_phase(key, Phase::Running);
        }
    }
}
