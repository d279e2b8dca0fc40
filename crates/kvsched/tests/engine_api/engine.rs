//! An engine written against the public API alone, on real KV bytes: every block a plan
//! tells the engine to read is checked against a deterministic function of (group, token
//! position, token prefix). Honest runs on dense and hybrid geometries, then hostile
//! engines (see `hostile.rs` for hostile connectors and tiers).

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use kvsched::kv::MemoryTier;
use kvsched::{CacheGroup, MambaMode, Mode, Policy, Settings, StepOutput};

fn dense() -> Vec<CacheGroup> {
    vec![CacheGroup::full_attention(16)]
}

fn hybrid_odd(mamba: MambaMode) -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(12),
        CacheGroup::sliding_window(8, 20),
        CacheGroup::mamba(24, mamba),
    ]
}

/// Two rounds on one engine and tier: the first computes and saves, the second runs on a
/// fresh runtime whose prefix cache is empty, so its prefixes come from the tier (half the
/// loads asynchronous, half inside the step).
fn two_rounds(
    groups: Vec<CacheGroup>,
    pool: usize,
    shards: usize,
) -> (Engine, Vec<kvsched::Report>) {
    let mut eng = Engine::new(groups.clone(), pool).memory_tier(0.5);
    let mut reports = Vec::new();
    for round in 0..2u32 {
        let mut rt = builder(&groups, pool)
            .shards(shards)
            .workers(2)
            .connector(eng.tier_conn.clone().unwrap())
            .build()
            .unwrap();
        for i in 0..12u32 {
            let len = 40 + (i as usize * 13) % 90;
            eng.submit(
                &rt,
                &format!("r{round}-{i}"),
                prompt(i % 3, 72, round * 100 + i, len),
                5,
            );
        }
        assert!(
            eng.run_until_idle(&mut rt, Duration::from_secs(20)),
            "requests never ended"
        );
        eng.flush();
        let r = rt.shutdown();
        assert_report_clean(&r, pool);
        assert_eq!(r.metrics.finished, 12);
        reports.push(r);
    }
    (eng, reports)
}

#[test]
fn dense_tier_round_trip_reads_only_right_bytes() {
    let (eng, reports) = two_rounds(dense(), 512, 2);
    eng.assert_clean();
    let m = &reports[1].metrics;
    assert!(
        m.loads_ok + m.sync_loads_ok > 0,
        "the second round loaded nothing from the tier: {}",
        reports[1]
    );
    assert!(eng.tally.reads_checked > 1000);
}

#[test]
fn hybrid_odd_block_sizes_align_round_trip_reads_only_right_bytes() {
    let (eng, reports) = two_rounds(hybrid_odd(MambaMode::Align), 1024, 2);
    eng.assert_clean();
    let m = &reports[1].metrics;
    assert!(
        m.loads_ok + m.sync_loads_ok > 0,
        "no tier load: {}",
        reports[1]
    );
}

#[test]
fn hybrid_odd_block_sizes_all_round_trip_reads_only_right_bytes() {
    let (eng, reports) = two_rounds(hybrid_odd(MambaMode::All), 1024, 3);
    eng.assert_clean();
    let m = &reports[1].metrics;
    assert!(
        m.loads_ok + m.sync_loads_ok > 0,
        "no tier load: {}",
        reports[1]
    );
}

/// A pool just big enough for one request at a time: requests queue, preempt, reuse the
/// prefix cache, and all end; nothing is read that was not written.
#[test]
fn tiny_pool_everything_ends_and_reads_are_right() {
    for groups in [
        dense(),
        hybrid_odd(MambaMode::Align),
        hybrid_odd(MambaMode::All),
    ] {
        let pool = 40;
        let mut eng = Engine::new(groups.clone(), pool);
        let mut rt = builder(&groups, pool).shards(2).build().unwrap();
        for i in 0..10u32 {
            eng.submit(
                &rt,
                &format!("t{i}"),
                prompt(i % 2, 48, i, 60 + i as usize),
                6,
            );
        }
        assert!(
            eng.run_until_idle(&mut rt, Duration::from_secs(20)),
            "hung with a pool that fits one request"
        );
        let r = rt.shutdown();
        eng.assert_clean();
        assert_report_clean(&r, pool);
        assert_eq!(r.metrics.finished, 10, "{r}");
    }
}

