//! The edge rules of docs/rules.md (null blocks, flat vs group-qualified reports, ids outside
//! every scan range, empty reports, repeated ids) and the readings of the rules
//! (docs/rules.md#readings-of-the-rules).

use kvsched::rules::geometry::{CacheGroup, Geometry, MambaMode};
use kvsched::rules::recovery::{self, recover, InvalidSet, Mode, Policy};

use super::helpers::{
    async_req, check, check_lists, check_unaffected, fa16, fa_mamba, geo, run, s5_requests,
    sync_req,
};

#[test]
fn null_blocks_never_hit_even_when_reported() {
    // A lone Mamba align group and a lone sliding-window group (where vLLM 0.33 would count a
    // reported null id as a hit), with the default and a non-default null id.
    for null in [0u64, 7] {
        for group in [
            CacheGroup::mamba(16, MambaMode::Align),
            CacheGroup::sliding_window(16, 16),
        ] {
            let g = Geometry::new(vec![group], None, null).unwrap();
            let reqs = vec![
                async_req("a", 64, vec![vec![null, null, null, 40]]),
                sync_req("s", 80, 16, vec![vec![null, null, null, 41, 42]]),
            ];
            for mode in [Mode::Vllm, Mode::Safe] {
                for policy in [Policy::Recompute, Policy::Fail] {
                    let out = run(&g, mode, policy, &reqs, &[null]);
                    check_unaffected(&out, 0, 64);
                    check_unaffected(&out, 1, 80);
                    check_lists(&out, &[], &[], &[], &[], 0, &[]);
                    let q = InvalidSet::with_groups([null], &[vec![null]], &g).unwrap();
                    let out = recover(&g, mode, policy, &reqs, &q);
                    check_lists(&out, &[], &[], &[], &[], 0, &[]);
                    // A real hit never claims or evicts a null entry either.
                    let out = run(&g, mode, policy, &reqs, &[null, 40, 41]);
                    for d in &out.requests {
                        assert!(!d.claimed_blocks.contains(&null));
                        assert!(!d.evicted_blocks.contains(&null));
                        assert!(d.waits_for.iter().all(|w| w.0 != null));
                    }
                    assert!(!out.evicted_blocks.contains(&null));
                    assert_eq!(out.affected, [0, 1]);
                }
            }
        }
    }
}

#[test]
fn flat_vs_group_qualified_reports() {
    // Block id 12 stands in R1's group-0 table and R2's group-1 table (one pool per group).
    let g = geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::full_attention(16),
        ],
        None,
    );
    let reqs = vec![
        async_req("R1", 48, vec![vec![1, 12, 3], vec![11, 21, 13]]),
        async_req("R2", 48, vec![vec![31, 32, 33], vec![41, 42, 12]]),
    ];
    for mode in [Mode::Vllm, Mode::Safe] {
        // Flat: 12 matches in both groups; the (group, id) pairs differ, so each request
        // claims its own.
        let out = run(&g, mode, Policy::Recompute, &reqs, &[12]);
        assert_eq!(out.requests[0].num_computed_tokens, 16);
        assert_eq!(out.requests[0].claimed_blocks, [12]);
        assert_eq!(out.requests[1].num_computed_tokens, 32);
        assert_eq!(out.requests[1].claimed_blocks, [12]);
        assert!(out.requests[1].waits_for.is_empty());
        assert_eq!(out.affected, [0, 1]);
        assert_eq!(out.total_affected_tokens, 32 + 16);

        // Qualified to group 1: only R2's entry matches.
        let q = InvalidSet::with_groups([], &[vec![], vec![12]], &g).unwrap();
        let out = recover(&g, mode, Policy::Recompute, &reqs, &q);
        check_unaffected(&out, 0, 48);
        assert_eq!(out.requests[1].num_computed_tokens, 32);
        assert_eq!(out.requests[1].claimed_blocks, [12]);
        assert_eq!(out.affected, [1]);

        // Qualified to group 0: only R1's entry matches.
        let q = InvalidSet::with_groups([], &[vec![12], vec![]], &g).unwrap();
        let out = recover(&g, mode, Policy::Recompute, &reqs, &q);
        assert_eq!(out.requests[0].num_computed_tokens, 16);
        check_unaffected(&out, 1, 48);
        assert_eq!(out.affected, [0]);

        // A flat id beside a qualified list matches everywhere (the report is the union).
        let q = InvalidSet::with_groups([12], &[vec![], vec![]], &g).unwrap();
        let out = recover(&g, mode, Policy::Recompute, &reqs, &q);
        assert_eq!(out.affected, [0, 1]);
    }
    // The same id in the same group of two requests is one shared block: one claim.
    let reqs2 = vec![
        async_req("R1", 48, vec![vec![1, 2, 3], vec![11, 12, 13]]),
        async_req("R2", 48, vec![vec![12, 22, 23], vec![31, 12, 33]]),
    ];
    let q = InvalidSet::with_groups([], &[vec![], vec![12]], &g).unwrap();
    let out = recover(&g, Mode::Vllm, Policy::Recompute, &reqs2, &q);
    assert_eq!(out.requests[0].claimed_blocks, [12]);
    assert!(out.requests[1].claimed_blocks.is_empty());
    assert_eq!(out.requests[1].num_computed_tokens, 48);
    // Flat: R2's group-0 entry 12 is a different (group, id) pair, which R2 claims.
    let out = run(&g, Mode::Vllm, Policy::Recompute, &reqs2, &[12]);
    assert_eq!(out.requests[1].claimed_blocks, [12]);
    assert_eq!(out.requests[1].num_computed_tokens, 0);
}

