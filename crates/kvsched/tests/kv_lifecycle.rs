//! A request's whole life on real bytes: engine finishes and cancels at every point of it
//! (queued with a pending sync load, loading, running), lost step outputs (on steps that carry
//! a sync load and on Mamba steps), and tiers that never answer. A runtime, a `TierConnector`
//! over a memory tier, host KV memory and the verifying `KvChecker`; mode `safe` must keep no
//! garbage read, lose no request and finish.
//!
//! Each defect these tests found has a runtime plant in `scripts/plants.sh`:
//! `register-unwritten` (a request ended before its sync load ran leaves the load's
//! destinations in the prefix cache), `reoffer-unwritten` (a lost step is re-offered past
//! bytes nothing wrote) and `park-unstarted` (a load no worker started is parked as if one
//! might still write it).

use std::sync::Arc;
use std::time::Duration;

use kvsched::kv::{MemoryTier, Tier};
use kvsched::{CacheGroup, MambaMode, Settings, StepPlan};

mod lifecycle;
use lifecycle::{Bench, HangingConnector, HangingTier};

fn dense() -> Vec<CacheGroup> {
    vec![CacheGroup::full_attention(16)]
}

/// A 64-token prefix in the tier, prompts of 70 tokens, every hit loaded synchronously, one
/// shard, a token budget of 16 (so a long request in front keeps the others waiting).
fn sync_bench(groups: Vec<CacheGroup>) -> Bench {
    Bench::new(groups, Arc::new(MemoryTier::new(64 << 20, 4)), 0.0, |b| {
        b.shards(1).workers(1).token_budget(16).pool_blocks(256)
    })
}

fn prompt_p() -> Vec<u32> {
    (1..=70).collect()
}

