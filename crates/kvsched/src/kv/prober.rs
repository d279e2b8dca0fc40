//! [`Prober`]: the connector's background existence checks. A lookup (or a
//! [`TierConnector::prefetch`](super::TierConnector::prefetch)) that meets keys its local
//! index does not know hands them here instead of asking the tier itself, so the step never
//! waits for the store; the prober's own thread asks the tier in batches and puts the keys it
//! holds into the index, where the next lookup of that prefix finds them. That is how one
//! engine comes to load the chunks another engine sharing the store saved.
//!
//! # Guarantees
//!
//! * **Never in the caller's way.** [`Prober::offer`] takes one short lock; a full queue drops
//!   the offer (counted in `dropped`).
//! * **Bounded work.** Each run of a prompt's keys is probed from its first unknown key, at
//!   most [`MAX_RUN`] keys of it; each tier call carries at most [`BATCH_KEYS`] keys. A run
//!   whose first key was asked within `miss_ttl` is not asked again (counted in `skipped`):
//!   many requests sharing a prefix cost one probe, and a key found absent is asked again
//!   only once `miss_ttl` has passed — by then another engine may have saved it.
//! * **Own queue, own thread.** Probes never wait behind the write-behind's saves.
//! * **A lookup makes no system call.** After its last probe the thread stays awake for
//!   [`LINGER`] (a timed wait), collecting what lookups offer meanwhile into its next tier
//!   call; only once it sleeps for good does an offer wake it. A `prefetch`'s offer, whose
//!   caller waits for the answer, always wakes it.
//!
//! # Limits
//!
//! A probe answers after the lookup that asked: that lookup misses, a later one of the same
//! prefix hits. An engine that wants the answer for the request itself calls `prefetch` when
//! the request arrives and submits it once the [`Prefetch`] is ready (or a bound passed).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};

use super::drain::{Backlog, Drain, Held};
use super::key_index::KeyIndex;
use super::tier_call::guarded;
use super::{ChunkKey, Tier};
use crate::connector::CancelToken;
use crate::sync::condvar::Condvar;
use crate::sync::thread_group::ThreadGroup;
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// Keys of one run probed at most (a prompt of 16,384 tokens of 16-token blocks).
pub(crate) const MAX_RUN: usize = 1024;
/// Keys one tier call carries at most.
const BATCH_KEYS: usize = 2048;
/// Keys waiting at most; offers past it are dropped.
const QUEUE_KEYS: usize = 32 * 1024;
/// Runs remembered as recently asked at most (the map is cleared past it).
const ASKED_CAPACITY: usize = 1 << 16;
/// How long the thread waits for more work after a probe before it sleeps until woken: the
/// most a lookup's probe waits to be asked meanwhile.
pub(crate) const LINGER: Duration = Duration::from_millis(1);

/// Whether the probes of one [`prefetch`](super::TierConnector::prefetch) are answered (the
/// default: nothing to wait for).
#[derive(Clone, Debug, Default)]
pub struct Prefetch {
    done: Option<Arc<AtomicBool>>,
}

impl Prefetch {
    /// Whether the tier's answer is in the connector's index (or there was nothing to ask,
    /// or the probe was dropped): a lookup now sees what the tier held when it was asked.
    pub fn is_ready(&self) -> bool {
        // Acquire: pairs with the Release store after the probe's hits are indexed.
        self.done.as_ref().is_none_or(|d| d.load(Ordering::Acquire))
    }
}

/// Counters of the prober.
#[derive(Debug, Default)]
pub(crate) struct ProbeCounts {
    /// Tier calls made.
    pub probes: AtomicU64,
    /// Keys asked, and found.
    pub keys: AtomicU64,
    pub hits: AtomicU64,
    /// Runs not asked: asked within `miss_ttl` already.
    pub skipped: AtomicU64,
    /// Runs dropped on a full queue.
    pub dropped: AtomicU64,
}

struct Job {
    runs: Vec<Vec<ChunkKey>>,
    done: Option<Arc<AtomicBool>>,
}

