//! `Runtime::update` names the outputs to discard before the engine emits them: the requests
//! whose step read a block one of the step's sync loads failed to fill. The next plan's
//! recovery must discard exactly those (sync requests in `skip`, or failed under `fail`), on
//! random workloads with shared prefixes, several shards, hybrid geometries and both modes.
//! A block a failed sync load shares between its running loader and a loading request is
//! claimed once per scan in mode `vllm`, which keeps a marked set per scan, and an owner that
//! ends there before recomputing it hands nothing off (mode `vllm` has no pending marks).

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};

use kvsched::rules::recovery::{Disposition, RequestClass};
use kvsched::{
    BlockRef, CacheGroup, MambaMode, Mode, Policy, Runtime, StepOutput, StepPlan, SubmitRequest,
};
use kvsched_testkit::{SimConfig, SimConnector, SplitMix64};

/// The engine's report of a failed block: as the plan named it, or (`newer`) at a generation
/// past it, as an engine with its generations wrong would.
fn run(
    seed: u64,
    groups: Vec<CacheGroup>,
    mode: Mode,
    policy: Policy,
    shards: usize,
    newer: bool,
) -> usize {
    let conn = Arc::new(SimConnector::new(SimConfig {
        seed,
        hit_ratio: 0.8,
        align_tokens: 16,
        async_ratio: 0.0, // every load is a sync load
        failure_rate: 0.3,
        shared_failure_share: 0.0,
        max_invalid_per_failure: 2,
        latency_min: Duration::ZERO,
        latency_max: Duration::ZERO,
        ..SimConfig::default()
    }));
    let dyn_conn: Arc<dyn KvConnector> = conn.clone();
    let mut rt = Runtime::builder()
        .groups(groups)
        .scheduler_block_size(16)
        .pool_blocks(4096)
        .shards(shards)
        .workers(1)
        .mode(mode)
        .policy(policy)
        .connector(dyn_conn)
        .build()
        .expect("runtime");
    let mut rng = SplitMix64::new(seed);
    let prefixes: Vec<Vec<u32>> = (0..3)
        .map(|p| (0..64).map(|t| p * 1000 + t).collect())
        .collect();
    for i in 0..40u32 {
        let mut prompt = prefixes[rng.below(3) as usize].clone();
        prompt.extend((0..rng.below(40) as u32 + 1).map(|t| 100_000 + i * 100 + t));
        rt.submit(SubmitRequest {
            id: format!("r{i}"),
            prompt,
            max_new_tokens: 3,
            priority: 0,
            load_deadline: None,
        })
        .expect("submit");
    }
    let mut expected: Option<BTreeSet<String>> = None;
    let mut checked = 0;
    for _ in 0..400 {
        let plan = rt.schedule().expect("step");
        if let Some(want) = expected.take() {
            let got: BTreeSet<String> = plan
                .recovery
                .recovered
                .iter()
                .filter(|r| r.class == RequestClass::Sync)
                .filter(|r| {
                    matches!(
                        r.decision.disposition,
                        Disposition::Skip | Disposition::Failed
                    )
                })
                .map(|r| r.id.to_string())
                .collect();
            assert_eq!(got, want, "seed {seed} step {}", plan.step);
            checked += want.len();
        }
        let mut out = StepOutput::for_plan(&plan);
        let mut failed_loader = BTreeSet::new();
        for s in &plan.scheduled {
            if let Some(job) = &s.sync_load {
                if let LoadResult::Failed(bad) = conn.decide(job) {
                    out.invalid_blocks
                        .extend(bad.into_flat().into_iter().map(|b| BlockRef {
                            generation: b.generation + u32::from(newer),
                            ..b
                        }));
                    failed_loader.insert(s.id.to_string());
                }
            }
            if s.samples {
                out.sampled.push(s.id.clone());
            }
        }
        let discard_now: BTreeSet<String> = rt.update(out).iter().map(|s| s.to_string()).collect();
        // Every loader whose own load failed discards its output.
        assert!(
            failed_loader.is_subset(&discard_now),
            "seed {seed}: loaders {failed_loader:?} not in {discard_now:?}"
        );
        expected = Some(discard_now);
        if rt.live() == 0 {
            break;
        }
        rt.wait_for_work(Duration::from_millis(1));
    }
    rt.shutdown();
    checked
}

