//! Chunk keys: a chain hash over a token prefix, per cache group, under a layout tag.

use std::fmt;

use crate::rules::geometry::{CacheGroup, GroupKind, MambaMode};

/// Names one block's worth of KV: one cache group's block `k` of one token prefix, under a
/// layout/model tag (a connector's: [`ChunkKey::layout_tag`]). 128 bits, chained: the key of block `k` hashes the key of block `k − 1`,
/// the block's tokens, the group index and the tag, so equal keys mean equal prefixes (up to a
/// 2⁻¹²⁸-scale collision) and two models (tags) never share a key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ChunkKey(pub u128);

/// Bytes [`ChunkKey::chain`] hashes before a block's tokens: the parent, the tag, the group.
const HEAD: usize = 16 + 8 + 4;

/// The most tokens a block may hold for [`ChunkKey::chain`] to lay it out on the stack.
const STACK_TOKENS: usize = 128;

impl ChunkKey {
    /// The key of the block after `parent` (use [`ChunkKey::ROOT`] for block 0) holding
    /// `tokens`, in group `group`, under layout tag `tag`.
    ///
    /// The hash is XXH3-128 of the parent (16 bytes), the tag (8), the group (4) and the
    /// tokens (4 each), all little-endian: stored chunks are found by it, so it never changes.
    /// A block of up to 128 tokens is laid out on the stack (no allocation).
    pub fn chain(parent: ChunkKey, tag: u64, group: u32, tokens: &[u32]) -> ChunkKey {
        let len = HEAD + 4 * tokens.len();
        let mut stack = [0u8; HEAD + 4 * STACK_TOKENS];
        let mut heap = Vec::new();
        let buf: &mut [u8] = match stack.get_mut(..len) {
            Some(b) => b,
            None => {
                heap.resize(len, 0);
                &mut heap
            }
        };
        let (head, body) = buf.split_at_mut(HEAD);
        head[..16].copy_from_slice(&parent.0.to_le_bytes());
        head[16..24].copy_from_slice(&tag.to_le_bytes());
        head[24..].copy_from_slice(&group.to_le_bytes());
        for (out, t) in body.chunks_exact_mut(4).zip(tokens) {
            out.copy_from_slice(&t.to_le_bytes());
        }
        ChunkKey(xxhash_rust::xxh3::xxh3_128(buf))
    }

    /// The keys of the first `blocks` full blocks of `tokens` in a group of `block_size`
    /// tokens (fewer when `tokens` holds fewer full blocks), block 0 first.
    pub fn chain_blocks(
        tag: u64,
        group: u32,
        block_size: u64,
        tokens: &[u32],
        blocks: usize,
    ) -> Vec<ChunkKey> {
        let b = usize::try_from(block_size).unwrap_or(usize::MAX).max(1);
        let mut parent = ChunkKey::ROOT;
        tokens
            .chunks_exact(b)
            .take(blocks)
            .map(|c| {
                parent = ChunkKey::chain(parent, tag, group, c);
                parent
            })
            .collect()
    }

    /// The tag a [`TierConnector`](super::TierConnector) chains its keys under: the model's
    /// `tag` ([`TierConnectorConfig::tag`](super::TierConnectorConfig::tag)) with the layout
    /// mixed in — each group's kind (window, Mamba mode), tokens per block and bytes per
    /// block. So two engines whose layouts differ in any of them never share a key, whatever
    /// tag they give, and a chunk one stores is never another's hit (its bytes would fit the
    /// other's blocks, or be refused only by their length). Bytes that differ for another
    /// reason (another model, dtype, a tensor-parallel rank's shard) need another `tag`.
    ///
    /// XXH3-64 of `kvsched-layout-v1`, the tag and, per group, its kind code (0 full
    /// attention; 1 sliding window, then the window; 2 Mamba, then 0 for `align` or 1 for
    /// `all`), block size and bytes per block, each a little-endian `u64`: stored chunks are
    /// found by it, so it never changes. `bytes_per_block` has one entry per group (a missing
    /// one counts as 0).
    pub fn layout_tag(tag: u64, groups: &[CacheGroup], bytes_per_block: &[usize]) -> u64 {
        let mut buf = b"kvsched-layout-v1".to_vec();
        let mut put = |v: u64| buf.extend_from_slice(&v.to_le_bytes());
        put(tag);
        for (g, grp) in groups.iter().enumerate() {
            match grp.kind {
                GroupKind::FullAttention => put(0),
                GroupKind::SlidingWindow { window } => {
                    put(1);
                    put(window);
                }
                GroupKind::Mamba { mode } => {
                    put(2);
                    put(match mode {
                        MambaMode::Align => 0,
                        MambaMode::All => 1,
                    });
                }
            }
            put(grp.block_size);
            put(bytes_per_block.get(g).map_or(0, |&b| b as u64));
        }
        xxhash_rust::xxh3::xxh3_64(&buf)
    }

