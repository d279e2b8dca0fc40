//! One algorithm, two synchronisation designs. The mutex baseline runs the runtime's own shard
//! code over its plain pool and claim words under one lock, so on the same seeded workload
//! with no timing-dependent input one shard and the baseline decide alike — at every step,
//! not only in total. What this checks is everything the two do not share: the baseline's
//! strategy (allocation order, reclaim, prefix hits, claims, pending marks), its engine side
//! (the output checks, the report's engine share, hand-offs) and its workers — and, across
//! shard counts, what the runtime's parallel step and budget split change.
//!
//! *No timing-dependent input*: every request is submitted before the first step, loads are
//! instant, and before every step the engine waits until every asynchronous load dispatched
//! so far has delivered its completion (`loads_in_flight() == 0`, what `kvsched stress
//! --lockstep` does), so both take the same completions in the same step; client cancels and
//! engine finishes fall on step numbers and request ids, never on a clock. The runtime runs
//! without the mechanisms the baseline lacks — load deadlines, the retry budget, quarantine —
//! which would otherwise have it offer fewer external loads.
//!
//! What the shard count itself changes is asserted exactly: each of `K` shards schedules
//! within `1/K` of the step's budgets, so under a binding sequence budget a step admits the
//! first `max_seqs / K` waiting requests *of each shard* rather than the first `max_seqs`
//! overall. Two more sources of difference are kept out of the multi-shard comparison by
//! construction and named in the stress report instead: a prefix registered by one shard is
//! found by another in a parallel step only if it registered first (here every prefix family
//! lives on one shard), and a shard preempts only its own requests (here the pool never runs
//! out).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::baseline::{BaselineConfig, MutexScheduler};
use crate::stress::{Preset, Scheduler};
use kvsched::rules::recovery::{Mode, Policy};
use kvsched::runtime::route::shard_of;
use kvsched::runtime::{EndState, Metrics, Runtime, Settings, StepOutput, StepPlan, SubmitRequest};
use kvsched_testkit::hash_str;
use kvsched_testkit::SimEngine;
use kvsched_testkit::{SimConfig, SimConnector, SplitMix64};

/// Prefix families (base prompts that requests share a prefix of).
const FAMILIES: usize = 6;
/// Steps after which a run that has not ended every request fails.
const MAX_STEPS: u64 = 5_000;

#[derive(Clone, Copy, Debug)]
struct Case {
    seed: u64,
    preset: Preset,
    mode: Mode,
    policy: Policy,
    pool_blocks: usize,
    token_budget: u64,
    max_seqs: usize,
    requests: usize,
    /// Share of each prompt the connector offers to load.
    hit_ratio: f64,
    /// Each prefix family's request ids route to one of this many shards (1: anywhere).
    families_on: usize,
}

/// A scheduled request: id, computed tokens, tokens, samples, its sync load's range.
type Scheduled = (String, u64, u64, bool, Option<(u64, u64)>);
/// A recovered request: id, disposition, computed tokens after, tokens rolled back, blocks
/// claimed, blocks waited for.
type Recovered = (String, String, u64, u64, usize, usize);

/// One step's decisions, independent of block ids and of the order shards report in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Decisions {
    scheduled: Vec<Scheduled>,
    recovered: Vec<Recovered>,
    ended: Vec<(String, EndState)>,
    /// Blocks in the step's report.
    report: usize,
}

impl Decisions {
    fn of(plan: &StepPlan) -> Self {
        let mut d = Decisions {
            scheduled: plan
                .scheduled
                .iter()
                .map(|s| {
                    let load = s
                        .sync_load
                        .as_deref()
                        .map(|j| (j.start_tokens, j.end_tokens));
                    let id = s.id.to_string();
                    (id, s.num_computed_tokens, s.num_tokens, s.samples, load)
                })
                .collect(),
            recovered: plan
                .recovery
                .recovered
                .iter()
                .map(|r| {
                    let d = &r.decision;
                    (
                        r.id.to_string(),
                        format!("{:?}", d.disposition),
                        d.num_computed_tokens,
                        d.affected_tokens,
                        d.claimed_blocks.len(),
                        d.waits_for.len(),
                    )
                })
                .collect(),
            ended: plan
                .ended
                .iter()
                .map(|(id, e)| (id.to_string(), *e))
                .collect(),
            report: plan.recovery.report.len(),
        };
        d.scheduled.sort();
        d.recovered.sort();
        d.ended.sort_by(|a, b| a.0.cmp(&b.0));
        d
    }
}

/// What one scheduler did on a case.
struct Run {
    name: String,
    steps: Vec<Decisions>,
    metrics: Metrics,
    early_finishes: u64,
}

