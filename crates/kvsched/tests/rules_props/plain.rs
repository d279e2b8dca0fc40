//! A plain implementation of mode `vllm` (loops and a `HashSet` marked set per scan), written
//! from docs/rules.md alone, that property (e) compares the library against.

use std::collections::{BTreeSet, HashSet};

use kvsched::rules::geometry::BlockId;
use kvsched::rules::recovery::{Disposition, Outcome, Policy, RequestClass};

use super::case::Case;

#[derive(Debug, PartialEq, Eq)]
pub struct PlainRequest {
    pub disposition: Disposition,
    pub num_computed_tokens: u64,
    pub affected_tokens: u64,
    pub claimed_blocks: Vec<BlockId>,
    pub evicted_blocks: Vec<BlockId>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct PlainOutcome {
    pub requests: Vec<PlainRequest>,
    pub affected: Vec<usize>,
    pub skip: Vec<usize>,
    pub failed: Vec<usize>,
    pub failed_recving: Vec<usize>,
    pub total_affected_tokens: u128,
    pub evicted_blocks: Vec<BlockId>,
}

pub fn plain_vllm(case: &Case, policy: Policy) -> PlainOutcome {
    let n = case.requests.len();
    let s = case.s();
    let null = case.geo.null_block();
    let mut results: Vec<Option<PlainRequest>> = (0..n).map(|_| None).collect();
    let mut all_evicted: BTreeSet<BlockId> = BTreeSet::new();
    let mut out = PlainOutcome {
        requests: Vec::new(),
        affected: Vec::new(),
        skip: Vec::new(),
        failed: Vec::new(),
        failed_recving: Vec::new(),
        total_affected_tokens: 0,
        evicted_blocks: Vec::new(),
    };
    for class in [RequestClass::Async, RequestClass::Sync] {
        let mut marked: HashSet<(usize, BlockId)> = HashSet::new();
        for (r, req) in case.requests.iter().enumerate() {
            if req.class != class {
                continue;
            }
            let p = req.num_computed_tokens - req.num_scheduled_tokens;
            let mut any_hit = false;
            let mut min_new: Option<u64> = None;
            let mut claimed: BTreeSet<BlockId> = BTreeSet::new();
            let mut new_pairs = Vec::new();
            for g in 0..case.geo.num_groups() {
                let b = case.geo.groups()[g].block_size;
                let table = &req.block_tables[g];
                let limit = std::cmp::min(p.div_ceil(b), table.len() as u64) as usize;
                for (i, &id) in table.iter().enumerate().take(limit) {
                    if id == null || !case.reported(g, id) {
                        continue;
                    }
                    any_hit = true;
                    if !marked.contains(&(g, id)) {
                        let pos = i as u64 * b;
                        min_new = Some(min_new.map_or(pos, |m: u64| m.min(pos)));
                        claimed.insert(id);
                        new_pairs.push((g, id));
                    }
                }
            }
            marked.extend(new_pairs);
            let mut res = PlainRequest {
                disposition: Disposition::Unaffected,
                num_computed_tokens: req.num_computed_tokens,
                affected_tokens: 0,
                claimed_blocks: claimed.into_iter().collect(),
                evicted_blocks: Vec::new(),
            };
            if let Some(pos) = min_new {
                let boundary = pos / s * s;
                res.num_computed_tokens = boundary;
                res.affected_tokens = p - boundary;
                if class == RequestClass::Sync && policy == Policy::Fail {
                    let mut ev = BTreeSet::new();
                    for g in 0..case.geo.num_groups() {
                        let b = case.geo.groups()[g].block_size;
                        for (i, &id) in req.block_tables[g].iter().enumerate() {
                            if i as u64 >= boundary / b && id != null {
                                ev.insert(id);
                            }
                        }
                    }
                    all_evicted.extend(ev.iter().copied());
                    res.evicted_blocks = ev.into_iter().collect();
                }
            } else if any_hit {
                res.num_computed_tokens = p;
                res.affected_tokens = req.num_scheduled_tokens;
            }
            if any_hit {
                out.affected.push(r);
                res.disposition = match (policy, class) {
                    (Policy::Fail, _) => {
                        out.failed.push(r);
                        Disposition::Failed
                    }
                    (Policy::Recompute, RequestClass::Async) => {
                        out.failed_recving.push(r);
                        Disposition::FailedRecving
                    }
                    (Policy::Recompute, RequestClass::Sync) => {
                        out.skip.push(r);
                        Disposition::Skip
                    }
                };
            }
            out.total_affected_tokens += u128::from(res.affected_tokens);
            results[r] = Some(res);
        }
    }
    out.requests = results.into_iter().map(Option::unwrap).collect();
    out.evicted_blocks = all_evicted.into_iter().collect();
    out
}

pub fn as_plain(o: &Outcome) -> PlainOutcome {
    PlainOutcome {
        requests: o
            .requests
            .iter()
            .map(|d| {
                assert!(d.waits_for.is_empty(), "mode vllm never waits");
                PlainRequest {
                    disposition: d.disposition,
                    num_computed_tokens: d.num_computed_tokens,
                    affected_tokens: d.affected_tokens,
                    claimed_blocks: d.claimed_blocks.clone(),
                    evicted_blocks: d.evicted_blocks.clone(),
                }
            })
            .collect(),
        affected: o.affected.clone(),
        skip: o.skip.clone(),
        failed: o.failed.clone(),
        failed_recving: o.failed_recving.clone(),
        total_affected_tokens: o.total_affected_tokens,
        evicted_blocks: o.evicted_blocks.clone(),
    }
}
