//! **Race: an exclusive (inline) step against a parallel step's shard** (`BlockPool::{exclusive,
//! shared}`, and under them `allocate`, `release` and the reclaim path, whose transitions are
//! plain stores in exclusive mode; block contents in a loom `UnsafeCell`).
//!
//! * `exclusive_and_shared_never_hand_out_one_block_twice`: one thread holds the pool
//!   exclusively and allocates, writes and releases a block, while another, as one shard of a
//!   parallel step, allocates under its shared guard; each block goes to one owner at a time
//!   and every access to its contents is ordered.
//! * `exclusive_and_shared_index_accesses_are_ordered`: the exclusive holder registers and
//!   looks up blocks, reaching the prefix index without its locks, while the other thread, as
//!   a shard, looks a hash up under its lock; every access to the index's maps (loom cells)
//!   is ordered.
//! * `exclusive_and_shared_reclaim_queue_accesses_are_ordered`: both threads release cached
//!   blocks (queueing them for reclaim) and allocate, one reclaiming when the free list is
//!   empty; the exclusive holder reaches the reclaim ring without its lock, the shard under
//!   it, and every access to the ring (a loom cell) is ordered.
//!
//! Each ends with a quiescent check: no double free, no invariant violation, the census
//! conserved, and every count-0 block allocatable exactly once.
//!
//! Catches: an exclusive mode that does not keep parallel mutators out (plant
//! `exclusive-unguarded`: a read lock instead of the write lock, so the exclusive holder's
//! plain stores race a shard's compare-and-swap and one block is handed out twice, and its
//! unlocked index and reclaim-ring accesses race the shard's locked ones).

#![cfg(kvsched_loom)]

use kvsched::sync::{thread, Arc};
use kvsched_loom_tests::{model, PoolCells};

/// Runs `shard` on a second thread holding the pool's shared guard and `only` on this one
/// holding it exclusively, on one pool of two usable blocks; returns the pool and both
/// results.
fn exclusive_against_a_shard<T: Send + 'static, U>(
    shard: fn(&PoolCells) -> T,
    only: impl FnOnce(&PoolCells) -> U,
) -> (Arc<PoolCells>, U, T) {
    let s = PoolCells::new(3);
    let other = {
        let s = Arc::clone(&s);
        thread::spawn(move || {
            let _step = s.pool.shared();
            shard(&s)
        })
    };
    let mine = {
        // SAFETY: the other thread reaches the pool only under `shared`.
        let _step = unsafe { s.pool.exclusive() };
        only(&s)
    };
    let theirs = other.join().expect("shard");
    (s, mine, theirs)
}

#[test]
fn exclusive_and_shared_never_hand_out_one_block_twice() {
    model(|| {
        let (s, mine, theirs) = exclusive_against_a_shard(
            |s| {
                let got = s.pool.allocate();
                if let Some(r) = got {
                    s.cell(r).write(2);
                }
                got
            },
            |s| {
                let a = s.pool.allocate().expect("a block is free");
                s.cell(a).write(1);
                s.pool.release(a).expect("held");
                let b = s.pool.allocate().expect("a block is free");
                s.cell(b).write(1);
                b
            },
        );
        let theirs = theirs.expect("a block is free");
        assert_ne!(mine.id, theirs.id, "one block handed out twice");
        s.check_quiescent(&[mine, theirs]);
    });
}

#[test]
fn exclusive_and_shared_index_accesses_are_ordered() {
    model(|| {
        let (s, mine, theirs) = exclusive_against_a_shard(
            |s| {
                let hit = s.pool.lookup(7);
                if let Some(r) = hit {
                    assert_eq!(s.cell(r).read(), 1, "a hit sees the registrant's write");
                }
                hit
            },
            |s| {
                let a = s.pool.allocate().expect("a block is free");
                s.cell(a).write(1);
                assert!(s.pool.register(7, a));
                assert_eq!(s.pool.lookup(7), Some(a), "a second reference");
                s.pool.release(a).expect("held");
                s.pool.release(a).expect("held");
                a
            },
        );
        if let Some(hit) = theirs {
            assert_eq!(hit, mine, "a hit is the registered block");
        }
        let held: Vec<_> = theirs.into_iter().collect();
        s.check_quiescent(&held);
    });
}

#[test]
fn exclusive_and_shared_reclaim_queue_accesses_are_ordered() {
    model(|| {
        // Whichever runs first leaves its block cached and unreferenced (queued); the
        // exclusive holder's second allocation then finds the free list empty and reclaims
        // if the shard ran first, and the shard reclaims if it runs second.
        let (s, mine, theirs) = exclusive_against_a_shard(
            |s| {
                let got = s.pool.allocate();
                if let Some(r) = got {
                    assert!(s.pool.register(20, r));
                    s.pool.release(r).expect("held");
                }
                got
            },
            |s| {
                let a = s.pool.allocate().expect("a block is free");
                assert!(s.pool.register(10, a));
                s.pool.release(a).expect("held");
                s.pool.allocate().expect("a block is free or reclaimable")
            },
        );
        if let Some(t) = theirs {
            assert!(
                t.id != mine.id || t.generation != mine.generation,
                "one use of a block handed out twice"
            );
        }
        s.check_quiescent(&[mine]);
    });
}
