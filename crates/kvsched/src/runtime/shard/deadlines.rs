//! The deadlines of a shard's in-flight asynchronous loads, earliest first.
//!
//! A load's deadline is its dispatch time plus a duration (the request's own `load_deadline`
//! or the step's), so while that duration holds, deadlines arrive in order: such a push is
//! an append to a queue whose front is the earliest. A deadline earlier than the queue's last
//! (a shorter duration than the one before) goes to a heap instead, and taking the due
//! entries takes the earlier of the two fronts: O(1) a push and a take in the usual case,
//! O(log n) otherwise.
//!
//! An entry stays after its load completes (the step taking the completion does not look for
//! it) and is skipped when it comes due. So that a long deadline does not keep an entry for
//! every load ever dispatched, the entries of loads no longer in flight are dropped whenever
//! the entries have doubled since that was last done: amortised O(1) a push, and at most
//! about twice the loads in flight (or [`MIN_COMPACT`]) entries.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

/// Below this many entries they are never compacted.
const MIN_COMPACT: usize = 1024;

/// One entry: the deadline, and the load it belongs to (request sequence number, attempt).
type Entry = (Instant, u64, u32);

/// In-flight loads' deadlines, earliest first.
#[derive(Debug)]
pub(super) struct Deadlines {
    /// Entries pushed in deadline order.
    in_order: VecDeque<Entry>,
    /// Entries earlier than the last of `in_order` when pushed.
    out_of_order: BinaryHeap<Reverse<Entry>>,
    /// Compact when the entries grow past this.
    compact_at: usize,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            in_order: VecDeque::new(),
            out_of_order: BinaryHeap::new(),
            compact_at: MIN_COMPACT,
        }
    }
}

impl Deadlines {
    /// Adds the deadline `at` of attempt `attempt` of request `seq`'s load. `in_flight(seq,
    /// attempt)` says whether a load still waits for its deadline: when the entries have
    /// doubled since they were last compacted, the entries of the others are dropped first.
    pub(super) fn push(
        &mut self,
        at: Instant,
        seq: u64,
        attempt: u32,
        in_flight: impl Fn(u64, u32) -> bool,
    ) {
        if self.len() >= self.compact_at {
            self.in_order.retain(|&(_, s, a)| in_flight(s, a));
            self.out_of_order
                .retain(|&Reverse((_, s, a))| in_flight(s, a));
            self.compact_at = (2 * self.len()).max(MIN_COMPACT);
        }
        match self.in_order.back() {
            Some(&(last, _, _)) if last > at => self.out_of_order.push(Reverse((at, seq, attempt))),
            _ => self.in_order.push_back((at, seq, attempt)),
        }
    }

