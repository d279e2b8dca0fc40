//! The plan's list in canonical order: the shards' scheduled requests merged by their
//! [`RequestOrder`] keys, each entry moved as few times as the input allows.

use crate::runtime::order::RequestOrder;
use crate::runtime::shard::ScheduledRequest;

/// `list` in canonical order. Each shard's part is mostly in order already, but the parts
/// interleave; a comparison sort of the entries themselves would move each (about 80 bytes)
/// about log n times. A list already in order is returned as it is; two ordered runs (the
/// two shards' lists) are merged; otherwise their keys are sorted and each entry moved three
/// times.
pub(super) fn in_request_order(mut list: Vec<ScheduledRequest>) -> Vec<ScheduledRequest> {
    let Some(cut) = list.windows(2).position(|w| w[0].key > w[1].key) else {
        return list; // already in order
    };
    let cut = cut + 1;
    if list[cut..].is_sorted_by_key(|s| s.key) {
        // Two ordered runs (two shards' lists, one appended to the other): merged with one
        // move of each entry of the first run and two of the second, no sort.
        let second = list.split_off(cut);
        let mut merged = Vec::with_capacity(list.len() + second.len());
        let (mut a, mut b) = (list.into_iter().peekable(), second.into_iter().peekable());
        while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
            let next = if x.key < y.key { a.next() } else { b.next() };
            merged.extend(next);
        }
        merged.extend(a);
        merged.extend(b);
        return merged;
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
        let merged = in_request_order(list);
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
        let sorted = in_request_order(merged);
        assert_eq!(sorted.len(), 7);
        // Three runs: the general path.
        let list: Vec<_> = [(0, 5), (0, 9), (0, 2), (0, 7), (0, 1), (0, 4)]
            .into_iter()
            .map(|(p, s)| entry(p, s))
            .collect();
        let seqs: Vec<u64> = in_request_order(list)
            .iter()
            .map(|s| s.key.sequence())
            .collect();
        assert_eq!(seqs, [1, 2, 4, 5, 7, 9]);
    }
}
