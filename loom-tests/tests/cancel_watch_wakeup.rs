//! **Race: a load's token firing while a thread waiting on it goes to sleep**
//! (`CancelToken::watch` and the real `Parker`: what a caller waiting for a tier get does in
//! `BoundedGets::get_into`, which parks until the answer, its deadline or the token's firing).
//!
//! * `a_cancel_wakes_its_watcher`: the watcher lists itself, checks the token and parks,
//!   untimed, until it sees the token fired; another thread fires it with `cancel`.
//! * `a_drop_wakes_its_watcher`: the same, the firing being the shard's `drop_unstarted`.
//!
//! Catches: a firing that wakes no watcher (plant `cancel-wakes-nobody`: the watcher sleeps
//! for good, and loom reports the deadlock); a firing that reads the word before the watcher
//! listed itself and so finds nobody to wake, while the watcher's check missed the firing.

#![cfg(kvsched_loom)]

use kvsched::connector::CancelToken;
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::worker::{model_drop_unstarted, model_job};
use kvsched::sync::park::Parker;
use kvsched::sync::{thread, Arc};
use kvsched_loom_tests::model;

/// Watches `token` from this thread until it fires: the wait of a caller for its tier get,
/// without the answer and the deadline (neither comes in these models).
fn sleep_until_fired(token: &CancelToken) {
    let parker = Parker::new();
    token.model_watch_while(parker.unparker(), || {
        while !token.is_cancelled() {
            parker.park();
        }
    });
}

#[test]
fn a_cancel_wakes_its_watcher() {
    model(|| {
        let token = CancelToken::new();
        let firer = {
            let token = token.clone();
            thread::spawn(move || token.cancel())
        };
        sleep_until_fired(&token);
        firer.join().expect("firer");
    });
}

#[test]
fn a_drop_wakes_its_watcher() {
    model(|| {
        let job = Arc::new(model_job(0, RequestKey::from_raw(1), 1));
        let shard = {
            let job = Arc::clone(&job);
            thread::spawn(move || model_drop_unstarted(&job))
        };
        sleep_until_fired(&job.cancel);
        assert!(shard.join().expect("shard"), "nothing started the job");
    });
}
