//! Applying the engine's output for the last step once recovery has decided: sampled tokens,
//! engine finishes, and the progress it confirms (pending marks cleared, full prompt blocks
//! registered in the prefix cache, nullable entries trimmed).

use crate::pool::BlockRef;
use crate::runtime::policy::lost::reoffer_at_pre_step;

use super::strategy::{Claims, Pool, Strategy};
use super::{EndState, Env, HolderIndex, Phase, Req, Shard, ShardStepResult};
use crate::runtime::policy::caching::cacheable;

impl<S: Strategy> Shard<S> {
    /// Applies the engine's output for the last step: sampled tokens (unless recovery
    /// discarded the step), engine finishes, owners' recomputed blocks.
    pub(super) fn apply_outputs(&mut self, env: &Env<'_, S>) {
        let mut seqs = std::mem::take(&mut self.touched);
        seqs.sort_unstable();
        seqs.dedup();
        let mut not_running = Vec::new();
        let mut restart = Vec::new();
        for &seq in &seqs {
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            if r.phase != Phase::Running {
                if r.finish_pending {
                    not_running.push(seq);
                }
                continue;
            }
            // A request the plan scheduled to sample whose sample the output left out (and
            // that the engine did not finish, nor recovery discard): nothing says its part of
            // the step ran, so it is lost as a lost output's is, and offered again — never
            // left with its tokens computed and no sample to come, which no step would
            // schedule again. (Planted bug `missing-sample-kept`, scripts/plants.sh: its
            // progress is confirmed without the sample.)
            if r.samples_last_step()
                && !r.sampled_pending
                && !r.finish_pending
                && !r.skip
                && !r.discard_told
                && !r.output_lost
                && !planted!("missing-sample-kept")
            {
                r.output_lost = true;
                self.result.counters.missing_samples += 1;
            }
            let lost = std::mem::take(&mut r.output_lost);
            // Only a step the request was scheduled in can confirm progress: a request the
            // engine finished (or that got a sample) without running holds nothing new.
            // (Planted bug `register-unwritten`, scripts/plants.sh: any applied output confirms
            // the computed length, a sync load's range never run included.)
            let ran = r.last_scheduled > 0 || planted!("register-unwritten");
            if lost {
                // Nothing of the step is known to have run, or not to have: offer it again
                // where it started if that reads only written, unchanged bytes; otherwise
                // restart from what the prefix cache holds.
                r.sampled_pending = false;
                if reoffer_at_pre_step(env.geo.groups(), r.pre_step, r.last_scheduled, r.written) {
                    r.num_computed_tokens = r.num_computed_tokens.min(r.pre_step);
                } else {
                    restart.push(seq);
                }
            }
            let skip = std::mem::take(&mut r.skip) || lost;
            let told = std::mem::take(&mut r.discard_told);
            let sampled = std::mem::take(&mut r.sampled_pending);
            let finish = std::mem::take(&mut r.finish_pending);
            r.last_scheduled = 0;
            // A sample counts unless the step was discarded — except one the engine was told
            // to keep and so emitted: recovery discards exactly what `update` named, but for
            // the first `safe` step after a live switch from `vllm`, which recovers blocks
            // mode `vllm` cached unwritten in steps whose outputs were kept (what `vllm`
            // computed stays). The request recomputes from where recovery put it, its token
            // kept. (Planted bug `kept-sample-discarded`, scripts/plants.sh: recovery's
            // `skip` drops it, and the request is asked for the same token again.)
            let counted =
                sampled && ran && !lost && (!skip || (!told && !planted!("kept-sample-discarded")));
            if counted {
                r.generated += 1;
                self.result.generated += 1;
            }
            if !skip && ran {
                r.written = r.num_computed_tokens;
                Self::confirm_progress(env, r, &mut self.index, &mut self.result);
            }
            if finish || (counted && r.generated >= r.max_new_tokens && r.max_new_tokens > 0) {
                self.end(env, seq, EndState::Finished);
            }
        }
        // The list goes back empty for the next step's marks, its room kept (unless a mark
        // was made meanwhile, which stays).
        seqs.clear();
        if self.touched.is_empty() {
            self.touched = seqs;
        }
        for seq in restart {
            if self.reqs.contains_key(&seq) {
                self.preempt(env, seq);
                self.result.counters.lost_output_restarts += 1;
            }
        }
        // Engine finishes of requests not running (loading/waiting): applied too.
        for seq in not_running {
            if let Some(r) = self.reqs.get_mut(&seq) {
                r.finish_pending = false;
                // Planted bug for the fault matrix: end a loading request at once, freeing
                // blocks a worker may still be filling.
                if planted!("end-while-loading") {
                    self.end(env, seq, EndState::Finished);
                    continue;
                }
            }
            self.end_when_load_stops(env, seq, EndState::Finished);
        }
    }

