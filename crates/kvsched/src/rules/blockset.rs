//! A set of invalid block ids tuned for the recovery scan's hot loop, in memory proportional
//! to the number of ids.
//!
//! A report names few ids; a scan tests every table entry against it. Two representations,
//! both `O(ids)` in memory:
//!
//! * **dense**: an exact bitmap over the id range `[min, max]` (offset to `min`), used when
//!   that range is at most [`BITMAP_BITS_PER_MEMBER`] bits per member, so the bitmap costs no
//!   more than the ids themselves;
//! * **small**: up to [`SMALL_MAX`] ids: a filter of [`SMALL_SLOTS_PER_MEMBER`] one-byte slots
//!   per member (one slot per id, at a multiplicative hash of the id) in front of the sorted
//!   ids;
//! * **sparse**: more ids: a filter of [`FILTER_BITS_PER_MEMBER`] bits per member in front of
//!   an exact hash set.
//!
//! The filters have no false negatives; an entry that passes is checked exactly. One
//! exception to "proportional": the set a whole report shares (its flat ids, one per report)
//! may be a bitmap of up to 1 MiB when it holds more than [`SMALL_MAX`] ids, because a
//! bitmap's exact test is the fastest scan ([`BlockSet::new_shared`]).
//!
//! Either way the scan tests chunks of entries without branches (the common case is "no
//! member") and walks only a chunk in which some entry passed. The null block is never a
//! member: callers build sets through [`BlockSet::new`], which drops it, so the scan needs no
//! separate null test.

use rustc_hash::FxHashSet;

use crate::rules::geometry::BlockId;

/// A bitmap is used while it costs at most this many bits per member (before rounding its word
/// count up to a power of two): 64 bits, the size of the id itself.
const BITMAP_BITS_PER_MEMBER: u64 = 64;
/// Filter bits per member of a sparse set (before rounding up to a power of two). The chance
/// that a non-member passes the filter is at most about one in this many.
const FILTER_BITS_PER_MEMBER: u64 = 128;
/// Fibonacci hashing: 2^64 / φ, odd.
const HASH_MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// A set shared by a whole report may use a bitmap of up to this many bits (1 MiB) however
/// sparse its ids.
const SHARED_BITMAP_BITS: u64 = 8 << 20;
/// Sets of at most this many ids (that are not dense) use a byte filter.
const SMALL_MAX: usize = 64;
/// Byte-filter slots per member.
const SMALL_SLOTS_PER_MEMBER: usize = 128;
/// Entries tested per branch-free chunk of the scan.
const CHUNK: usize = 16;

#[derive(Clone, Debug, Default)]
enum Repr {
    #[default]
    Empty,
    Bitmap {
        min: BlockId,
        /// `max - min + 1`.
        range: u64,
        /// A power-of-two number of words, so the scan indexes with a mask.
        words: Box<[u64]>,
    },
    /// Few members: a byte per filter slot (no variable shift in the hot loop).
    Small {
        /// A power-of-two number of slots; slot `hash(id) >> shift` is 1 for every member.
        slots: Box<[u8]>,
        shift: u32,
        members: Box<[BlockId]>,
    },
    Sparse {
        /// A power-of-two number of words; bit `hash(id) mod bits` is set for every member.
        filter: Box<[u64]>,
        members: FxHashSet<BlockId>,
    },
}

/// An immutable set of block ids with a fast membership test.
#[derive(Clone, Debug, Default)]
pub struct BlockSet {
    repr: Repr,
    len: usize,
}

/// Filters have at most this many bits: the hash keeps 32 bits.
const FILTER_MAX_BITS: u64 = 1 << 32;

/// The filter hash: `id · HASH_MUL` with its high half folded onto its low half, so that the
/// low bits (which pick the filter bit) depend on every bit of the id. Taking the low bits of
/// the product alone would map runs of consecutive ids — what block tables hold — onto a
/// fraction of the filter.
#[inline(always)]
fn hash(id: BlockId) -> u64 {
    let h = id.wrapping_mul(HASH_MUL);
    h ^ (h >> 32)
}

