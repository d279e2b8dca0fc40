//! Fault injection on real stored data: [`FaultyTier`] wraps a tier and, at seeded rates,
//! flips a byte of or cuts a stored value (in the file at rest, for disk), deletes a chunk
//! between lookup and load, or delays a load. Faults act on the bytes, never through a flag,
//! so a reader meets them exactly as it would meet real damage: through the codec's checks
//! (or as a miss, for a deleted chunk).

use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::{ChunkKey, DiskTier, MemoryTier, Tier, TierError};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a tier gives [`FaultyTier`] to damage what it stores: an in-place edit of one stored
/// value and its removal, over the tier's own public `edit_stored` / `remove`. Each call acts
/// on the value held now and says whether one was held and changed (`false`: nothing to act
/// on). The damage itself (which byte, which bit, how short) is chosen here, the same for
/// every tier.
pub trait FaultTarget: Tier {
    /// Lets `edit` change the stored value of `key` in place; what `edit` returned, or
    /// `false` when no value is held.
    fn edit_stored(
        &self,
        key: ChunkKey,
        edit: &mut dyn FnMut(&mut Vec<u8>) -> bool,
    ) -> Result<bool, TierError>;
    /// Deletes the stored value of `key`.
    fn remove(&self, key: ChunkKey) -> Result<bool, TierError>;

    /// Flips one bit of the stored value of `key`: the byte at `pick`'s high bits scaled to
    /// the value's length, the bit chosen by `pick`'s low three bits.
    fn corrupt_stored(&self, key: ChunkKey, pick: u64) -> Result<bool, TierError> {
        self.edit_stored(key, &mut |v| {
            let at = pick_offset(pick, v.len());
            match v.get_mut(at) {
                Some(b) => {
                    *b ^= pick_bit(pick);
                    true
                }
                None => false,
            }
        })
    }
    /// Cuts the stored value of `key` to a length below its own, chosen by `pick` as for
    /// [`corrupt_stored`](Self::corrupt_stored) (possibly 0).
    fn truncate_stored(&self, key: ChunkKey, pick: u64) -> Result<bool, TierError> {
        self.edit_stored(key, &mut |v| {
            if v.is_empty() {
                return false;
            }
            v.truncate(pick_offset(pick, v.len()));
            true
        })
    }
}

impl FaultTarget for MemoryTier {
    fn edit_stored(
        &self,
        key: ChunkKey,
        edit: &mut dyn FnMut(&mut Vec<u8>) -> bool,
    ) -> Result<bool, TierError> {
        Ok(MemoryTier::edit_stored(self, key, edit))
    }
    fn remove(&self, key: ChunkKey) -> Result<bool, TierError> {
        Ok(MemoryTier::remove(self, key))
    }
}

/// Damage in the file at rest.
impl FaultTarget for DiskTier {
    fn edit_stored(
        &self,
        key: ChunkKey,
        edit: &mut dyn FnMut(&mut Vec<u8>) -> bool,
    ) -> Result<bool, TierError> {
        DiskTier::edit_stored(self, key, edit)
    }
    fn remove(&self, key: ChunkKey) -> Result<bool, TierError> {
        DiskTier::remove(self, key)
    }
}

/// Damage on the server: `GET`, then `SET` of the damaged value (not atomic, see
/// [`RedisTier::edit_stored`](kvsched::kv::redis::RedisTier::edit_stored)); `remove` is a `DEL`.
#[cfg(feature = "redis")]
impl FaultTarget for kvsched::kv::redis::RedisTier {
    fn edit_stored(
        &self,
        key: ChunkKey,
        edit: &mut dyn FnMut(&mut Vec<u8>) -> bool,
    ) -> Result<bool, TierError> {
        kvsched::kv::redis::RedisTier::edit_stored(self, key, edit)
    }
    fn remove(&self, key: ChunkKey) -> Result<bool, TierError> {
        kvsched::kv::redis::RedisTier::remove(self, key)
    }
}

/// The offset in `0..len` that `pick` selects (multiply-shift on its bits; 0 when `len` is 0).
fn pick_offset(pick: u64, len: usize) -> usize {
    ((u128::from(pick) * len as u128) >> 64) as usize
}

/// The one-bit mask that `pick` selects.
fn pick_bit(pick: u64) -> u8 {
    1u8 << (pick & 7)
}

