//! The mutex baseline (`crate::baseline`): random workloads with many load failures, shared
//! prefixes, sync and async loads, cancels and engine finishes, in both modes and policies and
//! every geometry preset. After every step the invariants of docs/runtime.md ("Invariants") hold; the plan never
//! schedules a request in the step that told it to wait, never has two claimants of one block
//! in one marked set; at shutdown every request is accounted for and every block released.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::baseline::{BaselineConfig, MutexScheduler};
use crate::stress::{run_stress, BaselineKind, Preset, Rate, StressConfig};
use kvsched::rules::recovery::{Disposition, Mode, Policy, RequestClass};
use kvsched::runtime::{StepOutput, SubmitRequest};
use kvsched_testkit::SimEngine;
use kvsched_testkit::{SimConfig, SimConnector, SplitMix64};

fn run(seed: u64, preset: Preset, mode: Mode, policy: Policy, steps: usize) -> (u64, u64) {
    let sim = Arc::new(SimConnector::new(SimConfig {
        seed,
        hit_ratio: 0.8,
        align_tokens: 64,
        async_ratio: 0.6,
        failure_rate: 0.35,
        shared_failure_share: 0.6,
        max_invalid_per_failure: 3,
        latency_min: Duration::ZERO,
        latency_max: Duration::from_micros(30),
        ..SimConfig::default()
    }));
    let mut b = MutexScheduler::new(BaselineConfig {
        groups: preset.groups(),
        pool_blocks: 1500,
        workers: 2,
        mode,
        policy,
        token_budget: 512,
        max_seqs: 32,
        connector: sim.clone(),
        ..BaselineConfig::default()
    })
    .expect("baseline");
    let mut rng = SplitMix64::new(seed ^ 0xBA5E);
    let bases: Vec<Vec<u32>> = (0..4)
        .map(|_| (0..256).map(|_| rng.next_u64() as u32).collect())
        .collect();
    let (mut next, mut affected, mut claims) = (0u64, 0u64, 0u64);
    let mut out = StepOutput::default();
    let mut engine = SimEngine::new(|job| sim.decide(job));
    for step in 0..steps {
        if step < steps * 3 / 4 {
            for _ in 0..rng.below(3) {
                let base = &bases[rng.below(4) as usize];
                let mut prompt = base[..64 + rng.below(190) as usize].to_vec();
                prompt.extend((0..1 + rng.below(60)).map(|_| rng.next_u64() as u32));
                let id = format!("r{next}");
                next += 1;
                b.submit(SubmitRequest {
                    id,
                    prompt,
                    max_new_tokens: 1 + rng.below(6) as u32,
                    priority: 0,
                    load_deadline: None,
                })
                .expect("submit");
            }
        }
        if rng.below(20) == 0 && next > 0 {
            b.cancel(&format!("r{}", rng.below(next)));
        }
        b.update(std::mem::take(&mut out));
        let plan = b.schedule();
        let v = b.check_invariants();
        assert!(v.is_empty(), "seed {seed} {preset:?} step {step}: {v:?}");
        let waiting: BTreeSet<&str> = plan
            .recovery
            .recovered
            .iter()
            .filter(|r| !r.decision.waits_for.is_empty())
            .map(|r| &*r.id)
            .collect();
        let mut claimed = BTreeSet::new();
        for r in &plan.recovery.recovered {
            affected += 1;
            if policy == Policy::Fail {
                assert_eq!(r.decision.disposition, Disposition::Failed);
            }
            let set = mode == Mode::Vllm && r.class == RequestClass::Sync;
            for &blk in &r.decision.claimed_blocks {
                claims += 1;
                assert!(
                    claimed.insert((set, blk)),
                    "block {blk} claimed twice at step {step}"
                );
                assert!(plan.recovery.report.binary_search(&blk).is_ok());
            }
        }
        for s in &plan.scheduled {
            assert!(
                !waiting.contains(&*s.id),
                "{} scheduled while waiting",
                s.id
            );
        }
        out = engine.step_with(&plan, |_| rng.below(50) == 0);
        if plan.scheduled.is_empty() {
            b.wait_for_work(Duration::from_micros(200));
        }
    }
    let report = b.shutdown();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    let m = &report.metrics;
    assert_eq!(m.submitted, next);
    assert_eq!(m.finished + m.failed + m.cancelled, m.submitted, "{m:?}");
    assert!(report.census.conserved());
    assert_eq!(report.census.referenced, 0);
    (affected, claims)
}

#[test]
fn baseline_keeps_invariants_under_failures() {
    let presets = [
        Preset::Dense,
        Preset::HybridSwa,
        Preset::HybridMamba,
        Preset::Mixed16_32_64,
    ];
    let (mut affected, mut claims) = (0, 0);
    let mut i = 0u64;
    for mode in [Mode::Safe, Mode::Vllm] {
        for policy in [Policy::Recompute, Policy::Fail] {
            for preset in presets {
                i += 1;
                let (a, c) = run(i, preset, mode, policy, 300);
                affected += a;
                claims += c;
            }
        }
    }
    assert!(
        affected > 50 && claims > 50,
        "too little recovery exercised: {affected} affected, {claims} claims"
    );
}

#[test]
fn stress_runs_both_schedulers_on_the_same_workload() {
    let cfg = StressConfig {
        requests: 200,
        rate: Rate::Max,
        live: 64,
        duration_s: 10.0,
        model_us: 0,
        failure_rate: 0.2,
        baseline: Some(BaselineKind::Mutex),
        // The sim store holds most of each prompt, so both schedulers load (and fail loads).
        hit_ratio: 0.75,
        ..StressConfig::default()
    };
    let r = run_stress(&cfg).expect("stress");
    assert!(r.invariants_ok(), "{:?}", r.violations());
    let b = r.baseline.as_ref().expect("baseline run");
    assert_eq!(r.run.requests.submitted, 200);
    assert_eq!(b.requests.submitted, 200);
    assert!(r.ratios.is_some());
    assert!(r.run.loads.ok + r.run.loads.failed > 0 && b.loads.ok + b.loads.failed > 0);
}
