//! The runtime's public API: configuration errors, submit errors, stale and unknown events,
//! lifecycle accounting and shutdown with loads in flight.

use std::sync::Arc;
use std::time::Duration;

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult, Prepared};

use kvsched::rules::geometry::{CacheGroup, MambaMode};
use kvsched::BlockRef;
use kvsched::{EndState, Runtime, RuntimeError, StepOutput, SubmitRequest};
use kvsched_testkit::SimEngine;
use kvsched_testkit::{SimConfig, SimConnector};

mod support;

/// A request of `len` tokens that generates two.
fn req(id: &str, len: usize) -> SubmitRequest {
    support::req(id, (0..len as u32).collect(), 2)
}

#[test]
fn builder_rejects_bad_settings_with_the_field_named() {
    let cases: Vec<(Result<Runtime, RuntimeError>, &str)> = vec![
        (
            Runtime::builder().shards(0).build(),
            "shards: must be 1 to 64",
        ),
        (
            Runtime::builder().shards(65).build(),
            "shards: must be 1 to 64",
        ),
        (
            Runtime::builder().workers(0).build(),
            "workers: must be 1 to 256",
        ),
        (
            Runtime::builder().shards(4).token_budget(3).build(),
            "token_budget: must be at least the shard count",
        ),
        (
            Runtime::builder().shards(4).max_seqs(2).build(),
            "max_seqs: must be at least the shard count",
        ),
        (
            Runtime::builder().completion_queue_capacity(0).build(),
            "completion_queue_capacity: must be 1 to 65536",
        ),
        (
            Runtime::builder()
                .completion_queue_capacity(usize::MAX)
                .build(),
            "completion_queue_capacity: must be 1 to 65536",
        ),
        (Runtime::builder().pool_blocks(1).build(), "pool_blocks:"),
        (
            Runtime::builder().pool_blocks(u32::MAX as usize).build(),
            "pool_blocks: must be at most 16777216",
        ),
        (
            Runtime::builder()
                .settings(kvsched::Settings::default().with_load_deadline(Some(Duration::ZERO)))
                .build(),
            "load_deadline: must be > 0",
        ),
        (
            Runtime::builder().groups(vec![]).build(),
            "groups: at least one cache group",
        ),
        (
            Runtime::builder()
                .groups(vec![CacheGroup::full_attention(0)])
                .build(),
            "groups: group 0: block_size must be > 0",
        ),
        (
            Runtime::builder()
                .groups(vec![
                    CacheGroup::full_attention(16),
                    CacheGroup::mamba(64, MambaMode::Align),
                ])
                .scheduler_block_size(32)
                .build(),
            "groups: scheduler_block_size 32 is not a multiple",
        ),
    ];
    for (r, want) in cases {
        let e = r.expect_err(want).to_string();
        assert!(e.starts_with(want), "{e:?} should start with {want:?}");
        assert!(!e.contains('\n'));
    }
}

#[test]
fn submit_errors_are_typed_and_lose_nothing() {
    let mut rt = Runtime::builder()
        .pool_blocks(64)
        .shards(2)
        .build()
        .unwrap();
    rt.submit(req("a", 40)).unwrap();
    assert!(matches!(rt.submit(req("a", 40)), Err(RuntimeError::DuplicateId(id)) if id == "a"));
    assert!(matches!(
        rt.submit(req("e", 0)),
        Err(RuntimeError::EmptyPrompt(_))
    ));
    assert!(matches!(rt.submit(req("", 40)), Err(RuntimeError::EmptyId)));
    let zero = SubmitRequest {
        load_deadline: Some(Duration::ZERO),
        ..req("z", 40)
    };
    let e = rt.submit(zero).expect_err("a zero deadline");
    assert!(matches!(&e, RuntimeError::ZeroLoadDeadline(id) if id == "z"));
    assert_eq!(
        e.to_string(),
        "request \"z\": load_deadline: must be > 0 (or None)"
    );
    // 63 usable blocks of 16 tokens: 1,100 tokens never fit.
    match rt.submit(req("big", 1100)) {
        Err(RuntimeError::TooLong { needed, usable, .. }) => assert_eq!((needed, usable), (69, 63)),
        other => panic!("{other:?}"),
    }
    // Unknown ids in commands and out-of-range blocks in reports are counted, not fatal.
    rt.cancel("nobody");
    rt.update(StepOutput {
        step: 0, // no plan yet
        sampled: vec!["ghost".into()],
        finished: vec!["ghost2".into()],
        invalid_blocks: vec![
            BlockRef {
                id: 10_000,
                generation: 0,
            },
            BlockRef {
                id: 0,
                generation: 0,
            },
        ],
    });
    let plan = rt.schedule().expect("step");
    assert_eq!(plan.scheduled.len(), 1);
    let m = rt.metrics();
    // `cancel("nobody")`, the finish of "ghost2" and the sample of "ghost" name no request;
    // neither block is a sync load's destination.
    assert_eq!(m.unknown_commands, 3);
    assert_eq!(m.unexpected_samples, 0);
    assert_eq!(m.foreign_blocks, 2);
    assert_eq!(m.stale_blocks, 0);
    assert_eq!(m.submitted, 1);
    assert!(rt.check_invariants().is_empty());
    let report = rt.shutdown();
    assert_eq!(report.metrics.cancelled, 1);
    assert_eq!(report.cancelled_at_shutdown, vec!["a".to_string()]);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.census.referenced, 0);
    assert!(report.census.conserved());
}

