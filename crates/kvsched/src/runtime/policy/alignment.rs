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
//! * **A chunk that reaches the prompt's end stops first at the prompt's last block end**
//!   (`P` rounded down to `S`, when that is past `c` and short of `P`), as vLLM's scheduler
//!   does for Mamba `align` models: the state there is the one a request that continues this
//!   prompt (the next turn of a conversation) resumes from. The last `P mod S` tokens follow in
//!   the request's next step.
//! * **A chunk stops at the request's branch point** `B` when `c < B < c + n`: the end of
//!   the prefix its admission found in the prefix cache for the attention groups (their
//!   leading run of cached blocks, rounded down to `S`) but whose Mamba state no request had
//!   left ([`branch_point`]). Another prompt shares that prefix and goes on differently past it
//!   (a shared system prompt, an earlier turn): with the state at `B` cached, the next
//!   request sharing it resumes there instead of recomputing it.
//! * **Every decode step is not touched.**
//!
//! The tokens a chunk gives back stay in the step's budget for the requests after it in
//! canonical order, so the budget is lost only when nobody else can use it; the shards count
//! what was given back (`Metrics::aligned_chunk_tokens`): below `S` per request per step,
//! except at a branch point, where it is what the budget granted past it.

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

/// The branch point of a request admitted with its computed prefix ending at `computed` when
/// the attention groups' cached run reaches `cached` tokens (the local prefix search's cap):
/// `cached` rounded down to `S` when the geometry aligns chunks and that is past `computed`,
/// 0 (none) otherwise.
pub fn branch_point(geo: &Geometry, computed: u64, cached: u64) -> u64 {
    let b = geo.round_down_to_s(cached);
    if planted!("branch-state-uncached") {
        return 0; // chunks pass the end of a shared prefix: its state is never cached
    }
    if chunk_alignment(geo).is_some() && b > computed {
        b
    } else {
        0
    }
}

