//! `Handle`s used from other threads while the engine steps: submits and cancels land, every
//! request ends once, and the invariants read between steps hold throughout.

use kvsched::{Runtime, RuntimeError, StepOutput, SubmitRequest};
use kvsched_testkit::SimEngine;

mod support;

/// A request of `len` tokens that generates two.
fn req(id: &str, len: usize) -> SubmitRequest {
    support::req(id, (0..len as u32).collect(), 2)
}

/// `Handle` is `Send + Sync + Clone`: checked at compile time, then used from four threads.
#[test]
fn handle_submits_and_cancels_from_other_threads() {
    fn send_sync_clone<T: Send + Sync + Clone + 'static>() {}
    send_sync_clone::<kvsched::Handle>();

    let mut rt = Runtime::builder().shards(2).workers(2).build().unwrap();
    let handle = rt.handle();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let h = handle.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    h.submit(req(&format!("t{t}-{i}"), 20)).unwrap();
                }
                // Queued after its own submit, so it is cancelled before admission.
                h.cancel(&format!("t{t}-0"));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut out = StepOutput::default();
    let mut engine = SimEngine::default();
    for _ in 0..1_000 {
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        out = engine.step(&plan);
        if rt.live() == 0 {
            break;
        }
    }
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{report}");
    let m = &report.metrics;
    assert_eq!(m.submitted, 100);
    assert_eq!((m.finished, m.cancelled, m.failed), (96, 4, 0), "{report}");
    assert!(matches!(
        handle.submit(req("late", 20)),
        Err(RuntimeError::ShutDown)
    ));
    handle.cancel("late"); // a no-op, never a panic
}

/// The invariants read between steps hold while `Handle`s submit from other threads: the
/// accounting (submitted = finished + failed + cancelled + live) is read with submits held
/// off, so a submit counted live but not yet submitted is never seen half done.
#[test]
fn invariants_hold_while_handles_submit_from_other_threads() {
    let mut rt = Runtime::builder()
        .shards(2)
        .pool_blocks(512)
        .build()
        .unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let h = rt.handle();
            let done = std::sync::Arc::clone(&done);
            std::thread::spawn(move || {
                for i in 0..1_000 {
                    h.submit(req(&format!("t{t}-{i}"), 20)).unwrap();
                }
                done.fetch_add(1, std::sync::atomic::Ordering::Release);
            })
        })
        .collect();
    let mut out = StepOutput::default();
    let mut engine = SimEngine::default();
    let mut checks = 0;
    for _ in 0..1_000_000 {
        for _ in 0..8 {
            let v = rt.check_invariants();
            assert!(v.is_empty(), "after {checks} checks: {v:?}");
            checks += 1;
        }
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        out = engine.step(&plan);
        if done.load(std::sync::atomic::Ordering::Acquire) == 2 && rt.live() == 0 {
            break;
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.metrics.submitted, 2_000);
    assert_eq!(report.metrics.finished, 2_000, "{report}");
}
