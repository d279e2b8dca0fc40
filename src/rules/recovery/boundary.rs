//! The resumable boundary of mode `safe` (`docs/rules.md#the-resumable-boundary`): where a
//! request with a new hit can restart so that every cache group has the state it needs.

use crate::rules::geometry::{Geometry, GroupKind};
use crate::rules::recovery::{scan_len, Hit, HitOwner, RequestView};

/// The resumable boundary (`docs/rules.md#the-resumable-boundary`): the largest multiple `c` of
/// `S` with `c ≤ earliest_new` from which every group can resume, else 0.
///
/// Per group, resuming at `c > 0` needs a range of entries `[lo, hi)` to be real (present and
/// non-null) and not a new hit of this request (another request's block counts as valid: the
/// request waits for it):
/// `full_attention` `[0, c/b)`; `sliding_window` the entries holding tokens
/// `[max(0, c − window + 1), c)`; `mamba` `[c/b − 1, c/b)`. Every kind needs `hi = c/b ≤ len`,
/// so candidates start at `min(earliest_new, min_g len_g · b_g)` and there are at most
/// `min_g len_g + 1` of them; each is checked in `O(groups)` with per-group prefix counts of
/// unusable entries.
pub(super) fn resumable_boundary<O>(
    geo: &Geometry,
    req: RequestView<'_>,
    hits: &[Hit],
    owners: &[HitOwner<O>],
    earliest_new: u64,
) -> u64 {
    let groups = geo.groups();
    // Every kind needs entry `c/b − 1` at `c > 0`, except a sliding window of one token,
    // whose range `[c, c)` is empty.
    let cap = groups
        .iter()
        .zip(req.block_tables)
        .filter(|(g, _)| g.kind != GroupKind::SlidingWindow { window: 1 })
        .map(|(g, t)| (t.len() as u64).saturating_mul(g.block_size))
        .fold(earliest_new, u64::min);
    let start = geo.round_down_to_s(cap);
    if start == 0 {
        return 0;
    }
    // bad[g][i] = number of unusable entries among table[g][..i], for i ≤ start / b_g
    // (≤ len, see above).
    let null = geo.null_block();
    let mut bad: Vec<Vec<u32>> = Vec::with_capacity(groups.len());
    for (g, (group, table)) in groups.iter().zip(req.block_tables).enumerate() {
        let n = scan_len(start / group.block_size, table.len());
        let mut unusable = vec![false; n];
        for (i, &id) in table[..n].iter().enumerate() {
            unusable[i] = id == null;
        }
        for (h, o) in hits.iter().zip(owners) {
            if h.group as usize == g && matches!(o, HitOwner::Mine) && (h.index as usize) < n {
                unusable[h.index as usize] = true;
            }
        }
        let mut prefix = Vec::with_capacity(n + 1);
        let mut acc = 0u32;
        prefix.push(0);
        for u in unusable {
            acc += u32::from(u);
            prefix.push(acc);
        }
        bad.push(prefix);
    }
    let s = geo.scheduler_block_size();
    let mut c = start;
    while c > 0 {
        let ok = groups.iter().zip(&bad).all(|(group, prefix)| {
            let b = group.block_size;
            let hi = c / b; // ≤ prefix.len() - 1 by construction of `start`
            let lo = match group.kind {
                GroupKind::FullAttention => 0,
                GroupKind::SlidingWindow { window } => c.saturating_sub(window - 1) / b,
                GroupKind::Mamba { .. } => hi - 1,
            };
            let (lo, hi) = (lo as usize, hi as usize);
            lo >= hi || (hi < prefix.len() && prefix[hi] == prefix[lo])
        });
        if ok {
            return c;
        }
        c -= s;
    }
    0
}
