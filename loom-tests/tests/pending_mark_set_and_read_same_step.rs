//! **Race: pending marks set at decide and read in the same step on another shard**
//! (`ClaimTable::{set_pending, clear_pending, pending_owner}`; steps separated by the real
//! `PhaseBarrier`; block contents in a loom `UnsafeCell`).
//!
//! Phase 3 of a step runs on every shard at once with no barrier inside it: each shard
//! decides (a new owner's `set_pending`, a Relaxed store), applies the last step's output (an
//! owner that recomputed a block clears its mark, a Release compare-exchange) and schedules
//! (a sharer tests its marks with an Acquire load, and reads a block whose mark is clear).
//!
//! `new_mark_and_clear_read_across_shards`: block 1 was orphaned (its owner ended) and is
//! reported again this step; O2 on shard B wins it. Block 2 is owned by O1 on shard A, which
//! recomputed it. In the same phase 3, shard B marks block 1 for O2 and schedules a sharer
//! waiting for block 2, while shard A clears O1's mark of block 2 and schedules a sharer
//! waiting for block 1; after the step's barrier, shard A's sharer tests block 1 again.
//!
//! * The sharer testing block 1 in the same step sees the orphan mark or O2's, never a clear
//!   one; in the next step it sees O2's (waiters learn of a mark set at decide through the
//!   step boundary, not through the Relaxed store).
//! * A sharer that sees block 2's mark clear reads O1's recomputed contents, in order.
//!
//! Catches: a clear that is not Release (plant `clear-pending-relaxed`: the read of block 2
//! races O1's write), a step boundary that does not order the decide's marks (plant
//! `barrier-relaxed`: the next step's test reads the orphan mark again), a mark that passes
//! through "clear" on its way to the new owner.
//!
//! Left out, because loom cannot check it: the old owner's clear racing a new owner's mark on
//! the *same* block (a compare-exchange against a plain store). loom keeps each word's
//! modification order partial, so after such a race it lets a later load read the clear even
//! where the store must follow it (tokio-rs/loom#282, #389) and reports a lost mark that the
//! memory model rules out: the exchange either read the old owner's key, and the store comes
//! after it, or read the new owner's and failed.

#![cfg(kvsched_loom)]

use kvsched::runtime::claim::{ClaimTable, ORPHANED};
use kvsched::sync::{thread, Arc, PhaseBarrier};
use kvsched_loom_tests::{key, model, BlockContents};

/// What a failed load left in a block.
const GARBAGE: u64 = 0;
/// Block 2's contents as O1 recomputed them.
const RECOMPUTED_BY_O1: u64 = 101;

#[test]
fn new_mark_and_clear_read_across_shards() {
    model(|| {
        let (o0, o1, o2) = (key(1), key(2), key(3));
        let t = Arc::new(ClaimTable::new(3));
        let cell2 = Arc::new(BlockContents::new(GARBAGE));
        let barrier = Arc::new(PhaseBarrier::new(2));
        // Earlier steps: O0 owned block 1 and ended (orphaned it); O1 owns block 2.
        t.set_pending(1, o0);
        t.orphan(1, o0);
        t.set_pending(2, o1);
        let shard_a = {
            let (t, cell2, barrier) = (Arc::clone(&t), Arc::clone(&cell2), Arc::clone(&barrier));
            thread::spawn(move || {
                // Phase 3, apply_outputs: O1 recomputed block 2.
                cell2.write(RECOMPUTED_BY_O1);
                assert!(t.clear_pending(2, o1));
                // Phase 3, schedule: a sharer waiting for block 1 since it was orphaned.
                let m = t.pending_owner(1);
                assert!(
                    m == Some(ORPHANED) || m == Some(o2.raw()),
                    "block 1 read as clear while it changed owners: {m:?}"
                );
                barrier.wait(); // end of the step
                                // Next step: the same test sees the new owner's mark.
                assert_eq!(
                    t.pending_owner(1),
                    Some(o2.raw()),
                    "the next step missed the mark set at decide"
                );
            })
        };
        // Phase 3 of shard B: decide (O2 won block 1 this step), then schedule a sharer
        // waiting for block 2.
        t.set_pending(1, o2);
        match t.pending_owner(2) {
            None => assert_eq!(cell2.read(), RECOMPUTED_BY_O1, "read before the recompute"),
            Some(owner) => assert_eq!(owner, o1.raw()),
        }
        barrier.wait(); // end of the step
        shard_a.join().unwrap();
        assert_eq!(t.pending_owner(1), Some(o2.raw()));
        assert_eq!(t.pending_owner(2), None);
    });
}
