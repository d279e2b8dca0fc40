//! The [`Runtime`] and its [`Builder`]: threads, the step hand-off, submission.

use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::runtime::claim::{RequestKey, ClaimTable};
use crate::connector::{KvConnector, LoadJob, NoConnector};
use crate::runtime::route::shard_of;
use crate::rules::geometry::{BlockId, CacheGroup, Geometry, GeometryError, DEFAULT_NULL_BLOCK};
use crate::pool::{BlockPool, BlockRef, Census, PoolError};
use crate::runtime::quarantine::Quarantine;
use crate::rules::recovery::{InvalidSet, Mode, Policy};
use crate::runtime::shard::{Command, Env, NewRequest, Shard, ShardStepResult, StepSettings};
pub use crate::runtime::shard::{EndState, Metrics, RecoveredRequest, ScannedRequest, ScheduledRequest};
use crate::sync::{
    thread, Arc, ArrayQueue, AtomicBool, AtomicU64, AtomicUsize, Backoff, Condvar, Mutex, Ordering,
    Parker, PhaseBarrier, RwLock, SegQueue, Unparker,
};
use crate::runtime::worker::{Completion, WorkerPool};
use arc_swap::ArcSwap;

/// Why the runtime refused something.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// Invalid cache-group geometry.
    #[error("groups: {0}")]
    Geometry(#[from] GeometryError),
    /// Invalid pool size.
    #[error("pool_blocks: {0}")]
    Pool(#[from] PoolError),
    /// A builder setting is out of range.
    #[error("{field}: {problem}")]
    Config {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A live request already has this id.
    #[error("request {0:?}: duplicate id")]
    DuplicateId(String),
    /// The request can never fit in the pool.
    #[error("request {id:?}: needs {needed} blocks, the pool has {usable}")]
    TooLong {
        /// Request id.
        id: String,
        /// Blocks it needs at full length.
        needed: u64,
        /// Usable blocks in the pool.
        usable: u64,
    },
    /// An empty prompt.
    #[error("request {0:?}: empty prompt")]
    EmptyPrompt(String),
    /// The runtime is shutting down.
    #[error("the runtime is shut down")]
    ShutDown,
    /// A thread could not be started.
    #[error("spawning a thread: {0}")]
    Spawn(#[from] std::io::Error),
}

/// A request to submit.
#[derive(Clone, Debug)]
pub struct SubmitRequest {
    /// Unique among live requests.
    pub id: String,
    /// The prompt's token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Tokens to generate before the runtime finishes it (0: until the engine finishes it).
    pub max_new_tokens: u32,
    /// Lower runs first (default 0).
    pub priority: i16,
    /// This request's async-load deadline, overriding [`Settings::load_deadline`].
    pub load_deadline: Option<Duration>,
}

/// Settings that can change while the runtime runs ([`Runtime::update_settings`]). Shards
/// read one snapshot per step, so a change applies from the next step, never mid-step.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Recovery mode (default `safe`).
    pub mode: Mode,
    /// Recovery policy (default `recompute`).
    pub policy: Policy,
    /// Deadline of an async load from its dispatch (default 5 s; `None`: none). A load past it
    /// is treated as failed for all its blocks; its late completion is counted stale, and its
    /// blocks stay parked (never reused) until it lands.
    pub load_deadline: Option<Duration>,
    /// Failed external loads after which a request is offered no more (default 2): its next
    /// attempt recomputes locally.
    pub max_load_retries: u32,
    /// Consecutive failed loads of one prefix, across requests, that quarantine it (default 3;
    /// 0 disables quarantine).
    pub quarantine_after: u32,
    /// How long a quarantined prefix gets no external load (default 10 s).
    pub quarantine_for: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mode: Mode::Safe,
            policy: Policy::Recompute,
            load_deadline: Some(Duration::from_secs(5)),
            max_load_retries: 2,
            quarantine_after: 3,
            quarantine_for: Duration::from_secs(10),
        }
    }
}

impl Settings {
    fn validate(&self) -> Result<(), RuntimeError> {
        if self.load_deadline.is_some_and(|d| d.is_zero()) {
            return Err(RuntimeError::Config {
                field: "load_deadline",
                problem: "must be > 0 (or None)".into(),
            });
        }
        Ok(())
    }
}

/// What the engine reports after running a step.
///
/// `step` must echo the [`StepPlan::step`] of the plan the output answers — the latest one
/// (build it with [`StepOutput::for_plan`]). `sampled` and `invalid_blocks` belong to that
/// step: in an output naming any other step they are ignored and the output is counted in
/// [`Metrics::stale_outputs`]. `finished` is not tied to a step and always applies.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// The step this output answers ([`StepPlan::step`]).
    pub step: u64,
    /// Requests that sampled a token (those scheduled with `samples`).
    pub sampled: Vec<String>,
    /// Requests the engine finished (stop token, client gone, …).
    pub finished: Vec<String>,
    /// Blocks that sync loads in the step failed to fill.
    pub invalid_blocks: Vec<BlockRef>,
}

