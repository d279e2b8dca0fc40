//! **Race: ownership hand-off between an owner and the sharers waiting for it**
//! (`ClaimTable::{set_pending, orphan, clear_pending, pending_owner}`, block contents in a loom
//! `UnsafeCell`, steps separated by the real `PhaseBarrier`).
//!
//! * `waiter_reads_recomputed_contents`: the owner recomputes the block and clears its mark
//!   while a sharer polls the mark; a sharer that sees the mark cleared reads the recomputed
//!   contents, ordered after the owner's write (Release clear / Acquire check).
//! * `owner_aborts_while_sharer_waits`: the owner's request ends before recomputing; it
//!   orphans the block and hands it off through the next step's report while two sharers
//!   poll the mark (they never read the block); in the next step both sharers claim it, the
//!   least wins and marks it pending, and in the step after it recomputes and clears the mark
//!   while the other sharer polls — the other sharer reads only the new owner's contents.
//!
//! Catches: a clear that is not Release or a check that is not Acquire (plant
//! `clear-pending-relaxed`: loom reports the sharer's read racing the owner's write), a sharer
//! that reads an orphaned or still-pending block, a mark cleared by a request that is not the
//! owner, a hand-off that loses the block (nobody owns it in the next step), a step boundary
//! that does not order the marks (plant `barrier-relaxed`).

#![cfg(kvsched_loom)]

use kvsched::runtime::claim::{ClaimTable, RequestKey, Scan, ORPHANED};
use kvsched::sync::{thread, Arc, PhaseBarrier};
use kvsched_loom_tests::{model, BlockContents};

const BLOCK: u64 = 1;
/// What a failed load left in the block.
const GARBAGE: u64 = 0;

fn key(seq: u64) -> RequestKey {
    RequestKey::new(false, 0, seq)
}

/// Contents recomputed by the request `seq`.
fn recomputed_by(seq: u64) -> u64 {
    100 + seq
}

/// A sharer's check before it is scheduled: `true` (and the block read, checked to hold
/// `expect`) once the mark is clear; never a read while it is set.
fn sharer_check(t: &ClaimTable, cell: &BlockContents, expect: u64) -> bool {
    match t.pending_owner(BLOCK) {
        None => {
            assert_eq!(cell.read(), expect, "sharer read a block not recomputed");
            true
        }
        Some(_) => false,
    }
}

#[test]
fn waiter_reads_recomputed_contents() {
    model(|| {
        let t = Arc::new(ClaimTable::new(2));
        let cell = Arc::new(BlockContents::new(GARBAGE));
        // Decided in an earlier step (the step boundary orders the mark before both threads).
        t.set_pending(BLOCK, key(1));
        let owner = {
            let (t, cell) = (Arc::clone(&t), Arc::clone(&cell));
            thread::spawn(move || {
                cell.write(recomputed_by(1));
                assert!(!t.clear_pending(BLOCK, key(2)), "a sharer cleared the mark");
                assert!(t.clear_pending(BLOCK, key(1)));
            })
        };
        for _ in 0..2 {
            if sharer_check(&t, &cell, recomputed_by(1)) {
                break;
            }
            thread::yield_now();
        }
        owner.join().unwrap();
        assert_eq!(t.pending_owner(BLOCK), None);
        assert!(sharer_check(&t, &cell, recomputed_by(1)));
    });
}

#[test]
fn owner_aborts_while_sharer_waits() {
    // Shard A runs the owner (seq 1, which ends) and the sharer seq 3; shard B runs the sharer
    // seq 2, which takes the block over. Shard A also plays the engine's share of the report.
    model(|| {
        let t = Arc::new(ClaimTable::new(2));
        let cell = Arc::new(BlockContents::new(GARBAGE));
        let barrier = Arc::new(PhaseBarrier::new(2));
        // Step N decided: seq 1 owns the block, seqs 2 and 3 wait for it.
        t.set_pending(BLOCK, key(1));
        let shard_b = {
            let (t, cell, barrier) = (Arc::clone(&t), Arc::clone(&cell), Arc::clone(&barrier));
            thread::spawn(move || {
                // Step N+1: seq 2 polls the mark; it is owned or orphaned, never clear.
                assert!(!sharer_check(&t, &cell, GARBAGE));
                barrier.wait(); // end of step N+1
                barrier.wait(); // step N+2: report published
                t.claim(BLOCK, Scan::Async, key(2));
                barrier.wait(); // every hit claimed
                assert_eq!(t.winner(BLOCK, Scan::Async), Some(key(2)));
                t.set_pending(BLOCK, key(2));
                barrier.wait(); // end of step N+2
                                // Step N+3: seq 2 recomputes the block and clears its mark.
                cell.write(recomputed_by(2));
                assert!(t.clear_pending(BLOCK, key(2)));
            })
        };
        // Step N+1: seq 1 ends before recomputing: it orphans the block and hands it off in
        // its step result; seq 3 polls the mark.
        t.orphan(BLOCK, key(1));
        assert!(
            !t.clear_pending(BLOCK, key(1)),
            "an orphaned mark is not the owner's"
        );
        let handoffs = [BLOCK];
        assert!(!sharer_check(&t, &cell, GARBAGE));
        assert_eq!(t.pending_owner(BLOCK), Some(ORPHANED));
        barrier.wait(); // end of step N+1
                        // Step N+2: the hand-off is in the engine's share of the report.
        for &b in &handoffs {
            t.reset(b);
        }
        barrier.wait(); // report published
        t.claim(BLOCK, Scan::Async, key(3));
        barrier.wait(); // every hit claimed
        assert_eq!(
            t.winner(BLOCK, Scan::Async),
            Some(key(2)),
            "seq 3 must wait for seq 2"
        );
        barrier.wait(); // end of step N+2
                        // Step N+3: seq 3 (waits set last step) polls the mark while seq 2 recomputes.
        let mut read = false;
        for _ in 0..2 {
            if sharer_check(&t, &cell, recomputed_by(2)) {
                read = true;
                break;
            }
            thread::yield_now();
        }
        shard_b.join().unwrap();
        assert!(read || sharer_check(&t, &cell, recomputed_by(2)));
    });
}