fn hybrid() -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(16),
        CacheGroup::sliding_window(8, 24),
        CacheGroup::mamba(16, MambaMode::Align),
    ]
}

#[test]
fn discard_set_is_the_next_recoverys_sync_affected_set() {
    let mut checked = 0;
    for seed in 1..=6 {
        for (mode, policy) in [
            (Mode::Safe, Policy::Recompute),
            (Mode::Vllm, Policy::Recompute),
            (Mode::Safe, Policy::Fail),
        ] {
            for shards in [1, 2] {
                checked += run(
                    seed,
                    vec![CacheGroup::full_attention(16)],
                    mode,
                    policy,
                    shards,
                    false,
                );
                checked += run(seed, hybrid(), mode, policy, shards, false);
            }
        }
    }
    // The workloads must actually exercise discards.
    eprintln!("{checked} discarded outputs checked");
    assert!(checked > 50, "only {checked} discards checked");
}

/// A failed sync load's blocks reported at a newer generation than the plan's — which no
/// earlier use of the slot had — still discard the outputs that read them, and recovery
/// recomputes them: the report is about this step's load, its generation is wrong.
#[test]
fn failed_blocks_named_at_a_newer_generation_are_still_discarded() {
    let mut checked = 0;
    for seed in 1..=3 {
        for shards in [1, 2] {
            checked += run(seed, hybrid(), Mode::Safe, Policy::Recompute, shards, true);
        }
    }
    assert!(checked > 10, "only {checked} discards checked");
}

/// Prompts starting with token 7: a sync load of their first 64 tokens when nothing is
/// local, else an async load of what they lack of their first 96, which lands only once the
/// gate opens. Records each lookup's local tokens.
#[derive(Default)]
struct Staged {
    open: Mutex<bool>,
    opened: Condvar,
    local: Mutex<Vec<(String, u64)>>,
}

impl Staged {
    fn open(&self) {
        *self.open.lock().expect("gate") = true;
        self.opened.notify_all();
    }
}

impl KvConnector for Staged {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        if q.prompt.first() != Some(&7) {
            return LookupResult::default();
        }
        self.local
            .lock()
            .expect("lookups")
            .push((q.request.to_string(), q.local_tokens));
        if q.local_tokens == 0 {
            return LookupResult {
                external_tokens: 64,
                load_async: false,
            };
        }
        LookupResult {
            external_tokens: 96u64.saturating_sub(q.local_tokens),
            load_async: true,
        }
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        // A hang guard, not a timing assertion: the test opens the gate.
        let open = self.open.lock().expect("gate");
        let _ = self
            .opened
            .wait_timeout_while(open, Duration::from_secs(60), |open| !*open);
        LoadResult::Ok
    }
}

fn staged_runtime(mode: Mode, conn: &Arc<Staged>) -> Runtime {
    let dyn_conn: Arc<dyn KvConnector> = conn.clone();
    Runtime::builder()
        .groups(vec![CacheGroup::full_attention(16)])
        .pool_blocks(256)
        .mode(mode)
        .connector(dyn_conn)
        .build()
        .expect("runtime")
}

fn staged_request(id: &str) -> SubmitRequest {
    SubmitRequest {
        id: id.into(),
        prompt: (0..120).map(|t| if t == 0 { 7 } else { 500 + t }).collect(),
        max_new_tokens: 4,
        priority: 0,
        load_deadline: None,
    }
}

