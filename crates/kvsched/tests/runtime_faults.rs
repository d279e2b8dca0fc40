//! Fault-injection matrix (issue: runtime robustness). Each fault alone and all mixed, over
//! thousands of steps, with the invariants (docs/runtime.md#invariants) asserted after every step and the final
//! report reconciled (submitted = finished + failed + cancelled, nothing referenced).
//!
//! Faults: loads hanging past their deadline (late completions), connector panics, requests
//! cancelled while their load is in flight, duplicated engine output, stale and out-of-range
//! block reports, random cancels — plus live settings changes mid-run.

use std::sync::{Arc, Once};
use std::time::Duration;

use kvsched::rules::geometry::{CacheGroup, MambaMode};
use kvsched::rules::recovery::{Mode, Policy};
use kvsched::BlockRef;
use kvsched::{Metrics, Runtime, Settings, StepOutput, SubmitRequest};
use kvsched_testkit::SimEngine;
use kvsched_testkit::{SimConfig, SimConnector, SimulatedPanic, SplitMix64};

#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    hang: f64,
    panic: f64,
    late_cancel: f64,
    duplicate: f64,
    stale: f64,
    cancel: f64,
    flip_settings: bool,
    /// No load fails on its own: any recovery must then come from a trusted stale report.
    no_failures: bool,
    /// Every load takes 1–2 ms: the workers fall behind the arrivals, so loads queue.
    slow_loads: bool,
}

fn quiet_simulated_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<SimulatedPanic>().is_none() {
                prev(info);
            }
        }));
    });
}