/// Rates (each the probability, in `[0, 1]`, that a key meets the fault) and the seed.
///
/// A key's fate is a pure function of the seed, the fault and the key: the same seed and
/// keys make the same decisions on every run and in every thread order, and a key that
/// meets a fault meets it every time (each time it is stored, for `corrupt` and `truncate`;
/// each time it is read, for `evict` and `slow`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultConfig {
    /// Seed of every decision.
    pub seed: u64,
    /// Per stored key: flip one bit of the value at rest, right after `put`.
    pub corrupt: f64,
    /// Per stored key: cut the value at rest to a shorter length, right after `put`.
    pub truncate: f64,
    /// Per key read: delete the chunk on `get` before reading it (a miss).
    pub evict: f64,
    /// Per key read: delay the `get` by [`slow_for`](Self::slow_for) (once per call however
    /// many of its keys are slow), waking at least every millisecond to check cancellation.
    pub slow: f64,
    /// How long a slow `get` waits.
    pub slow_for: Duration,
}

impl Default for FaultConfig {
    /// No faults, seed 0, a 10 ms delay for slow gets.
    fn default() -> Self {
        FaultConfig {
            seed: 0,
            corrupt: 0.0,
            truncate: 0.0,
            evict: 0.0,
            slow: 0.0,
            slow_for: Duration::from_millis(10),
        }
    }
}

/// A [`FaultConfig`] field out of range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FaultConfigError {
    /// A rate is not a number in `[0, 1]`.
    #[error("fault rate {field}: {value} is not in [0, 1]")]
    Rate {
        /// The field (`corrupt`, `truncate`, `evict`, `slow`).
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// `slow_for` is over an hour.
    #[error("fault slow_for: {0:?} is over an hour")]
    SlowFor(Duration),
}

/// Faults injected so far, each counted when it acted on a held value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Values with a flipped bit.
    pub corrupted: u64,
    /// Values cut short.
    pub truncated: u64,
    /// Chunks deleted before a read.
    pub evicted: u64,
    /// Gets delayed.
    pub slowed: u64,
}

#[derive(Clone, Copy)]
#[repr(u8)]
enum Kind {
    Corrupt = 1,
    Truncate = 2,
    Evict = 3,
    Slow = 4,
}

/// A tier that injects faults into another (see [`FaultConfig`] for what and when).
/// `exists` passes through untouched: the faults surface on `get`.
#[derive(Debug)]
pub struct FaultyTier<T> {
    inner: T,
    cfg: FaultConfig,
    name: String,
    corrupted: AtomicU64,
    truncated: AtomicU64,
    evicted: AtomicU64,
    slowed: AtomicU64,
}