impl StepOutput {
    /// An empty output answering `plan`.
    pub fn for_plan(plan: &StepPlan) -> Self {
        StepOutput {
            step: plan.step,
            ..StepOutput::default()
        }
    }
}

/// A step's recovery.
#[derive(Clone, Debug, Default)]
pub struct StepRecovery {
    /// The step's report: ids, ascending.
    pub report: Vec<BlockId>,
    /// Every affected request's decision, in canonical order.
    pub recovered: Vec<RecoveredRequest>,
    /// Blocks whose prefix-cache entries were cleared, ascending.
    pub evicted_blocks: Vec<BlockId>,
    /// Every scanned request's inputs, in canonical order (only with
    /// [`Builder::record_recovery_inputs`]).
    pub scanned: Vec<ScannedRequest>,
}

/// What to run in a step.
#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    /// Step number, from 1; the engine echoes it in [`StepOutput::step`].
    pub step: u64,
    /// Requests to compute, in canonical order.
    pub scheduled: Vec<ScheduledRequest>,
    /// The step's recovery.
    pub recovery: StepRecovery,
    /// Requests that ended during the step.
    pub ended: Vec<(StdArc<str>, EndState)>,
    /// Load completion → runnable, per request that became runnable (ns).
    pub runnable_latency_ns: Vec<u64>,
    /// Submit → first scheduled, per request scheduled for the first time (ns).
    pub first_schedule_latency_ns: Vec<u64>,
}

/// The final account of a runtime.
#[derive(Clone, Debug)]
pub struct Report {
    /// Counters at the end.
    pub metrics: Metrics,
    /// Loads queued but never started, cancelled by shutdown.
    pub loads_cancelled: u64,
    /// Loads still running when shutdown stopped waiting (see [`Runtime::shutdown`]).
    pub loads_abandoned: u64,
    /// Blocks still held after shutdown: those of abandoned loads (0 when none was abandoned).
    pub blocks_abandoned: u64,
    /// The pool's census after every block was released.
    pub census: Census,
    /// Requests still live at shutdown (all cancelled), with their ids.
    pub cancelled_at_shutdown: Vec<String>,
    /// Invariant violations found at shutdown (empty when all hold).
    pub violations: Vec<String>,
}

impl std::fmt::Display for Report {
    /// A few lines: what happened to the requests and loads, and whether the invariants held.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = &self.metrics;
        writeln!(
            f,
            "requests: {} submitted, {} finished, {} failed, {} cancelled",
            m.submitted, m.finished, m.failed, m.cancelled
        )?;
        writeln!(
            f,
            "loads: {} dispatched, {} ok, {} failed, {} stale, {} cancelled at shutdown, {} abandoned",
            m.loads_dispatched,
            m.loads_ok,
            m.loads_failed,
            m.stale_completions,
            self.loads_cancelled,
            self.loads_abandoned
        )?;
        writeln!(
            f,
            "recovery: {} claims, {} hand-offs, {} tokens recomputed, {} preemptions over {} steps",
            m.claims, m.handoffs, m.tokens_recomputed, m.preemptions, m.steps
        )?;
        match self.violations.len() {
            0 => write!(f, "invariants: ok"),
            n => write!(f, "invariants: {n} violated: {}", self.violations.join("; ")),
        }
    }
}

/// Configures a [`Runtime`].
pub struct Builder {
    groups: Vec<CacheGroup>,
    scheduler_block_size: Option<u64>,
    pool_blocks: usize,
    shards: usize,
    workers: usize,
    settings: Settings,
    token_budget: u64,
    max_seqs: usize,
    completion_queue_capacity: usize,
    connector: StdArc<dyn KvConnector>,
    record: bool,
    shutdown_timeout: Duration,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("groups", &self.groups)
            .field("pool_blocks", &self.pool_blocks)
            .field("shards", &self.shards)
            .field("workers", &self.workers)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            groups: vec![CacheGroup::full_attention(16)],
            scheduler_block_size: None,
            pool_blocks: 4096,
            shards: 2,
            workers: 2,
            settings: Settings::default(),
            token_budget: 8192,
            max_seqs: 256,
            completion_queue_capacity: crate::sync::DEFAULT_COMPLETION_QUEUE_CAPACITY,
            connector: StdArc::new(NoConnector),
            record: false,
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

impl Builder {
    /// Cache groups (default: one full-attention group of 16).
    pub fn groups(mut self, groups: Vec<CacheGroup>) -> Self {
        self.groups = groups;
        self
    }
    /// Explicit scheduler block size (default: lcm of the block sizes).
    pub fn scheduler_block_size(mut self, s: u64) -> Self {
        self.scheduler_block_size = Some(s);
        self
    }
    /// Pool size in blocks, the null block included (default 4096).
    pub fn pool_blocks(mut self, n: usize) -> Self {
        self.pool_blocks = n;
        self
    }
    /// Shards (1–64, default 2).
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n;
        self
    }
    /// Worker threads (1–256, default 2).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }
    /// Recovery mode (default `safe`).
    pub fn mode(mut self, m: Mode) -> Self {
        self.settings.mode = m;
        self
    }
    /// Recovery policy (default `recompute`).
    pub fn policy(mut self, p: Policy) -> Self {
        self.settings.policy = p;
        self
    }
    /// Every live setting at once (mode, policy, deadlines, retries, quarantine).
    pub fn settings(mut self, s: Settings) -> Self {
        self.settings = s;
        self
    }
    /// Tokens per step across all shards (default 8192); each shard gets an equal share.
    pub fn token_budget(mut self, n: u64) -> Self {
        self.token_budget = n;
        self
    }
    /// Sequences per step across all shards (default 256); each shard gets an equal share.
    pub fn max_seqs(mut self, n: usize) -> Self {
        self.max_seqs = n;
        self
    }
    /// Capacity of each shard's completion queue (default 4096).
    pub fn completion_queue_capacity(mut self, n: usize) -> Self {
        self.completion_queue_capacity = n;
        self
    }
    /// The KV connector (default: none, everything recomputes locally).
    pub fn connector(mut self, c: StdArc<dyn KvConnector>) -> Self {
        self.connector = c;
        self
    }
    /// Record every scanned request's inputs in [`StepRecovery::scanned`] (for differential
    /// checks; costs a copy of each scanned table on steps with a non-empty report).
    pub fn record_recovery_inputs(mut self, on: bool) -> Self {
        self.record = on;
        self
    }

