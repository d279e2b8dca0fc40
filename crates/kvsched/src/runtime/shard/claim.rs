//! Claiming and deciding: phase 2 scans the requests that hold a reported block and claims
//! each hit; phase 3 starts by deciding each scanned request with ownership from the claim
//! table.

use crate::rules::geometry::BlockId;
use crate::rules::recovery::{
    self, Decision, Disposition, HitOwner, InvalidSet, Mode, Policy, RequestClass,
};
use crate::runtime::claim::{RequestKey, Scan};
use crate::runtime::order::RequestOrder;

use super::strategy::{Claims, Pool, Strategy};
use super::{EndState, Env, RecoveredRequest, ScannedRequest, Shard, StepSettings};

impl<S: Strategy> Shard<S> {
    /// Phase 2: scans the loading (async) and running (sync) requests that hold a reported
    /// block (found through the holder index) against the step's whole report and claims
    /// each hit. With `record_inputs`, every scannable request's inputs are recorded too, so a
    /// differential check also covers requests the index would have missed.
    pub fn claim(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        report: &InvalidSet,
        report_ids: &[BlockId],
    ) {
        self.hits.clear();
        // Mode safe: every reported block leaves the prefix cache here, in phase 2, which all
        // shards end before any shard admits (phase 3). Mode vllm caches a sync load's
        // destinations at admission, so after a live switch to safe a failed block may still
        // be cached, and a request admitted by a shard deciding before the owner's would hit
        // it unscanned. Each shard evicts its share of the ids (every `shards`-th from its
        // index). (Planted bug `report-evicted-late`: only phase 3's decisions evict.)
        if settings.mode == Mode::Safe && !planted!("report-evicted-late") {
            for &id in report_ids.iter().skip(env.shard).step_by(env.shards.max(1)) {
                env.pool.evict(id);
            }
        }
        if settings.record_inputs {
            for key in self.loading.keys().chain(self.running.keys()) {
                let Some(r) = self.reqs.get(&key.seq()) else {
                    continue;
                };
                let Some(view) = r.view() else { continue };
                self.result.scanned.push(ScannedRequest {
                    id: r.id.clone(),
                    key: r.key.with_sync(view.class == RequestClass::Sync).into(),
                    class: view.class,
                    num_computed_tokens: view.num_computed_tokens,
                    num_scheduled_tokens: view.num_scheduled_tokens,
                    block_tables: r.tables.clone(),
                });
            }
        }
        let mut candidates: Vec<u64> = report_ids
            .iter()
            .flat_map(|&id| self.index.holders(id))
            .copied()
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        for seq in candidates {
            let Some(r) = self.reqs.get(&seq) else {
                continue;
            };
            let Some(view) = r.view() else { continue };
            let mut hits = self.spare_hits.pop().unwrap_or_default();
            hits.clear();
            recovery::scan_request(env.geo, view, report, &mut hits);
            if hits.is_empty() {
                self.spare_hits.push(hits);
                continue;
            }
            let class_key = r.key.with_sync(view.class == RequestClass::Sync);
            let scan = scan_of(settings.mode, view.class);
            for h in &hits {
                env.claims.claim(h.block, scan, class_key);
            }
            self.hits.push((seq, view.class, hits));
        }
    }