    /// Takes the earliest entry if its deadline is at or before `now`: `(seq, attempt)`.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(u64, u32)> {
        let front = self.in_order.front().map(|e| e.0);
        let top = self.out_of_order.peek().map(|Reverse(e)| e.0);
        let (at, seq, attempt) = match (front, top) {
            (Some(f), Some(t)) if t < f => self.due_out_of_order(t, now)?,
            (Some(f), _) if f <= now => self.in_order.pop_front()?,
            (None, Some(t)) => self.due_out_of_order(t, now)?,
            _ => return None,
        };
        debug_assert!(at <= now);
        Some((seq, attempt))
    }

    /// The heap's earliest entry, whose deadline is `at`, if it is due.
    fn due_out_of_order(&mut self, at: Instant, now: Instant) -> Option<Entry> {
        if at > now {
            return None;
        }
        self.out_of_order.pop().map(|Reverse(e)| e)
    }

    /// The earliest deadline of a load still in flight (`in_flight(seq, attempt)`), the
    /// entries before it dropped: each entry is dropped once, so amortised O(1) a call.
    pub(super) fn next(&mut self, in_flight: impl Fn(u64, u32) -> bool) -> Option<Instant> {
        loop {
            let front = self.in_order.front().copied();
            let top = self.out_of_order.peek().map(|Reverse(e)| *e);
            let (from_heap, (at, seq, attempt)) = match (front, top) {
                (Some(f), Some(t)) if t.0 < f.0 => (true, t),
                (Some(f), _) => (false, f),
                (None, Some(t)) => (true, t),
                (None, None) => return None,
            };
            if in_flight(seq, attempt) {
                return Some(at);
            }
            if from_heap {
                self.out_of_order.pop();
            } else {
                self.in_order.pop_front();
            }
        }
    }

    /// Drops every entry.
    pub(super) fn clear(&mut self) {
        self.in_order.clear();
        self.out_of_order.clear();
        self.compact_at = MIN_COMPACT;
    }

    /// Entries held.
    pub(super) fn len(&self) -> usize {
        self.in_order.len() + self.out_of_order.len()
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn due_entries_come_out_earliest_first_whatever_the_push_order() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut d = Deadlines::default();
        let all = |_, _| true;
        // In order, then a shortened deadline, then equal deadlines (kept in push order).
        for (ms, seq) in [(10, 1), (20, 2), (30, 3), (15, 4), (5, 5), (20, 6), (40, 7)] {
            d.push(at(ms), seq, 0, all);
        }
        assert_eq!(d.pop_due(at(4)), None);
        let mut out = Vec::new();
        while let Some((seq, _)) = d.pop_due(at(30)) {
            out.push(seq);
        }
        assert_eq!(out, [5, 1, 4, 2, 6, 3]);
        assert_eq!(d.len(), 1);
        assert_eq!(d.pop_due(at(40)), Some((7, 0)));
        assert_eq!(d.pop_due(at(1000)), None);
    }

    #[test]
    fn entries_of_loads_no_longer_in_flight_do_not_pile_up() {
        let t0 = Instant::now();
        // A century's deadline: nothing ever comes due. Loads 0..100_000, each in flight
        // until the next 10 have been dispatched.
        let far = t0 + Duration::from_secs(100 * 365 * 86_400);
        let mut d = Deadlines::default();
        let mut most = 0;
        for seq in 0..100_000u64 {
            d.push(far, seq, 1, |s, a| a == 1 && s + 10 > seq);
            most = most.max(d.len());
        }
        assert!(most <= 2 * MIN_COMPACT, "{most} entries");
        // The loads still in flight keep theirs, in order.
        assert!(d.len() >= 10);
        let mut last = None;
        while let Some((seq, _)) = d.pop_due(far) {
            assert!(last.is_none_or(|l| l < seq));
            last = Some(seq);
        }
        assert_eq!(last, Some(99_999));
    }

    #[test]
    fn entries_are_dropped_after_more_loads_than_min_compact_were_in_flight() {
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(100 * 365 * 86_400);
        let mut d = Deadlines::default();
        // Three times MIN_COMPACT loads in flight at once, then none of them: attempt 1.
        let wide = 3 * MIN_COMPACT as u64;
        for seq in 0..wide {
            d.push(far, seq, 1, |_, a| a == 1);
        }
        assert_eq!(
            d.len(),
            wide as usize,
            "every load still in flight keeps its entry"
        );
        // Then loads of attempt 2, each in flight until the next 10 have been dispatched.
        for seq in 0..20 * MIN_COMPACT as u64 {
            d.push(far, seq, 2, |s, a| a == 2 && s + 10 > seq);
        }
        assert!(d.len() <= 2 * MIN_COMPACT, "{} entries", d.len());
    }

    #[test]
    fn a_push_asks_whether_loads_are_in_flight_amortised_once() {
        let far = Instant::now() + Duration::from_secs(100 * 365 * 86_400);
        let mut d = Deadlines::default();
        let asked = std::cell::Cell::new(0u64);
        // Every load stays in flight: each compaction keeps every entry, so the entries
        // must double before the next one. Compacting more often makes a dispatch cost
        // O(loads in flight) with many loads in flight.
        let pushes = 8 * MIN_COMPACT as u64;
        for seq in 0..pushes {
            d.push(far, seq, 0, |_, _| {
                asked.set(asked.get() + 1);
                true
            });
        }
        assert_eq!(d.len(), pushes as usize);
        assert!(asked.get() <= 2 * pushes, "asked {} times", asked.get());
    }

    #[test]
    fn an_out_of_order_entry_comes_due_after_a_compaction_empties_the_queue() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut d = Deadlines::default();
        // Loads 0.. with a long deadline, in the queue, until one short of compacting.
        for seq in 0..MIN_COMPACT as u64 - 1 {
            d.push(at(60_000), seq, 0, |_, _| true);
        }
        // Load 5000's shorter deadline goes to the heap.
        d.push(at(10), 5000, 0, |_, _| true);
        // Loads 0.. have completed: the compaction before load 6000's push drops their
        // entries, the queue is empty, and load 6000's entry is its only one. Once that is
        // taken, load 5000's must still come due, though no later load is dispatched.
        d.push(at(5), 6000, 0, |s, _| s >= 5000);
        assert_eq!(d.len(), 2);
        assert_eq!(d.pop_due(at(20)), Some((6000, 0)));
        assert_eq!(
            d.pop_due(at(20)),
            Some((5000, 0)),
            "with only the heap left"
        );
        assert_eq!(d.pop_due(at(20)), None);
    }

    #[test]
    fn a_deadline_is_due_at_its_instant_in_the_queue_and_in_the_heap() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut d = Deadlines::default();
        let all = |_, _| true;
        d.push(at(20), 1, 0, all);
        // The second, earlier than the queue's back, goes to the heap. Each comes due at or
        // before `now`, from either side.
        d.push(at(10), 2, 0, all);
        assert_eq!(d.pop_due(at(9)), None);
        assert_eq!(d.pop_due(at(10)), Some((2, 0)));
        assert_eq!(d.pop_due(at(10)), None);
        assert_eq!(d.pop_due(at(20)), Some((1, 0)));
    }

    #[test]
    fn next_is_the_earliest_deadline_of_a_load_in_flight_queue_or_heap() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut d = Deadlines::default();
        let all = |_, _| true;
        // An idle engine waits until this instant (`wait_for_work`): a later one would sleep
        // past a hung load's deadline.
        // The queue holds 10 (load 1) and 1000 (load 3); the heap 500 (load 2) and 5 (load 4).
        for (ms, seq) in [(10, 1), (1000, 3), (500, 2), (5, 4)] {
            d.push(at(ms), seq, 0, all);
        }
        assert_eq!(
            d.next(all),
            Some(at(5)),
            "the heap's top, before the queue's front"
        );
        // As loads complete, their entries are dropped from whichever side is earlier.
        let mut done = Vec::new();
        for (seq, then) in [(4, Some(10)), (1, Some(500)), (2, Some(1000)), (3, None)] {
            done.push(seq);
            assert_eq!(
                d.next(|s, _| !done.contains(&s)),
                then.map(at),
                "{done:?} done"
            );
        }
        assert_eq!(d.len(), 0);
    }
}
