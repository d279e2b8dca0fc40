//! Prefix quarantine: a prefix whose external loads keep failing, across requests, gets no
//! external load for a while, so a broken store entry is not retried in a loop.
//!
//! Prefixes are identified by a 64-bit key (the chained hash of the prompt up to the end of
//! the load). The table is sharded behind short `sync::Mutex` locks taken only when a load
//! fails or succeeds and at admission of a request that would load. It is bounded
//! (4,096 entries per shard), so prefixes that fail once and never come back do not
//! accumulate.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::sync::{AtomicUsize, Mutex, Ordering};

#[cfg(not(kvsched_loom))]
const SHARDS: usize = 16;
#[cfg(kvsched_loom)]
const SHARDS: usize = 2;

/// Entries one shard keeps at most. A prefix that failed once and is never loaded again, or
/// whose quarantine ran out unchecked, would otherwise stay for the process's life: when a
/// new prefix fails in a full shard, the entries not in force (a streak without a
/// quarantine, or a quarantine that ended) are dropped first.
#[cfg(not(kvsched_loom))]
const MAX_SHARD_ENTRIES: usize = 4096;
#[cfg(kvsched_loom)]
const MAX_SHARD_ENTRIES: usize = 4;

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    consecutive_failures: u32,
    until: Option<Instant>,
}

/// Failure counts and quarantine deadlines per prefix.
#[derive(Debug)]
pub struct Quarantine {
    shards: Vec<Mutex<FxHashMap<u64, Entry>>>,
    /// Entries with a deadline (in force, or ended and not yet met): while there is none,
    /// [`is_quarantined`](Self::is_quarantined) takes no lock. Changed only under the lock of
    /// the entry's shard.
    with_deadline: AtomicUsize,
}

impl Default for Quarantine {
    fn default() -> Self {
        Quarantine {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
            with_deadline: AtomicUsize::new(0),
        }
    }
}

impl Quarantine {
    fn shard(&self, key: u64) -> &Mutex<FxHashMap<u64, Entry>> {
        &self.shards[(key.rotate_left(7) as usize) % self.shards.len()]
    }

    /// Records a failed load of `key`; returns true when this failure puts the prefix into
    /// quarantine (`after` consecutive failures, `0` disables quarantine) until `now + for_`.
    ///
    /// The table is bounded (4,096 entries per shard): a new prefix failing while its
    /// shard is full of quarantines in force is not counted.
    pub fn record_failure(&self, key: u64, now: Instant, after: u32, for_: Duration) -> bool {
        if after == 0 {
            return false;
        }
        let mut map = self.shard(key).lock();
        if map.len() >= MAX_SHARD_ENTRIES && !map.contains_key(&key) {
            let mut ended = 0;
            map.retain(|_, e| {
                let in_force = e.until.is_some_and(|until| until > now);
                ended += usize::from(!in_force && e.until.is_some());
                in_force
            });
            // Relaxed: a count nothing is ordered by (see `is_quarantined`).
            self.with_deadline.fetch_sub(ended, Ordering::Relaxed);
            if map.len() >= MAX_SHARD_ENTRIES {
                // Every entry is a quarantine in force: this prefix's streak is not counted.
                return false;
            }
        }
        let e = map.entry(key).or_default();
        e.consecutive_failures = e.consecutive_failures.saturating_add(1);
        if e.consecutive_failures >= after {
            e.consecutive_failures = 0;
            // Planted bug (scripts/plants.sh): a new deadline is left uncounted, so a check
            // that finds the count 0 misses the quarantine.
            if e.until.is_none() && !planted!("quarantine-deadline-uncounted") {
                // Relaxed: as above.
                self.with_deadline.fetch_add(1, Ordering::Relaxed);
            }
            // A quarantine past what an Instant can hold lasts a century (no overflow).
            e.until = now
                .checked_add(for_)
                .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
                .or(Some(now));
            return true;
        }
        false
    }

    /// Records a successful load of `key`: its failure streak ends.
    pub fn record_success(&self, key: u64) {
        let mut map = self.shard(key).lock();
        if let Some(e) = map.get_mut(&key) {
            e.consecutive_failures = 0;
            if e.until.is_none() {
                map.remove(&key);
            }
        }
    }