    pub(super) fn decide(&mut self, env: &Env<'_, S>, settings: &StepSettings) {
        let hits = std::mem::take(&mut self.hits);
        let mut owners = Vec::new();
        for (seq, class, hits) in &hits {
            let Some(r) = self.reqs.get_mut(seq) else {
                continue;
            };
            let Some(view) = r.view() else { continue };
            let key = r.key.with_sync(*class == RequestClass::Sync);
            let scan = scan_of(settings.mode, *class);
            owners.clear();
            owners.extend(hits.iter().map(|h| match env.claims.winner(h.block, scan) {
                Some(w) if w != key => HitOwner::Other(w),
                _ => HitOwner::Mine,
            }));
            let d = recovery::decide(env.geo, settings.mode, settings.policy, view, hits, &owners);
            self.result.counters.claims += d.claimed_blocks.len() as u64;
            self.result.counters.tokens_recomputed += d.affected_tokens;
            for &id in &d.evicted_blocks {
                env.pool.evict(id);
            }
            self.result.evicted.extend_from_slice(&d.evicted_blocks);
            // A request decided again in mode safe while it waits keeps the waits its new
            // computed length still reads: this report's decision names only this report's
            // blocks. (Mode vllm has no waits: its decisions drop them.) (Planted bug
            // `waits-overwritten`: the earlier waits are dropped, and the request reads a
            // block its owner is still recomputing.)
            let earlier = std::mem::take(&mut r.waits);
            r.waits = d.waits_for.iter().map(|(b, _)| *b).collect();
            if settings.mode == Mode::Safe && !planted!("waits-overwritten") {
                let keep = d.num_computed_tokens.min(r.num_computed_tokens);
                for b in earlier {
                    if !r.waits.contains(&b) && reads_below(env, r, b, keep) {
                        r.waits.push(b);
                    }
                }
            }
            r.waits_step = self.step;
            // A new hit of mode vllm: rolled back to the hit rounded down to `S`, resumable or
            // not (a failed request ends: nothing of it is read again).
            r.rounded_down |= settings.mode == Mode::Vllm
                && !d.claimed_blocks.is_empty()
                && d.disposition != Disposition::Failed;
            if r.rounded_down {
                // Mode safe restarts it (`restart_rounded_down`).
                self.rounded.push(*seq);
            }
            let nct = d.num_computed_tokens;
            match d.disposition {
                Disposition::Unaffected => {}
                Disposition::Failed => {}
                Disposition::FailedRecving => {
                    r.load_cap = r.load_cap.min(nct);
                    r.num_computed_tokens = r.num_computed_tokens.min(nct);
                }
                Disposition::Skip => {
                    r.num_computed_tokens = nct;
                    r.skip = true;
                }
            }
            if d.disposition != Disposition::Failed {
                // Rolled back: entries at or past the boundary are rewritten and registered
                // again once recomputed.
                r.written = r.written.min(r.num_computed_tokens);
                for (reg, grp) in r.registered.iter_mut().zip(env.geo.groups()) {
                    *reg = (*reg).min((r.num_computed_tokens / grp.block_size) as usize);
                }
                if settings.mode == Mode::Safe && settings.policy == Policy::Recompute {
                    for &b in &d.claimed_blocks {
                        env.claims.set_pending(b, r.key);
                        if !r.owned_pending.contains(&b) {
                            r.owned_pending.push(b);
                        }
                    }
                }
            }
            let failed = d.disposition == Disposition::Failed;
            self.touched.push(*seq);
            self.result.recovered.push(RecoveredRequest {
                id: r.id.clone(),
                key: key.into(),
                class: *class,
                decision: public_decision(d),
            });
            if failed {
                self.end_when_load_stops(env, *seq, EndState::Failed);
            }
        }
        self.hits = hits;
        for (_, _, h) in self.hits.drain(..) {
            self.spare_hits.push(h);
        }
        // In a run that stays in mode vllm nothing drains the list: keep it to the requests
        // still rounded down, once each.
        if self.rounded.len() > 2 * self.reqs.len() + 64 {
            let reqs = &self.reqs;
            self.rounded
                .retain(|s| reqs.get(s).is_some_and(|r| r.rounded_down));
            self.rounded.sort_unstable();
            self.rounded.dedup();
        }
    }
}

fn scan_of(mode: Mode, class: RequestClass) -> Scan {
    match (mode, class) {
        (Mode::Vllm, RequestClass::Sync) => Scan::Sync,
        _ => Scan::Async,
    }
}

/// The decision with owners named by their public [`RequestOrder`].
fn public_decision(d: Decision<RequestKey>) -> Decision<RequestOrder> {
    Decision {
        disposition: d.disposition,
        num_computed_tokens: d.num_computed_tokens,
        affected_tokens: d.affected_tokens,
        claimed_blocks: d.claimed_blocks,
        waits_for: d
            .waits_for
            .into_iter()
            .map(|(b, o)| (b, o.into()))
            .collect(),
        evicted_blocks: d.evicted_blocks,
    }
}

/// Whether request `r` holds block `b` in an entry that starts below `upto` tokens (an entry it
/// reads from there on, and does not rewrite).
fn reads_below<S: Strategy>(env: &Env<'_, S>, r: &super::Req, b: BlockId, upto: u64) -> bool {
    r.tables.iter().zip(env.geo.groups()).any(|(t, grp)| {
        t.iter()
            .position(|&x| x == b)
            .is_some_and(|i| (i as u64) * grp.block_size < upto)
    })
}
