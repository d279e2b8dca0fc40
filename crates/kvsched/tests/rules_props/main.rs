//! Property tests of the recovery rules (docs/rules.md, modes `vllm` and `safe`) on random geometries, requests and
//! reports.
//!
//! Everything the properties compare against — the scan, the marked sets, the resume check,
//! the plain mode-`vllm` implementation — is written here again from the text of docs/rules.md, sharing
//! no code with `src/` beyond the public input and output types.

mod case;
mod model;
mod plain;
mod strategies;

use std::collections::{BTreeSet, HashMap};

use kvsched::rules::geometry::{BlockId, GroupKind};
use kvsched::rules::recovery::trace::{BoundaryRule, Unusable};
use kvsched::rules::recovery::{
    recover, recover_explained, Disposition, HitOwner, Mode, Policy, RequestClass,
};
use proptest::prelude::*;

use case::{Case, MODES, POLICIES};
use model::{can_resume, hits_of, min_new_pos, non_null_from, ownership};
use plain::{as_plain, plain_vllm};
use strategies::{case_strategy, config};

// ---------------------------------------------------------------------------------------------
// properties

/// (a) Every boundary of a request with a new hit is a multiple of `S` and at most `P`; a
/// request with only old hits returns to `P` in mode `vllm`, and in mode `safe` to `P` or, when
/// some group cannot resume there, to a multiple of `S` below it (its step discarded too).
fn check_boundaries(case: &Case) -> Result<(), TestCaseError> {
    let s = case.s();
    for mode in MODES {
        let own = ownership(case, mode);
        for policy in POLICIES {
            let out = case.run(mode, policy);
            for (r, d) in out.requests.iter().enumerate() {
                let p = case.p(r);
                let ctx = format!("{mode:?}/{policy:?} request {r}");
                if min_new_pos(&own[r], r).is_some() {
                    prop_assert_eq!(d.num_computed_tokens % s, 0, "{}", ctx);
                    prop_assert!(d.num_computed_tokens <= p, "{}", ctx);
                    prop_assert_eq!(d.affected_tokens, p - d.num_computed_tokens, "{}", ctx);
                } else if !own[r].is_empty() {
                    let q = &case.requests[r];
                    let nct = d.num_computed_tokens;
                    if mode == Mode::Vllm || nct == p {
                        prop_assert_eq!(nct, p, "{}", ctx);
                    } else {
                        prop_assert!(nct % s == 0 && nct < p, "{}", ctx);
                    }
                    prop_assert_eq!(
                        d.affected_tokens,
                        q.num_scheduled_tokens + (p - nct),
                        "{}",
                        ctx
                    );
                }
            }
        }
    }
    Ok(())
}

/// (b) Per marked set, each reported (group, id) found in some scan range is claimed by
/// exactly one request: the first in canonical order whose range holds it.
fn check_one_claim(case: &Case) -> Result<(), TestCaseError> {
    for mode in MODES {
        let own = ownership(case, mode);
        for policy in POLICIES {
            let out = case.run(mode, policy);
            for (r, d) in out.requests.iter().enumerate() {
                let expect: BTreeSet<BlockId> = own[r]
                    .iter()
                    .filter(|(_, o)| *o == r)
                    .map(|(h, _)| h.id)
                    .collect();
                let expect: Vec<BlockId> = expect.into_iter().collect();
                prop_assert_eq!(&d.claimed_blocks, &expect, "{:?} request {}", mode, r);
            }
            // Directly: per marked set, the number of claimants of each (group, id).
            let sets: Vec<Vec<usize>> = match mode {
                Mode::Safe => vec![case.canonical()],
                Mode::Vllm => [RequestClass::Async, RequestClass::Sync]
                    .iter()
                    .map(|&c| {
                        case.canonical()
                            .into_iter()
                            .filter(|&r| case.requests[r].class == c)
                            .collect()
                    })
                    .collect(),
            };
            for set in sets {
                let mut in_range: HashMap<(usize, BlockId), Vec<usize>> = HashMap::new();
                for &r in &set {
                    for h in hits_of(case, r) {
                        let v = in_range.entry((h.g, h.id)).or_default();
                        if !v.contains(&r) {
                            v.push(r);
                        }
                    }
                }
                for ((g, id), holders) in in_range {
                    let claimants: Vec<usize> = holders
                        .iter()
                        .copied()
                        .filter(|&r| out.requests[r].claimed_blocks.contains(&id))
                        .collect();
                    prop_assert!(
                        claimants.contains(&holders[0]),
                        "{:?}: ({}, {}) not claimed by its first holder",
                        mode,
                        g,
                        id
                    );
                    if case.unique_ids {
                        prop_assert_eq!(claimants.len(), 1, "{:?}: ({}, {})", mode, g, id);
                    }
                }
            }
        }
    }
    Ok(())
}