/// Mode `vllm`: the loader and a later request with the same prompt are admitted in one step,
/// and the engine reports the loader's first loaded block unwritten. The runtime, that block
/// and the plan of the step that recovers.
fn loaders_first_block_fails(conn: &Arc<Staged>) -> (Runtime, BlockRef, StepPlan) {
    let mut rt = staged_runtime(Mode::Vllm, conn);
    rt.submit(staged_request("loader")).expect("submit");
    rt.submit(staged_request("loading")).expect("submit");
    let plan = rt.schedule().expect("step");
    let failed = plan
        .scheduled
        .iter()
        .find_map(|s| s.sync_load.as_deref())
        .map(|j| j.all_loaded_blocks()[0])
        .expect("the loader's sync load");
    let mut out = StepOutput::all_sampled(&plan);
    out.invalid_blocks.push(failed);
    rt.update(out);
    let plan = rt.schedule().expect("step");
    (rt, failed, plan)
}

/// Mode `vllm` scans the async and the sync requests with a marked set each (docs/rules.md,
/// "The two scans"): a failed block that a running request (the sync load's loader) and a
/// loading one (a later request with the same prompt, admitted in the same step, which reuses
/// the loader's blocks and loads more) both hold is claimed once in each scan.
#[test]
fn mode_vllm_claims_a_block_shared_across_the_scans_once_in_each() {
    let conn = Arc::new(Staged::default());
    let (rt, failed, plan) = loaders_first_block_fails(&conn);
    let local = conn.local.lock().expect("lookups").clone();
    assert_eq!(
        local,
        [("loader".to_string(), 0), ("loading".to_string(), 64)],
        "the later request reuses the loader's blocks"
    );
    let mut claimants: Vec<(String, RequestClass)> = plan
        .recovery
        .recovered
        .iter()
        .filter(|r| r.decision.claimed_blocks.contains(&failed.id))
        .map(|r| (r.id.to_string(), r.class))
        .collect();
    claimants.sort_by(|a, b| a.0.cmp(&b.0));
    conn.open();
    let _ = rt.shutdown();
    assert_eq!(
        claimants,
        [
            ("loader".to_string(), RequestClass::Sync),
            ("loading".to_string(), RequestClass::Async)
        ]
    );
}

/// Mode `vllm` has no pending marks and no hand-offs (sharers never wait for an owner): an
/// owner that ends before it recomputed a block another request holds hands nothing off.
#[test]
fn mode_vllm_hands_off_nothing_when_an_owner_ends_before_recomputing() {
    let conn = Arc::new(Staged::default());
    let (mut rt, failed, plan) = loaders_first_block_fails(&conn);
    assert!(
        plan.recovery
            .recovered
            .iter()
            .any(|r| &*r.id == "loader" && r.decision.claimed_blocks.contains(&failed.id)),
        "{:?}",
        plan.recovery
    );
    // The loader ends before its recompute comes back.
    rt.cancel("loader");
    rt.update(StepOutput::for_plan(&plan));
    for _ in 0..2 {
        let plan = rt.schedule().expect("step");
        rt.update(StepOutput::for_plan(&plan));
    }
    conn.open();
    let m = rt.shutdown().metrics;
    assert_eq!(m.handoffs, 0, "{m:?}");
}

/// A sync load of 64 tokens for the first request that looks up (which fails, or succeeds),
/// and nothing for the others.
struct OneSyncLoad {
    offered: std::sync::atomic::AtomicBool,
    fails: bool,
}

impl OneSyncLoad {
    fn new(fails: bool) -> Arc<Self> {
        Arc::new(OneSyncLoad {
            offered: Default::default(),
            fails,
        })
    }
}

impl KvConnector for OneSyncLoad {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let first = !self
            .offered
            .swap(true, std::sync::atomic::Ordering::Relaxed);
        if q.local_tokens == 0 && first {
            LookupResult {
                external_tokens: 64,
                load_async: false,
            }
        } else {
            LookupResult::default()
        }
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        if self.fails {
            LoadResult::all_failed(job)
        } else {
            LoadResult::Ok
        }
    }
}

