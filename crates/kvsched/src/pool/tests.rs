//! Unit tests of the pool as a whole (allocation, retain/release, generations, bad ids), and
//! the helpers the mechanism files' test modules share.

use super::*;

pub(super) fn pool(n: usize) -> BlockPool {
    match BlockPool::new(n) {
        Ok(p) => p,
        Err(e) => panic!("pool({n}): {e}"),
    }
}

pub(super) fn conserved(p: &BlockPool) -> Census {
    let c = p.census();
    assert!(c.conserved(), "{c:?}");
    assert_eq!(p.allocatable(), c.free + c.cached_unreferenced, "{c:?}");
    c
}

pub(super) fn alloc(p: &BlockPool) -> BlockRef {
    let r = p.allocate();
    conserved(p);
    r.unwrap_or_else(|| panic!("pool exhausted"))
}

#[test]
fn pool_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<BlockPool>();
}

#[test]
fn construction_limits() {
    assert_eq!(
        BlockPool::new(0).err(),
        Some(PoolError::TooSmall { num_blocks: 0 })
    );
    assert_eq!(
        BlockPool::new(1).err(),
        Some(PoolError::TooSmall { num_blocks: 1 })
    );
    #[cfg(target_pointer_width = "64")]
    {
        let n = u32::MAX as usize + 1;
        assert_eq!(
            BlockPool::new(n).err(),
            Some(PoolError::TooLarge { num_blocks: n })
        );
    }
    let p = pool(2);
    assert_eq!(p.num_blocks(), 2);
    assert_eq!(p.null_block(), 0);
    let c = conserved(&p);
    assert_eq!((c.total, c.null, c.free), (2, 1, 1));
}

#[test]
fn allocation_until_exhaustion() {
    let p = pool(5);
    let got: Vec<BlockRef> = (0..4).map(|_| alloc(&p)).collect();
    let ids: Vec<BlockId> = got.iter().map(|r| r.id).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    for r in &got {
        assert_eq!(r.generation, 1);
        assert_eq!(p.ref_count(r.id), 1);
        assert!(!p.is_cached(r.id));
    }
    assert_eq!(p.allocate(), None);
    let c = conserved(&p);
    assert_eq!((c.referenced, c.free), (4, 0));
    // Free one, get exactly that one back, generation bumped.
    assert_eq!(p.release(got[2]), Ok(()));
    conserved(&p);
    let again = alloc(&p);
    assert_eq!(
        again,
        BlockRef {
            id: 3,
            generation: 2
        }
    );
    assert_eq!(p.allocate(), None);
}

#[test]
fn allocate_n_is_all_or_nothing() {
    let p = pool(5);
    let mut out = vec![BlockRef {
        id: 9,
        generation: 9,
    }];
    assert!(!p.allocate_n(5, &mut out));
    assert!(!p.allocate_n(usize::MAX, &mut out));
    assert!(p.allocate_n(3, &mut out));
    assert_eq!(out.len(), 4);
    conserved(&p);
    // Only one left: asking for two takes it, gives it back, leaves `out` alone.
    assert!(!p.allocate_n(2, &mut out));
    assert_eq!(out.len(), 4);
    let c = conserved(&p);
    assert_eq!((c.referenced, c.free), (3, 1));
    assert!(p.allocate_n(1, &mut out));
    assert!(p.allocate_n(0, &mut out));
    assert_eq!(out.len(), 5);
}

#[test]
fn generation_bumps_on_reuse_and_stale_is_detected() {
    let p = pool(2);
    let a = alloc(&p);
    assert!(p.is_current(a));
    assert_eq!(p.release(a), Ok(()));
    assert!(
        p.is_current(a),
        "freed but not reused: still the current generation"
    );
    let b = alloc(&p);
    assert_eq!(b.id, a.id);
    assert_eq!(b.generation, a.generation + 1);
    assert_eq!(p.generation(a.id), Some(b.generation));
    assert!(!p.is_current(a));
    let stale = PoolError::Stale {
        block: a,
        current: b.generation,
    };
    assert_eq!(p.release(a), Err(stale.clone()));
    assert_eq!(p.retain(a), Err(stale));
    assert_eq!(p.stale_releases(), 1);
    assert_eq!(p.ref_count(b.id), 1);
    assert!(!p.register(7, a));
    conserved(&p);
}

#[test]
fn double_free_is_detected_and_counted() {
    let p = pool(3);
    let a = alloc(&p);
    assert_eq!(p.release(a), Ok(()));
    assert_eq!(p.release(a), Err(PoolError::DoubleFree(a.id)));
    assert_eq!(p.release(a), Err(PoolError::DoubleFree(a.id)));
    assert_eq!(p.double_frees(), 2);
    assert_eq!(p.retain(a), Err(PoolError::NotReferenced(a.id)));
    let c = conserved(&p);
    assert_eq!(c.free, 2);
    // The slot is on the free list once: two allocations give two different blocks.
    let x = alloc(&p);
    let y = alloc(&p);
    assert_ne!(x.id, y.id);
    assert_eq!(p.allocate(), None);
}

