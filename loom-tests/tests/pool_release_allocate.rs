//! **Race: the last reference release racing allocation** (`BlockPool::{release, allocate,
//! register, lookup}` on the packed state word, free list and reclaim queue; block contents in
//! a loom `UnsafeCell`).
//!
//! * `last_release_races_allocate`: two holders of one uncached block read it and release
//!   their references concurrently while a third thread allocates; the block is handed out
//!   again only after both releases, and the new owner's write is ordered after both reads.
//! * `cached_release_races_reclaim_and_lookup`: the same block is cached (registered under a
//!   hash); one holder releases, the other releases and then looks the hash up again, while
//!   the allocator reclaims; the lookup hit and the reclaim never both get the block, and
//!   every access to its contents is ordered.
//!
//! Both end with a quiescent check: no double free, no stale release, no invariant violation,
//! the census conserved, and every count-0 block allocatable exactly once.
//!
//! Catches: a release whose CAS is not Release (plant `release-relaxed`: loom reports the new
//! owner's write racing an old holder's read — use after free), a block handed out while still
//! referenced, a block freed twice or leaked, a lookup that revives a reclaimed block.

#![cfg(kvsched_loom)]

use kvsched::pool::BlockRef;
use kvsched::sync::{thread, Arc};
use kvsched_loom_tests::{model, PoolCells};

#[test]
fn last_release_races_allocate() {
    model(|| {
        let s = PoolCells::new(3);
        let a = s.pool.allocate().unwrap();
        let b = s.pool.allocate().unwrap(); // held throughout: the free list is empty
        s.cell(a).write(7);
        s.pool.retain(a).unwrap();
        let holders: Vec<_> = (0..2)
            .map(|_| {
                let s = Arc::clone(&s);
                thread::spawn(move || {
                    assert_eq!(s.cell(a).read(), 7);
                    s.pool.release(a).unwrap();
                })
            })
            .collect();
        // The allocator: only `a` can come back, and only once both holders let go.
        let mut got = None;
        for _ in 0..2 {
            if let Some(r) = s.pool.allocate() {
                assert_eq!(
                    r,
                    BlockRef {
                        id: a.id,
                        generation: a.generation + 1
                    }
                );
                s.cell(r).write(9);
                got = Some(r);
                break;
            }
            thread::yield_now();
        }
        for h in holders {
            h.join().unwrap();
        }
        let held: Vec<BlockRef> = [Some(b), got].into_iter().flatten().collect();
        s.check_quiescent(&held);
    });
}

#[test]
fn cached_release_races_reclaim_and_lookup() {
    const HASH: u64 = 5;
    model(|| {
        let s = PoolCells::new(2); // one usable block: allocation must reclaim it
        let a = s.pool.allocate().unwrap();
        s.cell(a).write(7);
        assert!(s.pool.register(HASH, a));
        s.pool.retain(a).unwrap();
        let h1 = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                assert_eq!(s.cell(a).read(), 7);
                s.pool.release(a).unwrap();
            })
        };
        let h2 = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                s.pool.release(a).unwrap();
                // A prefix hit on the same hash: revives the block unless it was reclaimed.
                let hit = s.pool.lookup(HASH);
                if let Some(r) = hit {
                    assert_eq!(r, a, "a hit names the registered use");
                    assert_eq!(s.cell(r).read(), 7);
                }
                hit
            })
        };
        let got = s.pool.allocate();
        if let Some(r) = got {
            assert_eq!(
                r,
                BlockRef {
                    id: a.id,
                    generation: a.generation + 1
                }
            );
            s.cell(r).write(9);
        }
        h1.join().unwrap();
        let hit = h2.join().unwrap();
        assert!(
            !(got.is_some() && hit.is_some()),
            "a reclaimed block was revived (or a revived one reclaimed)"
        );
        if got.is_some() {
            assert_eq!(
                s.pool.lookup(HASH),
                None,
                "a reclaimed block stays in the index"
            );
        }
        let held: Vec<BlockRef> = [got, hit].into_iter().flatten().collect();
        s.check_quiescent(&held);
    });
}