    /// The parent of block 0.
    pub const ROOT: ChunkKey = ChunkKey(0);

    /// The key as 16 little-endian bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_le_bytes()
    }

    /// The key from 16 little-endian bytes.
    pub fn from_bytes(b: [u8; 16]) -> ChunkKey {
        ChunkKey(u128::from_le_bytes(b))
    }
}

impl fmt::Debug for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkKey({:032x})", self.0)
    }
}

impl fmt::Display for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::{ChunkKey, STACK_TOKENS};

    /// Every part of the layout changes the tag, and the tag is pinned: stored chunks are
    /// found by it.
    #[test]
    fn layout_tag_depends_on_every_part_of_the_layout() {
        use crate::rules::geometry::{CacheGroup, MambaMode};
        let hybrid = [
            CacheGroup::full_attention(16),
            CacheGroup::sliding_window(16, 32),
            CacheGroup::mamba(16, MambaMode::Align),
        ];
        let bytes = [128, 128, 32];
        let t = ChunkKey::layout_tag(0, &hybrid, &bytes);
        assert_eq!(t, ChunkKey::layout_tag(0, &hybrid, &bytes));
        assert_ne!(
            t,
            ChunkKey::layout_tag(1, &hybrid, &bytes),
            "the model's tag"
        );
        assert_ne!(
            t,
            ChunkKey::layout_tag(0, &hybrid[..1], &bytes[..1]),
            "the groups"
        );
        assert_ne!(
            t,
            ChunkKey::layout_tag(0, &hybrid, &[256, 128, 32]),
            "bytes per block"
        );
        let mut other = hybrid;
        other[1] = CacheGroup::sliding_window(16, 64);
        assert_ne!(t, ChunkKey::layout_tag(0, &other, &bytes), "the window");
        other = hybrid;
        other[2] = CacheGroup::mamba(16, MambaMode::All);
        assert_ne!(t, ChunkKey::layout_tag(0, &other, &bytes), "the Mamba mode");
        other = hybrid;
        other[0] = CacheGroup::full_attention(32);
        assert_ne!(t, ChunkKey::layout_tag(0, &other, &bytes), "the block size");
        let dense = [CacheGroup::full_attention(16)];
        assert_eq!(
            ChunkKey::layout_tag(0, &dense, &[128]),
            0x9109_53bf_0b15_b16a,
            "pinned"
        );
    }

    #[test]
    fn chain_depends_on_every_input() {
        let k = ChunkKey::chain(ChunkKey::ROOT, 7, 0, &[1, 2, 3]);
        assert_ne!(k, ChunkKey::chain(ChunkKey::ROOT, 8, 0, &[1, 2, 3]));
        assert_ne!(k, ChunkKey::chain(ChunkKey::ROOT, 7, 1, &[1, 2, 3]));
        assert_ne!(k, ChunkKey::chain(ChunkKey::ROOT, 7, 0, &[1, 2, 4]));
        assert_ne!(k, ChunkKey::chain(ChunkKey(1), 7, 0, &[1, 2, 3]));
        assert_eq!(k, ChunkKey::chain(ChunkKey::ROOT, 7, 0, &[1, 2, 3]));
        assert_eq!(ChunkKey::from_bytes(k.to_bytes()), k);
    }

    /// The bytes a key hashes, laid out the plain way: stored chunks are found by their keys,
    /// so the layout must not change whatever the block's size (on the stack or not).
    #[test]
    fn chain_hashes_parent_tag_group_and_tokens_little_endian() {
        const PINNED: u128 = 0xd41f_f85d_c345_83cd_21d2_e95f_a0f3_2b10;
        let reference = |parent: ChunkKey, tag: u64, group: u32, tokens: &[u32]| {
            let mut buf = Vec::new();
            buf.extend_from_slice(&parent.0.to_le_bytes());
            buf.extend_from_slice(&tag.to_le_bytes());
            buf.extend_from_slice(&group.to_le_bytes());
            for t in tokens {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            ChunkKey(xxhash_rust::xxh3::xxh3_128(&buf))
        };
        let tokens: Vec<u32> = (0..600u32).map(|t| t.wrapping_mul(2_654_435_761)).collect();
        let parent = ChunkKey(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        for n in [
            0,
            1,
            15,
            16,
            64,
            STACK_TOKENS - 1,
            STACK_TOKENS,
            STACK_TOKENS + 1,
            512,
            600,
        ] {
            assert_eq!(
                ChunkKey::chain(parent, 0xdead_beef, 3, &tokens[..n]),
                reference(parent, 0xdead_beef, 3, &tokens[..n]),
                "a block of {n} tokens"
            );
        }
        // One key pinned: a change of layout or hash shows here even if both sides change.
        assert_eq!(
            ChunkKey::chain(ChunkKey::ROOT, 7, 0, &[1, 2, 3]).0,
            PINNED,
            "{:#x}",
            ChunkKey::chain(ChunkKey::ROOT, 7, 0, &[1, 2, 3]).0
        );
    }
}
