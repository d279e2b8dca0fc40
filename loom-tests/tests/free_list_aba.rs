//! **Race: free-list push/pop and ABA** (`BlockPool`'s tagged Treiber stack, driven through
//! `allocate` and `release`).
//!
//! * `aba_pop_against_pop_pop_push`: the classic ABA schedule. One thread pops (reads the head
//!   slot 1 and its link 2) while another pops 1, pops 2 and pushes 1 back; the head is slot 1
//!   again, so an untagged CAS succeeds and installs slot 2 — which is allocated — as the head.
//! * `concurrent_pushes_and_pop`: two releases push concurrently while a third thread pops.
//!
//! Both end with a quiescent check: every block not held is allocatable exactly once, no
//! invariant violation (a pop that found a slot that was not free), the census conserved.
//!
//! Catches: a head without an ABA tag or a tag not bumped on every change (plant
//! `free-list-no-tag`: the pool pops an allocated slot — counted as an invariant violation —
//! or hands one out twice), a link read not ordered after its push (Acquire/Release on the
//! head), a lost push.

#![cfg(kvsched_loom)]

use kvsched::pool::{BlockPool, BlockRef};
use kvsched::sync::{thread, Arc};
use kvsched_loom_tests::{check_quiescent, model};

#[test]
fn aba_pop_against_pop_pop_push() {
    model(|| {
        // Slots 1, 2, 3; the free list is 1 → 2 → 3.
        let p = Arc::new(BlockPool::new(4).unwrap());
        let h = {
            let p = Arc::clone(&p);
            thread::spawn(move || p.allocate())
        };
        let x = p.allocate().unwrap();
        let y = p.allocate().unwrap();
        p.release(x).unwrap();
        let z = h.join().unwrap();
        let held: Vec<BlockRef> = [Some(y), z].into_iter().flatten().collect();
        check_quiescent(&p, &held);
    });
}

#[test]
fn concurrent_pushes_and_pop() {
    model(|| {
        let p = Arc::new(BlockPool::new(4).unwrap());
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        let hs: Vec<_> = [a, b]
            .into_iter()
            .map(|r| {
                let p = Arc::clone(&p);
                thread::spawn(move || p.release(r).unwrap())
            })
            .collect();
        let z = p.allocate();
        for h in hs {
            h.join().unwrap();
        }
        let held: Vec<BlockRef> = z.into_iter().collect();
        check_quiescent(&p, &held);
    });
}
