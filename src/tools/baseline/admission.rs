//! Admission of waiting requests: the longest usable local prefix, the connector's lookup,
//! block allocation and the dispatch of an external load (asynchronous to the workers, or
//! synchronous with the request's first scheduling).

use super::request::Phase;
use super::state::State;
use crate::connector::{CancelToken, LoadJob, LoadOwner, LookupQuery};
use crate::pool::BlockRef;
use crate::rules::geometry::{GroupKind, MambaMode};
use crate::runtime::claim::RequestKey;

impl State {
    /// Longest usable local prefix (a multiple of `S` below the prompt's end), referenced.
    fn local_prefix(&mut self, key: RequestKey) -> (u64, Vec<Vec<BlockRef>>) {
        let groups = self.geo.groups().to_vec();
        let mut got = vec![Vec::new(); groups.len()];
        let Some(r) = self.reqs.get(&key) else {
            return (0, got);
        };
        let mut cap = self
            .geo
            .round_down_to_s((r.prompt.len() as u64).saturating_sub(1));
        for (g, grp) in groups.iter().enumerate() {
            if matches!(
                grp.kind,
                GroupKind::FullAttention
                    | GroupKind::Mamba {
                        mode: MambaMode::All
                    }
            ) {
                let n = r.hashes[g]
                    .iter()
                    .take_while(|h| self.blocks.index.contains_key(h))
                    .count() as u64;
                cap = cap.min(n * grp.block_size);
            }
        }
        let mut l = self.geo.round_down_to_s(cap);
        while l > 0 {
            let ok = groups.iter().enumerate().all(|(g, grp)| {
                let n = (l / grp.block_size) as usize;
                ((grp.nullable_below(l) as usize)..n).all(|i| {
                    r.hashes[g]
                        .get(i)
                        .is_some_and(|h| self.blocks.index.contains_key(h))
                })
            });
            if ok {
                let hashes = r.hashes.clone();
                for (g, grp) in groups.iter().enumerate() {
                    let n = (l / grp.block_size) as usize;
                    let nullable = grp.nullable_below(l) as usize;
                    for (i, &h) in hashes[g].iter().take(n).enumerate() {
                        let b = if i < nullable {
                            None
                        } else {
                            self.blocks.lookup(h)
                        };
                        got[g].push(b.unwrap_or(BlockRef {
                            id: self.geo.null_block(),
                            generation: 0,
                        }));
                    }
                }
                return (l, got);
            }
            l -= self.geo.scheduler_block_size();
        }
        (0, got)
    }

    pub(super) fn admit(&mut self) {
        let keys: Vec<RequestKey> = self
            .waiting
            .iter()
            .take(self.cfg.max_seqs)
            .copied()
            .collect();
        for key in keys {
            let (local, mut got) = self.local_prefix(key);
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            let look = self.cfg.connector.lookup(LookupQuery {
                request: &r.id,
                prompt: &r.prompt,
                local_tokens: local,
            });
            let len = r.prompt.len() as u64;
            let limit = self.geo.round_down_to_s(len.saturating_sub(1));
            let ext_end = self
                .geo
                .round_down_to_s(local.saturating_add(look.external_tokens))
                .clamp(local, limit.max(local));
            let need: usize = self
                .geo
                .groups()
                .iter()
                .zip(&got)
                .map(|(g, t)| (g.blocks_for_tokens(len) as usize).saturating_sub(t.len()))
                .sum();
            let mut fresh = Vec::with_capacity(need);
            if !self.blocks.allocate_n(need, &mut fresh) {
                for b in got.into_iter().flatten() {
                    self.blocks.release(b);
                }
                break;
            }
            let mut fresh = fresh.into_iter();
            for (g, grp) in self.geo.groups().iter().enumerate() {
                while got[g].len() < grp.blocks_for_tokens(len) as usize {
                    got[g].extend(fresh.next());
                }
                r.tables[g] = got[g].iter().map(|b| b.id).collect();
                r.gens[g] = got[g].iter().map(|b| b.generation).collect();
                r.registered[g] = (local / grp.block_size) as usize;
            }
            r.num_computed_tokens = ext_end;
            if ext_end > local {
                r.attempt += 1;
                let job = LoadJob {
                    request: r.id.clone(),
                    tokens: r.prompt.clone(),
                    cancel: CancelToken::new(),
                    fill: None,
                    owner: LoadOwner {
                        shard: 0,
                        key: key.raw(),
                    },
                    attempt: r.attempt,
                    start_tokens: local,
                    end_tokens: ext_end,
                    block_tables: got,
                    block_sizes: self.geo.groups().iter().map(|g| g.block_size).collect(),
                    deadline: None,
                };
                self.metrics.loads_dispatched += 1;
                if look.load_async {
                    r.load_cap = u64::MAX;
                    self.jobs.push(job);
                    self.set_phase(key, Phase::Loading);
                } else {
                    r.sync_job = Some(job);
                    self.set_phase(key, Phase::Running);
                }
            } else {
                self.register_and_trim(key);
                self.set_phase(key, Phase::Running);
            }
        }
    }
}
