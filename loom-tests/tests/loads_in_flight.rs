//! `Runtime::loads_in_flight` (loads sent − `delivered`) reaching 0 promises a lockstep
//! engine that every completion is in its shard's queue. Drives the real `WorkerPool`: the
//! engine waits until the job counts as delivered, then the queue must hold its completion.
//! Plants `delivered-before-push` (counted before the push) and `delivered-relaxed`.
#![cfg(kvsched_loom)]

use kvsched::sync::Ordering;
use kvsched_loom_tests::{model, Engine};

#[test]
fn delivered_means_queued() {
    model(|| {
        let e = Engine::start(1, 2);
        e.dispatch(1, 0);
        loop {
            let before = e.events();
            // Acquire, as `loads_in_flight`.
            if e.pool.counts().delivered.load(Ordering::Acquire) >= 1 {
                break;
            }
            e.wait_for_work(before);
        }
        assert!(
            e.queue.pop().is_some(),
            "loads_in_flight said 0 but the completion is not in its queue"
        );
        let _ = e.shutdown();
    });
}
