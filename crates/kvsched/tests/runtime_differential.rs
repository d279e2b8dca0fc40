//! Differential and invariant tests of the runtime (docs/runtime.md).
//!
//! Random workloads — prompts sharing prefixes across shards, loads failing on blocks that
//! other shards' requests hold, sync and async loads, cancels and engine finishes — run through
//! the runtime with 1, 2 and 4 shards and 1–4 workers. At every step with a non-empty report,
//! the runtime's recovery (ownership from the claim table, decided concurrently per shard) must
//! equal the sequential rules (`recovery::recover`, ownership from marked sets in canonical
//! order) on the same inputs; and after every step the invariants of docs/runtime.md#invariants must hold.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kvsched::rules::geometry::{BlockId, CacheGroup, Geometry, MambaMode};
use kvsched::rules::recovery::{
    self, Disposition, InvalidSet, Mode, Policy, Request, RequestClass,
};
use kvsched::{Runtime, StepOutput, StepPlan, SubmitRequest};
use kvsched_testkit::SimEngine;
use kvsched_testkit::{SimConfig, SimConnector, SplitMix64};

#[derive(Clone, Copy, Debug)]
struct Config {
    seed: u64,
    shards: usize,
    workers: usize,
    mode: Mode,
    policy: Policy,
    preset: usize,
    steps: usize,
}

fn preset(i: usize) -> Vec<CacheGroup> {
    match i % 4 {
        0 => vec![CacheGroup::full_attention(16)],
        1 => vec![
            CacheGroup::full_attention(16),
            CacheGroup::sliding_window(16, 40),
        ],
        2 => vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(32, MambaMode::Align),
        ],
        _ => vec![
            CacheGroup::full_attention(8),
            CacheGroup::full_attention(16),
            CacheGroup::mamba(32, MambaMode::All),
        ],
    }
}

/// Counts of what a run exercised, so the suite can assert it tested something.
#[derive(Debug, Default)]
struct Seen {
    steps: usize,
    compared_steps: usize,
    affected: usize,
    shared_claims: usize,
    waits: usize,
    handoffs: u64,
    preemptions: u64,
    stale: u64,
}

fn check_step(cfg: &Config, geo: &Geometry, plan: &StepPlan, seen: &mut Seen) {
    seen.steps += 1;
    let rec = &plan.recovery;
    if rec.report.is_empty() {
        assert!(
            rec.recovered.is_empty(),
            "recovery without a report: {cfg:?}"
        );
        return;
    }
    seen.compared_steps += 1;
    // The sequential engine on the very same inputs, in canonical order.
    let requests: Vec<Request> = rec
        .scanned
        .iter()
        .map(|s| Request {
            id: s.id.to_string(),
            class: s.class,
            num_computed_tokens: s.num_computed_tokens,
            num_scheduled_tokens: s.num_scheduled_tokens,
            block_tables: s.block_tables.clone(),
        })
        .collect();
    let keys: Vec<_> = rec.scanned.iter().map(|s| s.key).collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "scanned not in canonical order"
    );
    let invalid = InvalidSet::flat(rec.report.iter().copied(), geo);
    let seq = recovery::recover(geo, cfg.mode, cfg.policy, &requests, &invalid);
    let by_id: HashMap<&str, usize> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    let key_to_id: HashMap<_, &str> = rec.scanned.iter().map(|s| (s.key, &*s.id)).collect();
    let mut runtime_affected = BTreeSet::new();
    for r in &rec.recovered {
        let i = by_id[&*r.id];
        runtime_affected.insert(i);
        let want = &seq.requests[i];
        let got = &r.decision;
        let ctx = || format!("{cfg:?} step {} request {}", plan.step, r.id);
        assert_eq!(got.disposition, want.disposition, "{}", ctx());
        assert_eq!(
            got.num_computed_tokens,
            want.num_computed_tokens,
            "{}",
            ctx()
        );
        assert_eq!(got.affected_tokens, want.affected_tokens, "{}", ctx());
        assert_eq!(got.claimed_blocks, want.claimed_blocks, "{}", ctx());
        assert_eq!(got.evicted_blocks, want.evicted_blocks, "{}", ctx());
        let got_waits: Vec<(BlockId, &str)> = got
            .waits_for
            .iter()
            .map(|(b, k)| (*b, key_to_id[k]))
            .collect();
        let want_waits: Vec<(BlockId, &str)> = want
            .waits_for
            .iter()
            .map(|(b, o)| (*b, requests[*o].id.as_str()))
            .collect();
        assert_eq!(got_waits, want_waits, "{}", ctx());
        seen.affected += 1;
        seen.waits += usize::from(!got.waits_for.is_empty());
    }
    let seq_affected: BTreeSet<usize> = seq.affected.iter().copied().collect();
    assert_eq!(
        runtime_affected, seq_affected,
        "{cfg:?} step {}: affected sets differ",
        plan.step
    );
    assert_eq!(
        rec.evicted_blocks, seq.evicted_blocks,
        "{cfg:?} step {}: evictions differ",
        plan.step
    );

    // Exactly one claim per invalid block per marked set (among blocks in some scan range).
    let mut hits_by_set: BTreeMap<(bool, BlockId), usize> = BTreeMap::new();
    for (i, r) in requests.iter().enumerate() {
        let mut hits = Vec::new();
        recovery::scan_request(geo, r.view(), &invalid, &mut hits);
        let set = cfg.mode == Mode::Vllm && r.class == RequestClass::Sync;
        for h in hits {
            hits_by_set.entry((set, h.block)).or_insert(0);
        }
        let _ = i;
    }
    for r in &rec.recovered {
        let set = cfg.mode == Mode::Vllm && r.class == RequestClass::Sync;
        for b in &r.decision.claimed_blocks {
            *hits_by_set
                .get_mut(&(set, *b))
                .expect("claimed block was never hit") += 1;
        }
    }
    for ((set, b), n) in &hits_by_set {
        assert_eq!(
            *n, 1,
            "{cfg:?} step {}: block {b} (sync set: {set}) claimed {n} times",
            plan.step
        );
    }
    seen.shared_claims += rec
        .recovered
        .iter()
        .filter(|r| r.decision.claimed_blocks.is_empty())
        .count();

    // A request told to wait this step is not scheduled this step.
    let waiting: BTreeSet<&str> = rec
        .recovered
        .iter()
        .filter(|r| !r.decision.waits_for.is_empty())
        .map(|r| &*r.id)
        .collect();
    for s in &plan.scheduled {
        assert!(
            !waiting.contains(&*s.id),
            "{cfg:?} step {}: {} scheduled while waiting",
            plan.step,
            s.id
        );
    }
    // Failed requests are gone; skipped ones are not.
    for r in &rec.recovered {
        if r.decision.disposition == Disposition::Failed {
            assert!(
                plan.scheduled.iter().all(|s| s.id != r.id),
                "failed request scheduled"
            );
        }
    }
}