/// An engine that answers with the wrong step, repeats samples, samples ids never
/// scheduled and finishes unknown ids: none of it counts, nothing panics, every request
/// still ends with exactly its `max_new_tokens` kept samples.
#[test]
fn lying_engine_outputs_are_ignored_and_counted() {
    let g = hybrid_odd(MambaMode::Align);
    let pool = 256;
    let mut eng = Engine::new(g.clone(), pool);
    let mut rt = builder(&g, pool).shards(2).build().unwrap();
    for i in 0..6u32 {
        eng.submit(&rt, &format!("l{i}"), prompt(0, 24, i, 50), 4);
    }
    let mut n = 0u64;
    while rt.live() > 0 && n < 2000 {
        n += 1;
        let plan = rt.schedule().unwrap();
        let (mut out, checks) = eng.run_plan(&plan);
        match n % 4 {
            0 => {
                let dup = out.sampled.clone();
                out.sampled.extend(dup);
                out.sampled.push("never-submitted".into());
                out.finished.push("nobody".into());
            }
            1 => {
                // Samples of live requests the plan did not schedule to sample.
                for s in &plan.scheduled {
                    if !s.samples {
                        out.sampled.push(s.id.clone());
                    }
                }
            }
            2 => {
                // A wrong step first (ignored), then the right answer.
                let wrong = StepOutput {
                    step: plan.step + 7,
                    sampled: out.sampled.clone(),
                    ..Default::default()
                };
                assert!(rt.update(wrong).is_empty());
            }
            _ => {
                // The same answer twice: the second is a duplicate, applied once.
                let again = out.clone();
                eng.answer(&mut rt, &plan, out, checks.clone());
                let _ = rt.update(again);
                if plan.scheduled.is_empty() && rt.live() > 0 {
                    rt.wait_for_work(Duration::from_millis(5));
                }
                continue;
            }
        }
        eng.answer(&mut rt, &plan, out, checks);
        if plan.scheduled.is_empty() && rt.live() > 0 {
            rt.wait_for_work(Duration::from_millis(5));
        }
    }
    let r = rt.shutdown();
    eng.assert_clean();
    assert_report_clean(&r, pool);
    assert_eq!(r.metrics.finished, 6, "{r}");
    let m = &r.metrics;
    assert!(
        m.duplicate_commands > 0 && m.unknown_commands > 0 && m.unexpected_samples > 0,
        "{m:?}"
    );
    for i in 0..6 {
        assert_eq!(
            eng.tally.kept_samples.get(&format!("l{i}")).copied(),
            Some(4),
            "{:?}",
            eng.tally.kept_samples
        );
    }
}

/// Dropping a plan's output (a crashed step), sometimes after running it, sometimes before:
/// the runtime re-offers or restarts, every request ends, and nothing read is garbage.
#[test]
fn dropped_outputs_are_reoffered_without_garbage() {
    for groups in [
        dense(),
        hybrid_odd(MambaMode::Align),
        hybrid_odd(MambaMode::All),
    ] {
        let pool = 512;
        let mut eng = Engine::new(groups.clone(), pool).memory_tier(0.0);
        // Fill the tier first so the second runtime carries sync loads.
        for round in 0..2u32 {
            let mut rt = builder(&groups, pool)
                .connector(eng.tier_conn.clone().unwrap())
                .build()
                .unwrap();
            for i in 0..8u32 {
                eng.submit(
                    &rt,
                    &format!("d{round}-{i}"),
                    prompt(i % 2, 48, round * 50 + i, 70),
                    5,
                );
            }
            let mut n = 0u64;
            while rt.live() > 0 && n < 3000 {
                n += 1;
                let plan = rt.schedule().unwrap();
                if round == 1 && n % 3 == 0 && !plan.scheduled.is_empty() {
                    // Lost: every other time the engine ran it (writes included), else not at all.
                    if n % 2 == 0 {
                        let _ = eng.run_plan(&plan);
                    }
                    continue;
                }
                let (out, checks) = eng.run_plan(&plan);
                eng.answer(&mut rt, &plan, out, checks);
                if plan.scheduled.is_empty() && rt.live() > 0 {
                    rt.wait_for_work(Duration::from_millis(5));
                }
            }
            eng.flush();
            let r = rt.shutdown();
            assert_report_clean(&r, pool);
            assert_eq!(r.metrics.finished, 8, "{r}");
            if round == 1 {
                assert!(r.metrics.lost_outputs > 0);
            }
        }
        eng.assert_clean();
    }
}

