//! The engine's output: recorded under the lock by `update`, applied at the next step
//! (samples, finishes, recomputed blocks no longer pending).

use super::request::Phase;
use super::state::State;
use crate::runtime::claim::RequestKey;
use crate::runtime::{EndState, StepOutput};

impl State {
    /// Records the engine's output for the last step, to apply at the next: samples and
    /// finishes marked on their requests, failed sync-load blocks kept for the report. Samples
    /// and blocks of an output naming another step are ignored and counted.
    pub(super) fn record_output(&mut self, out: StepOutput) {
        let current = out.step == self.step;
        if !current && (!out.sampled.is_empty() || !out.invalid_blocks.is_empty()) {
            self.metrics.stale_outputs += 1;
        }
        let (sampled, invalid_blocks) = if current {
            (out.sampled, out.invalid_blocks)
        } else {
            (Vec::new(), Vec::new())
        };
        for id in sampled {
            match self
                .by_id
                .get(id.as_str())
                .copied()
                .and_then(|k| self.reqs.get_mut(&k))
            {
                Some(r) if r.phase == Phase::Running && r.last_scheduled > 0 => {
                    r.sampled_pending = true
                }
                _ => self.metrics.unknown_commands += 1,
            }
        }
        for id in out.finished {
            match self
                .by_id
                .get(id.as_str())
                .copied()
                .and_then(|k| self.reqs.get_mut(&k))
            {
                Some(r) => r.finish_pending = true,
                None => self.metrics.unknown_commands += 1,
            }
        }
        let cap = self.blocks.ref_count.len() as u64;
        for b in invalid_blocks {
            if b.id < cap {
                self.sync_invalid.push(b);
            } else {
                self.metrics.stale_blocks += 1;
            }
        }
    }

    pub(super) fn apply_outputs(&mut self) {
        let keys: Vec<RequestKey> = self.running.iter().copied().collect();
        for key in keys {
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            let skip = std::mem::take(&mut r.skip);
            let sampled = std::mem::take(&mut r.sampled_pending);
            let finish = std::mem::take(&mut r.finish_pending);
            r.last_scheduled = 0;
            if !skip {
                r.generated += u32::from(sampled);
                let nct = r.num_computed_tokens;
                let groups = self.geo.groups();
                let pending = &mut self.pending;
                let tables = &r.tables;
                r.owned_pending.retain(|&id| {
                    let done = tables.iter().zip(groups).any(|(t, grp)| {
                        t.iter()
                            .position(|&x| x == id)
                            .is_some_and(|i| (i as u64 + 1) * grp.block_size <= nct)
                    });
                    if done && pending.get(&id) == Some(&key.raw()) {
                        pending.remove(&id);
                    }
                    !done
                });
                self.register_and_trim(key);
            }
            let Some(r) = self.reqs.get(&key) else {
                continue;
            };
            if finish
                || (!skip && sampled && r.max_new_tokens > 0 && r.generated >= r.max_new_tokens)
            {
                self.end(key, EndState::Finished);
            }
        }
        let others: Vec<RequestKey> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.finish_pending && r.phase != Phase::Running)
            .map(|(k, _)| *k)
            .collect();
        for key in others {
            if let Some(r) = self.reqs.get_mut(&key) {
                r.finish_pending = false;
                if r.phase == Phase::Loading && r.load_done.is_none() {
                    r.end_after_load = Some(EndState::Finished);
                    continue;
                }
            }
            self.end(key, EndState::Finished);
        }
    }
}