    /// How long [`Runtime::shutdown`] waits for loads in flight (default 10 s).
    pub fn shutdown_timeout(mut self, t: Duration) -> Self {
        self.shutdown_timeout = t;
        self
    }

    /// Validates the settings and starts the threads.
    pub fn build(self) -> Result<Runtime, RuntimeError> {
        let geo = Geometry::new(self.groups, self.scheduler_block_size, DEFAULT_NULL_BLOCK)?;
        let cfg = |field, ok: bool, problem: &str| {
            if ok {
                Ok(())
            } else {
                Err(RuntimeError::Config {
                    field,
                    problem: problem.to_string(),
                })
            }
        };
        cfg("shards", (1..=64).contains(&self.shards), "must be 1 to 64")?;
        cfg(
            "workers",
            (1..=256).contains(&self.workers),
            "must be 1 to 256",
        )?;
        cfg(
            "token_budget",
            self.token_budget >= self.shards as u64,
            "must be at least the shard count",
        )?;
        cfg(
            "max_seqs",
            self.max_seqs >= self.shards,
            "must be at least the shard count",
        )?;
        cfg(
            "completion_queue_capacity",
            self.completion_queue_capacity > 0,
            "must be > 0",
        )?;
        self.settings.validate()?;
        let pool = BlockPool::new(self.pool_blocks)?;
        let claims = ClaimTable::new(self.pool_blocks);
        let k = self.shards;
        let queues: Vec<Arc<ArrayQueue<Completion>>> = (0..k)
            .map(|_| Arc::new(ArrayQueue::new(self.completion_queue_capacity)))
            .collect();
        let signal = StdArc::new(WorkSignal::default());
        let notify_signal = StdArc::clone(&signal);
        let workers = WorkerPool::start(
            self.workers,
            queues.clone(),
            StdArc::clone(&self.connector),
            StdArc::new(move || notify_signal.notify()),
        )?;
        let budget =
            |total: u64, i: usize| total / k as u64 + u64::from((i as u64) < total % k as u64);
        let settings: Vec<StepSettings> = (0..k)
            .map(|i| StepSettings {
                mode: self.settings.mode,
                policy: self.settings.policy,
                token_budget: budget(self.token_budget, i),
                max_seqs: budget(self.max_seqs as u64, i) as usize,
                record_inputs: self.record,
                load_deadline: self.settings.load_deadline,
                max_load_retries: self.settings.max_load_retries,
                quarantine_after: self.settings.quarantine_after,
                quarantine_for: self.settings.quarantine_for,
            })
            .collect();
        let inner = Arc::new(Inner {
            geo,
            pool,
            claims,
            quarantine: Quarantine::default(),
            live_settings: ArcSwap::from_pointee(self.settings),
            connector: self.connector,
            shards: (0..k)
                .map(|i| ShardSlot {
                    state: Mutex::new(Shard::default()),
                    inbox: SegQueue::new(),
                    completions: Arc::clone(&queues[i]),
                    published: Mutex::new(Vec::new()),
                    result: Mutex::new(None),
                    ids: Mutex::new(rustc_hash::FxHashSet::default()),
                })
                .collect(),
            barrier: PhaseBarrier::new(k),
            report: Mutex::new(None),
            settings,
            go: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            engine: Mutex::new(None),
            seq: AtomicU64::new(1),
            submitted: AtomicU64::new(0),
            open: RwLock::new(true),
        });
        let mut threads = Vec::new();
        let mut unparkers = Vec::new();
        for i in 1..k {
            let p = Parker::new();
            unparkers.push(p.unparker().clone());
            let inner2 = Arc::clone(&inner);
            let h = thread::Builder::new()
                .name(format!("kvsched-shard-{i}"))
                .spawn(move || shard_loop(&inner2, i, p));
            match h {
                Ok(h) => threads.push(h),
                Err(e) => {
                    inner.stop.store(true, Ordering::Release);
                    for u in &unparkers {
                        u.unpark();
                    }
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(Runtime {
            inner,
            workers: Some(workers),
            shard_threads: threads,
            unparkers,
            engine_parker: Parker::new(),
            sync_invalid: Vec::new(),
            handoffs: Vec::new(),
            metrics: Metrics::default(),
            signal,
            events_at_schedule: 0,
            expired_unrun_at_shutdown: 0,
            shutdown_timeout: self.shutdown_timeout,
            step: 0,
        })
    }
}

/// How long a shard thread yields after a step, waiting for the next, before parking.
const SHARD_YIELD_WAIT: Duration = Duration::from_micros(300);

/// How long the engine thread yields, waiting for the other shards of a step, before parking.
const ENGINE_YIELD_WAIT: Duration = Duration::from_micros(500);

/// Wake-ups for an idle engine: bumped on every delivered completion.
#[derive(Debug, Default)]
struct WorkSignal {
    events: AtomicU64,
    lock: Mutex<()>,
    cv: Condvar,
}

impl WorkSignal {
    fn notify(&self) {
        // Release: pairs with the Acquire loads in `wait_for_work`.
        self.events.fetch_add(1, Ordering::Release);
        let _g = self.lock.lock();
        self.cv.notify_all();
    }
}

struct ShardSlot {
    state: Mutex<Shard>,
    inbox: SegQueue<Command>,
    completions: Arc<ArrayQueue<Completion>>,
    published: Mutex<Vec<BlockId>>,
    result: Mutex<Option<(ShardStepResult, Vec<LoadJob>)>>,
    /// Live request ids (duplicate check at submit; removed when a request ends).
    ids: Mutex<rustc_hash::FxHashSet<StdArc<str>>>,
}

struct Inner {
    geo: Geometry,
    pool: BlockPool,
    claims: ClaimTable,
    connector: StdArc<dyn KvConnector>,
    shards: Vec<ShardSlot>,
    barrier: PhaseBarrier,
    /// The engine thread's share of the step's report (sync-load failures, hand-offs).
    report: Mutex<Option<(Vec<BlockId>, StdArc<Settings>)>>,
    /// Static per-shard parts (budget share, recording).
    settings: Vec<StepSettings>,
    /// The live settings; the engine thread snapshots them once per step.
    live_settings: ArcSwap<Settings>,
    quarantine: Quarantine,
    go: AtomicU64,
    done: AtomicUsize,
    stop: AtomicBool,
    /// Shutdown's last step: apply what arrived, admit and schedule nothing.
    draining: AtomicBool,
    engine: Mutex<Option<Unparker>>,
    seq: AtomicU64,
    submitted: AtomicU64,
    /// Whether `submit` is accepted; `shutdown` closes it under the write lock.
    open: RwLock<bool>,
}

impl Inner {
    /// Queues a request (under the read lock of `open`, so shutdown cannot miss it).
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        let open = self.open.read();
        if !*open {
            return Err(RuntimeError::ShutDown);
        }
        if req.prompt.is_empty() {
            return Err(RuntimeError::EmptyPrompt(req.id));
        }
        let total = req.prompt.len() as u64 + u64::from(req.max_new_tokens.max(1));
        let needed: u64 = self
            .geo
            .groups()
            .iter()
            .map(|g| g.blocks_for_tokens(total))
            .sum();
        let usable = self.pool.num_blocks() as u64 - 1;
        if needed > usable {
            return Err(RuntimeError::TooLong {
                id: req.id,
                needed,
                usable,
            });
        }
        let i = self.shard_of(&req.id);
        let id: StdArc<str> = req.id.as_str().into();
        if !self.shards[i].ids.lock().insert(id.clone()) {
            return Err(RuntimeError::DuplicateId(req.id));
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.submitted.fetch_add(1, Ordering::Relaxed);
        self.shards[i].inbox.push(Command::Submit(NewRequest {
            id,
            prompt: req.prompt.into(),
            max_new_tokens: req.max_new_tokens,
            key: RequestKey::new(false, req.priority, seq),
            submitted_at: Instant::now(),
            load_deadline: req.load_deadline,
        }));
        Ok(())
    }

    /// Cancels a request at the next step (once its in-flight load, if any, lands). Unknown
    /// ids are counted in [`Metrics::unknown_commands`].
    fn cancel(&self, id: &str) {
        let i = self.shard_of(id);
        self.shards[i].inbox.push(Command::Cancel(id.into()));
    }

    fn shard_of(&self, id: &str) -> usize {
        shard_of(id, self.shards.len())
    }

    fn env(&self, shard: usize) -> Env<'_> {
        Env {
            geo: &self.geo,
            pool: &self.pool,
            claims: &self.claims,
            connector: self.connector.as_ref(),
            quarantine: &self.quarantine,
            shard,
        }
    }

    /// One shard's part of a step; every shard runs it concurrently.
    fn run_shard_step(&self, i: usize, engine_share: &[BlockId], live: &Settings) {
        let slot = &self.shards[i];
        let env = self.env(i);
        let settings = &StepSettings {
            mode: live.mode,
            policy: live.policy,
            load_deadline: live.load_deadline,
            max_load_retries: live.max_load_retries,
            quarantine_after: live.quarantine_after,
            quarantine_for: live.quarantine_for,
            ..self.settings[i].clone()
        };
        let mut shard = slot.state.lock();
        let commands = std::iter::from_fn(|| slot.inbox.pop());
        let completions = std::iter::from_fn(|| slot.completions.pop());
        let mine = shard.publish(&env, settings, Instant::now(), commands, completions);
        *slot.published.lock() = mine;
        // Barrier 1: every share of the report is published and its claim words reset.
        self.barrier.wait();
        let mut ids: Vec<BlockId> = engine_share.to_vec();
        for s in &self.shards {
            ids.extend_from_slice(&s.published.lock());
        }
        ids.sort_unstable();
        ids.dedup();
        let report = InvalidSet::flat(ids.iter().copied(), &self.geo);
        if !report.is_empty() {
            shard.claim(&env, settings, &report, &ids);
            // Barrier 2: every hit of every shard is claimed before anyone decides.
            #[cfg(not(kvsched_plant = "decide-early"))]
            self.barrier.wait();
        }
        let now = Instant::now();
        let mut loads = Vec::new();
        // Relaxed: set by the engine thread before the `go` Release that started this step.
        let draining = self.draining.load(Ordering::Relaxed);
        let res = shard.finish_step(&env, settings, now, draining, &mut loads);
        #[cfg(kvsched_plant = "decide-early")]
        if !report.is_empty() {
            self.barrier.wait();
        }
        {
            let mut live = slot.ids.lock();
            for (id, _) in &res.ended {
                live.remove(id);
            }
        }
        *slot.result.lock() = Some((res, loads));
    }
}

fn shard_loop(inner: &Inner, i: usize, parker: Parker) {
    let mut seen = 0u64;
    let mut idle_since = Instant::now();
    loop {
        // Acquire: pairs with the Release increment of `go` in `schedule`; the step's
        // report share and settings written before it are visible.
        let go = inner.go.load(Ordering::Acquire);
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
        if go == seen {
            // Steps of a busy engine come close together: yield for a short while so the next
            // one starts without a wake-up, then park.
            if idle_since.elapsed() < SHARD_YIELD_WAIT {
                thread::yield_now();
            } else {
                parker.park_timeout(Duration::from_millis(50));
            }
            continue;
        }
        seen = go;
        let Some((share, live)) = inner.report.lock().clone() else {
            continue;
        };
        inner.run_shard_step(i, &share, &live);
        // Release: publishes this shard's result slot to the engine, which Acquire-loads
        // `done` in `schedule`.
        inner.done.fetch_add(1, Ordering::Release);
        idle_since = Instant::now();
        if let Some(u) = inner.engine.lock().as_ref() {
            u.unpark();
        }
    }
}

/// A cheap, cloneable, `Send + Sync` handle to a [`Runtime`], for [`submit`](Handle::submit)
/// and [`cancel`](Handle::cancel) from threads other than the engine's. It keeps the
/// runtime's shared state alive but not its threads: after [`Runtime::shutdown`], `submit`
/// returns [`RuntimeError::ShutDown`] and `cancel` does nothing.
#[derive(Clone)]
pub struct Handle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("shards", &self.inner.shards.len())
            .finish()
    }
}