#[test]
fn an_engine_finish_before_the_sync_load_ran_leaves_nothing_in_the_prefix_cache() {
    let mut e = sync_bench(dense());
    let p = prompt_p();
    e.warm(&p, 64);
    // B takes the whole budget for 13 steps; A waits behind it with its sync load attached.
    e.submit("b", &(10_000..10_200).collect::<Vec<_>>(), 1);
    e.submit("a", &p, 4);
    let plan = e.step();
    assert!(
        plan.scheduled.iter().all(|s| &*s.id != "a"),
        "a waits behind b"
    );
    // The client of A goes away before A ever ran: the engine finishes it.
    e.finish_next("a");
    e.step();
    e.submit("c", &p, 4);
    e.run_to_end(400);
    let k = e.checker.counts();
    assert_eq!(k.garbage_reads, 0, "c read a's never-loaded blocks: {k:?}");
    assert_eq!(e.rt.live(), 0);
    let report = e.finish();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

#[test]
fn a_lost_step_that_carried_a_sync_load_is_offered_again_from_written_bytes() {
    for ran in [false, true] {
        let mut e = sync_bench(dense());
        let p = prompt_p();
        e.warm(&p, 64);
        e.submit("a", &p, 4);
        // The step that carries a's sync load (0, 64) and computes [64, 70) never answers.
        let plan = e.step_lost(ran);
        let s = plan
            .scheduled
            .iter()
            .find(|s| &*s.id == "a")
            .expect("a scheduled");
        assert!(s.sync_load.is_some(), "the first step carries the load");
        // Whatever the runtime offers next must not read bytes nothing wrote.
        e.run_to_end(400);
        let k = e.checker.counts();
        assert_eq!(k.garbage_reads, 0, "ran {ran}: {k:?}");
        let report = e.finish();
        assert_eq!(report.metrics.lost_outputs, 1);
        assert_eq!(report.metrics.finished, 1);
    }
}

#[test]
fn a_lost_mamba_decode_step_is_not_offered_again_on_the_state_it_advanced() {
    for mode in [MambaMode::Align, MambaMode::All] {
        let groups = vec![CacheGroup::full_attention(16), CacheGroup::mamba(16, mode)];
        let mut e = Bench::new(groups, Arc::new(MemoryTier::new(64 << 20, 4)), 1.0, |b| {
            b.shards(1).workers(1).pool_blocks(256)
        });
        e.submit("a", &(1..=70).collect::<Vec<_>>(), 6);
        // Prefill [0, 70), then decode steps; the third decode step runs (the engine writes
        // the state in place) but its output is lost.
        for _ in 0..3 {
            e.step();
        }
        e.step_lost(true);
        e.run_to_end(400);
        let k = e.checker.counts();
        assert_eq!(k.garbage_reads, 0, "mamba {mode:?}: {k:?}");
        let report = e.finish();
        assert_eq!(report.metrics.lost_outputs, 1);
        assert_eq!(report.metrics.finished, 1);
    }
}

/// A tier whose gets of some prompts never return: async loads queued behind hung workers and
/// sync loads inside the engine's step must both give up at their deadline, and every request
/// not waiting on a hung load must finish.
#[test]
fn a_tier_that_never_answers_does_not_drain_the_pool() {
    for async_ratio in [1.0, 0.0] {
        let inner = Arc::new(MemoryTier::new(64 << 20, 4));
        let hang = Arc::new(HangingTier::new(
            Arc::clone(&inner) as Arc<dyn Tier>,
            0.05,
            11,
        ));
        let mut e = Bench::new(dense(), hang.clone(), async_ratio, |b| {
            b.shards(2)
                .workers(2)
                .pool_blocks(400)
                .settings(Settings::default().with_load_deadline(Some(Duration::from_millis(200))))
        });
        let prompts: Vec<Vec<u32>> = (0..40u32)
            .map(|p| (0..70).map(|t| p * 1000 + t + 1).collect())
            .collect();
        for p in &prompts {
            e.warm(p, 64);
        }
        for (i, p) in prompts.iter().enumerate() {
            e.submit(&format!("r{i}"), p, 4);
        }
        // Bounded by wall time, not steps: the run's end waits on load deadlines.
        e.run_until_idle(Duration::from_secs(60));
        assert_eq!(e.rt.live(), 0, "async {async_ratio}: requests left");
        assert!(hang.hung() > 0, "async {async_ratio}: the tier hung no get");
        let k = e.checker.counts();
        assert_eq!(k.garbage_reads, 0, "{k:?}");
        hang.release();
        let report = e.finish();
        assert_eq!(
            report.metrics.finished, 40,
            "async {async_ratio}: {:?}",
            report.metrics
        );
    }
}

/// A connector whose first load hangs its only worker: every load queued behind it passes its
/// deadline without a worker ever starting it. Those are dropped and their blocks freed at
/// once, so a small pool does not drain; only the hung load's blocks stay parked, and every
/// request finishes.
#[test]
fn loads_queued_behind_a_hung_worker_are_dropped_not_parked() {
    let inner = Arc::new(MemoryTier::new(64 << 20, 4));
    let mut hang = None;
    let mut e = Bench::wrapped(
        dense(),
        inner,
        1.0,
        |b| {
            b.shards(1)
                .workers(1)
                .pool_blocks(160)
                .settings(Settings::default().with_load_deadline(Some(Duration::from_millis(5))))
        },
        |c| {
            let h = Arc::new(HangingConnector::new(c, |id| id == "r0"));
            hang = Some(Arc::clone(&h));
            h
        },
    );
    let hang = hang.expect("wrapped");
    let prompts: Vec<Vec<u32>> = (0..30u32)
        .map(|p| (0..70).map(|t| p * 1000 + t + 1).collect())
        .collect();
    for p in &prompts {
        e.warm(p, 64);
    }
    for (i, p) in prompts.iter().enumerate() {
        e.submit(&format!("r{i}"), p, 2);
        e.step();
    }
    e.run_to_end(3000);
    let left = e.rt.live();
    let m = e.rt.metrics();
    hang.release();
    assert_eq!(left, 0, "requests left: {m:?}");
    assert_eq!(hang.hung(), 1);
    assert!(m.loads_dropped_unstarted > 0, "{m:?}");
    assert_eq!(e.checker.counts().garbage_reads, 0);
    let report = e.finish();
    assert_eq!(report.metrics.finished, 30);
}

/// In the runtime no request other than the loader ever holds a failed load's block: a sync
/// load's destinations enter the prefix cache only once their bytes are known written, and an
/// async load's are `FILLING` until its completion. So a failure never has sharers, and no
/// decision ever waits.
#[test]
fn a_failed_load_never_has_sharers() {
    let mut waits = 0;
    let mut recovered = 0;
    for seed in 1..=4 {
        let faults = kvsched_testkit::FaultConfig {
            seed,
            corrupt: 0.2,
            ..kvsched_testkit::FaultConfig::default()
        };
        let tier = Arc::new(
            kvsched_testkit::FaultyTier::new(MemoryTier::new(64 << 20, 4), faults).expect("faults"),
        );
        let groups = vec![
            CacheGroup::full_attention(16),
            CacheGroup::sliding_window(16, 32),
            CacheGroup::mamba(16, MambaMode::All),
        ];
        let mut e = Bench::new(groups, tier, 0.5, |b| {
            b.shards(2).workers(2).pool_blocks(600)
        });
        let prefixes: Vec<Vec<u32>> = (0..3u32)
            .map(|p| (0..96).map(|t| p * 1000 + t + 1).collect())
            .collect();
        for p in &prefixes {
            e.warm(p, 96);
        }
        let mut rng = kvsched_testkit::SplitMix64::new(seed);
        for i in 0..60u32 {
            let mut prompt = prefixes[rng.below(3) as usize].clone();
            prompt.extend((0..1 + rng.below(20) as u32).map(|t| 50_000 + i * 100 + t));
            e.submit(&format!("r{i}"), &prompt, 3);
            if i % 4 == 3 {
                let plan = e.step();
                waits += count_waits(&plan);
                recovered += plan.recovery.recovered.len();
            }
        }
        e.run_to_end_with(3000, |plan| {
            waits += count_waits(plan);
            recovered += plan.recovery.recovered.len();
        });
        assert_eq!(e.checker.counts().garbage_reads, 0);
        e.finish();
    }
    assert!(recovered > 0, "loads failed and were recovered");
    assert_eq!(waits, 0, "a decision waited for another request");
}

fn count_waits(plan: &StepPlan) -> usize {
    plan.recovery
        .recovered
        .iter()
        .map(|r| r.decision.waits_for.len())
        .sum()
}

/// Seeded random lives on a hybrid model with a small pool (preemptions), damaged and evicted
/// chunks, sync and async loads: engine finishes and client cancels at any point of a
/// request's life, and lost outputs of steps the engine ran or never ran. Mode `safe` keeps
/// no garbage read and every request ends.
#[test]
fn random_lives_keep_no_garbage() {
    let mut kept = 0u64;
    let (mut lost, mut finishes, mut cancels, mut preemptions, mut loads) = (0, 0, 0, 0, 0);
    for seed in 1..=6u64 {
        for mamba in [MambaMode::Align, MambaMode::All] {
            let async_ratio = [0.0, 0.5, 1.0][(seed % 3) as usize];
            let groups = vec![
                CacheGroup::full_attention(16),
                CacheGroup::sliding_window(16, 32),
                CacheGroup::mamba(16, mamba),
            ];
            let tier = lifecycle::faulty_memory_tier(seed, 0.05, 0.05);
            let mut e = Bench::new(groups, tier, async_ratio, |b| {
                b.shards(2).workers(2).pool_blocks(64).token_budget(256)
            });
            let prefixes = lifecycle::warmed_prefixes(&mut e);
            let mut rng = kvsched_testkit::SplitMix64::new(seed * 31 + mamba as u64);
            let mut live: Vec<String> = Vec::new();
            let mut next = 0u32;
            for _ in 0..4000 {
                if next < 50 && rng.unit() < 0.8 {
                    let mut prompt = prefixes[rng.below(3) as usize].clone();
                    prompt.extend((0..1 + rng.below(40) as u32).map(|t| 50_000 + next * 100 + t));
                    let id = format!("r{next}");
                    e.submit(&id, &prompt, 1 + rng.below(16) as u32);
                    live.push(id);
                    next += 1;
                }
                if !live.is_empty() && rng.unit() < 0.03 {
                    let id = live[rng.below(live.len() as u64) as usize].clone();
                    e.finish_next(&id);
                    finishes += 1;
                }
                if !live.is_empty() && rng.unit() < 0.02 {
                    e.rt.cancel(&live[rng.below(live.len() as u64) as usize]);
                    cancels += 1;
                }
                let plan = if rng.unit() < 0.03 {
                    lost += 1;
                    e.step_lost(rng.unit() < 0.5)
                } else {
                    e.step()
                };
                for (id, _) in &plan.ended {
                    live.retain(|l| **l != **id);
                }
                if next == 50 && e.rt.live() == 0 {
                    break;
                }
            }
            kept += e.checker.counts().garbage_reads;
            let report = e.finish_all_ended(50, &format!("seed {seed} {mamba:?}"));
            let m = &report.metrics;
            preemptions += m.preemptions;
            loads += m.loads_dispatched;
        }
    }
    assert_eq!(kept, 0, "garbage read and kept");
    // The lives reached every point: the runs did what they are meant to.
    assert!(
        lost > 0 && finishes > 0 && cancels > 0,
        "{lost} {finishes} {cancels}"
    );
    assert!(preemptions > 0, "the pool never ran short");
    assert!(loads > 0);
}
