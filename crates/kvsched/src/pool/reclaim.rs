//! The reclaim queue: cached, unreferenced slots in release order, consumed with a
//! second-chance (CLOCK) rule — an approximate LRU over the prefix cache.
//!
//! The release that drops a cached slot's count to 0 sets `QUEUED` and pushes the slot's id;
//! a later release while `QUEUED` is still set only marks the slot `TOUCHED`. The allocator
//! pops from the head and, per [`State::reclaim`]:
//!
//! * claims a slot that is still cached, unreferenced and untouched (dropping its hash from
//!   the prefix index),
//! * re-queues a touched one at the tail (its second chance), clearing `TOUCHED`,
//! * drops the entry of a slot referenced again or no longer cached, clearing `QUEUED`.
//!
//! So a slot has at most one entry, and an entry may outlive the generation it was pushed
//! for; the state word decides what it still means.

use super::state::{ReclaimStep, State};
use super::{BlockPool, BlockRef};
use crate::rules::geometry::BlockId;
use crate::sync::{Ordering, SegQueue};

/// Cached, unreferenced slots, oldest release first; at most one entry per slot.
#[derive(Debug)]
pub(super) struct ReclaimQueue(SegQueue<BlockId>);

impl ReclaimQueue {
    /// An empty queue.
    pub(super) fn new() -> Self {
        ReclaimQueue(SegQueue::new())
    }

    /// Appends `id` at the tail: by the release that set the slot's `QUEUED`, or by a popper
    /// giving it a second chance.
    pub(super) fn push(&self, id: BlockId) {
        self.0.push(id);
    }

    /// Takes the oldest entry.
    fn pop(&self) -> Option<BlockId> {
        self.0.pop()
    }
}

impl BlockPool {
    /// The reclaim half of [`allocate`](Self::allocate).
    pub(super) fn allocate_reclaimed(&self) -> Option<BlockRef> {
        while let Some(id) = self.reclaim.pop() {
            let Some(slot) = self.slot(id) else {
                continue;
            };
            let mut cur = slot.state.load(Ordering::Relaxed);
            let step = loop {
                let step = State(cur).reclaim();
                let next = match step {
                    ReclaimStep::Claim(s)
                    | ReclaimStep::SecondChance(s)
                    | ReclaimStep::Dequeue(s) => s,
                };
                // Acquire: for a claim, pairs with the Release CAS in `release` that dropped
                // the count to 0 (and, through it, with `register`'s store of the hash word),
                // so the previous holders' writes happen-before the new owner's.
                match slot.state.compare_exchange_weak(
                    cur,
                    next.0,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break step,
                    Err(actual) => cur = actual,
                }
            };
            match step {
                ReclaimStep::Claim(next) => {
                    let old = BlockRef {
                        id,
                        generation: State(cur).generation(),
                    };
                    // Relaxed: written by `register` before the release our Acquire CAS
                    // synchronised with.
                    let hash = slot.hash.load(Ordering::Relaxed);
                    self.remove_index_entry(hash, old);
                    return Some(BlockRef {
                        id,
                        generation: next.generation(),
                    });
                }
                ReclaimStep::SecondChance(_) => self.reclaim.push(id),
                ReclaimStep::Dequeue(_) => {}
            }
        }
        None
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use crate::pool::tests::{alloc, conserved, pool};

    #[test]
    fn reclaim_order_of_cached_blocks() {
        let p = pool(4);
        let blocks: Vec<BlockRef> = (0..3).map(|_| alloc(&p)).collect();
        for (i, r) in blocks.iter().enumerate() {
            assert!(p.register(100 + i as u64, *r));
        }
        // Release in the order 2, 0, 1: that is the reclaim order.
        for &i in &[2usize, 0, 1] {
            assert_eq!(p.release(blocks[i]), Ok(()));
            conserved(&p);
        }
        let c = conserved(&p);
        assert_eq!((c.free, c.cached_unreferenced), (0, 3));
        for &i in &[2usize, 0, 1] {
            let r = alloc(&p);
            assert_eq!(r.id, blocks[i].id);
            assert_eq!(r.generation, blocks[i].generation + 1);
            assert!(!p.is_cached(r.id));
            assert_eq!(
                p.lookup(100 + i as u64),
                None,
                "reclaimed block left the index"
            );
        }
        assert_eq!(p.allocate(), None);
    }

    #[test]
    fn reclaim_prefers_free_list_and_revived_blocks_move_to_the_back() {
        let p = pool(5);
        let blocks: Vec<BlockRef> = (0..3).map(|_| alloc(&p)).collect();
        for (i, r) in blocks.iter().enumerate() {
            assert!(p.register(i as u64, *r));
            assert_eq!(p.release(*r), Ok(()));
        }
        // Revive block 0 and release it again: now the most recently released.
        assert_eq!(p.lookup(0), Some(blocks[0]));
        assert_eq!(p.release(blocks[0]), Ok(()));
        // The free block (id 4) goes first, then 1, 2, 0.
        assert_eq!(alloc(&p).id, 4);
        let order: Vec<BlockId> = (0..3).map(|_| alloc(&p).id).collect();
        assert_eq!(order, [blocks[1].id, blocks[2].id, blocks[0].id]);
        assert_eq!(p.allocate(), None);
    }

    #[test]
    fn stale_queue_entry_never_double_allocates() {
        // Released cached (queued), revived, evicted, released uncached → free list, while its
        // old queue entry is still pending: the block must be handed out once.
        let p = pool(3);
        let a = alloc(&p);
        assert!(p.register(1, a));
        assert_eq!(p.release(a), Ok(()));
        assert_eq!(p.lookup(1), Some(a));
        assert!(p.evict(a.id));
        assert_eq!(p.release(a), Ok(()));
        let x = alloc(&p);
        let y = alloc(&p);
        assert_ne!(x.id, y.id);
        assert_eq!(p.allocate(), None);
        conserved(&p);
    }
}
