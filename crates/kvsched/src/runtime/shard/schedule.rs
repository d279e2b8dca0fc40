//! Scheduling: the running requests, in canonical order, get tokens within the step's
//! budget; tables grow as they compute, and a request that finds no blocks preempts the
//! latest running one.

use std::time::Instant;

use super::strategy::{Claims, Pool, Strategy};
use super::{
    next_keys, EndState, Env, HolderIndex, Phase, Req, ScheduledRequest, Shard, StepSettings,
};
use crate::rules::geometry::{CacheGroup, GroupKind};
use crate::runtime::claim::RequestKey;
use crate::runtime::policy::alignment::{aligned_chunk, chunk_alignment};
use crate::runtime::policy::growth::blocks_needed;
use crate::runtime::policy::scheduling::{length_capped, preemption_victim, StepBudget};
use crate::runtime::policy::state_ends::written_state;

/// Running keys [`Shard::schedule`] takes from the set at a time.
const KEY_CHUNK: usize = 32;

impl<S: Strategy> Shard<S> {
    /// Makes room in the tables of `r` for `upto` computed tokens; on failure, the blocks the
    /// allocation that failed needed.
    fn grow(
        env: &Env<'_, S>,
        r: &mut Req,
        upto: u64,
        index: &mut HolderIndex,
    ) -> Result<(), usize> {
        let groups = env.geo.groups();
        if !Self::fill_written_entries(env, r, upto, index) {
            return Err(1);
        }
        let need = blocks_needed(groups, r.tables.iter().map(Vec::len), upto);
        if need == 0 {
            return Ok(());
        }
        let mut fresh = Vec::with_capacity(need);
        if !env.pool.allocate_n(need, &mut fresh) {
            return Err(need);
        }
        let mut fresh = fresh.into_iter();
        for (g, grp) in groups.iter().enumerate() {
            while (r.tables[g].len() as u64) < grp.blocks_for_tokens(upto) {
                if let Some(b) = fresh.next() {
                    r.tables[g].push(b.id);
                    r.snapshot = None;
                    index.add(b.id, r.key.seq());
                    r.gens[g].push(b.generation);
                }
            }
        }
        Ok(())
    }

    /// Gives a fresh block to every entry a step computing from the request's length up to
    /// `upto` writes into that is the null block: for a Mamba `align` group the entry its
    /// state goes to, for every other group each entry holding a token of the step. Such an
    /// entry arises where the request was rolled back below entries it never held: a Mamba
    /// entry of an external range that was not loaded (`policy::admission::external_nulls`),
    /// or a sliding window's entries left outside the window by a prefix hit, when a hand-off
    /// rolls a sharer back below its hit. The engine must never write into the null block.
    fn fill_written_entries(
        env: &Env<'_, S>,
        r: &mut Req,
        upto: u64,
        index: &mut HolderIndex,
    ) -> bool {
        let null = env.geo.null_block();
        if planted!("mamba-state-into-null") {
            return true; // the step writes its state into the null block: it is lost
        }
        if !env.geo.may_hold_nulls() {
            return true;
        }
        let from = r.num_computed_tokens;
        for (g, grp) in env.geo.groups().iter().enumerate() {
            // Planted bug (scripts/plants.sh): only Mamba states are given a block, so a
            // sharer rolled back below its prefix hit writes its window into the null block.
            let windows_too = !planted!("window-into-null");
            let written = if let Some(i) = written_state(grp, upto) {
                i..i.saturating_add(1)
            } else if windows_too && upto > from && is_window(grp) {
                // Only a window's entries are left null below its end: a full-attention or
                // Mamba `all` table holds a real block at every entry it has.
                let b = grp.block_size.max(1);
                let first = usize::try_from(from / b).unwrap_or(usize::MAX);
                let end = usize::try_from(upto.div_ceil(b)).unwrap_or(usize::MAX);
                first..end
            } else {
                continue;
            };
            let end = written.end.min(r.tables[g].len());
            for i in written.start..end {
                if r.tables[g][i] != null {
                    continue;
                }
                let mut one = Vec::with_capacity(1);
                if !env.pool.allocate_n(1, &mut one) {
                    return false;
                }
                if let Some(b) = one.pop() {
                    r.tables[g][i] = b.id;
                    r.gens[g][i] = b.generation;
                    r.snapshot = None;
                    index.add(b.id, r.key.seq());
                }
            }
        }
        true
    }

