//! The blocks a request's tables need: for its prompt at admission, for the tokens a step
//! computes, and whether the pool could ever hold them.

use crate::rules::geometry::CacheGroup;

/// Blocks the tables need, all groups together, to hold `tokens` tokens, beyond the entries
/// they have (`held`: one count per group, in group order).
pub fn blocks_needed(
    groups: &[CacheGroup],
    held: impl IntoIterator<Item = usize>,
    tokens: u64,
) -> usize {
    groups
        .iter()
        .zip(held)
        .map(|(g, n)| (g.blocks_for_tokens(tokens) as usize).saturating_sub(n))
        .sum()
}

/// Whether `tokens` tokens need more blocks, all groups together, than a pool of
/// `pool_blocks` slots holds besides the null block.
pub fn outgrows_pool(groups: &[CacheGroup], tokens: u64, pool_blocks: usize) -> bool {
    let need: u64 = groups.iter().map(|g| g.blocks_for_tokens(tokens)).sum();
    need > pool_blocks.saturating_sub(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::geometry::MambaMode;

    #[test]
    fn blocks_needed_counts_what_each_group_lacks() {
        let groups = [
            CacheGroup::full_attention(16),
            CacheGroup::mamba(32, MambaMode::Align),
        ];
        assert_eq!(blocks_needed(&groups, [0, 0], 33), 3 + 2);
        assert_eq!(blocks_needed(&groups, [2, 2], 33), 1);
        assert_eq!(blocks_needed(&groups, [5, 5], 33), 0);
        assert!(!outgrows_pool(&groups, 33, 6));
        assert!(outgrows_pool(&groups, 33, 5));
    }
}
