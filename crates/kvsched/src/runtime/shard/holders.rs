//! The holder index: which of a shard's requests hold each block.

use rustc_hash::FxHashMap;

use crate::rules::geometry::BlockId;

use super::strategy::Strategy;
use super::Shard;

/// Which of the shard's requests hold each block: the claim phase scans only the holders of
/// reported blocks, so its cost follows the report, not the number of live requests.
#[derive(Debug, Default)]
pub(super) struct HolderIndex {
    map: FxHashMap<BlockId, Holders>,
}

#[derive(Debug)]
enum Holders {
    One(u64),
    Many(Vec<u64>),
}

impl HolderIndex {
    pub(super) fn add(&mut self, id: BlockId, seq: u64) {
        match self.map.get_mut(&id) {
            None => {
                self.map.insert(id, Holders::One(seq));
            }
            Some(h) => {
                let first = match h {
                    Holders::One(s) => *s,
                    Holders::Many(v) => {
                        v.push(seq);
                        return;
                    }
                };
                *h = Holders::Many(vec![first, seq]);
            }
        }
    }

    pub(super) fn remove(&mut self, id: BlockId, seq: u64) {
        let empty = match self.map.get_mut(&id) {
            None => false,
            Some(Holders::One(s)) => *s == seq,
            Some(Holders::Many(v)) => {
                if let Some(i) = v.iter().position(|&x| x == seq) {
                    v.swap_remove(i);
                }
                v.is_empty()
            }
        };
        if empty {
            self.map.remove(&id);
        }
    }

    pub(super) fn holders(&self, id: BlockId) -> &[u64] {
        match self.map.get(&id) {
            None => &[],
            Some(Holders::One(s)) => std::slice::from_ref(s),
            Some(Holders::Many(v)) => v,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.map
            .values()
            .map(|h| match h {
                Holders::One(_) => 1,
                Holders::Many(v) => v.len(),
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
                    if !self.index.holders(id).contains(seq) {
                        return false;
                    }
                }
            }
        }
        n == self.index.len()
    }
}
