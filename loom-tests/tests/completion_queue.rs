//! **Race: the completion hand-off worker → shard** (the sync shim's bounded `ArrayQueue`, the
//! workers' push-retry loop of `worker.rs`, a shard draining at every step).
//!
//! * `one_worker_full_queue`: a worker delivers two completions into a queue of capacity 1,
//!   so its second push can find the queue full and retry, while the shard drains step after
//!   step; the shard applies both, in order.
//! * `two_workers_full_queue`: two workers deliver one completion each into a queue of
//!   capacity 1: the second push finds it full and retries (at most one producer spins at a
//!   time, which keeps loom's exploration finite).
//! * `default_capacity`: two workers, the runtime's default capacity (2 under loom).
//! * `full_queue_makes_the_producer_retry`: the retry path in every schedule.
//!
//! Every completion is applied exactly once (no loss, no duplicate, each attempt matches its
//! request), and a full queue makes the producer retry instead of dropping.
//!
//! Catches: a producer that drops a completion on a full queue, a push or pop that loses or
//! duplicates an item under contention, a drain loop that stops early.

#![cfg(kvsched_loom)]

use std::time::Instant;

use kvsched::connector::LoadResult;
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::worker::Completion;
use kvsched::sync::{
    spin_hint, thread, Arc, ArrayQueue, AtomicU64, Ordering, DEFAULT_COMPLETION_QUEUE_CAPACITY,
};
use kvsched_loom_tests::model;

fn completion(seq: u64, attempt: u32) -> Completion {
    Completion {
        key: RequestKey::new(false, 0, seq),
        attempt,
        result: LoadResult::Ok,
        panicked: false,
        finished_at: Instant::now(),
    }
}

/// A worker's delivery, as in `worker.rs`: push, and on a full queue take the completion back,
/// count the retry, back off and push again — never drop it.
fn deliver(q: &ArrayQueue<Completion>, retries: &AtomicU64, mut c: Completion) {
    loop {
        match q.push(c) {
            Ok(()) => return,
            Err(back) => {
                c = back;
                retries.fetch_add(1, Ordering::Relaxed);
                spin_hint();
            }
        }
    }
}

/// Runs `workers` threads each delivering `per_worker` completions (request `w + 1`, attempts
/// `0..per_worker`) to a queue of `cap`, while this thread drains it step by step.
fn run(cap: usize, workers: u64, per_worker: u32) -> u64 {
    let q = Arc::new(ArrayQueue::new(cap));
    let retries = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..workers)
        .map(|w| {
            let (q, retries) = (Arc::clone(&q), Arc::clone(&retries));
            thread::spawn(move || {
                for attempt in 0..per_worker {
                    deliver(&q, &retries, completion(w + 1, attempt));
                }
            })
        })
        .collect();
    // The shard: each step drains whatever is queued; a completion is applied once, and only
    // if it answers the request's next attempt (per-worker FIFO).
    let total = workers * u64::from(per_worker);
    let mut next_attempt = vec![0u32; workers as usize];
    let mut applied = 0u64;
    while applied < total {
        while let Some(c) = q.pop() {
            let w = (c.key.seq() - 1) as usize;
            assert_eq!(
                c.attempt, next_attempt[w],
                "lost, duplicate or reordered completion"
            );
            next_attempt[w] += 1;
            applied += 1;
        }
        if applied < total {
            spin_hint();
        }
    }
    for h in hs {
        h.join().unwrap();
    }
    assert!(q.is_empty(), "a completion was delivered twice");
    assert!(next_attempt.iter().all(|&n| n == per_worker));
    retries.load(Ordering::Relaxed)
}

#[test]
fn one_worker_full_queue() {
    model(|| {
        run(1, 1, 2);
    });
}

#[test]
fn two_workers_full_queue() {
    model(|| {
        run(1, 2, 1);
    });
}

#[test]
fn default_capacity() {
    model(|| {
        assert_eq!(
            DEFAULT_COMPLETION_QUEUE_CAPACITY, 2,
            "loom builds shrink the queue"
        );
        run(DEFAULT_COMPLETION_QUEUE_CAPACITY, 2, 1);
    });
}

/// The retry path in every schedule: the queue (capacity 1) is full when the producer
/// starts, the shard drains only once the producer has retried, and nothing is lost.
#[test]
fn full_queue_makes_the_producer_retry() {
    model(|| {
        let q = Arc::new(ArrayQueue::new(1));
        let retries = Arc::new(AtomicU64::new(0));
        deliver(&q, &retries, completion(1, 0));
        let (q2, r2) = (Arc::clone(&q), Arc::clone(&retries));
        let h = thread::spawn(move || deliver(&q2, &r2, completion(1, 1)));
        // Let the producer find the queue full at least once before draining.
        while retries.load(Ordering::Relaxed) == 0 {
            spin_hint();
        }
        assert_eq!(q.pop().map(|c| c.attempt), Some(0));
        h.join().unwrap();
        assert_eq!(q.pop().map(|c| c.attempt), Some(1));
        assert!(q.pop().is_none());
    });
}
