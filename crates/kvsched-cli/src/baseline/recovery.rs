//! Sequential recovery from a step's report: every loading and running request with a hit gathered in canonical order and handed to
//! [`recovery::recover`] (ownership from marked sets), and each decision applied — roll-back,
//! pending marks of the claimed blocks (mode `safe`, policy `recompute`), prefix-cache
//! evictions, and the request failed under policy `fail`.

use super::request::Phase;
use super::state::State;
use kvsched::rules::geometry::BlockId;
use kvsched::rules::recovery::{
    self, Decision, Disposition, InvalidSet, Mode, Policy, Request, RequestClass,
};
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::{EndState, RecoveredRequest, StepPlan};

impl State {
    /// Recovers from the step's report `ids` (current blocks only), recording the report,
    /// the decisions and the evicted blocks in `plan`. A reported block keeps its pending
    /// mark until a new owner claims it (as in the runtime's claim table).
    pub(super) fn recover(&mut self, mut ids: Vec<BlockId>, plan: &mut StepPlan) {
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return;
        }
        let invalid = InvalidSet::flat(ids.iter().copied(), &self.geo);
        plan.recovery.report = ids;
        let (keys, requests) = self.requests_with_hits(&invalid);
        let out = recovery::recover(
            &self.geo,
            self.cfg.mode,
            self.cfg.policy,
            &requests,
            &invalid,
        );
        let mut evicted = Vec::new();
        for (i, d) in out.requests.into_iter().enumerate() {
            let (key, class) = keys[i];
            evicted.extend_from_slice(&d.evicted_blocks);
            self.apply_decision(key, class, d, &keys, plan);
        }
        evicted.sort_unstable();
        evicted.dedup();
        plan.recovery.evicted_blocks = evicted;
    }

    /// Gathers, in canonical order (loading requests, then running ones), every request with a
    /// hit in `invalid`: its key and class, and its view for the rules.
    fn requests_with_hits(
        &self,
        invalid: &InvalidSet,
    ) -> (Vec<(RequestKey, RequestClass)>, Vec<Request>) {
        let mut keys = Vec::new();
        let mut requests = Vec::new();
        let mut hits = Vec::new();
        for (set, class) in [
            (&self.loading, RequestClass::Async),
            (&self.running, RequestClass::Sync),
        ] {
            for k in set {
                let Some(r) = self.reqs.get(k) else { continue };
                let scheduled = if class == RequestClass::Sync {
                    r.last_scheduled
                } else {
                    0
                };
                let req = Request {
                    id: r.id.to_string(),
                    class,
                    num_computed_tokens: r.num_computed_tokens,
                    num_scheduled_tokens: scheduled,
                    block_tables: Vec::new(),
                };
                let view = recovery::RequestView {
                    block_tables: &r.tables,
                    ..req.view()
                };
                hits.clear();
                recovery::scan_request(&self.geo, view, invalid, &mut hits);
                if !hits.is_empty() {
                    keys.push((*k, class));
                    requests.push(Request {
                        block_tables: r.tables.clone(),
                        ..req
                    });
                }
            }
        }
        (keys, requests)
    }

    /// Applies the decision `d` of request `key`, owners indexing `keys`, and records it in
    /// `plan`.
    fn apply_decision(
        &mut self,
        key: RequestKey,
        class: RequestClass,
        d: Decision<usize>,
        keys: &[(RequestKey, RequestClass)],
        plan: &mut StepPlan,
    ) {
        self.metrics.claims += d.claimed_blocks.len() as u64;
        self.metrics.tokens_recomputed += d.affected_tokens;
        for &id in &d.evicted_blocks {
            self.blocks.evict(id);
        }
        let safe_recompute = self.cfg.mode == Mode::Safe && self.cfg.policy == Policy::Recompute;
        let Some(r) = self.reqs.get_mut(&key) else {
            return;
        };
        r.waits = d.waits_for.iter().map(|(b, _)| *b).collect();
        r.waits_step = self.step;
        let nct = d.num_computed_tokens;
        match d.disposition {
            Disposition::Unaffected | Disposition::Failed => {}
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
            r.written = r.written.min(r.num_computed_tokens);
            for (reg, grp) in r.registered.iter_mut().zip(self.geo.groups()) {
                *reg = (*reg).min((r.num_computed_tokens / grp.block_size) as usize);
            }
            if safe_recompute {
                for &b in &d.claimed_blocks {
                    self.pending.insert(b, key.raw());
                    if !r.owned_pending.contains(&b) {
                        r.owned_pending.push(b);
                    }
                }
            }
        }
        self.touched.push(key);
        let failed = d.disposition == Disposition::Failed;
        let loading_unlanded = r.phase == Phase::Loading && r.load_done.is_none();
        let id = r.id.clone();
        let decision = Decision {
            disposition: d.disposition,
            num_computed_tokens: d.num_computed_tokens,
            affected_tokens: d.affected_tokens,
            claimed_blocks: d.claimed_blocks,
            waits_for: d
                .waits_for
                .into_iter()
                .map(|(b, o)| {
                    let owner = keys[o].0.with_sync(keys[o].1 == RequestClass::Sync);
                    (b, owner.into())
                })
                .collect(),
            evicted_blocks: d.evicted_blocks,
        };
        let class_key = key.with_sync(class == RequestClass::Sync);
        plan.recovery.recovered.push(RecoveredRequest {
            id,
            key: class_key.into(),
            class,
            decision,
        });
        if failed {
            if loading_unlanded {
                if let Some(r) = self.reqs.get_mut(&key) {
                    r.end_after_load = Some(EndState::Failed);
                }
            } else {
                self.end(key, EndState::Failed);
            }
        }
    }
}
