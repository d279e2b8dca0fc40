//! The baseline's block allocator and prefix cache: plain reference counts, a free list, a
//! queue of cached unreferenced blocks to reclaim and a hash map from block hash to block —
//! the [`Pool`] of the baseline's strategy, unsynchronised (it lives behind the global lock;
//! a `RefCell` gives the shard's `&self` calls their one mutable borrow at a time).
//!
//! The same allocation rules as the runtime's pool, so both reclaim the same cached blocks:
//! the free list is a stack (ids in increasing order at first), and the reclaim queue is
//! consumed with the pool's second-chance rule — a block released again after its queue
//! entry was pushed (revived by a prefix hit meanwhile) is *touched* and goes to the back
//! once before it is reclaimed.

use std::cell::RefCell;
use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use kvsched::connector::LoadJob;
use kvsched::pool::{BlockHash, BlockRef, Census, Generation, PoolError};
use kvsched::rules::geometry::{BlockId, DEFAULT_NULL_BLOCK};
use kvsched::runtime::shard::strategy::Pool;

/// The block allocator and prefix cache behind the global lock.
pub(super) struct Blocks(RefCell<Plain>);

/// Plain counters, a free list and a hash map.
struct Plain {
    ref_count: Vec<u32>,
    generation: Vec<Generation>,
    hash_of: Vec<Option<u64>>,
    queued: Vec<bool>,
    /// Released again after its queue entry was pushed: a second chance when popped.
    touched: Vec<bool>,
    free: Vec<BlockId>,
    /// Cached, unreferenced blocks in release order (entries checked when popped).
    reclaim: VecDeque<BlockId>,
    index: FxHashMap<u64, BlockId>,
    /// Blocks with count 0 (free, or cached and unreferenced).
    allocatable: usize,
    double_frees: u64,
}

impl Blocks {
    /// `n` blocks, the null block included, every one free.
    pub(super) fn new(n: usize) -> Self {
        Blocks(RefCell::new(Plain::new(n)))
    }

    /// Where every block is.
    pub(super) fn census(&self) -> Census {
        self.0.borrow().census()
    }

    /// Blocks on the free list.
    pub(super) fn free_len(&self) -> usize {
        self.0.borrow().free.len()
    }

    /// Releases of a block nobody held.
    pub(super) fn double_frees(&self) -> u64 {
        self.0.borrow().double_frees
    }
}

impl Pool for Blocks {
    fn num_blocks(&self) -> usize {
        self.0.borrow().ref_count.len()
    }
    fn contains_hash(&self, hash: BlockHash) -> bool {
        self.0.borrow().index.contains_key(&hash)
    }
    fn lookup(&self, hash: BlockHash) -> Option<BlockRef> {
        self.0.borrow_mut().lookup(hash)
    }
    fn allocatable(&self) -> usize {
        self.0.borrow().allocatable
    }
    fn allocate_n(&self, n: usize, out: &mut Vec<BlockRef>) -> bool {
        self.0.borrow_mut().allocate_n(n, out)
    }
    fn release(&self, r: BlockRef) -> Result<(), PoolError> {
        self.0.borrow_mut().release(r);
        Ok(())
    }
    fn register(&self, hash: BlockHash, r: BlockRef) -> bool {
        self.0.borrow_mut().register(hash, r)
    }
    fn evict(&self, id: BlockId) -> bool {
        self.0.borrow_mut().evict(id)
    }
    fn is_current(&self, r: BlockRef) -> bool {
        self.0.borrow().is_current(r)
    }
    fn generation(&self, id: BlockId) -> Option<Generation> {
        self.0.borrow().generation.get(id as usize).copied()
    }
    fn ref_count(&self, id: BlockId) -> u32 {
        self.0
            .borrow()
            .ref_count
            .get(id as usize)
            .copied()
            .unwrap_or(0)
    }
    /// The baseline keeps no fill flags: its loads' destinations are unguarded (as a job
    /// built outside a runtime).
    fn guard_fills(&self, _job: &mut LoadJob) {}
    fn end_fill(&self, _r: BlockRef) -> Result<(), PoolError> {
        Ok(())
    }
}