/// Bit 0 is set when `id` passes the filter. `filter.len()` must be `mask + 1`, a power of
/// two (then the index needs no bounds check). The hash's low 6 bits pick the bit, the next
/// ones the word: shifts by constants, so the hot loop needs one variable shift per entry, as
/// the bitmap does.
#[inline(always)]
fn filter_bit(filter: &[u64], mask: usize, id: BlockId) -> u64 {
    let h = hash(id);
    filter[((h >> 6) as usize) & mask] >> (h & 63)
}

/// The byte filter's slot of `id`: the top bits of the product (one shift by a loop-invariant
/// amount).
#[inline(always)]
fn slot(id: BlockId, shift: u32) -> usize {
    (id.wrapping_mul(HASH_MUL) >> shift) as usize
}

impl BlockSet {
    /// Builds the set of `ids`, leaving out `null_block` (which is never invalid).
    pub fn new(ids: impl IntoIterator<Item = BlockId>, null_block: BlockId) -> Self {
        Self::build(ids, null_block, 0)
    }

    /// [`BlockSet::new`] for a set that a whole report shares (the flat ids: one per report,
    /// whatever the number of groups): where more than [`SMALL_MAX`] ids are spread over a
    /// range of at most [`SHARED_BITMAP_BITS`], an exact bitmap is faster to scan than the
    /// filter and costs at most that constant.
    pub fn new_shared(ids: impl IntoIterator<Item = BlockId>, null_block: BlockId) -> Self {
        Self::build(ids, null_block, SHARED_BITMAP_BITS)
    }

    fn build(
        ids: impl IntoIterator<Item = BlockId>,
        null_block: BlockId,
        bitmap_allowance_bits: u64,
    ) -> Self {
        let mut v: Vec<BlockId> = ids.into_iter().filter(|&id| id != null_block).collect();
        v.sort_unstable();
        v.dedup();
        let (Some(&min), Some(&max)) = (v.first(), v.last()) else {
            return BlockSet::default();
        };
        let len = v.len();
        // `max − min` ≤ u64::MAX − 1 words' worth is fine: compare word counts, not bits.
        let range_words = (max - min) / 64 + 1;
        let bitmap_bits = (range_words as usize)
            .checked_next_power_of_two()
            .map_or(u64::MAX, |w| (w as u64).saturating_mul(64));
        let dense =
            range_words.saturating_mul(64) <= (len as u64).saturating_mul(BITMAP_BITS_PER_MEMBER);
        let allowed = len > SMALL_MAX && bitmap_bits <= bitmap_allowance_bits;
        let repr = if dense || allowed {
            let range = max - min + 1; // no overflow: dense implies a small range
            let n_words = (range_words as usize).next_power_of_two();
            let mut words = vec![0u64; n_words].into_boxed_slice();
            for id in &v {
                let off = id - min;
                words[(off >> 6) as usize] |= 1 << (off & 63);
            }
            Repr::Bitmap { min, range, words }
        } else if len <= SMALL_MAX {
            let n = (len * SMALL_SLOTS_PER_MEMBER).next_power_of_two();
            let shift = 64 - n.trailing_zeros();
            let mut slots = vec![0u8; n].into_boxed_slice();
            for &id in &v {
                slots[slot(id, shift)] = 1;
            }
            Repr::Small {
                slots,
                shift,
                members: v.into_boxed_slice(),
            }
        } else {
            let bits = (len as u64)
                .saturating_mul(FILTER_BITS_PER_MEMBER)
                .next_power_of_two()
                .clamp(64, FILTER_MAX_BITS);
            let mut filter = vec![0u64; (bits / 64) as usize].into_boxed_slice();
            let mask = filter.len() - 1;
            for &id in &v {
                let h = hash(id);
                filter[((h >> 6) as usize) & mask] |= 1 << (h & 63);
            }
            let mut members = FxHashSet::default();
            members.reserve(len);
            members.extend(v.iter().copied());
            Repr::Sparse { filter, members }
        };
        BlockSet { repr, len }
    }

