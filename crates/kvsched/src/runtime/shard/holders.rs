//! The holder index: which of a shard's requests hold each block.

use rustc_hash::FxHashSet;

use crate::rules::geometry::BlockId;

use super::strategy::Strategy;
use super::Shard;

/// Which of the shard's requests hold each block: the claim phase scans only the holders of
/// reported blocks, so its cost follows the report, not the number of live requests. Adding
/// and removing a holder cost O(1) whatever the number of sharers: the index is a slot per
/// block id (ids are dense, below the pool's size), and a block of a prefix shared by
/// thousands of requests keeps its holders in a set, not a list searched on every release.
///
/// Memory: 16 bytes per block id up to the largest the shard has held (the pool's size at
/// most), plus a set per shared block — small beside the block's KV bytes.
#[derive(Debug, Default)]
pub(super) struct HolderIndex {
    slots: Vec<Holders>,
}

#[derive(Debug, Default)]
enum Holders {
    #[default]
    None,
    One(u64),
    Many(Box<FxHashSet<u64>>),
}

/// Block ids whose slots [`HolderIndex::for_blocks`] makes up front (4 MiB): a larger pool's
/// index grows past it as higher ids are met.
const PRESIZED_SLOTS: usize = 1 << 18;

impl HolderIndex {
    /// An index with the slots of a pool of `num_blocks` ids made and written now (up to
    /// [`PRESIZED_SLOTS`]), so the steps never grow it, nor touch its pages for the first time.
    pub(super) fn for_blocks(num_blocks: usize) -> Self {
        let mut slots = Vec::new();
        slots.resize_with(num_blocks.min(PRESIZED_SLOTS), Holders::default);
        HolderIndex { slots }
    }

    fn slot(&mut self, id: BlockId) -> Option<&mut Holders> {
        let i = usize::try_from(id).ok()?;
        if i >= self.slots.len() {
            // Grows to the largest id seen; pool ids are below 2^24.
            self.slots.resize_with(i + 1, Holders::default);
        }
        self.slots.get_mut(i)
    }

    pub(super) fn add(&mut self, id: BlockId, seq: u64) {
        let Some(h) = self.slot(id) else {
            return;
        };
        match h {
            Holders::None => *h = Holders::One(seq),
            Holders::One(first) => {
                let mut set = FxHashSet::default();
                set.insert(*first);
                set.insert(seq);
                *h = Holders::Many(Box::new(set));
            }
            Holders::Many(set) => {
                set.insert(seq);
            }
        }
    }

    pub(super) fn remove(&mut self, id: BlockId, seq: u64) {
        let Some(h) = usize::try_from(id).ok().and_then(|i| self.slots.get_mut(i)) else {
            return;
        };
        let empty = match h {
            Holders::None => false,
            Holders::One(s) => *s == seq,
            Holders::Many(set) => {
                // Planted bug (holder-release-unrecorded) for the invariant check: a sharer's release is not
                // recorded.
                if !planted!("holder-release-unrecorded") {
                    set.remove(&seq);
                }
                set.is_empty()
            }
        };
        if empty {
            *h = Holders::None;
        }
    }

    /// The holders of block `id`, in no particular order.
    pub(super) fn holders(&self, id: BlockId) -> impl Iterator<Item = &u64> + '_ {
        let slot = usize::try_from(id).ok().and_then(|i| self.slots.get(i));
        let (one, many) = match slot {
            None | Some(Holders::None) => (None, None),
            Some(Holders::One(s)) => (Some(s), None),
            Some(Holders::Many(set)) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    pub(super) fn len(&self) -> usize {
        self.slots
            .iter()
            .map(|h| match h {
                Holders::None => 0,
                Holders::One(_) => 1,
                Holders::Many(set) => set.len(),
            })
            .sum()
    }
}

impl<S: Strategy> Shard<S> {
    /// Whether the holder index lists exactly the non-null entries of every request.
    pub fn index_consistent(&self, null: BlockId) -> bool {
        let mut n = 0;
        for (seq, r) in &self.reqs {
            for &id in r.tables.iter().flatten() {
                if id != null {
                    n += 1;
                    if !self.index.holders(id).any(|s| s == seq) {
                        return false;
                    }
                }
            }
        }
        n == self.index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(ix: &HolderIndex, id: BlockId) -> Vec<u64> {
        let mut v: Vec<u64> = ix.holders(id).copied().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn a_release_removes_exactly_its_holder_however_many_share_the_block() {
        let mut ix = HolderIndex::default();
        ix.add(7, 1);
        assert_eq!(sorted(&ix, 7), [1]);
        for seq in 2..=1000 {
            ix.add(7, seq);
        }
        ix.add(9, 5);
        assert_eq!(ix.len(), 1001);
        // Releases in an order unrelated to the adds.
        for seq in (2..=1000).rev().step_by(2) {
            ix.remove(7, seq);
        }
        let left: Vec<u64> = std::iter::once(1).chain((3..=999).step_by(2)).collect();
        assert_eq!(sorted(&ix, 7), left);
        assert_eq!(ix.len(), left.len() + 1);
        // A holder that is not there, and an id never seen, change nothing.
        ix.remove(7, 2);
        ix.remove(1 << 20, 1);
        assert_eq!(ix.len(), left.len() + 1);
        for &seq in &left {
            ix.remove(7, seq);
        }
        assert_eq!(sorted(&ix, 7), Vec::<u64>::new());
        assert_eq!(sorted(&ix, 9), [5]);
        assert_eq!(ix.len(), 1);
        ix.remove(9, 5);
        assert_eq!(ix.len(), 0);
        assert_eq!(sorted(&ix, 12_345), Vec::<u64>::new());
    }
}