#[test]
fn a_request_runs_to_completion_and_its_id_can_be_reused() {
    let mut rt = Runtime::builder().shards(1).build().unwrap();
    rt.submit(req("x", 33)).unwrap();
    let mut out = StepOutput::default();
    let mut ended = Vec::new();
    let mut engine = SimEngine::default();
    for _ in 0..10 {
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        out = engine.step(&plan);
        ended.extend(plan.ended);
    }
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].1, EndState::Finished);
    // Prompt 33 + 2 generated.
    rt.submit(req("x", 33)).unwrap();
    assert_eq!(rt.metrics().finished, 1);
    let report = rt.shutdown();
    assert_eq!(report.metrics.submitted, 2);
    assert!(report.violations.is_empty());
}

/// A connector that prepares each prompt's length at submit (and panics for one request),
/// and records what each lookup was handed.
#[derive(Default)]
struct Preparing {
    prepares: std::sync::atomic::AtomicUsize,
    seen: std::sync::Mutex<Vec<(String, Option<usize>)>>,
}

impl KvConnector for Preparing {
    fn prepare(&self, request: &str, prompt: &[u32]) -> Option<Prepared> {
        self.prepares
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert_ne!(request, "boom", "a connector bug in prepare");
        Some(Arc::new(prompt.len()))
    }
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let got = q.prepared.and_then(|p| p.downcast_ref::<usize>()).copied();
        if let Ok(mut seen) = self.seen.lock() {
            seen.push((q.request.to_owned(), got));
        }
        LookupResult::default()
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        LoadResult::Ok
    }
}

#[test]
fn what_a_connector_prepares_at_submit_reaches_the_lookup_of_that_request() {
    let conn = Arc::new(Preparing::default());
    let mut rt = Runtime::builder()
        .shards(2)
        .connector(conn.clone())
        .build()
        .unwrap();
    for (id, len) in [("a", 40), ("b", 57), ("boom", 33)] {
        rt.submit(req(id, len)).unwrap();
    }
    // On the submitting thread, before any step: one prepare a request.
    assert_eq!(conn.prepares.load(std::sync::atomic::Ordering::Relaxed), 3);
    let (mut out, mut engine, mut ended) = (StepOutput::default(), SimEngine::default(), 0);
    for _ in 0..20 {
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        out = engine.step(&plan);
        ended += plan.ended.len();
    }
    assert_eq!(
        ended, 3,
        "every request ends, the one whose prepare panicked too"
    );
    assert_eq!(conn.prepares.load(std::sync::atomic::Ordering::Relaxed), 3);
    let mut seen = conn.seen.lock().map(|s| s.clone()).unwrap_or_default();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("a".to_owned(), Some(40)),
            ("b".to_owned(), Some(57)),
            ("boom".to_owned(), None)
        ],
        "each request's lookup gets what was prepared for it"
    );
    let report = rt.shutdown();
    assert_eq!(report.metrics.connector_panics, 1, "the panic in prepare");
    assert_eq!(report.metrics.finished, 3);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

