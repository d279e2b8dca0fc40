//! A bounded multi-producer multi-consumer ring of block ids (Vyukov's array queue): each
//! cell carries a sequence number saying whose turn it is, so a push or pop is one
//! compare-and-swap on its end's counter, no allocation — and, while the pool is exclusive
//! ([`super::exclusive`]), a load and a store, no locked instruction at all.
//!
//! Cell `i` of a ring of capacity `c` (a power of two) holds the value of position `p ≡ i
//! (mod c)`. Its sequence is `p` while the cell is free for the push of position `p`, and
//! `p + 1` once that push has written the value, until the pop of position `p` frees it for
//! position `p + c`.
//!
//! # Guarantees
//!
//! * FIFO: values are popped in the order their pushes claimed positions; each value once.
//! * A push's write of its value happens-before the pop that takes it (the sequence store is
//!   Release, its load Acquire).
//! * A push fails only when `capacity` values are queued; a pop fails only when none is.

use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// One cell: whose turn it is, and the value.
struct Cell {
    seq: AtomicUsize,
    value: AtomicU64,
}

/// The ring. See the module docs.
pub(super) struct Ring {
    cells: Box<[Cell]>,
    mask: usize,
    /// The next position to push.
    tail: AtomicUsize,
    /// The next position to pop.
    head: AtomicUsize,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("capacity", &self.cells.len())
            .finish_non_exhaustive()
    }
}

impl Ring {
    /// An empty ring holding at least `capacity` values (rounded up to a power of two).
    pub(super) fn new(capacity: usize) -> Self {
        let cap = capacity.max(1).next_power_of_two();
        Ring {
            cells: (0..cap)
                .map(|i| Cell {
                    seq: AtomicUsize::new(i),
                    value: AtomicU64::new(0),
                })
                .collect(),
            mask: cap - 1,
            tail: AtomicUsize::new(0),
            head: AtomicUsize::new(0),
        }
    }

    /// Appends `v`; `false` when the ring is full. `exclusive`: no other thread pushes or
    /// pops meanwhile (the pool's exclusive mode), so the position is taken with a store.
    pub(super) fn push(&self, v: u64, exclusive: bool) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            // Acquire: pairs with the Release sequence store of the pop that freed the cell,
            // so its read of the old value happens-before our overwrite.
            let seq = cell.seq.load(Ordering::Acquire);
            let turn = seq.wrapping_sub(pos) as isize;
            if turn < 0 {
                return false; // the cell still holds position pos - capacity: full
            }
            if turn > 0 {
                pos = self.tail.load(Ordering::Relaxed); // another push took pos
                continue;
            }
            if exclusive {
                self.tail.store(pos.wrapping_add(1), Ordering::Relaxed);
            } else if let Err(actual) = self.tail.compare_exchange_weak(
                pos,
                pos.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                pos = actual;
                continue;
            }
            cell.value.store(v, Ordering::Relaxed);
            // Release: pairs with the Acquire sequence load in `pop`, publishing the value.
            cell.seq.store(pos.wrapping_add(1), Ordering::Release);
            return true;
        }
    }

    /// Takes the oldest value; `None` when the ring is empty. `exclusive` as for
    /// [`push`](Self::push).
    pub(super) fn pop(&self, exclusive: bool) -> Option<u64> {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            // Acquire: pairs with the Release sequence store of the push of `pos`.
            let seq = cell.seq.load(Ordering::Acquire);
            let turn = seq.wrapping_sub(pos.wrapping_add(1)) as isize;
            if turn < 0 {
                return None; // position pos not pushed yet: empty
            }
            if turn > 0 {
                pos = self.head.load(Ordering::Relaxed); // another pop took pos
                continue;
            }
            if exclusive {
                self.head.store(pos.wrapping_add(1), Ordering::Relaxed);
            } else if let Err(actual) = self.head.compare_exchange_weak(
                pos,
                pos.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                pos = actual;
                continue;
            }
            let v = cell.value.load(Ordering::Relaxed);
            // Release: pairs with the Acquire sequence load of the push of position
            // pos + capacity, so our read happens-before its overwrite.
            cell.seq.store(
                pos.wrapping_add(self.mask).wrapping_add(1),
                Ordering::Release,
            );
            return Some(v);
        }
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use crate::sync::{thread, Arc};

    #[test]
    fn fifo_bounded_and_reusable_in_both_modes() {
        for exclusive in [false, true] {
            let r = Ring::new(3); // rounded up to 4
            assert_eq!(r.pop(exclusive), None);
            for round in 0..5u64 {
                for v in 0..4 {
                    assert!(r.push(round * 10 + v, exclusive));
                }
                assert!(!r.push(99, exclusive), "full at capacity");
                for v in 0..4 {
                    assert_eq!(r.pop(exclusive), Some(round * 10 + v));
                }
                assert_eq!(r.pop(exclusive), None);
            }
        }
    }

    #[test]
    fn concurrent_pushes_and_pops_deliver_every_value_once() {
        const PER: u64 = 20_000;
        let r = Arc::new(Ring::new(64));
        let pushers: Vec<_> = (0..2u64)
            .map(|t| {
                let r = Arc::clone(&r);
                thread::spawn(move || {
                    for i in 0..PER {
                        while !r.push(t * PER + i, false) {
                            thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let popped = Arc::new(AtomicUsize::new(0));
        let poppers: Vec<_> = (0..2)
            .map(|_| {
                let (r, popped) = (Arc::clone(&r), Arc::clone(&popped));
                thread::spawn(move || {
                    let mut got = Vec::new();
                    while popped.load(Ordering::Relaxed) < 2 * PER as usize {
                        match r.pop(false) {
                            Some(v) => {
                                got.push(v);
                                popped.fetch_add(1, Ordering::Relaxed);
                            }
                            None => thread::yield_now(),
                        }
                    }
                    got
                })
            })
            .collect();
        for p in pushers {
            p.join().expect("pusher");
        }
        let mut all: Vec<u64> = poppers
            .into_iter()
            .flat_map(|p| p.join().expect("popper"))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..2 * PER).collect::<Vec<_>>());
    }
}
