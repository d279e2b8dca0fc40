//! loom models of kvsched's concurrent protocols live in `tests/` (one file per race, named
//! after it); run them with `loom-tests/run.sh` and prove they can fail with
//! `loom-tests/plants.sh`.
//!
//! This crate holds only the helpers the models share. Everything here, like every model,
//! exists only under `--cfg kvsched_loom`: a plain `cargo test --workspace` builds nothing.

#![cfg(kvsched_loom)]

use std::time::Duration;

use kvsched::connector::{KvConnector, NoConnector};
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::completion_queue::CompletionQueue;
use kvsched::runtime::worker::{model_job, model_job_key, Completion, WorkerPool};
use kvsched::sync::park::{Parker, Unparker};
use kvsched::sync::{Arc, AtomicU64, Ordering};
use loom::cell::UnsafeCell;

/// Preemption bound used when `LOOM_MAX_PREEMPTIONS` is not set (run.sh always sets it).
pub const DEFAULT_PREEMPTIONS: usize = 2;

/// Runs `f` under loom with the bound from `LOOM_MAX_PREEMPTIONS` (default
/// [`DEFAULT_PREEMPTIONS`]); the other `LOOM_*` variables are read by loom as usual.
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    let bound = builder.preemption_bound;
    let iterations = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = std::sync::Arc::clone(&iterations);
    let start = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    // The test harness names the thread after the test; run.sh shows these lines.
    eprintln!(
        "loom-model {}: {} executions, bound {}, {:.2}s",
        std::thread::current().name().unwrap_or("?"),
        iterations.load(std::sync::atomic::Ordering::Relaxed),
        bound.map_or("none".to_string(), |b| b.to_string()),
        start.elapsed().as_secs_f64()
    );
}

/// The contents of one KV block, as a loom cell: loom reports every pair of accesses that is
/// not ordered by happens-before (a write racing a read or another write) as a failure.
#[derive(Debug)]
pub struct BlockContents(UnsafeCell<u64>);

// SAFETY: every access goes through loom's cell, which fails the model on any access not
// ordered by happens-before, so sharing it is exactly what the models check.
unsafe impl Sync for BlockContents {}

impl BlockContents {
    /// A block holding `v`.
    pub fn new(v: u64) -> Self {
        BlockContents(UnsafeCell::new(v))
    }

    /// Reads the block (loom checks the read is ordered after every write).
    pub fn read(&self) -> u64 {
        // SAFETY: loom tracks the access; a read racing a write fails the model instead of
        // being undefined behaviour (the cell's value is a plain u64).
        self.0.with(|p| unsafe { *p })
    }

    /// Writes the block (loom checks the write is ordered after every other access).
    pub fn write(&self, v: u64) {
        // SAFETY: as in `read`.
        self.0.with_mut(|p| unsafe { *p = v })
    }
}

/// The engine's wake-up signal, [`WorkSignal`] of `crates/kvsched/src/runtime/signal.rs` (compiled out under
/// loom with the rest of the runtime, as it is an `impl Runtime`), restated line for line on
/// the real [`Parker`]/[`Unparker`]: an events counter bumped (Release) on every delivered
/// completion, then an unpark of the engine; the engine compares the counter (Acquire) with
/// the value it read when its last step began draining, and parks only while they are equal.
#[derive(Debug)]
pub struct WorkSignal {
    events: AtomicU64,
    engine: Unparker,
}

impl WorkSignal {
    /// A signal that wakes the parker `engine` belongs to.
    pub fn new(engine: Unparker) -> Self {
        WorkSignal {
            events: AtomicU64::new(0),
            engine,
        }
    }

    /// `WorkSignal::notify`: a worker delivered a completion.
    pub fn notify(&self) {
        self.events.fetch_add(1, Ordering::Release);
        self.engine.unpark();
    }

    /// What `Runtime::schedule` reads when it begins draining (`events_at_schedule`).
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Acquire)
    }

    /// `Runtime::wait_for_work` without a timeout (loom has no clock): returns once the
    /// counter differs from `before`.
    pub fn wait_for_work(&self, parker: &Parker, before: u64) {
        while self.events.load(Ordering::Acquire) == before {
            parker.park();
        }
    }
}

/// Shutdown timeout the models pass: never reached (loom has no clock, and a deadline that
/// could expire would make executions depend on wall time).
pub const NO_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The engine side of the real [`WorkerPool`], as the runtime drives it: one shard's bounded
/// completion queue, a connector whose loads all succeed ([`NoConnector`]), the pool's
/// `notify` wired to a [`WorkSignal`] on this thread's parker.
pub struct Engine {
    /// The shard's completion queue.
    pub queue: Arc<CompletionQueue>,
    /// The real pool.
    pub pool: WorkerPool,
    signal: Arc<WorkSignal>,
    parker: Parker,
}

impl Engine {
    /// Starts `workers` workers delivering into a queue of capacity `cap`.
    pub fn start(workers: usize, cap: usize) -> Self {
        Self::start_with(workers, cap, std::sync::Arc::new(NoConnector))
    }

