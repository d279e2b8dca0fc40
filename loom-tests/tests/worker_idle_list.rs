//! **Race: a dispatch against a worker going idle** (the real `WorkerPool`: `dispatch` pushes
//! the job, then pops an idle worker's index and unparks it; `worker_loop`, finding no job,
//! lists itself — its `listed` flag swapped false → true before its index goes on the idle
//! queue, sized to the workers — re-checks the jobs and parks untimed).
//!
//! * `dispatch_races_worker_going_idle`: one worker; the engine dispatches a job while the
//!   worker starts and goes idle, waits for its completion, dispatches a second while the
//!   worker goes idle again (still listed or not), waits, and shuts the pool down.
//! * `two_workers_dispatch_one_at_a_time`: two workers; the engine dispatches a job, waits for
//!   its completion, and dispatches another, each while either worker may be listed, going
//!   idle or still busy.
//!
//! No lost wake-up: every dispatched job is run (the engine parks untimed until its
//! completion, so a job nobody runs leaves every thread asleep: loom reports the deadlock).
//! Each worker is on the idle list at most once: the pool's debug assertions check that no
//! listing overflows the queue and that every popped listing is its worker's only one.
//!
//! Catches: a worker that parks without re-checking the jobs after listing itself (plant
//! `worker-no-recheck`: a dispatch whose pop came before the listing wakes nobody — deadlock),
//! the SeqCst fences left out of the pairing (plant `worker-no-fence`: the worker's re-check
//! misses the job while the dispatch's pop misses the listing — deadlock), a worker that lists
//! itself while still listed (plant `worker-list-twice`: the idle queue overflows or holds its
//! index twice).
//!
//! The fences are checked because the shim's queue models, like crossbeam's queues, see an
//! empty queue without taking a lock (a lock there would order the re-check after the
//! dispatch by itself); loom models their SeqCst length word, as every SeqCst access, no
//! stronger than acquire/release, so only the fences order a listing against a dispatch —
//! as the pool's argument has it, relying on no more than crossbeam promises. loom models a
//! SeqCst fence as a join with every earlier one, which gives exactly the fence–fence rule
//! this pairing needs: no false positive with the fences, a lost wake-up without them.

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
            e.pool.counts().loads.load(kvsched::sync::Ordering::Relaxed),
            2
        );
        let (applied, stale, left) = e.shutdown();
        assert_eq!((applied, stale, left), (vec![], vec![], vec![]));
        assert_eq!(first[0].key.seq() + second[0].key.seq(), 3);
    });
}

#[test]
fn two_workers_dispatch_one_at_a_time() {
    model(|| {
        let e = Engine::start(2, 2);
        for seq in 1..=2 {
            e.dispatch(seq, 0);
            let got = e.drain_until(1);
            assert_eq!(got.iter().map(|c| c.key.seq()).collect::<Vec<_>>(), [seq]);
        }
        let (applied, stale, left) = e.shutdown();
        assert_eq!((applied, stale, left), (vec![], vec![], vec![]));
    });
}
