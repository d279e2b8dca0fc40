//! The local prefix search at admission: the longest prefix of a prompt — a multiple of the
//! scheduler block size `S`, below the prompt's last token — whose entries every cache group
//! finds in the prefix cache or may leave null.
//!
//! The search is bounded: [`prefix_cap`] caps it by the leading run of cached blocks of every
//! group that needs every entry, and [`prefix_candidates`] tries at most
//! [`MAX_PREFIX_PROBES`] lengths below that, longest first, at which every Mamba `align` group
//! has its state cached (`policy::state_ends`). A caller checks each candidate's
//! entries ([`prefix_entries`]) against the prefix cache and takes the first that is whole;
//! none means no local prefix (0).

use super::state_ends::state_ends;
use crate::pool::BlockHash;
use crate::rules::geometry::{CacheGroup, Geometry, GroupKind, MambaMode};

/// Candidate prefix lengths tried per admission, longest first. Bounds an admission's
/// prefix-cache lookups (a candidate found incomplete gives back what it took) when the
/// groups that may hold null entries keep rejecting the longer candidates.
pub const MAX_PREFIX_PROBES: usize = 8;

/// The longest prefix worth trying for a prompt of `prompt_len` tokens whose block hashes
/// are `hashes` (per group, chained): below the prompt's last token (always computed), at
/// most the leading run of blocks `cached` reports in the prefix cache, in every group that
/// needs every entry below the prefix (full attention, Mamba `all`). Not rounded to `S`.
pub fn prefix_cap(
    geo: &Geometry,
    prompt_len: u64,
    hashes: &[Vec<BlockHash>],
    mut cached: impl FnMut(BlockHash) -> bool,
) -> u64 {
    let mut cap = geo.round_down_to_s(prompt_len.saturating_sub(1));
    for (grp, h) in geo.groups().iter().zip(hashes) {
        if needs_every_entry(grp) {
            let n = h.iter().take_while(|&&x| cached(x)).count() as u64;
            cap = cap.min(n.saturating_mul(grp.block_size));
        }
    }
    cap
}

/// The prefix lengths to try for a prefix of at most `cap` tokens, longest first: the
/// multiples of `S` at or below `cap` at which every Mamba `align` group finds its state in
/// the prefix cache (`cached`; `policy::state_ends`), at most [`MAX_PREFIX_PROBES`] of them,
/// never 0. Without a Mamba `align` group, the multiples of `S` just below `cap`.
pub fn prefix_candidates<'a>(
    geo: &'a Geometry,
    cap: u64,
    hashes: &'a [Vec<BlockHash>],
    mut cached: impl FnMut(BlockHash) -> bool + 'a,
) -> impl Iterator<Item = u64> + 'a {
    let s = geo.scheduler_block_size();
    let held = move |g: usize, i: usize| {
        hashes
            .get(g)
            .and_then(|h| h.get(i))
            .is_some_and(|&h| cached(h))
    };
    state_ends(geo.groups(), s, geo.round_down_to_s(cap), held).take(MAX_PREFIX_PROBES)
}

/// What a prefix of `len` tokens needs from group `grp`, as `(nullable, n)`: its first `n`
/// entries, of which those below `nullable` are the null block and the others
/// (`nullable..n`) must be prefix-cache hits.
pub fn prefix_entries(grp: &CacheGroup, len: u64) -> (usize, usize) {
    (
        grp.nullable_below(len) as usize,
        (len / grp.block_size) as usize,
    )
}

/// Whether a group needs every entry below a prefix (none may be null).
fn needs_every_entry(grp: &CacheGroup) -> bool {
    matches!(
        grp.kind,
        GroupKind::FullAttention
            | GroupKind::Mamba {
                mode: MambaMode::All
            }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::geometry::DEFAULT_NULL_BLOCK;

    fn geo(groups: Vec<CacheGroup>) -> Geometry {
        Geometry::new(groups, None, DEFAULT_NULL_BLOCK).expect("geometry")
    }

    #[test]
    fn the_cap_is_the_cached_run_below_the_last_token() {
        let g = geo(vec![CacheGroup::full_attention(16)]);
        let hashes = vec![(1..=10).collect::<Vec<BlockHash>>()];
        // Blocks 1..=6 cached: 96 tokens, below the 159-token prompt's last token.
        assert_eq!(prefix_cap(&g, 160, &hashes, |h| h <= 6), 96);
        // All cached: at most the last S boundary below the last token.
        assert_eq!(prefix_cap(&g, 160, &hashes, |_| true), 144);
        assert_eq!(prefix_cap(&g, 160, &hashes, |_| false), 0);
        // A sliding-window group does not cap.
        let swa = geo(vec![CacheGroup::sliding_window(16, 32)]);
        assert_eq!(prefix_cap(&swa, 160, &hashes, |_| false), 144);
    }

    #[test]
    fn candidates_go_down_by_s_at_most_max_probes_times() {
        let g = geo(vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(32, MambaMode::Align),
        ]);
        assert_eq!(g.scheduler_block_size(), 32);
        // Group 1's hashes are 100 + its entry's index; every state cached.
        let hashes = vec![(0..40).collect::<Vec<BlockHash>>(), (100..120).collect()];
        let c: Vec<u64> = prefix_candidates(&g, 100, &hashes, |_| true).collect();
        assert_eq!(c, [96, 64, 32]);
        let long: Vec<u64> = prefix_candidates(&g, 32 * 20, &hashes, |_| true).collect();
        assert_eq!(long.len(), MAX_PREFIX_PROBES);
        assert_eq!(long.first(), Some(&640));
        assert_eq!(long.last(), Some(&(640 - 7 * 32)));
        assert_eq!(prefix_candidates(&g, 31, &hashes, |_| true).count(), 0);
        // Only the states after 64 and 512 tokens cached (entries 1 and 15): the probes go
        // to those lengths, however far below the cap.
        let some: Vec<u64> =
            prefix_candidates(&g, 32 * 20, &hashes, |h| h == 101 || h == 115).collect();
        assert_eq!(some, [512, 64]);
    }

    #[test]
    fn entries_are_nullable_below_the_window() {
        let swa = CacheGroup::sliding_window(16, 32);
        let (nullable, n) = prefix_entries(&swa, 128);
        assert_eq!(n, 8);
        assert!(nullable > 0 && nullable < n, "{nullable}");
        assert_eq!(prefix_entries(&CacheGroup::full_attention(16), 128), (0, 8));
    }
}
