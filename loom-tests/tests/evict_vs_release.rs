//! `evict` racing a lock-free `release` (and `retain`) of the same cached block by
//! another holder. Eviction clears `CACHED` with a compare-and-swap under the index shard's
//! lock, but release and retain take no index lock: the eviction's transition must not lose
//! their count changes, and the claim that later hands the slot out must still be ordered
//! after the releasers' accesses (the eviction is an RMW in the last release's sequence).
//! Plant `evict-cas-store` (an eviction's plain store loses a count change).
#![cfg(kvsched_loom)]

use kvsched::sync::{thread, Arc};
use kvsched_loom_tests::{model, PoolCells};

const H: u64 = 5;

#[test]
fn evict_races_release_of_another_holder() {
    model(|| {
        let s = PoolCells::new(2); // one usable block
        let a = s.pool.allocate().unwrap();
        s.cell(a).write(7);
        assert!(s.pool.register(H, a));
        s.pool.retain(a).unwrap(); // two holders
        let releaser = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                assert_eq!(s.cell(a).read(), 7);
                s.pool.release(a).unwrap();
            })
        };
        let evictor = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                let _ = s.pool.evict(a.id);
                s.pool.release(a).unwrap();
            })
        };
        releaser.join().unwrap();
        evictor.join().unwrap();
        // Both references are gone: the block must be allocatable again, exactly once, and
        // its new owner's write ordered after the releasers' reads.
        let r = s.pool.allocate().expect("the block came back");
        s.cell(r).write(9);
        assert_eq!(s.pool.allocate(), None, "handed out twice");
        s.check_quiescent(&[r]);
    });
}

#[test]
fn evict_races_retain_and_release() {
    model(|| {
        let s = PoolCells::new(2);
        let a = s.pool.allocate().unwrap();
        assert!(s.pool.register(H, a));
        let holder = {
            let s = Arc::clone(&s);
            thread::spawn(move || {
                s.pool.retain(a).unwrap();
                s.pool.release(a).unwrap();
            })
        };
        let evictor = {
            let s = Arc::clone(&s);
            thread::spawn(move || s.pool.evict(a.id))
        };
        holder.join().unwrap();
        let _ = evictor.join().unwrap();
        assert_eq!(s.pool.ref_count(a.id), 1, "a count change was lost");
        s.pool.release(a).unwrap();
        s.check_quiescent(&[]);
    });
}