#[test]
fn id_outside_every_scan_range_affects_no_one() {
    let g = fa16();
    // The sync request's last entry holds its scheduled tokens (index 3 ≥ ceil(48/16)); the
    // async request's table is longer than its P (index 2 ≥ ceil(20/16) = 2).
    let reqs = vec![
        async_req("a", 20, vec![vec![1, 2, 3]]),
        sync_req("s", 64, 16, vec![vec![11, 12, 13, 14]]),
    ];
    for mode in [Mode::Vllm, Mode::Safe] {
        for policy in [Policy::Recompute, Policy::Fail] {
            for ids in [&[14u64, 3][..], &[999], &[14, 3, 999, 0]] {
                let out = run(&g, mode, policy, &reqs, ids);
                check_unaffected(&out, 0, 20);
                check_unaffected(&out, 1, 64);
                check_lists(&out, &[], &[], &[], &[], 0, &[]);
            }
            // The partial last block below P is in range: entry 1 holds tokens 16..20.
            let out = run(&g, mode, policy, &reqs, &[2]);
            assert_eq!(out.requests[0].num_computed_tokens, 16);
            assert_eq!(out.requests[0].affected_tokens, 4);
        }
    }
}

#[test]
fn empty_report_changes_nothing() {
    let g = fa_mamba();
    let reqs = s5_requests();
    for mode in [Mode::Vllm, Mode::Safe] {
        for policy in [Policy::Recompute, Policy::Fail] {
            let out = run(&g, mode, policy, &reqs, &[]);
            check_unaffected(&out, 0, 144);
            check_unaffected(&out, 1, 48);
            check_lists(&out, &[], &[], &[], &[], 0, &[]);
            let q = InvalidSet::with_groups([], &[vec![], vec![]], &g).unwrap();
            assert!(q.is_empty());
            assert_eq!(recover(&g, mode, policy, &reqs, &q), out);
        }
    }
}

