//! The worked examples of docs/rules.md and the example outcome of docs/replay.md, through the library API, with
//! exact numbers; plus the edge rules of §2/§3 (null blocks, flat vs group-qualified reports,
//! ids outside every scan range, empty reports, repeated ids) and request validation.
//!
//! Where §6 states a result only for mode `vllm`, the mode `safe` result is asserted only when
//! it follows directly from §4's text (noted at each such place).

use kvsched::rules::geometry::{BlockId, CacheGroup, Geometry, GeometryError, MambaMode};
use kvsched::rules::recovery::{
    self, recover, validate_request, validate_requests, Disposition, InvalidSet, Mode, Outcome,
    Policy, RecoveryError, Request, RequestClass,
};

// ---------------------------------------------------------------------------------------------
// helpers

fn fa16() -> Geometry {
    Geometry::single_full_attention(16).unwrap()
}

fn geo(groups: Vec<CacheGroup>, s: Option<u64>) -> Geometry {
    Geometry::new(groups, s, 0).unwrap()
}

fn async_req(id: &str, p: u64, tables: Vec<Vec<BlockId>>) -> Request {
    Request {
        id: id.to_string(),
        class: RequestClass::Async,
        num_computed_tokens: p,
        num_scheduled_tokens: 0,
        block_tables: tables,
    }
}

fn sync_req(id: &str, computed: u64, scheduled: u64, tables: Vec<Vec<BlockId>>) -> Request {
    Request {
        id: id.to_string(),
        class: RequestClass::Sync,
        num_computed_tokens: computed,
        num_scheduled_tokens: scheduled,
        block_tables: tables,
    }
}

fn run(geo: &Geometry, mode: Mode, policy: Policy, reqs: &[Request], ids: &[BlockId]) -> Outcome {
    validate_requests(geo, reqs).expect("example requests are valid");
    recover(
        geo,
        mode,
        policy,
        reqs,
        &InvalidSet::flat(ids.iter().copied(), geo),
    )
}

/// Asserts one request's outcome: computed tokens, affected tokens, claims, waits, evictions.
#[track_caller]
fn check(
    out: &Outcome,
    i: usize,
    nct: u64,
    affected_tokens: u64,
    claimed: &[BlockId],
    waits_for: &[(BlockId, usize)],
    evicted: &[BlockId],
) {
    let d = &out.requests[i];
    assert_eq!(
        d.num_computed_tokens, nct,
        "request {i}: num_computed_tokens"
    );
    assert_eq!(d.affected_tokens, affected_tokens, "request {i}: affected");
    assert_eq!(d.claimed_blocks, claimed, "request {i}: claimed_blocks");
    assert_eq!(d.waits_for, waits_for, "request {i}: waits_for");
    assert_eq!(d.evicted_blocks, evicted, "request {i}: evicted_blocks");
}

#[track_caller]
fn check_unaffected(out: &Outcome, i: usize, nct: u64) {
    let d = &out.requests[i];
    assert_eq!(d.disposition, Disposition::Unaffected, "request {i}");
    assert!(!d.affected(), "request {i}");
    check(out, i, nct, 0, &[], &[], &[]);
}

/// Asserts the outcome's lists (request indices, canonical order) and totals.
#[track_caller]
fn check_lists(
    out: &Outcome,
    affected: &[usize],
    skip: &[usize],
    failed: &[usize],
    failed_recving: &[usize],
    total: u128,
    evicted: &[BlockId],
) {
    assert_eq!(out.affected, affected, "affected");
    assert_eq!(out.skip, skip, "skip");
    assert_eq!(out.failed, failed, "failed");
    assert_eq!(out.failed_recving, failed_recving, "failed_recving");
    assert_eq!(out.total_affected_tokens, total, "total_affected_tokens");
    assert_eq!(out.evicted_blocks, evicted, "evicted_blocks");
    let sum: u128 = out
        .requests
        .iter()
        .map(|d| u128::from(d.affected_tokens))
        .sum();
    assert_eq!(out.total_affected_tokens, sum, "total is the sum");
}

