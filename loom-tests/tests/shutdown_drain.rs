//! **Race: shutdown against in-flight completions** (stop flag + drain loop of
//! `WorkerPool::shutdown` and `Runtime::shutdown`, with the sync shim's queues: jobs in a
//! `SegQueue`, completions in a bounded `ArrayQueue`).
//!
//! The engine stops the workers while they are running loads and pushing completions into a
//! shard's queue of capacity 1. As in `WorkerPool::stop_and_join` it sets `stop` (Release),
//! drains the completion queue while any worker is still running — a worker may be blocked
//! on the full queue — drains once more after the last one exits, and takes back the jobs no
//! worker started. As in `Runtime::shutdown` it pushes the drained completions back for the
//! last step (counting those that do not fit as stale) and that step applies them.
//!
//! * `one_worker_two_jobs`: one worker, two jobs queued.
//! * `two_workers_two_jobs`: two workers, one job each possible.
//!
//! Every job ends exactly once: applied, counted stale, or returned as never started; the
//! shutdown terminates (no worker left blocked on a full queue).
//!
//! Catches: a completion pushed after the last drain and lost (missing final drain), a worker
//! that keeps taking jobs after `stop`, a job both run and returned, a shutdown that waits for
//! a worker blocked on a full queue it does not drain (loom reports the livelock/deadlock).

#![cfg(kvsched_loom)]

use std::time::Instant;

use kvsched::connector::LoadResult;
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::worker::Completion;
use kvsched::sync::{
    spin_hint, thread, Arc, ArrayQueue, AtomicBool, AtomicUsize, Ordering, SegQueue,
};
use kvsched_loom_tests::model;

struct Shared {
    jobs: SegQueue<u64>,
    completions: ArrayQueue<Completion>,
    stop: AtomicBool,
    /// Workers that have exited (the model's `JoinHandle::is_finished`).
    exited: AtomicUsize,
}

/// `worker_loop`: take a job unless stopped, run it, deliver its completion (retrying while
/// the queue is full), repeat; with no job, re-check `stop` and park (the real loop parks
/// with a timeout; here only the engine's unpark wakes it, so a lost wake-up is a deadlock
/// loom reports).
fn worker_loop(s: &Shared) {
    loop {
        // Acquire: pairs with the Release store of `stop` by the engine.
        if s.stop.load(Ordering::Acquire) {
            break;
        }
        let Some(job) = s.jobs.pop() else {
            if s.jobs.is_empty() && !s.stop.load(Ordering::Acquire) {
                thread::park();
            }
            continue;
        };
        let mut c = Completion {
            key: RequestKey::new(false, 0, job),
            attempt: 1,
            result: LoadResult::Ok,
            panicked: false,
            finished_at: Instant::now(),
        };
        while let Err(back) = s.completions.push(c) {
            c = back;
            spin_hint();
        }
    }
    // Release: the engine's Acquire load of `exited` sees every push of this worker.
    s.exited.fetch_add(1, Ordering::Release);
}

fn run(workers: usize, jobs: u64) {
    let s = Arc::new(Shared {
        jobs: SegQueue::new(),
        completions: ArrayQueue::new(1),
        stop: AtomicBool::new(false),
        exited: AtomicUsize::new(0),
    });
    for j in 1..=jobs {
        s.jobs.push(j);
    }
    let hs: Vec<_> = (0..workers)
        .map(|_| {
            let s = Arc::clone(&s);
            thread::spawn(move || worker_loop(&s))
        })
        .collect();
    // WorkerPool::shutdown with Runtime::shutdown's drain closure.
    let mut parked = Vec::new();
    let mut drain = |s: &Shared| {
        while let Some(c) = s.completions.pop() {
            parked.push(c);
        }
    };
    s.stop.store(true, Ordering::Release);
    for h in &hs {
        h.thread().unpark();
    }
    while s.exited.load(Ordering::Acquire) < workers {
        drain(&s);
        thread::yield_now();
    }
    drain(&s);
    for h in hs {
        h.join().unwrap();
    }
    let mut left = Vec::new();
    while let Some(j) = s.jobs.pop() {
        left.push(j);
    }
    // Runtime::shutdown: landed completions go back to the queue for one last step; what does
    // not fit is counted stale. The last step drains and applies.
    let mut stale = Vec::new();
    for c in parked {
        if let Err(c) = s.completions.push(c) {
            stale.push(c.key.seq());
        }
    }
    let mut applied = Vec::new();
    while let Some(c) = s.completions.pop() {
        applied.push(c.key.seq());
    }
    let mut all: Vec<u64> = applied.iter().chain(&stale).chain(&left).copied().collect();
    all.sort_unstable();
    let want: Vec<u64> = (1..=jobs).collect();
    assert_eq!(
        all, want,
        "applied {applied:?} + stale {stale:?} + never started {left:?}"
    );
}

#[test]
fn one_worker_two_jobs() {
    model(|| run(1, 2));
}

#[test]
fn two_workers_two_jobs() {
    model(|| run(2, 2));
}
