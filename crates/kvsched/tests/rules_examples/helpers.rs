//! What every example builds on: geometries, requests, one run of the rules, and assertions
//! on one request's outcome and on the outcome's lists.

use kvsched::rules::geometry::{BlockId, CacheGroup, Geometry, MambaMode};
use kvsched::rules::recovery::{
    recover, validate_requests, Disposition, InvalidSet, Mode, Outcome, Policy, Request,
    RequestClass,
};

pub fn fa16() -> Geometry {
    Geometry::single_full_attention(16).unwrap()
}

pub fn geo(groups: Vec<CacheGroup>, s: Option<u64>) -> Geometry {
    Geometry::new(groups, s, 0).unwrap()
}

pub fn async_req(id: &str, p: u64, tables: Vec<Vec<BlockId>>) -> Request {
    Request {
        id: id.to_string(),
        class: RequestClass::Async,
        num_computed_tokens: p,
        num_scheduled_tokens: 0,
        block_tables: tables,
    }
}

pub fn sync_req(id: &str, computed: u64, scheduled: u64, tables: Vec<Vec<BlockId>>) -> Request {
    Request {
        id: id.to_string(),
        class: RequestClass::Sync,
        num_computed_tokens: computed,
        num_scheduled_tokens: scheduled,
        block_tables: tables,
    }
}

pub fn run(
    geo: &Geometry,
    mode: Mode,
    policy: Policy,
    reqs: &[Request],
    ids: &[BlockId],
) -> Outcome {
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
pub fn check(
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
pub fn check_unaffected(out: &Outcome, i: usize, nct: u64) {
    let d = &out.requests[i];
    assert_eq!(d.disposition, Disposition::Unaffected, "request {i}");
    assert!(!d.affected(), "request {i}");
    check(out, i, nct, 0, &[], &[], &[]);
}

/// Asserts the outcome's lists (request indices, canonical order) and totals.
#[track_caller]
pub fn check_lists(
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

pub fn range(lo: BlockId, n: u64) -> Vec<BlockId> {
    (lo..lo + n).collect()
}

/// Full attention and Mamba align, both 16 (docs/rules.md#full-attention-and-mamba-align).
pub fn fa_mamba() -> Geometry {
    geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(16, MambaMode::Align),
        ],
        Some(16),
    )
}

/// The requests of the example of docs/replay.md#example.
pub fn s5_requests() -> Vec<Request> {
    vec![
        async_req(
            "a",
            144,
            vec![range(101, 9), vec![0, 0, 0, 0, 0, 0, 0, 0, 201]],
        ),
        sync_req("s", 48, 16, vec![vec![1, 2, 3], vec![0, 0, 9]]),
    ]
}
