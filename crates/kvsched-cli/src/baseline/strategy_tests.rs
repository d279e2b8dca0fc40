//! The baseline's strategy keeps the contract of `kvsched::runtime::shard::strategy`: seen
//! from one thread, its plain [`Blocks`] and [`ClaimWords`] answer every operation as the
//! runtime's `BlockPool` and `ClaimTable` do — the same blocks allocated in the same order,
//! the same cached blocks reclaimed (second chance included), the same prefix hits, the same
//! claim winners and pending marks. Random operation sequences run on both, every answer
//! compared.

use kvsched::pool::{BlockPool, BlockRef};
use kvsched::rules::geometry::BlockId;
use kvsched::runtime::claim::{ClaimTable, RequestKey, Scan};
use kvsched::runtime::shard::strategy::{Claims, Pool};
use kvsched::sync::Arc;
use kvsched_testkit::SplitMix64;

use super::blocks::Blocks;
use super::claims::ClaimWords;

/// What one pool operation answered, in both.
#[derive(Debug, PartialEq)]
enum Answer {
    Blocks(Option<Vec<BlockRef>>),
    Hit(Option<BlockRef>),
    Flag(bool),
    Block(Option<u32>, u32),
}

/// Runs `steps` random operations on `a` and `b`, small pools and few hashes so that reclaim,
/// revival by a hit, eviction and exhaustion all happen; returns how many allocations reused
/// a block (freed or cached before).
fn pools_agree(seed: u64, n: usize, steps: usize, a: &impl Pool, b: &impl Pool) -> u64 {
    let mut rng = SplitMix64::new(seed);
    // The references held, each one reference on its block (the same in both pools).
    let mut held: Vec<BlockRef> = Vec::new();
    let mut reuses = 0;
    for step in 0..steps {
        let hash = rng.below(24);
        let (x, y) = match rng.below(8) {
            0 | 1 => {
                let k = 1 + rng.below(3) as usize;
                let (mut va, mut vb) = (Vec::new(), Vec::new());
                let (ok_a, ok_b) = (a.allocate_n(k, &mut va), b.allocate_n(k, &mut vb));
                if ok_a && va.iter().any(|r| r.generation > 1) {
                    reuses += 1;
                }
                held.extend(va.iter().copied());
                (
                    Answer::Blocks(ok_a.then_some(va)),
                    Answer::Blocks(ok_b.then_some(vb)),
                )
            }
            2 | 3 if !held.is_empty() => {
                let r = held.swap_remove(rng.below(held.len() as u64) as usize);
                let _ = (a.release(r), b.release(r));
                (Answer::Flag(a.is_current(r)), Answer::Flag(b.is_current(r)))
            }
            4 if !held.is_empty() => {
                let r = held[rng.below(held.len() as u64) as usize];
                (
                    Answer::Flag(a.register(hash, r)),
                    Answer::Flag(b.register(hash, r)),
                )
            }
            5 => {
                let (ha, hb) = (a.lookup(hash), b.lookup(hash));
                held.extend(ha);
                (Answer::Hit(ha), Answer::Hit(hb))
            }
            6 => {
                let id = rng.below(n as u64) as BlockId;
                (Answer::Flag(a.evict(id)), Answer::Flag(b.evict(id)))
            }
            _ => (
                Answer::Flag(a.contains_hash(hash)),
                Answer::Flag(b.contains_hash(hash)),
            ),
        };
        assert_eq!(
            x, y,
            "seed {seed}, step {step}: the two pools answered differently"
        );
        for id in 1..n as BlockId {
            let x = Answer::Block(a.generation(id), a.ref_count(id));
            let y = Answer::Block(b.generation(id), b.ref_count(id));
            assert_eq!(x, y, "seed {seed}, step {step}, block {id}");
        }
    }
    reuses
}

#[test]
fn the_baseline_pool_answers_as_the_runtime_pool() {
    let mut reuses = 0;
    for seed in 0..40 {
        let n = 4 + (seed as usize % 9);
        let runtime = Arc::new(BlockPool::new(n).expect("pool"));
        let baseline = Blocks::new(n);
        reuses += pools_agree(seed, n, 600, &runtime, &baseline);
    }
    // The runs exercised what the two could disagree on: which block is reused next.
    assert!(reuses > 100, "{reuses}");
}

#[test]
fn the_baseline_claim_words_answer_as_the_claim_table() {
    let n = 6;
    for seed in 0..40 {
        let (a, b) = (ClaimTable::new(n), ClaimWords::new(n));
        let mut rng = SplitMix64::new(seed ^ 0xC1A1);
        for step in 0..500 {
            // Out-of-range ids included: both ignore them.
            let id = rng.below(n as u64 + 2) as BlockId;
            let key = RequestKey::new(rng.below(2) == 0, rng.below(3) as i16, 1 + rng.below(5));
            let scan = if rng.below(2) == 0 {
                Scan::Async
            } else {
                Scan::Sync
            };
            let (x, y) = match rng.below(7) {
                0 => {
                    a.reset(id);
                    b.reset(id);
                    (None, None)
                }
                1 => {
                    a.claim(id, scan, key);
                    b.claim(id, scan, key);
                    (None, None)
                }
                2 => {
                    a.set_pending(id, key);
                    b.set_pending(id, key);
                    (None, None)
                }
                3 => {
                    a.orphan(id, key);
                    b.orphan(id, key);
                    (None, None)
                }
                4 => (
                    Some(u64::from(a.clear_pending(id, key))),
                    Some(u64::from(b.clear_pending(id, key))),
                ),
                5 => {
                    a.forget(id);
                    b.forget(id);
                    (None, None)
                }
                _ => (
                    a.winner(id, scan).map(RequestKey::raw),
                    b.winner(id, scan).map(RequestKey::raw),
                ),
            };
            assert_eq!(x, y, "seed {seed}, step {step}");
            for id in 0..n as BlockId + 2 {
                assert_eq!(
                    a.pending_owner(id),
                    b.pending_owner(id),
                    "seed {seed}, step {step}"
                );
                for s in [Scan::Async, Scan::Sync] {
                    assert_eq!(a.winner(id, s), b.winner(id, s), "seed {seed}, step {step}");
                }
            }
        }
    }
}
