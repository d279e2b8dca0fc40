//! Ending requests and releasing what they hold: blocks back to the pool, owned blocks
//! handed off; at shutdown, every request cancelled and the blocks of loads still running
//! held for good. Also the blocks held, for invariant checks.

use crate::pool::{BlockRef, Generation};
use crate::rules::geometry::BlockId;

use super::strategy::{Claims, Pool, Strategy};
use super::{EndState, Env, HolderIndex, Phase, Req, Shard, ShardStepResult};

impl<S: Strategy> Shard<S> {
    pub(super) fn release_entry(env: &Env<'_, S>, id: BlockId, gen: Generation) {
        if id != env.geo.null_block() {
            let _ = env.pool.release(BlockRef {
                id,
                generation: gen,
            });
        }
    }

    /// Releases every block of `r` and hands off the blocks it owned but did not recompute.
    pub(super) fn release_all(
        env: &Env<'_, S>,
        r: &mut Req,
        res: &mut ShardStepResult,
        index: &mut HolderIndex,
    ) {
        let key = r.key;
        let null = env.geo.null_block();
        // Which owned blocks another request still holds, read while this one still holds
        // its own reference: once released, a block nobody else holds is free, and in a
        // parallel step another shard can allocate it before a count read after the release,
        // taking an unrelated request's fresh block for a sharer's.
        let shared: Vec<Option<BlockRef>> = r
            .owned_pending
            .iter()
            .map(|&id| Self::held_by_others(env, r, id))
            .collect();
        for &id in r.tables.iter().flatten() {
            if id != null {
                index.remove(id, key.seq());
            }
        }
        r.sync_job = None;
        r.snapshot = None;
        for (t, g) in r.tables.iter_mut().zip(r.gens.iter_mut()) {
            env.pool.release_table(t, g, null);
            t.clear();
            g.clear();
        }
        // Owned blocks it did not recompute pass to the next waiter — a hand-off only when
        // another request still holds the block; one nobody holds is simply forgotten.
        for (id, shared) in r.owned_pending.drain(..).zip(shared) {
            env.claims.orphan(id, key);
            // Planted bug `handoff-count-after-release` (scripts/plants.sh): the count is read
            // after the release, when another shard may already hold the freed block.
            let shared = if planted!("handoff-count-after-release") {
                env.pool
                    .generation(id)
                    .filter(|_| env.pool.ref_count(id) > 0)
                    .map(|generation| BlockRef { id, generation })
            } else {
                shared
            };
            match shared {
                Some(b) => {
                    res.handoffs.push(b);
                    res.counters.handoffs += 1;
                }
                None => env.claims.forget(id),
            }
        }
        for reg in &mut r.registered {
            *reg = 0;
        }
        r.written = 0;
        r.waits.clear();
        r.rounded_down = false;
    }

    /// Block `id` at its current generation if a request other than `r` holds it: its count
    /// is above the references `r` itself holds (read before `r` releases them).
    ///
    /// In a parallel step a sharer on another shard may let go of the block between this read
    /// and `r`'s release. The hand-off then names a block nobody holds: the next report
    /// carries one block that no request's table hits, so it rolls nothing back and costs a
    /// claim reset. It cannot name a block another request was given since: `r` still holds
    /// its references here, so the block is not free, and the engine's share of the next
    /// report drops it if its generation moved.
    pub(super) fn held_by_others(env: &Env<'_, S>, r: &Req, id: BlockId) -> Option<BlockRef> {
        let own = r.tables.iter().flatten().filter(|&&x| x == id).count();
        let others = (env.pool.ref_count(id) as usize).saturating_sub(own);
        env.pool
            .generation(id)
            .filter(|_| others > 0)
            .map(|generation| BlockRef { id, generation })
    }

    /// Ends `seq` now if no load of it can still write its blocks (none in flight, or the one
    /// in flight never started and is dropped), otherwise once its load lands.
    pub(super) fn end_when_load_stops(&mut self, env: &Env<'_, S>, seq: u64, state: EndState) {
        let Some(r) = self.reqs.get_mut(&seq) else {
            return;
        };
        if r.load_may_be_running() {
            if !r.drop_load() {
                r.end_after_load = Some(state);
                return;
            }
            // Dropped before any worker took it: its destinations are no longer its own.
            Self::end_fills(env, r);
            self.result.counters.loads_dropped_unstarted += 1;
            env.estimate.returned();
        }
        self.end(env, seq, state);
    }

