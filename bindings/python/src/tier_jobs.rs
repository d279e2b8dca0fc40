//! [`Jobs`]: the tier's worker threads and the jobs they run — stores (slots → chunks → the
//! store), loads (the store → checked chunks → slots) and existence probes — with the
//! finished-job list vLLM polls and the [`Index`] the results update.
//!
//! Every call from Python only enqueues (a lock held for a push) or drains (a lock held for a
//! swap): tier I/O, checksums and MACs run on these threads ([`tier_ops`](crate::tier_ops)),
//! which never touch Python, so they run while the interpreter holds or releases the GIL as it
//! likes. Every method takes `&self`: [`Jobs::stop`] may run while other threads submit, poll
//! or wait, and they then see a stopped pool (jobs fail at once), never a half-torn one.
//!
//! # Fork
//!
//! A forked child inherits the pool's state but none of its threads, and any of its locks a
//! worker held at the fork stays locked in the child. The pool records the creating process;
//! in any other process it runs nothing and touches none of the workers' locks: every store
//! and load fails at once (reported by `take_finished`), `lookup` answers `false`, `wait_idle`
//! answers `true`, and `stop` (and drop) joins nothing. A tier is created after the fork to be
//! used in the child; the pool's threads wait only on its own std locks
//! ([`kvsched::sync::fork_safe`]), so an idle pool in the parent leaves nothing behind that
//! the child's tier could trip on.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::{ChunkCodec, ChunkKey, Tier};
use kvsched::sync::fork_safe::{Lock, Wake};
use kvsched::sync::{thread, Arc, AtomicU64};

use crate::tier_index::{Index, IndexLens, Lookup};
use crate::tier_ops::{run_load, run_probe, run_store};
use crate::tier_region::Region;
use crate::tier_store::Store;

/// What a job does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Store,
    Load,
    Probe,
}

/// One job: vLLM's job id (none for a probe), its keys and their slots.
pub(crate) struct Job {
    pub op: Op,
    pub id: u64,
    pub keys: Vec<ChunkKey>,
    pub blocks: Vec<u64>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs queued or running.
    open: usize,
    stop: bool,
}

/// Counters for `stats()`.
#[derive(Default)]
pub(crate) struct Counters {
    pub stored_blocks: AtomicU64,
    pub loaded_blocks: AtomicU64,
    pub failed_stores: AtomicU64,
    pub failed_loads: AtomicU64,
    pub missing_chunks: AtomicU64,
    pub bad_chunks: AtomicU64,
    pub unreadable_chunks: AtomicU64,
    pub probes: AtomicU64,
}

/// What the workers share with the pool.
pub(crate) struct Shared {
    queue: Lock<Queue>,
    work: Wake,
    idle: Wake,
    finished: Lock<Vec<(u64, bool)>>,
    pub(crate) index: Lock<Index>,
    pub(crate) tier: Arc<dyn Tier>,
    pub(crate) store: Store,
    pub(crate) codec: ChunkCodec,
    pub(crate) region: Region,
    pub(crate) cancel: CancelToken,
    pub(crate) counters: Counters,
}

/// The worker pool and its state.
pub(crate) struct Jobs {
    shared: Arc<Shared>,
    /// Taken (and joined) by the first `stop`; held while joining, so a concurrent `stop`
    /// returns only once the workers are gone.
    workers: Lock<Vec<thread::JoinHandle<()>>>,
    /// The process that started the workers.
    pid: u32,
    /// The results of the jobs submitted in a forked child (all failed): only ever locked in
    /// a child, by the thread calling, so never held at a fork by a thread the child lacks.
    child_finished: Lock<Vec<(u64, bool)>>,
}

impl Jobs {
    /// Starts `threads` workers (at least 1) over `tier`, `region` and `codec`; the index's
    /// key sets hold at most `index_cap` keys each.
    pub(crate) fn start(
        store: Store,
        region: Region,
        codec: ChunkCodec,
        probe_unknown: bool,
        index_cap: usize,
        threads: usize,
    ) -> std::io::Result<Jobs> {
        let shared = Arc::new(Shared {
            queue: Lock::new(Queue::default()),
            work: Wake::new(),
            idle: Wake::new(),
            finished: Lock::new(Vec::new()),
            index: Lock::new(Index::new(probe_unknown, index_cap)),
            tier: store.tier(),
            store,
            codec,
            region,
            cancel: CancelToken::new(),
            counters: Counters::default(),
        });
        let jobs = Jobs {
            shared,
            workers: Lock::new(Vec::new()),
            pid: std::process::id(),
            child_finished: Lock::new(Vec::new()),
        };
        for n in 0..threads.max(1) {
            let s = jobs.shared.clone();
            // A worker that fails to start stops those started (`jobs` drops).
            let h = thread::Builder::new()
                .name(format!("kvsched-tier-{n}"))
                .spawn(move || worker(&s))?;
            jobs.workers.lock().push(h);
        }
        Ok(jobs)
    }

