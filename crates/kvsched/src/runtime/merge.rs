//! The plan's list in canonical order: the shards' scheduled requests merged by their
//! [`RequestOrder`] keys, each entry moved as few times as the input allows, in place.

use std::ptr;

use crate::runtime::order::RequestOrder;
use crate::runtime::shard::ScheduledRequest;

/// Room for the first of two runs while they are merged, kept from step to step so that a
/// merge allocates nothing once it has grown. It never holds an entry between calls.
#[derive(Debug, Default)]
pub(super) struct MergeScratch(Vec<ScheduledRequest>);

/// `list` in canonical order. Each shard's part is mostly in order already, but the parts
/// interleave; a comparison sort of the entries themselves would move each (about 80 bytes)
/// about log n times. A list already in order is returned as it is; two ordered runs (the
/// two shards' lists) are merged in place, with the first run moved to `scratch` and back;
/// otherwise their keys are sorted and each entry moved three times.
pub(super) fn in_request_order(
    mut list: Vec<ScheduledRequest>,
    scratch: &mut MergeScratch,
) -> Vec<ScheduledRequest> {
    let Some(cut) = list.windows(2).position(|w| w[0].key > w[1].key) else {
        return list; // already in order
    };
    let cut = cut + 1;
    if list[cut..].is_sorted_by_key(|s| s.key) {
        merge_runs(&mut list, cut, &mut scratch.0);
        return list;
    }
    let mut order: Vec<(RequestOrder, usize)> =
        list.iter().enumerate().map(|(i, s)| (s.key, i)).collect();
    // Unstable: keys are unique (one entry a request).
    order.sort_unstable();
    let mut slots: Vec<Option<ScheduledRequest>> = list.into_iter().map(Some).collect();
    order
        .iter()
        .filter_map(|&(_, i)| slots.get_mut(i).and_then(Option::take))
        .collect()
}

