//! Tier gets bounded by the load's deadline: a store that never answers costs a load its
//! deadline, never the calling thread.
//!
//! A `Tier::get` is a call into code the connector does not control (a socket, a disk, a
//! wrapper): it may never return. When a load has a deadline, [`BoundedGets`] runs the get on
//! one of its own threads and the caller sleeps until the answer comes, the deadline passes
//! or the load's token fires (whose firing wakes it: [`CancelToken::watch`]), then gives up:
//! the load fails for all its blocks, and the get's own cancel token fires, so a tier that
//! looks at it (as the Redis tier does, every 20 ms) returns and frees its thread rather than
//! finishing a read nobody waits for. The answer of a get that comes back late is dropped
//! unread, and the bytes of a load are written into KV memory only by the caller after the
//! answer came in time, so a late get never writes anything.
//!
//! # Limits
//!
//! Threads start on demand: a get that finds more gets queued than threads free starts one
//! more, up to `threads`, so slow or hung gets do not hold up the others until that many are
//! stuck. A get that never returns keeps its thread for good: at most `threads` can hang at
//! once. Once every thread hangs, later gets wait in the queue and fail at their deadline; a
//! caller that gives up takes its get out of the queue, so the queue holds only gets whose
//! callers still wait. Busy threads are counted ([`BoundedGets::busy`]) and a hung one is
//! left behind when the connector is dropped.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::tier_call::guarded;
use super::{ChunkKey, Tier, TierError};
use crate::connector::CancelToken;
use crate::sync::condvar::Condvar;
use crate::sync::park::{Parker, Unparker};
use crate::sync::thread_group::ThreadGroup;
use crate::sync::{Arc, AtomicBool, AtomicUsize, Mutex, Ordering};

/// The buffers of a get, filled, and which keys were held.
pub(crate) type Filled = (Vec<Vec<u8>>, Vec<bool>);
type Answer = Result<Filled, TierError>;

/// One get handed to a thread (with the buffers it reads into), and where its answer goes.
struct Call {
    keys: Vec<ChunkKey>,
    bufs: Vec<Vec<u8>>,
    /// The get's own token, which the tier is given: fired when its caller gives up (the
    /// deadline passed, or the load's token fired).
    cancel: CancelToken,
    slot: Arc<Slot>,
}

/// The answer of one call; `gave_up` once its caller stopped waiting.
struct Slot {
    answer: Mutex<Option<Answer>>,
    /// Wakes the caller once the answer is in.
    ready: Unparker,
    gave_up: AtomicBool,
}

impl Slot {
    fn new(ready: Unparker) -> Slot {
        Slot {
            answer: Mutex::new(None),
            ready,
            gave_up: AtomicBool::new(false),
        }
    }
}

struct Shared {
    tier: Arc<dyn Tier>,
    queue: Mutex<VecDeque<Call>>,
    wake: Condvar,
    stop: AtomicBool,
    /// Threads inside a `get` now.
    busy: AtomicUsize,
}

/// Threads running tier gets whose callers wait only until a deadline.
pub(crate) struct BoundedGets {
    shared: Arc<Shared>,
    threads: Mutex<ThreadGroup>,
    /// Most threads to start.
    cap: usize,
}

/// How long a drop waits for the get threads at most (one inside a get that never returns
/// is left behind).
pub(crate) const JOIN_WAIT: Duration = Duration::from_millis(200);

impl BoundedGets {
    /// Up to `threads` threads (at least 1) calling `tier`; one starts now, the others when
    /// gets queue up behind busy ones.
    pub(crate) fn start(tier: Arc<dyn Tier>, threads: usize) -> std::io::Result<BoundedGets> {
        let shared = Arc::new(Shared {
            tier,
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
        });
        let gets = BoundedGets {
            shared,
            threads: Mutex::new(ThreadGroup::new()),
            cap: threads.max(1),
        };
        gets.spawn()?;
        Ok(gets)
    }

    /// Starts one more thread.
    fn spawn(&self) -> std::io::Result<()> {
        let mut threads = self.threads.lock();
        let s = Arc::clone(&self.shared);
        let name = format!("kvsched-tier-get-{}", threads.threads());
        threads.spawn(name, move || run(&s))
    }