    /// Number of distinct members.
    #[cfg(test)]
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
            Repr::Small {
                slots,
                shift,
                members,
            } => {
                slots[slot(id, *shift) & (slots.len() - 1)] != 0
                    && members.binary_search(&id).is_ok()
            }
            Repr::Sparse { filter, members } => {
                filter_bit(filter, filter.len() - 1, id) & 1 != 0 && members.contains(&id)
            }
        }
    }

    /// Members in ascending order.
    #[cfg(test)]
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
            Repr::Small { members, .. } => members.to_vec(),
            Repr::Sparse { members, .. } => {
                let mut out: Vec<_> = members.iter().copied().collect();
                out.sort_unstable();
                out
            }
        }
    }

    /// Calls `on_hit(index, id)` for every `table[index]` that is a member, in ascending index
    /// order. This is the recovery scan's hot loop.
    #[inline]
    pub fn scan(&self, table: &[BlockId], mut on_hit: impl FnMut(usize, BlockId)) {
        match &self.repr {
            Repr::Empty => {}
            Repr::Bitmap { min, range, words } => {
                let (min, range) = (*min, *range);
                let mask = words.len() - 1; // len is a power of two
                let words = &words[..=mask];
                let probe = |id: BlockId| {
                    let off = id.wrapping_sub(min);
                    let in_range = u64::from(off < range);
                    in_range & (words[((off >> 6) as usize) & mask] >> (off & 63))
                };
                scan_chunks(table, probe, |id| self.contains(id), &mut on_hit);
            }
            Repr::Small {
                slots,
                shift,
                members,
            } => {
                let shift = *shift;
                let mask = slots.len() - 1;
                let slots = &slots[..=mask];
                let probe = |id: BlockId| u64::from(slots[slot(id, shift) & mask]);
                scan_chunks(
                    table,
                    probe,
                    |id| probe(id) != 0 && members.binary_search(&id).is_ok(),
                    &mut on_hit,
                );
            }
            Repr::Sparse { filter, members } => {
                let mask = filter.len() - 1; // len is a power of two
                let filter = &filter[..=mask];
                let probe = |id: BlockId| filter_bit(filter, mask, id);
                scan_chunks(
                    table,
                    probe,
                    |id| probe(id) & 1 != 0 && members.contains(&id),
                    &mut on_hit,
                );
            }
        }
    }
}

