//! A shard that panics mid-step (a runtime bug: connector panics are caught where they
//! happen) releases the step on every shard, and `schedule` reports a typed error from then
//! on, in both the parallel and the inline step paths. The panic is injected through a
//! test-only hook in the shared state.

use std::sync::mpsc;
use std::time::Duration;

use crate::runtime::{Runtime, RuntimeError, SubmitRequest};
use crate::sync::Ordering;

fn poisoned_step(shards: usize, inline: usize, victim: usize) -> (RuntimeError, Vec<String>) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut rt = Runtime::builder()
            .shards(shards)
            .inline_steps_up_to(inline)
            .build()
            .unwrap();
        for i in 0..8 {
            rt.submit(SubmitRequest {
                id: format!("r{i}"),
                prompt: (0..40).collect(),
                max_new_tokens: 2,
                priority: 0,
                load_deadline: None,
            })
            .unwrap();
        }
        rt.schedule().expect("a healthy step");
        rt.inner.panic_in_shard.store(victim, Ordering::Relaxed);
        let err = rt.schedule().expect_err("the poisoned step");
        // Poisoned for good: the next step refuses at once.
        let again = rt.schedule().expect_err("after the poisoned step");
        assert_eq!(err.to_string(), again.to_string());
        // Nothing more is queued for steps that will not run.
        assert!(matches!(
            rt.handle().submit(SubmitRequest {
                id: "late".into(),
                prompt: (0..40).collect(),
                max_new_tokens: 2,
                priority: 0,
                load_deadline: None,
            }),
            Err(RuntimeError::ShutDown)
        ));
        let report = rt.shutdown();
        let _ = tx.send((err, report.violations));
    });
    // A hang guard, not a timing assertion.
    rx.recv_timeout(Duration::from_secs(60))
        .expect("a panicking shard hung the step")
}

#[test]
fn a_panicking_shard_poisons_the_runtime_instead_of_hanging() {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // the injected panics are expected
    for (shards, inline, victim) in [(2, 0, 1), (2, 0, 0), (4, 0, 3), (2, usize::MAX, 1)] {
        let (err, violations) = poisoned_step(shards, inline, victim);
        match err {
            RuntimeError::ShardPanicked {
                shard,
                step,
                ref message,
            } => {
                assert_eq!((shard, step), (victim, 2), "{err}");
                assert!(message.contains("test panic"), "{err}");
            }
            other => panic!("{other}"),
        }
        assert!(
            violations.first().is_some_and(|v| v.contains("panicked")),
            "{violations:?}"
        );
    }
    std::panic::set_hook(hook);
}

/// A poisoned runtime's shutdown accounts for every completion that landed: applied, or,
/// since no step runs, counted stale — those it put back into a two-place queue too.
#[test]
fn a_poisoned_shutdown_counts_every_completion_it_cannot_apply() {
    use crate::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Everything past the first token is loaded asynchronously, in 300 ms.
    struct Slow(AtomicUsize);
    impl KvConnector for Slow {
        fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
            LookupResult {
                external_tokens: (q.prompt.len() as u64 - 1) / 16 * 16,
                load_async: true,
            }
        }
        fn load(&self, _: &LoadJob) -> LoadResult {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(300));
            LoadResult::Ok
        }
    }
    let slow = Arc::new(Slow(AtomicUsize::new(0)));
    let mut rt = Runtime::builder()
        .shards(1)
        .workers(4)
        .completion_queue_capacity(2)
        .connector(Arc::clone(&slow) as Arc<dyn KvConnector>)
        .build()
        .unwrap();
    for i in 0..4 {
        rt.submit(SubmitRequest {
            id: format!("r{i}"),
            prompt: (0..100).collect(),
            max_new_tokens: 2,
            priority: 0,
            load_deadline: None,
        })
        .unwrap();
    }
    rt.schedule().expect("a healthy step");
    while slow.0.load(std::sync::atomic::Ordering::SeqCst) < 4 {
        std::thread::sleep(Duration::from_millis(1));
    }
    rt.inner.panic_in_shard.store(0, Ordering::Relaxed);
    rt.schedule().expect_err("the poisoned step");
    let report = rt.shutdown();
    let m = &report.metrics;
    assert_eq!(m.loads_ok + m.stale_completions, 4, "{m:?}");
}
