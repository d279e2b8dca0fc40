//! The KV connector: what an engine plugs in to supply leading tokens from an external store
//! (CPU memory, SSD, a remote cache). The data plane's connector, joining a tier to KV memory,
//! is [`TierConnector`](crate::kv::TierConnector); a simulated one is in `kvsched-testkit`.
//!
//! A connector has two sides: [`KvConnector::lookup`], called by the scheduler at admission to
//! learn how many tokens past the local prefix-cache hit it can supply and whether the load is
//! asynchronous; and [`KvConnector::load`], run by a worker thread (async loads) or by the
//! engine during the step (sync loads), returning success or the blocks that failed.

use crate::pool::{BlockPool, BlockRef};
use crate::rules::geometry::CacheGroup;
use crate::sync::Arc;

mod cancel;

pub use cancel::CancelToken;

/// What a connector derived from a request's prompt when the request was submitted
/// ([`KvConnector::prepare`]), handed back to its lookups ([`LookupQuery::prepared`]).
pub type Prepared = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// What the scheduler asks at admission.
#[derive(Clone, Copy, Debug)]
pub struct LookupQuery<'a> {
    /// The request id.
    pub request: &'a str,
    /// The prompt's tokens.
    pub prompt: &'a [u32],
    /// Leading tokens already available from the local prefix cache.
    pub local_tokens: u64,
    /// What [`KvConnector::prepare`] returned for this request's prompt, until the request
    /// is first admitted (`None` for a prompt it prepared nothing for, and for a request
    /// looked up again after a restart: a lookup must not depend on it being there).
    pub prepared: Option<&'a (dyn std::any::Any + Send + Sync)>,
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
///
/// # Who may write what
///
/// A load writes only its destination blocks: the non-null entries of `block_tables` that
/// overlap `[start_tokens, end_tokens)` ([`loaded_blocks`](Self::loaded_blocks)). For an
/// asynchronous load the runtime marks each destination as owned by the load until it applies
/// the load's completion; [`may_write`](Self::may_write) is the check a connector makes before
/// writing a block's bytes, and it fails for anything else. A destination is never handed to
/// another request before the load's completion is applied, even when its deadline passed.
#[derive(Clone, Debug)]
pub struct LoadJob {
    /// The request id.
    pub request: std::sync::Arc<str>,
    /// The request's tokens (its prompt): what a store keyed by prefix derives its keys from.
    pub tokens: std::sync::Arc<[u32]>,
    /// Fired by the runtime when it stops waiting for this load (deadline passed, request
    /// ended, shutdown): a cooperative connector stops early. Its result is then ignored.
    pub cancel: CancelToken,
    /// The pool whose fill flags guard the destinations of an asynchronous load (`None` for
    /// sync loads and jobs built outside a runtime).
    pub(crate) fill: Option<Arc<BlockPool>>,
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
    /// A job outside any runtime (for testing a connector): no deadline, owned by nobody,
    /// its destinations unguarded.
    pub fn new(
        request: &str,
        tokens: &[u32],
        start_tokens: u64,
        end_tokens: u64,
        block_tables: Vec<Vec<BlockRef>>,
        block_sizes: Vec<u64>,
    ) -> LoadJob {
        LoadJob {
            request: request.into(),
            tokens: tokens.into(),
            cancel: CancelToken::new(),
            fill: None,
            owner: LoadOwner { shard: 0, key: 0 },
            attempt: 0,
            start_tokens,
            end_tokens,
            block_tables,
            block_sizes,
            deadline: None,
        }
    }

    /// Entries `[lo, hi)` of group `g`'s table that the load fills.
    pub fn loaded_range(&self, g: usize) -> std::ops::Range<usize> {
        let b = self.block_sizes.get(g).copied().unwrap_or(1).max(1);
        let len = self.block_tables.get(g).map_or(0, Vec::len);
        let lo = usize::try_from(self.start_tokens / b)
            .unwrap_or(usize::MAX)
            .min(len);
        let hi = usize::try_from(self.end_tokens.div_ceil(b))
            .unwrap_or(usize::MAX)
            .min(len);
        lo..hi.max(lo)
    }

    /// The destination at entry `index` of group `g` if this load may write its bytes now:
    /// the entry is in the loaded range and not null, and — for an asynchronous load — the
    /// pool still marks the block as owned by this load. `None` otherwise: write nothing.
    pub fn may_write(&self, g: usize, index: usize) -> Option<BlockRef> {
        if !self.loaded_range(g).contains(&index) {
            return None;
        }
        let r = *self.block_tables.get(g)?.get(index)?;
        if r.id == 0 {
            return None;
        }
        match &self.fill {
            Some(pool) if !pool.is_filling(r) => None,
            _ => Some(r),
        }
    }

    /// The non-null blocks of group `g` that overlap `[start_tokens, end_tokens)`.
    pub fn loaded_blocks(&self, g: usize) -> impl Iterator<Item = BlockRef> + '_ {
        let range = self.loaded_range(g);
        self.block_tables
            .get(g)
            .into_iter()
            .flat_map(move |t| t[range.clone()].iter())
            .filter(|r| r.id != 0)
            .copied()
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
    /// These blocks hold garbage. Only the load's own blocks count (another id is a foreign
    /// block, ignored); a failure naming none of them, an empty list included, fails every
    /// block the load writes.
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
    ///
    /// Called inside a step, on the thread running it (the engine thread or a shard
    /// thread), for each request the step admits: it must answer from what the connector
    /// already knows and never wait for a store, since a step waits for it as long as it
    /// takes (`TierConnector`'s answers from its key index). A panic here is caught: the
    /// request is offered nothing and recomputes (`Metrics::lookup_panics`).
    fn lookup(&self, query: LookupQuery<'_>) -> LookupResult;
    /// Work on a request's prompt that every lookup of it would repeat (the keys its chunks
    /// are stored under, say), done once when the request is submitted, on the submitting
    /// thread, so that no step pays for it. The runtime hands the result to the request's
    /// lookups until it is admitted ([`LookupQuery::prepared`]) and drops it then. A panic
    /// here is caught and counted in `Metrics::connector_panics`, and the request goes on
    /// unprepared. A panic of the value's `Drop` is caught wherever the runtime drops it,
    /// and counted there too when that is at the request's admission (not when a cancel, a
    /// refused submit or shutdown drops it). The default prepares nothing.
    fn prepare(&self, request: &str, prompt: &[u32]) -> Option<Prepared> {
        let _ = (request, prompt);
        None
    }
    /// Performs one load. A panic here is caught by the worker and reported as a failure of
    /// every block of the load (a payload whose own `Drop` panics too: the worker lives on).
    ///
    /// Every write into a destination happens before this returns, each after
    /// [`LoadJob::may_write`] allowed it: the blocks become readable once the completion is
    /// applied, so a write after the return (even one `may_write` allows, as the blocks are
    /// still this load's until then) could change bytes a reader already takes as loaded.
    fn load(&self, job: &LoadJob) -> LoadResult;
    /// The cache groups a connector built for one geometry writes, in order, with the
    /// scheduler block size `S` its lookups offer multiples of (`TierConnector`'s). The
    /// runtime refuses to start with a connector whose geometry differs from its own
    /// ([`RuntimeError::Config`](crate::RuntimeError::Config) naming `connector`): its loads
    /// would write each group's blocks at another size than the engine reads them, and its
    /// lookups offer ranges the runtime's rules do not align to. The default, `None`, is a
    /// connector that takes the geometry of the jobs it is given.
    fn geometry(&self) -> Option<(&[CacheGroup], u64)> {
        None
    }
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