/// (c) The null block is never claimed, evicted or waited for.
fn check_null(case: &Case) -> Result<(), TestCaseError> {
    let null = case.geo.null_block();
    for mode in MODES {
        for policy in POLICIES {
            let out = case.run(mode, policy);
            prop_assert!(!out.evicted_blocks.contains(&null));
            for d in &out.requests {
                prop_assert!(!d.claimed_blocks.contains(&null));
                prop_assert!(!d.evicted_blocks.contains(&null));
                prop_assert!(d.waits_for.iter().all(|&(b, _)| b != null));
            }
        }
    }
    Ok(())
}

/// (d) Mode `safe`: the boundary is the largest multiple of `S` at or below the earliest new
/// hit from which every group can resume (else 0); a request with only old hits returns to
/// `P` if every group can resume there, else to the largest such multiple of `S` below `P`;
/// `waits_for` holds exactly the old hits starting below the new computed length, one per id;
/// evictions are every non-null entry at or past the boundary of each affected request.
fn check_safe(case: &Case) -> Result<(), TestCaseError> {
    let s = case.s();
    let own = ownership(case, Mode::Safe);
    for policy in POLICIES {
        let out = case.run(Mode::Safe, policy);
        let mut evicted_union = BTreeSet::new();
        for (r, d) in out.requests.iter().enumerate() {
            let nct = d.num_computed_tokens;
            let min_new = min_new_pos(&own[r], r);
            if let Some(earliest) = min_new {
                prop_assert_eq!(nct % s, 0);
                prop_assert!(nct <= earliest, "request {}: {} > {}", r, nct, earliest);
                prop_assert!(
                    can_resume(case, r, &own[r], nct),
                    "request {}: cannot resume at {}",
                    r,
                    nct
                );
                let mut c = nct + s;
                while c <= earliest {
                    prop_assert!(
                        !can_resume(case, r, &own[r], c),
                        "request {}: {} chosen but {} resumable",
                        r,
                        nct,
                        c
                    );
                    c += s;
                }
            } else if !own[r].is_empty() {
                // Only old hits.
                let p = case.p(r);
                if can_resume(case, r, &own[r], p) {
                    prop_assert_eq!(nct, p, "request {}", r);
                } else {
                    prop_assert_eq!(nct % s, 0);
                    prop_assert!(nct < p && can_resume(case, r, &own[r], nct));
                    let mut c = nct + s;
                    while c <= p {
                        prop_assert!(
                            !can_resume(case, r, &own[r], c),
                            "request {}: {} chosen but {} resumable",
                            r,
                            nct,
                            c
                        );
                        c += s;
                    }
                }
            }
            if own[r].is_empty() {
                prop_assert!(d.evicted_blocks.is_empty());
            } else {
                let ev = non_null_from(case, r, nct);
                evicted_union.extend(ev.iter().copied());
                prop_assert_eq!(&d.evicted_blocks, &ev.into_iter().collect::<Vec<_>>());
            }
            let mut waits: Vec<(BlockId, usize)> = Vec::new();
            if policy == Policy::Recompute {
                // One entry per (id, owner): every owner of an id is waited for, ascending by
                // id, then by the owner's canonical order.
                let rank: HashMap<usize, usize> = case
                    .canonical()
                    .into_iter()
                    .enumerate()
                    .map(|(pos, i)| (i, pos))
                    .collect();
                let pairs: BTreeSet<(BlockId, usize, usize)> = own[r]
                    .iter()
                    .filter(|&&(h, o)| o != r && h.pos < nct)
                    .map(|&(h, o)| (h.id, rank[&o], o))
                    .collect();
                waits = pairs.into_iter().map(|(id, _, o)| (id, o)).collect();
            }
            prop_assert_eq!(&d.waits_for, &waits, "request {}", r);
        }
        prop_assert_eq!(
            out.evicted_blocks,
            evicted_union.into_iter().collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// (e) Mode `vllm` equals the plain implementation above.
fn check_plain_vllm(case: &Case) -> Result<(), TestCaseError> {
    for policy in POLICIES {
        let got = as_plain(&case.run(Mode::Vllm, policy));
        let want = plain_vllm(case, policy);
        prop_assert_eq!(got, want, "{:?}", policy);
    }
    Ok(())
}

/// (f) Unaffected requests keep their computed length and have 0 affected tokens; affected
/// ones land in exactly the list their class and the policy say; the total is the sum.
fn check_unaffected(case: &Case) -> Result<(), TestCaseError> {
    for mode in MODES {
        for policy in POLICIES {
            let out = case.run(mode, policy);
            let mut affected = Vec::new();
            for r in case.canonical() {
                let d = &out.requests[r];
                let q = &case.requests[r];
                let has_hit = !hits_of(case, r).is_empty();
                if !has_hit {
                    prop_assert_eq!(d.disposition, Disposition::Unaffected);
                    prop_assert_eq!(d.num_computed_tokens, q.num_computed_tokens);
                    prop_assert_eq!(d.affected_tokens, 0);
                    prop_assert!(d.claimed_blocks.is_empty() && d.waits_for.is_empty());
                    prop_assert!(d.evicted_blocks.is_empty());
                    continue;
                }
                affected.push(r);
                let want = match (policy, q.class) {
                    (Policy::Fail, _) => Disposition::Failed,
                    (Policy::Recompute, RequestClass::Async) => Disposition::FailedRecving,
                    (Policy::Recompute, RequestClass::Sync) => Disposition::Skip,
                };
                prop_assert_eq!(d.disposition, want);
            }
            prop_assert_eq!(&out.affected, &affected);
            let of = |disp: Disposition| -> Vec<usize> {
                affected
                    .iter()
                    .copied()
                    .filter(|&r| out.requests[r].disposition == disp)
                    .collect()
            };
            prop_assert_eq!(&out.skip, &of(Disposition::Skip));
            prop_assert_eq!(&out.failed, &of(Disposition::Failed));
            prop_assert_eq!(&out.failed_recving, &of(Disposition::FailedRecving));
            let sum: u128 = out
                .requests
                .iter()
                .map(|d| u128::from(d.affected_tokens))
                .sum();
            prop_assert_eq!(out.total_affected_tokens, sum);
        }
    }
    Ok(())
}

/// (g) With one scan class (same ownership in both modes), mode `safe`'s boundary is at or
/// below mode `vllm`'s, and the claims are the same.
fn check_safe_below_vllm(case: &Case) -> Result<(), TestCaseError> {
    for policy in POLICIES {
        let v = case.run(Mode::Vllm, policy);
        let s = case.run(Mode::Safe, policy);
        for (r, (dv, ds)) in v.requests.iter().zip(&s.requests).enumerate() {
            prop_assert!(
                ds.num_computed_tokens <= dv.num_computed_tokens,
                "request {}: safe {} > vllm {}",
                r,
                ds.num_computed_tokens,
                dv.num_computed_tokens
            );
            prop_assert_eq!(&ds.claimed_blocks, &dv.claimed_blocks);
        }
    }
    Ok(())
}

/// (h) The explanation is the decision's own: `recover_explained` gives `recover`'s outcome,
/// and its traces agree with the model above — scan ranges, hits and their owners, the chosen
/// boundary and its rule, in mode `safe` every candidate between the boundary and the first
/// one rejected by a group that really lacks the entry it names, and the wait edges.
fn check_explained(case: &Case) -> Result<(), TestCaseError> {
    let s = case.s();
    let null = case.geo.null_block();
    for mode in MODES {
        let own = ownership(case, mode);
        for policy in POLICIES {
            let invalid = case.invalid_set();
            let plain = recover(&case.geo, mode, policy, &case.requests, &invalid);
            let (out, traces) =
                recover_explained(&case.geo, mode, policy, &case.requests, &invalid);
            prop_assert_eq!(&out, &plain);
            prop_assert_eq!(traces.len(), case.requests.len());
            for (r, (d, t)) in out.requests.iter().zip(&traces).enumerate() {
                let ctx = format!("{mode:?}/{policy:?} request {r}");
                let q = &case.requests[r];
                let p = case.p(r);
                let ranges: Vec<(usize, usize)> = case
                    .geo
                    .groups()
                    .iter()
                    .enumerate()
                    .map(|(g, grp)| {
                        let n = p
                            .div_ceil(grp.block_size)
                            .min(q.block_tables[g].len() as u64);
                        (g, n as usize)
                    })
                    .collect();
                let got: Vec<(usize, usize)> =
                    t.scan.iter().map(|x| (x.group, x.entries)).collect();
                prop_assert_eq!(got, ranges, "{}", ctx);
                let hits: Vec<(usize, usize, BlockId, u64, usize)> = t
                    .hits
                    .iter()
                    .map(|(h, o)| {
                        let owner = match o {
                            HitOwner::Mine => r,
                            HitOwner::Other(o) => *o,
                        };
                        (
                            h.group as usize,
                            h.index as usize,
                            h.block,
                            h.position,
                            owner,
                        )
                    })
                    .collect();
                let want: Vec<(usize, usize, BlockId, u64, usize)> = own[r]
                    .iter()
                    .map(|(h, o)| (h.g, h.idx, h.id, h.pos, *o))
                    .collect();
                prop_assert_eq!(hits, want, "{}", ctx);
                let (boundary, rule) = t.chosen.expect("every request has a chosen boundary");
                prop_assert_eq!(boundary, d.num_computed_tokens, "{}", ctx);
                let earliest = min_new_pos(&own[r], r);
                match (earliest, mode) {
                    (None, _) if own[r].is_empty() => prop_assert_eq!(rule, BoundaryRule::NoHit),
                    (None, Mode::Safe) if boundary != case.p(r) => prop_assert_eq!(
                        rule,
                        BoundaryRule::SafeOldHitsResumable {
                            pre_step: case.p(r)
                        }
                    ),
                    (None, _) => prop_assert_eq!(rule, BoundaryRule::OldHitsOnly),
                    (Some(e), Mode::Vllm) => {
                        prop_assert_eq!(rule, BoundaryRule::VllmRoundDown { earliest_new: e })
                    }
                    (Some(e), Mode::Safe) => {
                        prop_assert_eq!(rule, BoundaryRule::SafeResumable { earliest_new: e });
                        let c = t.candidates.expect("safe with a new hit has candidates");
                        prop_assert_eq!(c.earliest_new, e);
                        prop_assert!(c.start <= e && c.start % s == 0 && c.start >= boundary);
                        // Every candidate above the boundary is rejected, by groups that lack
                        // the entry they name; none at or below it.
                        let mut cand = c.start;
                        while cand > boundary {
                            prop_assert!(
                                t.rejected.iter().any(|x| x.candidate == cand),
                                "{}: candidate {} not rejected",
                                ctx,
                                cand
                            );
                            cand -= s;
                        }
                        for x in &t.rejected {
                            prop_assert!(x.candidate > boundary && x.candidate <= c.start);
                            let grp = case.geo.groups()[x.group];
                            let table = &q.block_tables[x.group];
                            let i = x.index as usize;
                            let hi = x.candidate / grp.block_size;
                            let lo = match grp.kind {
                                GroupKind::FullAttention => 0,
                                GroupKind::SlidingWindow { window } => {
                                    (x.candidate + 1).saturating_sub(window) / grp.block_size
                                }
                                GroupKind::Mamba { .. } => hi - 1,
                            };
                            prop_assert!(lo <= x.index && x.index < hi, "{}: {:?}", ctx, x);
                            let mine = own[r]
                                .iter()
                                .any(|(h, o)| *o == r && h.g == x.group && h.idx == i);
                            let ok = match x.why {
                                Unusable::Missing => i >= table.len(),
                                Unusable::Null => table.get(i) == Some(&null),
                                Unusable::OwnNewHit(b) => mine && table.get(i) == Some(&b),
                            };
                            prop_assert!(ok, "{}: {:?} does not hold", ctx, x);
                        }
                    }
                }
                let waits_apply = mode == Mode::Safe && policy == Policy::Recompute;
                let old: Vec<(BlockId, u64, usize, bool)> = t
                    .old_hits
                    .iter()
                    .map(|w| (w.block, w.position, w.owner, w.waits))
                    .collect();
                let want: Vec<(BlockId, u64, usize, bool)> = own[r]
                    .iter()
                    .filter(|(_, o)| *o != r)
                    .map(|(h, o)| (h.id, h.pos, *o, waits_apply && h.pos < boundary))
                    .collect();
                prop_assert_eq!(old, want, "{}", ctx);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn a_boundary_is_multiple_of_s_at_most_p(case in case_strategy(4, 3, None)) {
        check_boundaries(&case)?;
    }

    #[test]
    fn b_one_claim_per_block_per_marked_set(case in case_strategy(4, 3, None)) {
        check_one_claim(&case)?;
    }

    #[test]
    fn c_null_never_claimed_or_evicted(case in case_strategy(4, 3, None)) {
        check_null(&case)?;
    }

    #[test]
    fn d_safe_boundary_resumable_and_waits(case in case_strategy(4, 3, None)) {
        check_safe(&case)?;
    }

    #[test]
    fn e_vllm_single_full_attention_equals_plain(case in case_strategy(1, 1, None)) {
        check_plain_vllm(&case)?;
    }

    #[test]
    fn e_hybrid_vllm_equals_plain(case in case_strategy(4, 3, None)) {
        check_plain_vllm(&case)?;
    }

    #[test]
    fn f_unaffected_unchanged_and_total_is_sum(case in case_strategy(4, 3, None)) {
        check_unaffected(&case)?;
    }

    #[test]
    fn g_safe_at_or_below_vllm_all_async(case in case_strategy(4, 3, Some(true))) {
        check_safe_below_vllm(&case)?;
    }

    #[test]
    fn g_safe_at_or_below_vllm_all_sync(case in case_strategy(4, 3, Some(false))) {
        check_safe_below_vllm(&case)?;
    }

    #[test]
    fn h_explanation_is_the_decisions_own(case in case_strategy(4, 3, None)) {
        check_explained(&case)?;
    }
}

/// The generator really produces what the properties need: shared blocks between requests,
/// hits (new and old), nulls in reports and tables, both report forms, short tables.
#[test]
fn generator_covers_the_interesting_shapes() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strat = case_strategy(4, 3, None);
    let (mut old_hits, mut new_hits, mut qualified, mut null_reported, mut safe_differs) =
        (0, 0, 0, 0, 0);
    let (mut short_tables, mut waits) = (0, 0);
    for _ in 0..300 {
        let case = strat.new_tree(&mut runner).unwrap().current();
        let own = ownership(&case, Mode::Safe);
        for (r, hits) in own.iter().enumerate() {
            new_hits += hits.iter().filter(|(_, o)| *o == r).count();
            old_hits += hits.iter().filter(|(_, o)| *o != r).count();
            let q = &case.requests[r];
            for (g, group) in case.geo.groups().iter().enumerate() {
                if (q.block_tables[g].len() as u64) < case.p(r).div_ceil(group.block_size) {
                    short_tables += 1;
                }
            }
        }
        qualified += usize::from(case.report.by_group.is_some());
        null_reported += usize::from(
            case.report.flat.contains(&case.geo.null_block())
                || case
                    .report
                    .by_group
                    .as_ref()
                    .is_some_and(|l| l.iter().flatten().any(|&i| i == case.geo.null_block())),
        );
        let v = case.run(Mode::Vllm, Policy::Recompute);
        let s = case.run(Mode::Safe, Policy::Recompute);
        waits += s
            .requests
            .iter()
            .filter(|d| !d.waits_for.is_empty())
            .count();
        safe_differs += usize::from(
            v.requests
                .iter()
                .zip(&s.requests)
                .any(|(a, b)| a.num_computed_tokens != b.num_computed_tokens),
        );
    }
    assert!(new_hits > 100, "new hits {new_hits}");
    assert!(old_hits > 20, "old hits {old_hits}");
    assert!(qualified > 50, "qualified {qualified}");
    assert!(null_reported > 20, "null reported {null_reported}");
    assert!(safe_differs > 10, "safe differs {safe_differs}");
    assert!(waits > 10, "waits {waits}");
    assert!(short_tables > 10, "short tables {short_tables}");
}