impl Handle {
    /// Queues a request; it is admitted at a following step. Errors: an empty prompt, a
    /// request longer than the pool can ever hold, an id already live, or a runtime that is
    /// shut down.
    pub fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        self.inner.submit(req)
    }

    /// Cancels a request at the next step (once its in-flight load, if any, lands). Unknown
    /// ids are counted in [`Metrics::unknown_commands`].
    pub fn cancel(&self, id: &str) {
        self.inner.cancel(id)
    }
}

/// The scheduler core an engine embeds: one engine thread drives [`schedule`](Runtime::schedule)
/// and [`update`](Runtime::update); other threads submit and cancel through a [`Handle`].
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use kvsched::connector::{SimConfig, SimConnector};
/// use kvsched::{CacheGroup, MambaMode, Runtime, StepOutput, SubmitRequest};
///
/// let mut rt = Runtime::builder()
///     .groups(vec![CacheGroup::full_attention(16), CacheGroup::mamba(64, MambaMode::Align)])
///     .pool_blocks(4096)
///     .shards(2)
///     .workers(2)
///     .connector(Arc::new(SimConnector::new(SimConfig::default())))
///     .build()?;
/// rt.submit(SubmitRequest {
///     id: "r1".into(),
///     prompt: vec![1; 300],
///     max_new_tokens: 8,
///     priority: 0,
///     load_deadline: None,
/// })?;
/// let mut out = StepOutput::default();
/// while rt.live() > 0 {
///     rt.update(std::mem::take(&mut out));
///     let plan = rt.schedule(); // recovery, admission, loads, scheduling
///     out.step = plan.step; // the output answers this plan
///     // … the engine runs the model on plan.scheduled (and the sync loads they carry) …
///     for s in &plan.scheduled {
///         if s.samples {
///             out.sampled.push(s.id.to_string());
///         }
///     }
///     if plan.scheduled.is_empty() {
///         rt.wait_for_work(Duration::from_millis(1));
///     }
/// }
/// let report = rt.shutdown();
/// assert_eq!(report.metrics.finished, 1);
/// assert!(report.violations.is_empty());
/// # Ok::<(), kvsched::RuntimeError>(())
/// ```
pub struct Runtime {
    inner: Arc<Inner>,
    workers: Option<WorkerPool>,
    shard_threads: Vec<thread::JoinHandle<()>>,
    unparkers: Vec<Unparker>,
    engine_parker: Parker,
    sync_invalid: Vec<BlockRef>,
    handoffs: Vec<BlockRef>,
    metrics: Metrics,
    signal: StdArc<WorkSignal>,
    shutdown_timeout: Duration,
    /// Workers' count of expired jobs handed back unrun, kept once the workers are gone.
    expired_unrun_at_shutdown: u64,
    /// Completions signalled before the last `schedule` started draining.
    events_at_schedule: u64,
    /// The latest plan's step number (0 before the first).
    step: u64,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("step", &self.step)
            .field("shards", &self.inner.shards.len())
            .finish()
    }
}