struct Queue {
    jobs: VecDeque<Job>,
    keys: usize,
    /// The probe the thread holds (at most one).
    held: Held,
    stop: bool,
    /// The thread waits untimed: an offer must wake it.
    asleep: bool,
}

impl Backlog for Queue {
    fn nothing_queued(&self) -> bool {
        self.jobs.is_empty()
    }
    fn held(&mut self) -> &mut Held {
        &mut self.held
    }
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Where flushes wait: woken, under the queue's lock, when the thread ends a probe and
    /// finds nothing queued, and when a stop drops what is queued.
    drain: Drain,
    /// The first key of each run asked recently, and when.
    asked: Mutex<FxHashMap<u128, Instant>>,
    miss_ttl: Duration,
    counts: ProbeCounts,
}

/// The probe queue and its thread; dropping it stops the thread (work still queued is
/// dropped; a tier call in progress is waited for at most `drop_timeout`).
pub(crate) struct Prober {
    shared: Arc<Shared>,
    thread: ThreadGroup,
    drop_timeout: Duration,
}

impl Prober {
    pub(crate) fn start(
        tier: Arc<dyn Tier>,
        index: Arc<KeyIndex>,
        miss_ttl: Duration,
        drop_timeout: Duration,
    ) -> std::io::Result<Prober> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                keys: 0,
                held: Held::default(),
                stop: false,
                asleep: false,
            }),
            ready: Condvar::new(),
            drain: Drain::new(),
            asked: Mutex::new(FxHashMap::default()),
            miss_ttl,
            counts: ProbeCounts::default(),
        });
        let s = Arc::clone(&shared);
        let mut thread = ThreadGroup::new();
        thread.spawn("kvsched-prober".to_owned(), move || {
            run(&s, tier.as_ref(), &index);
        })?;
        Ok(Prober {
            shared,
            thread,
            drop_timeout,
        })
    }

    pub(crate) fn counts(&self) -> &ProbeCounts {
        &self.shared.counts
    }

    /// Queues the runs (each a prompt's keys of one group, from its first key the index does
    /// not know), each cut to [`MAX_RUN`] keys, but those whose first key was asked within
    /// `miss_ttl`. With `want_answer`, the [`Prefetch`] turns ready once they are answered,
    /// and the thread is woken at once; without, only if it sleeps untimed (a lingering
    /// thread takes them within [`LINGER`]).
    pub(crate) fn offer(&self, runs: Vec<Vec<ChunkKey>>, want_answer: bool) -> Prefetch {
        let now = Instant::now();
        let mut fresh = Vec::with_capacity(runs.len());
        {
            let mut asked = self.shared.asked.lock();
            for mut run in runs {
                let Some(first) = run.first() else { continue };
                let recent = asked
                    .get(&first.0)
                    .is_some_and(|&t| now.saturating_duration_since(t) < self.shared.miss_ttl);
                if recent {
                    self.shared.counts.skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if asked.len() >= ASKED_CAPACITY {
                    asked.clear();
                }
                asked.insert(first.0, now);
                run.truncate(MAX_RUN);
                fresh.push(run);
            }
        }
        if fresh.is_empty() {
            return Prefetch::default();
        }
        let n: usize = fresh.iter().map(Vec::len).sum();
        let done = want_answer.then(|| Arc::new(AtomicBool::new(false)));
        let mut q = self.shared.queue.lock();
        if q.stop || q.keys + n > QUEUE_KEYS {
            drop(q);
            let mut asked = self.shared.asked.lock();
            for run in &fresh {
                asked.remove(&run[0].0);
            }
            self.shared
                .counts
                .dropped
                .fetch_add(fresh.len() as u64, Ordering::Relaxed);
            return Prefetch::default();
        }
        q.keys += n;
        q.jobs.push_back(Job {
            runs: fresh,
            done: done.clone(),
        });
        // Planted bug (scripts/plants.sh): an offer never wakes the thread, so one that
        // finds it asleep waits for the next offer that wants an answer.
        let wake = (want_answer || q.asleep) && !planted!("probe-offer-never-wakes");
        drop(q);
        if wake {
            self.shared.ready.notify_one();
        }
        Prefetch { done }
    }

    /// Waits until nothing is queued or being asked, or `deadline` passed: whether so. It
    /// parks until the thread ending its probe finds nothing queued, or until the thread's
    /// stop drops what is ([`Drain`]).
    pub(crate) fn flush_until(&self, deadline: Option<Instant>) -> bool {
        let q = self.shared.queue.lock();
        self.shared.drain.flush_until(q, deadline)
    }

    /// Stops the thread without waiting for it (work still queued is dropped): what a
    /// connector's drop does to all its threads first, so that they wind down together.
    pub(crate) fn stop(&self) {
        self.shared.queue.lock().stop = true;
        self.shared.ready.notify_all();
    }

    /// Waits for the thread until `deadline` (`None`: for good), after [`stop`](Self::stop),
    /// parked until the thread ends and wakes it ([`ThreadGroup`]); one still inside a tier
    /// call then is detached, to end when that call returns (the queue is stopped). Whether
    /// it ended. Once it has run, dropping waits for nothing.
    pub(crate) fn join_until(&mut self, deadline: Option<Instant>) -> bool {
        self.thread.join_until(deadline) == 0
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop();
        self.join_until(Instant::now().checked_add(self.drop_timeout));
    }
}

