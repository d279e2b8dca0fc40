//! [`HostKvMemory`]: KV memory in host RAM, as 64-bit atomic words.

use super::kv_memory::{KvLayout, KvMemory, KvMemoryError, POISON_BYTE};
use crate::rules::geometry::BlockId;
use crate::sync::{store_words_xor, AtomicU64, Ordering};

/// KV memory in host RAM: one slot per block of the largest group's size, rounded up to 8
/// bytes, stored as atomic words so that racing accesses (which the runtime's rules exclude)
/// could tear bytes but never be undefined behaviour.
///
/// **Allocation.** The words are allocated zeroed and fallibly: a size the system cannot
/// give is [`KvMemoryError::Alloc`], never an abort, and pages are not touched until a block
/// is used (the kernel hands out zero pages lazily), so a large pool costs no resident memory
/// up front. Each word is stored XOR [`POISON_BYTE`]s: a zero page reads as poison, which is
/// what a block holds before it is first written.
///
/// Accesses are Relaxed word copies: ordering between a writer and a reader comes from the
/// runtime's hand-offs (the completion queue, the step), not from the memory.
///
/// **Write epochs.** Each block has a counter ([`KvMemory::write_epoch`]) that every write
/// bumps once its words are stored (Release; the epoch is read with Acquire), so a reader
/// that loads epoch `e`, then reads the bytes, and later loads `e` again, saw every write
/// that landed before its first load and knows none landed since. One more word per block.
pub struct HostKvMemory {
    layout: KvLayout,
    words_per_block: usize,
    words: Box<[AtomicU64]>,
    epochs: Box<[AtomicU64]>,
}

impl std::fmt::Debug for HostKvMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKvMemory")
            .field("layout", &self.layout)
            .field("blocks", &self.num_blocks())
            .finish_non_exhaustive()
    }
}

/// What a word is stored XOR with: a zero word reads as poison.
const POISON_WORD: u64 = u64::from_ne_bytes([POISON_BYTE; 8]);

/// `n` zero words, allocated fallibly and without touching their pages; `None` if the
/// allocation fails or its size overflows.
#[cfg(not(kvsched_loom))]
fn zeroed_words(n: usize) -> Option<Box<[AtomicU64]>> {
    if n == 0 {
        return Some(Box::new([]));
    }
    let layout = std::alloc::Layout::array::<AtomicU64>(n).ok()?;
    // SAFETY: `layout` has a non-zero size (n > 0, and an AtomicU64 is 8 bytes).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<AtomicU64>();
    if ptr.is_null() {
        return None;
    }
    let slice = std::ptr::slice_from_raw_parts_mut(ptr, n);
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `[AtomicU64; n]`
    // (which is what `Box<[AtomicU64]>` frees with), is non-null, aligned and zeroed, and an
    // all-zero AtomicU64 is a valid AtomicU64 holding 0 (it has the representation of u64).
    // The box is its only owner.
    Some(unsafe { Box::from_raw(slice) })
}

/// `n` zero words (loom's atomics are not plain memory: built one by one).
#[cfg(kvsched_loom)]
fn zeroed_words(n: usize) -> Option<Box<[AtomicU64]>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.extend((0..n).map(|_| AtomicU64::new(0)));
    Some(v.into_boxed_slice())
}

impl HostKvMemory {
    /// Memory for `num_blocks` blocks (the null block 0 included, which holds poison).
    ///
    /// # Errors
    ///
    /// [`KvMemoryError::TooLarge`] when the size overflows `usize` (or the address space's
    /// largest allocation), [`KvMemoryError::Alloc`] when the system cannot give that much.
    pub fn new(layout: KvLayout, num_blocks: usize) -> Result<HostKvMemory, KvMemoryError> {
        let block_bytes = layout.max_block_bytes();
        let words_per_block = block_bytes.div_ceil(8);
        let total = words_per_block
            .checked_mul(num_blocks)
            .filter(|w| w.checked_mul(8).is_some())
            .ok_or(KvMemoryError::TooLarge {
                blocks: num_blocks,
                block_bytes,
            })?;
        let words = zeroed_words(total).ok_or_else(|| {
            if std::alloc::Layout::array::<u64>(total).is_err() {
                KvMemoryError::TooLarge {
                    blocks: num_blocks,
                    block_bytes,
                }
            } else {
                KvMemoryError::Alloc { bytes: total * 8 }
            }
        })?;
        let epochs = zeroed_words(num_blocks).ok_or(KvMemoryError::Alloc {
            bytes: num_blocks.saturating_mul(8),
        })?;
        Ok(HostKvMemory {
            layout,
            words_per_block,
            words,
            epochs,
        })
    }