    /// Whether `key` is quarantined at `now` (expired entries are dropped).
    ///
    /// A quarantine recorded before this call (in happens-before order: an earlier step, or
    /// earlier on this thread) is seen; one recorded concurrently may be seen or not, as with
    /// the lock alone.
    pub fn is_quarantined(&self, key: u64, now: Instant) -> bool {
        // Relaxed: the count changes only under a shard's lock, by a thread whose record of
        // the quarantine happens-before this call whenever the caller must see it; a count
        // of 0 then means no entry has a deadline.
        if self.with_deadline.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut map = self.shard(key).lock();
        match map.get(&key).and_then(|e| e.until) {
            Some(until) if until > now => true,
            Some(_) => {
                if let Some(e) = map.get_mut(&key) {
                    e.until = None;
                    // Relaxed: as in `record_failure`.
                    self.with_deadline.fetch_sub(1, Ordering::Relaxed);
                    if e.consecutive_failures == 0 {
                        map.remove(&key);
                    }
                }
                false
            }
            None => false,
        }
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;

    #[test]
    fn quarantine_after_consecutive_failures_and_expiry() {
        let q = Quarantine::default();
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        assert!(!q.record_failure(7, t0, 3, d));
        assert!(!q.record_failure(7, t0, 3, d));
        q.record_success(7); // streak broken
        assert!(!q.record_failure(7, t0, 3, d));
        assert!(!q.record_failure(7, t0, 3, d));
        assert!(q.record_failure(7, t0, 3, d));
        assert!(q.is_quarantined(7, t0 + Duration::from_secs(9)));
        assert!(!q.is_quarantined(8, t0));
        deadlines_counted(&q);
        assert!(!q.is_quarantined(7, t0 + Duration::from_secs(11)));
        deadlines_counted(&q);
        assert!(!q.record_failure(9, t0, 0, d), "0 disables quarantine");
    }

    #[test]
    fn streaks_of_prefixes_sharing_a_shard_are_counted_apart() {
        let q = Quarantine::default();
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        let same: Vec<u64> = (1..)
            .filter(|&key| std::ptr::eq(q.shard(key), &q.shards[0]))
            .take(3)
            .collect();
        // Another prefix's failure in the same (far from full) shard does not end a streak.
        assert!(!q.record_failure(same[0], t0, 2, d));
        assert!(!q.record_failure(same[1], t0, 2, d));
        assert!(!q.record_failure(same[2], t0, 3, d));
        assert!(
            q.record_failure(same[0], t0, 2, d),
            "the second consecutive failure"
        );
        assert!(q.record_failure(same[1], t0, 2, d));
        assert!(q.is_quarantined(same[0], t0) && q.is_quarantined(same[1], t0));
        assert!(!q.is_quarantined(same[2], t0));
        deadlines_counted(&q);
    }

    #[test]
    fn a_quarantine_past_what_an_instant_holds_lasts_a_century() {
        let q = Quarantine::default();
        let t0 = Instant::now();
        assert!(q.record_failure(5, t0, 1, Duration::MAX));
        let years = |n: u64| t0 + Duration::from_secs(n * 365 * 86_400);
        assert!(q.is_quarantined(5, years(50)));
        assert!(!q.is_quarantined(5, years(101)));
    }

    #[test]
    fn a_prefix_quarantined_again_before_its_end_was_met_is_counted_once() {
        let q = Quarantine::default();
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        assert!(q.record_failure(4, t0, 1, d));
        // The quarantine ended unchecked; the prefix fails again and is quarantined anew.
        let later = t0 + Duration::from_secs(20);
        assert!(q.record_failure(4, later, 1, d));
        deadlines_counted(&q);
        assert!(q.is_quarantined(4, later));
        assert!(!q.is_quarantined(4, later + d));
        deadlines_counted(&q);
        assert_eq!(q.with_deadline.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_streak_begun_during_a_quarantine_outlives_its_end() {
        let q = Quarantine::default();
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        assert!(!q.record_failure(6, t0, 2, d));
        assert!(q.record_failure(6, t0, 2, d));
        // A load started before the quarantine fails while it is in force.
        assert!(!q.record_failure(6, t0 + Duration::from_secs(1), 2, d));
        let end = t0 + d + Duration::from_secs(1);
        assert!(!q.is_quarantined(6, end));
        assert!(
            q.record_failure(6, end, 2, d),
            "the streak's second failure"
        );
    }

    fn entries(q: &Quarantine) -> usize {
        q.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// The lock-free count of entries with a deadline is the census's.
    fn deadlines_counted(q: &Quarantine) {
        let census: usize = q
            .shards
            .iter()
            .map(|s| s.lock().values().filter(|e| e.until.is_some()).count())
            .sum();
        assert_eq!(q.with_deadline.load(Ordering::Relaxed), census);
    }

    #[test]
    fn prefixes_that_fail_once_do_not_stay_forever() {
        let q = Quarantine::default();
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        let cap = MAX_SHARD_ENTRIES * SHARDS;
        // Distinct prefixes failing once each, never loaded again.
        for key in 0..4 * cap as u64 {
            assert!(!q.record_failure(key.wrapping_mul(0x9E37_79B9_7F4A_7C15), t0, 3, d));
        }
        assert!(entries(&q) <= cap, "{} entries", entries(&q));
        // A quarantine in force survives the new prefixes' failures.
        assert!(!q.record_failure(1, t0, 2, d));
        assert!(q.record_failure(1, t0, 2, d));
        for key in 0..4 * cap as u64 {
            q.record_failure(key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 7, t0, 3, d);
        }
        assert!(entries(&q) <= cap);
        deadlines_counted(&q);
        assert!(q.is_quarantined(1, t0 + Duration::from_secs(1)));
        // A shard full of quarantines in force counts no new prefix, and keeps its own.
        let full = Quarantine::default();
        let one_shard: Vec<u64> = (1..)
            .filter(|&key| std::ptr::eq(full.shard(key), &full.shards[0]))
            .take(2 * MAX_SHARD_ENTRIES)
            .collect();
        let quarantined = one_shard
            .iter()
            .filter(|&&key| full.record_failure(key, t0, 1, d))
            .count();
        assert_eq!(entries(&full), MAX_SHARD_ENTRIES);
        assert_eq!(quarantined, MAX_SHARD_ENTRIES, "none replaced");
        assert!(full.is_quarantined(one_shard[0], t0));
        deadlines_counted(&full);
        // Once they end (a quarantine is over at its deadline), new prefixes are counted
        // again.
        let later = t0 + d;
        let last = one_shard[2 * MAX_SHARD_ENTRIES - 1];
        assert!(full.record_failure(last, later, 1, d));
        assert!(full.is_quarantined(last, later));
        assert_eq!(entries(&full), 1);
        deadlines_counted(&full);
    }
}
