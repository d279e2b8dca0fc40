//! **Race: `evict` against `register` and `lookup`** (the real `BlockPool`: the prefix index's
//! shard locks, the packed state word's `CACHED` flag and generation; block contents in a loom
//! `UnsafeCell`).
//!
//! Block `a` is registered under `H1` and held by the evictor, which evicts it and — if it is
//! then the block's only holder — rewrites it and registers it again under `H2` (what a
//! request does with a block whose prefix-cache entry it dropped). Meanwhile:
//!
//! * `evict_races_lookup`: a second thread looks `H1` up;
//! * `evict_races_lookup_and_register`: a second thread looks `H1` up while a third registers
//!   another block `b`, holding the same contents, under `H1`.
//!
//! A lookup of `H1` never returns a block after its eviction completed (unless registered
//! under `H1` again: only `b` is), never a block of another hash or generation: a hit is `a`
//! at its generation or `b`, holding `H1`'s contents, read in order after the registrant's
//! write. The census is conserved, and at the end the index maps `H1` to `b` exactly when
//! `b`'s registration succeeded, and `H2` to `a` exactly when the re-registration did.
//!
//! Catches: a lookup that revives an entry outside the lock under which it found it (plant
//! `lookup-revive-unlocked`: the block is evicted and registered under `H2` in between, and
//! the `H1` lookup returns it — a hit on another hash's contents), a registration accepted
//! while the hash still names a cached block (the evictor then finds its entry replaced).

#![cfg(kvsched_loom)]

use kvsched::pool::{BlockPool, BlockRef};
use kvsched::sync::{thread, Arc, AtomicBool, Ordering};
use kvsched_loom_tests::{model, BlockContents};

const H1: u64 = 1;
const H2: u64 = 2; // in the other index shard under loom

struct Shared {
    pool: BlockPool,
    contents: Vec<BlockContents>,
    /// Set (Release) once `evict(a)` returned `true`.
    evicted: AtomicBool,
}

impl Shared {
    fn cell(&self, r: BlockRef) -> &BlockContents {
        &self.contents[r.id as usize]
    }
}

/// Two usable blocks: `a` (held, written with `H1`, registered under `H1`) and `b` (held,
/// written with `H1`, not registered).
fn setup() -> (Arc<Shared>, BlockRef, BlockRef) {
    let pool = BlockPool::new(3).unwrap();
    let a = pool.allocate().unwrap();
    let b = pool.allocate().unwrap();
    let s = Arc::new(Shared {
        pool,
        contents: (0..3).map(|_| BlockContents::new(0)).collect(),
        evicted: AtomicBool::new(false),
    });
    s.cell(a).write(H1);
    s.cell(b).write(H1);
    assert!(s.pool.register(H1, a));
    (s, a, b)
}

/// The evictor (holds `a`): evicts it, and if it is then `a`'s only holder, rewrites it and
/// registers it under `H2`. Returns whether it re-registered.
fn evictor(s: &Shared, a: BlockRef) -> bool {
    assert!(s.pool.evict(a.id), "a settled cached block is evicted");
    // Release: the lookup thread's Acquire load orders this eviction before its lookup.
    s.evicted.store(true, Ordering::Release);
    // Only holder: no lookup can revive `a` any more (it left the index), so nobody reads it.
    if s.pool.ref_count(a.id) != 1 {
        return false;
    }
    s.cell(a).write(H2);
    assert!(
        s.pool.register(H2, a),
        "an uncached referenced block registers"
    );
    true
}

/// A lookup of `H1`: checks a hit and keeps its reference.
fn lookup_h1(s: &Shared, a: BlockRef, b: Option<BlockRef>) -> Option<BlockRef> {
    // Acquire: pairs with the Release store after the eviction.
    let after_evict = s.evicted.load(Ordering::Acquire);
    let hit = s.pool.lookup(H1)?;
    assert!(
        hit == a || Some(hit) == b,
        "a hit of another block or generation: {hit:?}"
    );
    assert!(
        !(after_evict && hit == a),
        "a lookup after the eviction returned the evicted block"
    );
    assert_eq!(
        s.cell(hit).read(),
        H1,
        "a hit holding another hash's contents"
    );
    Some(hit)
}

/// Quiescent checks, then every holder lets go and the census is conserved again.
fn check_end(s: &Shared, a: BlockRef, b: BlockRef, reregistered: bool, b_registered: bool) {
    let p = &s.pool;
    assert!(p.census().conserved(), "{:?}", p.census());
    let h1 = p.lookup(H1);
    assert_eq!(h1, b_registered.then_some(b), "H1 names the wrong block");
    let h2 = p.lookup(H2);
    assert_eq!(h2, reregistered.then_some(a), "H2 names the wrong block");
    for r in [h1, h2].into_iter().flatten() {
        p.release(r).unwrap();
    }
    assert_eq!(p.double_frees() + p.stale_releases(), 0);
    assert_eq!(p.invariant_violations(), 0);
    assert!(p.census().conserved(), "{:?}", p.census());
}

#[test]
fn evict_races_lookup() {
    model(|| {
        let (s, a, b) = setup();
        let looker = {
            let s = Arc::clone(&s);
            thread::spawn(move || lookup_h1(&s, a, None))
        };
        let reregistered = evictor(&s, a);
        let hit = looker.join().unwrap();
        assert!(
            !(reregistered && hit.is_some()),
            "rewrote a block a lookup holds"
        );
        check_end(&s, a, b, reregistered, false);
        for r in [Some(a), hit, Some(b)].into_iter().flatten() {
            s.pool.release(r).unwrap();
        }
        assert_eq!(s.pool.census().referenced, 0);
    });
}

#[test]
fn evict_races_lookup_and_register() {
    model(|| {
        let (s, a, b) = setup();
        let looker = {
            let s = Arc::clone(&s);
            thread::spawn(move || lookup_h1(&s, a, Some(b)))
        };
        let registrant = {
            let s = Arc::clone(&s);
            thread::spawn(move || s.pool.register(H1, b))
        };
        let reregistered = evictor(&s, a);
        let hit = looker.join().unwrap();
        let b_registered = registrant.join().unwrap();
        assert!(
            !(reregistered && hit == Some(a)),
            "rewrote a block a lookup holds"
        );
        check_end(&s, a, b, reregistered, b_registered);
        for r in [Some(a), hit, Some(b)].into_iter().flatten() {
            s.pool.release(r).unwrap();
        }
        assert_eq!(s.pool.census().referenced, 0);
    });
}