fn run(shared: &Shared, tier: &dyn Tier, index: &KeyIndex) {
    let never = CancelToken::new();
    loop {
        let mut jobs = Vec::new();
        {
            let mut q = shared.queue.lock();
            // After a probe, wait up to LINGER for more (offers do not wake a lingering
            // thread), then untimed, flagged so that the next offer wakes it.
            let mut linger_until = Some(Instant::now() + LINGER);
            while q.jobs.is_empty() && !q.stop {
                match linger_until {
                    Some(until) if Instant::now() < until => {
                        q = shared.ready.wait_until(q, Some(until)).0;
                    }
                    _ => {
                        linger_until = None;
                        q.asleep = true;
                        q = shared.ready.wait(q);
                        q.asleep = false;
                    }
                }
            }
            if q.stop {
                // The dropped jobs' prefetches turn ready before a flush is woken (under the
                // lock it returns through), so a flush that returns sees them ready: the order
                // loom-tests/tests/flush_drain.rs models.
                for j in std::mem::take(&mut q.jobs) {
                    finish(&j);
                }
                shared.drain.dropped(&mut *q);
                return;
            }
            let mut keys = 0;
            while let Some(j) = q.jobs.front() {
                let n: usize = j.runs.iter().map(Vec::len).sum();
                if !jobs.is_empty() && keys + n > BATCH_KEYS {
                    break;
                }
                keys += n;
                q.keys -= n;
                jobs.extend(q.jobs.pop_front());
            }
            shared.drain.take(&mut *q);
        }
        probe(shared, tier, index, &jobs, &never);
        for j in &jobs {
            finish(j);
        }
        // Wakes a flush if nothing is queued.
        shared.drain.end(&mut *shared.queue.lock());
    }
}

/// Asks the tier for every key of `jobs` in one call (duplicates once) and indexes those it
/// holds. A failed call indexes nothing: the runs are asked again after `miss_ttl`.
fn probe(shared: &Shared, tier: &dyn Tier, index: &KeyIndex, jobs: &[Job], never: &CancelToken) {
    let mut keys: Vec<ChunkKey> = jobs
        .iter()
        .flat_map(|j| j.runs.iter().flatten().copied())
        .collect();
    keys.sort_unstable_by_key(|k| k.0);
    keys.dedup();
    let c = &shared.counts;
    c.probes.fetch_add(1, Ordering::Relaxed);
    c.keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
    let Ok(held) = guarded("exists", || tier.exists(&keys, never)) else {
        return;
    };
    let mut found = FxHashSet::default();
    for (k, h) in keys.iter().zip(held) {
        // (Planted bug `probe-hits-unindexed`, scripts/plants.sh: what a probe finds never
        // reaches the index, so another engine's chunks are never offered.)
        if h && !planted!("probe-hits-unindexed") {
            index.insert(*k);
            found.insert(k.0);
        }
    }
    c.hits.fetch_add(found.len() as u64, Ordering::Relaxed);
    // The lookup after this one starts its run at each run's first absent key: it counts as
    // asked now, so that lookup does not ask again within `miss_ttl`.
    let now = Instant::now();
    let mut asked = shared.asked.lock();
    for run in jobs.iter().flat_map(|j| &j.runs) {
        if let Some(k) = run.iter().find(|k| !found.contains(&k.0)) {
            asked.insert(k.0, now);
        }
    }
}