/// A connector whose `prepare` waits until released.
#[derive(Default)]
struct SlowPrepare {
    entered: std::sync::atomic::AtomicBool,
    release: std::sync::atomic::AtomicBool,
}

impl KvConnector for SlowPrepare {
    fn prepare(&self, _: &str, _: &[u32]) -> Option<Prepared> {
        use std::sync::atomic::Ordering::{Acquire, Release};
        self.entered.store(true, Release);
        while !self.release.load(Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }
    fn lookup(&self, _: LookupQuery<'_>) -> LookupResult {
        LookupResult::default()
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        LoadResult::Ok
    }
}

#[test]
fn a_slow_prepare_delays_its_own_submit_and_never_shutdown() {
    use std::sync::atomic::Ordering::{Acquire, Release};
    let conn = Arc::new(SlowPrepare::default());
    let rt = Runtime::builder().connector(conn.clone()).build().unwrap();
    let handle = rt.handle();
    let submitter = std::thread::spawn(move || handle.submit(req("slow", 40)));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !conn.entered.load(Acquire) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        conn.entered.load(Acquire),
        "the submit never reached prepare"
    );
    // Shutdown while the submit is inside `prepare`: it must not wait for it.
    let (tx, rx) = std::sync::mpsc::channel();
    let closer = std::thread::spawn(move || {
        let _ = tx.send(rt.shutdown());
    });
    let report = rx.recv_timeout(Duration::from_secs(3));
    conn.release.store(true, Release);
    let report = report.expect("shutdown waited for a connector's prepare");
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    // The submit, let go after shutdown, is refused: nothing is queued for no step.
    let submitted = submitter.join().expect("submitter");
    assert!(
        matches!(submitted, Err(RuntimeError::ShutDown)),
        "{submitted:?}"
    );
    closer.join().expect("closer");
}

/// A connector whose loads never finish until released, to hold loads in flight.
struct Gate {
    open: std::sync::atomic::AtomicBool,
    panic_on: &'static str,
}

impl KvConnector for Gate {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        LookupResult {
            external_tokens: (q.prompt.len() as u64 - 1) / 16 * 16,
            load_async: true,
        }
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        if &*job.request == self.panic_on {
            panic!("connector bug");
        }
        while !self.open.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(200));
        }
        LoadResult::Ok
    }
}

#[test]
fn connector_panic_is_a_failed_load_and_shutdown_drains_loads_in_flight() {
    let gate = Arc::new(Gate {
        open: false.into(),
        panic_on: "p",
    });
    // One worker per load, so the panicking load is not queued behind gated ones.
    let mut rt = Runtime::builder()
        .shards(2)
        .workers(4)
        .connector(gate.clone())
        .build()
        .unwrap();
    for id in ["p", "a", "b", "c"] {
        rt.submit(req(id, 100)).unwrap();
    }
    let plan = rt.schedule().expect("step");
    assert!(
        plan.scheduled.is_empty(),
        "every request waits for its load"
    );
    // The panicking load fails all its blocks: the request recomputes from 0, not stuck.
    let mut seen_panic = false;
    for _ in 0..200 {
        rt.wait_for_work(Duration::from_millis(5));
        let plan = rt.schedule().expect("step");
        if rt.metrics().connector_panics > 0 {
            seen_panic = true;
            assert!(
                plan.recovery.recovered.iter().any(|r| &*r.id == "p")
                    || rt.metrics().loads_failed > 0
            );
            break;
        }
    }
    // Open before asserting: a failing test must not leave workers blocked in `load`.
    gate.open.store(true, std::sync::atomic::Ordering::Release);
    assert!(seen_panic);
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.metrics.submitted, 4);
    assert_eq!(
        report.metrics.finished + report.metrics.failed + report.metrics.cancelled,
        4
    );
    assert_eq!(report.census.referenced, 0);
}

#[test]
fn wait_for_work_wakes_on_a_completion_and_times_out_otherwise() {
    let sim = SimConnector::new(SimConfig {
        latency_min: Duration::from_millis(2),
        latency_max: Duration::from_millis(2),
        async_ratio: 1.0,
        failure_rate: 0.0,
        ..SimConfig::default()
    });
    let mut rt = Runtime::builder().connector(Arc::new(sim)).build().unwrap();
    assert!(
        !rt.wait_for_work(Duration::from_millis(5)),
        "nothing in flight"
    );
    rt.submit(req("w", 200)).unwrap();
    rt.schedule().expect("step");
    assert!(
        rt.wait_for_work(Duration::from_secs(5)),
        "the load's completion wakes the engine"
    );
    let plan = rt.schedule().expect("step");
    assert_eq!(plan.scheduled.len(), 1);
    assert_eq!(plan.runnable_latency_ns.len(), 1);
    drop(rt.shutdown());
}

