//! **Race: a late load's worker writing its destination while the shard reuses memory**
//! (`BlockPool::{begin_fill, is_filling, end_fill, release, allocate}` on the packed state
//! word; block bytes in the real `HostKvMemory`).
//!
//! * `late_load_never_lands_in_a_reused_block`: a load owns block `d` (FILLING). Its worker
//!   checks it may still write `d` and writes its bytes, then reports completion. Meanwhile the
//!   shard gives up on the load (its deadline passed) and tries to drop the request's
//!   reference to `d`, then allocates a block for the recompute, writes it and reads it back.
//!   The fill flag must keep `d` out of the free list until the completion is applied: the
//!   recompute's block never holds the late worker's bytes. After the completion the shard
//!   ends the fill and releases; the pool is quiescent.
//! * `completion_orders_the_load_before_the_next_owner`: the completion is applied first
//!   (end fill, release), then a third thread allocates `d` again and writes and reads it;
//!   the worker's bytes never appear in the new owner's block.
//!
//! Catches: a last release of a filling block that frees it (plant
//! `fill-release-unguarded`: the recompute gets `d` and reads the late worker's bytes).

#![cfg(kvsched_loom)]

use kvsched::kv::{HostKvMemory, KvLayout, KvMemory};
use kvsched::pool::{BlockPool, BlockRef};
use kvsched::sync::{thread, Arc, AtomicBool, Ordering};
use kvsched_loom_tests::model;

const LATE: [u8; 8] = [0xAA; 8];
const FRESH: [u8; 8] = [0xBB; 8];

struct Shared {
    pool: BlockPool,
    mem: HostKvMemory,
    /// The worker's completion (a completion queue of one).
    done: AtomicBool,
}

fn setup() -> (Arc<Shared>, BlockRef) {
    let layout = KvLayout::new(vec![8]).expect("layout");
    let s = Arc::new(Shared {
        pool: BlockPool::new(3).expect("pool"),
        mem: HostKvMemory::new(layout, 3).expect("memory"),
        done: AtomicBool::new(false),
    });
    let d = s.pool.allocate().expect("destination");
    s.pool.begin_fill(d).expect("fill");
    (s, d)
}

/// The load's worker: writes `d` only while the pool says the load owns it, then completes.
fn worker(s: &Shared, d: BlockRef) {
    if s.pool.is_filling(d) {
        s.mem.write(0, d.id, 0, &LATE).expect("write");
    }
    // Release: pairs with the Acquire load in `apply_completion`.
    s.done.store(true, Ordering::Release);
}

/// The shard applying the completion once it arrives: ends the fill, drops the reference.
fn apply_completion(s: &Shared, d: BlockRef) {
    // Acquire: pairs with the worker's Release store.
    while !s.done.load(Ordering::Acquire) {
        thread::yield_now();
    }
    s.pool.end_fill(d).expect("end fill");
    let _ = s.pool.release(d);
}

fn write_and_read_back(s: &Shared, b: BlockRef) {
    s.mem.write(0, b.id, 0, &FRESH).expect("write");
    let mut back = [0u8; 8];
    s.mem.read(0, b.id, 0, &mut back).expect("read");
    assert_eq!(
        back, FRESH,
        "a late load's bytes landed in reused block {b:?}"
    );
}

#[test]
fn late_load_never_lands_in_a_reused_block() {
    model(|| {
        let (s, d) = setup();
        let w = {
            let s = Arc::clone(&s);
            thread::spawn(move || worker(&s, d))
        };
        // The deadline passed: the shard drops the request's reference (refused while the
        // load owns the block) and recomputes into a fresh block.
        let dropped = s.pool.release(d).is_ok();
        let fresh = s.pool.allocate().expect("a block for the recompute");
        write_and_read_back(&s, fresh);
        w.join().expect("worker");
        if !dropped {
            apply_completion(&s, d);
        }
        let _ = s.pool.release(fresh);
        assert_eq!(s.pool.double_frees(), 0);
        assert!(s.pool.census().conserved());
    });
}

#[test]
fn completion_orders_the_load_before_the_next_owner() {
    model(|| {
        let (s, d) = setup();
        let w = {
            let s = Arc::clone(&s);
            thread::spawn(move || worker(&s, d))
        };
        let next = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                // Whatever it gets — `d` once freed, or the other block — holds its bytes.
                if let Some(b) = s.pool.allocate() {
                    write_and_read_back(&s, b);
                    let _ = s.pool.release(b);
                }
            })
        };
        apply_completion(&s, d);
        w.join().expect("worker");
        next.join().expect("next owner");
        assert_eq!(s.pool.invariant_violations(), 0);
        assert_eq!(s.pool.census().referenced, 0);
    });
}