fn range(lo: BlockId, n: u64) -> Vec<BlockId> {
    (lo..lo + n).collect()
}

// ---------------------------------------------------------------------------------------------
// §6: async, 99 loaded blocks, invalid at indices {0,98} / {50,98} / {98} of R2 of three

fn three_async() -> Vec<Request> {
    (0..3u64)
        .map(|r| {
            async_req(
                &format!("R{}", r + 1),
                99 * 16,
                vec![range(1000 * (r + 1), 99)],
            )
        })
        .collect()
}

#[test]
fn s6_async_99_blocks() {
    let g = fa16();
    let reqs = three_async();
    let r2 = &reqs[1].block_tables[0];
    for (idx, nct, tokens) in [
        (&[0usize, 98][..], 0u64, 1584u64),
        (&[50, 98], 800, 784),
        (&[98], 1568, 16),
    ] {
        let ids: Vec<BlockId> = idx.iter().map(|&i| r2[i]).collect();
        // Mode `safe` gives the same: one full-attention group, every entry below the
        // earliest hit is real and not invalid.
        for mode in [Mode::Vllm, Mode::Safe] {
            let out = run(&g, mode, Policy::Recompute, &reqs, &ids);
            let evicted: Vec<BlockId> = if mode == Mode::Safe {
                r2[(nct / 16) as usize..].to_vec()
            } else {
                vec![]
            };
            check_unaffected(&out, 0, 1584);
            check(&out, 1, nct, tokens, &ids, &[], &evicted);
            check_unaffected(&out, 2, 1584);
            assert_eq!(out.requests[1].disposition, Disposition::FailedRecving);
            check_lists(&out, &[1], &[], &[], &[1], tokens.into(), &evicted);

            // `fail`: the same rollback, R2 failed; vllm collects evictions in the sync scan
            // only, so an async request evicts nothing there.
            let out = run(&g, mode, Policy::Fail, &reqs, &ids);
            check(&out, 1, nct, tokens, &ids, &[], &evicted);
            assert_eq!(out.requests[1].disposition, Disposition::Failed);
            check_lists(&out, &[1], &[], &[1], &[], tokens.into(), &evicted);
        }
    }
}

// §6: sync, same sizes, 16 tokens scheduled each (num_computed_tokens 1600, P 1584)

#[test]
fn s6_sync_99_blocks() {
    let g = fa16();
    // 99 loaded blocks + the block the scheduled 16 tokens went to (outside the scan range).
    let reqs: Vec<Request> = (0..3u64)
        .map(|r| {
            sync_req(
                &format!("R{}", r + 1),
                1600,
                16,
                vec![range(1000 * (r + 1), 100)],
            )
        })
        .collect();
    let r2 = reqs[1].block_tables[0].clone();
    for (idx, nct, tokens) in [
        (&[0usize, 98][..], 0u64, 1584u64),
        (&[50, 98], 800, 784),
        (&[98], 1568, 16),
    ] {
        let ids: Vec<BlockId> = idx.iter().map(|&i| r2[i]).collect();
        let tail = r2[(nct / 16) as usize..].to_vec();
        for mode in [Mode::Vllm, Mode::Safe] {
            let out = run(&g, mode, Policy::Recompute, &reqs, &ids);
            let evicted = if mode == Mode::Safe {
                tail.clone()
            } else {
                vec![]
            };
            check_unaffected(&out, 0, 1600);
            check(&out, 1, nct, tokens, &ids, &[], &evicted);
            check_unaffected(&out, 2, 1600);
            assert_eq!(out.requests[1].disposition, Disposition::Skip);
            check_lists(&out, &[1], &[1], &[], &[], tokens.into(), &evicted);

            // `fail`: a sync claimant's tail is evicted in both modes.
            let out = run(&g, mode, Policy::Fail, &reqs, &ids);
            check(&out, 1, nct, tokens, &ids, &[], &tail);
            check_lists(&out, &[1], &[], &[1], &[], tokens.into(), &tail);
        }
    }
}