/// The totals both must agree on: every decision counter the two have in common.
fn totals(m: &Metrics) -> [(&'static str, u64); 22] {
    [
        ("submitted", m.submitted),
        ("finished", m.finished),
        ("failed", m.failed),
        ("cancelled", m.cancelled),
        ("loads_dispatched", m.loads_dispatched),
        ("loads_ok", m.loads_ok),
        ("loads_failed", m.loads_failed),
        ("stale_completions", m.stale_completions),
        ("stale_blocks", m.stale_blocks),
        ("claims", m.claims),
        ("handoffs", m.handoffs),
        ("tokens_recomputed", m.tokens_recomputed),
        ("preemptions", m.preemptions),
        ("length_capped", m.length_capped),
        ("foreign_blocks", m.foreign_blocks),
        ("unexpected_samples", m.unexpected_samples),
        ("missing_samples", m.missing_samples),
        ("unknown_commands", m.unknown_commands),
        ("sync_loads_ok", m.sync_loads_ok),
        ("sync_loads_failed", m.sync_loads_failed),
        ("connector_panics", m.connector_panics),
        ("steps", m.steps),
    ]
}

/// The seeded connector of `c`: instant loads, many failures, sync and async loads.
fn connector(c: &Case) -> Arc<SimConnector> {
    let s = kvsched::rules::geometry::Geometry::new(c.preset.groups(), None, 0)
        .map(|g| g.scheduler_block_size())
        .unwrap_or(16);
    Arc::new(SimConnector::new(SimConfig {
        seed: c.seed,
        hit_ratio: c.hit_ratio,
        align_tokens: s,
        async_ratio: 0.6,
        failure_rate: 0.15,
        shared_failure_share: 0.5,
        max_invalid_per_failure: 3,
        latency_min: Duration::ZERO,
        latency_max: Duration::ZERO,
        ..SimConfig::default()
    }))
}

/// An id for request `i` of family `f`, routed to shard `f % shards` when `shards > 1`.
fn family_id(f: usize, i: usize, shards: usize) -> String {
    (0u64..)
        .map(|n| format!("f{f}-r{i}-{n}"))
        .find(|id| shards <= 1 || shard_of(id, shards) == f % shards)
        .unwrap_or_default()
}

/// The seeded requests (prompts sharing a prefix of one of a few families, mixed priorities),
/// each with the step at which the client cancels it, if it does.
fn workload(c: &Case) -> Vec<(SubmitRequest, Option<u64>)> {
    let mut rng = SplitMix64::new(c.seed ^ 0x5A3E_D0C5);
    let bases: Vec<Vec<u32>> = (0..FAMILIES)
        .map(|_| (0..256).map(|_| rng.next_u64() as u32).collect())
        .collect();
    (0..c.requests)
        .map(|i| {
            let f = rng.below(FAMILIES as u64) as usize;
            let mut prompt = bases[f][..32 + rng.below(200) as usize].to_vec();
            prompt.extend((0..1 + rng.below(60)).map(|_| rng.next_u64() as u32));
            let req = SubmitRequest {
                id: family_id(f, i, c.families_on),
                prompt,
                max_new_tokens: 1 + rng.below(8) as u32,
                priority: rng.below(3) as i16 - 1,
                load_deadline: None,
            };
            let cancel_at = (rng.below(25) == 0).then(|| 1 + rng.below(40));
            (req, cancel_at)
        })
        .collect()
}

/// Whether the engine finishes request `id` on its own at `step` (a stop token): a draw on
/// the seed, the id and the step only.
fn finishes(seed: u64, id: &str, step: u64) -> bool {
    SplitMix64::new(seed ^ hash_str(id) ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)).unit() < 0.02
}