fn finish(j: &Job) {
    if let Some(d) = &j.done {
        // Release: pairs with the Acquire load in `Prefetch::is_ready`.
        d.store(true, Ordering::Release);
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use crate::kv::TierError;

    /// A tier whose `exists` answers `delay` after it is asked.
    struct Slow {
        delay: Duration,
        started: AtomicBool,
    }

    impl Slow {
        fn new(delay: Duration) -> Arc<Slow> {
            Arc::new(Slow {
                delay,
                started: AtomicBool::new(false),
            })
        }
    }

    impl Tier for Slow {
        fn name(&self) -> &str {
            "slow"
        }
        fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
            self.started.store(true, Ordering::SeqCst);
            std::thread::sleep(self.delay);
            Ok(vec![true; keys.len()])
        }
        fn get(
            &self,
            keys: &[ChunkKey],
            _: &CancelToken,
        ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
            Ok(vec![None; keys.len()])
        }
        fn put(&self, _: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
            Ok(())
        }
    }

    /// A flush parks until the thread ending its last probe wakes it: it returns when the
    /// tier answers, not at its deadline.
    #[test]
    fn a_flush_is_woken_when_the_last_probe_is_answered() {
        let index = Arc::new(KeyIndex::new(64));
        let prober = Prober::start(
            Slow::new(Duration::from_millis(30)),
            Arc::clone(&index),
            Duration::from_secs(60),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let ready = prober.offer(vec![vec![ChunkKey(1), ChunkKey(2)]], true);
        let started = Instant::now();
        assert!(prober.flush_until(Some(started + Duration::from_secs(30))));
        let waited = started.elapsed();
        assert!(ready.is_ready());
        assert!(index.contains(ChunkKey(2)), "the probe's hits are indexed");
        assert!(
            waited < Duration::from_secs(15),
            "the flush waited out its deadline ({waited:?}): nothing woke it"
        );
    }

    /// Joining the thread parks until it ends: it returns when the probe it waited for is
    /// answered, without waking in the meantime (no polling) and without waiting out its
    /// deadline (no lost wake-up).
    #[test]
    fn joining_is_woken_when_the_thread_ends() {
        use crate::sync::thread_group::test_support::voluntary_switches;
        let tier = Slow::new(Duration::from_millis(500));
        let mut prober = Prober::start(
            tier.clone(),
            Arc::new(KeyIndex::new(64)),
            Duration::from_secs(60),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let ready = prober.offer(vec![vec![ChunkKey(1)]], true);
        while !tier.started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        prober.stop();
        let before = voluntary_switches();
        let started = Instant::now();
        assert!(prober.join_until(Some(started + Duration::from_secs(20))));
        let waited = started.elapsed();
        let after = voluntary_switches();
        assert!(ready.is_ready(), "the probe in progress was answered");
        assert!(
            waited < Duration::from_secs(10),
            "the join waited out its deadline ({waited:?}): nothing woke it"
        );
        // A hang guard on polling, not a count to match: a 1 ms poll over the 500 ms probe
        // sleeps hundreds of times; a parked join, a few.
        if let (Some(a), Some(b)) = (before, after) {
            assert!(b - a < 50, "the join slept {} times: it polls", b - a);
        }
    }
}