/// The chunked scan: `probe(id) & 1` is 1 for every member (and possibly for some
/// non-members); `exact` is the membership test. Chunks are probed without branches; only a
/// chunk in which some entry passed is walked with `exact`.
#[inline(always)]
fn scan_chunks(
    table: &[BlockId],
    probe: impl Fn(BlockId) -> u64,
    exact: impl Fn(BlockId) -> bool,
    on_hit: &mut impl FnMut(usize, BlockId),
) {
    let mut chunks = table.chunks_exact(CHUNK);
    let mut base = 0usize;
    for chunk in &mut chunks {
        let mut any = 0u64;
        for &id in chunk {
            any |= probe(id);
        }
        if any & 1 != 0 {
            for (i, &id) in chunk.iter().enumerate() {
                if exact(id) {
                    on_hit(base + i, id);
                }
            }
        }
        base += CHUNK;
    }
    for (i, &id) in chunks.remainder().iter().enumerate() {
        if exact(id) {
            on_hit(base + i, id);
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

    /// Heap bytes the set's representation holds (the hash set's buckets approximated).
    fn heap_bytes(set: &BlockSet) -> usize {
        match &set.repr {
            Repr::Empty => 0,
            Repr::Bitmap { words, .. } => words.len() * 8,
            Repr::Small { slots, members, .. } => slots.len() + members.len() * 8,
            Repr::Sparse { filter, members } => filter.len() * 8 + members.capacity() * 9,
        }
    }

    #[test]
    fn bitmap_and_sparse_agree() {
        let ids = [5u64, 7, 60, 0, 5];
        let small = BlockSet::new(ids, 0);
        assert!(matches!(small.repr, Repr::Bitmap { .. }));
        assert_eq!(small.len(), 3);
        assert_eq!(small.to_sorted_vec(), vec![5, 7, 60]);
        let huge = BlockSet::new([5u64, 7, u64::MAX], 0);
        assert!(matches!(huge.repr, Repr::Small { .. }));
        assert_eq!(huge.to_sorted_vec(), vec![5, 7, u64::MAX]);
        let table: Vec<u64> = (0..40).chain([60, u64::MAX, 7]).collect();
        assert_eq!(
            hits(&small, &table),
            vec![(5, 5), (7, 7), (40, 60), (42, 7)]
        );
        assert_eq!(
            hits(&huge, &table),
            vec![(5, 5), (7, 7), (41, u64::MAX), (42, 7)]
        );
        assert!(!small.contains(0) && !small.contains(4) && !small.contains(u64::MAX));
        assert!(!huge.contains(0) && !huge.contains(6) && huge.contains(u64::MAX));
        // More than SMALL_MAX far-apart ids: the bit filter.
        let many: Vec<u64> = (0..100u64).map(|i| i << 40).chain([u64::MAX]).collect();
        let sparse = BlockSet::new(many.iter().copied(), 0);
        assert!(matches!(sparse.repr, Repr::Sparse { .. }));
        assert_eq!(sparse.to_sorted_vec()[..3], [1 << 40, 2 << 40, 3 << 40]);
        assert_eq!(hits(&sparse, &table), vec![(41, u64::MAX)]);
        assert!(sparse.contains(7 << 40) && !sparse.contains((7 << 40) + 1));
    }

    #[test]
    fn memory_is_proportional_to_the_ids() {
        // Two ids far apart: a few hundred bytes, not a bitmap over the range (2 MiB).
        let two = BlockSet::new([1u64, 16_777_215], 0);
        assert!(matches!(two.repr, Repr::Small { .. }));
        assert!(heap_bytes(&two) <= 2 * 136, "{} bytes", heap_bytes(&two));
        // Dense ids: a bitmap of at most 16 bytes per id.
        let dense = BlockSet::new(1000u64..3000, 0);
        assert!(matches!(dense.repr, Repr::Bitmap { .. }));
        assert!(heap_bytes(&dense) <= 2000 * 16);
        // Sparse ids: bounded per id too.
        let sparse = BlockSet::new((0..1000u64).map(|i| i * 1_000_003 + 1), 0);
        assert!(matches!(sparse.repr, Repr::Sparse { .. }));
        assert!(heap_bytes(&sparse) <= 1000 * 64, "{}", heap_bytes(&sparse));
        // A shared set may be a bitmap of up to 1 MiB once it has more than SMALL_MAX ids, never
        // beyond.
        let spread = || (0..100u64).map(|i| i * 80_000 + 1);
        let shared = BlockSet::new_shared(spread(), 0);
        assert!(matches!(shared.repr, Repr::Bitmap { .. }));
        assert!(heap_bytes(&shared) <= 1 << 20);
        assert!(matches!(
            BlockSet::new(spread(), 0).repr,
            Repr::Sparse { .. }
        ));
        let wide = BlockSet::new_shared((0..100u64).map(|i| i * 100_000 + 1), 0);
        assert!(matches!(wide.repr, Repr::Sparse { .. }));
        let few = BlockSet::new_shared([1u64, 5_000_000], 0);
        assert!(matches!(few.repr, Repr::Small { .. }));
        // The whole u64 range with two members stays sparse (no overflow in the range test).
        let ends = BlockSet::new([1u64, u64::MAX], 0);
        assert!(matches!(ends.repr, Repr::Small { .. }) && ends.contains(1));
        let ends = BlockSet::new([0u64, u64::MAX], 7);
        assert!(ends.contains(0) && ends.contains(u64::MAX) && !ends.contains(1));
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
        for set in [
            BlockSet::new([100u64, 131], 0),
            BlockSet::new([100u64, 131, 1 << 40], 0),
        ] {
            for len in [0usize, 1, 15, 16, 17, 31, 32, 33, 64] {
                let table: Vec<u64> = (100..100 + len as u64).collect();
                let expect: Vec<_> = table
                    .iter()
                    .enumerate()
                    .filter(|(_, &id)| id == 100 || id == 131)
                    .map(|(i, &id)| (i, id))
                    .collect();
                assert_eq!(hits(&set, &table), expect, "len {len} {:?}", set.repr);
            }
        }
    }

    #[test]
    fn scan_equals_naive_membership() {
        // A seeded mix of dense and sparse sets against tables that hit, miss and collide.
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        for round in 0..200 {
            let spread = [8u64, 64, 1 << 12, 1 << 20, u64::MAX][round % 5];
            let n = (next() % 200) as usize;
            let ids: Vec<u64> = (0..n).map(|_| next() % spread).collect();
            let set = BlockSet::new(ids.iter().copied(), 3);
            let table: Vec<u64> = (0..(next() % 100))
                .map(|k| {
                    if k % 3 == 0 && !ids.is_empty() {
                        ids[(next() as usize) % ids.len()]
                    } else {
                        next() % spread
                    }
                })
                .collect();
            let expect: Vec<_> = table
                .iter()
                .enumerate()
                .filter(|(_, &id)| id != 3 && ids.contains(&id))
                .map(|(i, &id)| (i, id))
                .collect();
            assert_eq!(hits(&set, &table), expect, "round {round}");
            for &id in &table {
                assert_eq!(set.contains(id), id != 3 && ids.contains(&id));
            }
        }
    }
}

#[cfg(test)]
mod filter_quality {
    use super::*;

    /// Entries of `table` that pass `set`'s filter.
    fn passing(set: &BlockSet, table: &[BlockId]) -> usize {
        match &set.repr {
            Repr::Small { slots, shift, .. } => table
                .iter()
                .filter(|&&id| slots[slot(id, *shift) & (slots.len() - 1)] != 0)
                .count(),
            Repr::Sparse { filter, .. } => table
                .iter()
                .filter(|&&id| filter_bit(filter, filter.len() - 1, id) & 1 != 0)
                .count(),
            _ => panic!("not a filtered set"),
        }
    }

    /// Against a run of consecutive ids (what tables hold), the filters pass about as many
    /// entries as their share of set slots predicts: the hash spreads consecutive ids.
    #[test]
    fn consecutive_ids_are_spread() {
        let table: Vec<u64> = (1..=875_000).collect();
        let mut x = 12345u64;
        for n in [10usize, 64, 65, 500, 5000] {
            let ids: Vec<u64> = (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    1 + (x >> 33) % 875_000
                })
                .collect();
            let set = BlockSet::new(ids.iter().copied(), 0);
            let per_member = if n <= SMALL_MAX {
                SMALL_SLOTS_PER_MEMBER as f64
            } else {
                FILTER_BITS_PER_MEMBER as f64
            };
            // Expected: every member's own entry plus a false-positive share of at most
            // 1 / per_member of the rest.
            let expected = n as f64 + table.len() as f64 / per_member;
            let got = passing(&set, &table) as f64;
            assert!(
                got < 2.0 * expected,
                "{n} ids: {got} entries pass, expected ≈ {expected}"
            );
        }
    }
}
