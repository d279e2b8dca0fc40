//! How a shard reaches the state it shares with the other shards — the block pool and the
//! claim table — as a strategy its step code plugs into.
//!
//! A [`Shard`](super::Shard) is generic over a [`Strategy`]; every decision, every phase and
//! every piece of request state is the shard's own code, and the strategy says only how the
//! shared blocks and claims are synchronised. [`LockFree`] is the runtime's: the lock-free
//! [`BlockPool`] and the atomic [`ClaimTable`], shared by shards stepping in parallel. The
//! mutex baseline of `kvsched stress --baseline mutex` plugs in plain, unsynchronised ones
//! (a free list, a hash map, plain claim words) and runs the one shard under one global lock,
//! so the two differ only in how they synchronise. The shard's methods are monomorphised per
//! strategy: the runtime's step calls the pool and the claim table directly, as before.
//!
//! # Contract
//!
//! A strategy's pool and claims behave as the runtime's do seen from one thread, operation by
//! operation — the same allocation order (a stack of free blocks, then cached blocks reclaimed
//! with the pool's second chance), the same prefix-cache hits, the least key winning a claim.
//! That is what lets one shard and the baseline make the same decisions at every step.

use crate::connector::LoadJob;
use crate::pool::{BlockHash, BlockPool, BlockRef, Generation, PoolError};
use crate::rules::geometry::BlockId;
use crate::runtime::claim::{ClaimTable, RequestKey, Scan};
use crate::sync::Arc;

/// The shared state a shard's step works on, by type: the pool and the claim table.
pub trait Strategy {
    /// The block pool and prefix cache.
    type Pool: Pool;
    /// The claim words and pending-recompute marks.
    type Claims: Claims;
}

/// The block pool and prefix cache as a shard uses them (the meaning of each method is
/// [`BlockPool`]'s method of the same name).
pub trait Pool {
    /// Blocks in the pool, the null block included.
    fn num_blocks(&self) -> usize;
    /// Whether `hash` is in the prefix cache (a hint).
    fn contains_hash(&self, hash: BlockHash) -> bool;
    /// A prefix-cache hit on `hash`, referenced.
    fn lookup(&self, hash: BlockHash) -> Option<BlockRef>;
    /// Blocks an allocation could take now (a hint while other threads mutate the pool).
    fn allocatable(&self) -> usize;
    /// `n` fresh blocks appended to `out`, all or nothing.
    fn allocate_n(&self, n: usize, out: &mut Vec<BlockRef>) -> bool;
    /// Drops one reference to `r`.
    fn release(&self, r: BlockRef) -> Result<(), PoolError>;
    /// Drops one reference to each block of a table, `(ids[i], generations[i])`, skipping
    /// `null`; refusals are ignored, as a release of a block the caller holds cannot fail.
    fn release_table(&self, ids: &[BlockId], generations: &[Generation], null: BlockId) {
        for (&id, &generation) in ids.iter().zip(generations) {
            if id != null {
                let _ = self.release(BlockRef { id, generation });
            }
        }
    }
    /// Enters `r` in the prefix cache under `hash`.
    fn register(&self, hash: BlockHash, r: BlockRef) -> bool;
    /// Enters each `(hash, r)` in the prefix cache, as `register` on each in turn would.
    fn register_all(&self, entries: &[(BlockHash, BlockRef)]) {
        for &(hash, r) in entries {
            self.register(hash, r);
        }
    }
    /// Takes block `id` out of the prefix cache.
    fn evict(&self, id: BlockId) -> bool;
    /// Whether `r` names the block's current generation.
    fn is_current(&self, r: BlockRef) -> bool;
    /// The current generation of block `id`.
    fn generation(&self, id: BlockId) -> Option<Generation>;
    /// References held on block `id`.
    fn ref_count(&self, id: BlockId) -> u32;
    /// Marks the destinations of an asynchronous load `job` as owned by it, and gives the job
    /// what its writer checks (`LoadJob::may_write`); a strategy without fill flags does
    /// nothing.
    fn guard_fills(&self, job: &mut LoadJob);
    /// Ends a load's ownership of destination `r`.
    fn end_fill(&self, r: BlockRef) -> Result<(), PoolError>;
}