// §6: shared prefix, sync: R1 (1584 external + 16 scheduled) and R2 (local hit on R1's first 50
// blocks, 800 computed before the step, s2 scheduled) share c0..c49

#[test]
fn s6_shared_prefix_sync() {
    let g = fa16();
    let c = range(1, 99); // c0..c98 = ids 1..=99
    let mut r1_table = c.clone();
    r1_table.push(500); // the block of R1's scheduled tokens
    for s2 in [1u64, 16, 40] {
        let mut r2_table = c[..50].to_vec();
        r2_table.extend(range(600, 3)); // blocks of R2's scheduled tokens
        let reqs = vec![
            sync_req("R1", 1600, 16, vec![r1_table.clone()]),
            sync_req("R2", 800 + s2, s2, vec![r2_table.clone()]),
        ];
        for (ids, r1_nct) in [
            (vec![c[0], c[49]], 0u64),
            (vec![c[25], c[49]], 400),
            (vec![c[49]], 784),
        ] {
            let r1_tokens = 1584 - r1_nct;
            let total = u128::from(r1_tokens + s2);
            let out = run(&g, Mode::Vllm, Policy::Recompute, &reqs, &ids);
            check(&out, 0, r1_nct, r1_tokens, &ids, &[], &[]);
            check(&out, 1, 800, s2, &[], &[], &[]);
            assert_eq!(out.requests[1].disposition, Disposition::Skip);
            check_lists(&out, &[0, 1], &[0, 1], &[], &[], total, &[]);

            // `fail`: both failed; R1's tail is evicted, R2 evicts nothing (no new hit).
            let out = run(&g, Mode::Vllm, Policy::Fail, &reqs, &ids);
            let tail = r1_table[(r1_nct / 16) as usize..].to_vec();
            check(&out, 0, r1_nct, r1_tokens, &ids, &[], &tail);
            check(&out, 1, 800, s2, &[], &[], &[]);
            check_lists(&out, &[0, 1], &[], &[0, 1], &[], total, &tail);

            // Mode `safe` (§4 items 2 and 4): the same boundaries (one scan class, so the same
            // ownership); R2 waits for R1 on each shared invalid block starting below 800.
            let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &ids);
            let waits: Vec<(BlockId, usize)> = ids.iter().map(|&b| (b, 0)).collect();
            check(&out, 0, r1_nct, r1_tokens, &ids, &[], &tail);
            check(&out, 1, 800, s2, &[], &waits, &[]);
            check_lists(&out, &[0, 1], &[0, 1], &[], &[], total, &tail);
        }
    }
}

// §6: two groups 16/16, one sync request, tables ([1,2,3,4],[11,12,13,14]), P=64, I={12}

#[test]
fn s6_two_groups_16_16() {
    let g = geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::full_attention(16),
        ],
        None,
    );
    let reqs = vec![sync_req(
        "s",
        80,
        16,
        vec![vec![1, 2, 3, 4], vec![11, 12, 13, 14]],
    )];
    let tail = [2, 3, 4, 12, 13, 14];
    let out = run(&g, Mode::Vllm, Policy::Recompute, &reqs, &[12]);
    check(&out, 0, 16, 48, &[12], &[], &[]);
    check_lists(&out, &[0], &[0], &[], &[], 48, &[]);
    let out = run(&g, Mode::Vllm, Policy::Fail, &reqs, &[12]);
    check(&out, 0, 16, 48, &[12], &[], &tail);
    check_lists(&out, &[0], &[], &[0], &[], 48, &tail);
    // Mode `safe`: resuming at 16 needs entries 1 and 11, both real and valid.
    for policy in [Policy::Recompute, Policy::Fail] {
        let out = run(&g, Mode::Safe, policy, &reqs, &[12]);
        check(&out, 0, 16, 48, &[12], &[], &tail);
        assert_eq!(out.evicted_blocks, tail);
    }
}

