//! The verifying checker's positive control, on a constructed shared-prefix case driven by
//! the rules themselves: two running requests share a 64-token prefix; a block of it is
//! reported invalid (its bytes are poison). Mode `vllm` returns the second request (an old
//! hit only) to its pre-step length at once, so in the next step it reads the shared block
//! before the owner has recomputed it — garbage. Mode `safe` makes it wait for the owner and
//! reads none. Also on a hybrid geometry (full attention + sliding window + Mamba).

use std::sync::Arc;

use kvsched::kv::{HostKvMemory, KvLayout, KvMemory};
use kvsched::rules::geometry::Geometry;
use kvsched::rules::recovery::{recover, InvalidSet, Request, RequestClass};
use kvsched::{BlockRef, BlockTable, CacheGroup, MambaMode, Mode, Policy};
use kvsched_testkit::KvChecker;

fn table(ids: &[u64]) -> BlockTable {
    ids.iter()
        .map(|&id| BlockRef { id, generation: 0 })
        .collect()
}

/// Garbage units read by the two requests over the steps after the report.
fn garbage_after_report(groups: Vec<CacheGroup>, mode: Mode) -> u64 {
    let geo = Geometry::new(groups.clone(), Some(16), 0).expect("geometry");
    let layout = KvLayout::for_groups(&groups, 8, 32).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 64).expect("memory"));
    let mut checker = KvChecker::new(groups.clone(), 1, 8, 32, Arc::clone(&memory));
    let shared: Vec<u32> = (1..=64).collect();
    let prompt = |tail: u32| {
        let mut p = shared.clone();
        p.extend((0..32).map(|t| tail + t));
        p
    };
    checker.add_request("a", &prompt(1000));
    checker.add_request("b", &prompt(2000));
    // Per group: shared blocks for the prefix's 4 entries, then each request's own 2.
    let g = groups.len() as u64;
    let tables = |own: u64| -> Vec<BlockTable> {
        (0..g)
            .map(|k| {
                let base = 1 + k * 10;
                table(&[
                    base,
                    base + 1,
                    base + 2,
                    base + 3,
                    own + k * 10,
                    own + k * 10 + 1,
                ])
            })
            .collect()
    };
    let (ta, tb) = (tables(5), tables(7));
    // a computes the prefix and its own first block; b shares the prefix and computes its own.
    assert_eq!(checker.compute("a", 0, 80, &ta), 0);
    assert_eq!(
        checker.compute("b", 64, 16, &tb),
        0,
        "the shared prefix reads back intact"
    );
    // The report: entry 2 of the full-attention group (tokens 32..48) holds garbage.
    let bad = ta[0][2].id;
    memory.poison(0, bad).expect("poison");
    let reqs: Vec<Request> = [("a", &ta), ("b", &tb)]
        .iter()
        .map(|(id, t)| Request {
            id: id.to_string(),
            class: RequestClass::Sync,
            num_computed_tokens: 80,
            num_scheduled_tokens: 16,
            block_tables: t.iter().map(|t| t.iter().map(|r| r.id).collect()).collect(),
        })
        .collect();
    let out = recover(
        &geo,
        mode,
        Policy::Recompute,
        &reqs,
        &InvalidSet::flat([bad], &geo),
    );
    let [oa, ob] = [&out.requests[0], &out.requests[1]];
    assert!(
        oa.num_computed_tokens <= 32,
        "a owns the block and recomputes it: {oa:?}"
    );
    let mut garbage = 0;
    // Next step: every runnable request reads before anyone writes. b runs unless it waits.
    let b_runs = ob.waits_for.is_empty();
    if b_runs {
        garbage += checker.compute("b", ob.num_computed_tokens, 1, &tb);
    }
    garbage += checker.compute(
        "a",
        oa.num_computed_tokens,
        80 - oa.num_computed_tokens,
        &ta,
    );
    if !b_runs {
        // The owner is past the block: the waiter runs now.
        garbage += checker.compute("b", ob.num_computed_tokens, 1, &tb);
    }
    garbage
}

fn hybrid() -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(16),
        CacheGroup::sliding_window(16, 48),
        CacheGroup::mamba(16, MambaMode::All),
    ]
}

#[test]
fn vllm_lets_a_sharer_read_the_block_its_owner_is_recomputing() {
    assert!(garbage_after_report(vec![CacheGroup::full_attention(16)], Mode::Vllm) > 0);
    assert!(garbage_after_report(hybrid(), Mode::Vllm) > 0);
}

#[test]
fn safe_makes_the_sharer_wait_and_reads_no_garbage() {
    assert_eq!(
        garbage_after_report(vec![CacheGroup::full_attention(16)], Mode::Safe),
        0
    );
    assert_eq!(garbage_after_report(hybrid(), Mode::Safe), 0);
}
