//! How much of a prompt the connector's index holds: the offer a lookup makes, and the keys a
//! probe asks the tier about.

use super::super::ChunkKey;
use super::TierConnector;
use crate::runtime::policy::state_ends::{state_ends, state_only};

impl TierConnector {
    /// The longest offer from `local` (tokens) up to `limit`, a multiple of `S`, at which
    /// every group's chunks are in the index — every chunk below it for the groups that need
    /// them all, the state at its end for Mamba `align` groups — and the keys a probe should
    /// ask about: per group the keys past its run, and the states the index lacks
    /// past the offer.
    pub(super) fn held_prefix(
        &self,
        prompt: &[u32],
        local: u64,
        limit: u64,
    ) -> (u64, Vec<Vec<ChunkKey>>) {
        let mut reach = limit;
        let mut runs = Vec::new();
        let mut state_keys = vec![Vec::new(); self.cfg.groups.len()];
        for (g, grp) in self.cfg.groups.iter().enumerate() {
            let b = grp.block_size.max(1);
            let first = (local / b) as usize;
            let keys = self.keys(g, prompt, (limit / b) as usize);
            if state_only(grp) {
                // Mamba `align`: only the state at the offer's end is loaded (below).
                state_keys[g] = keys;
                continue;
            }
            let held = keys
                .iter()
                .skip(first)
                .take_while(|&&k| self.index.contains(k))
                .count();
            reach = reach.min((first + held) as u64 * b);
            if first + held < keys.len() {
                runs.push(keys[first + held..].to_vec());
            }
        }
        // The longest offer at which every Mamba `align` group's state is held.
        let held = |g: usize, i: usize| {
            let key = state_keys.get(g).and_then(|k| k.get(i));
            key.is_some_and(|&k| self.index.contains(k))
        };
        let offer = state_ends(&self.cfg.groups, self.s, reach, held)
            .take_while(|&l| l > local)
            .next()
            .unwrap_or(0);
        for (g, grp) in self.cfg.groups.iter().enumerate() {
            if !state_only(grp) {
                continue;
            }
            let b = grp.block_size.max(1);
            // Every missing state past the offer, not only below the other groups' reach: a
            // fresh index knows no attention run yet.
            let from = (offer.max(local) / b) as usize;
            let keys = state_keys[g].iter().skip(from);
            let missing: Vec<ChunkKey> = keys
                .filter(|&&k| !self.index.contains(k))
                .copied()
                .collect();
            if !missing.is_empty() {
                runs.push(missing);
            }
        }
        (offer, runs)
    }
}