// §6: shared hybrid block: R1 ([1,2,3],[11,12,13]) and R2 ([21,22,23],[31,12,33]), both async

#[test]
fn s6_shared_hybrid_block() {
    let g = geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::full_attention(16),
        ],
        None,
    );
    let reqs = vec![
        async_req("R1", 48, vec![vec![1, 2, 3], vec![11, 12, 13]]),
        async_req("R2", 48, vec![vec![21, 22, 23], vec![31, 12, 33]]),
    ];
    let out = run(&g, Mode::Vllm, Policy::Recompute, &reqs, &[12]);
    check(&out, 0, 16, 32, &[12], &[], &[]);
    check(&out, 1, 48, 0, &[], &[], &[]);
    assert!(out.requests[1].affected());
    check_lists(&out, &[0, 1], &[], &[], &[0, 1], 32, &[]);

    let out = run(&g, Mode::Vllm, Policy::Fail, &reqs, &[12]);
    check(&out, 0, 16, 32, &[12], &[], &[]);
    check(&out, 1, 48, 0, &[], &[], &[]);
    check_lists(&out, &[0, 1], &[], &[0, 1], &[], 32, &[]);

    // Mode `safe`: same ownership (one class); R2 waits for R1 on 12 (start 16 < 48).
    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[12]);
    check(&out, 0, 16, 32, &[12], &[], &[2, 3, 12, 13]);
    check(&out, 1, 48, 0, &[], &[(12, 0)], &[]);
    check_lists(&out, &[0, 1], &[], &[], &[0, 1], 32, &[2, 3, 12, 13]);
    // Under `fail` nobody waits.
    let out = run(&g, Mode::Safe, Policy::Fail, &reqs, &[12]);
    check(&out, 1, 48, 0, &[], &[], &[]);
}

// §6: mixed sizes 16/32/64 (S=64), P=192

#[test]
fn s6_mixed_sizes_16_32_64() {
    let g = geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::full_attention(32),
            CacheGroup::full_attention(64),
        ],
        None,
    );
    assert_eq!(g.scheduler_block_size(), 64);
    let tables = vec![range(100, 12), range(200, 6), range(300, 3)];
    let reqs = vec![async_req("r", 192, tables.clone())];
    for (ids, nct, tokens) in [
        (&[203u64][..], 64u64, 128u64),
        (&[109], 128, 64),
        (&[300], 0, 192),
        (&[203, 109], 64, 128),
    ] {
        // Every group is full attention and only the reported entries are invalid: mode
        // `safe` resumes at the same boundary.
        for mode in [Mode::Vllm, Mode::Safe] {
            let out = run(&g, mode, Policy::Recompute, &reqs, ids);
            let d = &out.requests[0];
            assert_eq!((d.num_computed_tokens, d.affected_tokens), (nct, tokens));
            assert_eq!(d.claimed_blocks, ids.to_vec().tap_sort());
            assert_eq!(out.failed_recving, [0]);
        }
        // And as a sync request with 16 scheduled tokens.
        let sreqs = vec![sync_req("r", 208, 16, tables.clone())];
        let out = run(&g, Mode::Vllm, Policy::Recompute, &sreqs, ids);
        assert_eq!(out.requests[0].num_computed_tokens, nct);
        assert_eq!(out.requests[0].affected_tokens, tokens);
        assert_eq!(out.skip, [0]);
    }
}

trait TapSort {
    fn tap_sort(self) -> Self;
}
impl TapSort for Vec<BlockId> {
    fn tap_sort(mut self) -> Self {
        self.sort_unstable();
        self
    }
}

// §6 / §5: full attention + Mamba align, async, P=144

fn fa_mamba() -> Geometry {
    geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(16, MambaMode::Align),
        ],
        Some(16),
    )
}

