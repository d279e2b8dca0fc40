//! The sequential engine: every request of a report decided in canonical order
//! (`docs/rules.md#canonical-order`), ownership from marked sets, and the [`Outcome`] assembled
//! from the decisions. The replay tool runs it; the runtime's results are checked against it.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

use crate::rules::geometry::{BlockId, Geometry};
use crate::rules::recovery::trace::{NoTrace, RequestTrace, Trace};
use crate::rules::recovery::{
    decide_traced, scan_request_traced, Decision, Disposition, HitOwner, InvalidSet, Mode, Policy,
    Request, RequestClass,
};

/// A request's result in the sequential engine; owners are request indices (into the input).
pub type RequestOutcome = Decision<usize>;

/// The result of one report (the outcome of `docs/replay.md#outcome-format`, with request
/// indices instead of ids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Per request, in input order.
    pub requests: Vec<RequestOutcome>,
    /// Affected request indices, canonical order.
    pub affected: Vec<usize>,
    /// `recompute` sync affected, canonical order.
    pub skip: Vec<usize>,
    /// `fail` affected, canonical order.
    pub failed: Vec<usize>,
    /// `recompute` async affected, canonical order.
    pub failed_recving: Vec<usize>,
    /// Sum of `affected_tokens`.
    pub total_affected_tokens: u128,
    /// Blocks whose prefix-cache entries were cleared, ascending.
    pub evicted_blocks: Vec<BlockId>,
}

/// Canonical order (`docs/rules.md#canonical-order`): async requests in input order, then sync
/// requests.
pub fn canonical_order(requests: &[Request]) -> Vec<usize> {
    let asyncs = (0..requests.len()).filter(|&i| requests[i].class == RequestClass::Async);
    let syncs = (0..requests.len()).filter(|&i| requests[i].class == RequestClass::Sync);
    asyncs.chain(syncs).collect()
}

/// The sequential engine: applies the rules to `requests` in canonical order, ownership from
/// marked sets (one per scan in mode `vllm`, one for both scans in mode `safe`).
///
/// Requests should have passed [`validate_requests`](super::validate_requests); invalid ones
/// give a defined but meaningless result, never a panic.
pub fn recover(
    geo: &Geometry,
    mode: Mode,
    policy: Policy,
    requests: &[Request],
    invalid: &InvalidSet,
) -> Outcome {
    recover_with::<NoTrace>(geo, mode, policy, requests, invalid).0
}

/// [`recover`], with the reasons of every decision: one [`RequestTrace`] per request, in input
/// order (owners are request indices into the input, as in the [`Outcome`]). The outcome is
/// the one [`recover`] gives: the same engine runs, with a collecting sink.
pub fn recover_explained(
    geo: &Geometry,
    mode: Mode,
    policy: Policy,
    requests: &[Request],
    invalid: &InvalidSet,
) -> (Outcome, Vec<RequestTrace<usize>>) {
    let (outcome, traces) =
        recover_with::<RequestTrace<usize>>(geo, mode, policy, requests, invalid);
    let order = canonical_order(requests);
    let traces = traces
        .into_iter()
        .map(|t| t.map_owners(|pos| order.get(pos).copied().unwrap_or(pos)))
        .collect();
    (outcome, traces)
}

/// The engine, one sink per request (in input order; owners in the traces are canonical
/// positions).
fn recover_with<T: Trace<usize> + Default>(
    geo: &Geometry,
    mode: Mode,
    policy: Policy,
    requests: &[Request],
    invalid: &InvalidSet,
) -> (Outcome, Vec<T>) {
    let mut decisions: Vec<Option<RequestOutcome>> = vec![None; requests.len()];
    let mut traces: Vec<T> = Vec::new();
    if T::ON {
        traces.resize_with(requests.len(), T::default);
    }
    let order = canonical_order(requests);
    // Owners are canonical positions while deciding (so "the least owner" of an id is the
    // earliest in canonical order), mapped back to input indices afterwards.
    let mut marked: FxHashMap<(u32, BlockId), usize> = FxHashMap::default();
    let mut hits = Vec::new();
    let mut owners = Vec::new();
    let mut prev_class = None;
    let mut off = T::default();
    for (pos, &i) in order.iter().enumerate() {
        let req = requests[i].view();
        if mode == Mode::Vllm
            && prev_class == Some(RequestClass::Async)
            && req.class == RequestClass::Sync
        {
            marked.clear(); // the sync scan starts with its own empty marked set
        }
        prev_class = Some(req.class);
        let trace = if T::ON {
            traces.get_mut(i).unwrap_or(&mut off)
        } else {
            &mut off
        };
        hits.clear();
        owners.clear();
        if !invalid.is_empty() || T::ON {
            scan_request_traced(geo, req, invalid, &mut hits, trace);
        }
        owners.extend(hits.iter().map(|h| match marked.get(&(h.group, h.block)) {
            Some(&o) => HitOwner::Other(o),
            None => HitOwner::Mine,
        }));
        for (h, o) in hits.iter().zip(&owners) {
            if let (HitOwner::Mine, Entry::Vacant(e)) = (o, marked.entry((h.group, h.block))) {
                e.insert(pos);
            }
        }
        let mut d = decide_traced(geo, mode, policy, req, &hits, &owners, trace);
        for w in &mut d.waits_for {
            w.1 = order[w.1];
        }
        decisions[i] = Some(d);
    }
    let requests_out: Vec<RequestOutcome> = decisions.into_iter().flatten().collect();
    (outcome_from_decisions(requests, requests_out), traces)
}

/// Assembles an [`Outcome`] from per-request decisions (in input order): the canonical-order
/// lists, the total of affected tokens and the union of applied evictions.
pub fn outcome_from_decisions(requests: &[Request], decisions: Vec<RequestOutcome>) -> Outcome {
    let mut out = Outcome {
        affected: Vec::new(),
        skip: Vec::new(),
        failed: Vec::new(),
        failed_recving: Vec::new(),
        total_affected_tokens: 0,
        evicted_blocks: Vec::new(),
        requests: Vec::new(),
    };
    for i in canonical_order(requests) {
        let Some(d) = decisions.get(i) else { continue };
        out.total_affected_tokens += u128::from(d.affected_tokens);
        match d.disposition {
            Disposition::Unaffected => continue,
            Disposition::FailedRecving => out.failed_recving.push(i),
            Disposition::Skip => out.skip.push(i),
            Disposition::Failed => out.failed.push(i),
        }
        out.affected.push(i);
        out.evicted_blocks.extend_from_slice(&d.evicted_blocks);
    }
    out.evicted_blocks.sort_unstable();
    out.evicted_blocks.dedup();
    out.requests = decisions;
    out
}
