//! The resumable boundary of mode `safe` (`docs/rules.md#the-resumable-boundary`): where a
//! request with a new hit can restart so that every cache group has the state it needs.

use crate::rules::geometry::{CacheGroup, Geometry, GroupKind};
use crate::rules::recovery::trace::{Candidates, Event, ShortTable, Trace, Unusable};
use crate::rules::recovery::{scan_len, Hit, HitOwner, RequestView};

/// The resumable boundary (`docs/rules.md#the-resumable-boundary`): the largest multiple `c` of
/// `S` with `c ≤ earliest_new` from which every group can resume, else 0.
///
/// Per group, resuming at `c > 0` needs a range of entries `[lo, hi)` to be real (present and
/// non-null) and not a new hit of this request (another request's block counts as valid: the
/// request waits for it):
/// `full_attention` `[0, c/b)`; `sliding_window` the entries holding tokens
/// `[max(0, c − window + 1), c)`; `mamba` `[c/b − 1, c/b)`. Every kind needs `hi = c/b ≤ len`
/// (except a one-token window, which needs nothing), so candidates start at
/// `min(earliest_new, min_g len_g · b_g)` rounded down to `S`, and there are at most
/// `min_g len_g + 1` of them.
///
/// Cost: one pass over the hits and over each group's entries below the first candidate, to
/// build per-group prefix counts of unusable entries; then `O(groups)` per candidate. In all
/// `O(hits + Σ_g len_g)`: linear in the request's size, however many groups there are.
///
/// With a tracing sink, every group that rejects a candidate reports the first unusable entry
/// it needs ([`Event::Rejected`]).
pub(super) fn resumable_boundary<O: Clone, T: Trace<O>>(
    geo: &Geometry,
    req: RequestView<'_>,
    hits: &[Hit],
    owners: &[HitOwner<O>],
    earliest_new: u64,
    trace: &mut T,
) -> u64 {
    let groups = geo.groups();
    // Every kind needs entry `c/b − 1` at `c > 0`, except a sliding window of one token,
    // whose range `[c, c)` is empty.
    let mut cap = earliest_new;
    let mut short_table = None;
    for (g, (group, table)) in groups.iter().zip(req.block_tables).enumerate() {
        if group.kind == (GroupKind::SlidingWindow { window: 1 }) {
            continue;
        }
        let held = (table.len() as u64).saturating_mul(group.block_size);
        if held < cap {
            cap = held;
            short_table = Some(ShortTable {
                group: g,
                len: table.len(),
            });
        }
    }
    let start = geo.round_down_to_s(cap);
    if T::ON {
        let short_table = short_table.filter(|_| start < geo.round_down_to_s(earliest_new));
        trace.event(Event::Candidates(Candidates {
            earliest_new,
            start,
            short_table,
        }));
    }
    if start == 0 {
        return 0;
    }

    // One buffer for every group: group g's prefix counts occupy `offsets[g] ..= offsets[g] +
    // n_g`, where `n_g = min(start / b_g, len_g)` and `count[offsets[g] + i]` is the number of
    // unusable entries among `table[g][..i]`.
    let null = geo.null_block();
    let mut offsets = Vec::with_capacity(groups.len());
    let mut total = 0usize;
    for (group, table) in groups.iter().zip(req.block_tables) {
        offsets.push(total);
        total = total.saturating_add(scan_len(start / group.block_size, table.len()) + 1);
    }
    let mut count = vec![0usize; total];
    // Flags first (`count[offset + 1 + i] = 1` when entry i is unusable), then prefix sums.
    for ((group, table), &off) in groups.iter().zip(req.block_tables).zip(&offsets) {
        let n = scan_len(start / group.block_size, table.len());
        for (slot, &id) in count[off + 1..=off + n].iter_mut().zip(&table[..n]) {
            *slot = usize::from(id == null);
        }
    }
    for (h, o) in hits.iter().zip(owners) {
        let g = h.group as usize;
        let (Some(group), Some(table), Some(&off)) =
            (groups.get(g), req.block_tables.get(g), offsets.get(g))
        else {
            continue;
        };
        let n = scan_len(start / group.block_size, table.len());
        if matches!(o, HitOwner::Mine) && (h.index as usize) < n {
            count[off + 1 + h.index as usize] = 1;
        }
    }
    for ((group, table), &off) in groups.iter().zip(req.block_tables).zip(&offsets) {
        let n = scan_len(start / group.block_size, table.len());
        for i in off + 1..=off + n {
            count[i] += count[i - 1];
        }
    }

    let s = geo.scheduler_block_size();
    let mut c = start;
    while c > 0 {
        let mut ok = true;
        for (g, ((group, table), &off)) in groups
            .iter()
            .zip(req.block_tables)
            .zip(&offsets)
            .enumerate()
        {
            let n = scan_len(start / group.block_size, table.len());
            // `c` is a multiple of `S`, so of `b`: a range always exists; `hi ≤ n` by
            // construction of `start`, except for a one-token window.
            let Some((lo, hi)) = needed_entries(group, c).filter(|(lo, hi)| lo < hi) else {
                continue;
            };
            let (lo, hi) = (lo as usize, hi as usize);
            let prefix = &count[off..=off + n];
            if hi < prefix.len() && prefix[hi] == prefix[lo] {
                continue;
            }
            ok = false;
            if !T::ON {
                break;
            }
            let (index, why) = first_unusable(prefix, lo, hi, table, null);
            trace.event(Event::Rejected {
                candidate: c,
                group: g,
                index,
                why,
            });
        }
        if ok {
            return c;
        }
        c -= s;
    }
    0
}