fn s5_requests() -> Vec<Request> {
    vec![
        async_req(
            "a",
            144,
            vec![range(101, 9), vec![0, 0, 0, 0, 0, 0, 0, 0, 201]],
        ),
        sync_req("s", 48, 16, vec![vec![1, 2, 3], vec![0, 0, 9]]),
    ]
}

#[test]
fn s5_example_outcome() {
    let g = fa_mamba();
    let reqs = s5_requests();
    let out = run(&g, Mode::Vllm, Policy::Recompute, &reqs, &[104]);
    // {"affected": ["a"], "skip": [], "failed": [], "failed_recving": ["a"],
    //  "total_affected_tokens": 96, "evicted_blocks": [], ...}
    check_lists(&out, &[0], &[], &[], &[0], 96, &[]);
    assert_eq!(out.requests[0].disposition, Disposition::FailedRecving);
    check(&out, 0, 48, 96, &[104], &[], &[]);
    check_unaffected(&out, 1, 48);
}

#[test]
fn s6_fa_mamba_align() {
    let g = fa_mamba();
    let reqs = vec![s5_requests().remove(0)];
    let all_a: Vec<BlockId> = range(101, 9).into_iter().chain([201]).collect();
    for (ids, vllm_nct) in [(&[201u64][..], 128u64), (&[104], 48), (&[104, 201], 48)] {
        let out = run(&g, Mode::Vllm, Policy::Recompute, &reqs, ids);
        check(&out, 0, vllm_nct, 144 - vllm_nct, ids, &[], &[]);
        check_lists(&out, &[0], &[], &[], &[0], (144 - vllm_nct).into(), &[]);
        let out = run(&g, Mode::Vllm, Policy::Fail, &reqs, ids);
        check(&out, 0, vllm_nct, 144 - vllm_nct, ids, &[], &[]);
        check_lists(&out, &[0], &[], &[0], &[], (144 - vllm_nct).into(), &[]);

        // Mode `safe`: no Mamba state exists at 128 or 48 → 0; everything is evicted.
        for policy in [Policy::Recompute, Policy::Fail] {
            let out = run(&g, Mode::Safe, policy, &reqs, ids);
            check(&out, 0, 0, 144, ids, &[], &all_a);
            assert_eq!(out.evicted_blocks, all_a);
        }
    }
    // I={0}: the null block is never invalid.
    for mode in [Mode::Vllm, Mode::Safe] {
        for policy in [Policy::Recompute, Policy::Fail] {
            let out = run(&g, mode, policy, &reqs, &[0]);
            check_unaffected(&out, 0, 144);
            check_lists(&out, &[], &[], &[], &[], 0, &[]);
        }
    }
}

// §6: mixed old and new hits: R1 [a,b,c,d], R2 [a,x,y,z], both async, P=64, I={a,y}

#[test]
fn s6_mixed_old_and_new_hits() {
    let g = fa16();
    let (a, b, c, d, x, y, z) = (1, 2, 3, 4, 5, 6, 7);
    let reqs = vec![
        async_req("R1", 64, vec![vec![a, b, c, d]]),
        async_req("R2", 64, vec![vec![a, x, y, z]]),
    ];
    let out = run(&g, Mode::Vllm, Policy::Recompute, &reqs, &[a, y]);
    check(&out, 0, 0, 64, &[a], &[], &[]);
    check(&out, 1, 32, 32, &[y], &[], &[]);
    check_lists(&out, &[0, 1], &[], &[], &[0, 1], 96, &[]);

    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[a, y]);
    check(&out, 0, 0, 64, &[a], &[], &[a, b, c, d]);
    check(&out, 1, 32, 32, &[y], &[(a, 0)], &[y, z]);
    check_lists(&out, &[0, 1], &[], &[], &[0, 1], 96, &[a, b, c, d, y, z]);

    let out = run(&g, Mode::Safe, Policy::Fail, &reqs, &[a, y]);
    check(&out, 1, 32, 32, &[y], &[], &[y, z]);
    check_lists(&out, &[0, 1], &[], &[0, 1], &[], 96, &[a, b, c, d, y, z]);
}