#[test]
fn repeated_id_inside_one_request_is_new_everywhere() {
    let g = fa16();
    // Block 5 at indices 0 and 2 of R1; R2 shares it at index 2 only.
    let reqs = vec![
        async_req("R1", 64, vec![vec![9, 5, 6, 5]]),
        async_req("R2", 64, vec![vec![20, 21, 5, 22]]),
    ];
    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[5]);
    // Both positions are new hits of R1: it claims 5 once and does not wait for itself.
    check(&out, 0, 16, 48, &[5], &[], &[5, 6]);
    // R2's hit is old (R1 owns 5): back to P, waiting for R1.
    check(&out, 1, 64, 0, &[], &[(5, 0)], &[]);

    // Through the per-request API: every occurrence in the request is its own hit.
    let set = InvalidSet::flat([5], &g);
    let mut hits = Vec::new();
    recovery::scan_request(&g, reqs[0].view(), &set, &mut hits);
    assert_eq!(
        hits.iter()
            .map(|h| (h.index, h.position))
            .collect::<Vec<_>>(),
        [(1, 16), (3, 48)]
    );
    // A repeat in two groups with a flat report: two (group, id) pairs, both new.
    let g2 = geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::full_attention(16),
        ],
        None,
    );
    let reqs = vec![async_req("R", 64, vec![vec![1, 2, 3, 5], vec![5, 6, 7, 8]])];
    let out = run(&g2, Mode::Safe, Policy::Recompute, &reqs, &[5]);
    check(&out, 0, 0, 64, &[5], &[], &[1, 2, 3, 5, 6, 7, 8]);
}

// ---------------------------------------------------------------------------------------------
// readings of the rules (docs/rules.md#readings-of-the-rules)

/// The resumable boundary (docs/rules.md#the-resumable-boundary): `sliding_window` needs the entries holding tokens
/// `[max(0, c − window + 1), c)`. With `window = 1` that range is empty, so a short
/// sliding-window table does not stop a resume: 12, not 8.
#[test]
fn safe_window_1_short_table_resumes() {
    let g = geo(
        vec![
            CacheGroup::full_attention(4),
            CacheGroup::sliding_window(4, 1),
        ],
        None,
    );
    // P = 16; the sliding-window table is short (2 entries = tokens 0..8).
    let reqs = vec![async_req("r", 16, vec![vec![1, 2, 3, 4], vec![5, 6]])];
    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[4]);
    // Earliest new hit at 12; resuming at 12 needs FA entries 0..3 (real, valid) and no
    // sliding-window entry (tokens [12, 12)).
    assert_eq!(out.requests[0].num_computed_tokens, 12);
}

/// The same inside a block: an old-hits-only request at `P = 3` (mid-block) resumes there in
/// mode `safe` — its one-token window needs no entry, full or short — and waits for the
/// owner of the shared block instead of rolling back to 2 (or, beside a full-attention
/// group of block size 1, to 0).
#[test]
fn safe_window_1_inside_a_block_resumes_at_p() {
    let g = geo(vec![CacheGroup::sliding_window(2, 1)], None);
    let reqs = vec![
        async_req("A", 3, vec![vec![1, 2]]),
        async_req("B", 3, vec![vec![1, 0]]),
    ];
    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[1]);
    check(&out, 1, 3, 0, &[], &[(1, 0)], &[]);
    let g = geo(
        vec![
            CacheGroup::full_attention(1),
            CacheGroup::sliding_window(2, 1),
        ],
        None,
    );
    let reqs = vec![
        async_req("A", 1, vec![vec![1], vec![]]),
        async_req("B", 1, vec![vec![1], vec![]]),
    ];
    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[1]);
    check(&out, 1, 1, 0, &[], &[(1, 0)], &[]);
    assert_eq!(out.total_affected_tokens, 1, "only the owner recomputes");
}

/// docs/rules.md#one-id-two-owners: with one pool per group, id 7 stands in group 0 of R1 and in
/// group 1 of R2, each its owner there; R3 holds 7 in both groups and waits for both owners
/// (waiting for R1 alone, it could read group 1's block 7 while R2 still rewrites it).
#[test]
fn one_id_two_owners_are_both_waited_for() {
    let g = geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::full_attention(16),
        ],
        None,
    );
    let reqs = vec![
        async_req("R1", 32, vec![vec![7, 2], vec![10, 11]]),
        async_req("R2", 32, vec![vec![20, 21], vec![7, 31]]),
        async_req("R3", 32, vec![vec![7, 41], vec![7, 51]]),
    ];
    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[7]);
    check(&out, 0, 0, 32, &[7], &[], &[2, 7, 10, 11]);
    check(&out, 1, 0, 32, &[7], &[], &[7, 20, 21, 31]);
    check(&out, 2, 32, 0, &[], &[(7, 0), (7, 1)], &[]);
}