fn run(seed: u64, shards: usize, f: Faults, steps: usize) -> Metrics {
    quiet_simulated_panics();
    let sim = Arc::new(SimConnector::new(SimConfig {
        seed,
        hit_ratio: 0.8,
        align_tokens: 16,
        async_ratio: 0.7,
        failure_rate: if f.no_failures { 0.0 } else { 0.1 },
        shared_failure_share: 0.5,
        max_invalid_per_failure: 2,
        latency_min: if f.slow_loads {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        },
        latency_max: Duration::from_micros(if f.slow_loads { 2_000 } else { 200 }),
        panic_rate: f.panic,
        hang_rate: f.hang,
        hang: Duration::from_millis(8),
    }));
    let settings = Settings::default()
        // Tight only where hangs are injected: elsewhere a slow machine must not turn normal
        // loads into deadline failures (which are real recoveries).
        .with_load_deadline(Some(if f.hang > 0.0 {
            Duration::from_millis(2)
        } else {
            Duration::from_secs(10)
        }))
        .with_quarantine_for(Duration::from_millis(20));
    let mut rt = Runtime::builder()
        .groups(vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(32, MambaMode::Align),
        ])
        .pool_blocks(2000)
        .shards(shards)
        .workers(3)
        .settings(settings.clone())
        .token_budget(1024)
        .max_seqs(32)
        .connector(sim.clone())
        // Alternate the inline and parallel step paths across seeds.
        .inline_steps_up_to(if seed % 2 == 1 { usize::MAX } else { 0 })
        .build()
        .expect("runtime");
    let mut rng = SplitMix64::new(seed ^ 0xFA017);
    // A few hot prefixes (shared blocks, quarantine) and many cold ones (external loads).
    let bases: Vec<Vec<u32>> = (0..24)
        .map(|_| (0..200).map(|_| rng.next_u64() as u32).collect())
        .collect();
    let mut out = StepOutput::default();
    let mut engine = SimEngine::new(|job| sim.decide(job));
    let mut live: Vec<String> = Vec::new();
    let mut seen_blocks: Vec<BlockRef> = Vec::new();
    // The destination blocks of the sync loads of the plan `out` answers.
    let mut step_dests: Vec<BlockRef> = Vec::new();
    let mut injected_stale = 0u64;
    let mut next = 0u64;
    // Requests to finish at the next step, once their load has been dispatched.
    let mut finish_next: Vec<std::sync::Arc<str>> = Vec::new();
    for step in 0..steps {
        if step < steps * 4 / 5 {
            for _ in 0..rng.below(3) {
                let hot = rng.unit() < 0.4;
                let base = &bases[if hot { rng.below(3) } else { 3 + rng.below(21) } as usize];
                let mut prompt = base[..40 + rng.below(150) as usize].to_vec();
                prompt.extend((0..1 + rng.below(40)).map(|_| rng.next_u64() as u32));
                let id = format!("f{next}");
                next += 1;
                rt.submit(SubmitRequest {
                    id: id.clone(),
                    prompt,
                    max_new_tokens: 1 + rng.below(8) as u32,
                    priority: 0,
                    load_deadline: None,
                })
                .expect("submit");
                if rng.unit() < f.late_cancel {
                    // Ended while (likely) its load is in flight: the completion lands late.
                    finish_next.push(id.as_str().into());
                }
                live.push(id);
            }
        }
        if !live.is_empty() && rng.unit() < f.cancel {
            let i = rng.below(live.len() as u64) as usize;
            rt.cancel(&live.swap_remove(i));
        }
        if rng.unit() < f.duplicate {
            let dup = out.clone();
            out.sampled.extend(dup.sampled);
            out.finished.extend(dup.finished);
            out.invalid_blocks.extend(dup.invalid_blocks);
        }
        if rng.unit() < f.stale {
            // A destination of this step's sync loads at an older generation: stale for
            // certain (generations only grow). It passes the destination check, so only the
            // generation check stops it.
            if let Some(b) = step_dests
                .get(rng.below(step_dests.len().max(1) as u64) as usize)
                .filter(|b| b.generation > 0)
            {
                out.invalid_blocks.push(BlockRef {
                    id: b.id,
                    generation: b.generation - 1,
                });
                injected_stale += 1;
            }
            // An older block no sync load of this step wrote, and one out of range: foreign.
            // (Never this step's own destinations: those `seen_blocks` holds too.)
            if let Some(b) = seen_blocks
                .get(rng.below(seen_blocks.len().max(1) as u64) as usize)
                .filter(|b| !step_dests.contains(b))
            {
                out.invalid_blocks.push(*b);
            }
            out.invalid_blocks.push(BlockRef {
                id: 1_000_000 + rng.below(10),
                generation: 0,
            });
        }
        if f.flip_settings && step % 97 == 0 {
            let mut s = rt.settings();
            s.mode = if s.mode == Mode::Safe {
                Mode::Vllm
            } else {
                Mode::Safe
            };
            s.policy = if step % 194 == 0 {
                Policy::Fail
            } else {
                Policy::Recompute
            };
            rt.update_settings(s).expect("settings");
        }
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        // The engine: run sync loads and sample; then finish the requests picked to end while
        // their load is (likely) in flight.
        out = engine.step(&plan);
        out.finished.append(&mut finish_next);
        if f.no_failures {
            assert!(
                plan.recovery.recovered.is_empty(),
                "a stale or duplicate report rolled a request back: {:?}",
                plan.recovery
            );
        }
        let violations = rt.check_invariants();
        assert!(
            violations.is_empty(),
            "seed {seed} step {step} {f:?}: {violations:?}"
        );
        // Live settings apply from a step boundary: one step's decisions share one policy.
        let fails = plan
            .recovery
            .recovered
            .iter()
            .filter(|r| r.decision.disposition == kvsched::rules::recovery::Disposition::Failed)
            .count();
        assert!(
            fails == 0 || fails == plan.recovery.recovered.len(),
            "policy changed mid-step"
        );
        step_dests.clear();
        for job in plan.scheduled.iter().filter_map(|s| s.sync_load.as_deref()) {
            step_dests.extend(job.all_loaded_blocks());
            seen_blocks.extend(job.all_loaded_blocks().into_iter().take(2));
        }
        if seen_blocks.len() > 64 {
            seen_blocks.drain(..32);
        }
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_micros(300));
        }
    }
    // Arrivals stopped at four fifths of the steps; step on until nothing is live. A release
    // build's steps take microseconds, so the remaining fifth can end before 1–2 ms loads
    // land, and their requests would be cancelled at shutdown instead of finishing.
    let drain_until = std::time::Instant::now() + Duration::from_secs(30);
    while rt.live() > 0 && std::time::Instant::now() < drain_until {
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        out = engine.step(&plan);
        let violations = rt.check_invariants();
        assert!(
            violations.is_empty(),
            "seed {seed} drain {f:?}: {violations:?}"
        );
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_micros(300));
        }
    }
    // Let hanging loads land late before shutdown, so late completions are exercised.
    std::thread::sleep(Duration::from_millis(10));
    rt.update(std::mem::take(&mut out));
    rt.schedule().expect("step");
    let report = rt.shutdown();
    let m = report.metrics.clone();
    if f.no_failures {
        // Nothing else reports a block: every injected stale generation is counted, once.
        assert_eq!(m.stale_blocks, injected_stale, "seed {seed} {f:?}: {m:?}");
    }
    assert!(
        report.violations.is_empty(),
        "seed {seed} {f:?}: {:?}",
        report.violations
    );
    assert_eq!(m.submitted, next);
    assert_eq!(
        m.finished + m.failed + m.cancelled,
        m.submitted,
        "{f:?}: {m:?}"
    );
    assert_eq!(report.census.referenced, 0, "{f:?}: blocks leaked");
    assert!(report.census.conserved());
    m
}