// §6: full attention + sliding window (both 16, window 17, S=16), async, P=96

#[test]
fn s6_fa_sliding_window() {
    let g = geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::sliding_window(16, 17),
        ],
        Some(16),
    );
    let reqs = vec![async_req(
        "r",
        96,
        vec![vec![1, 2, 3, 4, 5, 6], vec![0, 0, 0, 0, 15, 16]],
    )];
    let out = run(&g, Mode::Vllm, Policy::Recompute, &reqs, &[15]);
    check(&out, 0, 64, 32, &[15], &[], &[]);
    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[15]);
    check(&out, 0, 0, 96, &[15], &[], &[1, 2, 3, 4, 5, 6, 15, 16]);

    for mode in [Mode::Vllm, Mode::Safe] {
        let out = run(&g, mode, Policy::Recompute, &reqs, &[16]);
        let evicted: &[BlockId] = if mode == Mode::Safe { &[6, 16] } else { &[] };
        check(&out, 0, 80, 16, &[16], &[], evicted);
        check_lists(&out, &[0], &[], &[], &[0], 16, evicted);
    }
}

// §6: async and sync sharing a block p: A1 [p,q] P=32, S1 [p,r] P=32, I={p}

#[test]
fn s6_async_and_sync_sharing() {
    let g = fa16();
    let (p, q, r, r2) = (7, 8, 9, 10);
    let reqs = vec![
        // Input order puts the sync request first: canonical order is still A1, S1.
        sync_req("S1", 48, 16, vec![vec![p, r, r2]]),
        async_req("A1", 32, vec![vec![p, q]]),
    ];
    let out = run(&g, Mode::Vllm, Policy::Recompute, &reqs, &[p]);
    check(&out, 1, 0, 32, &[p], &[], &[]);
    check(&out, 0, 0, 32, &[p], &[], &[]);
    check_lists(&out, &[1, 0], &[0], &[], &[1], 64, &[]);
    // `fail`: only the sync claimant's tail is evicted in mode vllm.
    let out = run(&g, Mode::Vllm, Policy::Fail, &reqs, &[p]);
    check(&out, 1, 0, 32, &[p], &[], &[]);
    check(&out, 0, 0, 32, &[p], &[], &[p, r, r2]);
    check_lists(&out, &[1, 0], &[], &[1, 0], &[], 64, &[p, r, r2]);

    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[p]);
    check(&out, 1, 0, 32, &[p], &[], &[p, q]);
    check(&out, 0, 32, 16, &[], &[(p, 1)], &[]);
    assert_eq!(out.requests[0].disposition, Disposition::Skip);
    check_lists(&out, &[1, 0], &[0], &[], &[1], 48, &[p, q]);
    let out = run(&g, Mode::Safe, Policy::Fail, &reqs, &[p]);
    check(&out, 0, 32, 16, &[], &[], &[]);
    check_lists(&out, &[1, 0], &[], &[1, 0], &[], 48, &[p, q]);
}

// ---------------------------------------------------------------------------------------------
// edge rules

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
// validation

