//! Prefix quarantine: a prefix whose external loads keep failing, across requests, gets no
//! external load for a while, so a broken store entry is not retried in a loop.
//!
//! Prefixes are identified by a 64-bit key (the chained hash of the prompt up to the end of
//! the load). The table is sharded behind short `sync::Mutex` locks taken only when a load
//! fails or succeeds and at admission of a request that would load.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::sync::Mutex;

#[cfg(not(kvsched_loom))]
const SHARDS: usize = 16;
#[cfg(kvsched_loom)]
const SHARDS: usize = 2;

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    consecutive_failures: u32,
    until: Option<Instant>,
}

/// Failure counts and quarantine deadlines per prefix.
#[derive(Debug)]
pub struct Quarantine {
    shards: Vec<Mutex<FxHashMap<u64, Entry>>>,
}

impl Default for Quarantine {
    fn default() -> Self {
        Quarantine {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
        }
    }
}

impl Quarantine {
    fn shard(&self, key: u64) -> &Mutex<FxHashMap<u64, Entry>> {
        &self.shards[(key.rotate_left(7) as usize) % self.shards.len()]
    }

    /// Records a failed load of `key`; returns true when this failure puts the prefix into
    /// quarantine (`after` consecutive failures, `0` disables quarantine) until `now + for_`.
    pub fn record_failure(&self, key: u64, now: Instant, after: u32, for_: Duration) -> bool {
        if after == 0 {
            return false;
        }
        let mut map = self.shard(key).lock();
        let e = map.entry(key).or_default();
        e.consecutive_failures = e.consecutive_failures.saturating_add(1);
        if e.consecutive_failures >= after {
            e.consecutive_failures = 0;
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
    pub fn is_quarantined(&self, key: u64, now: Instant) -> bool {
        let mut map = self.shard(key).lock();
        match map.get(&key).and_then(|e| e.until) {
            Some(until) if until > now => true,
            Some(_) => {
                if let Some(e) = map.get_mut(&key) {
                    e.until = None;
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
        assert!(!q.is_quarantined(7, t0 + Duration::from_secs(11)));
        assert!(!q.record_failure(9, t0, 0, d), "0 disables quarantine");
    }
}
