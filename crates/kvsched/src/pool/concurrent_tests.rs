//! Multi-threaded stress of the block pool (docs/runtime.md): allocate / retain / release / register /
//! lookup / evict from several threads on a small pool, checking that
//!
//! * no block is ever held by two exclusive owners at once (each thread tags the slots it
//!   allocated in a shared owner array), and every allocation of a slot has a newer
//!   generation than the one before;
//! * a prefix hit is the block registered under that hash (a shared content array holds the
//!   hash each block was filled with), at its current generation, with no exclusive owner;
//! * at the end the census is conserved, nothing is referenced, no double free or stale
//!   release was reported for this correct program, and every usable block can be allocated
//!   again (nothing leaked off the free list or the reclaim queue).
//!
//! Seeded: `POOL_STRESS_SEED=<u64>` replays a run; `POOL_STRESS_ROUNDS=<n>` runs more rounds.

// The checker's own bookkeeping (owner and content tags, counters, the violation list) uses
// std's atomics and locks directly, all SeqCst: it pairs with nothing in the pool and is not
// what is being checked. (It stays out of loom builds, where `crate::sync` is loom's.)
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::thread;

use crate::pool::{BlockHash, BlockPool, BlockRef};

const THREADS: usize = 4;
/// Slots including the null block: small, so allocation often reclaims and blocks are reused.
const BLOCKS: usize = 17;
/// Distinct prefix hashes: few, so lookups hit and registrations collide.
const HASHES: u64 = 24;
const OPS_PER_THREAD: usize = 40_000;
/// A thread holds at most this many references.
const MAX_HELD: usize = 6;
/// Content marker bit for blocks that were never registered (never collides with a hash).
const PRIVATE: u64 = 1 << 63;

/// SplitMix64: small, seeded, good enough for choosing operations.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Clone, Copy, Debug)]
enum Hold {
    /// Allocated by this thread, never registered: this thread is the only holder.
    Exclusive { r: BlockRef, content: u64 },
    /// Registered (by anyone) under `hash`, or a prefix hit on it: shared, read-only.
    Shared { r: BlockRef, hash: BlockHash },
}

struct World {
    pool: BlockPool,
    /// `owner[id]`: the tag of the thread holding `id` exclusively, or 0.
    owner: Vec<AtomicU64>,
    /// `content[id]`: what the block holds — a hash once registered, else a private marker.
    content: Vec<AtomicU64>,
    /// `last_generation[id]`: the newest generation `id` was allocated at; every allocation
    /// must be newer, or a stale reference to the previous use would pass as current.
    last_generation: Vec<AtomicU64>,
    violations: Mutex<Vec<String>>,
    hits: AtomicU64,
    evictions: AtomicU64,
}

impl World {
    fn violation(&self, msg: String) {
        if let Ok(mut v) = self.violations.lock() {
            if v.len() < 20 {
                v.push(msg);
            }
        }
    }
}

fn tag(thread: usize, r: BlockRef) -> u64 {
    ((thread as u64 + 1) << 32) | u64::from(r.generation)
}

fn check_shared(w: &World, t: usize, r: BlockRef, hash: BlockHash, when: &str) {
    let id = r.id as usize;
    let owner = w.owner[id].load(SeqCst);
    if owner != 0 {
        w.violation(format!(
            "t{t} {when}: shared {r:?} has exclusive owner {owner:#x}"
        ));
    }
    let content = w.content[id].load(SeqCst);
    if content != hash {
        w.violation(format!(
            "t{t} {when}: {r:?} holds {content:#x}, expected hash {hash}"
        ));
    }
    if w.pool.generation(r.id) != Some(r.generation) || w.pool.ref_count(r.id) == 0 {
        w.violation(format!(
            "t{t} {when}: held {r:?} but slot is gen {:?} count {}",
            w.pool.generation(r.id),
            w.pool.ref_count(r.id)
        ));
    }
}

fn check_exclusive(w: &World, t: usize, r: BlockRef, content: u64, when: &str) {
    let id = r.id as usize;
    let owner = w.owner[id].load(SeqCst);
    let count = w.pool.ref_count(r.id);
    let seen = w.content[id].load(SeqCst);
    if owner != tag(t, r) || count != 1 || seen != content || w.pool.is_cached(r.id) {
        w.violation(format!(
            "t{t} {when}: exclusive {r:?}: owner {owner:#x} (want {:#x}), count {count}, \
             content {seen:#x} (want {content:#x}), cached {}",
            tag(t, r),
            w.pool.is_cached(r.id)
        ));
    }
}

fn release(w: &World, t: usize, h: Hold) {
    let r = match h {
        Hold::Exclusive { r, content } => {
            check_exclusive(w, t, r, content, "release");
            if w.owner[r.id as usize]
                .compare_exchange(tag(t, r), 0, SeqCst, SeqCst)
                .is_err()
            {
                w.violation(format!("t{t}: lost exclusive ownership of {r:?}"));
            }
            r
        }
        Hold::Shared { r, hash } => {
            check_shared(w, t, r, hash, "release");
            r
        }
    };
    if let Err(e) = w.pool.release(r) {
        w.violation(format!("t{t}: release({r:?}) failed: {e}"));
    }
}