/// Switching mode and policy every few steps while requests share prefixes and a tier
/// damages nothing: every request ends, no violation, no garbage in kept outputs.
#[test]
fn live_mode_and_policy_switches_keep_invariants() {
    let g = hybrid_odd(MambaMode::Align);
    let pool = 512;
    let tier = Arc::new(MemoryTier::new(64 << 20, 4));
    let mut eng = Engine::new(g.clone(), pool).with_tier(tier, 0.5);
    let mut rt = builder(&g, pool)
        .shards(2)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    for i in 0..30u32 {
        eng.submit(
            &rt,
            &format!("m{i}"),
            prompt(i % 3, 48, i, 60 + (i as usize % 5) * 11),
            4,
        );
    }
    let mut n = 0u32;
    while rt.live() > 0 && n < 4000 {
        n += 1;
        if n % 3 == 0 {
            let s = Settings::default()
                .with_mode(if n % 2 == 0 { Mode::Vllm } else { Mode::Safe })
                .with_policy(if n % 5 == 0 {
                    Policy::Fail
                } else {
                    Policy::Recompute
                });
            rt.update_settings(s).unwrap();
        }
        let plan = eng.step(&mut rt);
        if plan.scheduled.is_empty() && rt.live() > 0 {
            rt.wait_for_work(Duration::from_millis(5));
        }
    }
    let r = rt.shutdown();
    assert_report_clean(&r, pool);
    assert_eq!(r.metrics.finished + r.metrics.failed, 30, "{r}");
    eng.assert_clean();
}

/// An engine that names its sync loads' destinations at the wrong generation: a newer one
/// is taken as the destination failed (its output discarded, recomputed), an older one as
/// stale (ignored). Either way nothing kept reads a wrong byte and every request ends.
#[test]
fn sync_failures_named_at_wrong_generations() {
    for newer in [true, false] {
        let g = hybrid_odd(MambaMode::Align);
        let pool = 512;
        let mut eng = Engine::new(g.clone(), pool).memory_tier(0.0);
        let mut rt = builder(&g, pool)
            .connector(eng.tier_conn.clone().unwrap())
            .build()
            .unwrap();
        for i in 0..4u32 {
            eng.submit(&rt, &format!("s{i}"), prompt(i, 96, 900 + i, 110), 1);
        }
        assert!(eng.run_until_idle(&mut rt, Duration::from_secs(10)));
        eng.flush();
        rt.shutdown();
        let mut rt = builder(&g, pool)
            .connector(eng.tier_conn.clone().unwrap())
            .build()
            .unwrap();
        for i in 0..8u32 {
            eng.submit(&rt, &format!("n{i}"), prompt(i % 4, 96, i, 100), 2);
        }
        let mut discarded = 0;
        let start = std::time::Instant::now();
        while rt.live() > 0 && start.elapsed() < Duration::from_secs(10) {
            let plan = rt.schedule().unwrap();
            let (mut out, checks) = eng.run_plan(&plan);
            let loaders: Vec<_> = plan
                .scheduled
                .iter()
                .filter(|s| s.sync_load.is_some())
                .map(|s| s.id.clone())
                .collect();
            for s in &plan.scheduled {
                if let Some(job) = &s.sync_load {
                    for b in job.all_loaded_blocks().into_iter().take(1) {
                        let generation = if newer {
                            b.generation.wrapping_add(1)
                        } else {
                            b.generation.wrapping_sub(1)
                        };
                        out.invalid_blocks.push(kvsched::BlockRef {
                            id: b.id,
                            generation,
                        });
                    }
                }
            }
            let discard = rt.update(out.clone());
            if newer {
                for l in &loaders {
                    assert!(
                        discard.contains(l),
                        "a newer generation did not fail {l}'s destination"
                    );
                }
            } else {
                assert!(
                    discard.is_empty(),
                    "an older generation discarded {discard:?}"
                );
            }
            discarded += discard.len();
            // The engine's own bookkeeping (saves, kept samples) on the answered output.
            let _ = rt.update(kvsched::StepOutput {
                step: out.step,
                ..Default::default()
            });
            eng.answer(
                &mut rt,
                &plan,
                kvsched::StepOutput {
                    step: 0,
                    ..Default::default()
                },
                checks,
            );
            if plan.scheduled.is_empty() && rt.live() > 0 {
                rt.wait_for_work(Duration::from_millis(5));
            }
        }
        assert_eq!(
            rt.live(),
            0,
            "newer={newer}: requests never ended: {:?}",
            rt.metrics()
        );
        let r = rt.shutdown();
        // The loads really filled their blocks: whatever was kept read right bytes.
        eng.assert_clean();
        assert_report_clean(&r, pool);
        if newer {
            assert!(discarded > 0);
        } else {
            assert!(r.metrics.stale_blocks > 0, "{:?}", r.metrics);
        }
    }
}
