//! The KV connector: what an engine plugs in to supply leading tokens from an external store
//! (CPU memory, SSD, a remote cache), and a seeded simulated connector for tests, examples and
//! the stress tool.
//!
//! A connector has two sides: [`KvConnector::lookup`], called by the scheduler at admission to
//! learn how many tokens past the local prefix-cache hit it can supply and whether the load is
//! asynchronous; and [`KvConnector::load`], run by a worker thread (async loads) or by the
//! engine during the step (sync loads), returning success or the blocks that failed.

use std::time::Duration;

use crate::claim::ClaimKey;
use crate::pool::BlockRef;

/// What the scheduler asks at admission.
#[derive(Clone, Copy, Debug)]
pub struct LookupQuery<'a> {
    /// The request id.
    pub request: &'a str,
    /// The prompt's tokens.
    pub prompt: &'a [u32],
    /// Leading tokens already available from the local prefix cache.
    pub local_tokens: u64,
}

/// The connector's answer at admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupResult {
    /// Tokens past `local_tokens` it can supply (0: nothing to load).
    pub external_tokens: u64,
    /// Whether the load runs asynchronously on a worker (the request waits) or inside the
    /// engine's next step.
    pub load_async: bool,
}

/// One load: fill the blocks covering tokens `[start_tokens, end_tokens)` of a request.
#[derive(Clone, Debug)]
pub struct LoadJob {
    /// The request id.
    pub request: std::sync::Arc<str>,
    /// The request's canonical key (identifies it to its shard).
    pub key: ClaimKey,
    /// The shard that owns the request.
    pub shard: usize,
    /// Which load attempt of the request this is (a completion for an older one is stale).
    pub attempt: u32,
    /// First token to load.
    pub start_tokens: u64,
    /// One past the last token to load.
    pub end_tokens: u64,
    /// The request's block tables, one per group (the null block as id 0 / generation 0),
    /// including the locally cached prefix below `start_tokens`.
    pub block_tables: Vec<Vec<BlockRef>>,
    /// Block size of each group, in tokens.
    pub block_sizes: Vec<u64>,
    /// When the scheduler stops waiting for this load: a worker that takes the job after
    /// this does not run it (the scheduler already failed it) and hands it straight back.
    pub deadline: Option<std::time::Instant>,
}

impl LoadJob {
    /// The non-null blocks of group `g` that overlap `[start_tokens, end_tokens)`.
    pub fn loaded_blocks(&self, g: usize) -> impl Iterator<Item = BlockRef> + '_ {
        let b = self.block_sizes.get(g).copied().unwrap_or(1).max(1);
        let (lo, hi) = (self.start_tokens / b, self.end_tokens.div_ceil(b));
        self.block_tables
            .get(g)
            .into_iter()
            .flat_map(move |t| t.iter().enumerate())
            .filter(move |(i, r)| (*i as u64) >= lo && (*i as u64) < hi && r.id != 0)
            .map(|(_, r)| *r)
    }

    /// Every non-null block the load writes, in all groups.
    pub fn all_loaded_blocks(&self) -> Vec<BlockRef> {
        (0..self.block_tables.len())
            .flat_map(|g| self.loaded_blocks(g))
            .collect()
    }
}

/// Which blocks of a load are invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvalidBlocks {
    /// Ids only; an id matches in every group where it appears.
    Flat(Vec<BlockRef>),
    /// One list per group.
    ByGroup(Vec<Vec<BlockRef>>),
}

impl InvalidBlocks {
    /// Every named block, flattened (ids are unique across groups in the runtime's pool).
    pub fn into_flat(self) -> Vec<BlockRef> {
        match self {
            InvalidBlocks::Flat(v) => v,
            InvalidBlocks::ByGroup(v) => v.into_iter().flatten().collect(),
        }
    }
}

/// A load's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadResult {
    /// Every block was filled.
    Ok,
    /// These blocks hold garbage.
    Failed(InvalidBlocks),
}

impl LoadResult {
    /// Every block the job writes failed: what a connector returns on an error it cannot
    /// narrow down (a panic in [`KvConnector::load`] is turned into the same).
    pub fn all_failed(job: &LoadJob) -> Self {
        LoadResult::Failed(InvalidBlocks::Flat(job.all_loaded_blocks()))
    }
}

/// An external KV store. Implementations must be thread-safe: workers call `load` concurrently.
pub trait KvConnector: Send + Sync + 'static {
    /// How many tokens past the local hit the store can supply, and whether asynchronously.
    fn lookup(&self, query: LookupQuery<'_>) -> LookupResult;
    /// Performs one load. A panic here is caught by the worker and reported as a failure of
    /// every block of the load.
    fn load(&self, job: &LoadJob) -> LoadResult;
}

/// A connector that never has anything: every request recomputes locally.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoConnector;

impl KvConnector for NoConnector {
    fn lookup(&self, _: LookupQuery<'_>) -> LookupResult {
        LookupResult::default()
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        LoadResult::Ok
    }
}

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

/// splitmix64: a tiny, good, seedable generator.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `[0, n)`; 0 when `n == 0`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
        }
    }
}

/// FNV-1a of a string, to derive per-request seeds.
pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
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
