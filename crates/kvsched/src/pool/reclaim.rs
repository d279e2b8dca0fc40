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

use std::collections::VecDeque;

use super::exclusive::ModeLock;
use super::state::{ReclaimStep, State};
use super::{transition, BlockHash, BlockPool, BlockRef};
use crate::rules::geometry::BlockId;
use crate::sync::Ordering;

/// Cached, unreferenced slots, oldest release first; at most one entry per slot.
///
/// A ring of 32-bit slot ids behind a short lock ([`ModeLock`]), which a step holding the
/// pool's [`Exclusive`](super::Exclusive) mode skips: made with room for an entry per slot,
/// and since a slot is queued at most once (its `QUEUED` bit) it never grows, so pushing and
/// popping never allocate. The step's own pushes and pops — every one of them in an inline
/// step — are a plain ring's. A bounded lock-free queue cost more here, measured: each entry
/// carries a stamp word beside the id (16 bytes an entry against 4, the table read on every
/// reclaim four times larger) and each push and pop a compare-and-swap, while the only
/// contention is between the shards of a parallel step.
#[derive(Debug)]
pub(super) struct ReclaimQueue {
    ids: ModeLock<VecDeque<u32>>,
    /// Entries it may hold: one per slot.
    capacity: usize,
}

impl ReclaimQueue {
    /// An empty queue for a pool of `num_blocks` slots (at most `u32::MAX`: [`BlockPool::new`]).
    pub(super) fn new(num_blocks: usize) -> Self {
        ReclaimQueue {
            ids: ModeLock::new(VecDeque::with_capacity(num_blocks)),
            capacity: num_blocks,
        }
    }

    /// Appends `id` at the tail: by the release that set the slot's `QUEUED`, or by a popper
    /// giving it a second chance; `exclusive` as for [`ModeLock::with`]. `false` only if the
    /// queue held an entry for every slot already, which the one-entry-per-slot rule rules
    /// out (the caller counts it as an invariant violation), or for an id beyond the pool's.
    #[must_use]
    pub(super) fn push(&self, id: BlockId, exclusive: bool) -> bool {
        let Ok(id) = u32::try_from(id) else {
            return false;
        };
        self.ids.with(exclusive, |q| {
            if q.len() >= self.capacity {
                return false;
            }
            q.push_back(id);
            true
        })
    }

    /// Takes the oldest entry.
    fn pop(&self, exclusive: bool) -> Option<BlockId> {
        self.ids
            .with(exclusive, |q| q.pop_front())
            .map(BlockId::from)
    }
}

impl BlockPool {
    /// The reclaim half of [`allocate`](Self::allocate).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // as `allocate`
    pub(super) fn allocate_reclaimed(&self) -> Option<BlockRef> {
        let (r, stale) = self.reclaim_one()?;
        self.remove_index_entry(stale.0, stale.1);
        Some(r)
    }

    /// Claims the oldest reclaimable block: returns it (count 1, generation bumped) and its
    /// index entry `(hash, old ref)`, which the caller must drop from the prefix index
    /// ([`remove_index_entry`](Self::remove_index_entry)). Until then a lookup meeting the
    /// entry finds a block of another generation: a miss, and it removes the entry itself.
    pub(super) fn reclaim_one(&self) -> Option<(BlockRef, (BlockHash, BlockRef))> {
        let exclusive = self.is_exclusive();
        while let Some(id) = self.reclaim.pop(exclusive) {
            let (Some(slot), Some(hash_word)) = (self.slot(id), self.hash_word(id)) else {
                continue;
            };
            // Acquire: for a claim, pairs with the Release CAS in `release` that dropped the
            // count to 0 (and, through it, with `register`'s store of the hash word), so the
            // previous holders' writes happen-before the new owner's.
            let installed = transition(&slot.state, exclusive, Ordering::Acquire, |cur| {
                let step = State(cur).reclaim();
                let next = match step {
                    ReclaimStep::Claim(s)
                    | ReclaimStep::SecondChance(s)
                    | ReclaimStep::Dequeue(s) => s,
                };
                Ok::<_, std::convert::Infallible>((next.0, step))
            });
            let Ok((cur, step)) = installed;
            match step {
                ReclaimStep::Claim(next) => {
                    self.count_allocatable(-1, exclusive);
                    let old = BlockRef {
                        id,
                        generation: State(cur).generation(),
                    };
                    // Relaxed: written by `register` before the release our Acquire CAS
                    // synchronised with.
                    let hash = hash_word.load(Ordering::Relaxed);
                    let new = BlockRef {
                        id,
                        generation: next.generation(),
                    };
                    return Some((new, (hash, old)));
                }
                ReclaimStep::SecondChance(_) => {
                    if !self.reclaim.push(id, exclusive) {
                        self.invariant_violations.fetch_add(1, Ordering::Relaxed);
                    }
                }
                ReclaimStep::Dequeue(_) => {}
            }
        }
        None
    }
}

/// Index entries of blocks [`BlockPool::allocate_n`] reclaimed, dropped from the prefix index
/// [`STALE_BATCH`] at a time (each index shard locked once per batch).
pub(super) struct StaleEntries {
    entries: [(BlockHash, BlockRef); STALE_BATCH],
    len: usize,
}

/// How many reclaimed blocks' index entries are dropped together.
const STALE_BATCH: usize = 32;

impl Default for StaleEntries {
    fn default() -> Self {
        StaleEntries {
            entries: [(
                0,
                BlockRef {
                    id: 0,
                    generation: 0,
                },
            ); STALE_BATCH],
            len: 0,
        }
    }
}

impl StaleEntries {
    /// Keeps `entry`, dropping the batch first if it is full.
    pub(super) fn push(&mut self, pool: &BlockPool, entry: (BlockHash, BlockRef)) {
        if self.len == STALE_BATCH {
            self.flush(pool);
        }
        self.entries[self.len] = entry;
        self.len += 1;
    }

    /// Drops every kept entry from the prefix index.
    pub(super) fn flush(&mut self, pool: &BlockPool) {
        pool.remove_index_entries(&self.entries[..self.len]);
        self.len = 0;
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
    fn a_block_released_twice_while_queued_keeps_its_second_chance() {
        let p = pool(4);
        let blocks: Vec<BlockRef> = (0..3).map(|_| alloc(&p)).collect();
        for (i, r) in blocks.iter().enumerate() {
            assert!(p.register(i as u64, *r));
            assert_eq!(p.release(*r), Ok(()));
        }
        // Block 0 is revived and released twice while its first queue entry is pending: the
        // second release must leave it touched, as the first did.
        for _ in 0..2 {
            assert_eq!(p.lookup(0), Some(blocks[0]));
            assert_eq!(p.release(blocks[0]), Ok(()));
        }
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
