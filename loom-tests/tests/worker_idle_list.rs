//! **Race: a dispatch against a worker going idle** (the real `WorkerPool`: `dispatch` pushes
//! the job, then pops an idle worker's index and unparks it; `worker_loop`, finding no job,
//! lists itself — its `listed` flag swapped false → true before its index goes on the idle
//! queue, sized to the workers — re-checks the jobs and parks untimed).
//!
//! * `dispatch_races_worker_going_idle`: one worker; the engine dispatches a job while the
//!   worker starts and goes idle, waits for its completion, dispatches a second while the
//!   worker goes idle again (still listed or not), waits, and shuts the pool down.
//! * `two_workers_two_dispatches`: two workers, two jobs dispatched back to back; the engine
//!   waits for both completions.
//!
//! No lost wake-up: every dispatched job is run (the engine parks untimed until its
//! completion, so a job nobody runs leaves every thread asleep: loom reports the deadlock).
//! Each worker is on the idle list at most once: the pool's debug assertions check that no
//! listing overflows the queue and that every popped listing is its worker's only one.
//!
//! Catches: a worker that parks without re-checking the jobs after listing itself (plant
//! `worker-no-recheck`: a dispatch whose pop came before the listing wakes nobody — deadlock),
//! a worker that lists itself while still listed (plant `worker-list-twice`: the idle queue
//! overflows or holds its index twice).
//!
//! Not caught here: the SeqCst fences pairing the listing with the dispatch. Under loom both
//! queues are lock-based models, whose locks already order a listing against a dispatch's
//! pop; with crossbeam's lock-free queues the fences are what does (see the README).

#![cfg(kvsched_loom)]

use kvsched_loom_tests::{model, Engine};

#[test]
fn dispatch_races_worker_going_idle() {
    model(|| {
        let e = Engine::start(1, 2);
        e.dispatch(1, 0);
        let first = e.drain_until(1);
        assert_eq!(first.len(), 1);
        e.dispatch(2, 0);
        let second = e.drain_until(1);
        assert_eq!(second.len(), 1);
        assert_eq!(
            e.pool
                .counters()
                .loads
                .load(kvsched::sync::Ordering::Relaxed),
            2
        );
        let (applied, stale, left) = e.shutdown();
        assert_eq!((applied, stale, left), (vec![], vec![], vec![]));
        assert_eq!(first[0].key.seq() + second[0].key.seq(), 3);
    });
}

#[test]
fn two_workers_two_dispatches() {
    model(|| {
        let e = Engine::start(2, 2);
        e.dispatch(1, 0);
        e.dispatch(2, 0);
        let mut seqs: Vec<u64> = e.drain_until(2).iter().map(|c| c.key.seq()).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, [1, 2]);
        let (applied, stale, left) = e.shutdown();
        assert_eq!((applied, stale, left), (vec![], vec![], vec![]));
    });
}
