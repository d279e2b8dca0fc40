//! The workers' waits, woken by their events: a worker parked on a full completion queue wakes
//! at the pop that makes room, and a shutdown wakes as its workers exit (or wait for room).
//! Each test also counts the waits, which a wait that polled would repeat many times.

use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use super::claim::RequestKey;
use super::completion_queue::CompletionQueue;
use super::worker::{Completion, WorkerPool};
use crate::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult, NoConnector};
use crate::sync::{thread, Arc, AtomicBool, Ordering};

/// Generous: a wait woken by its event ends in microseconds, one that lost its wake-up only
/// at the 10 s bounds below.
const PROMPTLY: Duration = Duration::from_secs(2);

fn completion() -> Completion {
    Completion {
        key: RequestKey::from_raw(0),
        attempt: 0,
        result: LoadResult::Ok,
        panicked: false,
        started_at: Instant::now(),
        finished_at: Instant::now(),
    }
}

fn job() -> LoadJob {
    LoadJob::new("r", &[], 0, 0, Vec::new(), Vec::new())
}

/// Whether `f` holds within 10 s (checked every millisecond).
fn within_10s(f: impl Fn() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while !f() {
        if Instant::now() >= until {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
    true
}

fn pool(queue: &Arc<CompletionQueue>, connector: StdArc<dyn KvConnector>) -> WorkerPool {
    WorkerPool::start(1, vec![Arc::clone(queue)], connector, StdArc::new(|| {})).unwrap()
}

/// A pool of one worker whose load's completion found its queue (of one, already holding
/// one) full: returned once the worker has been refused at least once.
fn worker_on_full_queue() -> (Arc<CompletionQueue>, WorkerPool) {
    let q = Arc::new(CompletionQueue::new(1));
    q.push(completion()).unwrap();
    let pool = pool(&q, StdArc::new(NoConnector));
    pool.dispatch(job());
    let counts = pool.counts();
    assert!(within_10s(|| counts
        .queue_full_retries
        .load(Ordering::Relaxed)
        > 0));
    (q, pool)
}

/// A worker finding its queue full spins, then parks until a pop makes room: it retries a
/// few times, not once per pause while the queue stays full, and the pop wakes it at once.
#[test]
fn a_worker_waiting_for_room_wakes_at_the_pop() {
    let (q, pool) = worker_on_full_queue();
    let counts = pool.counts();
    // Time for the worker to fall asleep: one that slept a pause at a time would retry again
    // and again.
    thread::sleep(Duration::from_millis(200));
    let retries = counts.queue_full_retries.load(Ordering::Relaxed);
    let popped = Instant::now();
    assert!(q.pop().is_some());
    // Acquire: pairs with the Release increment after the worker's push.
    assert!(
        within_10s(|| counts.delivered.load(Ordering::Acquire) == 1),
        "the pop woke nobody"
    );
    assert!(popped.elapsed() < PROMPTLY, "{:?}", popped.elapsed());
    assert!(
        retries < 40,
        "the worker retried {retries} times while the queue stayed full"
    );
    let (left, finished) = pool.shutdown(|| while q.pop().is_some() {}, Duration::from_secs(10));
    assert!(left.is_empty() && finished);
}

/// A connector whose loads end when the test lets them.
struct Held(StdArc<AtomicBool>);

impl KvConnector for Held {
    fn lookup(&self, _: LookupQuery<'_>) -> LookupResult {
        LookupResult::default()
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        while !self.0.load(Ordering::Acquire) {
            thread::sleep(Duration::from_millis(1));
        }
        LoadResult::Ok
    }
}

/// A shutdown waiting for a load in flight sleeps until its worker exits: it drains once or
/// twice, not once per pause, and returns as soon as the worker is gone.
#[test]
fn a_shutdown_wakes_when_its_workers_exit() {
    let release = StdArc::new(AtomicBool::new(false));
    let q = Arc::new(CompletionQueue::new(4));
    let pool = pool(&q, StdArc::new(Held(StdArc::clone(&release))));
    pool.dispatch(job());
    assert!(within_10s(|| pool.queued() == 0), "no worker took the job");
    let r = StdArc::clone(&release);
    let releaser = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        r.store(true, Ordering::Release);
    });
    let t = Instant::now();
    let mut drains = 0;
    let mut got = 0;
    let (left, finished) = pool.shutdown(
        || {
            drains += 1;
            while q.pop().is_some() {
                got += 1;
            }
        },
        Duration::from_secs(10),
    );
    let took = t.elapsed();
    releaser.join().unwrap();
    assert!(left.is_empty() && finished);
    assert_eq!(got, 1, "the load's completion");
    assert!(took < PROMPTLY, "the worker's exit woke nobody: {took:?}");
    assert!(
        drains <= 4,
        "the shutdown drained {drains} times while the load ran"
    );
}

/// A shutdown drains for a worker parked on a full queue: the worker delivers and exits, and
/// the shutdown ends long before its deadline.
#[test]
fn a_shutdown_drains_for_a_worker_waiting_for_room() {
    let (q, pool) = worker_on_full_queue();
    thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let mut got = 0;
    let (left, finished) = pool.shutdown(
        || {
            while q.pop().is_some() {
                got += 1;
            }
        },
        Duration::from_secs(10),
    );
    assert!(left.is_empty() && finished);
    assert_eq!(got, 2, "the earlier completion and the worker's");
    assert!(t.elapsed() < PROMPTLY, "{:?}", t.elapsed());
}
