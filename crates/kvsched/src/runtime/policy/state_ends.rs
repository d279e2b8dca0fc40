//! Where a reused prefix can end when a Mamba group keeps its state in mode `align`: only at
//! a length whose state some step ended on, and so was cached in the prefix cache or saved to
//! a tier.
//!
//! A Mamba `align` group needs one entry below a prefix of `L` tokens, the state after them
//! (entry `L / b − 1`); every older one may be the null block. Whether the cache holds
//! the blocks of a full-attention group is a leading run (each is needed), but a Mamba
//! `align` group's states are scattered: they exist at the ends of the steps that computed
//! the prompt, not at every block end. A search that only looks at the lengths just below the
//! full-attention run misses a state a few blocks further down, and one that needs every
//! Mamba entry, like full attention, finds none. [`state_ends`] lists the lengths, longest
//! first, at which every Mamba `align` group holds its state: the local prefix search
//! (`policy::prefix`) tries those, and so does a tier's lookup (`kv::TierConnector`).

use crate::rules::geometry::{CacheGroup, GroupKind, MambaMode};

/// Whether group `grp` needs only the entry at a prefix's end, the state after it: Mamba in
/// mode `align`.
pub fn state_only(grp: &CacheGroup) -> bool {
    matches!(
        grp.kind,
        GroupKind::Mamba {
            mode: MambaMode::Align
        }
    )
}

/// The multiples of `s` in `(0, top]`, longest first, at which every Mamba `align` group `g`
/// of `groups` holds its state: `held(g, index)` for entry `index = L / b_g − 1`. Every
/// multiple of `s` when no group is Mamba `align`. Lazy: a caller that takes the first one
/// asks `held` only down to it.
pub fn state_ends<'a>(
    groups: &'a [CacheGroup],
    s: u64,
    top: u64,
    mut held: impl FnMut(usize, usize) -> bool + 'a,
) -> impl Iterator<Item = u64> + 'a {
    let s = s.max(1);
    let top = top - top % s;
    (1..=top / s).rev().map(move |k| k * s).filter(move |&len| {
        groups.iter().enumerate().all(|(g, grp)| {
            if !state_only(grp) {
                return true;
            }
            if planted!("mamba-state-one-block-late") {
                // The state one block past the prefix: a load would read a later state.
                return held(g, (len / grp.block_size.max(1)) as usize);
            }
            match (len / grp.block_size.max(1)).checked_sub(1) {
                Some(i) => held(g, i as usize),
                None => false,
            }
        })
    })
}

/// The entry a step that computes up to `upto` tokens writes group `grp`'s state into, for a
/// Mamba `align` group: the one holding token `upto − 1`. `None` for other groups (and
/// `upto = 0`).
pub fn written_state(grp: &CacheGroup, upto: u64) -> Option<usize> {
    if !state_only(grp) {
        return None;
    }
    let i = upto.checked_sub(1)? / grp.block_size.max(1);
    usize::try_from(i).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Vec<CacheGroup> {
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(64, MambaMode::Align),
        ]
    }

    #[test]
    fn only_lengths_whose_state_is_held_longest_first() {
        let g = groups();
        // States after 128 and 320 tokens (entries 1 and 4).
        let held = |grp: usize, i: usize| grp == 1 && (i == 1 || i == 4);
        let ends: Vec<u64> = state_ends(&g, 64, 1000, held).collect();
        assert_eq!(ends, [320, 128]);
        // `top` is rounded down to `s`.
        let ends: Vec<u64> = state_ends(&g, 64, 319, held).collect();
        assert_eq!(ends, [128]);
        assert_eq!(state_ends(&g, 64, 63, |_, _| true).count(), 0);
    }

    #[test]
    fn a_step_writes_the_state_into_the_entry_of_its_last_token() {
        let g = groups();
        assert_eq!(written_state(&g[1], 128), Some(1));
        assert_eq!(written_state(&g[1], 129), Some(2));
        assert_eq!(written_state(&g[1], 0), None);
        assert_eq!(written_state(&g[0], 128), None, "full attention");
    }

    #[test]
    fn without_a_mamba_align_group_every_multiple_of_s() {
        let g = vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(64, MambaMode::All),
        ];
        let ends: Vec<u64> = state_ends(&g, 64, 200, |_, _| false).collect();
        assert_eq!(ends, [192, 128, 64]);
    }

    proptest::proptest! {
        #[test]
        fn an_end_is_listed_exactly_when_every_align_state_is_held(
            states in proptest::collection::btree_set(0usize..40, 0..12),
            top in 0u64..3_000,
            b in proptest::sample::select(vec![16u64, 32, 64]),
        ) {
            let g = vec![CacheGroup::full_attention(16), CacheGroup::mamba(b, MambaMode::Align)];
            let s = 64u64; // a multiple of every b above
            let ends: Vec<u64> = state_ends(&g, s, top, |grp, i| grp == 1 && states.contains(&i)).collect();
            let want: Vec<u64> = (1..=top / s)
                .rev()
                .map(|k| k * s)
                .filter(|&l| states.contains(&((l / b - 1) as usize)))
                .collect();
            proptest::prop_assert_eq!(ends, want);
        }
    }
}