    /// Schedules the running requests in canonical order within the step's budget, and
    /// returns what is left of it (mode `vllm` admits into the step with it, [`super::step_order`]).
    pub(super) fn schedule(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
    ) -> StepBudget {
        let mut budget = StepBudget::new(settings.token_budget, settings.max_seqs);
        let align = chunk_alignment(env.geo);
        // One allocation for the step's list, not one per doubling.
        self.result
            .scheduled
            .reserve(settings.max_seqs.min(self.running.len()));
        // Scheduling never makes a request running: a chunk of the running keys at a time
        // visits each once (one it preempts is met again and skipped).
        let mut keys = std::mem::take(&mut self.key_chunk);
        let mut cursor = None;
        'chunks: loop {
            next_keys(&self.running, cursor, KEY_CHUNK, &mut keys);
            let Some(&last) = keys.last() else {
                break;
            };
            cursor = Some(last);
            for &key in &keys {
                if budget.exhausted() {
                    break 'chunks;
                }
                self.schedule_one(env, settings, now, key, &mut budget, align);
            }
        }
        self.key_chunk = keys;
        budget
    }

    /// Schedules the running request `key` for what `budget` grants it (charged), growing its
    /// tables and preempting the latest running request when the pool is short. Returns
    /// whether it was scheduled.
    pub(super) fn schedule_one(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        key: RequestKey,
        budget: &mut StepBudget,
        align: Option<u64>,
    ) -> bool {
        let seq = key.seq();
        let Some(r) = self.reqs.get_mut(&seq) else {
            return false;
        };
        if r.phase != Phase::Running {
            return false; // preempted earlier in this step
        }
        // Sharers wait for owners (mode `safe`): never scheduled to read a pending block.
        if r.waits_step == self.step && !r.waits.is_empty() {
            return false;
        }
        r.waits.retain(|&b| env.claims.pending_owner(b).is_some());
        if !r.waits.is_empty() {
            return false;
        }
        let granted = budget.grant(r.num_computed_tokens, r.seq_len());
        let prompt_len = r.prompt.len() as u64;
        let n = aligned_chunk(r.num_computed_tokens, granted, prompt_len, align, r.branch);
        self.result.counters.aligned_chunk_tokens += granted - n;
        if n == 0 {
            return false;
        }
        let upto = r.num_computed_tokens + n;
        if length_capped(
            env.geo.groups(),
            r.max_new_tokens,
            upto,
            env.pool.num_blocks(),
        ) {
            // No token limit, and one more token would need more blocks than the pool
            // holds: the request has generated all it ever can.
            self.result.counters.length_capped += 1;
            self.end(env, seq, EndState::Finished);
            return false;
        }
        if Self::grow(env, r, upto, &mut self.index).is_err() {
            // Preempt the latest running request of this shard, if it is not this one and not
            // in this step's plan already. Scheduling in canonical order never meets one that
            // is; mode vllm schedules the requests it admits after the running ones, and
            // releasing a planned request's blocks would hand them to another request of the
            // same plan (the engine then writes both into one block). The request waits for a
            // later step instead.
            let latest = self.running.keys().next_back().copied();
            let step = self.step;
            let planned = |v: &RequestKey| {
                self.reqs
                    .get(&v.seq())
                    .is_some_and(|r| r.scheduled_step == step)
                    && !planted!("preempt-planned")
            };
            if let Some(v) = preemption_victim(latest, key).filter(|v| !planned(v)) {
                self.preempt(env, v.seq());
                self.result.counters.preemptions += 1;
            }
            let Some(r) = self.reqs.get_mut(&seq) else {
                return false;
            };
            if let Err(need) = Self::grow(env, r, upto, &mut self.index) {
                self.result.want(need);
                return false;
            }
        }
        let Some(r) = self.reqs.get_mut(&seq) else {
            return false;
        };
        let first = !r.first_scheduled;
        if first {
            r.first_scheduled = true;
            self.result
                .first_schedule_latency_ns
                .push(now.saturating_duration_since(r.submitted_at).as_nanos() as u64);
        }
        // A sync load runs inside this step: it gets a deadline as an async load does, so
        // a connector that honours it (`TierConnector`) gives up on a hung tier.
        let sync_load = r.sync_job.take().map(|mut job| {
            job.deadline = r
                .load_deadline
                .or(settings.load_deadline)
                .and_then(|d| now.checked_add(d));
            job
        });
        let block_tables = r.block_tables();
        let samples = upto == r.seq_len();
        if samples {
            // What a `SampledAll` answering this step's plan samples.
            self.sampling.push(seq);
        }
        self.result.scheduled.push(ScheduledRequest {
            id: r.id.clone(),
            block_tables,
            key: r.key.into(),
            num_computed_tokens: r.num_computed_tokens,
            num_tokens: n,
            samples,
            sync_load: sync_load.map(Box::new),
            first,
        });
        r.pre_step = r.num_computed_tokens;
        r.num_computed_tokens = upto;
        r.last_scheduled = n;
        r.scheduled_step = self.step;
        self.touched.push(seq);
        budget.charge(n);
        true
    }

    /// The latest running request (by canonical key) holding blocks: the cross-shard
    /// preemption candidate of this shard.
    pub(crate) fn latest_running(&self) -> Option<RequestKey> {
        self.running.keys().next_back().copied()
    }

    pub(super) fn preempt(&mut self, env: &Env<'_, S>, seq: u64) {
        if let Some(r) = self.reqs.get_mut(&seq) {
            Self::release_all(env, r, &mut self.result, &mut self.index);
            r.num_computed_tokens = 0;
            r.last_scheduled = 0;
            // Nothing of its last step is applied once it starts over (a sample the engine
            // kept is counted before: `restart_rounded_down`).
            r.sampled_pending = false;
            r.discard_told = false;
            // A loss of the last step's output ends with it: the restart's first step is not
            // lost. (Planted bug `restart-keeps-lost-output`, scripts/plants.sh: it is, and the
            // request is restarted again, its kept sample asked for once more.)
            if !planted!("restart-keeps-lost-output") {
                r.output_lost = false;
            }
            r.sync_job = None;
            self.set_phase(seq, Phase::Waiting);
        }
    }

    /// Mode `safe`: restarts every running request a mode `vllm` recovery rolled back to its
    /// hit rounded down to `S`, resumable or not (`Req::rounded_down`): its window or Mamba
    /// state there may not exist, and mode `safe` must not run it from there. It starts over
    /// from what the prefix cache holds, as a preempted request does (counted as a
    /// preemption).
    pub(super) fn restart_rounded_down(&mut self, env: &Env<'_, S>) {
        let mut rounded = std::mem::take(&mut self.rounded);
        rounded.sort_unstable();
        rounded.dedup();
        for seq in rounded {
            match self.reqs.get_mut(&seq) {
                Some(r) if r.rounded_down && r.phase == Phase::Running => {
                    // Its last step's output is not decided by this step's recovery: a sample
                    // the engine was told to keep counts before it starts over (and ends it
                    // at its limit). (Planted bug `restart-drops-kept-sample`,
                    // scripts/plants.sh: dropped, the request is asked for it again.)
                    let kept = r.sampled_pending
                        && r.last_scheduled > 0
                        && !r.discard_told
                        && !r.output_lost
                        && !planted!("restart-drops-kept-sample");
                    if kept {
                        r.sampled_pending = false;
                        r.generated += 1;
                        self.result.generated += 1;
                        if r.max_new_tokens > 0 && r.generated >= r.max_new_tokens {
                            self.end(env, seq, EndState::Finished);
                            continue;
                        }
                    }
                    self.preempt(env, seq);
                    self.result.counters.preemptions += 1;
                }
                // Its load still runs: once it lands, a later step restarts it.
                Some(r) if r.rounded_down => self.rounded.push(seq),
                _ => {}
            }
        }
    }
}

/// Whether `grp` is a sliding window, whose entries wholly outside the window are the null
/// block.
fn is_window(grp: &CacheGroup) -> bool {
    matches!(grp.kind, GroupKind::SlidingWindow { .. })
}