    /// Whether this is a forked child of the process that started the workers.
    pub(crate) fn forked(&self) -> bool {
        // The plant `tier-fork-unchecked` (scripts/plants.sh): a child takes itself for the
        // parent, queues jobs for workers it does not have and joins threads it never had.
        std::process::id() != self.pid && !cfg!(kvsched_plant = "tier-fork-unchecked")
    }

    /// The lookup answer for `key`, enqueueing a probe when the index asks for one (at most
    /// [`Index::PROBING_CAP`] probes are queued or running: past that the index answers a
    /// miss, so the probe queue is bounded however fast unknown keys are looked up).
    pub(crate) fn lookup(&self, key: ChunkKey) -> Option<bool> {
        // Stopped: every load fails at once, so nothing is present to load.
        if self.forked() || self.shared.queue.lock().stop {
            return Some(false);
        }
        // A store that knows at once what it holds (memory) is asked first, outside the
        // index's lock. (Planted bug `tier-memory-index-only`, scripts/plants.sh: the index
        // alone answers, promising what the store evicted and missing what it kept.)
        let held = self
            .shared
            .store
            .held_now(key)
            .filter(|_| !cfg!(kvsched_plant = "tier-memory-index-only"));
        let answer = match held {
            Some(held) => self.shared.index.lock().lookup_held(key, held),
            None => self.shared.index.lock().lookup(key),
        };
        match answer {
            Lookup::Hit => Some(true),
            Lookup::Miss => Some(false),
            Lookup::Retry => None,
            Lookup::Probe => {
                self.enqueue(Job {
                    op: Op::Probe,
                    id: 0,
                    keys: vec![key],
                    blocks: Vec::new(),
                });
                None
            }
        }
    }

    /// Enqueues a store: the keys already present or being stored are dropped from it here
    /// (vLLM leaves that filtering to the tier).
    pub(crate) fn submit_store(&self, id: u64, keys: Vec<ChunkKey>, blocks: Vec<u64>) {
        if self.forked() {
            return self.submit_load(id, keys, blocks);
        }
        // Keys the memory store evicted are written again, whatever the index remembers.
        let evicted: Vec<ChunkKey> = if cfg!(kvsched_plant = "tier-memory-index-only") {
            Vec::new()
        } else {
            match self.shared.store.held_now_all(&keys) {
                Some(held) => keys
                    .iter()
                    .zip(held)
                    .filter(|&(_, held)| !held)
                    .map(|(&k, _)| k)
                    .collect(),
                None => Vec::new(),
            }
        };
        let (keys, blocks) = {
            let mut ix = self.shared.index.lock();
            for &k in &evicted {
                ix.forget_present(k);
            }
            keys.into_iter()
                .zip(blocks)
                .filter(|(k, _)| ix.begin_store(*k))
                .unzip()
        };
        self.enqueue(Job {
            op: Op::Store,
            id,
            keys,
            blocks,
        });
    }

    /// Enqueues a load.
    pub(crate) fn submit_load(&self, id: u64, keys: Vec<ChunkKey>, blocks: Vec<u64>) {
        self.enqueue(Job {
            op: Op::Load,
            id,
            keys,
            blocks,
        });
    }

    /// A job nothing will run (the pool stopped before it ran): a store or load fails (vLLM
    /// recomputes), reported by `take_finished` as any job is; a probe is answered "absent".
    fn fail_unrun(&self, job: &Job) {
        match job.op {
            Op::Store => {
                let mut ix = self.shared.index.lock();
                for &k in &job.keys {
                    ix.end_store(k, false);
                }
                drop(ix);
                self.shared.finished.lock().push((job.id, false));
            }
            Op::Load => self.shared.finished.lock().push((job.id, false)),
            Op::Probe => {
                let mut ix = self.shared.index.lock();
                for &k in &job.keys {
                    ix.end_probe(k, false);
                }
            }
        }
    }

