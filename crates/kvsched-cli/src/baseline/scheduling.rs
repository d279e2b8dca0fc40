//! Scheduling the runnable requests of a step, the shard's way
//! ([`kvsched::runtime::policy::scheduling`]): running requests in canonical order get the
//! tokens they have left within the token and sequence budgets, growing their block tables;
//! a request without a token limit that the pool could never hold one more token of is
//! finished; one that finds no blocks preempts the latest running request.

use std::time::Instant;

use super::request::Phase;
use super::state::State;
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::policy::alignment::{aligned_chunk, chunk_alignment};
use kvsched::runtime::policy::growth::blocks_needed;
use kvsched::runtime::policy::scheduling::{length_capped, preemption_victim, StepBudget};
use kvsched::runtime::{EndState, ScheduledRequest, StepPlan};

impl State {
    fn grow(&mut self, key: RequestKey, upto: u64) -> bool {
        let Some(r) = self.reqs.get_mut(&key) else {
            return false;
        };
        let groups = self.geo.groups();
        let need = blocks_needed(groups, r.tables.iter().map(Vec::len), upto);
        if need == 0 {
            return true;
        }
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
        let mut budget = StepBudget::new(self.cfg.token_budget, self.cfg.max_seqs);
        let align = chunk_alignment(&self.geo);
        let keys: Vec<RequestKey> = self.running.iter().copied().collect();
        for key in keys {
            if budget.exhausted() {
                break;
            }
            let step = self.step;
            let pending = &self.pending;
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            if r.phase != Phase::Running {
                continue; // preempted earlier in this loop
            }
            // Sharers wait for owners (mode `safe`): never scheduled to read a pending block.
            if r.waits_step == step && !r.waits.is_empty() {
                continue;
            }
            r.waits.retain(|b| pending.contains_key(b));
            if !r.waits.is_empty() {
                continue;
            }
            let granted = budget.grant(r.num_computed_tokens, r.seq_len());
            let n = aligned_chunk(r.num_computed_tokens, granted, r.prompt.len() as u64, align);
            self.metrics.aligned_chunk_tokens += granted - n;
            if n == 0 {
                continue;
            }
            let upto = r.num_computed_tokens + n;
            if length_capped(
                self.geo.groups(),
                r.max_new_tokens,
                upto,
                self.blocks.ref_count.len(),
            ) {
                self.metrics.length_capped += 1;
                self.end(key, EndState::Finished);
                continue;
            }
            if !self.grow(key, upto) {
                let latest = self.running.last().copied();
                if let Some(victim) = preemption_victim(latest, key) {
                    self.preempt(victim);
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
                        .map(|(&id, &generation)| kvsched::pool::BlockRef { id, generation })
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
            self.touched.push(key);
            budget.charge(n);
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
