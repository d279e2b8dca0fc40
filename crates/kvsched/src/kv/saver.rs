//! [`Saver`]: the connector's write-behind: a bounded queue of chunks to store, drained by
//! its own threads, so a step never waits for a tier. Saves that keep
//! failing (a full or read-only disk, a store that is down) make it pause saving
//! ([`SaveBackoff`]) instead of trying every chunk against the same error.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::buffers::Buffers;
use super::drain::{Backlog, Drain, Held};
use super::key_index::KeyIndex;
use super::save_duty::Duty;
use super::tier_call::guarded;
use super::{ChunkCodec, ChunkKey, Tier};
use crate::connector::CancelToken;
use crate::sync::condvar::Condvar;
use crate::sync::thread_group::ThreadGroup;
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// One unit of background work.
pub(crate) enum Work {
    /// Store this block's bytes under `key`: `chunk` is a buffer of the saver's
    /// [`Buffers`] holding [`ChunkCodec::payload_offset`] bytes of room, then the payload
    /// (sealed in place on a saver thread, given back after the put).
    Save {
        key: ChunkKey,
        group: u32,
        tokens: u32,
        chunk: Vec<u8>,
    },
}

/// When the write-behind of a [`TierConnector`](super::TierConnector) stops trying: after
/// `after_failed_batches` tier puts in a row failed, it pauses saving for `pause`, then tries
/// the next batch; each further failure right after a pause doubles the pause, up to
/// `max_pause`; a batch stored resets both. A load the tier answers in the meantime shows it
/// back: the pause then ends at most `pause` from then (so a store that is up again gets
/// its saves back within `pause`, and one that answers reads but keeps refusing writes costs
/// at most a failed batch every `pause`). Chunks taken off the queue while paused are not
/// tried, only counted ([`TierCounts::saves_skipped`](super::TierCounts::saves_skipped)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveBackoff {
    /// Failed puts in a row that start a pause; 0 never pauses.
    pub after_failed_batches: u32,
    /// The first pause.
    pub pause: Duration,
    /// The longest pause.
    pub max_pause: Duration,
}

impl Default for SaveBackoff {
    /// After 3 failed puts in a row, 1 s, doubling up to 60 s.
    fn default() -> Self {
        SaveBackoff {
            after_failed_batches: 3,
            pause: Duration::from_secs(1),
            max_pause: Duration::from_secs(60),
        }
    }
}

/// How a [`Saver`] runs (from the connector's configuration).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SaverSettings {
    /// Most work waiting.
    pub capacity: usize,
    /// Threads.
    pub threads: usize,
    /// How long dropping waits for the threads.
    pub drop_timeout: Duration,
    /// When failing saves pause saving.
    pub backoff: SaveBackoff,
    /// The encoded size of the largest chunk (what its reused buffers are made for).
    pub chunk_bytes: usize,
    /// The share of its time each save thread may spend storing (0–1]: see [`Duty`].
    pub cpu_share: f64,
    /// Most chunks one `put` carries (at least 1).
    pub batch: usize,
}

/// Counters of the write-behind.
#[derive(Debug, Default)]
pub(crate) struct SaverCounts {
    pub saved_chunks: AtomicU64,
    pub saved_bytes: AtomicU64,
    pub dropped: AtomicU64,
    /// Failed puts (batches).
    pub errors: AtomicU64,
    /// Chunks of failed puts that the tier does not hold.
    pub failed_chunks: AtomicU64,
    /// Chunks not tried during a pause.
    pub skipped: AtomicU64,
    /// Pauses started.
    pub pauses: AtomicU64,
    /// The last put's error, for reports.
    pub last_error: Mutex<Option<String>>,
}

/// The pause state of [`SaveBackoff`].
#[derive(Debug, Default)]
struct Pause {
    /// Failed puts in a row.
    failed_in_row: u32,
    /// The pause the next one lasts.
    next: Option<Duration>,
    /// Saving resumes then.
    until: Option<Instant>,
    /// Whether the first pause was logged (later ones are not).
    warned: bool,
}

pub(super) struct Queue {
    work: VecDeque<Work>,
    pub(super) stop: bool,
    /// Batches threads hold, taken off the queue.
    held: Held,
}

impl Backlog for Queue {
    fn nothing_queued(&self) -> bool {
        self.work.is_empty()
    }
    fn held(&mut self) -> &mut Held {
        &mut self.held
    }
}

