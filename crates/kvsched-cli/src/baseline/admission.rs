//! Admission of waiting requests, the shard's way: the longest usable local prefix
//! ([`kvsched::runtime::policy::prefix`]), the connector's lookup, how far the external load
//! reaches ([`external_end`]), block allocation and the dispatch of an external load
//! (asynchronous to the workers, or synchronous with the request's first scheduling).

use super::request::Phase;
use super::state::State;
use kvsched::connector::{LoadJob, LookupQuery};
use kvsched::pool::BlockRef;
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::policy::admission::external_end;
use kvsched::runtime::policy::growth::blocks_needed;
use kvsched::runtime::policy::prefix::{prefix_candidates, prefix_cap, prefix_entries};

impl State {
    /// Longest usable local prefix (a multiple of `S` below the prompt's end), referenced:
    /// the first candidate whose every entry is a prefix hit or may be null. Each candidate
    /// takes its hits as it goes and gives them back at its first miss, as a shard does (a
    /// hit revives a cached block, which then gets its second chance in the reclaim order).
    fn local_prefix(&mut self, key: RequestKey) -> (u64, Vec<Vec<BlockRef>>) {
        let groups = self.geo.num_groups();
        let Some(r) = self.reqs.get(&key) else {
            return (0, vec![Vec::new(); groups]);
        };
        let index = &self.blocks.index;
        let cap = prefix_cap(&self.geo, r.prompt.len() as u64, &r.hashes, |h| {
            index.contains_key(&h)
        });
        let hashes = r.hashes.clone();
        let null = BlockRef {
            id: self.geo.null_block(),
            generation: 0,
        };
        for l in prefix_candidates(&self.geo, cap) {
            let mut got: Vec<Vec<BlockRef>> = vec![Vec::new(); groups];
            let mut ok = true;
            'groups: for (g, grp) in self.geo.groups().iter().enumerate() {
                let (nullable, n) = prefix_entries(grp, l);
                for i in 0..n {
                    if i < nullable {
                        got[g].push(null);
                        continue;
                    }
                    match hashes[g].get(i).and_then(|&h| self.blocks.lookup(h)) {
                        Some(b) => got[g].push(b),
                        None => {
                            ok = false;
                            break 'groups;
                        }
                    }
                }
            }
            if ok {
                return (l, got);
            }
            for b in got.into_iter().flatten() {
                if b.id != null.id {
                    self.blocks.release(b);
                }
            }
        }
        (0, vec![Vec::new(); groups])
    }

    /// Admits waiting requests in canonical order, at most `max_seqs` per step: each gets its
    /// local prefix, what the connector offers past it, and fresh blocks for the rest of its
    /// prompt. Stops at the first request the pool cannot hold (it is admitted again next
    /// step).
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
            let ext_end = external_end(&self.geo, len, local, look.external_tokens);
            let need = blocks_needed(self.geo.groups(), got.iter().map(Vec::len), len);
            let mut fresh = Vec::with_capacity(need);
            if !self.blocks.allocate_n(need, &mut fresh) {
                let null = self.geo.null_block();
                for b in got.into_iter().flatten().filter(|b| b.id != null) {
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
            r.written = local;
            r.num_computed_tokens = ext_end;
            if ext_end > local {
                r.attempt += 1;
                r.load_start = local;
                r.load_end = ext_end;
                let block_sizes = self.geo.groups().iter().map(|g| g.block_size).collect();
                let mut job = LoadJob::new(&r.id, &r.prompt, local, ext_end, got, block_sizes);
                job.attempt = r.attempt;
                self.metrics.loads_dispatched += 1;
                if look.load_async {
                    r.load_cap = u64::MAX;
                    self.jobs.push((key, job));
                    self.set_phase(key, Phase::Loading);
                } else {
                    r.sync_job = Some(job);
                    // vLLM's design, as a shard: sync destinations cached at allocation.
                    if self.cfg.mode == kvsched::rules::recovery::Mode::Vllm {
                        self.register_upto(key, Some(ext_end));
                    }
                    self.set_phase(key, Phase::Running);
                }
            } else {
                self.register_and_trim(key);
                self.set_phase(key, Phase::Running);
            }
        }
    }
}
