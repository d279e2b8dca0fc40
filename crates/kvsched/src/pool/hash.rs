//! Naming block contents for the prefix index: [`BlockHash`] and the prefix chain hash
//! [`chain_hash`].

/// A hash naming a block's contents in the prefix index. Callers mix the cache-group index
/// and the parent block's hash into it, so one index serves every group.
pub type BlockHash = u64;

/// The prefix-cache hash of one full block of `tokens` in cache group `group`, chained on the
/// hash of the blocks before it (`parent`, 0 for the first), so equal hashes mean equal
/// prefixes (up to 64-bit collisions).
pub fn chain_hash(parent: BlockHash, group: usize, tokens: &[u32]) -> BlockHash {
    let mut h = parent ^ (group as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        h = (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3);
        h ^= h >> 29;
    }
    h
}
