//! A request that ends, restarts or is preempted releases its blocks and hands off the ones
//! it owned (claimed to recompute) only when another request still holds them. In a parallel
//! step the other shards allocate from the same free list while this one releases, so a block
//! freed here can be in another request's table before this shard looks at it again: whether
//! someone else holds an owned block must be known before the release, not read after it.
//!
//! [`TakenAtOnce`] makes that interleaving certain, on one thread: each block whose last
//! reference goes is allocated at once by a stand-in for another shard. The shard's own step
//! code runs on it unchanged (a [`Strategy`] only says how the shared pool is reached).
//! Planted bug `handoff-count-after-release` (scripts/plants.sh) reads the count after the
//! release, and the first test catches it.

use std::cell::RefCell;
use std::sync::Arc as StdArc;
use std::time::Instant;

use super::strategy::{Pool, Strategy};
use super::{Command, Env, NewRequest, Shard, ShardStepResult, StepSettings};
use crate::connector::{
    InvalidBlocks, KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult,
};
use crate::pool::{BlockHash, BlockPool, BlockRef, Generation, PoolError};
use crate::rules::geometry::{BlockId, CacheGroup, Geometry};
use crate::rules::recovery::{Disposition, InvalidSet};
use crate::runtime::claim::{ClaimTable, RequestKey};
use crate::runtime::handle::SubmitRequest;
use crate::runtime::load_estimate::LoadEstimate;
use crate::runtime::quarantine::Quarantine;
use crate::runtime::settings::Settings;
use crate::runtime::worker::Completion;
use crate::sync::Arc;

/// The runtime's pool, with another shard that allocates every block the moment it is freed.
struct TakenAtOnce {
    pool: Arc<BlockPool>,
    /// The blocks the other shard took (and holds).
    taken: RefCell<Vec<BlockRef>>,
}

impl Pool for TakenAtOnce {
    fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }
    fn contains_hash(&self, hash: BlockHash) -> bool {
        self.pool.contains_hash(hash)
    }
    fn lookup(&self, hash: BlockHash) -> Option<BlockRef> {
        self.pool.lookup(hash)
    }
    fn allocatable(&self) -> usize {
        self.pool.allocatable()
    }
    fn allocate_n(&self, n: usize, out: &mut Vec<BlockRef>) -> bool {
        self.pool.allocate_n(n, out)
    }
    fn release(&self, r: BlockRef) -> Result<(), PoolError> {
        self.pool.release(r)?;
        if self.pool.ref_count(r.id) == 0 && !self.pool.is_cached(r.id) {
            // The free list is a stack: the other shard's next allocation is this block.
            self.taken.borrow_mut().extend(self.pool.allocate());
        }
        Ok(())
    }
    fn register(&self, hash: BlockHash, r: BlockRef) -> bool {
        self.pool.register(hash, r)
    }
    fn evict(&self, id: BlockId) -> bool {
        self.pool.evict(id)
    }
    fn is_current(&self, r: BlockRef) -> bool {
        self.pool.is_current(r)
    }
    fn generation(&self, id: BlockId) -> Option<Generation> {
        self.pool.generation(id)
    }
    fn ref_count(&self, id: BlockId) -> u32 {
        self.pool.ref_count(id)
    }
    fn guard_fills(&self, job: &mut LoadJob) {
        Pool::guard_fills(&self.pool, job)
    }
    fn end_fill(&self, r: BlockRef) -> Result<(), PoolError> {
        self.pool.end_fill(r)
    }
}

struct Interleaved;

impl Strategy for Interleaved {
    type Pool = TakenAtOnce;
    type Claims = ClaimTable;
}

/// Offers every prompt but its last block, loaded asynchronously (the test answers the load).
pub(super) struct AsyncOffer;

impl KvConnector for AsyncOffer {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let held = (q.prompt.len() as u64 - 1) / 16 * 16;
        LookupResult {
            external_tokens: held.saturating_sub(q.local_tokens),
            load_async: true,
        }
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        LoadResult::Ok
    }
}

const BLOCKS: usize = 64;