/// The claim words and pending-recompute marks as a shard uses them (the meaning of each
/// method is [`ClaimTable`]'s method of the same name).
pub trait Claims {
    /// Clears both claim words of `id`.
    fn reset(&self, id: BlockId);
    /// Offers `key` for `id` in `scan`; the least key wins.
    fn claim(&self, id: BlockId, scan: Scan, key: RequestKey);
    /// The winning key of `id` in `scan`.
    fn winner(&self, id: BlockId, scan: Scan) -> Option<RequestKey>;
    /// Marks `id` as awaiting recompute by `owner`.
    fn set_pending(&self, id: BlockId, owner: RequestKey);
    /// Marks `id` as orphaned if `owner` still owns it.
    fn orphan(&self, id: BlockId, owner: RequestKey);
    /// Clears `owner`'s mark on `id`.
    fn clear_pending(&self, id: BlockId, owner: RequestKey) -> bool;
    /// Clears any mark on `id`.
    fn forget(&self, id: BlockId);
    /// Who must recompute `id` first (raw key), if anyone.
    fn pending_owner(&self, id: BlockId) -> Option<u64>;
}

/// The runtime's strategy: the lock-free pool and the atomic claim table, shared by every
/// shard of a step.
#[derive(Debug, Default)]
pub struct LockFree;

impl Strategy for LockFree {
    type Pool = Arc<BlockPool>;
    type Claims = ClaimTable;
}

impl Pool for Arc<BlockPool> {
    #[inline]
    fn num_blocks(&self) -> usize {
        BlockPool::num_blocks(self)
    }
    #[inline]
    fn contains_hash(&self, hash: BlockHash) -> bool {
        BlockPool::contains_hash(self, hash)
    }
    #[inline]
    fn lookup(&self, hash: BlockHash) -> Option<BlockRef> {
        BlockPool::lookup(self, hash)
    }
    #[inline]
    fn allocatable(&self) -> usize {
        BlockPool::allocatable(self)
    }
    #[inline]
    fn allocate_n(&self, n: usize, out: &mut Vec<BlockRef>) -> bool {
        BlockPool::allocate_n(self, n, out)
    }
    #[inline]
    fn release(&self, r: BlockRef) -> Result<(), PoolError> {
        BlockPool::release(self, r)
    }
    #[inline]
    fn release_table(&self, ids: &[BlockId], generations: &[Generation], null: BlockId) {
        BlockPool::release_each(self, ids, generations, null);
    }
    #[inline]
    fn register(&self, hash: BlockHash, r: BlockRef) -> bool {
        BlockPool::register(self, hash, r)
    }
    #[inline]
    fn register_all(&self, entries: &[(BlockHash, BlockRef)]) {
        BlockPool::register_all(self, entries)
    }
    #[inline]
    fn evict(&self, id: BlockId) -> bool {
        BlockPool::evict(self, id)
    }
    #[inline]
    fn is_current(&self, r: BlockRef) -> bool {
        BlockPool::is_current(self, r)
    }
    #[inline]
    fn generation(&self, id: BlockId) -> Option<Generation> {
        BlockPool::generation(self, id)
    }
    #[inline]
    fn ref_count(&self, id: BlockId) -> u32 {
        BlockPool::ref_count(self, id)
    }
    #[inline]
    fn guard_fills(&self, job: &mut LoadJob) {
        // The load owns its destinations' bytes until its completion is applied.
        for g in 0..job.block_tables.len() {
            for b in job.loaded_blocks(g) {
                let began = self.begin_fill(b);
                debug_assert!(began.is_ok(), "fresh destination {b:?}: {began:?}");
            }
        }
        job.fill = Some(Arc::clone(self));
    }
    #[inline]
    fn end_fill(&self, r: BlockRef) -> Result<(), PoolError> {
        BlockPool::end_fill(self, r)
    }
}

impl Claims for ClaimTable {
    #[inline]
    fn reset(&self, id: BlockId) {
        ClaimTable::reset(self, id)
    }
    #[inline]
    fn claim(&self, id: BlockId, scan: Scan, key: RequestKey) {
        ClaimTable::claim(self, id, scan, key)
    }
    #[inline]
    fn winner(&self, id: BlockId, scan: Scan) -> Option<RequestKey> {
        ClaimTable::winner(self, id, scan)
    }
    #[inline]
    fn set_pending(&self, id: BlockId, owner: RequestKey) {
        ClaimTable::set_pending(self, id, owner)
    }
    #[inline]
    fn orphan(&self, id: BlockId, owner: RequestKey) {
        ClaimTable::orphan(self, id, owner)
    }
    #[inline]
    fn clear_pending(&self, id: BlockId, owner: RequestKey) -> bool {
        ClaimTable::clear_pending(self, id, owner)
    }
    #[inline]
    fn forget(&self, id: BlockId) {
        ClaimTable::forget(self, id)
    }
    #[inline]
    fn pending_owner(&self, id: BlockId) -> Option<u64> {
        ClaimTable::pending_owner(self, id)
    }
}
