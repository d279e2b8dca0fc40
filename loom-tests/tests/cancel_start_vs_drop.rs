//! **Race: a worker starting a queued load while its shard stops waiting for it**
//! (`CancelToken::start` / `CancelToken::drop_unstarted` on the token's state word).
//!
//! * `exactly_one_side_wins`: a worker takes a queued job and starts it; meanwhile the shard's
//!   deadline passes (or the request ends) and it drops the job if no worker has started it.
//!   Exactly one of the two must win: the shard frees the destinations only if the job will
//!   never run, and a job that runs was never dropped. Whatever the interleaving, the token
//!   ends cancelled (a started load is told to stop).
//! * `a_second_drop_agrees`: dropping twice (deadline, then the request's end) gives the same
//!   answer as the first drop, racing the start.
//!
//! Catches: a drop that checks the started bit and then sets its own with a separate store
//! (plant `drop-check-then-set`: both sides win, so the shard frees blocks a worker writes).

#![cfg(kvsched_loom)]

use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::worker::{model_drop_unstarted, model_job, model_start};
use kvsched::sync::{thread, Arc};
use kvsched_loom_tests::model;

#[test]
fn exactly_one_side_wins() {
    model(|| {
        let job = Arc::new(model_job(0, RequestKey::from_raw(1), 1));
        let worker = {
            let job = Arc::clone(&job);
            thread::spawn(move || model_start(&job))
        };
        let dropped = model_drop_unstarted(&job);
        let started = worker.join().expect("worker");
        assert!(
            started != dropped,
            "started {started}, dropped {dropped}: exactly one side must win"
        );
        assert!(job.cancel.is_cancelled());
    });
}

#[test]
fn a_second_drop_agrees() {
    model(|| {
        let job = Arc::new(model_job(0, RequestKey::from_raw(1), 1));
        let worker = {
            let job = Arc::clone(&job);
            thread::spawn(move || model_start(&job))
        };
        let first = model_drop_unstarted(&job);
        let second = model_drop_unstarted(&job);
        let started = worker.join().expect("worker");
        assert_eq!(first, second);
        assert!(started != first);
    });
}