pub(super) struct Shared {
    queue: Mutex<Queue>,
    /// Where threads wait for work: each offer wakes one of them.
    pub(super) ready: Condvar,
    /// Where threads rest their CPU share: only a stop wakes them (an offer that woke a
    /// resting thread would go unserved while another waited for work).
    pub(super) rest: Condvar,
    /// Where flushes wait: woken when the last batch's end finds the queue empty, or when
    /// dropping the queued work leaves no batch held.
    drain: Drain,
    capacity: usize,
    counters: SaverCounts,
    backoff: SaveBackoff,
    pause: Mutex<Pause>,
    /// Whether a pause has started since the last stored batch: spares a load that the tier
    /// answered the pause's lock when saving is not paused.
    pausing: AtomicBool,
    /// The chunk buffers saves are copied into and sealed in, reused.
    buffers: Buffers,
    cpu_share: f64,
    /// Most chunks one `put` carries.
    batch: usize,
}

/// The write-behind queue and its threads. Dropping it stops the threads: the work still
/// queued is dropped (and counted), a batch a thread holds is finished, and the drop waits at
/// most `drop_timeout` for that — a thread still inside a hung tier call then is left to
/// finish on its own. Flush first to have everything offered stored.
pub(crate) struct Saver {
    shared: Arc<Shared>,
    threads: ThreadGroup,
    drop_timeout: std::time::Duration,
}

impl std::fmt::Debug for Saver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saver")
            .field("threads", &self.threads.threads())
            .finish_non_exhaustive()
    }
}

