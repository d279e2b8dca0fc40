//! The explanation's candidates in mode `safe` (docs/replay.md#explain,
//! `candidates.short_table`): a table too short to resume above its length is named when it
//! lowers the first candidate below `floor(earliest_new_hit / S) · S`, and only then.

use kvsched::rules::geometry::{CacheGroup, Geometry};
use kvsched::rules::recovery::{
    recover_explained, InvalidSet, Mode, Policy, Request, RequestClass,
};

fn async_req(p: u64, tables: Vec<Vec<u64>>) -> Request {
    Request {
        id: "r".into(),
        class: RequestClass::Async,
        num_computed_tokens: p,
        num_scheduled_tokens: 0,
        block_tables: tables,
    }
}

/// Group 1's table holds tokens below 32 only, but the earliest new hit (40) rounds down to 32
/// anyway: nothing was lowered, so no short table is named.
#[test]
fn a_short_table_that_lowers_nothing_is_not_named() {
    let geo = Geometry::new(
        vec![
            CacheGroup::full_attention(8),
            CacheGroup::full_attention(16),
        ],
        Some(16),
        0,
    )
    .unwrap();
    // Group 0: 8 entries (tokens 0..64), block 6 at entry 5 (position 40); group 1: 2 entries.
    let reqs = vec![async_req(64, vec![(1..=8).collect(), vec![21, 22]])];
    let inv = InvalidSet::flat([6u64], &geo);
    let (out, traces) = recover_explained(&geo, Mode::Safe, Policy::Recompute, &reqs, &inv);
    assert_eq!(out.requests[0].num_computed_tokens, 32);
    let c = traces[0].candidates.expect("candidates");
    assert_eq!((c.earliest_new, c.start), (40, 32));
    assert!(c.short_table.is_none(), "{:?}", c.short_table);
}

/// Group 1's two entries lower the first candidate from 48 to 32: it is named, and 32, being
/// resumable, rejects nothing.
#[test]
fn a_short_table_that_lowers_the_first_candidate_is_named() {
    let geo = Geometry::new(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::full_attention(16),
        ],
        None,
        0,
    )
    .unwrap();
    let reqs = vec![async_req(64, vec![vec![1, 2, 3, 4], vec![21, 22]])];
    let inv = InvalidSet::flat([4u64], &geo); // entry 3, position 48
    let (out, traces) = recover_explained(&geo, Mode::Safe, Policy::Recompute, &reqs, &inv);
    assert_eq!(out.requests[0].num_computed_tokens, 32);
    let c = traces[0].candidates.expect("candidates");
    assert_eq!((c.earliest_new, c.start), (48, 32));
    let st = c.short_table.expect("group 1 lowered the first candidate");
    assert_eq!((st.group, st.len), (1, 2));
    assert!(traces[0].rejected.is_empty(), "{:?}", traces[0].rejected);
}
