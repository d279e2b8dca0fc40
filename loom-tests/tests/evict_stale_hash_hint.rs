//! `evict` racing a re-registration of the same block under another hash. The
//! block's hash word still names its old hash `H1` (now another block's entry) until the
//! registration stores `H2`; evict must not act on `H1`'s entry meanwhile. Checks that the
//! unrelated block's entry survives and that the pool ends quiescent. Plant
//! `evict-hint-unchecked` (evict drops the entry its hint names without checking it).
#![cfg(kvsched_loom)]

use kvsched::sync::{thread, Arc};
use kvsched_loom_tests::{model, PoolCells};

const H1: u64 = 11;
const H2: u64 = 22;

#[test]
fn evict_with_a_stale_hash_hint_leaves_other_entries_alone() {
    model(|| {
        let s = PoolCells::new(4);
        let a = s.pool.allocate().unwrap();
        let c = s.pool.allocate().unwrap();
        assert!(s.pool.register(H1, a));
        assert!(s.pool.evict(a.id)); // a's hash word keeps H1
        assert!(s.pool.register(H1, c)); // H1 → c now
        let t = {
            let s = Arc::clone(&s);
            thread::spawn(move || s.pool.register(H2, a))
        };
        let e = {
            let s = Arc::clone(&s);
            thread::spawn(move || s.pool.evict(a.id))
        };
        let _ = e.join().unwrap();
        let _ = t.join().unwrap();
        let hit = s.pool.lookup(H1);
        assert_eq!(
            hit,
            Some(c),
            "evicting a dropped the unrelated entry H1 → c"
        );
        for r in [hit, Some(a), Some(c)].into_iter().flatten() {
            s.pool.release(r).unwrap();
        }
        s.check_quiescent(&[]);
    });
}