/// Merges `list[..cut]` and `list[cut..]`, each in key order, into one run in place (stable:
/// the first run's entry first on equal keys). The first run is moved to `scratch`'s spare
/// room; each entry is then moved once into its place, front to back.
fn merge_runs(list: &mut Vec<ScheduledRequest>, cut: usize, scratch: &mut Vec<ScheduledRequest>) {
    let n = list.len();
    debug_assert!(cut <= n && scratch.is_empty());
    scratch.clear();
    scratch.reserve(cut);
    let base = list.as_mut_ptr();
    let first = scratch.as_mut_ptr();
    // SAFETY: `list` is emptied first, so it owns no entry while they are moved: a panic
    // (there is none to expect: key comparisons and pointer copies) would leak them, never
    // drop one twice; `scratch`'s length stays 0, so it never owns one. `first` has room
    // for `cut` entries (reserved above) and does not overlap `list`. The loop keeps
    // `k = i + (j - cut)`: while both runs have entries left, `i < cut`, so `k < j` — the
    // slot written is one whose entry was already moved out (to `first`, or earlier in the
    // second run), and never the one read. When the second run ends (`j = n`), the rest of
    // the first fills `k..n` exactly; when the first ends, the rest of the second is already
    // at `k = j..n`. Every entry is in `list[..n]` exactly once when its length is restored.
    unsafe {
        list.set_len(0);
        ptr::copy_nonoverlapping(base, first, cut);
        let (mut i, mut j, mut k) = (0, cut, 0);
        while i < cut && j < n {
            // Planted bug (scripts/plants.sh): the larger key is taken first.
            let second_first = if planted!("merge-larger-first") {
                (*base.add(j)).key > (*first.add(i)).key
            } else {
                (*base.add(j)).key < (*first.add(i)).key
            };
            if second_first {
                ptr::copy_nonoverlapping(base.add(j), base.add(k), 1);
                j += 1;
            } else {
                ptr::copy_nonoverlapping(first.add(i), base.add(k), 1);
                i += 1;
            }
            k += 1;
        }
        ptr::copy_nonoverlapping(first.add(i), base.add(k), cut - i);
        list.set_len(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::claim::RequestKey;
    use std::sync::Arc as StdArc;

    fn entry(priority: i16, seq: u64) -> ScheduledRequest {
        ScheduledRequest {
            id: format!("r{seq}").into(),
            key: RequestKey::new(true, priority, seq).into(),
            num_computed_tokens: seq,
            num_tokens: 1,
            samples: false,
            block_tables: StdArc::from(Vec::new()),
            sync_load: None,
            first: false,
        }
    }

    #[test]
    fn shard_lists_merge_into_canonical_order_with_every_entry_once() {
        // Two shards' lists, each in order, interleaving; a priority that sorts first.
        let list: Vec<_> = [(0, 2), (0, 5), (0, 9), (-1, 7), (0, 1), (0, 4), (0, 8)]
            .into_iter()
            .map(|(p, s)| entry(p, s))
            .collect();
        let mut bufs = MergeScratch::default();
        let merged = in_request_order(list, &mut bufs);
        assert!(
            bufs.0.is_empty() && bufs.0.capacity() >= 3,
            "room kept, no entry"
        );
        let order: Vec<(i16, u64)> = merged
            .iter()
            .map(|s| (s.key.priority(), s.key.sequence()))
            .collect();
        assert_eq!(
            order,
            vec![(-1, 7), (0, 1), (0, 2), (0, 4), (0, 5), (0, 8), (0, 9)]
        );
        // Each entry travelled with its own fields.
        assert!(merged
            .iter()
            .all(|s| s.num_computed_tokens == s.key.sequence()
                && *s.id == *format!("r{}", s.key.sequence())));
        let sorted = in_request_order(merged, &mut bufs);
        assert_eq!(sorted.len(), 7);
        // Three runs: the general path.
        let list: Vec<_> = [(0, 5), (0, 9), (0, 2), (0, 7), (0, 1), (0, 4)]
            .into_iter()
            .map(|(p, s)| entry(p, s))
            .collect();
        let seqs: Vec<u64> = in_request_order(list, &mut bufs)
            .iter()
            .map(|s| s.key.sequence())
            .collect();
        assert_eq!(seqs, [1, 2, 4, 5, 7, 9]);
    }

    proptest::proptest! {
        /// Two ordered runs of any lengths, interleaving anyhow, with equal priorities or
        /// not: the merge gives every entry once, with its own fields, in key order, and the
        /// scratch room owns nothing afterwards — over many calls with one scratch.
        #[test]
        fn two_runs_merge_in_place(
            keys in proptest::collection::vec((-2i16..2, 0u64..1_000), 2..200),
            split in proptest::collection::vec(proptest::bool::ANY, 200),
            rounds in 1usize..4,
        ) {
            let mut scratch = MergeScratch::default();
            for round in 0..rounds {
                let mut keys = keys.clone();
                keys.sort_unstable_by_key(|&(p, s)| (s, p));
                keys.dedup_by_key(|k| k.1);
                let (mut a, mut b): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
                for (i, &(p, s)) in keys.iter().enumerate() {
                    if split[(i + round) % split.len()] { a.push(entry(p, s)) } else { b.push(entry(p, s)) }
                }
                a.sort_by_key(|e| e.key);
                b.sort_by_key(|e| e.key);
                let mut list = a;
                list.extend(b);
                let mut want: Vec<(i16, u64)> =
                    keys.iter().map(|&(p, s)| (p, s)).collect();
                want.sort_by_key(|&(p, s)| entry(p, s).key);
                let merged = in_request_order(list, &mut scratch);
                let got: Vec<(i16, u64)> = merged
                    .iter()
                    .map(|e| (e.key.priority(), e.key.sequence()))
                    .collect();
                proptest::prop_assert_eq!(got, want);
                for e in &merged {
                    let id = format!("r{}", e.key.sequence());
                    proptest::prop_assert_eq!(&*e.id, id.as_str());
                    proptest::prop_assert_eq!(e.num_computed_tokens, e.key.sequence());
                }
                proptest::prop_assert!(scratch.0.is_empty());
            }
        }
    }
}
