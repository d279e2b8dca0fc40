//! [`Jobs`]: the tier's worker threads and the jobs they run — stores (slots → chunks → the
//! store), loads (the store → checked chunks → slots) and existence probes — with the
//! finished-job list vLLM polls and the [`Index`] the results update.
//!
//! Every call from Python only enqueues (a lock held for a push) or drains (a lock held for a
//! swap): tier I/O, checksums and MACs run on these threads, which never touch Python, so they
//! run while the interpreter holds or releases the GIL as it likes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::{ChunkCodec, ChunkKey, Tier};
use kvsched::sync::condvar::Condvar;
use kvsched::sync::{thread, Arc, AtomicU64, Mutex, Ordering};

use crate::tier_index::{Index, LoadMiss, Lookup};
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
    pub probes: AtomicU64,
}

struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
    idle: Condvar,
    finished: Mutex<Vec<(u64, bool)>>,
    index: Mutex<Index>,
    tier: Arc<dyn Tier>,
    store: Store,
    codec: ChunkCodec,
    region: Region,
    cancel: CancelToken,
    counters: Counters,
}

/// The worker pool and its state.
pub(crate) struct Jobs {
    shared: Arc<Shared>,
    workers: Vec<thread::JoinHandle<()>>,
}

impl Jobs {
    /// Starts `threads` workers (at least 1) over `tier`, `region` and `codec`.
    pub(crate) fn start(
        store: Store,
        region: Region,
        codec: ChunkCodec,
        probe_unknown: bool,
        threads: usize,
    ) -> std::io::Result<Jobs> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            finished: Mutex::new(Vec::new()),
            index: Mutex::new(Index::new(probe_unknown)),
            tier: store.tier(),
            store,
            codec,
            region,
            cancel: CancelToken::new(),
            counters: Counters::default(),
        });
        let mut jobs = Jobs {
            shared,
            workers: Vec::new(),
        };
        for n in 0..threads.max(1) {
            let s = jobs.shared.clone();
            let h = thread::Builder::new()
                .name(format!("kvsched-tier-{n}"))
                .spawn(move || worker(&s))?;
            jobs.workers.push(h);
        }
        Ok(jobs)
    }

    /// The lookup answer for `key`, enqueueing a probe when the index asks for one.
    pub(crate) fn lookup(&self, key: ChunkKey) -> Option<bool> {
        let answer = self.shared.index.lock().lookup(key);
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
        let (keys, blocks) = {
            let mut ix = self.shared.index.lock();
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

    fn enqueue(&self, job: Job) {
        let mut q = self.shared.queue.lock();
        if q.stop {
            // Stopped: nothing will run it. A store or load fails at once (vLLM recomputes);
            // a probe is answered "absent".
            drop(q);
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
            return;
        }
        q.open += 1;
        q.jobs.push_back(job);
        drop(q);
        self.shared.work.notify_one();
    }

    /// The jobs finished since the last call: `(job id, success)`, in completion order.
    pub(crate) fn take_finished(&self) -> Vec<(u64, bool)> {
        std::mem::take(&mut *self.shared.finished.lock())
    }

    /// Waits until no job is queued or running, at most `timeout`; whether that happened.
    pub(crate) fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.queue.lock();
        while q.open > 0 {
            let (g, timed_out) = self.shared.idle.wait_until(q, Some(deadline));
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

    /// Keys answered present.
    pub(crate) fn present_len(&self) -> usize {
        self.shared.index.lock().present_len()
    }

    /// Stops the workers (queued jobs are dropped, running tier calls are cancelled) and joins
    /// them. Idempotent.
    pub(crate) fn stop(&mut self) {
        {
            let mut q = self.shared.queue.lock();
            q.stop = true;
            q.open -= q.jobs.len();
            q.jobs.clear();
        }
        self.shared.cancel.cancel();
        self.shared.work.notify_all();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
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

fn run_store(s: &Shared, job: &Job) -> bool {
    let mut chunks = Vec::with_capacity(job.keys.len());
    let mut ok = true;
    for (&key, &block) in job.keys.iter().zip(&job.blocks) {
        match s.region.read(block) {
            Some(payload) => chunks.push((key, s.codec.encode(key, 0, 0, &payload))),
            None => ok = false,
        }
    }
    ok = ok && (chunks.is_empty() || s.tier.put(&chunks).is_ok());
    let mut ix = s.index.lock();
    for &key in &job.keys {
        ix.end_store(key, ok);
    }
    drop(ix);
    let c = &s.counters;
    if ok {
        c.stored_blocks
            .fetch_add(job.keys.len() as u64, Ordering::Relaxed);
    } else {
        c.failed_stores.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

fn run_load(s: &Shared, job: &Job) -> bool {
    let block_bytes = s.region.block_bytes() as u64;
    let got = s.tier.get(&job.keys, &s.cancel);
    let mut misses: Vec<(ChunkKey, LoadMiss)> = Vec::new();
    match got {
        Ok(values) => {
            for ((&key, &block), value) in job.keys.iter().zip(&job.blocks).zip(values) {
                let Some(value) = value else {
                    misses.push((key, LoadMiss::Absent));
                    continue;
                };
                match s.codec.decode(&value, key, 0, block_bytes) {
                    Ok(payload) if s.region.write(block, payload) => {}
                    Ok(_) => misses.push((key, LoadMiss::Absent)),
                    Err(_) => misses.push((key, LoadMiss::Bad)),
                }
            }
        }
        Err(_) => misses.extend(job.keys.iter().map(|&k| (k, LoadMiss::Absent))),
    }
    let c = &s.counters;
    let ok = misses.is_empty() && job.keys.len() == job.blocks.len();
    if ok {
        c.loaded_blocks
            .fetch_add(job.keys.len() as u64, Ordering::Relaxed);
        return true;
    }
    c.failed_loads.fetch_add(1, Ordering::Relaxed);
    let mut ix = s.index.lock();
    for &(key, why) in &misses {
        let counter = match why {
            LoadMiss::Absent => &c.missing_chunks,
            LoadMiss::Bad => &c.bad_chunks,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        ix.load_missed(key, why);
    }
    false
}

fn run_probe(s: &Shared, job: &Job) {
    s.counters.probes.fetch_add(1, Ordering::Relaxed);
    let found = s
        .store
        .probe(&job.keys, &s.cancel)
        .unwrap_or_else(|_| vec![false; job.keys.len()]);
    let mut ix = s.index.lock();
    for (&key, exists) in job.keys.iter().zip(found) {
        ix.end_probe(key, exists);
    }
}

impl Jobs {
    /// Bytes per slot of the region.
    pub(crate) fn block_bytes(&self) -> usize {
        self.shared.region.block_bytes()
    }
}
