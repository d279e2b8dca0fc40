//! **Race: a stale completion for a freed and reused block** (`BlockPool::is_current` racing
//! `release` + `allocate`; the completion travels through the real completion queue; shards
//! step through the real `PhaseBarrier`).
//!
//! A worker's load of request R failed on block `r` (generation 1) and it pushes the
//! completion. Meanwhile shard B ends R: it releases `r`, and a new request allocates the same
//! slot (generation 2) and writes it. Shard A drains its queue in the same step and in the next
//! one, validating each named block with `is_current` as `Shard::publish` does.
//!
//! * In the racing step either verdict may come out (a snapshot), but "stale" is final: the
//!   slot's generation never goes back.
//! * A completion drained in the step after the reuse (ordered by the step barrier) is always
//!   stale.
//! * A stale reference never touches the new use: `release(r)` is refused as `Stale` and the
//!   new use keeps count 1.
//!
//! Catches: allocation that does not bump the generation, an `is_current` that can read a
//! generation older than one ordered before it (e.g. plant `barrier-relaxed`), a stale
//! reference that frees the block's new use.

#![cfg(kvsched_loom)]

use std::time::Instant;

use kvsched::connector::{InvalidBlocks, LoadResult};
use kvsched::pool::{BlockPool, BlockRef, PoolError};
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::worker::Completion;
use kvsched::sync::{spin_hint, thread, Arc, ArrayQueue, PhaseBarrier};
use kvsched_loom_tests::{model, BlockContents};

struct Shared {
    pool: BlockPool,
    queue: ArrayQueue<Completion>,
    barrier: PhaseBarrier,
    contents: BlockContents,
}

/// Shard A's validation of one drained completion: `Some(verdict)` per named block.
fn validate(s: &Shared, c: Completion) -> Vec<(BlockRef, bool)> {
    match c.result {
        LoadResult::Ok => Vec::new(),
        LoadResult::Failed(bad) => bad
            .into_flat()
            .into_iter()
            .map(|b| (b, s.pool.is_current(b)))
            .collect(),
    }
}

/// A stale verdict is final, and a stale reference is refused without touching the new use.
fn check_stale(s: &Shared, r: BlockRef) {
    assert!(!s.pool.is_current(r), "the generation went back");
    match s.pool.release(r) {
        Err(PoolError::Stale { block, current }) => {
            assert_eq!(block, r);
            assert_eq!(current, r.generation + 1);
        }
        other => panic!("a stale release was not refused: {other:?}"),
    }
}

#[test]
fn stale_completion_for_reused_block() {
    model(|| {
        let pool = BlockPool::new(2).unwrap(); // one usable block: reuse takes the same slot
        let r = pool.allocate().unwrap();
        let s = Arc::new(Shared {
            pool,
            queue: ArrayQueue::new(1),
            barrier: PhaseBarrier::new(2),
            contents: BlockContents::new(0),
        });
        let worker = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                let mut c = Completion {
                    key: RequestKey::new(false, 0, 1),
                    attempt: 1,
                    result: LoadResult::Failed(InvalidBlocks::Flat(vec![r])),
                    panicked: false,
                    started_at: Instant::now(),
                    finished_at: Instant::now(),
                };
                while let Err(back) = s.queue.push(c) {
                    c = back;
                    spin_hint();
                }
            })
        };
        let shard_b = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                // Step N+1: request R ends; a new request reuses the slot.
                s.pool.release(r).unwrap();
                let r2 = s.pool.allocate().expect("the released slot");
                assert_eq!(
                    r2,
                    BlockRef {
                        id: r.id,
                        generation: r.generation + 1
                    }
                );
                s.contents.write(2);
                s.barrier.wait(); // end of step N+1
                r2
            })
        };
        // Shard A, step N+1: drain and validate (races the reuse).
        let mut verdicts = Vec::new();
        if let Some(c) = s.queue.pop() {
            verdicts.extend(validate(&s, c));
        }
        for &(b, current) in &verdicts {
            if !current {
                check_stale(&s, b);
            }
        }
        s.barrier.wait(); // end of step N+1
                          // Step N+2: the reuse is ordered before us; whatever is drained now is stale.
        if let Some(c) = s.queue.pop() {
            for (b, current) in validate(&s, c) {
                assert!(
                    !current,
                    "a completion drained after the reuse passed as current"
                );
                check_stale(&s, b);
            }
        }
        let r2 = shard_b.join().unwrap();
        worker.join().unwrap();
        assert_eq!(s.contents.read(), 2);
        assert_eq!(
            s.pool.ref_count(r2.id),
            1,
            "a stale reference touched the new use"
        );
        assert_eq!(s.pool.double_frees(), 0);
        assert!(s.pool.census().conserved());
    });
}