    pub(super) fn end(&mut self, env: &Env<'_, S>, seq: u64, state: EndState) {
        if let Some(mut r) = self.reqs.remove(&seq) {
            self.waiting.remove(&r.key);
            self.loading.remove(&r.key);
            self.running.remove(&r.key);
            self.by_id.remove(&r.id);
            Self::release_all(env, &mut r, &mut self.result, &mut self.index);
            self.result.ended.push((r.id.clone(), state));
        }
    }

    /// Fires the cancellation token of every load in flight (shutdown).
    pub fn cancel_loads(&mut self) {
        // Planted bug `shutdown-leaves-loads-running` (scripts/plants.sh): no token fires, and
        // shutdown waits out every running load.
        if planted!("shutdown-leaves-loads-running") {
            return;
        }
        for r in self.reqs.values_mut() {
            r.cancel_load();
        }
    }

    /// Ends every request (shutdown): loading ones only once their load is known finished by
    /// the caller. Returns how many were cancelled.
    pub fn cancel_all(
        &mut self,
        env: &Env<'_, S>,
        workers_finished: bool,
        never_started: &rustc_hash::FxHashSet<(u64, u32)>,
    ) -> ShardStepResult {
        self.result = ShardStepResult::default();
        // Once every worker finished no load can still write into parked blocks; otherwise a
        // parked (timed-out) load may still be running: its blocks stay held.
        for ((seq, attempt), blocks) in self.parked.drain() {
            if workers_finished || never_started.contains(&(seq, attempt)) {
                for b in blocks {
                    let _ = env.pool.end_fill(b);
                    let _ = env.pool.release(b);
                }
            } else {
                self.result.counters.loads_abandoned += 1;
                self.abandoned.extend(blocks);
            }
        }
        self.deadlines.clear();
        if !workers_finished {
            // Loads still in flight: take their blocks out of the requests before ending them.
            let in_flight: Vec<u64> = self
                .reqs
                .iter()
                .filter(|(seq, r)| {
                    // A load that timed out but has not been parked yet may still be running.
                    r.phase == Phase::Loading
                        && (r.load_done.is_none() || r.timed_out)
                        && !never_started.contains(&(**seq, r.attempt))
                })
                .map(|(seq, _)| *seq)
                .collect();
            let null = env.geo.null_block();
            for seq in in_flight {
                let Some(r) = self.reqs.get_mut(&seq) else {
                    continue;
                };
                r.snapshot = None;
                for (t, g) in r.tables.iter_mut().zip(r.gens.iter_mut()) {
                    for (id, gen) in t.iter_mut().zip(g.iter_mut()) {
                        if *id != null {
                            self.index.remove(*id, seq);
                            self.abandoned.push(BlockRef {
                                id: *id,
                                generation: *gen,
                            });
                            *id = null;
                        }
                    }
                }
                self.result.counters.loads_abandoned += 1;
            }
        }
        // What is left of loading requests' loads has finished or never ran (the blocks of
        // loads still running were taken out above): their bytes are no longer the loads'.
        for r in self.reqs.values_mut() {
            r.cancel_load();
            if r.phase == Phase::Loading {
                Self::end_fills(env, r);
            }
        }
        let seqs: Vec<u64> = self.reqs.keys().copied().collect();
        for seq in seqs {
            self.end(env, seq, EndState::Cancelled);
        }
        std::mem::take(&mut self.result)
    }

    /// Ids of the blocks of loads abandoned at shutdown (held for good; a detached worker may
    /// still write them), with repeats when several references were held.
    pub fn abandoned_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.abandoned.iter().map(|b| b.id)
    }

    /// Blocks each live request holds a reference on, for invariant checks.
    pub fn held_blocks(&self, null: BlockId) -> Vec<BlockId> {
        self.parked
            .values()
            .flatten()
            .chain(&self.abandoned)
            .map(|b| b.id)
            .chain(self.held_by_requests(null))
            .collect()
    }

    fn held_by_requests(&self, null: BlockId) -> Vec<BlockId> {
        self.reqs
            .values()
            .flat_map(|r| {
                r.tables
                    .iter()
                    .flatten()
                    .copied()
                    .filter(move |&id| id != null)
            })
            .collect()
    }
}