/// Waits until every asynchronous load dispatched so far has delivered its completion.
fn settle<S: Scheduler>(sched: &S) {
    let since = Instant::now();
    while sched.loads_in_flight() > 0 {
        // Instant loads deliver within microseconds; this only keeps a lost completion from
        // hanging the test.
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "a load never delivered its completion"
        );
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Runs the workload of `c` through `sched` in lockstep until every request has ended.
fn drive<S: Scheduler>(mut sched: S, name: String, c: &Case, sim: &SimConnector) -> Run {
    let mut cancels: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (req, cancel_at) in workload(c) {
        if let Some(at) = cancel_at {
            cancels.entry(at).or_default().push(req.id.clone());
        }
        sched.submit(req).expect("submit");
    }
    let mut engine = SimEngine::new(|job| sim.decide(job));
    let mut out = StepOutput::default();
    let mut steps = Vec::new();
    for step in 1..=MAX_STEPS {
        settle(&sched);
        for id in cancels.remove(&step).unwrap_or_default() {
            sched.cancel(&id);
        }
        sched.update(std::mem::take(&mut out));
        let plan = sched.schedule().expect("step");
        out = engine.step_with(&plan, |s| finishes(c.seed, &s.id, step));
        steps.push(Decisions::of(&plan));
        if step % 16 == 0 {
            let v = sched.check_invariants();
            assert!(v.is_empty(), "{name} {c:?} step {step}: {v:?}");
        }
        let m = sched.metrics();
        if m.finished + m.failed + m.cancelled == m.submitted {
            break;
        }
    }
    settle(&sched);
    sched.update(out);
    let report = sched.shutdown();
    assert!(report.violations.is_empty(), "{name} {c:?}: {report}");
    assert!(
        report.cancelled_at_shutdown.is_empty(),
        "{name} {c:?}: requests left after {MAX_STEPS} steps"
    );
    Run {
        name,
        steps,
        metrics: report.metrics,
        early_finishes: engine.counts().finishes,
    }
}

fn runtime(c: &Case, shards: usize, inline: bool, sim: &Arc<SimConnector>) -> Runtime {
    Runtime::builder()
        .groups(c.preset.groups())
        .pool_blocks(c.pool_blocks)
        .shards(shards)
        .workers(2)
        .settings(
            Settings::default()
                .with_mode(c.mode)
                .with_policy(c.policy)
                // The mechanisms the baseline lacks, off.
                .with_load_deadline(None)
                .with_max_load_retries(u32::MAX)
                .with_quarantine_after(0),
        )
        .token_budget(c.token_budget)
        .max_seqs(c.max_seqs)
        .connector(sim.clone())
        .inline_steps_up_to(if inline { usize::MAX } else { 0 })
        .build()
        .expect("runtime")
}

fn baseline(c: &Case, sim: &Arc<SimConnector>) -> MutexScheduler {
    MutexScheduler::new(BaselineConfig {
        groups: c.preset.groups(),
        pool_blocks: c.pool_blocks,
        workers: 2,
        mode: c.mode,
        policy: c.policy,
        token_budget: c.token_budget,
        max_seqs: c.max_seqs,
        connector: sim.clone(),
        ..BaselineConfig::default()
    })
    .expect("baseline")
}

fn run_runtime(c: &Case, shards: usize, inline: bool) -> Run {
    let sim = connector(c);
    let name = format!(
        "kvsched {shards} shard(s){}",
        if inline { " inline" } else { "" }
    );
    drive(runtime(c, shards, inline, &sim), name, c, &sim)
}

fn run_baseline(c: &Case) -> Run {
    let sim = connector(c);
    drive(baseline(c, &sim), "mutex".into(), c, &sim)
}

/// `a` and `b` made the same decisions at every step, and their totals agree.
fn assert_same(c: &Case, a: &Run, b: &Run) {
    if let Some(i) =
        (0..a.steps.len().max(b.steps.len())).find(|&i| a.steps.get(i) != b.steps.get(i))
    {
        panic!(
            "{c:?}: {} and {} first decide differently at step {}:\n{}: {:?}\n{}: {:?}",
            a.name,
            b.name,
            i + 1,
            a.name,
            a.steps.get(i),
            b.name,
            b.steps.get(i)
        );
    }
    assert_eq!(
        totals(&a.metrics),
        totals(&b.metrics),
        "{c:?}: {} vs {}",
        a.name,
        b.name
    );
    assert_eq!(a.early_finishes, b.early_finishes);
}

/// The runtime's own mechanisms stayed out of it (the baseline runs without them).
fn assert_no_runtime_only_events(c: &Case, m: &Metrics) {
    let only = [
        m.deadlines_expired,
        m.retry_budget_skips,
        m.quarantine_skips,
        m.cross_shard_preemptions,
        m.lost_outputs,
        m.no_progress_steps,
        m.duplicate_commands,
    ];
    assert_eq!(only, [0; 7], "{c:?}: {m:?}");
}

/// One shard against the baseline, with every budget binding: a small pool (reclaim of cached
/// blocks, preemption), a token budget below the step's work, shared prefixes on hybrid
/// geometries (the bounded prefix search), load failures in both modes and policies.
#[test]
fn one_shard_and_the_baseline_decide_alike_at_every_step() {
    let cases = [
        (Preset::Dense, Mode::Safe, Policy::Recompute),
        (Preset::HybridSwa, Mode::Safe, Policy::Recompute),
        (Preset::HybridMamba, Mode::Vllm, Policy::Recompute),
        (Preset::Mixed16_32_64, Mode::Safe, Policy::Fail),
        (Preset::HybridSwa, Mode::Vllm, Policy::Fail),
        (Preset::HybridMamba, Mode::Safe, Policy::Recompute),
    ];
    let mut sum = Metrics::default();
    let mut early = 0;
    for (i, &(preset, mode, policy)) in cases.iter().enumerate() {
        let c = Case {
            seed: 11 + i as u64,
            preset,
            mode,
            policy,
            pool_blocks: 700,
            token_budget: 768,
            max_seqs: 24,
            requests: 500,
            hit_ratio: 0.8,
            families_on: 1,
        };
        let rt = run_runtime(&c, 1, true);
        let b = run_baseline(&c);
        assert_same(&c, &rt, &b);
        assert_no_runtime_only_events(&c, &rt.metrics);
        sum += &rt.metrics;
        early += rt.early_finishes;
    }
    // The workload exercised what the two could disagree on.
    assert!(sum.preemptions > 0, "{sum:?}");
    assert!(sum.loads_failed > 0 && sum.sync_loads_failed > 0, "{sum:?}");
    assert!(sum.tokens_recomputed > 0 && sum.claims > 0, "{sum:?}");
    assert!(sum.failed > 0 && sum.cancelled > 0 && early > 0, "{sum:?}");
    assert!(sum.loads_ok > 0 && sum.sync_loads_ok > 0, "{sum:?}");
}

/// Two shards, their steps run in parallel and inline, against one shard and the baseline:
/// with budgets that do not bind and every prefix family on one shard, the shard count
/// changes no decision.
#[test]
fn two_shards_decide_as_one_when_budgets_do_not_bind() {
    for (i, preset) in [Preset::Dense, Preset::HybridSwa].into_iter().enumerate() {
        let c = Case {
            seed: 41 + i as u64,
            preset,
            mode: Mode::Safe,
            policy: Policy::Recompute,
            pool_blocks: 1 << 14,
            token_budget: 1 << 20,
            max_seqs: 4096,
            requests: 240,
            hit_ratio: 0.8,
            families_on: 2,
        };
        let one = run_runtime(&c, 1, true);
        let b = run_baseline(&c);
        assert_same(&c, &one, &b);
        for inline in [false, true] {
            let two = run_runtime(&c, 2, inline);
            assert_same(&c, &two, &one);
            assert_no_runtime_only_events(&c, &two.metrics);
        }
        assert!(one.metrics.loads_failed > 0 && one.metrics.tokens_recomputed > 0);
    }
}

/// With a binding sequence budget the shard count does change decisions, exactly as the
/// budget split says: each of two shards admits the first `max_seqs / 2` requests it owns,
/// where one shard (and the baseline) admits the first `max_seqs` overall.
#[test]
fn a_binding_budget_is_split_over_the_shards() {
    let c = Case {
        seed: 6,
        preset: Preset::Dense,
        mode: Mode::Safe,
        policy: Policy::Recompute,
        pool_blocks: 4096,
        token_budget: 1 << 20,
        max_seqs: 8,
        requests: 40,
        // No external loads: every admitted request computes, and is scheduled, at once.
        hit_ratio: 0.0,
        families_on: 1,
    };
    let ids: Vec<String> = workload(&c).into_iter().map(|(r, _)| r.id).collect();
    let first = |run: &Run| -> Vec<String> {
        let mut v: Vec<String> = run.steps[0].scheduled.iter().map(|s| s.0.clone()).collect();
        v.sort();
        v
    };
    let one = run_runtime(&c, 1, true);
    let b = run_baseline(&c);
    assert_same(&c, &one, &b);
    let two = run_runtime(&c, 2, true);
    assert_no_runtime_only_events(&c, &two.metrics);
    // The first step: nothing is cached and nothing loads, so each admitted request is
    // scheduled at once; admission follows canonical order (priority, then submission) among
    // the requests not cancelled before it.
    let by_order = |shard: Option<usize>, n: usize| -> Vec<String> {
        let work = workload(&c);
        let mut order: Vec<(i16, usize, &String)> = work
            .iter()
            .enumerate()
            .filter(|(_, (_, cancel_at))| *cancel_at != Some(1))
            .filter(|(_, (r, _))| shard.is_none_or(|s| shard_of(&r.id, 2) == s))
            .map(|(i, (r, _))| (r.priority, i, &ids[i]))
            .collect();
        order.sort();
        order
            .into_iter()
            .take(n)
            .map(|(_, _, id)| id.clone())
            .collect()
    };
    let mut overall = by_order(None, c.max_seqs);
    overall.sort();
    let mut split: Vec<String> = by_order(Some(0), c.max_seqs / 2);
    split.extend(by_order(Some(1), c.max_seqs / 2));
    split.sort();
    assert_eq!(first(&one), overall);
    assert_ne!(overall, split, "the workload must tell the two apart");
    assert_eq!(first(&two), split);
    // Every request still ends the same way.
    assert_eq!(two.metrics.finished, one.metrics.finished);
    assert_eq!(two.metrics.cancelled, one.metrics.cancelled);
}
