//! **Race: a delivered completion against the engine going to sleep** (the work signal of
//! `crates/kvsched/src/runtime/signal.rs` — an events counter and the engine's `Unparker` — on the real
//! `sync::park::Parker`; the completions travel through the sync shim's queue).
//!
//! `WorkSignal` is an `impl` on the runtime, compiled out of loom builds with it, so the
//! model restates its dozen lines ([`kvsched_loom_tests::WorkSignal`]) over the real parker:
//! a worker pushes its completion, bumps the counter (Release) and unparks the engine; the
//! engine's step reads the counter (Acquire) before draining, and `wait_for_work` parks only
//! while the counter still equals that value.
//!
//! `two_workers_deliver_while_engine_waits`: two workers each write a block, push a completion
//! and notify, while the engine steps — drain, then wait for work — until it has both. A
//! notification may land before the engine reads the counter, between its drain and its
//! park, or while it sleeps; it must always wake (loom reports a sleeper nobody wakes as a
//! deadlock), and each drained completion's block reads the worker's write.
//!
//! Catches: an unpark that signals without taking the parker's lock (plant `unpark-no-lock`:
//! the notification falls between the engine's state change and its wait), a counter read
//! after the drain instead of before (a completion pushed and notified between the drain and
//! the read is never drained: the engine sleeps with it queued — checked by hand, the model's
//! copy of the signal being the only place to plant it).

#![cfg(kvsched_loom)]

use kvsched::sync::park::Parker;
use kvsched::sync::{thread, Arc, SegQueue};
use kvsched_loom_tests::{model, BlockContents, WorkSignal};

#[test]
fn two_workers_deliver_while_engine_waits() {
    model(|| {
        let parker = Parker::new();
        let signal = Arc::new(WorkSignal::new(parker.unparker()));
        let queue = Arc::new(SegQueue::new());
        let blocks: Arc<Vec<BlockContents>> =
            Arc::new((0..2).map(|_| BlockContents::new(0)).collect());
        let workers: Vec<_> = (0..2usize)
            .map(|w| {
                let (signal, queue, blocks) =
                    (Arc::clone(&signal), Arc::clone(&queue), Arc::clone(&blocks));
                thread::spawn(move || {
                    blocks[w].write(10 + w as u64);
                    queue.push(w);
                    signal.notify();
                })
            })
            .collect();
        // The engine: each step reads the counter, then drains; with nothing new it waits.
        let mut got = Vec::new();
        while got.len() < 2 {
            let before = signal.events();
            while let Some(w) = queue.pop() {
                assert_eq!(blocks[w].read(), 10 + w as u64);
                got.push(w);
            }
            if got.len() < 2 {
                signal.wait_for_work(&parker, before);
            }
        }
        got.sort_unstable();
        assert_eq!(got, [0, 1]);
        for w in workers {
            w.join().unwrap();
        }
    });
}
