//! [`MemoryTier`]: chunks in process memory, bounded in bytes, sharded, LRU per shard (the
//! local CPU tier).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::tier::check_into_lens;
use super::{ChunkKey, Tier, TierError};
use crate::connector::CancelToken;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// What a [`MemoryTier`] has done since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryCounts {
    /// Keys `get` found.
    pub hits: u64,
    /// Keys `get` did not find.
    pub misses: u64,
    /// Values dropped to make room.
    pub evictions: u64,
    /// Value bytes held now.
    pub bytes: u64,
    /// Values held now.
    pub entries: u64,
}

/// The capacity a value takes at least when a shard counts its entries (see [`MemoryTier`]).
const MIN_ENTRY_BYTES: u64 = 64;

#[derive(Default)]
struct Shard {
    /// Key → (last-use tick, value).
    map: FxHashMap<ChunkKey, (u64, Vec<u8>)>,
    /// Last-use tick → key, oldest first.
    order: BTreeMap<u64, ChunkKey>,
    next_tick: u64,
    bytes: u64,
}

impl Shard {
    fn tick(&mut self) -> u64 {
        self.next_tick += 1;
        self.next_tick
    }

    fn remove(&mut self, key: ChunkKey) -> Option<Vec<u8>> {
        let (tick, v) = self.map.remove(&key)?;
        self.order.remove(&tick);
        self.bytes -= v.len() as u64;
        Some(v)
    }
}

/// Chunks in process memory: at most `capacity_bytes` of values, split evenly over `shards`
/// shards (a key's shard is fixed by its bits), each a mutex-guarded map with its own
/// least-recently-used order. A `put` that overfills a shard evicts that shard's least
/// recently used values (a `get` hit counts as a use, `exists` does not).
///
/// Limits: capacity counts value bytes only; bookkeeping adds about 100 bytes per value,
/// which is noise for chunk-sized values. A shard holds at most one value per 64 bytes of
/// its capacity (and one at least: a tier of capacity 0 holds one empty value per shard), so
/// however small (or empty) the values, the bookkeeping stays within about twice the
/// capacity. A value larger than a shard's share of the
/// capacity is refused. Calls hold one shard lock at a time, for map work and the copy of
/// one value, never for I/O.
pub struct MemoryTier {
    shards: Box<[Mutex<Shard>]>,
    shard_capacity: u64,
    /// Values a shard holds at most: one per [`MIN_ENTRY_BYTES`] of its capacity.
    shard_entries: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    bytes: AtomicU64,
    entries: AtomicU64,
}

impl std::fmt::Debug for MemoryTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTier")
            .field("shards", &self.shards.len())
            .field("shard_capacity", &self.shard_capacity)
            .field("stats", &self.counts())
            .finish()
    }
}

impl MemoryTier {
    /// A tier holding at most `capacity_bytes` of values over `shards` shards (at least 1;
    /// at most 1024).
    pub fn new(capacity_bytes: u64, shards: usize) -> Self {
        let n = shards.clamp(1, 1024);
        MemoryTier {
            shards: (0..n).map(|_| Mutex::new(Shard::default())).collect(),
            shard_capacity: capacity_bytes / n as u64,
            shard_entries: usize::try_from(capacity_bytes / n as u64 / MIN_ENTRY_BYTES)
                .unwrap_or(usize::MAX)
                .max(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
        }
    }

    /// The largest value the tier accepts: one shard's share of the capacity.
    pub fn max_value_bytes(&self) -> u64 {
        self.shard_capacity
    }

    /// Counters so far (each read on its own: a snapshot under concurrent calls is not
    /// atomic across fields).
    pub fn counts(&self) -> MemoryCounts {
        // Relaxed: statistics only, nothing is ordered by them.
        MemoryCounts {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
        }
    }

    fn shard(&self, key: ChunkKey) -> &Mutex<Shard> {
        // Keys are hashes: the high 64 bits are as good as any, reduced by multiply-shift.
        let h = (key.0 >> 64) as u64;
        let i = ((u128::from(h) * self.shards.len() as u128) >> 64) as usize;
        &self.shards[i]
    }

    fn note_removed(&self, len: usize) {
        // Relaxed: statistics only.
        self.bytes.fetch_sub(len as u64, Ordering::Relaxed);
        self.entries.fetch_sub(1, Ordering::Relaxed);
    }

    /// Runs `f` on the stored value of `key` (if held), keeping the byte counts right.
    fn with_stored(&self, key: ChunkKey, f: impl FnOnce(&mut Vec<u8>)) -> bool {
        let mut s = self.shard(key).lock();
        let Some((_, v)) = s.map.get_mut(&key) else {
            return false;
        };
        let before = v.len() as u64;
        f(v);
        let after = v.len() as u64;
        s.bytes = s.bytes - before + after;
        // Relaxed: statistics only.
        if after >= before {
            self.bytes.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.bytes.fetch_sub(before - after, Ordering::Relaxed);
        }
        true
    }
}

impl Tier for MemoryTier {
    fn name(&self) -> &str {
        "memory"
    }

