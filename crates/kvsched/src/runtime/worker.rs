//! Worker threads that run asynchronous loads and deliver completions to the owning shard
//! through a bounded lock-free queue.
//!
//! # Guarantees
//!
//! * A worker never takes a scheduler lock: it pops a [`LoadJob`] from a lock-free queue, runs
//!   [`KvConnector::load`], and pushes a [`Completion`] onto the owning shard's bounded
//!   completion queue.
//! * **Back-pressure is explicit:** when a shard's completion queue is full the worker spins
//!   briefly, then parks until a pop makes room ([`CompletionQueue`](super::completion_queue))
//!   and retries; it never drops a completion. Shards drain their queue at every step, so a
//!   stalled engine stalls the workers, never loses results.
//! * A connector that panics is reported as a failed load of every block the job writes; the
//!   worker thread survives and takes the next job.
//! * On shutdown, workers finish the load they are running, deliver it, and exit; jobs still
//!   queued are returned to the caller so it can report them cancelled. The shutdown sleeps
//!   until a worker exits or waits for room (then it drains), or until its deadline.

use std::time::Instant;

#[cfg(kvsched_loom)]
use crate::connector::LoadOwner;
use crate::connector::{InvalidBlocks, KvConnector, LoadJob, LoadResult};
use crate::panics::caught;
use crate::runtime::claim::RequestKey;
pub use pool_impl::WorkerPool;

/// A finished load, on its way to the shard that owns the request.
#[derive(Clone, Debug)]
pub struct Completion {
    /// The request's key.
    pub key: RequestKey,
    /// The load attempt it answers.
    pub attempt: u32,
    /// Success, or the invalid blocks.
    pub result: LoadResult,
    /// Whether the connector panicked (the result then fails every loaded block).
    pub panicked: bool,
    /// When the worker started the load (took it off the queue).
    pub started_at: Instant,
    /// When the worker finished the load.
    pub finished_at: Instant,
}

/// Runs one load, turning a panic into a failure of every block the job writes.
pub fn run_load(connector: &dyn KvConnector, job: &LoadJob) -> (LoadResult, bool) {
    match caught(|| connector.load(job)) {
        Ok(r) => (r, false),
        Err(_) => (
            LoadResult::Failed(InvalidBlocks::Flat(job.all_loaded_blocks())),
            true,
        ),
    }
}

/// What a worker does with a job it took: nothing when the shard dropped it before any
/// worker started it (`None`: it never runs, nobody waits for it); otherwise the job is
/// started and run — or, taken past its deadline, failed unrun (`ran` is `false`) — and its
/// completion returned.
pub fn take_job(connector: &dyn KvConnector, job: &LoadJob) -> Option<(Completion, bool)> {
    if !job.cancel.start() {
        return None;
    }
    let started_at = Instant::now();
    let ran = job.deadline.is_none_or(|d| started_at < d);
    let (result, panicked) = if ran {
        run_load(connector, job)
    } else {
        (LoadResult::all_failed(job), false)
    };
    let c = Completion {
        key: RequestKey::from_raw(job.owner.key),
        attempt: job.attempt,
        result,
        panicked,
        started_at,
        finished_at: Instant::now(),
    };
    Some((c, ran))
}

/// A load job for request `key` of shard `shard` that writes no block: the loom models'
/// jobs (a job's owner is the runtime's business, not constructible outside the crate).
#[cfg(kvsched_loom)]
pub fn model_job(shard: usize, key: RequestKey, attempt: u32) -> LoadJob {
    LoadJob {
        request: std::sync::Arc::from("model"),
        tokens: std::sync::Arc::from(Vec::new()),
        cancel: crate::connector::CancelToken::new(),
        fill: None,
        owner: LoadOwner {
            shard,
            key: key.raw(),
        },
        attempt,
        start_tokens: 0,
        end_tokens: 0,
        block_tables: Vec::new(),
        block_sizes: Vec::new(),
        deadline: None,
    }
}

/// What a worker does before running `job`: marks it started, unless the shard dropped it
/// first (loom models: the protocol is crate-private).
#[cfg(kvsched_loom)]
pub fn model_start(job: &LoadJob) -> bool {
    job.cancel.start()
}

