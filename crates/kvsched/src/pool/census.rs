//! The census: a classification of every slot by its state word ([`Census`],
//! [`BlockPool::census`]).

use super::state::State;
use super::BlockPool;
use crate::sync::Ordering;

/// A classification of every slot of the block pool (see [`Report::census`](crate::Report)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Slots in the pool, the null block included.
    pub total: usize,
    /// The null block (always 1).
    pub null: usize,
    /// Reference count 0, not in the prefix index.
    pub free: usize,
    /// Reference count 0, still in the prefix index (reclaimable, or revivable by a lookup).
    pub cached_unreferenced: usize,
    /// Reference count > 0 (cached or not).
    pub referenced: usize,
}

impl Census {
    /// Whether every slot is accounted for exactly once:
    /// `free + cached_unreferenced + referenced + null == total` (invariants of docs/runtime.md ("Invariants")).
    pub fn conserved(&self) -> bool {
        self.free
            .checked_add(self.cached_unreferenced)
            .and_then(|s| s.checked_add(self.referenced))
            .and_then(|s| s.checked_add(self.null))
            == Some(self.total)
    }
}

impl BlockPool {
    /// Classifies every slot by one scan of the state words (exact when quiescent).
    pub fn census(&self) -> Census {
        let mut c = Census {
            total: self.num_blocks(),
            null: 1,
            ..Census::default()
        };
        for slot in self.slots.iter().skip(1) {
            let s = State(slot.state.load(Ordering::Relaxed));
            match (s.ref_count(), s.is_cached()) {
                (0, false) => c.free += 1,
                (0, true) => c.cached_unreferenced += 1,
                _ => c.referenced += 1,
            }
        }
        c
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use crate::pool::tests::{alloc, conserved, pool};

    #[test]
    fn census_conserved_through_a_sequence() {
        let p = pool(6);
        let mut held = Vec::new();
        for i in 0..5u64 {
            let r = alloc(&p);
            if i % 2 == 0 {
                assert!(p.register(i, r));
            }
            held.push(r);
            conserved(&p);
        }
        for r in held.drain(..) {
            assert_eq!(p.release(r), Ok(()));
            conserved(&p);
        }
        let c = conserved(&p);
        assert_eq!((c.free, c.cached_unreferenced, c.referenced), (2, 3, 0));
        assert!(p.evict(1));
        let c = conserved(&p);
        assert_eq!((c.free, c.cached_unreferenced), (3, 2));
        let mut all = Vec::new();
        assert!(
            p.allocate_n(5, &mut all),
            "every count-0 block is allocatable"
        );
        let c = conserved(&p);
        assert_eq!(c.referenced, 5);
    }
}