/// The tokens a request with `computed` tokens computed of a `prompt_len`-token prompt gets
/// when the budget grants it `granted`, with branch point `branch` (0: none): the chunk ends
/// at the branch point if it passes it, else at the last multiple of `align` it reaches when
/// it stops inside the prompt, else at the prompt's last multiple of `align` when it passes
/// that on its way to the prompt's end (the module docs give the rule). Never more than
/// `granted`, and never 0 when `granted` is not.
pub fn aligned_chunk(
    computed: u64,
    granted: u64,
    prompt_len: u64,
    align: Option<u64>,
    branch: u64,
) -> u64 {
    let Some(align) = align.filter(|&a| a > 1) else {
        return granted;
    };
    if planted!("unaligned-chunks") {
        return granted; // chunks end where the budget says: Mamba align prefixes not reusable
    }
    let end = computed.saturating_add(granted);
    if computed >= prompt_len {
        return granted; // decode
    }
    if computed < branch && branch < end && branch < prompt_len {
        return branch - computed;
    }
    let target = if end >= prompt_len {
        if planted!("prompt-end-state-uncached") {
            return granted; // the prompt's last block end is passed: no state to continue from
        }
        let last = prompt_len - prompt_len % align;
        if last == prompt_len {
            return granted; // the state at the prompt's end is at a block end already
        }
        last
    } else {
        end - end % align
    };
    if target > computed {
        target - computed
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
        assert_eq!(aligned_chunk(0, 100, 1000, a, 0), 64);
        // 64 + 200 = 264: back to 256.
        assert_eq!(aligned_chunk(64, 200, 1000, a, 0), 192);
        // Already on a block end.
        assert_eq!(aligned_chunk(128, 128, 1000, a, 0), 128);
        // Resuming mid-block: to the first block end reached.
        assert_eq!(aligned_chunk(10, 100, 1000, a, 0), 54);
    }

    #[test]
    fn a_chunk_to_the_prompt_end_stops_at_its_last_block_end() {
        let a = Some(64);
        assert_eq!(aligned_chunk(0, 1000, 1000, a, 0), 960, "960 = 15 · 64");
        assert_eq!(
            aligned_chunk(960, 50, 1000, a, 0),
            50,
            "the last block end is passed"
        );
        assert_eq!(aligned_chunk(900, 200, 1000, a, 0), 60, "resumed mid-block");
        assert_eq!(
            aligned_chunk(0, 1024, 1024, a, 0),
            1024,
            "the prompt ends on one"
        );
        assert_eq!(aligned_chunk(0, 1100, 1024, a, 0), 1100, "resumed past it");
    }

    #[test]
    fn a_chunk_stops_at_the_branch_point() {
        let a = Some(64);
        assert_eq!(aligned_chunk(0, 1000, 5000, a, 512), 512);
        assert_eq!(
            aligned_chunk(0, 5000, 5000, a, 512),
            512,
            "before the prompt end"
        );
        assert_eq!(
            aligned_chunk(512, 1000, 5000, a, 512),
            960,
            "already past it"
        );
        assert_eq!(aligned_chunk(0, 512, 5000, a, 512), 512, "ends on it");
        assert_eq!(aligned_chunk(0, 100, 5000, None, 64), 100, "no alignment");
    }

    #[test]
    fn the_branch_point_is_the_cached_run_past_the_computed_prefix() {
        let fa = CacheGroup::full_attention(16);
        let align = geo(vec![fa, CacheGroup::mamba(64, MambaMode::Align)]);
        assert_eq!(branch_point(&align, 0, 530), 512);
        assert_eq!(branch_point(&align, 512, 530), 0, "computed up to it");
        assert_eq!(branch_point(&align, 0, 63), 0);
        let all = geo(vec![fa, CacheGroup::mamba(64, MambaMode::All)]);
        assert_eq!(
            branch_point(&all, 0, 530),
            0,
            "no alignment, no branch point"
        );
    }

    #[test]
    fn decode_and_short_chunks_keep_their_tokens() {
        let a = Some(64);
        assert_eq!(aligned_chunk(1000, 1, 1000, a, 0), 1, "decode");
        assert_eq!(
            aligned_chunk(1000, 1, 1000, a, 1024),
            1,
            "decode past a branch"
        );
        assert_eq!(
            aligned_chunk(70, 20, 1000, a, 0),
            20,
            "stays inside one block"
        );
        assert_eq!(aligned_chunk(0, 0, 1000, a, 0), 0);
        assert_eq!(aligned_chunk(0, 100, 1000, None, 0), 100, "no alignment");
        assert_eq!(aligned_chunk(0, 100, 1000, Some(1), 0), 100);
        assert_eq!(aligned_chunk(u64::MAX - 1, 5, u64::MAX, a, 0), 5);
    }

    proptest::proptest! {
        #[test]
        fn a_chunk_ends_on_a_stop_or_keeps_its_tokens(
            computed in 0u64..5_000,
            granted in 0u64..5_000,
            prompt_len in 0u64..10_000,
            align in proptest::option::of(1u64..300),
            branch in 0u64..10_000,
        ) {
            let n = aligned_chunk(computed, granted, prompt_len, align, branch);
            proptest::prop_assert!(n <= granted);
            proptest::prop_assert_eq!(n == 0, granted == 0);
            let end = computed + granted;
            let a = align.unwrap_or(1);
            // The stops, in the order the rule takes them: the branch point, then the last
            // block end the chunk reaches short of the prompt's end (none when the prompt
            // ends on one and the chunk reaches it).
            let want = if a <= 1 || computed >= prompt_len {
                end
            } else if computed < branch && branch < end && branch < prompt_len {
                branch
            } else if end >= prompt_len && prompt_len % a == 0 {
                end
            } else {
                let upto = end.min(prompt_len - 1);
                (computed + 1..=upto).rev().find(|e| e % a == 0).unwrap_or(end)
            };
            proptest::prop_assert_eq!(computed + n, want);
        }
    }
}