/// What a shard does when it stops waiting for `job`: drops it if no worker started it
/// (loom models).
#[cfg(kvsched_loom)]
pub fn model_drop_unstarted(job: &LoadJob) -> bool {
    job.cancel.drop_unstarted()
}

/// The request key a job's completion goes to (loom models: a job's owner is crate-private).
#[cfg(kvsched_loom)]
pub fn model_job_key(job: &LoadJob) -> RequestKey {
    RequestKey::from_raw(job.owner.key)
}

/// The worker threads. Under `cfg(kvsched_loom)` they are loom threads through the sync shim
/// (a `sleep` yields, a `Backoff` never spins, `is_finished` is a flag), and the loom models
/// drive this very pool; only the shutdown deadline stays wall-clock (models pass one that
/// never expires).
mod pool_impl {
    use std::time::{Duration, Instant};

    use super::take_job;
    use crate::connector::{KvConnector, LoadJob};
    use crate::runtime::completion_queue::CompletionQueue;
    use crate::sync::park::{Parker, Unparker};
    use crate::sync::{
        fence, thread, Arc, AtomicBool, AtomicU64, AtomicUsize, Backoff, Ordering, SegQueue,
    };

    /// The ordering of a completion's `delivered` count: Release, pairing with the Acquire
    /// load in `Runtime::loads_in_flight`. The planted bug `delivered-relaxed` (loom model
    /// `loads_in_flight`) weakens it.
    const DELIVERED_ORDER: Ordering = if planted!("delivered-relaxed") {
        Ordering::Relaxed
    } else {
        Ordering::Release
    };

    /// Counters kept by the workers.
    #[derive(Debug, Default)]
    pub struct WorkerCounts {
        /// Loads run.
        pub loads: AtomicU64,
        /// Connector panics caught.
        pub panics: AtomicU64,
        /// Times a worker found a completion queue full and backed off (a spin, or a park
        /// until a pop made room).
        pub queue_full_retries: AtomicU64,
        /// Jobs whose deadline had passed when a worker took them: returned without running.
        pub expired_unrun: AtomicU64,
        /// Completions pushed onto their shard's queue.
        pub delivered: AtomicU64,
    }

    struct Shared {
        jobs: SegQueue<LoadJob>,
        queues: Vec<Arc<CompletionQueue>>,
        connector: Arc<dyn KvConnector>,
        stop: AtomicBool,
        /// Workers that have left `worker_loop`, each counted before it wakes the joiner.
        exited: AtomicUsize,
        /// Wakes the thread waiting in `stop_and_join` (the pool's `joiner`): unparked by a
        /// worker that exits or waits for room in a full queue (which the joiner's drain
        /// makes). An unpark while nobody joins leaves a notification that makes the join's
        /// first park return at once: one more check, nothing lost.
        joiner: Unparker,
        /// Set when the pool is dropped without a drain: a full queue is abandoned.
        abandon: AtomicBool,
        /// Per worker, whether it is listed idle: set by the worker before its last check of
        /// the jobs and its park, cleared by the dispatch that wakes it or by the worker itself
        /// once awake. A listed worker is parked or about to park, never running a load: a
        /// dispatch wakes only a worker that can take its job.
        idle: Vec<AtomicBool>,
        unparkers: Vec<Unparker>,
        counters: WorkerCounts,
        notify: Arc<dyn Fn() + Send + Sync>,
    }

    /// A fixed set of worker threads.
    pub struct WorkerPool {
        shared: Arc<Shared>,
        /// Where `stop_and_join` sleeps (one joiner at a time: it takes the pool mutably).
        joiner: Parker,
        handles: Vec<thread::JoinHandle<()>>,
    }

