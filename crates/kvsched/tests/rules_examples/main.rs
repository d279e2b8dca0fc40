//! The worked examples of docs/rules.md and the example outcome of docs/replay.md, through the library API, with
//! exact numbers; plus the edge rules of docs/rules.md#data-model and
//! docs/rules.md#scanning-a-request (null blocks, flat vs group-qualified reports, ids outside
//! every scan range, empty reports, repeated ids) and request validation.
//!
//! Where a worked example (docs/rules.md#worked-examples) states a result only for mode `vllm`,
//! the mode `safe` result is asserted only when it follows directly from the text of
//! docs/rules.md#mode-safe (noted at each such place).

mod edges;
mod explain;
mod helpers;
mod validation;

use kvsched::rules::geometry::{BlockId, CacheGroup};
use kvsched::rules::recovery::{Disposition, Mode, Policy, Request};

use helpers::{
    async_req, check, check_lists, check_unaffected, fa16, fa_mamba, geo, range, run, s5_requests,
    sync_req,
};

// ---------------------------------------------------------------------------------------------
// docs/rules.md#async-99-loaded-blocks: invalid at indices {0,98} / {50,98} / {98} of R2 of three

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

// docs/rules.md#sync-99-loaded-blocks: same sizes, 16 tokens scheduled each (num_computed_tokens 1600, P 1584)

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

// docs/rules.md#shared-prefix-sync: R1 (1584 external + 16 scheduled) and R2 (local hit on R1's first 50
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

            // Mode `safe` (docs/rules.md#sharers-wait-for-the-owner and #evict-on-recompute-too): the same boundaries (one scan class, so the same
            // ownership); R2 waits for R1 on each shared invalid block starting below 800, and
            // evicts the blocks its discarded step wrote after reading them (from index 50).
            let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &ids);
            let waits: Vec<(BlockId, usize)> = ids.iter().map(|&b| (b, 0)).collect();
            let r2_tail = r2_table[50..].to_vec();
            let both: Vec<BlockId> = tail.iter().chain(&r2_tail).copied().collect();
            check(&out, 0, r1_nct, r1_tokens, &ids, &[], &tail);
            check(&out, 1, 800, s2, &[], &waits, &r2_tail);
            check_lists(&out, &[0, 1], &[0, 1], &[], &[], total, &both);
        }
    }
}

// docs/rules.md#two-groups-of-16: one sync request, tables ([1,2,3,4],[11,12,13,14]), P=64, I={12}

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

// docs/rules.md#shared-hybrid-block: R1 ([1,2,3],[11,12,13]) and R2 ([21,22,23],[31,12,33]), both async

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

// docs/rules.md#mixed-block-sizes-16-32-64: S=64, P=192

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

// docs/rules.md#full-attention-and-mamba-align and docs/replay.md#example: async, P=144

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

// docs/rules.md#mixed-old-and-new-hits: R1 [a,b,c,d], R2 [a,x,y,z], both async, P=64, I={a,y}

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

// docs/rules.md#full-attention-and-sliding-window: both 16, window 17, S=16, async, P=96

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

// docs/rules.md#async-and-sync-sharing-a-block: A1 [p,q] P=32, S1 [p,r] P=32, I={p}

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

    // Mode `safe`: S1, a sharer, also evicts r2, which its discarded step wrote after reading p.
    let out = run(&g, Mode::Safe, Policy::Recompute, &reqs, &[p]);
    check(&out, 1, 0, 32, &[p], &[], &[p, q]);
    check(&out, 0, 32, 16, &[], &[(p, 1)], &[r2]);
    assert_eq!(out.requests[0].disposition, Disposition::Skip);
    check_lists(&out, &[1, 0], &[0], &[], &[1], 48, &[p, q, r2]);
    let out = run(&g, Mode::Safe, Policy::Fail, &reqs, &[p]);
    check(&out, 0, 32, 16, &[], &[], &[r2]);
    check_lists(&out, &[1, 0], &[], &[1, 0], &[], 48, &[p, q, r2]);
}
