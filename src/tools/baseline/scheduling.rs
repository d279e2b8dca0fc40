//! Picking the runnable requests of a step within the token and sequence budgets, growing
//! their block tables, and preempting the last running request when blocks run out.

use std::time::Instant;

use super::request::Phase;
use super::state::State;
use crate::runtime::claim::RequestKey;
use crate::runtime::{ScheduledRequest, StepPlan};

impl State {
    fn grow(&mut self, key: RequestKey, upto: u64) -> bool {
        let Some(r) = self.reqs.get_mut(&key) else {
            return false;
        };
        let groups = self.geo.groups();
        let need: usize = groups
            .iter()
            .zip(&r.tables)
            .map(|(g, t)| (g.blocks_for_tokens(upto) as usize).saturating_sub(t.len()))
            .sum();
        let mut fresh = Vec::with_capacity(need);
        if !self.blocks.allocate_n(need, &mut fresh) {
            return false;
        }
        let mut fresh = fresh.into_iter();
        for (g, grp) in groups.iter().enumerate() {
            while (r.tables[g].len() as u64) < grp.blocks_for_tokens(upto) {
                let Some(b) = fresh.next() else { break };
                r.tables[g].push(b.id);
                r.gens[g].push(b.generation);
            }
        }
        true
    }

    pub(super) fn schedule(&mut self, now: Instant, plan: &mut StepPlan) {
        let mut budget = self.cfg.token_budget;
        let mut seqs_left = self.cfg.max_seqs;
        let keys: Vec<RequestKey> = self.running.iter().copied().collect();
        for key in keys {
            if budget == 0 || seqs_left == 0 {
                break;
            }
            let pending = &self.pending;
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            r.waits.retain(|b| pending.contains_key(b));
            if !r.waits.is_empty() {
                continue;
            }
            let n = r
                .seq_len()
                .saturating_sub(r.num_computed_tokens)
                .min(budget);
            if n == 0 {
                continue;
            }
            let upto = r.num_computed_tokens + n;
            if !self.grow(key, upto) {
                if let Some(&victim) = self.running.last() {
                    if victim != key {
                        self.preempt(victim);
                    }
                }
                if !self.grow(key, upto) {
                    continue;
                }
            }
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            let first = !r.first_scheduled;
            if first {
                r.first_scheduled = true;
                plan.first_schedule_latency_ns
                    .push(now.saturating_duration_since(r.submitted_at).as_nanos() as u64);
            }
            let block_tables = r
                .tables
                .iter()
                .zip(&r.gens)
                .map(|(t, g)| {
                    t.iter()
                        .zip(g)
                        .map(|(&id, &generation)| crate::pool::BlockRef { id, generation })
                        .collect()
                })
                .collect();
            plan.scheduled.push(ScheduledRequest {
                id: r.id.clone(),
                key: key.into(),
                block_tables,
                num_computed_tokens: r.num_computed_tokens,
                num_tokens: n,
                samples: upto == r.seq_len(),
                sync_load: r.sync_job.take(),
                first,
            });
            r.num_computed_tokens = upto;
            r.last_scheduled = n;
            budget -= n;
            seqs_left -= 1;
        }
    }

    fn preempt(&mut self, key: RequestKey) {
        self.release_all(key);
        if let Some(r) = self.reqs.get_mut(&key) {
            r.num_computed_tokens = 0;
            r.last_scheduled = 0;
            self.metrics.preemptions += 1;
        }
        self.set_phase(key, Phase::Waiting);
    }
}
