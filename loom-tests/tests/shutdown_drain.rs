//! **Race: shutdown against in-flight completions** (the real `WorkerPool::shutdown` — the
//! stop flag, the unparks, the wait that drains and parks until a worker exits or waits for
//! room, the final drain and the jobs never started — with `Runtime::shutdown`'s drain closure and last
//! step, into a shard queue of capacity 1).
//!
//! The engine dispatches two jobs and shuts down at once, while the workers are starting,
//! running loads and pushing completions (one may be blocked on the full queue). The drain
//! closure parks what landed; afterwards, as in `Runtime::shutdown`, the parked completions
//! go back into the queue for one last step (what does not fit is counted stale) and that
//! step applies them.
//!
//! * `one_worker_two_jobs`: one worker, two jobs.
//! * `two_workers_two_jobs`: two workers, two jobs.
//!
//! Every job ends exactly once: applied, counted stale, or returned as never started; the
//! shutdown terminates (no worker left blocked on a full queue, none asleep past the stop).
//!
//! Catches: a shutdown that waits for a worker blocked on a full queue without draining it
//! (plant `shutdown-no-drain-while-waiting`: both threads sleep for good — loom reports the
//! deadlock), a worker left asleep through the stop (a stop without the
//! unparks: the engine waits on it forever, as checked by hand), a job both run and returned
//! or lost from the accounting.

#![cfg(kvsched_loom)]

use kvsched_loom_tests::{model, Engine};

fn run(workers: usize, jobs: u64) {
    let e = Engine::start(workers, 1);
    for seq in 1..=jobs {
        e.dispatch(seq, 0);
    }
    let (applied, stale, left) = e.shutdown();
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