fn worker(w: &World, t: usize, seed: u64) {
    let mut rng = Rng(seed ^ (t as u64).wrapping_mul(0xA076_1D64_78BD_642F));
    let mut held: Vec<Hold> = Vec::with_capacity(MAX_HELD + 1);
    let mut private = 0u64;
    for _ in 0..OPS_PER_THREAD {
        let op = rng.below(100);
        if held.len() >= MAX_HELD || (op < 30 && !held.is_empty()) {
            let i = rng.below(held.len() as u64) as usize;
            let h = held.swap_remove(i);
            release(w, t, h);
        } else if op < 50 {
            // Allocate: the block must come to us alone.
            let Some(r) = w.pool.allocate() else { continue };
            if w.owner[r.id as usize]
                .compare_exchange(0, tag(t, r), SeqCst, SeqCst)
                .is_err()
            {
                w.violation(format!(
                    "t{t}: allocated {r:?} already owned by {:#x}",
                    w.owner[r.id as usize].load(SeqCst)
                ));
            }
            let before =
                w.last_generation[r.id as usize].fetch_max(u64::from(r.generation), SeqCst);
            if before >= u64::from(r.generation) {
                w.violation(format!("t{t}: {r:?} reuses generation (last was {before})"));
            }
            if w.pool.ref_count(r.id) != 1 || w.pool.generation(r.id) != Some(r.generation) {
                w.violation(format!(
                    "t{t}: fresh {r:?} has count {}",
                    w.pool.ref_count(r.id)
                ));
            }
            private += 1;
            let content = PRIVATE | ((t as u64) << 40) | private;
            w.content[r.id as usize].store(content, SeqCst);
            held.push(Hold::Exclusive { r, content });
        } else if op < 65 {
            // Register one of our exclusive blocks.
            let Some(i) = held
                .iter()
                .position(|h| matches!(h, Hold::Exclusive { .. }))
            else {
                continue;
            };
            let Hold::Exclusive { r, content } = held[i] else {
                continue;
            };
            check_exclusive(w, t, r, content, "register");
            let hash = rng.below(HASHES);
            w.content[r.id as usize].store(hash, SeqCst);
            if w.owner[r.id as usize]
                .compare_exchange(tag(t, r), 0, SeqCst, SeqCst)
                .is_err()
            {
                w.violation(format!(
                    "t{t}: lost exclusive ownership of {r:?} before register"
                ));
            }
            if w.pool.register(hash, r) {
                held[i] = Hold::Shared { r, hash };
            } else {
                // Not cached, so still ours alone.
                if w.owner[r.id as usize]
                    .compare_exchange(0, tag(t, r), SeqCst, SeqCst)
                    .is_err()
                {
                    w.violation(format!("t{t}: {r:?} taken while its registration failed"));
                }
                held[i] = Hold::Exclusive { r, content: hash };
            }
        } else if op < 85 {
            let hash = rng.below(HASHES);
            if let Some(r) = w.pool.lookup(hash) {
                w.hits.fetch_add(1, SeqCst);
                check_shared(w, t, r, hash, "lookup");
                held.push(Hold::Shared { r, hash });
            }
        } else if op < 93 {
            // Retain a shared reference we hold.
            if let Some(&Hold::Shared { r, hash }) =
                held.iter().find(|h| matches!(h, Hold::Shared { .. }))
            {
                match w.pool.retain(r) {
                    Ok(()) => held.push(Hold::Shared { r, hash }),
                    Err(e) => w.violation(format!("t{t}: retain({r:?}) failed: {e}")),
                }
            }
        } else {
            // Evict any block, held by anyone or no one; counts must not move.
            let id = 1 + rng.below(BLOCKS as u64 - 1);
            if w.pool.evict(id) {
                w.evictions.fetch_add(1, SeqCst);
            }
        }
    }
    for h in held.drain(..) {
        release(w, t, h);
    }
}