#[test]
fn validation_errors() {
    let g = geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::sliding_window(16, 16),
        ],
        None,
    );
    let ok = async_req("ok", 32, vec![vec![1, 2], vec![0, 3]]);
    assert_eq!(validate_request(&g, ok.view()), Ok(()));

    let r = async_req("t", 32, vec![vec![1, 2]]);
    assert_eq!(
        validate_request(&g, r.view()),
        Err(RecoveryError::TableCount {
            given: 1,
            groups: 2
        })
    );
    let r = sync_req("x", 16, 17, vec![vec![1, 2], vec![3, 4]]);
    assert_eq!(
        validate_request(&g, r.view()),
        Err(RecoveryError::ScheduledExceedsComputed {
            scheduled: 17,
            computed: 16
        })
    );
    let mut r = async_req("y", 32, vec![vec![1, 2], vec![3, 4]]);
    r.num_scheduled_tokens = 16;
    assert_eq!(
        validate_request(&g, r.view()),
        Err(RecoveryError::AsyncWithScheduled { scheduled: 16 })
    );
    // A null in the full-attention table below P (P = 48 - 16 = 32: indices 0, 1).
    let r = sync_req("n", 48, 16, vec![vec![1, 0, 5], vec![0, 0, 0]]);
    assert_eq!(
        validate_request(&g, r.view()),
        Err(RecoveryError::NullInFullAttention {
            group: 0,
            index: 1,
            pre_step_tokens: 32
        })
    );
    // At or past P a null is accepted, as are nulls in the sliding window.
    let r = sync_req("n2", 48, 16, vec![vec![1, 2, 0], vec![0, 0, 0]]);
    assert_eq!(validate_request(&g, r.view()), Ok(()));

    // validate_requests: the index of the first bad request; duplicate ids.
    let reqs = vec![
        ok.clone(),
        async_req("b", 16, vec![vec![4], vec![5]]),
        async_req("ok", 16, vec![vec![6], vec![7]]),
    ];
    assert_eq!(
        validate_requests(&g, &reqs),
        Err((
            2,
            RecoveryError::DuplicateRequestId {
                id: "ok".to_string()
            }
        ))
    );
    let reqs = vec![ok.clone(), async_req("bad", 16, vec![vec![4]])];
    assert_eq!(
        validate_requests(&g, &reqs),
        Err((
            1,
            RecoveryError::TableCount {
                given: 1,
                groups: 2
            }
        ))
    );
    assert_eq!(validate_requests(&g, &[]), Ok(()));

    // A qualified report with the wrong list count.
    let e = InvalidSet::with_groups([], &[vec![1u64]], &g).unwrap_err();
    assert_eq!(
        e,
        RecoveryError::ReportGroupCount {
            given: 1,
            groups: 2
        }
    );
    let e = InvalidSet::with_groups([1], &[vec![1u64], vec![], vec![]], &g).unwrap_err();
    assert_eq!(
        e,
        RecoveryError::ReportGroupCount {
            given: 3,
            groups: 2
        }
    );
    // Messages name the problem as §5 shows.
    assert_eq!(
        RecoveryError::TableCount {
            given: 2,
            groups: 3
        }
        .to_string(),
        "2 tables given, 3 groups configured"
    );
    // One of a thing is singular.
    for (e, text) in [
        (
            RecoveryError::TableCount {
                given: 2,
                groups: 1,
            },
            "2 tables given, 1 group configured",
        ),
        (
            RecoveryError::TableCount {
                given: 1,
                groups: 2,
            },
            "1 table given, 2 groups configured",
        ),
        (
            RecoveryError::ReportGroupCount {
                given: 1,
                groups: 2,
            },
            "1 list given, 2 groups configured",
        ),
        (
            RecoveryError::ReportGroupCount {
                given: 0,
                groups: 1,
            },
            "0 lists given, 1 group configured",
        ),
    ] {
        assert_eq!(e.to_string(), text);
    }
}

#[test]
fn geometry_errors() {
    assert_eq!(Geometry::new(vec![], None, 0), Err(GeometryError::NoGroups));
    assert_eq!(
        Geometry::new(
            vec![
                CacheGroup::full_attention(16),
                CacheGroup::full_attention(24)
            ],
            Some(32),
            0
        ),
        Err(GeometryError::NotAMultiple {
            scheduler_block_size: 32,
            group: 1,
            block_size: 24
        })
    );
    assert_eq!(
        Geometry::new(
            vec![
                CacheGroup::full_attention(16),
                CacheGroup::full_attention(24)
            ],
            None,
            0
        )
        .unwrap()
        .scheduler_block_size(),
        48
    );
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
