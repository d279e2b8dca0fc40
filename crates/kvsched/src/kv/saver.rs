//! [`Saver`]: the connector's write-behind: a bounded queue of chunks to store and keys to
//! probe, drained by its own threads, so a step never waits for a tier.

use std::collections::VecDeque;

use super::key_index::KeyIndex;
use super::{ChunkCodec, ChunkKey, Tier};
use crate::connector::CancelToken;
use crate::sync::condvar::Condvar;
use crate::sync::{thread, Arc, AtomicU64, AtomicUsize, Mutex, Ordering};

/// One unit of background work.
pub(crate) enum Work {
    /// Store this block's bytes under `key`.
    Save {
        key: ChunkKey,
        group: u32,
        tokens: u32,
        payload: Vec<u8>,
    },
    /// Ask the tier which of these keys it holds and remember those it does.
    Probe(Vec<ChunkKey>),
}

/// Counters of the write-behind.
#[derive(Debug, Default)]
pub(crate) struct SaverCounters {
    pub saved_chunks: AtomicU64,
    pub saved_bytes: AtomicU64,
    pub dropped: AtomicU64,
    pub errors: AtomicU64,
    pub probes: AtomicU64,
    pub probe_hits: AtomicU64,
}

struct Queue {
    work: VecDeque<Work>,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    capacity: usize,
    counters: SaverCounters,
    /// Threads holding work taken off the queue.
    busy: AtomicUsize,
}

/// The write-behind queue and its threads. Dropping it stops the threads after the work
/// already queued (bounded by the capacity), waiting at most `drop_timeout` for them: a
/// thread still inside a hung tier call then is left to finish on its own.
pub(crate) struct Saver {
    shared: Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
    drop_timeout: std::time::Duration,
}

impl std::fmt::Debug for Saver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saver")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

/// Chunks one `put` carries at most.
const BATCH: usize = 32;

