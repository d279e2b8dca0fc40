//! A set of invalid block ids tuned for the recovery scan's hot loop.
//!
//! A report names few ids; a scan tests every table entry against it. The set is a bitmap
//! over the id range `[min, max]` (offset to `min`) unless that range is huge compared with
//! the number of ids, in which case it falls back to a hash set. The null block is never a
//! member: callers build sets through [`BlockSet::new`], which drops it, so the scan needs no
//! separate null test.

use rustc_hash::FxHashSet;

use crate::rules::geometry::BlockId;

/// Ranges up to this many ids always use a bitmap (2 MiB).
const BITMAP_MIN_RANGE: u64 = 1 << 24;
/// Beyond that, a bitmap is still used while it costs at most this many bits per member.
const BITMAP_BITS_PER_MEMBER: u64 = 64;

#[derive(Clone, Debug, Default)]
enum Repr {
    #[default]
    Empty,
    Bitmap {
        min: BlockId,
        /// `max - min + 1`.
        range: u64,
        words: Box<[u64]>,
    },
    Hash(FxHashSet<BlockId>),
}

/// An immutable set of block ids with a fast membership test.
#[derive(Clone, Debug, Default)]
pub struct BlockSet {
    repr: Repr,
    len: usize,
}

impl BlockSet {
    /// Builds the set of `ids`, leaving out `null_block` (which is never invalid).
    pub fn new(ids: impl IntoIterator<Item = BlockId>, null_block: BlockId) -> Self {
        let mut v: Vec<BlockId> = ids.into_iter().filter(|&id| id != null_block).collect();
        v.sort_unstable();
        v.dedup();
        let (Some(&min), Some(&max)) = (v.first(), v.last()) else {
            return BlockSet::default();
        };
        let range = max - min; // + 1 below, checked: the full u64 range is "huge"
        let len = v.len();
        let bitmap_ok =
            range < BITMAP_MIN_RANGE.max((len as u64).saturating_mul(BITMAP_BITS_PER_MEMBER));
        let repr = if bitmap_ok {
            let range = range + 1;
            // A power-of-two word count lets the scan index with a mask instead of a clamp.
            let n_words = (range.div_ceil(64) as usize).next_power_of_two();
            let mut words = vec![0u64; n_words].into_boxed_slice();
            for id in &v {
                let off = id - min;
                words[(off >> 6) as usize] |= 1 << (off & 63);
            }
            Repr::Bitmap { min, range, words }
        } else {
            Repr::Hash(v.iter().copied().collect())
        };
        BlockSet { repr, len }
    }

    /// Number of distinct members.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the set is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `id` is a member.
    #[inline]
    pub fn contains(&self, id: BlockId) -> bool {
        match &self.repr {
            Repr::Empty => false,
            Repr::Bitmap { min, range, words } => {
                let off = id.wrapping_sub(*min);
                off < *range && words[(off >> 6) as usize] & (1 << (off & 63)) != 0
            }
            Repr::Hash(h) => h.contains(&id),
        }
    }

    /// Members in ascending order.
    pub fn to_sorted_vec(&self) -> Vec<BlockId> {
        match &self.repr {
            Repr::Empty => Vec::new(),
            Repr::Bitmap { min, words, .. } => {
                let mut out = Vec::with_capacity(self.len);
                for (w, &word) in words.iter().enumerate() {
                    let mut bits = word;
                    while bits != 0 {
                        let b = bits.trailing_zeros() as u64;
                        out.push(min + ((w as u64) << 6) + b);
                        bits &= bits - 1;
                    }
                }
                out
            }
            Repr::Hash(h) => {
                let mut out: Vec<_> = h.iter().copied().collect();
                out.sort_unstable();
                out
            }
        }
    }

    /// Calls `on_hit(index, id)` for every `table[index]` with `index < limit` that is a
    /// member, in ascending index order. This is the recovery scan's hot loop.
    #[inline]
    pub fn scan(&self, table: &[BlockId], mut on_hit: impl FnMut(usize, BlockId)) {
        match &self.repr {
            Repr::Empty => {}
            Repr::Bitmap { min, range, words } => {
                let (min, range) = (*min, *range);
                let mask = words.len() - 1; // len is a power of two
                let words = &words[..=mask];
                // Chunks are tested without branches (the common case is "no member"); only
                // a chunk that holds a member is walked entry by entry.
                const CHUNK: usize = 16;
                let mut chunks = table.chunks_exact(CHUNK);
                let mut base = 0usize;
                for chunk in &mut chunks {
                    let mut any = 0u64;
                    for &id in chunk {
                        let off = id.wrapping_sub(min);
                        let in_range = u64::from(off < range);
                        let word = words[((off >> 6) as usize) & mask];
                        any |= in_range & (word >> (off & 63));
                    }
                    if any & 1 != 0 {
                        for (i, &id) in chunk.iter().enumerate() {
                            if self.contains(id) {
                                on_hit(base + i, id);
                            }
                        }
                    }
                    base += CHUNK;
                }
                for (i, &id) in chunks.remainder().iter().enumerate() {
                    if self.contains(id) {
                        on_hit(base + i, id);
                    }
                }
            }
            Repr::Hash(h) => {
                for (i, id) in table.iter().enumerate() {
                    if h.contains(id) {
                        on_hit(i, *id);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(set: &BlockSet, table: &[BlockId]) -> Vec<(usize, BlockId)> {
        let mut v = Vec::new();
        set.scan(table, |i, id| v.push((i, id)));
        v
    }

    #[test]
    fn bitmap_and_hash_agree() {
        let ids = [5u64, 7, 900, 0, 5];
        let small = BlockSet::new(ids, 0);
        assert!(matches!(small.repr, Repr::Bitmap { .. }));
        assert_eq!(small.len(), 3);
        assert_eq!(small.to_sorted_vec(), vec![5, 7, 900]);
        let huge = BlockSet::new([5u64, 7, u64::MAX], 0);
        assert!(matches!(huge.repr, Repr::Hash(_)));
        assert_eq!(huge.to_sorted_vec(), vec![5, 7, u64::MAX]);
        let table: Vec<u64> = (0..40).chain([900, u64::MAX, 7]).collect();
        assert_eq!(
            hits(&small, &table),
            vec![(5, 5), (7, 7), (40, 900), (42, 7)]
        );
        assert_eq!(
            hits(&huge, &table),
            vec![(5, 5), (7, 7), (41, u64::MAX), (42, 7)]
        );
        assert!(!small.contains(0) && !small.contains(4) && !small.contains(u64::MAX));
    }

    #[test]
    fn null_block_never_member() {
        let s = BlockSet::new([3u64, 9], 9);
        assert!(s.contains(3) && !s.contains(9));
        assert!(BlockSet::new([9u64], 9).is_empty());
        assert!(hits(&BlockSet::new([9u64], 9), &[9, 9]).is_empty());
    }

    #[test]
    fn chunk_boundaries() {
        let s = BlockSet::new([100u64, 131], 0);
        for len in [0usize, 1, 15, 16, 17, 31, 32, 33, 64] {
            let table: Vec<u64> = (100..100 + len as u64).collect();
            let expect: Vec<_> = table
                .iter()
                .enumerate()
                .filter(|(_, &id)| id == 100 || id == 131)
                .map(|(i, &id)| (i, id))
                .collect();
            assert_eq!(hits(&s, &table), expect, "len {len}");
        }
    }
}