    /// Blocks it holds, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.words
            .len()
            .checked_div(self.words_per_block)
            .unwrap_or(0)
    }

    /// Bytes of host memory it holds.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// The words of `block` covering bytes `offset..offset + len` of a `group` block, and the
    /// byte offset of `offset` inside the first word.
    fn span(
        &self,
        group: usize,
        block: BlockId,
        offset: usize,
        len: usize,
        writing: bool,
    ) -> Result<(&[AtomicU64], usize), KvMemoryError> {
        let block_bytes = self
            .layout
            .bytes_per_block(group)
            .ok_or(KvMemoryError::Group(group))?;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= block_bytes)
            .ok_or(KvMemoryError::Range {
                offset,
                end: offset.saturating_add(len),
                block_bytes,
            })?;
        let b = usize::try_from(block).map_err(|_| KvMemoryError::Block(block))?;
        if b >= self.num_blocks() || (writing && b == 0) {
            return Err(KvMemoryError::Block(block));
        }
        let base = b * self.words_per_block;
        let (w0, w1) = (offset / 8, end.div_ceil(8));
        Ok((&self.words[base + w0..base + w1], offset % 8))
    }
}

/// Stores 64 bytes as eight words (each XOR the poison pattern).
#[inline(always)]
fn store8(w: &[AtomicU64; 8], c: &[u8; 64]) {
    for (i, w) in w.iter().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&c[i * 8..i * 8 + 8]);
        // Relaxed: see the type's docs; the runtime orders writers and readers.
        w.store(u64::from_ne_bytes(b) ^ POISON_WORD, Ordering::Relaxed);
    }
}

impl KvMemory for HostKvMemory {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn write(
        &self,
        group: usize,
        block: BlockId,
        offset: usize,
        data: &[u8],
    ) -> Result<(), KvMemoryError> {
        let (words, skew) = self.span(group, block, offset, data.len(), true)?;
        Self::store(words, skew, data);
        // Planted bug: a whole-block write (what a load and a poison do) leaves the epoch as
        // it was, so a reader that checked the block before takes the new bytes as checked.
        let whole = offset == 0 && Some(data.len()) == self.layout.bytes_per_block(group);
        if !(planted!("epoch-not-bumped-on-whole-block-write") && whole) {
            if let Some(e) = usize::try_from(block).ok().and_then(|b| self.epochs.get(b)) {
                // Release: pairs with the Acquire load in `write_epoch`: after the words
                // above, so a reader that sees this epoch sees the bytes (the type's docs).
                e.fetch_add(1, Ordering::Release);
            }
        }
        Ok(())
    }

    fn write_epoch(&self, block: BlockId) -> Option<u64> {
        let b = usize::try_from(block).ok().filter(|&b| b > 0)?;
        // Acquire: pairs with the Release bump in `write`.
        self.epochs.get(b).map(|e| e.load(Ordering::Acquire))
    }

    fn read(
        &self,
        group: usize,
        block: BlockId,
        offset: usize,
        out: &mut [u8],
    ) -> Result<(), KvMemoryError> {
        let (words, skew) = self.span(group, block, offset, out.len(), false)?;
        if skew == 0 {
            let whole = out.len() / 8 * 8;
            let (body, tail) = out.split_at_mut(whole);
            for (c, w) in body.chunks_exact_mut(8).zip(words) {
                c.copy_from_slice(&(w.load(Ordering::Relaxed) ^ POISON_WORD).to_ne_bytes());
            }
            if let (Some(w), false) = (words.get(whole / 8), tail.is_empty()) {
                let b = (w.load(Ordering::Relaxed) ^ POISON_WORD).to_ne_bytes();
                tail.copy_from_slice(&b[..tail.len()]);
            }
            return Ok(());
        }
        let mut pos = 0usize;
        for (i, w) in words.iter().enumerate() {
            let lo = if i == 0 { skew } else { 0 };
            let take = (8 - lo).min(out.len() - pos);
            let b = (w.load(Ordering::Relaxed) ^ POISON_WORD).to_ne_bytes();
            out[pos..pos + take].copy_from_slice(&b[lo..lo + take]);
            pos += take;
        }
        Ok(())
    }
}