/// A connector whose loads never return (until the process exits); it records the blocks of
/// every load it started.
#[derive(Default)]
struct Hang {
    started: std::sync::Mutex<Vec<u64>>,
}

impl KvConnector for Hang {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        LookupResult {
            external_tokens: (q.prompt.len() as u64 - 1) / 16 * 16,
            load_async: true,
        }
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        if let Ok(mut started) = self.started.lock() {
            started.extend(job.block_tables.iter().flatten().map(|b| b.id));
        }
        loop {
            std::thread::park();
        }
    }
}

#[test]
fn shutdown_is_bounded_and_reports_loads_still_running() {
    let hang = Arc::new(Hang::default());
    let mut rt = Runtime::builder()
        .shards(2)
        .workers(1)
        .connector(hang.clone())
        .shutdown_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    for id in ["h1", "h2", "h3"] {
        rt.submit(req(id, 100)).unwrap();
    }
    rt.schedule().expect("step");
    std::thread::sleep(Duration::from_millis(20)); // the one worker is now stuck in a load
    let t0 = std::time::Instant::now();
    let report = rt.shutdown();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "shutdown took {:?}",
        t0.elapsed()
    );
    // One load was running (abandoned: its blocks stay held), two never started.
    assert_eq!(report.loads_abandoned, 1);
    assert_eq!(report.loads_cancelled, 2);
    assert_eq!(report.blocks_abandoned, 7); // ceil(100 / 16) blocks of the running load

    // The ids listed are exactly the running load's destination blocks.
    let mut started = hang.started.lock().unwrap().clone();
    started.sort_unstable();
    assert_eq!(report.abandoned_block_ids, started);
    assert_eq!(report.metrics.cancelled, 3);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(report.census.conserved());
}

/// Plans are numbered from 1; an output naming another step has its samples ignored and is
/// counted, while `finished` still applies.
#[test]
fn step_outputs_answer_their_plan() {
    let mut rt = Runtime::builder().shards(1).build().unwrap();
    rt.submit(req("x", 33)).unwrap();
    rt.submit(req("y", 33)).unwrap();
    let first = rt.schedule().expect("step");
    assert_eq!(first.step, 1);
    let ids: Vec<std::sync::Arc<str>> = first.scheduled.iter().map(|s| s.id.clone()).collect();
    assert_eq!(ids.len(), 2);
    rt.update(StepOutput {
        step: first.step + 7,
        sampled: ids.clone(),
        finished: vec!["y".into()],
        ..StepOutput::default()
    });
    let second = rt.schedule().expect("step");
    assert_eq!(second.step, 2);
    let m = rt.metrics();
    assert_eq!(m.stale_outputs, 1);
    assert_eq!(m.finished, 1, "finished applies whatever the step");
    // The stale sample was not applied: `x` has not generated a token, so it is still live.
    assert_eq!(rt.live(), 1);
    let report = rt.shutdown();
    assert_eq!(report.cancelled_at_shutdown, vec!["x".to_string()]);
}

#[test]
fn requests_that_end_in_shutdowns_last_step_are_named() {
    let mut rt = Runtime::builder().shards(1).build().unwrap();
    rt.submit(req("x", 33)).unwrap();
    rt.submit(req("y", 33)).unwrap();
    let plan = rt.schedule().expect("step");
    assert_eq!(plan.scheduled.len(), 2);
    // The engine finishes x in the output shutdown's last step applies.
    let mut out = StepOutput::for_plan(&plan);
    out.finished = vec!["x".into()];
    rt.update(out);
    let report = rt.shutdown();
    assert_eq!(
        report.ended_at_shutdown,
        vec![("x".to_string(), kvsched::EndState::Finished)]
    );
    assert_eq!(report.cancelled_at_shutdown, vec!["y".to_string()]);
    assert_eq!(report.metrics.finished, 1);
}