fn run(seed: u64) {
    let pool = match BlockPool::new(BLOCKS) {
        Ok(p) => p,
        Err(e) => panic!("pool: {e}"),
    };
    let w = World {
        pool,
        owner: (0..BLOCKS).map(|_| AtomicU64::new(0)).collect(),
        content: (0..BLOCKS).map(|_| AtomicU64::new(0)).collect(),
        last_generation: (0..BLOCKS).map(|_| AtomicU64::new(0)).collect(),
        violations: Mutex::new(Vec::new()),
        hits: AtomicU64::new(0),
        evictions: AtomicU64::new(0),
    };
    thread::scope(|s| {
        for t in 0..THREADS {
            let w = &w;
            s.spawn(move || worker(w, t, seed));
        }
    });
    let violations = w.violations.lock().map(|v| v.clone()).unwrap_or_default();
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");

    let census = w.pool.census();
    eprintln!(
        "seed {seed}: {} prefix hits, {} evictions, end census {census:?}",
        w.hits.load(SeqCst),
        w.evictions.load(SeqCst)
    );
    assert!(census.conserved(), "seed {seed}: {census:?}");
    assert_eq!(census.referenced, 0, "seed {seed}: {census:?}");
    assert_eq!(
        w.pool.allocatable(),
        census.free + census.cached_unreferenced,
        "seed {seed}: {census:?}"
    );
    assert_eq!(w.pool.double_frees(), 0, "seed {seed}");
    assert_eq!(w.pool.stale_releases(), 0, "seed {seed}");
    assert_eq!(
        w.pool.invariant_violations(),
        0,
        "seed {seed}: free list corrupt"
    );
    assert!(
        w.hits.load(SeqCst) > 0,
        "seed {seed}: the run never hit the prefix cache"
    );

    // Nothing leaked: every usable block comes back exactly once, then the pool is empty.
    let mut all = Vec::new();
    assert!(
        w.pool.allocate_n(BLOCKS - 1, &mut all),
        "seed {seed}: leaked blocks"
    );
    let mut ids: Vec<u64> = all.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        BLOCKS - 1,
        "seed {seed}: a block was handed out twice"
    );
    assert_eq!(w.pool.allocate(), None, "seed {seed}");
    for r in all {
        assert_eq!(w.pool.release(r), Ok(()));
    }
    let census = w.pool.census();
    assert_eq!(
        (census.free, census.conserved(), w.pool.allocatable()),
        (BLOCKS - 1, true, BLOCKS - 1),
        "seed {seed}"
    );
}

#[test]
fn pool_stress_conserves_blocks_and_ownership() {
    let base: u64 = std::env::var("POOL_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_B10C);
    let rounds: u64 = std::env::var("POOL_STRESS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    for round in 0..rounds {
        run(base.wrapping_add(round));
    }
}

/// Free-list churn only: each thread repeatedly takes two blocks and gives back the first
/// one (pop A, pop B, push A — the ABA pattern a Treiber stack without a tag gets wrong when
/// another thread stalls between reading `next[A]` and its CAS).
#[test]
fn free_list_churn_never_double_allocates() {
    const SMALL: usize = 6;
    /// Long enough for the scheduler to preempt threads inside the pool's CAS windows.
    const RUN_FOR: std::time::Duration = std::time::Duration::from_millis(1500);
    let pool = match BlockPool::new(SMALL) {
        Ok(p) => p,
        Err(e) => panic!("pool: {e}"),
    };
    let owner: Vec<AtomicU64> = (0..SMALL).map(|_| AtomicU64::new(0)).collect();
    let violations = AtomicU64::new(0);
    let start = std::sync::Barrier::new(THREADS);
    thread::scope(|s| {
        for t in 0..THREADS {
            let (pool, owner, violations, start) = (&pool, &owner, &violations, &start);
            s.spawn(move || {
                start.wait();
                let deadline = std::time::Instant::now() + RUN_FOR;
                let mut held: Vec<BlockRef> = Vec::new();
                let take = |held: &mut Vec<BlockRef>| {
                    if let Some(r) = pool.allocate() {
                        if owner[r.id as usize]
                            .compare_exchange(0, tag(t, r), SeqCst, SeqCst)
                            .is_err()
                        {
                            violations.fetch_add(1, SeqCst);
                        }
                        held.push(r);
                    }
                };
                let give = |r: BlockRef| {
                    if owner[r.id as usize]
                        .compare_exchange(tag(t, r), 0, SeqCst, SeqCst)
                        .is_err()
                    {
                        violations.fetch_add(1, SeqCst);
                    }
                    if pool.release(r).is_err() {
                        violations.fetch_add(1, SeqCst);
                    }
                };
                while std::time::Instant::now() < deadline {
                    take(&mut held);
                    take(&mut held);
                    if !held.is_empty() {
                        give(held.remove(0));
                    }
                    while held.len() > 1 {
                        if let Some(r) = held.pop() {
                            give(r);
                        }
                    }
                }
                for r in held.drain(..) {
                    give(r);
                }
            });
        }
    });
    assert_eq!(
        violations.load(SeqCst),
        0,
        "a block had two owners (or a release failed)"
    );
    assert_eq!(pool.double_frees(), 0);
    assert_eq!(
        pool.invariant_violations(),
        0,
        "the free list yielded a slot that was not free"
    );
    let c = pool.census();
    assert_eq!((c.free, c.conserved()), (SMALL - 1, true), "{c:?}");
    assert_eq!(pool.allocatable(), SMALL - 1, "{c:?}");
    let mut all = Vec::new();
    assert!(pool.allocate_n(SMALL - 1, &mut all), "leaked blocks");
    assert_eq!(pool.allocate(), None, "a block is on the free list twice");
}
