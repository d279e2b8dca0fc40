//! A seeded, in-memory simulated connector with configurable latency and failures, for tests,
//! examples and the stress tool.

use std::time::Duration;

use kvsched::connector::{
    InvalidBlocks, KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult,
};
use kvsched::BlockRef;

use crate::rng::{hash_str, SplitMix64};

/// Settings of [`SimConnector`].
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Seed of every random decision (each load draws from `seed`, the request and attempt, so
    /// results do not depend on thread timing).
    pub seed: u64,
    /// Share of a prompt the store holds (0–1).
    pub hit_ratio: f64,
    /// External tokens are offered in multiples of this (the scheduler block size).
    pub align_tokens: u64,
    /// Share of loads that are asynchronous (0–1).
    pub async_ratio: f64,
    /// Share of loads that fail (0–1).
    pub failure_rate: f64,
    /// Share of failures that name a block of the locally shared prefix (below the load's
    /// start) instead of a loaded one (0–1).
    pub shared_failure_share: f64,
    /// Invalid blocks per failure: 1 to this many.
    pub max_invalid_per_failure: u32,
    /// Load latency: uniform in `[min, max]`.
    pub latency_min: Duration,
    /// See `latency_min`.
    pub latency_max: Duration,
    /// Share of loads that panic inside the connector (0–1): a worker fault.
    pub panic_rate: f64,
    /// Share of loads that take `hang` instead of the normal latency (0–1): with a load
    /// deadline below `hang`, these land late.
    pub hang_rate: f64,
    /// Latency of a hanging load.
    pub hang: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 0x5eed,
            hit_ratio: 0.75,
            align_tokens: 16,
            async_ratio: 0.8,
            failure_rate: 0.01,
            shared_failure_share: 0.5,
            max_invalid_per_failure: 2,
            latency_min: Duration::from_micros(50),
            latency_max: Duration::from_micros(500),
            panic_rate: 0.0,
            hang_rate: 0.0,
            hang: Duration::from_millis(50),
        }
    }
}

/// The payload of a simulated connector panic (so a panic hook can tell it from a real one).
#[derive(Clone, Copy, Debug)]
pub struct SimulatedPanic;

/// An in-memory, seeded connector with configurable latency and failures.
#[derive(Clone, Debug, Default)]
pub struct SimConnector {
    cfg: SimConfig,
}

impl SimConnector {
    /// A connector with these settings.
    pub fn new(cfg: SimConfig) -> Self {
        SimConnector { cfg }
    }

    /// Its settings.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    fn rng(&self, request: &str, salt: u64) -> SplitMix64 {
        SplitMix64::new(
            self.cfg.seed
                ^ hash_str(request).rotate_left(17)
                ^ salt.wrapping_mul(0x2545_F491_4F6C_DD1D),
        )
    }

    /// The failure decision for `job`, without sleeping (used by [`KvConnector::load`] and by
    /// engines that run sync loads inline).
    pub fn decide(&self, job: &LoadJob) -> LoadResult {
        let mut rng = self.rng(&job.request, 1 + u64::from(job.attempt));
        if rng.unit() >= self.cfg.failure_rate {
            return LoadResult::Ok;
        }
        let n = 1 + rng.below(u64::from(self.cfg.max_invalid_per_failure.max(1)));
        let loaded = job.all_loaded_blocks();
        let prefix: Vec<BlockRef> = (0..job.block_tables.len())
            .flat_map(|g| {
                let b = job.block_sizes.get(g).copied().unwrap_or(1).max(1);
                let hi = (job.start_tokens / b) as usize;
                job.block_tables[g]
                    .iter()
                    .take(hi)
                    .filter(|r| r.id != 0)
                    .copied()
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut bad = Vec::new();
        for _ in 0..n {
            let from = if !prefix.is_empty()
                && (loaded.is_empty() || rng.unit() < self.cfg.shared_failure_share)
            {
                &prefix
            } else {
                &loaded
            };
            if let Some(r) = from.get(rng.below(from.len() as u64) as usize) {
                bad.push(*r);
            }
        }
        if bad.is_empty() {
            // Nothing to name: fail the whole range (an empty report would mean success).
            bad = loaded;
        }
        LoadResult::Failed(InvalidBlocks::Flat(bad))
    }
}

impl KvConnector for SimConnector {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let mut rng = self.rng(q.request, 0);
        let align = self.cfg.align_tokens.max(1);
        let held = (q.prompt.len() as f64 * self.cfg.hit_ratio.clamp(0.0, 1.0)) as u64;
        // Never the whole prompt: the last token is always computed to sample from it.
        let held = held.min((q.prompt.len() as u64).saturating_sub(1));
        let held = held - held % align;
        LookupResult {
            external_tokens: held.saturating_sub(q.local_tokens),
            load_async: rng.unit() < self.cfg.async_ratio,
        }
    }

    fn load(&self, job: &LoadJob) -> LoadResult {
        let mut rng = self.rng(&job.request, 0x1000 + u64::from(job.attempt));
        let (lo, hi) = (
            self.cfg.latency_min.as_nanos() as u64,
            self.cfg.latency_max.as_nanos() as u64,
        );
        let mut ns = lo + rng.below(hi.saturating_sub(lo) + 1);
        if rng.unit() < self.cfg.hang_rate {
            ns = self.cfg.hang.as_nanos() as u64;
        }
        if rng.unit() < self.cfg.panic_rate {
            // A simulated connector bug: the worker must survive it.
            std::panic::panic_any(SimulatedPanic);
        }
        if ns > 0 {
            std::thread::sleep(Duration::from_nanos(ns));
        }
        self.decide(job)
    }
}