/// A mode `vllm` runtime of `groups` on `shards` shards holding one request, `a`: 96 tokens,
/// 4 to generate, whose first lookup is a sync load of 64 tokens that fails.
fn one_failing_loader(groups: Vec<CacheGroup>, shards: usize) -> Runtime {
    let rt = Runtime::builder()
        .groups(groups)
        .pool_blocks(64)
        .shards(shards)
        .mode(Mode::Vllm)
        .connector(OneSyncLoad::new(true))
        .build()
        .unwrap();
    rt.submit(SubmitRequest {
        id: "a".into(),
        prompt: (0..96).collect(),
        max_new_tokens: 4,
        priority: 0,
        load_deadline: None,
    })
    .unwrap();
    rt
}

/// Every sample `update` does not name for discard is kept, across a live switch from
/// `vllm` to `safe`: the first `safe` step restarts a request a `vllm` recovery rolled back
/// to its hit rounded down (its Mamba state there may not exist) only once it has applied
/// the last step's output, so the engine's kept token counts and the request emits exactly
/// its tokens (dropped, it would be asked for the same position again: one token too many).
/// The switch comes after each of the request's kept tokens in turn, on one and two shards.
/// The tokens a step emitted: its samples `update` did not return for discard.
fn kept_samples(plan: &StepPlan, discard: &[Arc<str>]) -> usize {
    plan.scheduled
        .iter()
        .filter(|s| s.samples && !discard.contains(&s.id))
        .count()
}

#[test]
fn a_kept_sample_counts_across_a_switch_to_safe() {
    for shards in [1, 2] {
        for switch_after in 1..4 {
            let case = format!("{shards} shards, switch after {switch_after} tokens");
            let mut rt = one_failing_loader(
                vec![
                    CacheGroup::full_attention(16),
                    CacheGroup::mamba(32, MambaMode::Align),
                ],
                shards,
            );
            let (mut emitted, mut restarted, mut first) = (0, false, true);
            for _ in 0..40 {
                if rt.live() == 0 {
                    break;
                }
                if emitted == switch_after && rt.settings().mode == Mode::Vllm {
                    rt.update_settings(rt.settings().with_mode(Mode::Safe))
                        .unwrap();
                }
                let plan = rt.schedule().expect("step");
                let mut out = StepOutput::all_sampled(&plan);
                for s in &plan.scheduled {
                    restarted |= rt.settings().mode == Mode::Safe && s.num_computed_tokens == 0;
                    if let Some(job) = s.sync_load.as_ref().filter(|_| first) {
                        // The load fails to fill the full-attention block of [32, 48).
                        out.invalid_blocks.push(job.block_tables[0][2]);
                        first = false;
                    }
                }
                emitted += kept_samples(&plan, &rt.update(out));
            }
            assert_eq!(rt.live(), 0, "{case}: still live");
            assert!(
                restarted,
                "{case}: the safe step restarted nothing: tests nothing"
            );
            assert_eq!(emitted, 4, "{case}: tokens emitted");
            let report = rt.shutdown();
            assert!(report.violations.is_empty(), "{case}: {report}");
        }
    }
}