fn run(cfg: Config) -> Seen {
    let sim = SimConnector::new(SimConfig {
        seed: cfg.seed,
        hit_ratio: 0.8,
        align_tokens: 32,
        async_ratio: 0.6,
        failure_rate: 0.5,
        // Failures name the load's own blocks only: a connector naming the cached prefix
        // below its load is refused (foreign blocks, tests/runtime_trust.rs).
        shared_failure_share: 0.0,
        max_invalid_per_failure: 3,
        latency_min: Duration::ZERO,
        latency_max: Duration::from_micros(30),
        ..SimConfig::default()
    });
    let sim = Arc::new(sim);
    let groups = preset(cfg.preset);
    let mut rt = Runtime::builder()
        .groups(groups.clone())
        // Every third run has a small pool: admission back-pressure and preemption.
        .pool_blocks(if cfg.seed % 3 == 0 { 400 } else { 1500 })
        .shards(cfg.shards)
        .workers(cfg.workers)
        .mode(cfg.mode)
        .policy(cfg.policy)
        .token_budget(512)
        .max_seqs(32)
        .connector(sim.clone())
        .record_recovery_inputs(true)
        // Odd seeds run every step inline on the engine thread, even seeds every step in
        // parallel: both paths must equal the sequential rules.
        .inline_steps_up_to(if cfg.seed % 2 == 1 { usize::MAX } else { 0 })
        .build()
        .expect("runtime");
    let geo = rt.geometry().clone();
    let mut rng = SplitMix64::new(cfg.seed ^ 0xD1FF);
    let bases: Vec<Vec<u32>> = (0..4)
        .map(|_| (0..256).map(|_| rng.next_u64() as u32).collect())
        .collect();
    let mut seen = Seen::default();
    let mut next_id = 0u64;
    let mut out = StepOutput::default();
    let mut engine = SimEngine::new(|job| sim.decide(job));
    let mut live: Vec<String> = Vec::new();
    for step in 0..cfg.steps {
        // Arrivals: share prefixes so blocks are shared across shards.
        if step < cfg.steps * 3 / 4 {
            for _ in 0..rng.below(3) {
                let base = &bases[rng.below(bases.len() as u64) as usize];
                let shared = 32 + rng.below(200) as usize;
                let mut prompt = base[..shared].to_vec();
                prompt.extend((0..1 + rng.below(60)).map(|_| rng.next_u64() as u32));
                let id = format!("r{next_id}");
                next_id += 1;
                let priority = rng.below(3) as i16 - 1;
                // Small-pool runs generate longer, so running requests must grow into a full pool.
                let max_new = 1 + rng.below(if cfg.seed % 3 == 0 { 48 } else { 6 }) as u32;
                rt.submit(SubmitRequest {
                    id: id.clone(),
                    prompt,
                    max_new_tokens: max_new,
                    priority,
                    load_deadline: None,
                })
                .expect("submit");
                live.push(id);
            }
        }
        if rng.below(20) == 0 && !live.is_empty() {
            let victim = live.swap_remove(rng.below(live.len() as u64) as usize);
            rt.cancel(&victim);
        }
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        check_step(&cfg, &geo, &plan, &mut seen);
        let violations = rt.check_invariants();
        assert!(violations.is_empty(), "{cfg:?} step {step}: {violations:?}");
        // The engine: run sync loads, sample, sometimes finish early.
        out = engine.step_with(&plan, |_| rng.below(50) == 0);
        if plan.scheduled.is_empty() && step % 8 == 0 {
            rt.wait_for_work(Duration::from_micros(200));
        }
    }
    let report = rt.shutdown();
    assert!(
        report.violations.is_empty(),
        "{cfg:?}: {:?}",
        report.violations
    );
    let m = &report.metrics;
    assert_eq!(m.submitted, next_id, "{cfg:?}");
    assert_eq!(
        m.finished + m.failed + m.cancelled,
        m.submitted,
        "{cfg:?}: {m:?}"
    );
    assert!(report.census.conserved(), "{cfg:?}: {:?}", report.census);
    assert_eq!(
        report.census.referenced, 0,
        "{cfg:?}: blocks still referenced after shutdown"
    );
    seen.handoffs = m.handoffs;
    seen.preemptions = m.preemptions;
    seen.stale = m.stale_completions + m.stale_blocks;
    seen
}

