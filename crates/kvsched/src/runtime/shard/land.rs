//! Landing async loads: a request whose load completed this step becomes runnable, restarts,
//! or ends; the blocks of a load that passed its deadline are parked first.

use std::time::Instant;

use crate::pool::BlockRef;

use super::strategy::{Claims, Pool, Strategy};
use super::{Env, Phase, Shard};

impl<S: Strategy> Shard<S> {
    /// Loading requests whose load landed this step become runnable (or restart at 0).
    pub(super) fn land_loads(&mut self, env: &Env<'_, S>, now: Instant) {
        let mut seqs = std::mem::take(&mut self.landed);
        seqs.sort_unstable();
        for seq in seqs {
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            if r.phase != Phase::Loading {
                continue;
            }
            let Some((_ok, finished_at)) = r.load_done.take() else {
                continue;
            };
            let holes = if r.timed_out {
                self.park_timed_out(env, seq)
            } else {
                Vec::new()
            };
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            if let Some(state) = r.end_after_load.take() {
                self.end(env, seq, state);
                continue;
            }
            r.num_computed_tokens = r.num_computed_tokens.min(r.load_cap);
            r.load_cap = u64::MAX;
            // Refill the parked positions with fresh blocks (they are recomputed). Planted bugs
            // (scripts/plants.sh): `parked-positions-unfilled`, a request resuming past a local
            // prefix keeps the null block where its timed-out load's blocks were;
            // `restart-fills-holes`, a request starting over takes fresh blocks too, freed at
            // once, which reclaims cached prefixes for nothing.
            let resumes = if planted!("restart-fills-holes") {
                true
            } else {
                r.num_computed_tokens > 0
            };
            if resumes && !holes.is_empty() && !planted!("parked-positions-unfilled") {
                let mut fresh = Vec::with_capacity(holes.len());
                if env.pool.allocate_n(holes.len(), &mut fresh) {
                    for (&(g, i), b) in holes.iter().zip(fresh) {
                        r.tables[g][i] = b.id;
                        r.snapshot = None;
                        r.gens[g][i] = b.generation;
                        self.index.add(b.id, seq);
                    }
                } else {
                    r.num_computed_tokens = 0; // no room: start over
                }
            }
            if r.num_computed_tokens == 0 {
                // Start over: free everything, admit again.
                Self::release_all(env, r, &mut self.result, &mut self.index);
                r.attempt += 1;
                self.set_phase(seq, Phase::Waiting);
                continue;
            }
            // The load landed: its range, capped where recovery found a bad block, is written.
            r.written = r.num_computed_tokens;
            Self::register_and_trim(env, r, &mut self.index);
            self.result
                .runnable_latency_ns
                .push(now.saturating_duration_since(finished_at).as_nanos() as u64);
            self.set_phase(seq, Phase::Running);
        }
    }

    /// Moves the blocks of a timed-out load out of `r`'s tables into the parked set (held
    /// until the late completion lands) and returns the emptied positions.
    fn park_timed_out(&mut self, env: &Env<'_, S>, seq: u64) -> Vec<(usize, usize)> {
        let Some(r) = self.reqs.get_mut(&seq) else {
            return Vec::new();
        };
        r.timed_out = false;
        let null = env.geo.null_block();
        let mut holes = Vec::new();
        let mut parked = Vec::new();
        for (g, grp) in env.geo.groups().iter().enumerate() {
            let lo = (r.load_start / grp.block_size) as usize;
            let hi = (grp.blocks_for_tokens(r.load_end) as usize).min(r.tables[g].len());
            for i in lo..hi {
                let id = r.tables[g][i];
                if id == null {
                    continue;
                }
                self.index.remove(id, seq);
                // Planted bug `parked-claim-mismatched` (scripts/plants.sh): another owned
                // block's claim is dropped, and the parked one is handed off later.
                let mismatched = planted!("parked-claim-mismatched");
                if let Some(p) = r
                    .owned_pending
                    .iter()
                    .position(|&x| (x == id) != mismatched)
                {
                    r.owned_pending.swap_remove(p);
                    env.claims.forget(id);
                }
                parked.push(BlockRef {
                    id,
                    generation: r.gens[g][i],
                });
                r.tables[g][i] = null;
                r.snapshot = None;
                r.gens[g][i] = 0;
                holes.push((g, i));
            }
        }
        if !parked.is_empty() {
            self.parked.insert((seq, r.attempt), parked);
        }
        holes
    }
}