impl Plain {
    fn new(n: usize) -> Self {
        Plain {
            ref_count: vec![0; n],
            generation: vec![0; n],
            hash_of: vec![None; n],
            queued: vec![false; n],
            touched: vec![false; n],
            free: (1..n as BlockId).rev().collect(),
            // Sized up front, as the runtime's pool sizes its prefix index.
            reclaim: VecDeque::with_capacity(n),
            index: FxHashMap::with_capacity_and_hasher(n, Default::default()),
            allocatable: n.saturating_sub(1),
            double_frees: 0,
        }
    }
    fn is_current(&self, r: BlockRef) -> bool {
        r.id != DEFAULT_NULL_BLOCK && self.generation.get(r.id as usize) == Some(&r.generation)
    }
    fn allocate(&mut self) -> Option<BlockRef> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => loop {
                let id = self.reclaim.pop_front()?;
                let i = id as usize;
                if self.ref_count[i] == 0 && self.hash_of[i].is_some() {
                    // Planted bug `baseline-no-second-chance` (scripts/plants.sh): a block
                    // revived by a prefix hit is reclaimed without its second chance.
                    let second_chance = !cfg!(kvsched_plant = "baseline-no-second-chance");
                    if std::mem::take(&mut self.touched[i]) && second_chance {
                        self.reclaim.push_back(id); // its second chance
                        continue;
                    }
                    self.queued[i] = false;
                    if let Some(h) = self.hash_of[i].take() {
                        self.index.remove(&h);
                    }
                    break id;
                }
                self.queued[i] = false;
                self.touched[i] = false;
            },
        };
        let i = id as usize;
        self.touched[i] = false;
        self.generation[i] = self.generation[i].wrapping_add(1);
        self.ref_count[i] = 1;
        self.allocatable -= 1;
        Some(BlockRef {
            id,
            generation: self.generation[i],
        })
    }
    /// Allocates `n` blocks, all or nothing (as the pool: more than the usable blocks fails
    /// at once, touching nothing).
    fn allocate_n(&mut self, n: usize, out: &mut Vec<BlockRef>) -> bool {
        if n >= self.ref_count.len() {
            return false;
        }
        let start = out.len();
        for _ in 0..n {
            match self.allocate() {
                Some(b) => out.push(b),
                None => {
                    for b in out.drain(start..) {
                        self.release(b);
                    }
                    return false;
                }
            }
        }
        true
    }
    fn release(&mut self, r: BlockRef) {
        if !self.is_current(r) {
            return;
        }
        let i = r.id as usize;
        if self.ref_count[i] == 0 {
            self.double_frees += 1;
            return;
        }
        self.ref_count[i] -= 1;
        if self.ref_count[i] == 0 {
            self.allocatable += 1;
            if self.hash_of[i].is_some() {
                if self.queued[i] {
                    self.touched[i] = true;
                } else {
                    self.queued[i] = true;
                    self.reclaim.push_back(r.id);
                }
            } else {
                self.free.push(r.id);
            }
        }
    }
    fn register(&mut self, hash: u64, r: BlockRef) -> bool {
        let i = r.id as usize;
        if !self.is_current(r) || self.hash_of[i].is_some() || self.index.contains_key(&hash) {
            return false;
        }
        self.index.insert(hash, r.id);
        self.hash_of[i] = Some(hash);
        true
    }
    fn lookup(&mut self, hash: u64) -> Option<BlockRef> {
        let id = *self.index.get(&hash)?;
        let i = id as usize;
        if self.ref_count[i] == 0 {
            self.allocatable -= 1;
        }
        self.ref_count[i] += 1;
        Some(BlockRef {
            id,
            generation: self.generation[i],
        })
    }
    fn evict(&mut self, id: BlockId) -> bool {
        let i = id as usize;
        let Some(h) = self.hash_of.get_mut(i).and_then(Option::take) else {
            return false;
        };
        self.index.remove(&h);
        if self.ref_count[i] == 0 {
            self.free.push(id);
        }
        true
    }
    fn census(&self) -> Census {
        let mut c = Census {
            total: self.ref_count.len(),
            null: 1,
            ..Census::default()
        };
        for i in 1..self.ref_count.len() {
            match (self.ref_count[i], self.hash_of[i].is_some()) {
                (0, false) => c.free += 1,
                (0, true) => c.cached_unreferenced += 1,
                _ => c.referenced += 1,
            }
        }
        c
    }
}
