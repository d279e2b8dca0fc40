//! **Race: concurrent claims on the claim table** (`ClaimTable::{reset, claim, winner}`).
//!
//! * `two_claimants_one_block`, `three_claimants_one_block`: the least key wins whatever order
//!   the `fetch_min`s run in, and the other scan's word is untouched.
//! * `overlapping_blocks`: three requests claiming overlapping block sets; every block is owned
//!   by exactly one claimant, its least.
//! * `reset_between_steps` (epoch turnover): two shards run two consecutive steps through the
//!   real `PhaseBarrier` (claim → barrier → decide → barrier → reset → barrier → claim →
//!   barrier → decide); the second step's winner is never the first step's key, and the
//!   first step's decisions never see the second step's reset.
//!
//! Catches: a claim that is not an atomic min (last writer wins — plant `claim-store`), a lost
//! claim, a reset that leaks into or out of its step, a scan writing the other scan's word.

#![cfg(kvsched_loom)]

use kvsched::runtime::claim::{ClaimTable, RequestKey, Scan};
use kvsched::sync::{thread, Arc, PhaseBarrier};
use kvsched_loom_tests::model;

fn key(seq: u64) -> RequestKey {
    RequestKey::new(false, 0, seq)
}

#[test]
fn two_claimants_one_block() {
    model(|| {
        let t = Arc::new(ClaimTable::new(2));
        t.reset(1);
        let t2 = Arc::clone(&t);
        let h = thread::spawn(move || t2.claim(1, Scan::Async, key(1)));
        t.claim(1, Scan::Async, key(2));
        h.join().unwrap();
        assert_eq!(t.winner(1, Scan::Async), Some(key(1)));
        assert_eq!(t.winner(1, Scan::Sync), None);
    });
}

#[test]
fn three_claimants_one_block() {
    model(|| {
        let t = Arc::new(ClaimTable::new(2));
        t.reset(1);
        let hs: Vec<_> = [3u64, 1]
            .into_iter()
            .map(|seq| {
                let t = Arc::clone(&t);
                thread::spawn(move || t.claim(1, Scan::Sync, key(seq).with_sync(true)))
            })
            .collect();
        t.claim(1, Scan::Sync, key(2).with_sync(true));
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(t.winner(1, Scan::Sync), Some(key(1).with_sync(true)));
        assert_eq!(t.winner(1, Scan::Async), None);
    });
}

#[test]
fn overlapping_blocks() {
    // Request seq → the blocks it claims (two each, pairwise overlapping).
    const CLAIMS: [(u64, [u64; 2]); 3] = [(2, [1, 2]), (1, [2, 3]), (3, [3, 1])];
    model(|| {
        let t = Arc::new(ClaimTable::new(4));
        for b in 1..4 {
            t.reset(b);
        }
        let hs: Vec<_> = CLAIMS[1..]
            .iter()
            .map(|&(seq, blocks)| {
                let t = Arc::clone(&t);
                thread::spawn(move || {
                    for b in blocks {
                        t.claim(b, Scan::Async, key(seq));
                    }
                })
            })
            .collect();
        let (seq, blocks) = CLAIMS[0];
        for b in blocks {
            t.claim(b, Scan::Async, key(seq));
        }
        for h in hs {
            h.join().unwrap();
        }
        for b in 1..4u64 {
            let claimants: Vec<u64> = CLAIMS
                .iter()
                .filter(|(_, bs)| bs.contains(&b))
                .map(|&(s, _)| s)
                .collect();
            let owners: Vec<u64> = claimants
                .iter()
                .copied()
                .filter(|&s| t.winner(b, Scan::Async) == Some(key(s)))
                .collect();
            assert_eq!(owners.len(), 1, "block {b}: owners {owners:?}");
            assert_eq!(Some(&owners[0]), claimants.iter().min(), "block {b}");
        }
    });
}

#[test]
fn reset_between_steps() {
    model(|| {
        let t = Arc::new(ClaimTable::new(2));
        let barrier = Arc::new(PhaseBarrier::new(2));
        // Step 1's publish ran before the shards started.
        t.reset(1);
        let shard = |seq: u64, t: Arc<ClaimTable>, barrier: Arc<PhaseBarrier>| {
            move || {
                // Step 1: both requests hit block 1.
                t.claim(1, Scan::Async, key(seq));
                barrier.wait();
                let owns_1 = t.winner(1, Scan::Async) == Some(key(seq));
                // End of step 1 (the engine collects every shard's result).
                barrier.wait();
                // Step 2: block 1 is reported again; seq 2's shard publishes it (resets its
                // words) and seq 2's request has ended, so only seq 3 claims.
                if seq == 2 {
                    t.reset(1);
                }
                barrier.wait();
                if seq == 3 {
                    t.claim(1, Scan::Async, key(seq));
                }
                barrier.wait();
                let owns_2 = t.winner(1, Scan::Async) == Some(key(seq));
                (owns_1, owns_2)
            }
        };
        let h = thread::spawn(shard(3, Arc::clone(&t), Arc::clone(&barrier)));
        let (a1, a2) = shard(2, Arc::clone(&t), Arc::clone(&barrier))();
        let (b1, b2) = h.join().unwrap();
        assert!(a1 && !b1, "step 1: seq 2 owns (got {a1}, {b1})");
        assert!(
            !a2 && b2,
            "step 2: seq 3 owns after the reset (got {a2}, {b2})"
        );
        assert_eq!(t.winner(1, Scan::Async), Some(key(3)));
    });
}
