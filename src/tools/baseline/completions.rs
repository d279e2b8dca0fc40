//! Asynchronous loads coming back: their completions drained into the step's report, and the
//! landed loads moved on (running, back to waiting, or ended as asked while they were in
//! flight).

use std::time::Instant;

use super::request::Phase;
use super::state::State;
use crate::connector::LoadResult;
use crate::pool::BlockRef;
use crate::runtime::claim::RequestKey;
use crate::runtime::worker::Completion;
use crate::runtime::StepPlan;

impl State {
    /// The step's report: completions drained, last output's sync failures, hand-offs.
    pub(super) fn drain_completions(&mut self, completions: Vec<Completion>) -> Vec<BlockRef> {
        let mut bad: Vec<BlockRef> = self
            .sync_invalid
            .drain(..)
            .chain(self.handoffs.drain(..))
            .collect();
        for c in completions {
            let Some(r) = self.reqs.get_mut(&c.key) else {
                self.metrics.stale_completions += 1;
                continue;
            };
            if r.phase != Phase::Loading || r.attempt != c.attempt || r.load_done.is_some() {
                self.metrics.stale_completions += 1;
                continue;
            }
            self.metrics.connector_panics += u64::from(c.panicked);
            r.load_done = Some(c.finished_at);
            match c.result {
                LoadResult::Ok => self.metrics.loads_ok += 1,
                LoadResult::Failed(blocks) => {
                    self.metrics.loads_failed += 1;
                    bad.extend(blocks.into_flat());
                }
            }
        }
        bad
    }

    pub(super) fn land_loads(&mut self, now: Instant, plan: &mut StepPlan) {
        let keys: Vec<RequestKey> = self.loading.iter().copied().collect();
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
            self.register_and_trim(key);
            plan.runnable_latency_ns
                .push(now.saturating_duration_since(finished_at).as_nanos() as u64);
            self.set_phase(key, Phase::Running);
        }
    }
}
