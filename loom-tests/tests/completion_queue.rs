//! **Race: the completion hand-off worker → shard** (the real `WorkerPool`: a worker runs a
//! job and pushes its `Completion` onto the shard's bounded `CompletionQueue` — the sync
//! shim's `ArrayQueue` — and, finding it full, notifies the shard, lists itself and parks
//! until a pop makes room; the shard drains it at every step and waits for work between steps
//! as `Runtime::wait_for_work` does).
//!
//! * `one_worker_full_queue`: one worker, two jobs, a queue of capacity 1: the second push can
//!   find the queue full and retry while the shard drains step after step; the shard gets
//!   both, in dispatch order.
//! * `two_workers_full_queue`: two workers, one job each possible, capacity 1: one push can
//!   find the queue full and retry (at most one producer spins at a time: with capacity 1 the
//!   other's push has succeeded, which keeps loom's exploration finite).
//! * `full_queue_makes_the_producer_retry`: the queue is full before the job is dispatched,
//!   and the shard drains only once the worker has counted a retry: the retry path in every
//!   execution.
//!
//! Every completion is applied exactly once (no loss, no duplicate, each attempt matching its
//! request), a full queue makes the producer retry instead of dropping, and shutdown finds
//! nothing left over.
//!
//! Catches: a worker that drops a completion on a full queue (plant `worker-drop-on-full`:
//! the shard waits for it forever — loom reports the deadlock), a push or pop that loses or
//! duplicates an item under contention, a full-queue retry that does not notify the shard
//! (`full_queue_makes_the_producer_retry` then never wakes: loom stops it at its branch limit,
//! as checked by hand), a pop that leaves a listed worker asleep (it then waits forever with
//! room in the queue: a deadlock).

#![cfg(kvsched_loom)]

use std::time::Instant;

use kvsched::connector::LoadResult;
use kvsched::runtime::worker::Completion;
use kvsched::sync::{Ordering, DEFAULT_COMPLETION_QUEUE_CAPACITY};
use kvsched_loom_tests::{key, model, Engine};

/// Dispatches `jobs` (request, attempt) to a pool of `workers` delivering into a queue of
/// capacity `cap`, drains until every completion arrived and shuts down; returns them in
/// arrival order.
fn run(workers: usize, cap: usize, jobs: &[(u64, u32)]) -> Vec<(u64, u32)> {
    let e = Engine::start(workers, cap);
    for &(seq, attempt) in jobs {
        e.dispatch(seq, attempt);
    }
    let got: Vec<(u64, u32)> = e
        .drain_until(jobs.len())
        .iter()
        .map(|c| (c.key.seq(), c.attempt))
        .collect();
    let (applied, stale, left) = e.shutdown();
    assert!(
        applied.is_empty() && stale.is_empty() && left.is_empty(),
        "left over after every completion was drained: {applied:?} {stale:?} {left:?}"
    );
    let mut sorted = got.clone();
    sorted.sort_unstable();
    let mut want = jobs.to_vec();
    want.sort_unstable();
    assert_eq!(sorted, want, "lost or duplicate completion");
    got
}

#[test]
fn one_worker_full_queue() {
    model(|| {
        let got = run(1, 1, &[(1, 0), (1, 1)]);
        assert_eq!(
            got,
            [(1, 0), (1, 1)],
            "one worker delivers in dispatch order"
        );
    });
}

#[test]
fn two_workers_full_queue() {
    model(|| {
        run(2, 1, &[(1, 0), (2, 0)]);
    });
}

/// The runtime's default capacity under loom. (Not a model: two workers delivering one
/// completion each into it never fill it, which `two_workers_full_queue` covers and more.)
#[test]
fn default_capacity_is_tiny_under_loom() {
    assert_eq!(
        DEFAULT_COMPLETION_QUEUE_CAPACITY, 2,
        "loom builds shrink the queue"
    );
}

/// The retry path in every execution: the queue (capacity 1) is full when the job is
/// dispatched, the shard drains only once the worker has counted a retry, and nothing is lost.
#[test]
fn full_queue_makes_the_producer_retry() {
    model(|| {
        let e = Engine::start(1, 1);
        let earlier = Completion {
            key: key(9),
            attempt: 0,
            result: LoadResult::Ok,
            panicked: false,
            started_at: Instant::now(),
            finished_at: Instant::now(),
        };
        assert!(e.queue.push(earlier).is_ok());
        e.dispatch(1, 0);
        // A retry notifies the shard (events go up), so this waits without spinning.
        loop {
            let before = e.events();
            if e.pool.counts().queue_full_retries.load(Ordering::Relaxed) > 0 {
                break;
            }
            e.wait_for_work(before);
        }
        assert_eq!(e.queue.pop().map(|c| c.key.seq()), Some(9));
        let got = e.drain_until(1);
        assert_eq!(got.iter().map(|c| c.key.seq()).collect::<Vec<_>>(), [1]);
        let (applied, stale, left) = e.shutdown();
        assert!(applied.is_empty() && stale.is_empty() && left.is_empty());
    });
}