    fn enqueue(&self, job: Job) {
        if self.forked() {
            if job.op != Op::Probe {
                self.child_finished.lock().push((job.id, false));
            }
            return;
        }
        let mut q = self.shared.queue.lock();
        if q.stop {
            drop(q);
            self.fail_unrun(&job);
            return;
        }
        q.open += 1;
        q.jobs.push_back(job);
        drop(q);
        self.shared.work.notify_one();
    }

    /// The jobs finished since the last call: `(job id, success)`, in completion order.
    pub(crate) fn take_finished(&self) -> Vec<(u64, bool)> {
        if self.forked() {
            return std::mem::take(&mut *self.child_finished.lock());
        }
        std::mem::take(&mut *self.shared.finished.lock())
    }

    /// Waits until no job is queued or running, at most `timeout` (one too long for an
    /// `Instant`, such as `Duration::MAX`: without limit); whether that happened (in a forked
    /// child nothing runs: `true`).
    pub(crate) fn wait_idle(&self, timeout: Duration) -> bool {
        if self.forked() {
            return true;
        }
        let deadline = Instant::now().checked_add(timeout);
        let mut q = self.shared.queue.lock();
        while q.open > 0 {
            let (g, timed_out) = self.shared.idle.wait_until(q, deadline);
            q = g;
            if timed_out {
                return q.open == 0;
            }
        }
        true
    }

    /// The counters.
    pub(crate) fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// The lengths of the index's key sets (in a forked child, where a worker may have held
    /// the index's lock at the fork, all zero unless the lock is free).
    pub(crate) fn index_lens(&self) -> IndexLens {
        let zero = IndexLens {
            present: 0,
            failed: 0,
            absent: 0,
        };
        if self.forked() {
            return self.shared.index.try_lock().map_or(zero, |ix| ix.lens());
        }
        self.shared.index.lock().lens()
    }

    /// Stops the workers and joins them: queued jobs fail unrun (reported), running loads and probes
    /// are cancelled, a running store stops at its next batch (its current `put` is bounded by
    /// the store's own call timeout). Idempotent, and safe to call while other threads use
    /// the pool; a concurrent call returns once the workers are joined. In a forked child it
    /// joins nothing (the workers are the parent's).
    pub(crate) fn stop(&self) {
        if self.forked() {
            if let Some(mut workers) = self.workers.try_lock() {
                // Not the child's threads: joining or detaching them is meaningless here.
                for h in workers.drain(..) {
                    std::mem::forget(h);
                }
            }
            return;
        }
        let mut workers = self.workers.lock();
        let unrun = {
            let mut q = self.shared.queue.lock();
            q.stop = true;
            q.open -= q.jobs.len();
            std::mem::take(&mut q.jobs)
        };
        // Every job is reported once: those queued fail as those submitted from now on do.
        // (Planted bug `tier-stop-drops-queued`, scripts/plants.sh: they are never reported.)
        if !cfg!(kvsched_plant = "tier-stop-drops-queued") {
            for job in &unrun {
                self.fail_unrun(job);
            }
        }
        self.shared.cancel.cancel();
        self.shared.work.notify_all();
        for h in workers.drain(..) {
            let _ = h.join();
        }
        drop(workers);
        self.shared.idle.notify_all();
    }
}

impl Drop for Jobs {
    fn drop(&mut self) {
        self.stop();
    }
}

fn worker(s: &Shared) {
    loop {
        let job = {
            let mut q = s.queue.lock();
            loop {
                if q.stop {
                    return;
                }
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if cfg!(kvsched_plant = "tier-pool-parks-globally") {
                    // Planted bug (scripts/plants.sh): an idle worker waits in parking_lot's
                    // process-wide table, as the pool once did; a child forked meanwhile
                    // inherits its entry.
                    drop(q);
                    let lock = kvsched::sync::Mutex::new(());
                    let pause = Instant::now() + Duration::from_millis(20);
                    let cv = kvsched::sync::condvar::Condvar::new();
                    drop(cv.wait_until(lock.lock(), Some(pause)));
                    q = s.queue.lock();
                    continue;
                }
                q = s.work.wait(q);
            }
        };
        let result = match job.op {
            Op::Store => Some(run_store(s, &job)),
            Op::Load => Some(run_load(s, &job)),
            Op::Probe => {
                run_probe(s, &job);
                None
            }
        };
        if let Some(ok) = result {
            s.finished.lock().push((job.id, ok));
        }
        let mut q = s.queue.lock();
        q.open -= 1;
        if q.open == 0 {
            s.idle.notify_all();
        }
    }
}

impl Jobs {
    /// Bytes per slot of the region.
    pub(crate) fn block_bytes(&self) -> usize {
        self.shared.region.block_bytes()
    }
}