impl<T: FaultTarget> FaultyTier<T> {
    /// Wraps `inner`; refuses rates outside `[0, 1]` (or NaN) and delays over an hour.
    pub fn new(inner: T, cfg: FaultConfig) -> Result<Self, FaultConfigError> {
        for (field, value) in [
            ("corrupt", cfg.corrupt),
            ("truncate", cfg.truncate),
            ("evict", cfg.evict),
            ("slow", cfg.slow),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(FaultConfigError::Rate { field, value });
            }
        }
        if cfg.slow_for > Duration::from_secs(3600) {
            return Err(FaultConfigError::SlowFor(cfg.slow_for));
        }
        Ok(FaultyTier {
            name: format!("{}+faults", inner.name()),
            inner,
            cfg,
            corrupted: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            slowed: AtomicU64::new(0),
        })
    }

    /// The wrapped tier.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// Faults injected so far.
    pub fn counts(&self) -> FaultCounts {
        // Relaxed: statistics only.
        FaultCounts {
            corrupted: self.corrupted.load(Ordering::Relaxed),
            truncated: self.truncated.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            slowed: self.slowed.load(Ordering::Relaxed),
        }
    }

    /// 64 bits fixed by (seed, fault kind, key, salt).
    fn draw(&self, kind: Kind, key: ChunkKey, salt: u8) -> u64 {
        let mut b = [0u8; 18];
        b[..16].copy_from_slice(&key.to_bytes());
        b[16] = kind as u8;
        b[17] = salt;
        xxhash_rust::xxh3::xxh3_64_with_seed(&b, self.cfg.seed)
    }

    fn meets(&self, kind: Kind, key: ChunkKey) -> bool {
        let rate = match kind {
            Kind::Corrupt => self.cfg.corrupt,
            Kind::Truncate => self.cfg.truncate,
            Kind::Evict => self.cfg.evict,
            Kind::Slow => self.cfg.slow,
        };
        // 53 uniform bits in [0, 1): rate 0 never fires, rate 1 always does.
        rate > 0.0 && ((self.draw(kind, key, 0) >> 11) as f64 / (1u64 << 53) as f64) < rate
    }

    /// The read faults of every get path (`get`, `get_into`, `read_with`): one delay if any
    /// key is slow, then the deletion of each key that meets `evict`.
    fn before_read(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<(), TierError> {
        if keys.iter().any(|&k| self.meets(Kind::Slow, k)) {
            // Relaxed: statistics only.
            self.slowed.fetch_add(1, Ordering::Relaxed);
            self.stall(cancel)?;
        }
        for &k in keys {
            if self.meets(Kind::Evict, k) && self.inner.remove(k)? {
                // Relaxed: statistics only.
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Waits `slow_for`, checking `cancel` at least every millisecond.
    fn stall(&self, cancel: &CancelToken) -> Result<(), TierError> {
        let end = Instant::now() + self.cfg.slow_for;
        loop {
            if cancel.is_cancelled() {
                return Err(TierError::Cancelled);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            std::thread::sleep(left.min(Duration::from_millis(1)));
        }
    }
}

impl<T: FaultTarget> Tier for FaultyTier<T> {
    fn name(&self) -> &str {
        &self.name
    }

    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        self.inner.exists(keys, cancel)
    }

    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        self.before_read(keys, cancel)?;
        self.inner.get(keys, cancel)
    }

    /// As [`get`](Tier::get), read into the caller's buffers through the inner tier's own
    /// `get_into`: a faulted load takes the path a clean one takes.
    fn get_into(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
        bufs: &mut [Vec<u8>],
        held: &mut [bool],
    ) -> Result<(), TierError> {
        self.before_read(keys, cancel)?;
        self.inner.get_into(keys, cancel, bufs, held)
    }

    /// As [`get`](Tier::get) for one key, through the inner tier's own `read_with` (the
    /// memory tier's verify-and-copy where the value lies).
    fn read_with(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, TierError> {
        self.before_read(&[key], cancel)?;
        self.inner.read_with(key, cancel, f)
    }

    fn expect_values_up_to(&self, bytes: usize) {
        self.inner.expect_values_up_to(bytes);
    }

    /// The inner tier's answer unless gets may be slowed (`slow` > 0): then `true`, so the
    /// connector bounds them by the load's deadline. Without slow gets a faulted memory tier
    /// is read on the loading thread, as a clean one is.
    fn may_block(&self) -> bool {
        self.cfg.slow > 0.0 || self.inner.may_block()
    }

    /// The inner tier's answer: a faulted memory tier is read in place, as a clean one is.
    fn reads_in_place(&self) -> bool {
        self.inner.reads_in_place()
    }

    /// Stores through the inner tier, then damages the chosen values at rest (also when the
    /// inner put failed: whatever it stored can be damaged).
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        let stored = self.inner.put(chunks);
        for (k, _) in chunks {
            if self.meets(Kind::Truncate, *k)
                && self
                    .inner
                    .truncate_stored(*k, self.draw(Kind::Truncate, *k, 1))?
            {
                // Relaxed: statistics only.
                self.truncated.fetch_add(1, Ordering::Relaxed);
            }
            if self.meets(Kind::Corrupt, *k)
                && self
                    .inner
                    .corrupt_stored(*k, self.draw(Kind::Corrupt, *k, 1))?
            {
                // Relaxed: statistics only.
                self.corrupted.fetch_add(1, Ordering::Relaxed);
            }
        }
        stored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_stay_in_range() {
        for len in [0usize, 1, 2, 48, 16 << 10] {
            for pick in [0u64, 1, u64::MAX, u64::MAX / 2, 0xdead_beef] {
                assert!(pick_offset(pick, len) < len.max(1));
            }
        }
        assert_eq!(pick_offset(u64::MAX, 10), 9);
        assert_eq!(pick_bit(9), 2);
    }

    #[test]
    fn rates_out_of_range_are_refused() {
        let m = MemoryTier::new(10, 1);
        let cfg = FaultConfig {
            evict: f64::NAN,
            ..FaultConfig::default()
        };
        let e = FaultyTier::new(m, cfg).unwrap_err();
        assert!(matches!(e, FaultConfigError::Rate { field: "evict", .. }));
    }
}