fn configs(total_steps: usize, seed0: u64) -> Vec<Config> {
    let mut v = Vec::new();
    let mut i = 0u64;
    for &shards in &[1usize, 2, 4] {
        for mode in [Mode::Safe, Mode::Vllm] {
            for policy in [Policy::Recompute, Policy::Fail] {
                v.push(Config {
                    seed: seed0 + i,
                    shards,
                    workers: 1 + (i as usize % 4),
                    mode,
                    policy,
                    preset: i as usize,
                    steps: 0,
                });
                i += 1;
            }
        }
    }
    let per = total_steps / v.len() + 1;
    for c in &mut v {
        c.steps = per;
    }
    v
}

#[test]
fn runtime_matches_sequential_rules_and_keeps_invariants() {
    let mut total = Seen::default();
    let mut vllm_shared = 0u64;
    for cfg in configs(10_200, 1) {
        let vllm = cfg.mode == Mode::Vllm;
        let mut s = run(cfg);
        if vllm {
            // vLLM's design caches sync-load destinations at allocation: sharers of a
            // failed load exist, and the claim table decides them as the rules do.
            vllm_shared += s.shared_claims as u64 + s.waits as u64 + s.handoffs;
            (s.shared_claims, s.waits, s.handoffs) = (0, 0, 0);
        }
        total.steps += s.steps;
        total.compared_steps += s.compared_steps;
        total.affected += s.affected;
        total.shared_claims += s.shared_claims;
        total.waits += s.waits;
        total.handoffs += s.handoffs;
        total.preemptions += s.preemptions;
        total.stale += s.stale;
    }
    eprintln!("mode safe: {total:?}; mode vllm: {vllm_shared} shared claims");
    assert!(total.steps >= 10_000, "{total:?}");
    // The workload must actually exercise recovery, sharing and waiting.
    assert!(total.compared_steps >= 500, "{total:?}");
    assert!(total.preemptions >= 5, "{total:?}");
    // In mode safe an invalid block has one holder: a block becomes findable in the prefix
    // cache only once its bytes are known written, and a failure may name only the loader's
    // own blocks. So nobody shares a reported block, waits or takes one over. (Shared
    // reports are exercised by mode vllm above, through the claim path on replayed
    // scenarios, and by loom.)
    assert_eq!(total.shared_claims, 0, "{total:?}");
    assert_eq!(total.waits, 0, "{total:?}");
    assert_eq!(total.handoffs, 0, "{total:?}");
}

#[test]
#[ignore = "soak: run with --ignored"]
fn soak_runtime_matches_sequential_rules() {
    let seed = std::env::var("KVSCHED_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    for cfg in configs(200_000, seed) {
        run(cfg);
    }
}