impl Saver {
    pub(crate) fn start(
        tier: Arc<dyn Tier>,
        codec: ChunkCodec,
        index: Arc<KeyIndex>,
        own: Arc<KeyIndex>,
        settings: SaverSettings,
    ) -> std::io::Result<Saver> {
        let SaverSettings {
            capacity,
            threads,
            drop_timeout,
            backoff,
            chunk_bytes,
            cpu_share,
            batch,
        } = settings;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                work: VecDeque::new(),
                stop: false,
                held: Held::default(),
            }),
            ready: Condvar::new(),
            rest: Condvar::new(),
            drain: Drain::new(),
            capacity: capacity.max(1),
            counters: SaverCounts::default(),
            backoff,
            pause: Mutex::new(Pause::default()),
            pausing: AtomicBool::new(false),
            buffers: Buffers::new(chunk_bytes),
            cpu_share,
            batch: batch.max(1),
        });
        let mut group = ThreadGroup::new();
        for i in 0..threads.max(1) {
            let (s, t, c, ix, own) = (
                Arc::clone(&shared),
                Arc::clone(&tier),
                codec.clone(),
                Arc::clone(&index),
                Arc::clone(&own),
            );
            let spawned = group.spawn(format!("kvsched-saver-{i}"), move || {
                run(&s, t.as_ref(), &c, &ix, &own);
            });
            if let Err(e) = spawned {
                stop(&shared);
                group.join_until(None);
                return Err(e);
            }
        }
        Ok(Saver {
            shared,
            threads: group,
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
            let Work::Save { chunk, .. } = work;
            self.shared.buffers.give([chunk]);
            return false;
        }
        q.work.push_back(work);
        drop(q);
        self.shared.ready.notify_one();
        true
    }

    /// The tier answered a load in time: a save pause ends soon ([`SaveBackoff`]).
    pub(crate) fn tier_answered(&self) {
        self.shared.tier_answered();
    }

    /// The reused chunk buffers: a save takes one, fills it (room, then payload) and offers
    /// it; the saver gives it back after the put.
    pub(crate) fn buffers(&self) -> &Buffers {
        &self.shared.buffers
    }

    /// Work waiting.
    pub(crate) fn queued(&self) -> usize {
        self.shared.queue.lock().work.len()
    }

    pub(crate) fn counts(&self) -> &SaverCounts {
        &self.shared.counters
    }

    /// Whether an offer now would be dropped (a hint, read under the queue's lock): a save
    /// that would be dropped is counted ([`note_dropped`](Self::note_dropped)) without its
    /// bytes being copied first.
    pub(crate) fn full(&self) -> bool {
        let q = self.shared.queue.lock();
        q.stop || q.work.len() >= self.shared.capacity
    }

    /// Counts an offer dropped before it was made (see [`full`](Self::full)).
    pub(crate) fn note_dropped(&self) {
        self.shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits until the queue is empty and no thread holds work (tests and tools that want
    /// every offered chunk stored before they look).
    pub(crate) fn flush(&self) {
        self.flush_until(None);
    }

    /// As [`flush`](Self::flush), but waits at most until `deadline` (`None`: for good);
    /// whether everything offered was stored (or dropped) by then. It parks until the thread
    /// that ends the last batch finds the queue empty, or until the queued work is dropped
    /// (`drop_queued`, a stop) with no batch held ([`Drain`]).
    pub(crate) fn flush_until(&self, deadline: Option<Instant>) -> bool {
        let q = self.shared.queue.lock();
        self.shared.drain.flush_until(q, deadline)
    }

    /// Drops the work still queued, counted in `dropped`, and returns how many saves that
    /// was; a batch a thread holds is finished, and later offers are queued as before.
    pub(crate) fn drop_queued(&self) -> u64 {
        let left = {
            let mut q = self.shared.queue.lock();
            let left = std::mem::take(&mut q.work);
            // A flush waiting for the dropped saves is done if no thread holds a batch (else
            // the thread ending it wakes the flush).
            self.shared.drain.dropped(&mut *q);
            left
        };
        self.shared.dropped(left)
    }

    /// Stops the threads without waiting for them (see [`stop`]): what a connector's drop
    /// does to all its threads first, so that they wind down together.
    pub(crate) fn stop(&self) {
        stop(&self.shared);
    }

    /// Waits for the threads until `deadline` (`None`: for good), after [`stop`](Self::stop),
    /// parked until the last of them ends and wakes it ([`ThreadGroup`]); a thread still inside
    /// a tier call then is detached, to end when that call returns (the queue is stopped).
    /// Whether every thread ended. Once it has run, dropping waits for nothing.
    pub(crate) fn join_until(&mut self, deadline: Option<Instant>) -> bool {
        let left = self.threads.join_until(deadline);
        if left > 0 {
            tracing::warn!(
                threads = left,
                "tier connector dropped with save threads still in a tier call"
            );
        }
        left == 0
    }
}

/// Stops the threads: the work still queued is dropped (saves counted in `dropped`), a batch
/// a thread holds is finished. Whoever wants every offered save stored flushes first.
fn stop(shared: &Shared) {
    let left = {
        let mut q = shared.queue.lock();
        q.stop = true;
        let left = std::mem::take(&mut q.work);
        shared.drain.dropped(&mut *q);
        left
    };
    shared.ready.notify_all();
    shared.rest.notify_all();
    shared.dropped(left);
}

impl Drop for Saver {
    fn drop(&mut self) {
        stop(&self.shared);
        let deadline = Instant::now().checked_add(self.drop_timeout);
        self.join_until(deadline);
    }
}

impl Shared {
    /// Counts the saves of `left`, taken off the queue unstored, as dropped and gives their
    /// buffers back; how many they were.
    fn dropped(&self, left: VecDeque<Work>) -> u64 {
        let saves = left.len() as u64;
        // Planted bug `queued-drop-uncounted` (scripts/plants.sh): the saves dropped off the
        // queue are not counted, so the counts read after them miss saves offered.
        if !planted!("queued-drop-uncounted") {
            self.counters.dropped.fetch_add(saves, Ordering::Relaxed);
        }
        self.buffers.give(left.into_iter().map(|w| {
            let Work::Save { chunk, .. } = w;
            chunk
        }));
        saves
    }

    /// Whether saving is paused now.
    fn paused(&self) -> bool {
        self.pause.lock().until.is_some_and(|t| Instant::now() < t)
    }

    /// Counts a put that failed with `error`; starts a pause when the failures in a row
    /// reach the backoff's threshold.
    fn put_failed(&self, error: String) {
        let b = self.backoff;
        let mut p = self.pause.lock();
        p.failed_in_row = p.failed_in_row.saturating_add(1);
        if b.after_failed_batches == 0 || p.failed_in_row < b.after_failed_batches {
            drop(p);
            *self.counters.last_error.lock() = Some(error);
            return;
        }
        let pause = p.next.unwrap_or(b.pause).min(b.max_pause);
        p.next = Some(pause.saturating_mul(2).min(b.max_pause));
        p.until = Some(Instant::now() + pause);
        // Relaxed: a hint read by `tier_answered`, which takes the lock before acting on it.
        self.pausing.store(true, Ordering::Relaxed);
        let first = !std::mem::replace(&mut p.warned, true);
        drop(p);
        self.counters.pauses.fetch_add(1, Ordering::Relaxed);
        if first {
            tracing::warn!(
                failed_in_row = b.after_failed_batches,
                pause_ms = pause.as_millis() as u64,
                max_pause_ms = b.max_pause.as_millis() as u64,
                %error,
                "tier connector: saves keep failing; not saving for a while (the pause doubles while they go on failing)"
            );
        }
        *self.counters.last_error.lock() = Some(error);
    }

    /// A put succeeded: the failures in a row and the pause start over.
    fn put_ok(&self) {
        let mut p = self.pause.lock();
        p.failed_in_row = 0;
        p.next = None;
        p.until = None;
        // Relaxed: see `put_failed`.
        self.pausing.store(false, Ordering::Relaxed);
    }

    /// The tier answered a load: a pause ends at most the backoff's first pause from now.
    fn tier_answered(&self) {
        // Relaxed: a hint (see `put_failed`); a pause it misses is shortened by a later load.
        if !self.pausing.load(Ordering::Relaxed) || planted!("save-pause-outlasts-outage") {
            return;
        }
        let mut p = self.pause.lock();
        if let (Some(until), Some(soon)) = (p.until, Instant::now().checked_add(self.backoff.pause))
        {
            if until > soon {
                p.until = Some(soon);
            }
        }
    }
}

/// Stores `chunks` in one put and indexes them. After a failed put, asks the tier which of
/// them it holds (a put may store part of a batch: the disk tier stops at its first error):
/// those are saved, the others counted as failed.
fn store(
    shared: &Shared,
    tier: &dyn Tier,
    chunks: &[(ChunkKey, Vec<u8>)],
    index: &KeyIndex,
    own: &KeyIndex,
    never: &CancelToken,
) {
    let c = &shared.counters;
    let saved = |k: ChunkKey, len: usize| {
        c.saved_chunks.fetch_add(1, Ordering::Relaxed);
        c.saved_bytes.fetch_add(len as u64, Ordering::Relaxed);
        index.insert(k);
    };
    // Ours before the put: once it is in the tier the prober may find it and a load take it,
    // and a chunk this connector stored is never another writer's (a failed put's chunks the
    // tier does not hold are taken back below).
    for (k, _) in chunks {
        own.insert(*k);
    }
    match guarded("put", || tier.put(chunks)) {
        Ok(()) => {
            shared.put_ok();
            for (k, v) in chunks {
                saved(*k, v.len());
            }
        }
        Err(e) => {
            c.errors.fetch_add(1, Ordering::Relaxed);
            let keys: Vec<ChunkKey> = chunks.iter().map(|(k, _)| *k).collect();
            let held = match guarded("exists", || tier.exists(&keys, never)) {
                Ok(h) if h.len() == keys.len() => h,
                _ => vec![false; keys.len()],
            };
            for ((k, v), h) in chunks.iter().zip(held) {
                if h {
                    saved(*k, v.len());
                } else {
                    own.remove(*k);
                    c.failed_chunks.fetch_add(1, Ordering::Relaxed);
                }
            }
            shared.put_failed(e.to_string());
        }
    }
}

fn run(shared: &Shared, tier: &dyn Tier, codec: &ChunkCodec, index: &KeyIndex, own: &KeyIndex) {
    let never = CancelToken::new();
    let mut duty = Duty::new(shared.cpu_share);
    loop {
        let mut saves = Vec::new();
        {
            let mut q = shared.queue.lock();
            while q.work.is_empty() && !q.stop {
                q = shared.ready.wait(q);
            }
            if q.work.is_empty() {
                return; // stopped and drained
            }
            shared.drain.take(&mut *q);
            while saves.len() < shared.batch {
                let Some(w) = q.work.pop_front() else { break };
                saves.push(w);
            }
        }
        let c = &shared.counters;
        if !saves.is_empty() {
            let mut chunks: Vec<(ChunkKey, Vec<u8>)> = Vec::with_capacity(saves.len());
            for w in saves {
                let Work::Save {
                    key,
                    group,
                    tokens,
                    mut chunk,
                } = w;
                // The connector always leaves the room; a chunk without it is not stored.
                if codec.seal(&mut chunk, key, group, tokens).is_ok() {
                    chunks.push((key, chunk));
                } else {
                    c.failed_chunks.fetch_add(1, Ordering::Relaxed);
                }
            }
            if shared.paused() {
                c.skipped.fetch_add(chunks.len() as u64, Ordering::Relaxed);
            } else {
                let started = Instant::now();
                store(shared, tier, &chunks, index, own, &never);
                duty.worked(started.elapsed());
            }
            shared.buffers.give(chunks.into_iter().map(|(_, b)| b));
        }
        let mut q = shared.queue.lock();
        // The batch is stored and indexed: a flush waiting under this lock sees it done. Then
        // the thread rests what it owes, not counted busy: a flush does not wait for its rest.
        // (Planted bug `saver-flush-waits-rest`, scripts/plants.sh: it rests first.)
        if planted!("saver-flush-waits-rest") {
            q = duty.rest(q, shared);
        }
        // Wakes a flush if this was the last batch and nothing is queued.
        shared.drain.end(&mut *q);
        drop(duty.rest(q, shared));
    }
}

#[cfg(all(test, not(kvsched_loom)))]
#[path = "saver_tests.rs"]
mod tests;
