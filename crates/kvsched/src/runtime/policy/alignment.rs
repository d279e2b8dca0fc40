//! Block-aligned prefill chunks: where a step's chunk of a prompt ends when a Mamba group
//! keeps its state in mode `align`.
//!
//! A Mamba `align` group holds one real state, the one at the end of the request's latest
//! step; every older entry is the null block. A block of such a group is cached in the prefix
//! index and saved to a tier only when a step ended on that block's end (docs/kv.md), so a
//! prompt whose chunks end wherever the token budget runs out leaves almost nothing another
//! request can reuse. The rule, applied to every running request as it is granted tokens:
//!
//! * **The alignment** is the geometry's scheduler block size `S` (a multiple of every group's
//!   block size, so of the Mamba group's) when some group is Mamba `align`; otherwise there is
//!   none and chunks end where the budget says.
//! * **A chunk that stops inside the prompt** (computed `c`, granted `n`, `c + n` below the
//!   prompt's length) ends at the last multiple of `S` in `(c, c + n]` instead: the state at
//!   that block end is real, so the prefix up to it is cached and saved.
//! * **A chunk is never shortened to nothing**: when `(c, c + n]` holds no multiple of `S`
//!   (the chunk stays inside one block: a budget remainder, or a request resuming
//!   mid-block), it keeps its `n` tokens — ending it earlier would schedule nothing, and
//!   its state could not be cached either way.
//! * **A chunk that reaches the prompt's end, and every decode step, is not touched**: the
//!   state at the prompt's end is the one the request's next step reads.
//!
//! The tokens a chunk gives back stay in the step's budget for the requests after it in
//! canonical order, so the budget is lost only when nobody else can use it; the shards count
//! what was given back (`Metrics::aligned_chunk_tokens`), at most `S − 1` per request per
//! step.

use crate::rules::geometry::{Geometry, GroupKind, MambaMode};

/// The block size prefill chunks end on: the scheduler block size when a group is Mamba
/// `align`, `None` (chunks end where the budget says) otherwise.
pub fn chunk_alignment(geo: &Geometry) -> Option<u64> {
    let align = geo.groups().iter().any(|g| {
        matches!(
            g.kind,
            GroupKind::Mamba {
                mode: MambaMode::Align
            }
        )
    });
    align.then(|| geo.scheduler_block_size())
}

/// The tokens a request with `computed` tokens computed of a `prompt_len`-token prompt gets
/// when the budget grants it `granted`: `granted` cut back to the last multiple of `align` it
/// reaches, when the chunk stops inside the prompt and reaches one (the module docs give the
/// rule). Never more than `granted`, and never 0 when `granted` is not.
pub fn aligned_chunk(computed: u64, granted: u64, prompt_len: u64, align: Option<u64>) -> u64 {
    let Some(align) = align.filter(|&a| a > 1) else {
        return granted;
    };
    if planted!("unaligned-chunks") {
        return granted; // chunks end where the budget says: Mamba align prefixes not reusable
    }
    let end = computed.saturating_add(granted);
    if end >= prompt_len {
        return granted;
    }
    let aligned = end - end % align;
    if aligned > computed {
        aligned - computed
    } else {
        granted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::geometry::CacheGroup;

    fn geo(groups: Vec<CacheGroup>) -> Geometry {
        Geometry::new(groups, None, 0).unwrap()
    }

    #[test]
    fn only_a_mamba_align_group_aligns_chunks() {
        let fa = CacheGroup::full_attention(16);
        assert_eq!(chunk_alignment(&geo(vec![fa])), None);
        let all = CacheGroup::mamba(64, MambaMode::All);
        assert_eq!(chunk_alignment(&geo(vec![fa, all])), None);
        let swa = CacheGroup::sliding_window(16, 128);
        assert_eq!(chunk_alignment(&geo(vec![fa, swa])), None);
        let align = CacheGroup::mamba(64, MambaMode::Align);
        assert_eq!(chunk_alignment(&geo(vec![fa, align])), Some(64));
        let wide = CacheGroup::full_attention(128);
        assert_eq!(chunk_alignment(&geo(vec![wide, align])), Some(128));
    }

    #[test]
    fn a_chunk_inside_the_prompt_ends_on_a_block_end() {
        let a = Some(64);
        // 0 + 100 inside a 1000-token prompt: back to 64.
        assert_eq!(aligned_chunk(0, 100, 1000, a), 64);
        // 64 + 200 = 264: back to 256.
        assert_eq!(aligned_chunk(64, 200, 1000, a), 192);
        // Already on a block end.
        assert_eq!(aligned_chunk(128, 128, 1000, a), 128);
        // Resuming mid-block: to the first block end reached.
        assert_eq!(aligned_chunk(10, 100, 1000, a), 54);
    }

    #[test]
    fn the_prompt_end_decode_and_short_chunks_keep_their_tokens() {
        let a = Some(64);
        assert_eq!(
            aligned_chunk(0, 1000, 1000, a),
            1000,
            "reaches the prompt end"
        );
        assert_eq!(
            aligned_chunk(960, 50, 1000, a),
            50,
            "reaches it past the end"
        );
        assert_eq!(aligned_chunk(1000, 1, 1000, a), 1, "decode");
        assert_eq!(aligned_chunk(70, 20, 1000, a), 20, "stays inside one block");
        assert_eq!(aligned_chunk(0, 0, 1000, a), 0);
        assert_eq!(aligned_chunk(0, 100, 1000, None), 100, "no alignment");
        assert_eq!(aligned_chunk(0, 100, 1000, Some(1)), 100);
        assert_eq!(aligned_chunk(u64::MAX - 1, 5, u64::MAX, a), 5);
    }

    proptest::proptest! {
        #[test]
        fn a_chunk_ends_on_the_last_block_end_it_reaches_or_keeps_its_tokens(
            computed in 0u64..5_000,
            granted in 0u64..5_000,
            prompt_len in 0u64..10_000,
            align in proptest::option::of(1u64..300),
        ) {
            let n = aligned_chunk(computed, granted, prompt_len, align);
            proptest::prop_assert!(n <= granted);
            proptest::prop_assert_eq!(n == 0, granted == 0);
            let end = computed + granted;
            let a = align.unwrap_or(1);
            let last_block_end = (computed + 1..=end).rev().find(|e| e % a == 0);
            match last_block_end {
                Some(e) if end < prompt_len => proptest::prop_assert_eq!(computed + n, e),
                _ => proptest::prop_assert_eq!(n, granted),
            }
        }
    }
}
