//! [`SimTier`]: a seeded simulated store for tests and the stress tool — real chunks in
//! memory, with simulated latency, transfer damage, connector panics and hangs, so the
//! default `kvsched stress` moves and verifies real bytes through the same connector as a
//! real tier.

use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};

use kvsched::connector::CancelToken;
use kvsched::kv::{ChunkKey, MemoryTier, Tier, TierError};

use crate::rng::SplitMix64;
use crate::sim_connector::SimulatedPanic;

/// Settings of a [`SimTier`].
#[derive(Clone, Debug, PartialEq)]
pub struct SimTierConfig {
    /// Seed of every decision (mixed with the call's keys and a per-tier call count).
    pub seed: u64,
    /// Bytes the underlying memory holds.
    pub capacity_bytes: u64,
    /// Share of the values a `get` returns that its transfer damages, each value on its own
    /// (0–1), so a read of `n` chunks loses one or more with probability `1 − (1 − r)^n`
    /// whether the connector reads them in one call or in `n`. The damage is a flipped byte,
    /// caught by the chunk checksum like real damage.
    pub failure_rate: f64,
    /// Most values one call damages.
    pub max_invalid_per_failure: u32,
    /// Latency of a `get`: uniform in `[min, max]`.
    pub latency_min: Duration,
    /// See `latency_min`.
    pub latency_max: Duration,
    /// Share of `get` calls that panic (a connector bug the worker must survive).
    pub panic_rate: f64,
    /// Share of `get` calls that take `hang` instead (until cancelled).
    pub hang_rate: f64,
    /// How long a hanging `get` takes.
    pub hang: Duration,
}

impl Default for SimTierConfig {
    fn default() -> Self {
        SimTierConfig {
            seed: 0x5eed,
            capacity_bytes: 1 << 30,
            failure_rate: 0.01,
            max_invalid_per_failure: 2,
            latency_min: Duration::from_micros(50),
            latency_max: Duration::from_micros(500),
            panic_rate: 0.0,
            hang_rate: 0.0,
            hang: Duration::from_millis(50),
        }
    }
}

/// What a [`SimTier`] injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimTierCounts {
    /// `get` calls.
    pub gets: u64,
    /// Values damaged in transfer (distinct chunks of a call, one flipped byte each).
    pub damaged: u64,
    /// Calls that panicked.
    pub panics: u64,
    /// Calls that hung.
    pub hangs: u64,
}

/// A [`MemoryTier`] behind simulated latency, damage, panics and hangs.
#[derive(Debug)]
pub struct SimTier {
    inner: MemoryTier,
    cfg: SimTierConfig,
    calls: AtomicU64,
    damaged: AtomicU64,
    panics: AtomicU64,
    hangs: AtomicU64,
}

impl SimTier {
    /// A simulated tier.
    pub fn new(cfg: SimTierConfig) -> SimTier {
        SimTier {
            inner: MemoryTier::new(cfg.capacity_bytes, 16),
            cfg,
            calls: AtomicU64::new(0),
            damaged: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            hangs: AtomicU64::new(0),
        }
    }

    /// What it injected so far.
    pub fn counts(&self) -> SimTierCounts {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SimTierCounts {
            gets: r(&self.calls),
            damaged: r(&self.damaged),
            panics: r(&self.panics),
            hangs: r(&self.hangs),
        }
    }

    /// The memory behind it.
    pub fn inner(&self) -> &MemoryTier {
        &self.inner
    }
}

/// Sleeps `d`, waking every millisecond to check `cancel`; `false` if cancelled.
fn sleep_unless_cancelled(d: Duration, cancel: &CancelToken) -> bool {
    let until = Instant::now() + d;
    loop {
        if cancel.is_cancelled() {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(1)));
    }
}

impl Tier for SimTier {
    fn name(&self) -> &str {
        "sim"
    }

    /// Its simulated latency and hangs wait on the caller's cancellation token, as a
    /// cooperative tier does: no thread of the connector's is needed to bound them.
    fn may_block(&self) -> bool {
        false
    }

    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        self.inner.exists(keys, cancel)
    }

    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        // Relaxed: a count that only varies the seed.
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let mix = keys.first().map_or(0, |k| k.0 as u64 ^ (k.0 >> 64) as u64);
        let mut rng = SplitMix64::new(self.cfg.seed ^ mix ^ call.wrapping_mul(0x9e37_79b9));
        let (lo, hi) = (
            self.cfg.latency_min.as_nanos() as u64,
            self.cfg.latency_max.as_nanos() as u64,
        );
        let mut wait = Duration::from_nanos(lo + rng.below(hi.saturating_sub(lo) + 1));
        if rng.unit() < self.cfg.hang_rate {
            self.hangs.fetch_add(1, Ordering::Relaxed);
            wait = self.cfg.hang;
        }
        if rng.unit() < self.cfg.panic_rate {
            self.panics.fetch_add(1, Ordering::Relaxed);
            std::panic::panic_any(SimulatedPanic);
        }
        if !wait.is_zero() && !sleep_unless_cancelled(wait, cancel) {
            return Err(TierError::Cancelled);
        }
        let mut values = self.inner.get(keys, cancel)?;
        let mut left = self.cfg.max_invalid_per_failure;
        for v in values.iter_mut() {
            if left == 0 {
                break;
            }
            if rng.unit() >= self.cfg.failure_rate {
                continue;
            }
            if let Some(v) = v.as_mut().filter(|v| !v.is_empty()) {
                let at = rng.below(v.len() as u64) as usize;
                v[at] ^= 0x5a;
                left -= 1;
                self.damaged.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(values)
    }

    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        self.inner.put(chunks)
    }
}