/// Whether every group can resume at the pre-step length `p` of a request with only old hits
/// (`docs/rules.md#only-old-hits-in-mode-safe`): the entries holding tokens below `p` that a
/// group needs are real (present and non-null) — `full_attention` every entry below
/// `ceil(p / b)`, `sliding_window` those holding tokens `[max(0, p − window + 1), p)` — and a
/// `mamba` group holds the state after `p` tokens: `p` is a multiple of `b` and entry
/// `p / b − 1` is real (the state of a length inside a block is the one a step advances in
/// place, so a discarded step leaves none). Old hits count as real: the request waits for
/// their owners. Cost: one pass over the entries below `p`.
pub(super) fn resumable_at_pre_step(geo: &Geometry, req: RequestView<'_>, p: u64) -> bool {
    if p == 0 {
        return true;
    }
    let null = geo.null_block();
    geo.groups()
        .iter()
        .zip(req.block_tables)
        .all(|(group, table)| match needed_entries(group, p) {
            None => false,
            Some((lo, hi)) if lo >= hi => true,
            Some((lo, hi)) => {
                let (Ok(lo), Ok(hi)) = (usize::try_from(lo), usize::try_from(hi)) else {
                    return false;
                };
                table
                    .get(lo..hi)
                    .is_some_and(|entries| entries.iter().all(|&id| id != null))
            }
        })
}

/// The entries `[lo, hi)` a group needs real to resume at `c > 0`
/// (`docs/rules.md#the-resumable-boundary`): `full_attention` every entry holding a token
/// below `c`, `sliding_window` those holding tokens `[max(0, c − window + 1), c)`, `mamba`
/// entry `c / b − 1`, the state after `c` tokens — `None` when `c` is not a multiple of `b`,
/// whose state no entry holds. A one-token window needs no entry (its range is empty), at a
/// block boundary or inside a block.
fn needed_entries(group: &CacheGroup, c: u64) -> Option<(u64, u64)> {
    let b = group.block_size;
    let hi = c.div_ceil(b);
    let lo = match group.kind {
        GroupKind::FullAttention => 0,
        // Planted bug (scripts/plants.sh): a one-token window inside a block needs the
        // entry holding the block (the token range's start rounded down, its end up).
        GroupKind::SlidingWindow { window }
            if window <= 1 && !planted!("window-one-needs-entry") =>
        {
            hi
        }
        GroupKind::SlidingWindow { window } => c.saturating_sub(window - 1) / b,
        GroupKind::Mamba { .. } if c % b != 0 => return None,
        GroupKind::Mamba { .. } => hi - 1,
    };
    Some((lo, hi))
}

/// The first unusable entry in `[lo, hi)` of a group whose `prefix` counts (over its first
/// `prefix.len() − 1` entries) show one, for a rejection's reason: found by binary search on
/// the counts. An unusable entry that is not null is one of the request's own new hits.
fn first_unusable(
    prefix: &[usize],
    lo: usize,
    hi: usize,
    table: &[u64],
    null: u64,
) -> (u64, Unusable) {
    let n = prefix.len().saturating_sub(1);
    let top = hi.min(n);
    if lo < top && prefix[top] > prefix[lo] {
        let base = prefix[lo];
        // The least j in (lo, top] with prefix[j] > prefix[lo]; entry j − 1 is unusable.
        let j = lo + 1 + prefix[lo + 1..=top].partition_point(|&x| x == base);
        let index = j - 1;
        let why = match table.get(index) {
            Some(&id) if id != null => Unusable::OwnNewHit(id),
            _ => Unusable::Null,
        };
        return (index as u64, why);
    }
    // Nothing unusable among the counted entries: the table ends before `hi`.
    (top.max(lo) as u64, Unusable::Missing)
}