#[test]
fn retain_and_release_count() {
    let p = pool(2);
    let a = alloc(&p);
    assert_eq!(p.retain(a), Ok(()));
    assert_eq!(p.retain(a), Ok(()));
    assert_eq!(p.ref_count(a.id), 3);
    for left in [2, 1, 0] {
        assert_eq!(p.release(a), Ok(()));
        assert_eq!(p.ref_count(a.id), left);
        conserved(&p);
    }
    assert_eq!(p.double_frees(), 0);
}

#[test]
fn ref_count_overflow_is_an_error() {
    let p = pool(2);
    let a = alloc(&p);
    // Drive the count to the maximum directly; a loop of 2^29 retains is too slow.
    let max = State(State::INITIAL.0)
        .fresh_use()
        .0
        .wrapping_add((State::RC_MAX - 1) << State::RC_SHIFT);
    p.slots[1].state.store(max, Ordering::Relaxed);
    assert_eq!(p.ref_count(a.id), MAX_REF_COUNT);
    assert_eq!(p.retain(a), Err(PoolError::RefCountOverflow(a.id)));
    assert_eq!(p.release(a), Ok(()));
    assert_eq!(p.retain(a), Ok(()));
}

#[test]
fn null_and_out_of_range_ids_never_panic() {
    let p = pool(3);
    let null = BlockRef {
        id: 0,
        generation: 0,
    };
    let far = BlockRef {
        id: 3,
        generation: 1,
    };
    let huge = BlockRef {
        id: u64::MAX,
        generation: 1,
    };
    assert_eq!(p.retain(null), Err(PoolError::NullBlock(0)));
    assert_eq!(p.release(null), Err(PoolError::NullBlock(0)));
    assert_eq!(p.retain(far), Err(PoolError::OutOfRange(3)));
    assert_eq!(p.release(huge), Err(PoolError::OutOfRange(u64::MAX)));
    for r in [null, far, huge] {
        assert!(!p.is_current(r));
        assert_eq!(p.generation(r.id), None);
        assert_eq!(p.ref_count(r.id), 0);
        assert!(!p.is_cached(r.id));
        assert!(!p.register(1, r));
        assert!(!p.evict(r.id));
    }
    assert_eq!((p.double_frees(), p.stale_releases()), (0, 0));
    assert_eq!(p.lookup(1), None);
    conserved(&p);
}

#[test]
fn a_filling_block_is_never_freed_cached_or_refilled() {
    let p = pool(4);
    let b = alloc(&p);
    assert!(!p.is_filling(b));
    assert_eq!(p.begin_fill(b), Ok(()));
    assert!(p.is_filling(b));
    assert_eq!(
        p.begin_fill(b),
        Err(PoolError::FillState(b.id)),
        "one load owns it"
    );
    // Its last release is refused and counted; the block stays referenced.
    assert_eq!(p.release(b), Err(PoolError::Filling(b.id)));
    assert_eq!(p.invariant_violations(), 1);
    assert_eq!(p.ref_count(b.id), 1);
    // It cannot be registered in the prefix index while filling.
    assert!(!p.register(crate::pool::chain_hash(0, 0, &[1]), b));
    assert!(!p.is_cached(b.id));
    // A second holder may release while the fill is open; the last may not.
    assert_eq!(p.retain(b), Ok(()));
    assert_eq!(p.release(b), Ok(()));
    assert_eq!(p.end_fill(b), Ok(()));
    assert!(!p.is_filling(b));
    assert_eq!(p.end_fill(b), Err(PoolError::FillState(b.id)));
    assert_eq!(p.release(b), Ok(()));
    conserved(&p);
    // A stale reference has no fill rights.
    let again = alloc(&p);
    let stale = BlockRef {
        generation: again.generation.wrapping_sub(1),
        ..again
    };
    if stale.id == again.id {
        assert_eq!(p.begin_fill(stale), Err(PoolError::FillState(stale.id)));
        assert!(!p.is_filling(stale));
    }
    assert_eq!(
        p.begin_fill(BlockRef {
            id: 0,
            generation: 0
        }),
        Err(PoolError::NullBlock(0))
    );
}

#[test]
fn an_unreferenced_block_has_no_fill_rights() {
    let p = pool(3);
    let b = alloc(&p);
    assert_eq!(p.release(b), Ok(()));
    // Free, at its current generation: no load may take its bytes.
    assert!(p.is_current(b));
    assert_eq!(p.begin_fill(b), Err(PoolError::FillState(b.id)));
    assert!(!p.is_filling(b));
    conserved(&p);
}