    fn may_block(&self) -> bool {
        false
    }

    fn reads_in_place(&self) -> bool {
        true
    }

    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        let mut out = Vec::with_capacity(keys.len());
        for &k in keys {
            if cancel.is_cancelled() {
                return Err(TierError::Cancelled);
            }
            out.push(self.shard(k).lock().map.contains_key(&k));
        }
        Ok(out)
    }

    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        let mut out = Vec::with_capacity(keys.len());
        for &k in keys {
            if cancel.is_cancelled() {
                return Err(TierError::Cancelled);
            }
            let mut s = self.shard(k).lock();
            let tick = s.tick();
            let got = match s.map.get_mut(&k) {
                Some((t, v)) => {
                    let old = std::mem::replace(t, tick);
                    let v = v.clone();
                    s.order.remove(&old);
                    s.order.insert(tick, k);
                    Some(v)
                }
                None => None,
            };
            drop(s);
            // Relaxed: statistics only.
            match got {
                Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
                None => self.misses.fetch_add(1, Ordering::Relaxed),
            };
            out.push(got);
        }
        Ok(out)
    }

    /// Copies each held value into its buffer under its shard's lock (one memcpy into
    /// memory the caller already owns: no allocation once a buffer has held a value of the
    /// size). A hit counts as a use, as in `get`.
    fn get_into(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
        bufs: &mut [Vec<u8>],
        held: &mut [bool],
    ) -> Result<(), TierError> {
        check_into_lens(keys.len(), bufs.len(), held.len())?;
        for ((&k, buf), h) in keys.iter().zip(bufs.iter_mut()).zip(held.iter_mut()) {
            if cancel.is_cancelled() {
                return Err(TierError::Cancelled);
            }
            buf.clear();
            let mut s = self.shard(k).lock();
            let tick = s.tick();
            *h = match s.map.get_mut(&k) {
                Some((t, v)) => {
                    let old = std::mem::replace(t, tick);
                    buf.extend_from_slice(v);
                    s.order.remove(&old);
                    s.order.insert(tick, k);
                    true
                }
                None => false,
            };
            drop(s);
            // Relaxed: statistics only.
            if *h {
                self.hits.fetch_add(1, Ordering::Relaxed);
            } else {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Runs `f` on the stored value under its shard's lock (no copy out: the connector
    /// verifies it and copies its payload into KV memory from where it lies). A hit counts as
    /// a use, as in `get`.
    fn read_with(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, TierError> {
        if cancel.is_cancelled() {
            return Err(TierError::Cancelled);
        }
        let mut guard = self.shard(key).lock();
        let s = &mut *guard;
        let tick = s.tick();
        let held = match s.map.get_mut(&key) {
            Some((t, v)) => {
                // The use is recorded before `f` runs: a panicking `f` (caught by the
                // connector) leaves the order consistent with the map. (Planted bug
                // `lru-order-after-read`, scripts/plants.sh: it is recorded after, and a
                // panic leaves the key's old order entry, evicting its next value first.)
                let old = std::mem::replace(t, tick);
                if planted!("lru-order-after-read") {
                    f(v);
                }
                s.order.remove(&old);
                s.order.insert(tick, key);
                if !planted!("lru-order-after-read") {
                    f(v);
                }
                true
            }
            None => false,
        };
        drop(guard);
        // Relaxed: statistics only.
        if held {
            self.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        Ok(held)
    }

    /// Stores every value that fits a shard, evicting least recently used values of its shard
    /// as needed. If any value is larger than [`max_value_bytes`](MemoryTier::max_value_bytes)
    /// the others are still stored and the call returns [`TierError::Refused`] naming the
    /// first such key.
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        let mut refused = None;
        for (k, v) in chunks {
            let len = v.len() as u64;
            if len > self.shard_capacity {
                refused.get_or_insert((*k, len));
                continue;
            }
            let mut s = self.shard(*k).lock();
            if let Some(old) = s.remove(*k) {
                self.note_removed(old.len());
            }
            let mut evicted = 0u64;
            // Room in bytes and in entries: tiny or empty values must not pile up
            // bookkeeping the byte count does not see.
            while s.bytes + len > self.shard_capacity || s.map.len() >= self.shard_entries {
                let Some((_, victim)) = s.order.pop_first() else {
                    break;
                };
                if let Some((_, old)) = s.map.remove(&victim) {
                    s.bytes -= old.len() as u64;
                    self.note_removed(old.len());
                    evicted += 1;
                }
            }
            let tick = s.tick();
            s.order.insert(tick, *k);
            s.map.insert(*k, (tick, v.clone()));
            s.bytes += len;
            drop(s);
            // Relaxed: statistics only.
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
            self.bytes.fetch_add(len, Ordering::Relaxed);
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
        match refused {
            None => Ok(()),
            Some((k, len)) => Err(TierError::Refused(format!(
                "value for key {k}: {len} bytes, more than a memory shard holds ({} bytes)",
                self.shard_capacity
            ))),
        }
    }
}

/// Editing a stored value in place: what a repair tool or the test kit's fault injection
/// (`kvsched_testkit::FaultyTier`) uses to change a value at rest exactly as real damage would.
impl MemoryTier {
    /// Lets `edit` change the value stored for `key` in place (the tier's byte counts follow
    /// its new length, past the capacity if the edit grows it: nothing is evicted; its
    /// recency is untouched). Returns what `edit` returned, or `false`
    /// when no value is held.
    pub fn edit_stored(&self, key: ChunkKey, edit: impl FnOnce(&mut Vec<u8>) -> bool) -> bool {
        let mut changed = false;
        self.with_stored(key, |v| changed = edit(v));
        changed
    }

    /// Deletes the value stored for `key`; `false` if none was held.
    pub fn remove(&self, key: ChunkKey) -> bool {
        let old = self.shard(key).lock().remove(key);
        if let Some(v) = &old {
            self.note_removed(v.len());
        }
        old.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u128) -> ChunkKey {
        ChunkKey::chain(ChunkKey::ROOT, 1, 0, &[i as u32])
    }

    fn get1(t: &MemoryTier, key: ChunkKey) -> Option<Vec<u8>> {
        t.get(&[key], &CancelToken::new()).unwrap().pop().flatten()
    }

    #[test]
    fn evicts_least_recently_used_first() {
        let t = MemoryTier::new(300, 1);
        assert_eq!(t.max_value_bytes(), 300);
        t.put(&[
            (k(1), vec![1; 100]),
            (k(2), vec![2; 100]),
            (k(3), vec![3; 100]),
        ])
        .unwrap();
        assert_eq!(get1(&t, k(1)), Some(vec![1; 100])); // 1 is now the most recent
        t.put(&[(k(4), vec![4; 100])]).unwrap(); // evicts 2, the least recent
        let c = CancelToken::new();
        assert_eq!(
            t.exists(&[k(1), k(2), k(3), k(4)], &c).unwrap(),
            [true, false, true, true]
        );
        let s = t.counts();
        assert_eq!((s.evictions, s.bytes, s.entries, s.hits), (1, 300, 3, 1));
        assert_eq!(get1(&t, k(2)), None);
        assert_eq!(t.counts().misses, 1);
    }

    #[test]
    fn capacity_holds_across_shards_and_replacement() {
        let t = MemoryTier::new(4 * 1000, 4);
        for i in 0..100u128 {
            t.put(&[(k(i), vec![i as u8; 90])]).unwrap();
            t.put(&[(k(i), vec![i as u8; 90])]).unwrap(); // replacing never double-counts
            assert!(t.counts().bytes <= 4000);
        }
        let per: Vec<u64> = t.shards.iter().map(|s| s.lock().bytes).collect();
        assert!(per.iter().all(|&b| b > 0 && b <= 1000), "{per:?}");
        let held: u64 = per.iter().sum();
        assert_eq!(t.counts().bytes, held);
        assert_eq!(t.counts().entries * 90, held);
        assert!(t.counts().evictions > 0);
    }

    #[test]
    fn empty_values_do_not_pile_up() {
        let t = MemoryTier::new(64 * 100, 2);
        for i in 0..10_000u128 {
            t.put(&[(k(i), Vec::new())]).unwrap();
        }
        let s = t.counts();
        assert!(s.entries <= 100 && s.evictions >= 9_900, "{s:?}");
        assert_eq!(get1(&t, k(9_999)), Some(Vec::new()), "the newest is kept");
    }

    #[test]
    fn oversized_value_is_refused_and_the_rest_stored() {
        let t = MemoryTier::new(100, 1);
        let r = t.put(&[(k(1), vec![0; 101]), (k(2), vec![0; 10])]);
        assert!(matches!(r, Err(TierError::Refused(m)) if m.contains("101 bytes")));
        assert_eq!(get1(&t, k(2)), Some(vec![0; 10]));
        assert_eq!(get1(&t, k(1)), None);
    }

    #[test]
    fn get_stops_when_cancelled() {
        let t = MemoryTier::new(100, 1);
        t.put(&[(k(1), vec![1])]).unwrap();
        let c = CancelToken::new();
        c.cancel();
        assert!(matches!(t.get(&[k(1)], &c), Err(TierError::Cancelled)));
        assert_eq!(t.counts().hits, 0);
    }

    #[test]
    fn edit_and_remove_change_the_stored_value() {
        let t = MemoryTier::new(1000, 2);
        t.put(&[(k(1), vec![0; 10]), (k(2), vec![0; 10])]).unwrap();
        assert!(t.edit_stored(k(1), |v| {
            v[3] ^= 1;
            true
        }));
        assert_eq!(
            get1(&t, k(1)).unwrap().iter().filter(|&&b| b != 0).count(),
            1
        );
        assert!(t.edit_stored(k(2), |v| {
            v.truncate(4);
            true
        }));
        assert_eq!(get1(&t, k(2)).unwrap().len(), 4);
        assert_eq!(t.counts().bytes, 10 + 4);
        assert!(!t.edit_stored(k(2), |_| false));
        assert!(t.remove(k(1)));
        assert!(!t.remove(k(1)));
        assert!(!t.edit_stored(k(1), |_| true));
    }

    /// A `read_with` callback that panics (a `KvMemory::write` panicking in the connector's
    /// landing, which the connector catches) leaves the LRU order as the map says: the key's
    /// next value is the newest, not evicted first.
    #[test]
    fn a_panicking_read_callback_leaves_the_lru_order_consistent() {
        let t = MemoryTier::new(256, 1); // one shard of four 64-byte values
        for i in 1..=4u128 {
            assert!(t.put(&[(ChunkKey(i), vec![i as u8; 64])]).is_ok());
        }
        let never = CancelToken::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = t.read_with(ChunkKey(1), &never, &mut |_| panic!("write panicked"));
        }));
        assert!(r.is_err());
        assert!(t.put(&[(ChunkKey(1), vec![9; 64])]).is_ok()); // the newest value now
        assert!(t.put(&[(ChunkKey(5), vec![5; 64])]).is_ok()); // evicts the oldest: key 2
        let held: Vec<bool> = t
            .get(&[ChunkKey(1), ChunkKey(2)], &never)
            .map(|v| v.iter().map(Option::is_some).collect())
            .unwrap_or_default();
        assert_eq!(held, [true, false], "[key 1 (newest), key 2 (oldest)] held");
    }
}
