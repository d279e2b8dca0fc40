//! Chunk keys: a chain hash over a token prefix, per cache group, under a layout tag.

use std::fmt;

/// Names one block's worth of KV: one cache group's block `k` of one token prefix, under a
/// layout/model tag. 128 bits, chained: the key of block `k` hashes the key of block `k − 1`,
/// the block's tokens, the group index and the tag, so equal keys mean equal prefixes (up to a
/// 2⁻¹²⁸-scale collision) and two models (tags) never share a key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ChunkKey(pub u128);

impl ChunkKey {
    /// The key of the block after `parent` (use [`ChunkKey::ROOT`] for block 0) holding
    /// `tokens`, in group `group`, under layout tag `tag`.
    pub fn chain(parent: ChunkKey, tag: u64, group: u32, tokens: &[u32]) -> ChunkKey {
        let mut buf = Vec::with_capacity(16 + 8 + 4 + 4 * tokens.len());
        buf.extend_from_slice(&parent.0.to_le_bytes());
        buf.extend_from_slice(&tag.to_le_bytes());
        buf.extend_from_slice(&group.to_le_bytes());
        for t in tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        ChunkKey(xxhash_rust::xxh3::xxh3_128(&buf))
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
    use super::ChunkKey;

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
}