    /// Starts a thread if the gets queued (`queued`, counted as the caller's went in) are more
    /// than the threads not busy, and fewer than the cap run (a failed start leaves the get
    /// queued for the threads there are).
    fn grow(&self, queued: usize) {
        let running = self.threads.lock().threads();
        // Relaxed: a thread that took a get before the caller's push counted itself busy
        // under the queue's lock, which the caller took after it; one finishing meanwhile
        // only means one thread more than needed.
        let busy = self.shared.busy.load(Ordering::Relaxed);
        // (Planted bug `gets-grow-on-busy-alone`, scripts/plants.sh: the queue is not
        // counted, so two gets queued before the one thread takes the first leave the second
        // behind it.)
        let short = if planted!("gets-grow-on-busy-alone") {
            busy >= running
        } else {
            busy.saturating_add(queued) > running
        };
        if running < self.cap && short {
            let _ = self.spawn();
        }
    }

    /// The tier's answer to `get_into(keys, bufs)` (the buffers back, filled), or
    /// [`TierError::Timeout`] once `deadline` passes (or [`TierError::Cancelled`] once
    /// `cancel` fires) without one; the buffers then stay with the call.
    pub(crate) fn get_into(
        &self,
        keys: &[ChunkKey],
        bufs: Vec<Vec<u8>>,
        cancel: &CancelToken,
        deadline: Instant,
    ) -> Answer {
        let parker = Parker::new();
        let slot = Arc::new(Slot::new(parker.unparker()));
        let call_cancel = CancelToken::new();
        let queued = {
            let mut q = self.shared.queue.lock();
            q.push_back(Call {
                keys: keys.to_vec(),
                bufs,
                cancel: call_cancel.clone(),
                slot: Arc::clone(&slot),
            });
            q.len()
        };
        self.shared.wake.notify_one();
        self.grow(queued);
        let started = Instant::now();
        // The load's token wakes this thread as it fires; so does the answer (`run`).
        let _watch = cancel.watch(parker.unparker());
        loop {
            let mut answer = slot.answer.lock();
            if let Some(a) = answer.take() {
                return a;
            }
            let now = Instant::now();
            let gave_up = if now >= deadline {
                Some(TierError::Timeout(now.saturating_duration_since(started)))
            } else if cancel.is_cancelled() {
                Some(TierError::Cancelled)
            } else {
                None
            };
            if let Some(e) = gave_up {
                // Release: pairs with the Acquire load in `run`: a thread that sees it skips
                // the call or drops its answer.
                slot.gave_up.store(true, Ordering::Release);
                // Planted bug `gave-up-get-uncancelled` (scripts/plants.sh): the tier is not
                // told, so a get nobody waits for keeps its thread until it ends.
                if !planted!("gave-up-get-uncancelled") {
                    call_cancel.cancel();
                }
                drop(answer);
                // A call no thread took yet leaves the queue now: with every thread hung,
                // the queue holds only the calls whose callers still wait.
                self.shared
                    .queue
                    .lock()
                    .retain(|c| !Arc::ptr_eq(&c.slot, &slot));
                return Err(e);
            }
            drop(answer);
            crate::sync::park::count_wait();
            // Woken by the answer or the token (an unpark before the park makes it return at
            // once), or at the deadline.
            parker.park_timeout(deadline.saturating_duration_since(now));
        }
    }

    /// Threads inside a get now (hung ones among them).
    pub(crate) fn busy(&self) -> usize {
        self.shared.busy.load(Ordering::Relaxed)
    }

    /// Stops the threads without waiting for them: what a connector's drop does to all its
    /// threads first, so that they wind down together.
    pub(crate) fn stop(&self) {
        shutdown(&self.shared);
    }

    /// Waits for the threads until `deadline`, after [`stop`](Self::stop), woken as each one
    /// ends ([`ThreadGroup::join_until`]); one inside a get that never returns is left behind
    /// (detached). Once it has run, dropping waits for nothing.
    pub(crate) fn join_until(&mut self, deadline: Instant) {
        self.threads.get_mut().join_until(Some(deadline));
    }
}

impl Drop for BoundedGets {
    fn drop(&mut self) {
        shutdown(&self.shared);
        self.join_until(Instant::now() + JOIN_WAIT);
    }
}

fn shutdown(s: &Shared) {
    // Release: pairs with the Acquire load in `run`.
    s.stop.store(true, Ordering::Release);
    let _guard = s.queue.lock();
    s.wake.notify_all();
}

