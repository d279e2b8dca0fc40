//! How much of a prompt the connector's index holds: the offer a lookup makes, and the keys a
//! probe asks the tier about; and the prompt's chunk keys, derived once at submit.

use std::borrow::Cow;

use super::super::ChunkKey;
use super::TierConnector;
use crate::runtime::policy::state_ends::{state_ends, state_only};

/// A prompt's chunk keys per group, as far as a lookup of it can offer: what the connector
/// prepares when the request is submitted (`KvConnector::prepare`), so that its lookup, inside
/// a step, hashes nothing.
pub(super) struct PromptKeys {
    /// The length of the prompt they were derived from.
    len: usize,
    keys: Vec<Vec<ChunkKey>>,
}

impl TierConnector {
    /// The most a lookup of a prompt of `len` tokens offers: never the whole prompt (its last
    /// token is computed to sample from it), a multiple of `S`.
    pub(super) fn lookup_limit(&self, len: usize) -> u64 {
        (len as u64).saturating_sub(1) / self.s * self.s
    }

    /// `prompt`'s chunk keys per group, up to the lookup limit.
    pub(super) fn prompt_keys(&self, prompt: &[u32]) -> PromptKeys {
        let limit = self.lookup_limit(prompt.len());
        let keys = (0..self.cfg.groups.len())
            .map(|g| {
                let b = self.cfg.groups[g].block_size.max(1);
                // Planted bug (scripts/plants.sh): every group's keys are group 0's.
                let g = if planted!("prompt-keys-one-group") {
                    0
                } else {
                    g
                };
                self.keys(g, prompt, (limit / b) as usize)
            })
            .collect();
        PromptKeys {
            len: prompt.len(),
            keys,
        }
    }

    /// The first `blocks` keys of group `g` of `prompt`: from `prepared` when it holds them,
    /// derived here otherwise.
    fn keys_of<'a>(
        &self,
        prepared: Option<&'a PromptKeys>,
        g: usize,
        prompt: &[u32],
        blocks: usize,
    ) -> Cow<'a, [ChunkKey]> {
        let held = prepared
            .filter(|p| p.len == prompt.len())
            .and_then(|p| p.keys.get(g))
            .and_then(|k| k.get(..blocks));
        match held {
            Some(k) => Cow::Borrowed(k),
            None => Cow::Owned(self.keys(g, prompt, blocks)),
        }
    }

    /// The longest offer from `local` (tokens) up to `limit`, a multiple of `S`, at which
    /// every group's chunks are in the index — every chunk below it for the groups that need
    /// them all, the state at its end for Mamba `align` groups — and the keys a probe should
    /// ask about: per group the keys past its run, and the states the index lacks
    /// past the offer. The keys come from `prepared` when it holds them.
    pub(super) fn held_prefix(
        &self,
        prompt: &[u32],
        prepared: Option<&PromptKeys>,
        local: u64,
        limit: u64,
    ) -> (u64, Vec<Vec<ChunkKey>>) {
        let mut reach = limit;
        let mut runs = Vec::new();
        let mut state_keys = vec![Cow::Borrowed(&[][..]); self.cfg.groups.len()];
        for (g, grp) in self.cfg.groups.iter().enumerate() {
            let b = grp.block_size.max(1);
            let first = (local / b) as usize;
            let keys = self.keys_of(prepared, g, prompt, (limit / b) as usize);
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
