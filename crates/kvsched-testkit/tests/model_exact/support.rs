//! The model tests' stack: a runtime, a `TierConnector` and the model engine on host KV
//! memory, and the engine loop that answers plans and saves what kept steps computed.

use std::sync::Arc;
use std::time::Duration;

use kvsched::connector::KvConnector;
use kvsched::kv::{HostKvMemory, KvMemory, Tier, TierConnector, TierConnectorConfig};
use kvsched::{CacheGroup, MambaMode, Mode, Report, Runtime, StepOutput, StepPlan, SubmitRequest};
use kvsched_testkit::{ModelCounts, ModelEngine, ModelShape, TinyModel};

pub(crate) struct Run {
    pub(crate) model: ModelCounts,
    pub(crate) report: Report,
}

pub(crate) struct Knobs {
    pub(crate) mode: Mode,
    pub(crate) async_ratio: f64,
    pub(crate) pool: usize,
    pub(crate) budget: u64,
    pub(crate) corrupt: f64,
    pub(crate) evict: f64,
    /// Per step: an engine finish, a client cancel, a lost output.
    pub(crate) finish: f64,
    pub(crate) cancel: f64,
    pub(crate) lose: f64,
    pub(crate) requests: u32,
    /// Arrivals come in bursts of this many requests sharing one prefix.
    pub(crate) burst: u32,
    /// Distinct shared prefixes.
    pub(crate) prefixes: u32,
    /// The runtime's shards.
    pub(crate) shards: usize,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            mode: Mode::Safe,
            async_ratio: 0.5,
            pool: 2048,
            budget: 512,
            corrupt: 0.0,
            evict: 0.0,
            finish: 0.0,
            cancel: 0.0,
            lose: 0.0,
            requests: 40,
            burst: 1,
            prefixes: 3,
            shards: 2,
        }
    }
}

/// The layout tag the connectors store chunks under (part of every chunk's key).
pub(crate) const TAG: u64 = 1;

pub(crate) fn hybrid(mamba: MambaMode) -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(16),
        CacheGroup::sliding_window(16, 24),
        CacheGroup::mamba(16, mamba),
    ]
}

/// A runtime, a `TierConnector` on `tier` and the model engine on host KV memory.
pub(crate) fn stack(
    groups: &[CacheGroup],
    tier: Arc<dyn Tier>,
    k: &Knobs,
    seed: u64,
) -> (Runtime, Arc<TierConnector>, ModelEngine) {
    let model = Arc::new(TinyModel::new(groups, ModelShape::default(), 42));
    let layout = model.kv_layout(groups).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 4096).expect("memory"));
    let conn = Arc::new(
        TierConnector::new(
            tier,
            Arc::clone(&memory),
            TierConnectorConfig::default()
                .with_groups(groups.to_vec())
                .with_tag(TAG)
                .with_async_ratio(k.async_ratio)
                .with_seed(seed),
        )
        .expect("connector"),
    );
    let dyn_conn: Arc<dyn KvConnector> = conn.clone();
    let rt = Runtime::builder()
        .groups(groups.to_vec())
        .pool_blocks(k.pool)
        .shards(k.shards)
        .workers(2)
        .token_budget(k.budget)
        .mode(k.mode)
        .connector(dyn_conn)
        .build()
        .expect("runtime");
    (rt, conn, ModelEngine::new(model, groups.to_vec(), memory))
}

/// Submits `prompt` as request `id` to the runtime and the engine.
pub(crate) fn submit(
    rt: &mut Runtime,
    engine: &mut ModelEngine,
    id: String,
    prompt: Vec<u32>,
    max_new: u32,
) {
    engine.add_request(&id, &prompt);
    rt.submit(SubmitRequest {
        id,
        prompt,
        max_new_tokens: max_new,
        priority: 0,
        load_deadline: None,
    })
    .expect("submit");
}

/// Runs `plan` on the model and answers it (with `finished` as the engine's finishes), then
/// offers what the kept steps completed to the tier.
pub(crate) fn answer(
    rt: &mut Runtime,
    engine: &mut ModelEngine,
    conn: &TierConnector,
    plan: &StepPlan,
    finished: Vec<Arc<str>>,
) {
    let step = engine.run_step(plan, Some(conn));
    let mut out = StepOutput::all_sampled(plan);
    out.invalid_blocks = step.invalid_blocks.clone();
    out.finished = finished;
    let discard = rt.update(out);
    engine.settle(plan, step, &discard);
    for s in plan.scheduled.iter().filter(|s| !discard.contains(&s.id)) {
        if let Some(p) = engine.prompt(&s.id).map(<[u32]>::to_vec) {
            conn.save_step(&p, s);
        }
    }
}

/// Steps `rt` until no request is live, shuts it down and returns the model's counts; the
/// runtime's invariants must hold.
pub(crate) fn finish(
    mut rt: Runtime,
    engine: &mut ModelEngine,
    conn: &TierConnector,
) -> ModelCounts {
    while rt.live() > 0 {
        let plan = rt.schedule().expect("step");
        answer(&mut rt, engine, conn, &plan, Vec::new());
        rt.wait_for_work(Duration::from_millis(1));
    }
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    engine.counts()
}

/// Another engine on the same tier computes the prompts and saves their blocks (damaged at
/// rest as the tier's faults say), so the run meets them in the tier, not its prefix cache.
pub(crate) fn warm(groups: &[CacheGroup], tier: Arc<dyn Tier>, prompts: &[Vec<u32>]) {
    let k = Knobs::default();
    let (mut rt, conn, mut engine) = stack(groups, tier, &k, 99);
    for (i, p) in prompts.iter().enumerate() {
        let prompt = [&p[..], &[1]].concat();
        submit(&mut rt, &mut engine, format!("warm{i}"), prompt, 1);
    }
    while rt.live() > 0 {
        let plan = rt.schedule().expect("step");
        answer(&mut rt, &mut engine, &conn, &plan, Vec::new());
    }
    rt.shutdown();
    conn.flush();
}