fn run(s: &Shared) {
    loop {
        let call = {
            let mut q = s.queue.lock();
            loop {
                // Acquire: pairs with the Release store in `shutdown`.
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(c) = q.pop_front() {
                    // Counted busy before the queue's lock goes: a caller that queues a get
                    // after this pop (it takes the lock after us) sees this thread busy in
                    // `grow` and starts another, instead of leaving its get behind this one.
                    // Relaxed: the queue's lock orders it before that caller's read.
                    s.busy.fetch_add(1, Ordering::Relaxed);
                    break c;
                }
                q = s.wake.wait(q);
            }
        };
        // Acquire: pairs with the Release store in `get`: a caller gone never gets its call run.
        if call.slot.gave_up.load(Ordering::Acquire) {
            s.busy.fetch_sub(1, Ordering::Relaxed);
            continue;
        }
        let Call {
            keys,
            mut bufs,
            cancel,
            slot,
        } = call;
        let mut held = vec![false; keys.len()];
        let answer = guarded("get", || {
            s.tier.get_into(&keys, &cancel, &mut bufs, &mut held)
        })
        .map(|()| (bufs, held));
        s.busy.fetch_sub(1, Ordering::Relaxed);
        *slot.answer.lock() = Some(answer);
        slot.ready.unpark();
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use crate::sync::thread;

    /// A store whose gets never return until the test lets them.
    struct Hung(Arc<AtomicBool>);

    impl Tier for Hung {
        fn name(&self) -> &str {
            "hung"
        }
        fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
            Ok(vec![false; keys.len()])
        }
        fn get(
            &self,
            keys: &[ChunkKey],
            _: &CancelToken,
        ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
            while !self.0.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(1));
            }
            Ok(vec![None; keys.len()])
        }
        fn put(&self, _: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
            Ok(())
        }
    }

    /// Two gets queued before the one thread wakes to take the first: one thread cannot serve
    /// both while the first hangs, so the second starts another (under the cap). Counting
    /// busy threads alone, none is busy yet, and the second get would wait behind the first.
    #[test]
    fn gets_queued_past_the_idle_threads_start_another() {
        let release = Arc::new(AtomicBool::new(false));
        let gets = BoundedGets::start(Arc::new(Hung(Arc::clone(&release))), 4).unwrap();
        let call = || Call {
            keys: vec![ChunkKey(1)],
            bufs: vec![Vec::new()],
            cancel: CancelToken::new(),
            slot: Arc::new(Slot::new(Parker::new().unparker())),
        };
        // Queued without a wake-up: the thread sleeps on as both wait.
        let queued = {
            let mut q = gets.shared.queue.lock();
            q.push_back(call());
            q.push_back(call());
            q.len()
        };
        gets.grow(queued);
        assert_eq!(
            gets.threads.lock().threads(),
            2,
            "no thread started for the second get"
        );
        gets.shared.wake.notify_all();
        release.store(true, Ordering::Release);
    }

    #[test]
    fn gets_given_up_behind_a_hung_store_do_not_pile_up() {
        let release = Arc::new(AtomicBool::new(false));
        let gets = BoundedGets::start(Arc::new(Hung(Arc::clone(&release))), 2).unwrap();
        let never = CancelToken::new();
        let soon = || Instant::now() + Duration::from_millis(1);
        for _ in 0..500 {
            let bufs = (0..4).map(|_| Vec::with_capacity(1 << 12)).collect();
            let got = gets.get_into(&[ChunkKey(1); 4], bufs, &never, soon());
            assert!(matches!(got, Err(TierError::Timeout(_))));
        }
        assert!(gets.busy() >= 1, "the store hangs its threads");
        assert_eq!(
            gets.shared.queue.lock().len(),
            0,
            "no given-up get stays queued"
        );
        release.store(true, Ordering::Release);
    }

    /// A store whose gets return only when their token fires (or after `forever`).
    struct Cooperative;

    impl Tier for Cooperative {
        fn name(&self) -> &str {
            "cooperative"
        }
        fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
            Ok(vec![false; keys.len()])
        }
        fn get(
            &self,
            _: &[ChunkKey],
            cancel: &CancelToken,
        ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
            let forever = Instant::now() + Duration::from_secs(30);
            while !cancel.is_cancelled() && Instant::now() < forever {
                thread::sleep(Duration::from_millis(1));
            }
            Err(TierError::Cancelled)
        }
        fn put(&self, _: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
            Ok(())
        }
    }

    /// A get whose caller gave up (its deadline, or its load's token) is cancelled: a tier
    /// that looks at its token frees the thread at once, not when its own read would end.
    #[test]
    fn a_get_given_up_is_cancelled_and_frees_its_thread() {
        let gets = BoundedGets::start(Arc::new(Cooperative), 2).unwrap();
        let never = CancelToken::new();
        for _ in 0..2 {
            let bufs = vec![Vec::new()];
            let deadline = Instant::now() + Duration::from_millis(10);
            let got = gets.get_into(&[ChunkKey(1)], bufs, &never, deadline);
            assert!(matches!(got, Err(TierError::Timeout(_))));
        }
        let load = CancelToken::new();
        load.cancel();
        let got = gets.get_into(
            &[ChunkKey(1)],
            vec![Vec::new()],
            &load,
            Instant::now() + Duration::from_secs(60),
        );
        assert!(matches!(got, Err(TierError::Cancelled)));
        let until = Instant::now() + Duration::from_secs(5);
        while gets.busy() > 0 {
            assert!(
                Instant::now() < until,
                "{} gets still hold their threads",
                gets.busy()
            );
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Hangs one get in the store: the caller's deadline is far off and nothing answers.
    fn one_get_hung(gets: &BoundedGets) {
        gets.shared.queue.lock().push_back(Call {
            keys: vec![ChunkKey(1)],
            bufs: vec![Vec::new()],
            cancel: CancelToken::new(),
            slot: Arc::new(Slot::new(Parker::new().unparker())),
        });
        gets.shared.wake.notify_all();
        while gets.busy() == 0 {
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// A load's token fired while its caller waits for a hung get wakes the caller at once:
    /// it goes to sleep once (not once per poll) and returns long before its deadline. A
    /// cancel that wakes nobody leaves it asleep until the deadline, 10 s on.
    #[test]
    fn a_cancel_wakes_the_caller_waiting_for_its_get() {
        let release = Arc::new(AtomicBool::new(false));
        let gets = Arc::new(BoundedGets::start(Arc::new(Hung(Arc::clone(&release))), 1).unwrap());
        let load = CancelToken::new();
        let (g, l) = (Arc::clone(&gets), load.clone());
        let caller = thread::spawn(move || {
            let t = Instant::now();
            let bufs = vec![Vec::new()];
            let got = g.get_into(&[ChunkKey(1)], bufs, &l, t + Duration::from_secs(10));
            (got, t.elapsed(), crate::sync::park::waits())
        });
        while gets.busy() == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        // Time for the caller to fall asleep: one that polled would wake again and again.
        thread::sleep(Duration::from_millis(100));
        load.cancel();
        let (got, took, waits) = caller.join().unwrap();
        release.store(true, Ordering::Release);
        assert!(matches!(got, Err(TierError::Cancelled)), "{got:?}");
        assert!(
            took < Duration::from_secs(2),
            "the cancel woke nobody: {took:?}"
        );
        assert!(
            waits <= 2,
            "the caller woke {waits} times before its cancel"
        );
    }

    /// A join wakes when the threads end: it sleeps once while a get hangs, not once per
    /// poll, and returns as soon as the last thread is gone, long before its deadline.
    #[test]
    fn a_join_wakes_when_the_threads_end() {
        use crate::sync::thread_group::test_support::voluntary_switches;
        let release = Arc::new(AtomicBool::new(false));
        let mut gets = BoundedGets::start(Arc::new(Hung(Arc::clone(&release))), 1).unwrap();
        one_get_hung(&gets);
        gets.stop();
        let r = Arc::clone(&release);
        let releaser = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            r.store(true, Ordering::Release);
        });
        let t = Instant::now();
        let before = voluntary_switches();
        gets.join_until(t + Duration::from_secs(10));
        let (took, after) = (t.elapsed(), voluntary_switches());
        releaser.join().unwrap();
        assert!(
            took < Duration::from_secs(2),
            "the thread's end woke nobody: {took:?}"
        );
        if let (Some(b), Some(a)) = (before, after) {
            // A join that slept 1 ms at a time would block about 100 times here.
            assert!(
                a - b < 20,
                "the join blocked {} times before the thread ended: it polls",
                a - b
            );
        }
        assert_eq!(gets.busy(), 0);
    }
}
