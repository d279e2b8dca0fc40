//! **Race: joining a group of threads against their ends** (the real
//! `sync::thread_group::ThreadGroup`, which the write-behind's and the prober's threads are
//! spawned into and joined through at a connector's drop).
//!
//! * `join_is_woken_by_the_last_end`: two threads, each writing a block; the join parks
//!   until both have ended — each end marks itself under the group's lock and wakes it.
//!
//! The join always returns (a joiner left parked after both threads ended is a deadlock
//! loom reports), leaves no thread behind without a deadline, and sees both writes.
//!
//! Catches: an end that does not wake the join (plant `thread-end-unwoken`: deadlock); a
//! join that stops waiting before every thread has ended (one left behind).

#![cfg(kvsched_loom)]

use kvsched::sync::thread_group::ThreadGroup;
use kvsched::sync::Arc;
use kvsched_loom_tests::{model, BlockContents};

#[test]
fn join_is_woken_by_the_last_end() {
    model(|| {
        let blocks = Arc::new([BlockContents::new(0), BlockContents::new(0)]);
        let mut group = ThreadGroup::new();
        for i in 0..2 {
            let b = Arc::clone(&blocks);
            group.spawn(format!("t{i}"), move || b[i].write(1)).unwrap();
        }
        assert_eq!(group.join_until(None), 0, "a thread was left behind");
        assert_eq!(blocks[0].read(), 1);
        assert_eq!(blocks[1].read(), 1);
    });
}