    impl std::fmt::Debug for WorkerPool {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("WorkerPool")
                .field("workers", &self.handles.len())
                .finish()
        }
    }

    impl WorkerPool {
        /// Starts `workers` threads (at least 1) delivering to `queues` (indexed by shard);
        /// `notify` is called after every delivered completion.
        pub fn start(
            workers: usize,
            queues: Vec<Arc<CompletionQueue>>,
            connector: Arc<dyn KvConnector>,
            notify: Arc<dyn Fn() + Send + Sync>,
        ) -> std::io::Result<Self> {
            let n = workers.max(1);
            let parkers: Vec<Parker> = (0..n).map(|_| Parker::new()).collect();
            let joiner = Parker::new();
            let shared = Arc::new(Shared {
                jobs: SegQueue::new(),
                queues,
                connector,
                stop: AtomicBool::new(false),
                exited: AtomicUsize::new(0),
                joiner: joiner.unparker(),
                abandon: AtomicBool::new(false),
                idle: (0..n).map(|_| AtomicBool::new(false)).collect(),
                unparkers: parkers.iter().map(Parker::unparker).collect(),
                counters: WorkerCounts::default(),
                notify,
            });
            let mut handles = Vec::new();
            for (i, parker) in parkers.into_iter().enumerate() {
                let s = Arc::clone(&shared);
                let h = thread::Builder::new()
                    .name(format!("kvsched-worker-{i}"))
                    .spawn(move || {
                        let _exit = Exit(&s);
                        worker_loop(&s, i, &parker);
                    });
                match h {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        // Stop the ones already started before reporting the error.
                        // Release: pairs with the Acquire loads of `stop` in `worker_loop`.
                        shared.stop.store(true, Ordering::Release);
                        for u in &shared.unparkers {
                            u.unpark();
                        }
                        for h in handles {
                            let _ = h.join();
                        }
                        return Err(e);
                    }
                }
            }
            Ok(WorkerPool {
                shared,
                joiner,
                handles,
            })
        }

        /// Queues a load and wakes one idle worker, if any is listed (an awake worker takes
        /// every queued job before it lists itself again).
        pub fn dispatch(&self, job: LoadJob) {
            let s = &*self.shared;
            s.jobs.push(job);
            // SeqCst: pairs with the fence in `worker_loop` between listing and re-checking the
            // jobs: either that re-check sees this job, or this scan sees the listing.
            // (Planted bug `worker-no-fence`, loom-tests/plants.sh: both fences left out.)
            if !planted!("worker-no-fence") {
                fence(Ordering::SeqCst);
            }
            for (flag, unparker) in s.idle.iter().zip(&s.unparkers) {
                // Relaxed: the fences above and in `worker_loop` order the listing against this
                // read; the CAS takes the listing once (a worker taking it back, or another
                // dispatch, makes it fail) and the unpark publishes what the worker needs.
                if flag.load(Ordering::Relaxed)
                    && flag
                        .compare_exchange(true, false, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    unparker.unpark();
                    return;
                }
            }
        }

        /// Jobs queued that no worker has taken yet (dropped ones among them until a worker
        /// meets them).
        pub fn queued(&self) -> usize {
            self.shared.jobs.len()
        }

        /// The workers' counters.
        pub fn counts(&self) -> &WorkerCounts {
            &self.shared.counters
        }

        /// Stops the workers after their current load and returns the jobs never started.
        /// `drain` is called while waiting, first and then each time a worker waits for room
        /// in a full queue, so the caller can empty the completion queues that a finishing
        /// worker is blocked on; between those the caller sleeps until a worker exits.
        /// Waits at most `timeout` for the loads in flight; returns the jobs never started and
        /// whether every worker finished. Workers still inside a load after the timeout are
        /// detached: they finish it, deliver nothing, and exit — the caller must treat their
        /// loads' blocks as still being written.
        pub fn shutdown(mut self, drain: impl FnMut(), timeout: Duration) -> (Vec<LoadJob>, bool) {
            self.stop_and_join(drain, timeout)
        }

        fn stop_and_join(
            &mut self,
            mut drain: impl FnMut(),
            timeout: Duration,
        ) -> (Vec<LoadJob>, bool) {
            // Release: pairs with the Acquire load in `worker_loop`; a worker that sees the flag
            // exits after its current load.
            self.shared.stop.store(true, Ordering::Release);
            for u in &self.shared.unparkers {
                u.unpark();
            }
            // A timeout past what an Instant can hold waits for the loads as long as they take.
            let deadline = Instant::now().checked_add(timeout);
            let n = self.handles.len();
            // Acquire: pairs with the Release increment in `Exit::drop`: a worker counted has
            // left its loop (only its thread's end is still to come).
            while self.shared.exited.load(Ordering::Acquire) < n {
                // Planted bug (loom-tests/plants.sh): no drain while waiting, so a worker
                // blocked on a full queue never finishes.
                if !planted!("shutdown-no-drain-while-waiting") {
                    drain();
                }
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    // Release: pairs with the Acquire load in the push loop; a late worker
                    // delivers nothing.
                    self.shared.abandon.store(true, Ordering::Release);
                    // A worker parked on a full queue wakes to see it.
                    for u in &self.shared.unparkers {
                        u.unpark();
                    }
                    break;
                }
                // Woken by a worker exiting or waiting for room (an unpark before the park
                // makes it return at once), or at the deadline.
                match deadline {
                    Some(d) => self.joiner.park_timeout(d.saturating_duration_since(now)),
                    None => self.joiner.park(),
                }
            }
            drain();
            // Acquire: as above.
            let all_exited = self.shared.exited.load(Ordering::Acquire) >= n;
            let mut all_finished = true;
            for h in self.handles.drain(..) {
                if all_exited || h.is_finished() {
                    let _ = h.join();
                } else {
                    all_finished = false; // detached
                }
            }
            let mut left = Vec::new();
            while let Some(j) = self.shared.jobs.pop() {
                left.push(j);
            }
            (left, all_finished)
        }
    }

    impl Drop for WorkerPool {
        fn drop(&mut self) {
            if !self.handles.is_empty() {
                // Nobody drains the queues any more: workers blocked on a full queue give up,
                // and a worker stuck in a load is detached after a second.
                // Release: pairs with the Acquire loads of `abandon` in `worker_loop`.
                self.shared.abandon.store(true, Ordering::Release);
                let _ = self.stop_and_join(|| {}, Duration::from_secs(1));
            }
        }
    }

    /// Counts its worker out of `worker_loop` (whichever way it leaves) and wakes the joiner.
    struct Exit<'a>(&'a Shared);

    impl Drop for Exit<'_> {
        fn drop(&mut self) {
            // Release: pairs with the Acquire loads in `stop_and_join`.
            self.0.exited.fetch_add(1, Ordering::Release);
            // Planted bug `worker-exit-silent` (scripts/plants.sh): the joiner is not woken
            // and sleeps until its deadline.
            if !planted!("worker-exit-silent") {
                self.0.joiner.unpark();
            }
        }
    }

    fn worker_loop(s: &Shared, me: usize, parker: &Parker) {
        let backoff = Backoff::new();
        loop {
            // Acquire: pairs with the Release store in `stop_and_join`.
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            let Some(job) = s.jobs.pop() else {
                if !backoff.is_completed() {
                    backoff.snooze();
                    continue;
                }
                // List as idle, re-check, then park untimed: a dispatch after the re-check
                // takes the listing and unparks us, and an unpark that lands before the park
                // makes it return at once. Relaxed: the fence below orders it.
                s.idle[me].store(true, Ordering::Relaxed);
                // SeqCst: pairs with the fence in `dispatch` (listing, then re-check here;
                // push, then scan there).
                if !planted!("worker-no-fence") {
                    fence(Ordering::SeqCst);
                }
                // Acquire: pairs with the Release store of `stop` in `stop_and_join`. Planted
                // bug `worker-no-recheck` (loom-tests/plants.sh): no re-check of the jobs after
                // listing, so a job dispatched before the listing is never run.
                let idle = (planted!("worker-no-recheck") || s.jobs.is_empty())
                    && !s.stop.load(Ordering::Acquire);
                if idle {
                    parker.park();
                }
                // Awake (a dispatch's unpark, a job the re-check found, a stop, or a wake-up
                // meant for an earlier park): the listing goes before any load runs, so no
                // dispatch wakes this worker for a job while it runs another and leaves an idle
                // one asleep. A dispatch that took it first has unparked us: our next park
                // returns at once. Relaxed: a dispatch's CAS on the flag decides who takes it.
                // (Planted bug `worker-busy-listed`, loom-tests/plants.sh: the listing stays,
                // and a dispatch wakes this worker while it runs a load.)
                if !planted!("worker-busy-listed") {
                    s.idle[me].store(false, Ordering::Relaxed);
                }
                backoff.reset();
                continue;
            };
            backoff.reset();
            // A job whose deadline passed while queued is not run: the scheduler has already
            // failed it, and running it would only delay the loads queued behind it.
            // A job the shard dropped before any worker took it is not run, and nobody waits
            // for its completion: the shard has freed its blocks (`CancelToken::start`
            // settles which side came first). It counts as delivered for `loads_in_flight`.
            let Some((mut c, ran)) = take_job(s.connector.as_ref(), &job) else {
                // Release: pairs with the Acquire load in `Runtime::loads_in_flight`.
                s.counters.delivered.fetch_add(1, Ordering::Release);
                continue;
            };
            if ran {
                s.counters.loads.fetch_add(1, Ordering::Relaxed);
            } else {
                s.counters.expired_unrun.fetch_add(1, Ordering::Relaxed);
            }
            if c.panicked {
                s.counters.panics.fetch_add(1, Ordering::Relaxed);
            }
            // Acquire: pairs with the Release store in `stop_and_join` / `Drop`.
            if s.abandon.load(Ordering::Acquire) {
                return;
            }
            let Some(q) = s.queues.get(job.owner.shard) else {
                continue;
            };
            let push_backoff = Backoff::new();
            let mut refused = false;
            // Listed on the queue as waiting for room since the last refusal (the retry that
            // follows a listing parks when refused); `on_list` until taken off it here (a pop
            // that wakes the worker takes it off too).
            let mut listed = false;
            let mut on_list = false;
            // Planted bug `delivered-before-push` (loom-tests/plants.sh): the completion counts
            // as delivered before it is in its queue.
            let early = planted!("delivered-before-push");
            if early {
                s.counters.delivered.fetch_add(1, Ordering::Release);
            }
            loop {
                match q.push(c) {
                    Ok(()) => {
                        if on_list {
                            q.unlist(me);
                        }
                        // Release: pairs with the Acquire load in `Runtime::loads_in_flight`,
                        // so a caller that counts this completion delivered finds it queued.
                        // (Planted bug `delivered-relaxed`: Relaxed.)
                        if !early {
                            s.counters.delivered.fetch_add(1, DELIVERED_ORDER);
                        }
                        break;
                    }
                    Err(back) => {
                        // Planted bug (loom-tests/plants.sh): a full queue drops the
                        // completion.
                        if planted!("worker-drop-on-full") {
                            drop(back);
                            break;
                        }
                        // Acquire: pairs with the Release stores in `Drop` and `stop_and_join`
                        // (each unparks the workers after it).
                        if s.abandon.load(Ordering::Acquire) {
                            if on_list {
                                q.unlist(me);
                            }
                            break;
                        }
                        c = back;
                        if std::mem::take(&mut listed) {
                            // Refused after listing: no pop came between, and the next one
                            // wakes this worker (or a stop, or a wake-up meant for an earlier
                            // park: the push is retried and the worker listed again).
                            parker.park();
                            continue;
                        }
                        s.counters
                            .queue_full_retries
                            .fetch_add(1, Ordering::Relaxed);
                        // The engine is woken to drain the queue at the first refusal, and
                        // again once the spins are done and the worker lists itself to sleep
                        // until a pop makes room (so is a shutdown waiting to drain).
                        if push_backoff.is_completed() {
                            (s.notify)();
                            q.wait_for_room(me, &s.unparkers[me]);
                            listed = true;
                            on_list = true;
                            s.joiner.unpark();
                        } else {
                            if !std::mem::replace(&mut refused, true) {
                                (s.notify)();
                            }
                            push_backoff.snooze();
                        }
                    }
                }
            }
            (s.notify)();
        }
    }
}