impl HostKvMemory {
    /// Stores `data` into `words`, starting `skew` bytes into the first.
    fn store(words: &[AtomicU64], skew: usize, data: &[u8]) {
        if skew == 0 {
            // Word-aligned (every whole-block write): 64 bytes a round in 16-byte stores
            // where the target has them (`sync::store_words_xor`), the rest eight words per
            // round, as fixed-size arrays so no index is checked inside the loop (independent
            // loads, XORs and stores the core overlaps: bound by its stores, two a cycle on
            // current x86), then one at a time.
            let whole = data.len() / 8;
            // (Planted bug `vector-store-skips-round`, scripts/plants.sh: the vector path's
            // words are taken as stored one round further than they were, so 64 bytes of
            // every whole-block write keep what the block held.)
            let mut done = store_words_xor(&words[..whole], data, POISON_WORD);
            if planted!("vector-store-skips-round") && done > 0 {
                done = (done + 8).min(whole);
            }
            let (words, data) = (&words[done..], &data[done * 8..]);
            let whole = whole - done;
            let (octs, rest) = words[..whole].split_at(whole / 8 * 8);
            let mut src = data.chunks_exact(64);
            for (w, c) in octs.chunks_exact(8).zip(&mut src) {
                if let (Ok(w), Ok(c)) = (<&[AtomicU64; 8]>::try_from(w), <&[u8; 64]>::try_from(c)) {
                    store8(w, c);
                }
            }
            let mut chunks = src.remainder().chunks_exact(8);
            for (w, c) in rest.iter().zip(&mut chunks) {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                // Relaxed: see the type's docs; the runtime orders writers and readers.
                w.store(u64::from_ne_bytes(b) ^ POISON_WORD, Ordering::Relaxed);
            }
            let tail = chunks.remainder();
            if let (Some(w), false) = (words.get(data.len() / 8), tail.is_empty()) {
                // A partial last word: merge with what is there (only this writer owns it).
                let mut b = (w.load(Ordering::Relaxed) ^ POISON_WORD).to_ne_bytes();
                b[..tail.len()].copy_from_slice(tail);
                w.store(u64::from_ne_bytes(b) ^ POISON_WORD, Ordering::Relaxed);
            }
            return;
        }
        let mut pos = 0usize;
        for (i, w) in words.iter().enumerate() {
            let lo = if i == 0 { skew } else { 0 };
            let take = (8 - lo).min(data.len() - pos);
            if lo == 0 && take == 8 {
                let mut b = [0u8; 8];
                b.copy_from_slice(&data[pos..pos + 8]);
                // Relaxed: see the type's docs; the runtime orders writers and readers.
                w.store(u64::from_ne_bytes(b) ^ POISON_WORD, Ordering::Relaxed);
            } else {
                // A partial word: merge with what is there (only this writer owns the block).
                let mut b = (w.load(Ordering::Relaxed) ^ POISON_WORD).to_ne_bytes();
                b[lo..lo + take].copy_from_slice(&data[pos..pos + take]);
                w.store(u64::from_ne_bytes(b) ^ POISON_WORD, Ordering::Relaxed);
            }
            pos += take;
        }
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;

    fn mem() -> HostKvMemory {
        match KvLayout::new(vec![64, 13]).and_then(|l| HostKvMemory::new(l, 4)) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn bytes_round_trip_at_any_offset() {
        let m = mem();
        for off in 0..13 {
            for len in 0..=13 - off {
                let data: Vec<u8> = (0..len as u8).map(|x| x.wrapping_mul(7) + 1).collect();
                assert_eq!(m.write(1, 2, off, &data), Ok(()));
                let mut back = vec![0; len];
                assert_eq!(m.read(1, 2, off, &mut back), Ok(()));
                assert_eq!(back, data, "offset {off} len {len}");
            }
        }
        // Neighbouring blocks are untouched.
        let mut other = vec![0; 64];
        assert_eq!(m.read(0, 3, 0, &mut other), Ok(()));
        assert!(other.iter().all(|&b| b == POISON_BYTE));
    }

    #[test]
    fn long_writes_round_trip_whatever_their_length_and_offset() {
        // Long enough for the 64-byte vector rounds, with word and byte offsets and every
        // length of tail; each write's pattern differs from the one before it.
        let m = match KvLayout::new(vec![600]).and_then(|l| HostKvMemory::new(l, 3)) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        };
        let mut round = 0u8;
        for off in [0, 8, 3] {
            for len in (0..=600 - off).step_by(7).chain([600 - off]) {
                round = round.wrapping_add(1);
                let data: Vec<u8> = (0..len)
                    .map(|i| (i as u8).wrapping_mul(13).wrapping_add(round))
                    .collect();
                assert_eq!(m.write(0, 1, off, &data), Ok(()));
                let mut back = vec![0; len];
                assert_eq!(m.read(0, 1, off, &mut back), Ok(()));
                assert!(back == data, "offset {off} len {len}");
            }
        }
        let mut other = vec![0; 600];
        assert_eq!(m.read(0, 2, 0, &mut other), Ok(()));
        assert!(other.iter().all(|&b| b == POISON_BYTE), "block 2 untouched");
    }

    #[test]
    fn every_write_changes_the_epoch_and_reads_do_not() {
        let m = mem();
        assert_eq!(m.write_epoch(0), None, "the null block is not tracked");
        assert_eq!(m.write_epoch(4), None, "out of range");
        let mut seen = vec![m.write_epoch(2)];
        let mut back = [0u8; 13];
        assert_eq!(m.read(1, 2, 0, &mut back), Ok(()));
        assert_eq!(m.write_epoch(2), seen[0], "a read leaves the epoch");
        // A token-sized write, a whole-block write in each group (what a load does), a poison.
        assert_eq!(m.write(0, 2, 8, &[1; 8]), Ok(()));
        seen.push(m.write_epoch(2));
        assert_eq!(m.write(0, 2, 0, &[2; 64]), Ok(()));
        seen.push(m.write_epoch(2));
        assert_eq!(m.write(1, 2, 0, &[3; 13]), Ok(()));
        seen.push(m.write_epoch(2));
        assert_eq!(m.poison(1, 2), Ok(()));
        seen.push(m.write_epoch(2));
        for w in seen.windows(2) {
            assert!(w[0].is_some() && w[0] != w[1], "{seen:?}");
        }
        assert_eq!(m.write_epoch(3), Some(0), "other blocks untouched");
        assert!(m.write(0, 0, 0, &[1]).is_err());
        assert_eq!(m.write_epoch(1), Some(0), "a refused write changes nothing");
    }

    #[test]
    fn bad_accesses_are_errors() {
        let m = mem();
        assert_eq!(m.write(0, 0, 0, &[1]), Err(KvMemoryError::Block(0)));
        assert_eq!(m.write(0, 4, 0, &[1]), Err(KvMemoryError::Block(4)));
        assert_eq!(m.write(2, 1, 0, &[1]), Err(KvMemoryError::Group(2)));
        assert!(matches!(
            m.write(1, 1, 10, &[0; 4]),
            Err(KvMemoryError::Range { .. })
        ));
        assert!(matches!(
            m.read(1, 1, usize::MAX, &mut [0; 2]),
            Err(KvMemoryError::Range { .. })
        ));
        let mut null = [0u8; 13];
        assert_eq!(m.read(1, 0, 0, &mut null), Ok(()));
        assert!(
            null.iter().all(|&b| b == POISON_BYTE),
            "the null block reads as poison"
        );
        assert_eq!(m.poison(1, 1), Ok(()));
        assert!(HostKvMemory::new(
            KvLayout::new(vec![8]).unwrap_or_else(|e| panic!("{e}")),
            usize::MAX
        )
        .is_err());
        assert!(KvLayout::new(vec![]).is_err());
    }

    #[test]
    fn a_size_the_system_cannot_give_is_an_error_not_an_abort() {
        // 1 TiB blocks × 1 Mi blocks: 2^60 bytes.
        let huge = KvLayout::new(vec![1 << 40]).unwrap_or_else(|e| panic!("{e}"));
        match HostKvMemory::new(huge, 1 << 20) {
            Err(KvMemoryError::Alloc { .. } | KvMemoryError::TooLarge { .. }) => {}
            other => panic!("{other:?}"),
        }
        // 64 GiB: an error, or memory that costs no resident pages until used.
        let rss = || {
            std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                })
                .unwrap_or(0)
        };
        let before = rss();
        let l = KvLayout::new(vec![1 << 20]).unwrap_or_else(|e| panic!("{e}"));
        if let Ok(m) = HostKvMemory::new(l, 64 << 10) {
            assert!(
                rss().saturating_sub(before) < 256 << 10,
                "pages touched eagerly"
            );
            let mut b = [0u8; 16];
            assert_eq!(m.read(0, (64 << 10) - 1, 0, &mut b), Ok(()));
            assert_eq!(b, [POISON_BYTE; 16], "a fresh block reads as poison");
        }
        assert!(KvLayout::new(vec![8, 0]).is_err());
    }
}
