//! The free list: a lock-free Treiber stack of slot indices.
//!
//! The links live in a side array (`next[i]` is the slot below `i` while `i` is on the list)
//! and the head packs an ABA tag with the top index, bumped on every change, so a pop that
//! read a stale link fails its CAS instead of installing it. A slot is on the list exactly
//! when its count is 0 and it is not cached; the slot state word, not the list, decides
//! whether a popped slot may be handed out.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The free-list head's next ABA tag. The planted bug `free-list-no-tag` (loom demonstration,
/// `loom-tests/plants.sh`) keeps the tag unchanged, so the stack is open to ABA.
#[inline]
fn next_tag(tag: u32) -> u32 {
    if planted!("free-list-no-tag") {
        tag
    } else {
        tag.wrapping_add(1)
    }
}

/// Free-list head: `tag (high 32) | index (low 32)`; index 0 (the null block) = empty.
fn pack_head(tag: u32, index: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(index)
}

fn unpack_head(head: u64) -> (u32, u32) {
    ((head >> 32) as u32, head as u32)
}

/// A Treiber stack over the slot indices `1..n` of a pool of `n` slots.
#[derive(Debug)]
pub(super) struct FreeList {
    /// Treiber-stack links: `next[i]` is the slot below `i` while `i` is on the free list.
    next: Box<[AtomicU32]>,
    /// Packed (tag, top index) of the free list, see [`pack_head`].
    head: AtomicU64,
}

impl FreeList {
    /// Every usable index of a pool of `n` slots on the list, 1 on top.
    pub(super) fn new(n: u32) -> Self {
        // Chain 1 → 2 → … → n-1 → 0 (empty), so pops return ids in increasing order.
        let next = (0..n)
            .map(|i| {
                let below = if i == 0 || i + 1 == n { 0 } else { i + 1 };
                AtomicU32::new(below)
            })
            .collect();
        FreeList {
            next,
            head: AtomicU64::new(pack_head(0, 1)),
        }
    }

    /// Pops a slot index off the free list. `exclusive`: the caller is the pool's only
    /// mutator ([`super::exclusive`]), so the new head is stored, not swapped in.
    pub(super) fn pop(&self, exclusive: bool) -> Option<u32> {
        // Acquire: pairs with the Release CAS in `push` that installed this head, so the
        // pusher's store of `next[top]` is visible.
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (tag, top) = unpack_head(head);
            if top == 0 {
                return None;
            }
            // Relaxed: ordered by the Acquire load above. If `top` was popped and pushed
            // again since, this may be stale, but then the tag moved and the CAS fails.
            let below = self.next.get(top as usize)?.load(Ordering::Relaxed);
            if exclusive {
                // Relaxed: no other mutator until the exclusive mode's lock is released.
                self.head
                    .store(pack_head(next_tag(tag), below), Ordering::Relaxed);
                return Some(top);
            }
            // Acquire (success and failure): the failure value is the next head we read
            // `next[...]` through, pairing with `push`'s Release CAS as above; on success
            // the new head's link was published by its pusher (a pop is an RMW and continues
            // that release sequence).
            match self.head.compare_exchange_weak(
                head,
                pack_head(next_tag(tag), below),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(top),
                Err(actual) => head = actual,
            }
        }
    }

    /// Pushes a slot index on the free list (`exclusive` as for [`pop`](Self::pop)).
    pub(super) fn push(&self, index: u32, exclusive: bool) {
        let Some(link) = self.next.get(index as usize) else {
            return;
        };
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            let (tag, top) = unpack_head(head);
            // Relaxed: published by the Release CAS (or store) below.
            link.store(top, Ordering::Relaxed);
            if exclusive {
                // Release: as the CAS's, pairs with the Acquire head load in `pop`.
                self.head
                    .store(pack_head(next_tag(tag), index), Ordering::Release);
                return;
            }
            // Release: pairs with the Acquire load/CAS in `pop`, publishing `next[index]`.
            match self.head.compare_exchange_weak(
                head,
                pack_head(next_tag(tag), index),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }
}
