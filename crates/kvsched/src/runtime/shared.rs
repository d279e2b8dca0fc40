//! The state the engine thread, the shard threads and every [`Handle`] share: the pool,
//! the claim table, one slot per shard, and the step hand-off's flags and counters.
//!
//! [`Handle`]: crate::runtime::Handle

use std::sync::Arc as StdArc;

use arc_swap::ArcSwap;

use crate::connector::{KvConnector, LoadJob};
use crate::pool::BlockPool;
use crate::rules::geometry::{BlockId, Geometry};
use crate::runtime::claim::ClaimTable;
use crate::runtime::completion_queue::CompletionQueue;
use crate::runtime::inbox::Inbox;
use crate::runtime::load_estimate::LoadEstimate;
use crate::runtime::quarantine::Quarantine;
use crate::runtime::route::shard_of;
use crate::runtime::settings::Settings;
use crate::runtime::shard::{Env, Shard, ShardStepResult, StepSettings};
use crate::runtime::signal::WorkSignal;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, PhaseBarrier, RwLock, Unparker};

/// The most jobs the workers' queue holds: a step dispatches asynchronous loads only into the
/// room left when it begins (shared out between the shards), and requests admitted past it
/// compute what they would have loaded. With every worker stuck in a connector that never
/// returns, the queue would otherwise grow by a job (its block tables, its prompt) for every
/// request admitted.
pub(super) const MAX_QUEUED_LOADS: usize = 4096;

/// One shard's slot: its state, its inputs (commands, completions), and what its part of
/// the last step published and produced.
pub(super) struct ShardSlot {
    pub(super) state: Mutex<Shard>,
    pub(super) inbox: Inbox,
    pub(super) completions: Arc<CompletionQueue>,
    pub(super) published: Mutex<Vec<BlockId>>,
    pub(super) result: Mutex<Option<(ShardStepResult, Vec<LoadJob>)>>,
    /// Live request ids (duplicate check at submit; removed when a request ends).
    pub(super) ids: Mutex<rustc_hash::FxHashSet<StdArc<str>>>,
}

/// What the engine thread, the shard threads and the handles share.
pub(super) struct Inner {
    pub(super) geo: Geometry,
    pub(super) pool: Arc<BlockPool>,
    pub(super) claims: ClaimTable,
    pub(super) connector: StdArc<dyn KvConnector>,
    pub(super) shards: Vec<ShardSlot>,
    pub(super) barrier: PhaseBarrier,
    /// The engine thread's share of the step's report (sync-load failures, hand-offs).
    pub(super) report: Mutex<Option<(Vec<BlockId>, StdArc<Settings>)>>,
    /// Static per-shard parts (budget share, recording).
    pub(super) settings: Vec<StepSettings>,
    /// The live settings; the engine thread snapshots them once per step.
    pub(super) live_settings: ArcSwap<Settings>,
    pub(super) quarantine: Quarantine,
    /// The tier's load cost, measured by the shards.
    pub(super) load_estimate: LoadEstimate,
    pub(super) go: AtomicU64,
    pub(super) done: AtomicUsize,
    pub(super) stop: AtomicBool,
    /// Shutdown's last step: apply what arrived, admit and schedule nothing.
    pub(super) draining: AtomicBool,
    /// Room in the workers' queue when the step began ([`MAX_QUEUED_LOADS`] less the jobs it
    /// held): the most asynchronous loads this step dispatches, shared out between the
    /// shards.
    pub(super) load_room: AtomicUsize,
    /// Wakes the engine thread, which parks while shard threads finish a step.
    pub(super) engine: Unparker,
    /// Wakes an idle engine (`Runtime::wait_for_work`): a completion delivered, a request
    /// submitted or cancelled.
    pub(super) signal: StdArc<WorkSignal>,
    pub(super) seq: AtomicU64,
    pub(super) submitted: AtomicU64,
    /// Whether `submit` is accepted; `shutdown` closes it under the write lock.
    pub(super) open: RwLock<bool>,
    /// The first panic caught in a shard's step (shard, message): the runtime is poisoned.
    pub(super) poison: Mutex<Option<(usize, String)>>,
    /// Test hook: the shard whose next step panics (`usize::MAX`: none).
    #[cfg(test)]
    pub(super) panic_in_shard: AtomicUsize,
    /// Test hook: the shard whose claims in the next parallel step start late (`usize::MAX`:
    /// none).
    #[cfg(test)]
    pub(super) slow_claims_in_shard: AtomicUsize,
}

impl Inner {
    /// The shared state of a runtime with one shard per completion queue, before any step.
    pub(super) fn new(
        geo: Geometry,
        pool: BlockPool,
        connector: StdArc<dyn KvConnector>,
        queues: &[Arc<CompletionQueue>],
        settings: Vec<StepSettings>,
        live: Settings,
        signal: StdArc<WorkSignal>,
    ) -> Inner {
        let k = queues.len();
        let blocks = pool.num_blocks();
        Inner {
            geo,
            // One claim word per block id.
            claims: ClaimTable::new(pool.num_blocks()),
            pool: Arc::new(pool),
            quarantine: Quarantine::default(),
            load_estimate: LoadEstimate::default(),
            live_settings: ArcSwap::from_pointee(live),
            connector,
            shards: (0..k)
                .map(|i| ShardSlot {
                    state: Mutex::new(Shard::for_blocks(blocks)),
                    inbox: Inbox::default(),
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
            load_room: AtomicUsize::new(MAX_QUEUED_LOADS),
            engine: signal.engine().clone(),
            signal,
            seq: AtomicU64::new(1),
            submitted: AtomicU64::new(0),
            open: RwLock::new(true),
            poison: Mutex::new(None),
            #[cfg(test)]
            panic_in_shard: AtomicUsize::new(usize::MAX),
            #[cfg(test)]
            slow_claims_in_shard: AtomicUsize::new(usize::MAX),
        }
    }

    pub(super) fn shard_of(&self, id: &str) -> usize {
        shard_of(id, self.shards.len())
    }

    pub(super) fn env(&self, shard: usize) -> Env<'_> {
        Env {
            geo: &self.geo,
            pool: &self.pool,
            claims: &self.claims,
            connector: self.connector.as_ref(),
            quarantine: &self.quarantine,
            estimate: &self.load_estimate,
            shard,
            shards: self.shards.len(),
        }
    }
}
