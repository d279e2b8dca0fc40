//! The [`Builder`]: checks the configuration, then starts the workers and the shard threads.

use std::sync::Arc as StdArc;
use std::time::Duration;

use crate::connector::{KvConnector, NoConnector};
use crate::pool::BlockPool;
use crate::rules::geometry::{CacheGroup, Geometry, DEFAULT_NULL_BLOCK};
use crate::rules::recovery::{Mode, Policy};
use crate::runtime::completion_queue::CompletionQueue;
use crate::runtime::error::RuntimeError;
use crate::runtime::handoff::spawn_shard_threads;
#[cfg(doc)]
use crate::runtime::plan::StepRecovery;
use crate::runtime::settings::Settings;
use crate::runtime::shard::{Metrics, StepSettings};
use crate::runtime::shared::Inner;
use crate::runtime::signal::WorkSignal;
use crate::runtime::step::Runtime;
use crate::runtime::step_mode::{LastStep, DEFAULT_PARALLEL_STEP_WORK};
use crate::runtime::worker::WorkerPool;
use crate::sync::{Arc, Parker};

/// The largest pool a runtime accepts: 2^24 blocks (about 40 bytes of bookkeeping each:
/// state word, free-list link, claim words). A cap by documented limit, not by trying to
/// allocate (with overcommit, an allocation that succeeds proves nothing).
pub(super) const MAX_POOL_BLOCKS: usize = 1 << 24;

/// The largest completion queue per shard (completions are about 100 bytes each).
pub(super) const MAX_COMPLETION_QUEUE_CAPACITY: usize = 1 << 16;

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
    inline_up_to: usize,
    parallel_work: usize,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("groups", &self.groups)
            .field("pool_blocks", &self.pool_blocks)
            .field("shards", &self.shards)
            .field("workers", &self.workers)
            .field("settings", &self.settings)
            .field("inline_steps_up_to", &self.inline_up_to)
            .field("parallel_step_work", &self.parallel_work)
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
            inline_up_to: 256,
            parallel_work: DEFAULT_PARALLEL_STEP_WORK,
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
    /// Pool size in blocks, the null block included (default 4096, at most 2^24).
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
    /// Capacity of each shard's completion queue (default 4096, at most 65,536).
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

    /// Steps with at most `live` requests live run every shard's phases on the engine thread,
    /// without waking the shard threads (default 256): a small
    /// step costs less than the hand-off. `0` runs every step of a multi-shard runtime in
    /// parallel, whatever its work; `usize::MAX` runs every step inline. The recovery
    /// decisions are the same either way; admissions may differ (docs/runtime.md: a parallel
    /// step's shards admit from one pool at the same time).
    pub fn inline_steps_up_to(mut self, live: usize) -> Self {
        self.inline_up_to = live;
        self
    }

    /// Work units (about one request touched each: a queued command or completion, a request
    /// to schedule or admit, a reported block) from which a step with more than
    /// [`inline_steps_up_to`](Builder::inline_steps_up_to) live requests runs in parallel
    /// (default 2048): below it the hand-off — waking the shard threads, the phase barriers,
    /// waiting for the slowest — costs more than it saves. `0` decides by the live count
    /// alone. The recovery decisions are the same either way; admissions may differ (as for
    /// [`inline_steps_up_to`](Builder::inline_steps_up_to)).
    pub fn parallel_step_work(mut self, units: usize) -> Self {
        self.parallel_work = units;
        self
    }

    /// How long [`Runtime::shutdown`] waits for loads in flight (default 10 s).
    pub fn shutdown_timeout(mut self, t: Duration) -> Self {
        self.shutdown_timeout = t;
        self
    }

    /// Validates the settings and starts the threads.
    pub fn build(mut self) -> Result<Runtime, RuntimeError> {
        let geo = Geometry::new(
            std::mem::take(&mut self.groups),
            self.scheduler_block_size,
            DEFAULT_NULL_BLOCK,
        )?;
        self.check()?;
        // (Planted bug `connector-geometry-unchecked`, scripts/plants.sh: a connector built
        // for another geometry is taken, and its loads write blocks of other sizes.)
        if let Some((groups, s)) = self
            .connector
            .geometry()
            .filter(|_| !planted!("connector-geometry-unchecked"))
        {
            if groups != geo.groups() || s != geo.scheduler_block_size() {
                return Err(RuntimeError::Config {
                    field: "connector",
                    problem: format!(
                        "built for cache groups {groups:?} with scheduler block size {s}, \
                         the runtime has {:?} with {}",
                        geo.groups(),
                        geo.scheduler_block_size()
                    ),
                });
            }
        }
        let pool = BlockPool::new(self.pool_blocks)?;
        let k = self.shards;
        let queues: Vec<Arc<CompletionQueue>> = (0..k)
            .map(|_| Arc::new(CompletionQueue::new(self.completion_queue_capacity)))
            .collect();
        let engine_parker = Parker::new();
        let signal = StdArc::new(WorkSignal::new(engine_parker.unparker()));
        let notify_signal = StdArc::clone(&signal);
        let workers = WorkerPool::start(
            self.workers,
            queues.clone(),
            StdArc::clone(&self.connector),
            StdArc::new(move || notify_signal.notify()),
        )?;
        let settings = self.shard_settings();
        let inner = Arc::new(Inner::new(
            geo,
            pool,
            self.connector,
            &queues,
            settings,
            self.settings,
            StdArc::clone(&signal),
        ));
        let (threads, unparkers) = spawn_shard_threads(&inner)?;
        Ok(Runtime {
            inner,
            workers: Some(workers),
            shard_threads: threads,
            unparkers,
            engine_parker,
            sync_invalid: Vec::new(),
            handoffs: Vec::new(),
            metrics: Metrics::default(),
            signal,
            events_at_schedule: 0,
            expired_unrun_at_shutdown: 0,
            shutdown_timeout: self.shutdown_timeout,
            step: 0,
            inline_up_to: self.inline_up_to,
            parallel_work: self.parallel_work,
            last_step: LastStep::default(),
            expect_output: false,
            answered: true,
            stalled_steps: 0,
            preempted_unserved: false,
            work_pending: false,
            panicked: None,
            handed: Default::default(),
            merge: Default::default(),
            loads_sent: 0,
            room_at_loads_sent: None,
            command_batches: Vec::new(),
            scratch: Default::default(),
        })
    }

    /// The range checks on the sizes, then the live settings' own.
    fn check(&self) -> Result<(), RuntimeError> {
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
            (1..=MAX_COMPLETION_QUEUE_CAPACITY).contains(&self.completion_queue_capacity),
            "must be 1 to 65536",
        )?;
        cfg(
            "pool_blocks",
            self.pool_blocks <= MAX_POOL_BLOCKS,
            "must be at most 16777216 (2^24)",
        )?;
        self.settings.validate()?;
        Ok(())
    }

    /// Each shard's static step settings: an equal share of the budgets (the first
    /// `total % k` shards get one more), the recording flag, and the initial live settings.
    fn shard_settings(&self) -> Vec<StepSettings> {
        let k = self.shards;
        let budget =
            |total: u64, i: usize| total / k as u64 + u64::from((i as u64) < total % k as u64);
        (0..k)
            .map(|i| StepSettings {
                workers: self.workers,
                ..StepSettings::new(
                    &self.settings,
                    budget(self.token_budget, i),
                    budget(self.max_seqs as u64, i) as usize,
                    self.record,
                )
            })
            .collect()
    }
}
