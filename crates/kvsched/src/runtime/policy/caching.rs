//! Which full blocks may enter the prefix cache: those whose bytes are what their hash says.

use crate::rules::geometry::{CacheGroup, GroupKind, MambaMode};

/// Whether entry `index` of a table in group `grp`, with `computed` tokens computed, holds
/// what a prefix hit on it would read. Always for attention groups and Mamba in mode `all`.
/// A Mamba group in mode `align` keeps one real state, the one at the computed length: an
/// older entry was never written with the state at its block's end (a step that ran past it
/// wrote only its own last state), so it is not cached.
pub fn cacheable(grp: &CacheGroup, index: usize, computed: u64) -> bool {
    // Planted bug `mamba-align-cache-unwritten` (scripts/plants.sh): every full Mamba entry is
    // cached, real state or not (tests/kv_engine.rs reads garbage).
    if planted!("mamba-align-cache-unwritten") {
        return true;
    }
    match grp.kind {
        GroupKind::Mamba {
            mode: MambaMode::Align,
        } => (index as u64 + 1).saturating_mul(grp.block_size) == computed,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_align_state_at_the_computed_length_is_cacheable() {
        let align = CacheGroup::mamba(16, MambaMode::Align);
        assert!(cacheable(&align, 3, 64));
        assert!(!cacheable(&align, 2, 64));
        assert!(!cacheable(&align, 3, 70));
        assert!(cacheable(&CacheGroup::mamba(16, MambaMode::All), 2, 64));
        assert!(cacheable(&CacheGroup::full_attention(16), 0, 64));
        assert!(cacheable(&CacheGroup::sliding_window(16, 32), 0, 64));
    }
}