/// One step of `shard`: commands and completions, the report's claims, then the rest.
fn step(
    shard: &mut Shard<Interleaved>,
    env: &Env<'_, Interleaved>,
    settings: &StepSettings,
    commands: Vec<Command>,
    completions: Vec<Completion>,
    loads: &mut Vec<LoadJob>,
) -> ShardStepResult {
    let now = Instant::now();
    let ids = shard.publish(env, settings, now, commands, completions);
    if !ids.is_empty() {
        let report = InvalidSet::flat(ids.iter().copied(), env.geo);
        shard.claim(env, settings, &report, &ids);
    }
    let mut res = ShardStepResult::default();
    shard.finish_step(env, settings, now, false, loads, &mut res);
    res
}

/// A request's async load fails at its first block, so recovery restarts it from 0 and it
/// releases everything while owning that block. `sharer` makes another request hold the
/// failed block too. Returns the step's result, the failed block and the blocks the other
/// shard took as they were freed, and the failed block's pending mark after the step.
fn restart_owner(sharer: bool) -> (ShardStepResult, BlockRef, Vec<BlockRef>, Option<u64>) {
    let geo = Geometry::new(vec![CacheGroup::full_attention(16)], None, 0).expect("geometry");
    let pool = TakenAtOnce {
        pool: Arc::new(BlockPool::new(BLOCKS).expect("pool")),
        taken: RefCell::new(Vec::new()),
    };
    let claims = ClaimTable::new(BLOCKS);
    let (quarantine, estimate) = (Quarantine::default(), LoadEstimate::default());
    let env = Env {
        geo: &geo,
        pool: &pool,
        claims: &claims,
        connector: &AsyncOffer,
        quarantine: &quarantine,
        estimate: &estimate,
        shard: 0,
        shards: 1,
    };
    let settings = StepSettings::new(&Settings::default(), 1 << 20, 8, false);
    let mut shard = Shard::<Interleaved>::for_blocks(BLOCKS);
    let req = SubmitRequest {
        id: "r".into(),
        prompt: (0..80).collect(),
        max_new_tokens: 4,
        priority: 0,
        load_deadline: None,
    };
    let new = NewRequest::new(&geo, req, StdArc::from("r"), RequestKey::new(false, 0, 1));
    let mut loads = Vec::new();
    step(
        &mut shard,
        &env,
        &settings,
        vec![Command::Submit(Box::new(new))],
        vec![],
        &mut loads,
    );
    let job = loads.pop().expect("an async load");
    let first = job.all_loaded_blocks()[0];
    if sharer {
        pool.pool.retain(first).expect("a second holder");
    }
    let failed = Completion {
        key: RequestKey::from_raw(job.owner.key),
        attempt: job.attempt,
        result: LoadResult::Failed(InvalidBlocks::Flat(vec![first])),
        panicked: false,
        started_at: Instant::now(),
        finished_at: Instant::now(),
    };
    let res = step(
        &mut shard,
        &env,
        &settings,
        vec![],
        vec![failed],
        &mut loads,
    );
    let decided = res.recovered.first().map(|r| &r.decision);
    assert!(
        decided.is_some_and(|d| d.disposition == Disposition::FailedRecving
            && d.num_computed_tokens == 0
            && d.claimed_blocks == [first.id]),
        "the load's owner restarts from 0 owning the failed block: {decided:?}"
    );
    let taken = pool.taken.borrow().clone();
    (res, first, taken, claims.pending_owner(first.id))
}

#[test]
fn a_freed_owned_block_another_shard_took_is_not_handed_off() {
    let (res, first, taken, pending) = restart_owner(false);
    // The interleaving happened: the failed block is in the other shard's hands.
    assert!(taken.iter().any(|b| b.id == first.id), "{taken:?}");
    assert!(res.handoffs.is_empty(), "{:?}", res.handoffs);
    assert_eq!(res.counters.handoffs, 0);
    // Its owner's mark is gone with it: a later sharer of the block's new contents would
    // otherwise wait for a recompute nobody owns.
    assert_eq!(pending, None, "the freed block keeps no pending mark");
}

#[test]
fn an_owned_block_another_request_holds_is_handed_off() {
    let (res, first, taken, pending) = restart_owner(true);
    assert!(taken.iter().all(|b| b.id != first.id), "{taken:?}");
    assert_eq!(res.handoffs, [first]);
    assert_eq!(res.counters.handoffs, 1);
    // Orphaned until the next step re-claims it: nobody reads it meanwhile.
    assert_eq!(pending, Some(crate::runtime::claim::ORPHANED));
}