    /// [`start`](Self::start) with `connector` running the loads.
    pub fn start_with(
        workers: usize,
        cap: usize,
        connector: std::sync::Arc<dyn KvConnector>,
    ) -> Self {
        let queue = Arc::new(CompletionQueue::new(cap));
        let parker = Parker::new();
        let signal = Arc::new(WorkSignal::new(parker.unparker()));
        let s = Arc::clone(&signal);
        let notify: std::sync::Arc<dyn Fn() + Send + Sync> =
            std::sync::Arc::new(move || s.notify());
        let pool = WorkerPool::start(
            workers,
            vec![Arc::clone(&queue)],
            Arc::from_std(connector),
            Arc::from_std(notify),
        )
        .expect("loom threads start");
        Engine {
            queue,
            pool,
            signal,
            parker,
        }
    }

    /// Dispatches a load of request `seq` (shard 0), attempt `attempt`.
    pub fn dispatch(&self, seq: u64, attempt: u32) {
        self.pool.dispatch(model_job(0, key(seq), attempt));
    }

    /// One step's drain: what is queued now, and the events count read before draining.
    pub fn drain(&self) -> (u64, Vec<Completion>) {
        let before = self.signal.events();
        let mut out = Vec::new();
        while let Some(c) = self.queue.pop() {
            out.push(c);
        }
        (before, out)
    }

    /// Steps until `n` completions were drained: drain, and with nothing new, wait for work
    /// (an untimed park: a lost wake-up leaves this thread asleep, which loom reports).
    pub fn drain_until(&self, n: usize) -> Vec<Completion> {
        let mut got = Vec::new();
        loop {
            let (before, cs) = self.drain();
            got.extend(cs);
            if got.len() >= n {
                return got;
            }
            self.signal.wait_for_work(&self.parker, before);
        }
    }

    /// The events count now (as `Runtime::schedule` reads it before draining).
    pub fn events(&self) -> u64 {
        self.signal.events()
    }

    /// Parks until the events count differs from `before`.
    pub fn wait_for_work(&self, before: u64) {
        self.signal.wait_for_work(&self.parker, before);
    }

    /// `Runtime::shutdown`'s part: `WorkerPool::shutdown` with a drain closure that parks what
    /// landed, then those pushed back into the queue for one last step (what does not fit is
    /// stale), then that step's drain. Returns `(applied, stale, never started)` as seqs.
    pub fn shutdown(self) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
        let Engine { queue, pool, .. } = self;
        let mut parked = Vec::new();
        let (left, finished) = pool.shutdown(
            || {
                while let Some(c) = queue.pop() {
                    parked.push(c);
                }
            },
            NO_TIMEOUT,
        );
        assert!(finished, "a worker was detached without a timeout");
        let mut stale = Vec::new();
        for c in parked {
            if let Err(c) = queue.push(c) {
                stale.push(c.key.seq());
            }
        }
        let mut applied = Vec::new();
        while let Some(c) = queue.pop() {
            applied.push(c.key.seq());
        }
        let left = left.iter().map(|j| model_job_key(j).seq()).collect();
        (applied, stale, left)
    }
}

/// A request key of sequence number `seq` (async, priority 0).
pub fn key(seq: u64) -> RequestKey {
    RequestKey::new(false, 0, seq)
}

/// A block pool with one contents cell per slot: the pool models' shared state.
pub struct PoolCells {
    /// The pool under test.
    pub pool: kvsched::pool::BlockPool,
    /// Slot `i`'s contents.
    pub contents: Vec<BlockContents>,
}

impl PoolCells {
    /// A pool of `num_blocks` slots, every cell 0.
    pub fn new(num_blocks: usize) -> Arc<Self> {
        Arc::new(PoolCells {
            pool: kvsched::pool::BlockPool::new(num_blocks).expect("pool"),
            contents: (0..num_blocks).map(|_| BlockContents::new(0)).collect(),
        })
    }

    /// The contents cell of `r`'s slot.
    pub fn cell(&self, r: kvsched::pool::BlockRef) -> &BlockContents {
        &self.contents[r.id as usize]
    }

    /// [`check_quiescent`] of the pool.
    pub fn check_quiescent(&self, held: &[kvsched::pool::BlockRef]) {
        check_quiescent(&self.pool, held);
    }
}

/// Quiescent checks of a pool: nothing refused, nothing corrupt (before and after draining
/// it: a corrupt free list shows when it is popped), conservation, and every block that is
/// not in `held` can be allocated exactly once more.
pub fn check_quiescent(p: &kvsched::pool::BlockPool, held: &[kvsched::pool::BlockRef]) {
    assert_eq!(
        p.invariant_violations(),
        0,
        "a pop found a slot that was not free"
    );
    assert_eq!(p.double_frees(), 0, "double free");
    assert_eq!(p.stale_releases(), 0, "stale release");
    let c = p.census();
    assert!(c.conserved(), "{c:?}");
    assert_eq!(c.referenced, held.len(), "{c:?}");
    let mut ids: Vec<u64> = held.iter().map(|r| r.id).collect();
    while let Some(r) = p.allocate() {
        ids.push(r.id);
    }
    assert_eq!(p.invariant_violations(), 0, "the free list was corrupt");
    ids.sort_unstable();
    let all: Vec<u64> = (1..p.num_blocks() as u64).collect();
    assert_eq!(ids, all, "a block leaked or was handed out twice");
}