impl Runtime {
    /// A builder with the defaults.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The validated geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.inner.geo
    }

    /// The shared block pool.
    pub fn pool(&self) -> &BlockPool {
        &self.inner.pool
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.inner.shards.len()
    }

    /// A thread-safe handle for [`Handle::submit`] and [`Handle::cancel`] from other threads.
    pub fn handle(&self) -> Handle {
        Handle {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Queues a request; it is admitted at a following step. Same as
    /// [`Handle::submit`].
    pub fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        self.inner.submit(req)
    }

    /// Cancels a request at the next step. Same as [`Handle::cancel`].
    pub fn cancel(&self, id: &str) {
        self.inner.cancel(id)
    }

    /// Runs one step on every shard in parallel and returns what to compute.
    pub fn schedule(&mut self) -> StepPlan {
        self.step += 1;
        // Acquire: pairs with the Release increment in `WorkSignal::notify`; read before the
        // shards drain, so a completion counted after this point may still be undrained and
        // `wait_for_work` must not sleep past it.
        self.events_at_schedule = self.signal.events.load(Ordering::Acquire);
        // The engine thread's share of the report: sync-load failures of the last step and
        // blocks handed off by owners that ended, minus stale ones.
        let mut share = Vec::new();
        for b in self.sync_invalid.drain(..).chain(self.handoffs.drain(..)) {
            // Planted bug for the fault matrix: trust a report whatever its generation.
            #[cfg(kvsched_plant = "trust-stale")]
            let current = b.id < self.inner.pool.num_blocks() as u64;
            #[cfg(not(kvsched_plant = "trust-stale"))]
            let current = self.inner.pool.is_current(b);
            if b.id != self.inner.geo.null_block() && current {
                share.push(b.id);
            } else {
                self.metrics.stale_blocks += 1;
                self.inner.claims.forget(b.id);
            }
        }
        for &id in &share {
            self.inner.claims.reset(id);
        }
        // One snapshot of the live settings for the whole step, on every shard.
        let live = self.inner.live_settings.load_full();
        *self.inner.report.lock() = Some((share.clone(), StdArc::clone(&live)));
        *self.inner.engine.lock() = Some(self.engine_parker.unparker().clone());
        self.inner.done.store(0, Ordering::Relaxed);
        // Release: pairs with the Acquire load of `go` in `shard_loop`.
        self.inner.go.fetch_add(1, Ordering::Release);
        for u in &self.unparkers {
            u.unpark();
        }
        let span = tracing::debug_span!("kvsched_step", step = self.step);
        let _enter = span.enter();
        self.inner.run_shard_step(0, &share, &live);
        let others = self.inner.shards.len() - 1;
        let backoff = Backoff::new();
        let park_after = Instant::now() + ENGINE_YIELD_WAIT;
        // Acquire: pairs with the Release increments of `done` by the shard threads.
        while self.inner.done.load(Ordering::Acquire) < others {
            if !backoff.is_completed() {
                backoff.snooze();
            } else if Instant::now() < park_after {
                // The other shards usually finish within microseconds of shard 0: yielding
                // keeps the engine off the futex path (a park costs a second wake-up).
                thread::yield_now();
            } else {
                self.engine_parker.park_timeout(Duration::from_millis(1));
            }
        }
        self.collect(share)
    }

    fn collect(&mut self, engine_share: Vec<BlockId>) -> StepPlan {
        let mut plan = StepPlan {
            step: self.step,
            ..StepPlan::default()
        };
        let mut report = engine_share;
        let mut evicted = Vec::new();
        for slot in &self.inner.shards {
            report.extend_from_slice(&slot.published.lock());
            let Some((res, loads)) = slot.result.lock().take() else {
                continue;
            };
            if let Some(w) = &self.workers {
                for j in loads {
                    w.dispatch(j);
                }
            }
            self.metrics += &res.counters;
            for (_, state) in &res.ended {
                match state {
                    EndState::Finished => self.metrics.finished += 1,
                    EndState::Failed => self.metrics.failed += 1,
                    EndState::Cancelled => self.metrics.cancelled += 1,
                }
            }
            plan.scheduled.extend(res.scheduled);
            plan.recovery.recovered.extend(res.recovered);
            plan.recovery.scanned.extend(res.scanned);
            evicted.extend(res.evicted);
            plan.ended.extend(res.ended);
            self.handoffs.extend(res.handoffs);
            plan.runnable_latency_ns.extend(res.runnable_latency_ns);
            plan.first_schedule_latency_ns
                .extend(res.first_schedule_latency_ns);
        }
        report.sort_unstable();
        report.dedup();
        evicted.sort_unstable();
        evicted.dedup();
        plan.recovery.report = report;
        plan.recovery.evicted_blocks = evicted;
        plan.scheduled.sort_by_key(|s| s.key);
        plan.recovery.recovered.sort_by_key(|r| r.key);
        plan.recovery.scanned.sort_by_key(|r| r.key);
        if !plan.recovery.recovered.is_empty() {
            let tokens: u64 = plan
                .recovery
                .recovered
                .iter()
                .map(|r| r.decision.affected_tokens)
                .sum();
            tracing::warn!(
                step = self.step,
                invalid_blocks = plan.recovery.report.len(),
                affected_requests = plan.recovery.recovered.len(),
                affected_tokens = tokens,
                "recovered from failed KV loads"
            );
        }
        self.metrics.steps += 1;
        plan
    }

    /// Applies the engine's output for the last step. It takes effect at the next
    /// [`Runtime::schedule`], after that step's recovery (which may discard it).
    pub fn update(&mut self, out: StepOutput) {
        for id in out.finished {
            let i = self.inner.shard_of(&id);
            self.inner.shards[i].inbox.push(Command::Finish(id.into()));
        }
        if out.step != self.step {
            if !out.sampled.is_empty() || !out.invalid_blocks.is_empty() {
                self.metrics.stale_outputs += 1;
            }
            return;
        }
        for id in out.sampled {
            let i = self.inner.shard_of(&id);
            self.inner.shards[i].inbox.push(Command::Sampled(id.into()));
        }
        let cap = self.inner.pool.num_blocks() as u64;
        for b in out.invalid_blocks {
            if b.id < cap {
                self.sync_invalid.push(b);
            } else {
                self.metrics.stale_blocks += 1;
            }
        }
    }

    /// Replaces the live settings; they apply from the next step. Lock-free for the shards.
    pub fn update_settings(&self, s: Settings) -> Result<(), RuntimeError> {
        s.validate()?;
        self.inner.live_settings.store(StdArc::new(s));
        Ok(())
    }

    /// The live settings.
    pub fn settings(&self) -> Settings {
        Settings::clone(&self.inner.live_settings.load())
    }

    /// Non-blocking: whether a load completed since the last [`Runtime::schedule`] began
    /// draining (so a `schedule` now has something new to apply).
    pub fn poll_work(&self) -> bool {
        // Acquire: pairs with the Release increment in `WorkSignal::notify`.
        self.signal.events.load(Ordering::Acquire) != self.events_at_schedule
    }

    /// Counters so far.
    pub fn metrics(&self) -> Metrics {
        let mut m = self.metrics.clone();
        m.submitted = self.inner.submitted.load(Ordering::Relaxed);
        if let Some(w) = &self.workers {
            m.loads_expired_unrun = w.counters().expired_unrun.load(Ordering::Relaxed);
        } else {
            m.loads_expired_unrun = self.expired_unrun_at_shutdown;
        }
        m
    }

    /// Requests live (submitted and not ended) as of the last step.
    pub fn live(&self) -> usize {
        self.inner.shards.iter().map(|s| s.ids.lock().len()).sum()
    }

    /// Waits until a load completes or `timeout` passes; returns whether a completion arrived
    /// since the last [`Runtime::schedule`] began draining (so a completion that landed between
    /// `schedule` and this call returns at once: an idle engine never sleeps past work).
    pub fn wait_for_work(&self, timeout: Duration) -> bool {
        let s = &self.signal;
        let before = self.events_at_schedule;
        let deadline = Instant::now() + timeout;
        let mut g = s.lock.lock();
        loop {
            // Acquire: as above. Checked under the lock `notify` takes, so no wake-up is lost.
            if s.events.load(Ordering::Acquire) != before {
                return true;
            }
            if s.cv.wait_until(&mut g, deadline).timed_out() {
                return s.events.load(Ordering::Acquire) != before;
            }
        }
    }

    /// SPEC §7 invariants that can be checked between steps; returns the violations.
    pub fn check_invariants(&self) -> Vec<String> {
        let mut v = Vec::new();
        let census = self.inner.pool.census();
        if !census.conserved() {
            v.push(format!("pool conservation: {census:?}"));
        }
        let df = self.inner.pool.double_frees();
        if df > 0 {
            v.push(format!("double frees: {df}"));
        }
        let stale = self.inner.pool.stale_releases();
        if stale > 0 {
            v.push(format!("releases of a block's old generation: {stale}"));
        }
        for (i, s) in self.inner.shards.iter().enumerate() {
            if !s.state.lock().index_consistent(self.inner.geo.null_block()) {
                v.push(format!(
                    "shard {i}: holder index out of step with the block tables"
                ));
            }
        }
        // Between steps requests are the only holders: each block's count is its holders.
        let null = self.inner.geo.null_block();
        let mut held = vec![0u32; self.inner.pool.num_blocks()];
        for s in &self.inner.shards {
            for id in s.state.lock().held_blocks(null) {
                if let Some(h) = held.get_mut(id as usize) {
                    *h += 1;
                }
            }
        }
        let mut bad = 0;
        for (id, &n) in held.iter().enumerate().skip(1) {
            let rc = self.inner.pool.ref_count(id as BlockId);
            if rc != n {
                if bad < 5 {
                    v.push(format!(
                        "block {id}: held by {n} requests, reference count {rc}"
                    ));
                }
                bad += 1;
            }
        }
        if bad > 5 {
            v.push(format!(
                "… {} more blocks whose reference count is not their holder count",
                bad - 5
            ));
        }
        let m = self.metrics();
        let live = self.live() as u64;
        if m.finished + m.failed + m.cancelled + live != m.submitted {
            v.push(format!(
                "accounting: submitted {} != finished {} + failed {} + cancelled {} + live {live}",
                m.submitted, m.finished, m.failed, m.cancelled
            ));
        }
        v
    }

    /// Stops the workers, waiting at most [`Builder::shutdown_timeout`] for the loads in
    /// flight (those that finish are applied), cancels every live request and queued load,
    /// releases every block and reports. Loads still running at the timeout are abandoned:
    /// their requests are cancelled, but their blocks stay held (a detached worker may still
    /// write them) and are counted in [`Report::loads_abandoned`] / [`Report::blocks_abandoned`].
    pub fn shutdown(mut self) -> Report {
        // Closed under the write lock: a submit holding the read lock has pushed its
        // command before this returns, so the last step below sees it.
        *self.inner.open.write() = false;
        let mut loads_cancelled = 0;
        let mut workers_finished = true;
        let mut never_started = rustc_hash::FxHashSet::default();
        if let Some(w) = self.workers.take() {
            self.expired_unrun_at_shutdown = w.counters().expired_unrun.load(Ordering::Relaxed);
            let inner = &self.inner;
            let mut parked: Vec<Vec<Completion>> = vec![Vec::new(); inner.shards.len()];
            let (left, finished) = w.shutdown(
                || {
                    for (i, s) in inner.shards.iter().enumerate() {
                        while let Some(c) = s.completions.pop() {
                            parked[i].push(c);
                        }
                    }
                },
                self.shutdown_timeout,
            );
            workers_finished = finished;
            loads_cancelled = left.len() as u64;
            never_started = left
                .iter()
                .map(|j| (RequestKey::from_raw(j.owner.key).seq(), j.attempt))
                .collect();
            // Completions that landed are applied once (as a step would), then everyone is
            // cancelled. Whatever does not fit back in a queue is counted stale.
            for (i, cs) in parked.into_iter().enumerate() {
                for c in cs {
                    if inner.shards[i].completions.push(c).is_err() {
                        self.metrics.stale_completions += 1;
                    }
                }
            }
        }
        // One last step applies drained completions and pending commands, admitting and
        // scheduling nothing.
        self.inner.draining.store(true, Ordering::Relaxed);
        let _ = self.schedule();
        let mut cancelled_ids = Vec::new();
        for (i, s) in self.inner.shards.iter().enumerate() {
            let env = self.inner.env(i);
            let res = s
                .state
                .lock()
                .cancel_all(&env, workers_finished, &never_started);
            self.metrics += &res.counters;
            for (id, _) in &res.ended {
                cancelled_ids.push(id.to_string());
                self.metrics.cancelled += 1;
            }
            s.ids.lock().clear();
        }
        self.stop_shards();
        let violations = self.check_invariants();
        let census = self.inner.pool.census();
        Report {
            loads_abandoned: self.metrics.loads_abandoned,
            blocks_abandoned: census.referenced as u64,
            metrics: self.metrics(),
            loads_cancelled,
            census,
            cancelled_at_shutdown: cancelled_ids,
            violations,
        }
    }

    fn stop_shards(&mut self) {
        // Release: pairs with the Acquire load of `stop` in `shard_loop`.
        self.inner.stop.store(true, Ordering::Release);
        for u in &self.unparkers {
            u.unpark();
        }
        for t in self.shard_threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop_shards();
    }
}
