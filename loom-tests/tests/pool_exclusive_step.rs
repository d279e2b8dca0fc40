//! **Race: an exclusive (inline) step against a parallel step's shard** (`BlockPool::{exclusive,
//! shared}`, and under them `allocate`, `release` and the reclaim path, whose transitions are
//! plain stores in exclusive mode; block contents in a loom `UnsafeCell`).
//!
//! * `exclusive_and_shared_never_hand_out_one_block_twice`: one thread holds the pool
//!   exclusively and allocates, writes and releases a block, while another, as one shard of a
//!   parallel step, allocates under its shared guard; each block goes to one owner at a time
//!   and every access to its contents is ordered.
//!
//! It ends with a quiescent check: no double free, no invariant violation, the census
//! conserved, and every count-0 block allocatable exactly once.
//!
//! Catches: an exclusive mode that does not keep parallel mutators out (plant
//! `exclusive-unguarded`: a read lock instead of the write lock, so the exclusive holder's
//! plain stores race a shard's compare-and-swap and one block is handed out twice).

#![cfg(kvsched_loom)]

use kvsched::sync::{thread, Arc};
use kvsched_loom_tests::{model, PoolCells};

#[test]
fn exclusive_and_shared_never_hand_out_one_block_twice() {
    model(|| {
        let s = PoolCells::new(3); // two usable blocks
        let shard = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                let _step = s.pool.shared();
                let got = s.pool.allocate();
                if let Some(r) = got {
                    s.cell(r).write(2);
                }
                got
            })
        };
        let mine = {
            let _step = s.pool.exclusive();
            let a = s.pool.allocate().expect("a block is free");
            s.cell(a).write(1);
            s.pool.release(a).expect("held");
            let b = s.pool.allocate().expect("a block is free");
            s.cell(b).write(1);
            b
        };
        let theirs = shard.join().expect("shard").expect("a block is free");
        assert_ne!(mine.id, theirs.id, "one block handed out twice");
        s.check_quiescent(&[mine, theirs]);
    });
}