    /// The computed length is confirmed (the step ran and was not discarded): clear pending
    /// marks of recomputed owned blocks, hand off the owned blocks it went past without
    /// writing, register full prompt blocks, trim nullable entries.
    ///
    /// An owned block is rewritten once the request has computed past its end — except a
    /// Mamba `align` state, which a step writes only where it ends: a state block whose end
    /// the request passed inside a step (not at its end) will never be written by it, so
    /// it is handed off to the next request holding it, as if its owner had ended (planted
    /// bug `align-pass-clears-mark`: its mark is cleared, and the waiters resume from a state
    /// nobody wrote).
    fn confirm_progress(
        env: &Env<'_, S>,
        r: &mut Req,
        index: &mut HolderIndex,
        res: &mut ShardStepResult,
    ) {
        let nct = r.num_computed_tokens;
        let key = r.key;
        let groups = env.geo.groups();
        let mut passed = Vec::new();
        r.owned_pending.retain(|&id| {
            // Find the block's end in whichever group holds it.
            let mut done = false;
            for (t, grp) in r.tables.iter().zip(groups) {
                let Some(i) = t.iter().position(|&x| x == id) else {
                    continue;
                };
                let end = (i as u64 + 1) * grp.block_size;
                if end > nct {
                    continue;
                }
                if cacheable(grp, i, nct) || planted!("align-pass-clears-mark") {
                    done = true;
                    break;
                } else {
                    passed.push(id);
                    return false;
                }
            }
            if done {
                env.claims.clear_pending(id, key);
            }
            !done
        });
        for id in passed {
            // Read while `r` still holds the block (the trim below may release it).
            let shared = Self::held_by_others(env, r, id);
            env.claims.orphan(id, key);
            match shared {
                Some(b) => {
                    res.handoffs.push(b);
                    res.counters.handoffs += 1;
                }
                None => env.claims.forget(id),
            }
        }
        Self::register_and_trim(env, r, index);
    }

    /// Registers the request's full blocks below what is known written, and trims the entries
    /// its groups no longer need. The one place a block enters the prefix cache: no block is
    /// visible to a lookup before its bytes are known written, whatever ends its writer.
    pub(super) fn register_and_trim(env: &Env<'_, S>, r: &mut Req, index: &mut HolderIndex) {
        let nct = r.written.min(r.num_computed_tokens);
        Self::register_upto(env, r, nct);
        let null = env.geo.null_block();
        for (g, grp) in env.geo.groups().iter().enumerate() {
            let nullable = (grp.nullable_below(nct) as usize).min(r.tables[g].len());
            for i in 0..nullable {
                let id = r.tables[g][i];
                if id != null {
                    Self::release_entry(env, id, r.gens[g][i]);
                    index.remove(id, r.key.seq());
                    r.tables[g][i] = null;
                    r.snapshot = None;
                    r.gens[g][i] = 0;
                }
            }
        }
    }

    /// Registers the request's full blocks below `nct` tokens not registered yet, in their
    /// order, [`REGISTER_BATCH`] to a call of the pool.
    pub(super) fn register_upto(env: &Env<'_, S>, r: &mut Req, nct: u64) {
        let full = |g: usize, block_size: u64| {
            ((nct / block_size) as usize)
                .min(r.hashes[g].len())
                .min(r.tables[g].len())
        };
        // Most calls (a decoding request between block boundaries) find nothing new: leave
        // before filling the batch.
        let groups = env.geo.groups();
        if groups
            .iter()
            .enumerate()
            .all(|(g, grp)| r.registered[g] >= full(g, grp.block_size))
        {
            return;
        }
        let null = env.geo.null_block();
        let mut batch = [(
            0,
            BlockRef {
                id: 0,
                generation: 0,
            },
        ); REGISTER_BATCH];
        let mut len = 0;
        for (g, grp) in groups.iter().enumerate() {
            let full = full(g, grp.block_size);
            while r.registered[g] < full {
                let i = r.registered[g];
                let id = r.tables[g][i];
                let real = crate::runtime::policy::caching::cacheable(grp, i, nct);
                if id != null && real {
                    if len == REGISTER_BATCH {
                        env.pool.register_all(&batch);
                        len = 0;
                    }
                    let generation = r.gens[g][i];
                    batch[len] = (r.hashes[g][i], BlockRef { id, generation });
                    len += 1;
                }
                r.registered[g] += 1;
            }
        }
        env.pool.register_all(&batch[..len]);
    }
}

/// Blocks [`Shard::register_upto`] hands the pool at a time: the pool locks each index shard
/// once per call for the blocks it holds.
const REGISTER_BATCH: usize = 32;