#[test]
fn a_free_list_slot_that_is_not_free_is_skipped_and_counted() {
    // The free list holds only count-0, uncached slots. Break that by hand, once with a
    // referenced block and once with a cached, unreferenced one: allocation must hand out
    // neither, count each, and take the next slot.
    let p = pool(4);
    let held = alloc(&p);
    let cached = alloc(&p);
    assert!(p.register(9, cached));
    assert_eq!(p.release(cached), Ok(()));
    p.free.push(cached.id as u32, false);
    p.free.push(held.id as u32, false);
    let got = alloc(&p);
    assert_eq!(got.id, 3, "the one free slot");
    assert_eq!(p.invariant_violations(), 2);
    assert_eq!(p.ref_count(held.id), 1);
    assert!(p.is_current(held));
    assert_eq!(p.lookup(9), Some(cached), "still cached at its generation");
}

#[test]
fn a_lookup_of_a_block_at_the_maximum_count_is_a_miss_that_keeps_it() {
    let p = pool(2);
    let a = alloc(&p);
    assert!(p.register(4, a));
    // Drive the count to the maximum directly, the cached flag kept.
    let word = p.slots[1].state.load(Ordering::Relaxed);
    p.slots[1].state.store(
        word + ((State::RC_MAX - 1) << State::RC_SHIFT),
        Ordering::Relaxed,
    );
    assert_eq!(p.ref_count(a.id), MAX_REF_COUNT);
    assert_eq!(p.lookup(4), None);
    assert_eq!(p.ref_count(a.id), MAX_REF_COUNT);
    assert!(p.is_current(a));
    assert!(p.contains_hash(4), "the entry stays");
    assert_eq!(p.release(a), Ok(()));
    assert_eq!(p.lookup(4), Some(a));
    assert_eq!(p.ref_count(a.id), MAX_REF_COUNT);
}

#[test]
fn a_stale_entry_of_a_block_cached_again_is_a_miss() {
    // An entry of a block's older generation, the block cached again under another hash (as
    // a registration racing the block's last release can leave, `register`): a lookup of the
    // old hash must not revive it. `reclaim_one` leaves the old entry for its caller to drop,
    // which makes one.
    let p = pool(2);
    let old = alloc(&p);
    assert!(p.register(5, old));
    assert_eq!(p.release(old), Ok(()));
    let Some((new, entry)) = p.reclaim_one() else {
        panic!("nothing to reclaim")
    };
    assert_eq!(entry, (5, old));
    assert_eq!(new.generation, old.generation + 1);
    assert!(p.register(6, new));
    assert_eq!(p.lookup(5), None);
    assert_eq!(p.ref_count(new.id), 1);
    assert_eq!(p.lookup(6), Some(new));
    assert_eq!(p.ref_count(new.id), 2);
    p.remove_index_entry(entry.0, entry.1);
    assert!(!p.contains_hash(5));
    conserved(&p);
}

/// `release_each` over a table is `release` on each entry in turn, the null block skipped,
/// refusals counted alike — with and without the exclusive mode; and an `allocate_n` that
/// empties the free list goes on by reclaim to the last allocatable block.
#[test]
fn release_each_is_release_on_each_entry() {
    /// A fixed history: blocks cached and not, shared, released twice, stale, null; then the
    /// tables released and the pool allocated dry.
    fn run(p: &BlockPool, each: bool) -> (Vec<BlockRef>, Census, u64, u64, Vec<BlockRef>) {
        let mut blocks = Vec::new();
        assert!(p.allocate_n(6, &mut blocks));
        for (i, r) in blocks.iter().enumerate().take(4) {
            assert!(p.register(100 + i as u64, *r));
        }
        assert_eq!(p.lookup(101), Some(blocks[1])); // held twice
        let stale = BlockRef {
            id: blocks[5].id,
            generation: blocks[5].generation.wrapping_add(1),
        };
        // A table with the null block, the stale ref and block 2 twice (a double free).
        let mut table = vec![
            BlockRef {
                id: 0,
                generation: 0,
            },
            stale,
        ];
        table.extend(blocks.iter().copied());
        table.push(blocks[2]);
        let ids: Vec<BlockId> = table.iter().map(|r| r.id).collect();
        let gens: Vec<Generation> = table.iter().map(|r| r.generation).collect();
        if each {
            p.release_each(&ids, &gens, 0);
        } else {
            for r in &table {
                let _ = p.release(*r);
            }
        }
        let census = conserved(p);
        let mut after = Vec::new();
        assert!(p.allocate_n(p.allocatable(), &mut after));
        (after, census, p.double_frees(), p.stale_releases(), blocks)
    }
    for exclusive in [false, true] {
        let (a, b) = (pool(9), pool(9));
        let (got, want) = if exclusive {
            // SAFETY: no other thread has either pool.
            let (_ea, _eb) = unsafe { (a.exclusive(), b.exclusive()) };
            (run(&a, true), run(&b, false))
        } else {
            (run(&a, true), run(&b, false))
        };
        assert_eq!(got, want, "exclusive: {exclusive}");
        let (after, census, double_frees, stale, _) = got;
        assert_eq!((double_frees, stale), (1, 1), "exclusive: {exclusive}");
        assert_eq!(census.referenced, 1, "block 1 is still held once");
        assert_eq!(after.len(), 7, "every unreferenced block allocated again");
    }
}