impl Saver {
    pub(crate) fn start(
        tier: Arc<dyn Tier>,
        codec: ChunkCodec,
        index: Arc<KeyIndex>,
        own: Arc<KeyIndex>,
        capacity: usize,
        threads: usize,
        drop_timeout: std::time::Duration,
    ) -> std::io::Result<Saver> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                work: VecDeque::new(),
                stop: false,
            }),
            ready: Condvar::new(),
            capacity: capacity.max(1),
            counters: SaverCounters::default(),
            busy: AtomicUsize::new(0),
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let (s, t, c, ix, own) = (
                Arc::clone(&shared),
                Arc::clone(&tier),
                codec.clone(),
                Arc::clone(&index),
                Arc::clone(&own),
            );
            let h = thread::Builder::new()
                .name(format!("kvsched-saver-{i}"))
                .spawn(move || run(&s, t.as_ref(), &c, &ix, &own));
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    stop(&shared);
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Saver {
            shared,
            threads: handles,
            drop_timeout,
        })
    }

    /// Queues `work` unless the queue is full (then it is dropped and counted): never blocks
    /// longer than one short lock.
    pub(crate) fn offer(&self, work: Work) -> bool {
        let mut q = self.shared.queue.lock();
        if q.stop || q.work.len() >= self.shared.capacity {
            drop(q);
            self.shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.work.push_back(work);
        drop(q);
        self.shared.ready.notify_one();
        true
    }

    /// Work waiting.
    pub(crate) fn queued(&self) -> usize {
        self.shared.queue.lock().work.len()
    }

    pub(crate) fn counters(&self) -> &SaverCounters {
        &self.shared.counters
    }

    /// Waits until the queue is empty and no thread holds work (tests and tools that want
    /// every offered chunk stored before they look).
    pub(crate) fn flush(&self) {
        loop {
            let q = self.shared.queue.lock();
            // Acquire: pairs with the Release decrement in `run` after a batch is stored.
            // (Planted bug `saver-flush-early`, scripts/plants.sh: a batch a thread has taken
            // but not stored yet is not waited for.)
            let idle =
                planted!("saver-flush-early") || self.shared.busy.load(Ordering::Acquire) == 0;
            if q.work.is_empty() && idle {
                return;
            }
            drop(q);
            thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

fn stop(shared: &Shared) {
    shared.queue.lock().stop = true;
    shared.ready.notify_all();
}

impl Drop for Saver {
    fn drop(&mut self) {
        stop(&self.shared);
        let deadline = std::time::Instant::now() + self.drop_timeout;
        let mut left = 0;
        for h in self.threads.drain(..) {
            while !h.is_finished() && std::time::Instant::now() < deadline {
                thread::sleep(std::time::Duration::from_millis(1));
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                // Detached: it ends when its tier call returns (the queue is stopped).
                left += 1;
            }
        }
        if left > 0 {
            tracing::warn!(
                threads = left,
                "tier connector dropped with save threads still in a tier call"
            );
        }
    }
}

fn run(shared: &Shared, tier: &dyn Tier, codec: &ChunkCodec, index: &KeyIndex, own: &KeyIndex) {
    let never = CancelToken::new();
    loop {
        let mut saves = Vec::new();
        let mut probe = None;
        {
            let mut q = shared.queue.lock();
            while q.work.is_empty() && !q.stop {
                q = shared.ready.wait(q);
            }
            if q.work.is_empty() {
                return; // stopped and drained
            }
            // Relaxed: taken under the queue lock, which `flush` holds while it reads.
            shared.busy.fetch_add(1, Ordering::Relaxed);
            while let Some(w) = q.work.pop_front() {
                match w {
                    Work::Save { .. } => {
                        saves.push(w);
                        if saves.len() == BATCH {
                            break;
                        }
                    }
                    Work::Probe(keys) => {
                        probe = Some(keys);
                        break;
                    }
                }
            }
        }
        let c = &shared.counters;
        if !saves.is_empty() {
            let chunks: Vec<(ChunkKey, Vec<u8>)> = saves
                .into_iter()
                .filter_map(|w| match w {
                    Work::Save {
                        key,
                        group,
                        tokens,
                        payload,
                    } => Some((key, codec.encode(key, group, tokens, &payload))),
                    Work::Probe(_) => None,
                })
                .collect();
            let bytes: u64 = chunks.iter().map(|(_, v)| v.len() as u64).sum();
            match tier.put(&chunks) {
                Ok(()) => {
                    c.saved_chunks
                        .fetch_add(chunks.len() as u64, Ordering::Relaxed);
                    c.saved_bytes.fetch_add(bytes, Ordering::Relaxed);
                    for (k, _) in &chunks {
                        index.insert(*k);
                        own.insert(*k);
                    }
                }
                Err(_) => {
                    c.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if let Some(keys) = probe {
            c.probes.fetch_add(1, Ordering::Relaxed);
            if let Ok(held) = tier.exists(&keys, &never) {
                for (k, h) in keys.iter().zip(held) {
                    if h {
                        c.probe_hits.fetch_add(1, Ordering::Relaxed);
                        index.insert(*k);
                    }
                }
            }
        }
        // Release: pairs with the Acquire load in `flush`, so a flush that sees 0 sees the
        // batch stored and indexed.
        shared.busy.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use crate::kv::TierError;
    use crate::sync::AtomicBool;

    /// A tier whose `put` waits until the test opens the gate, then records that it stored.
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        started: AtomicBool,
        stored: AtomicBool,
    }

    impl Tier for Gate {
        fn name(&self) -> &str {
            "gate"
        }
        fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
            Ok(vec![false; keys.len()])
        }
        fn get(
            &self,
            keys: &[ChunkKey],
            _: &CancelToken,
        ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
            Ok(vec![None; keys.len()])
        }
        fn put(&self, _: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
            self.started.store(true, Ordering::SeqCst);
            while !*self.open.lock() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.stored.store(true, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn flush_waits_for_a_batch_a_thread_has_taken() {
        let gate = Arc::new(Gate::default());
        let tier: Arc<dyn Tier> = gate.clone();
        let ix = Arc::new(KeyIndex::new(64));
        let saver = Saver::start(
            tier,
            ChunkCodec::new(None),
            ix.clone(),
            ix,
            8,
            1,
            std::time::Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(saver.offer(Work::Save {
            key: ChunkKey(1),
            group: 0,
            tokens: 16,
            payload: vec![1; 8],
        }));
        // The thread has taken the batch: the queue is empty, the put is in progress.
        while !gate.started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let opener = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(30));
                *gate.open.lock() = true;
            })
        };
        saver.flush();
        assert!(
            gate.stored.load(Ordering::SeqCst),
            "flush returned before the taken batch was stored"
        );
        let _ = opener.join();
    }
}