/// Mode `vllm` caches a sync load's destinations as it admits the loader, and a request
/// admitted after it in the same step shares them. The loader ends; after a live switch to
/// `safe`, the first `safe` step reports those blocks (nothing remembers that the load
/// succeeded) and rolls the sharer back — but its last `vllm` step's sample, which `update`
/// told the engine to keep, still counts: the sharer emits exactly its tokens.
#[test]
fn a_kept_sample_counts_when_the_first_safe_step_rolls_its_request_back() {
    for shards in [1, 2] {
        let mut rt = Runtime::builder()
            .groups(vec![CacheGroup::full_attention(16)])
            .pool_blocks(64)
            .shards(shards)
            .inline_steps_up_to(usize::MAX)
            .mode(Mode::Vllm)
            .connector(OneSyncLoad::new(false))
            .build()
            .unwrap();
        let shared: Vec<u32> = (0..64).collect();
        for (id, extra, max_new_tokens) in [("loader", 16, 1), ("sharer", 32, 4)] {
            let prompt = shared.iter().copied().chain(1000..1000 + extra).collect();
            rt.submit(SubmitRequest {
                id: id.into(),
                prompt,
                max_new_tokens,
                priority: 0,
                load_deadline: None,
            })
            .unwrap();
        }
        let mut emitted = std::collections::HashMap::<String, usize>::new();
        let mut rolled_back = false;
        for _ in 0..40 {
            if rt.live() == 0 {
                break;
            }
            if emitted.get("sharer") == Some(&2) && rt.settings().mode == Mode::Vllm {
                rt.update_settings(rt.settings().with_mode(Mode::Safe))
                    .unwrap();
            }
            let plan = rt.schedule().expect("step");
            rolled_back |= rt.settings().mode == Mode::Safe
                && plan.recovery.recovered.iter().any(|r| &*r.id == "sharer");
            let discard = rt.update(StepOutput::all_sampled(&plan));
            for s in plan.scheduled.iter().filter(|s| s.samples) {
                if !discard.contains(&s.id) {
                    *emitted.entry(s.id.to_string()).or_default() += 1;
                }
            }
        }
        assert_eq!(rt.live(), 0, "{shards} shards: still live");
        assert!(
            rolled_back,
            "{shards} shards: the first safe step rolled nothing back: tests nothing"
        );
        assert_eq!(emitted["loader"], 1, "{shards} shards");
        assert_eq!(
            emitted["sharer"], 4,
            "{shards} shards: tokens the sharer emitted"
        );
        let report = rt.shutdown();
        assert!(report.violations.is_empty(), "{shards} shards: {report}");
    }
}

/// A lost output before a live switch from `vllm` to `safe`: the first `safe` step restarts
/// the request a `vllm` recovery rolled back to its hit rounded down, and nothing of the lost
/// step counts — but the restart ends that loss: the restarted run's first sample, which the
/// engine keeps, counts, and the request is not restarted again (it would emit one token too
/// many). The lost step is each of the request's steps after its failed load in turn, on one
/// and two shards, dense and with a Mamba group.
#[test]
fn a_lost_output_before_a_switch_to_safe_is_lost_once() {
    for shards in [1, 2] {
        for mamba in [false, true] {
            for lose_at in 2..6 {
                let case = format!("{shards} shards, mamba {mamba}, step {lose_at} lost");
                let mut groups = vec![CacheGroup::full_attention(16)];
                if mamba {
                    groups.push(CacheGroup::mamba(32, MambaMode::Align));
                }
                let mut rt = one_failing_loader(groups, shards);
                let (mut emitted, mut restarts, mut first) = (0, 0, true);
                for step in 1..40 {
                    if rt.live() == 0 {
                        break;
                    }
                    let plan = rt.schedule().expect("step");
                    let mut out = StepOutput::all_sampled(&plan);
                    for s in &plan.scheduled {
                        restarts += usize::from(
                            rt.settings().mode == Mode::Safe && s.num_computed_tokens == 0,
                        );
                        if let Some(job) = s.sync_load.as_ref().filter(|_| first) {
                            // The load fails to fill the full-attention block of [32, 48).
                            out.invalid_blocks.push(job.block_tables[0][2]);
                            first = false;
                        }
                    }
                    if step == lose_at {
                        // The engine never answers this step, and switches.
                        rt.update_settings(rt.settings().with_mode(Mode::Safe))
                            .unwrap();
                        continue;
                    }
                    emitted += kept_samples(&plan, &rt.update(out));
                }
                assert_eq!(rt.live(), 0, "{case}: still live");
                assert_eq!(restarts, 1, "{case}: restarts");
                assert_eq!(emitted, 4, "{case}: tokens emitted");
                let report = rt.shutdown();
                assert!(report.violations.is_empty(), "{case}: {report}");
            }
        }
    }
}
