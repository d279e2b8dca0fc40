//! The KV connector: what an engine plugs in to supply leading tokens from an external store
//! (CPU memory, SSD, a remote cache), and a seeded simulated connector for tests, examples and
//! the stress tool.
//!
//! A connector has two sides: [`KvConnector::lookup`], called by the scheduler at admission to
//! learn how many tokens past the local prefix-cache hit it can supply and whether the load is
//! asynchronous; and [`KvConnector::load`], run by a worker thread (async loads) or by the
//! engine during the step (sync loads), returning success or the blocks that failed.

use crate::pool::BlockRef;

mod cancel;
mod sim;

pub use cancel::CancelToken;

pub use crate::rng::SplitMix64;
pub use sim::{SimConfig, SimConnector, SimulatedPanic};

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
    /// Who gets the completion: the owning shard and the request's key there (the runtime's
    /// business, opaque to a connector).
    pub(crate) owner: LoadOwner,
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

/// The shard and request key a load's completion is routed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LoadOwner {
    /// The shard that owns the request.
    pub shard: usize,
    /// The request's canonical key, packed.
    pub key: u64,
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