#[test]
fn deadlines_alone() {
    let m = run(
        1,
        2,
        Faults {
            hang: 0.2,
            ..Faults::default()
        },
        700,
    );
    assert!(m.deadlines_expired > 5, "{m:?}");
    assert!(m.late_completions > 0, "{m:?}");
    assert!(
        m.retry_budget_skips + m.quarantine_skips > 0,
        "retries or quarantine never kicked in: {m:?}"
    );
}

#[test]
fn connector_panics_alone() {
    let m = run(
        2,
        2,
        Faults {
            panic: 0.2,
            ..Faults::default()
        },
        600,
    );
    assert!(m.connector_panics > 5, "{m:?}");
    assert!(m.loads_failed >= m.connector_panics, "{m:?}");
}

#[test]
fn requests_ended_while_loading_keep_their_blocks_until_the_load_lands() {
    let m = run(
        3,
        2,
        Faults {
            late_cancel: 0.3,
            // Loads slower than the arrivals: some are still queued when their request ends,
            // however the threads are scheduled (with loads of at most 200 µs, a machine that
            // ran the workers ahead of the engine thread left none queued).
            slow_loads: true,
            ..Faults::default()
        },
        600,
    );
    // Ending a loading request waits for a load a worker started: its completion is applied,
    // never stale (no deadlines fire here). A load still queued is dropped and the request
    // ends at once; the worker skips the job and sends nothing. Nothing leaks (checked in
    // `run`).
    assert!(m.loads_dropped_unstarted > 0, "{m:?}");
    assert_eq!(m.stale_completions, 0, "{m:?}");
    assert_eq!(m.loads_expired_unrun, 0, "{m:?}");
    assert!(
        m.loads_dispatched > 50 && m.finished == m.submitted,
        "{m:?}"
    );
}

#[test]
fn duplicate_and_stale_reports_alone() {
    let m = run(
        4,
        2,
        Faults {
            duplicate: 0.3,
            stale: 0.3,
            no_failures: true,
            ..Faults::default()
        },
        600,
    );
    assert!(m.stale_blocks > 0, "{m:?}");
    assert!(m.foreign_blocks > 20, "{m:?}");
    assert!(m.duplicate_commands > 20, "{m:?}");
}

#[test]
fn cancels_alone() {
    let m = run(
        5,
        2,
        Faults {
            cancel: 0.3,
            ..Faults::default()
        },
        600,
    );
    assert!(m.cancelled > 5, "{m:?}");
    assert!(
        m.unknown_commands > 0,
        "cancels of ended requests are counted: {m:?}"
    );
}

#[test]
fn everything_mixed_with_live_settings_changes() {
    let all = Faults {
        hang: 0.1,
        panic: 0.1,
        late_cancel: 0.1,
        duplicate: 0.2,
        stale: 0.2,
        cancel: 0.1,
        flip_settings: true,
        no_failures: false,
        slow_loads: false,
    };
    for (seed, shards) in [(10, 1), (11, 2), (12, 4)] {
        let m = run(seed, shards, all, 800);
        assert!(
            m.deadlines_expired > 0 && m.connector_panics > 0 && m.stale_blocks > 0,
            "{m:?}"
        );
        assert!(m.failed > 0, "policy fail never applied: {m:?}");
    }
}
