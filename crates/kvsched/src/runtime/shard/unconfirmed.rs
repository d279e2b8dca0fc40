//! Blocks mode `vllm` entered in the prefix cache before their bytes were known written, kept
//! until a step in mode `safe` can recover everyone holding them.
//!
//! Mode `vllm` registers a sync load's destinations when it admits the loader (vLLM's design,
//! `admit`), so the cache may hold blocks whose load failed, was rolled back or was never
//! answered (a lost output). Mode `safe` never does: a block enters its cache once written
//! (`register_and_trim`). After a live switch to `safe`, what mode `vllm` cached that way is
//! still there, and a request admitted onto it — or holding it already, or re-offered its
//! step over it after a lost output — would read bytes nobody wrote. So each such
//! registration is recorded here, and the first `safe` step publishes every one not yet
//! confirmed in its share of the report: the claim phase drops them from the prefix cache
//! before any shard admits, and every request holding one is recovered as from a failed load.
//!
//! A registration is confirmed once its loader, in the admission that registered it and still
//! holding the block at that generation, has had a step applied that wrote past the block's
//! end (`written`: a later admission's counts its prefix-cache hits, perhaps on this very
//! block, as written); one whose block changed generation names nobody's block any more. A
//! registration the step just answered wrote past is awaited, not published: that answer (a
//! failed load in the report, or the confirmation) is applied in the step that would publish
//! it, after its report is made. Confirmed and stale entries are dropped whenever the
//! entries have doubled since that was last done, so in a run that stays in mode `vllm`
//! they stay below about twice the pool's blocks (or 1,024).

use crate::pool::BlockRef;
use crate::rules::geometry::BlockId;

use super::strategy::{Claims, Pool, Strategy};
use super::{Env, Req, Shard};

/// Below this many entries they are never compacted.
const MIN_COMPACT: usize = 1024;

/// One registration made before its bytes were known written.
#[derive(Clone, Copy, Debug)]
struct Entry {
    block: BlockRef,
    /// The request that registered it, its admission, and where the block is in its tables.
    seq: u64,
    admission: u32,
    group: usize,
    index: usize,
    /// The block's end, in tokens: confirmed once the request's `written` reaches it.
    end: u64,
}

/// The registrations of a shard not known confirmed yet.
#[derive(Debug)]
pub(super) struct Unconfirmed {
    entries: Vec<Entry>,
    compact_at: usize,
}

impl Default for Unconfirmed {
    fn default() -> Self {
        Unconfirmed {
            entries: Vec::new(),
            compact_at: MIN_COMPACT,
        }
    }
}

impl Entry {
    /// Whether the block is known written, or names no block of this generation any more.
    fn settled<S: Strategy>(&self, env: &Env<'_, S>, r: Option<&Req>) -> bool {
        !env.pool.is_current(self.block) || r.is_some_and(|r| self.mine(r) && r.written >= self.end)
    }

    /// Whether the step just answered writes past the block: its output, applied in this
    /// step's phase 3 (after the report is published), confirms it or reports it failed.
    fn awaited(&self, r: Option<&Req>) -> bool {
        r.is_some_and(|r| {
            self.mine(r)
                && r.last_scheduled > 0
                && !r.output_lost
                && r.num_computed_tokens >= self.end
        })
    }

    /// Whether `r` is the admission that registered the block and still holds it there: a
    /// later admission's `written` counts its prefix-cache hits, perhaps on this very block,
    /// unwritten.
    fn mine(&self, r: &Req) -> bool {
        r.admissions == self.admission
            && r.tables.get(self.group).and_then(|t| t.get(self.index)) == Some(&self.block.id)
            && r.gens.get(self.group).and_then(|g| g.get(self.index))
                == Some(&self.block.generation)
    }
}

impl<S: Strategy> Shard<S> {
    /// Records the registrations `register_upto` just made for request `seq` (`r`): its
    /// entries from `before` (per group, the entries registered until now) on.
    pub(super) fn record_unconfirmed(&mut self, env: &Env<'_, S>, seq: u64, before: &[usize]) {
        let Some(r) = self.reqs.get(&seq) else {
            return;
        };
        let null = env.geo.null_block();
        for (g, grp) in env.geo.groups().iter().enumerate() {
            let from = before.get(g).copied().unwrap_or(0);
            let to = r.registered.get(g).copied().unwrap_or(0);
            for index in from..to {
                let (Some(&id), Some(&generation)) = (r.tables[g].get(index), r.gens[g].get(index))
                else {
                    continue;
                };
                if id != null {
                    self.unconfirmed.entries.push(Entry {
                        block: BlockRef { id, generation },
                        seq,
                        admission: r.admissions,
                        group: g,
                        index,
                        end: (index as u64 + 1) * grp.block_size,
                    });
                }
            }
        }
        if self.unconfirmed.entries.len() >= self.unconfirmed.compact_at {
            let reqs = &self.reqs;
            self.unconfirmed
                .entries
                .retain(|e| !e.settled(env, reqs.get(&e.seq)));
            self.unconfirmed.compact_at = (self.unconfirmed.entries.len() * 2).max(MIN_COMPACT);
        }
    }

    /// Mode `safe`: adds every unsettled registration to `published` (this shard's share of
    /// the report) and forgets it — but those the step just answered wrote past, whose
    /// outcome this step applies (kept for the next). Planted bug `unconfirmed-kept-cached`:
    /// nothing is published, so what mode `vllm` cached unwritten survives a switch to
    /// `safe`.
    pub(super) fn publish_unconfirmed(&mut self, env: &Env<'_, S>, published: &mut Vec<BlockId>) {
        if self.unconfirmed.entries.is_empty() || planted!("unconfirmed-kept-cached") {
            return;
        }
        let reqs = &self.reqs;
        self.unconfirmed.entries.retain(|e| {
            let r = reqs.get(&e.seq);
            // A block with a pending mark is in mode safe's recovery already: an owner
            // recomputes it (registering it once written) and its sharers wait; reporting it
            // again would reset that claim and make a second owner.
            if e.settled(env, r) || env.claims.pending_owner(e.block.id).is_some() {
                return false;
            }
            if e.awaited(r) {
                return true;
            }
            published.push(e.block.id);
            false
        });
    }
}
