//! The runtime never hangs and never stalls: connector lookups that panic on any shard,
//! durations too large for an `Instant`, a step output that never comes back, a request with
//! no token limit that outgrows the pool, and pool pressure spread over two shards.
//!
//! Every test runs under a hang guard ([`guarded`]): the scenario runs on its own thread and
//! the test fails if it has not finished within a generous bound. That bound is a guard
//! against hanging, never a timing assertion: each scenario takes well under a second.

use std::sync::Arc;
use std::time::Duration;

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use kvsched::runtime::route::shard_of;

use kvsched::{CacheGroup, EndState, Metrics, Runtime, Settings, StepOutput};
use kvsched_testkit::SimEngine;
use kvsched_testkit::{SimConfig, SimConnector};

mod support;
use support::{guarded, req};

/// Drives the engine loop (update → schedule → sample every request that samples) until no
/// request is live or `max_steps` pass; returns the metrics and how each request ended.
fn drive(rt: &mut Runtime, max_steps: usize) -> (Metrics, Vec<(String, EndState)>) {
    drive_with(rt, max_steps, |_| false)
}

/// [`drive`], calling `arrive` before every step (to submit); it returns whether more
/// requests are still to come, so an empty runtime ends the loop only once it returns false.
fn drive_with(
    rt: &mut Runtime,
    max_steps: usize,
    mut arrive: impl FnMut(&Runtime) -> bool,
) -> (Metrics, Vec<(String, EndState)>) {
    let mut out = StepOutput::default();
    let mut ended = Vec::new();
    // Sync loads succeed (these tests' connectors decide only lookups and async loads).
    let mut engine = SimEngine::default();
    for _ in 0..max_steps {
        let more = arrive(rt);
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        out = engine.step(&plan);
        ended.extend(plan.ended.iter().map(|(id, e)| (id.to_string(), *e)));
        if !more && rt.live() == 0 {
            break;
        }
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_millis(1));
        }
    }
    (rt.metrics(), ended)
}

/// A connector whose `lookup` panics for requests named `boom…` and offers nothing otherwise.
struct PanickyLookup;

impl KvConnector for PanickyLookup {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        if q.request.starts_with("boom") {
            panic!("lookup of {} exploded", q.request);
        }
        LookupResult::default()
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        LoadResult::Ok
    }
}

#[test]
fn lookup_panics_on_every_shard_are_counted_and_the_step_completes() {
    // Quiet the expected panics' messages; anything else still prints.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        if !msg.contains("exploded") {
            default_hook(info);
        }
    }));
    // Booms on shard 0 and on shard 1, so the panic happens on the engine thread and on a
    // shard thread (parallel), and all on the engine thread (inline).
    let booms: Vec<String> = (0..40)
        .map(|i| format!("boom-{i}"))
        .filter(|id| shard_of(id, 2) == 0)
        .take(3)
        .chain(
            (0..40)
                .map(|i| format!("boom-{i}"))
                .filter(|id| shard_of(id, 2) == 1)
                .take(3),
        )
        .collect();
    assert_eq!(booms.len(), 6);
    for inline in [0, usize::MAX] {
        let booms = booms.clone();
        let (m, ended) = guarded("panicking lookup", move || {
            let mut rt = Runtime::builder()
                .shards(2)
                .connector(Arc::new(PanickyLookup))
                .inline_steps_up_to(inline)
                .build()
                .unwrap();
            for id in &booms {
                rt.submit(req(id, (0..40).collect(), 2)).unwrap();
            }
            for i in 0..6 {
                rt.submit(req(&format!("ok-{i}"), (100..140).collect(), 2))
                    .unwrap();
            }
            let out = drive(&mut rt, 1_000);
            let report = rt.shutdown();
            assert!(report.violations.is_empty(), "{report}");
            out
        });
        assert_eq!(m.lookup_panics, 6, "inline {inline}: {m:?}");
        assert_eq!(m.connector_panics, 6);
        assert_eq!(m.finished, 12, "inline {inline}: every request finishes");
        assert!(ended.iter().all(|(_, e)| *e == EndState::Finished));
    }
    let _ = std::panic::take_hook();
}

#[test]
fn duration_max_in_every_setting_and_argument_never_panics() {
    let (m, finished) = guarded("Duration::MAX", || {
        let settings = Settings::default()
            .with_load_deadline(Some(Duration::MAX))
            .with_quarantine_after(1)
            .with_quarantine_for(Duration::MAX);
        // Every load asynchronous and failing: deadlines are set, failures quarantine.
        let sim = SimConnector::new(SimConfig {
            hit_ratio: 1.0,
            async_ratio: 1.0,
            failure_rate: 1.0,
            latency_min: Duration::from_micros(50),
            latency_max: Duration::from_micros(100),
            ..SimConfig::default()
        });
        let mut rt = Runtime::builder()
            .shards(2)
            .settings(settings)
            .shutdown_timeout(Duration::MAX)
            .connector(Arc::new(sim))
            .build()
            .unwrap();
        for i in 0..8 {
            let mut r = req(&format!("r{i}"), (0..200).map(|t| t + i).collect(), 2);
            r.load_deadline = Some(Duration::MAX);
            rt.submit(r).unwrap();
        }
        let plan = rt.schedule().expect("step");
        assert!(
            plan.scheduled.is_empty(),
            "every request waits for its load"
        );
        // Untimed: returns because a completion arrives.
        assert!(rt.wait_for_work(Duration::MAX));
        let (m, _) = drive(&mut rt, 10_000);
        let report = rt.shutdown();
        assert!(report.violations.is_empty(), "{report}");
        (m, report.metrics.finished)
    });
    assert!(m.loads_failed > 0, "{m:?}");
    assert!(m.prefixes_quarantined > 0, "{m:?}");
    assert_eq!(finished, 8);
}

#[test]
fn a_lost_step_output_is_reoffered_and_counted() {
    let (first, again, m) = guarded("lost output", || {
        let mut rt = Runtime::builder().shards(1).build().unwrap();
        rt.submit(req("x", (0..33).collect(), 2)).unwrap();
        let first = rt.schedule().expect("step");
        // The engine crashes in this step: no update.
        let again = rt.schedule().expect("step");
        rt.update(SimEngine::default().step(&again));
        let (m, _) = drive(&mut rt, 100);
        drop(rt.shutdown());
        (first, again, m)
    });
    assert_eq!(first.scheduled.len(), 1);
    assert_eq!(first.scheduled[0].num_computed_tokens, 0);
    assert_eq!(m.lost_outputs, 1);
    let x = again.scheduled.first().expect("x offered again");
    assert_eq!(
        x.num_computed_tokens, 0,
        "back to where the lost step started"
    );
    assert_eq!(x.num_tokens, first.scheduled[0].num_tokens);
    assert_eq!(m.finished, 1);
}

#[test]
fn a_request_without_a_token_limit_that_outgrows_the_pool_finishes() {
    let (m, ended) = guarded("outgrowing request", || {
        let mut rt = Runtime::builder()
            .groups(vec![CacheGroup::full_attention(16)])
            .pool_blocks(9) // 8 usable blocks: 128 tokens
            .shards(1)
            .build()
            .unwrap();
        rt.submit(req("endless", (0..20).collect(), 0)).unwrap();
        let out = drive(&mut rt, 1_000);
        drop(rt.shutdown());
        out
    });
    assert_eq!(ended, vec![("endless".to_string(), EndState::Finished)]);
    assert_eq!(m.length_capped, 1);
}

#[test]
fn two_shards_sharing_a_small_pool_finish_every_request() {
    let m = guarded("small pool", || {
        let mut rt = Runtime::builder()
            .groups(vec![CacheGroup::full_attention(16)])
            .pool_blocks(41)
            .shards(2)
            .inline_steps_up_to(0)
            .build()
            .unwrap();
        // Shared prefixes (cached blocks many requests hold), long generations that must grow.
        let bases: Vec<Vec<u32>> = (0..3)
            .map(|b| (0..96).map(|t| t * 7 + b).collect())
            .collect();
        let mut next = 0u32;
        drive_with(&mut rt, 200_000, |rt| {
            while next < 300 && rt.live() < 24 {
                let mut prompt = bases[(next % 3) as usize][..48 + (next % 48) as usize].to_vec();
                prompt.push(1_000 + next);
                rt.submit(req(&format!("r{next}"), prompt, 8 + next % 40))
                    .unwrap();
                next += 1;
            }
            next < 300
        });
        let report = rt.shutdown();
        assert!(report.violations.is_empty(), "{report}");
        report.metrics
    });
    assert_eq!(m.submitted, 300);
    assert_eq!(m.finished, 300, "{m:?}");
    assert_eq!(m.no_progress_steps, 0);
}

/// Offers every prompt's full blocks as an asynchronous load that never returns until the
/// test lets it: the worker that takes one is stuck in the connector.
struct HungLoads(Arc<std::sync::atomic::AtomicBool>);

impl KvConnector for HungLoads {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let held = (q.prompt.len() as u64 - 1) / 16 * 16;
        LookupResult {
            external_tokens: held.saturating_sub(q.local_tokens),
            load_async: true,
        }
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        while !self.0.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        LoadResult::Ok
    }
}

/// A connector whose loads never return holds its one worker for good; the loads queued
/// behind it fail at their deadline and their requests compute instead. The queue of jobs no
/// worker will take stops growing at the runtime's bound (4,096): later admissions dispatch
/// no load (`load_queue_skips`), and every request still finishes.
#[test]
fn loads_queued_behind_a_hung_connector_stop_at_the_bound() {
    const REQUESTS: u64 = 6_000;
    const MAX_SEQS: usize = 256;
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hung = Arc::clone(&release);
    let m = guarded("hung connector", move || {
        let mut rt = Runtime::builder()
            .groups(vec![CacheGroup::full_attention(16)])
            .pool_blocks(4096)
            .shards(1)
            .workers(1)
            .max_seqs(MAX_SEQS)
            .token_budget(1 << 16)
            .settings(Settings::default().with_load_deadline(Some(Duration::from_millis(1))))
            .connector(Arc::new(HungLoads(hung)))
            // The hung worker is abandoned at shutdown.
            .shutdown_timeout(Duration::from_millis(50))
            .build()
            .unwrap();
        let mut next = 0u64;
        let (m, ended) = drive_with(&mut rt, 20_000, |rt| {
            // Distinct prompts of two full blocks and a token, a step's admissions at a time.
            for _ in 0..MAX_SEQS {
                if next == REQUESTS {
                    break;
                }
                let prompt = (0..33).map(|t| (next * 33 + t) as u32).collect();
                let mut r = req(&format!("h{next}"), prompt, 1);
                if next == 0 {
                    // Long enough for the worker to take it (and hang) before it expires.
                    r.load_deadline = Some(Duration::from_millis(500));
                }
                rt.submit(r).unwrap();
                next += 1;
            }
            next < REQUESTS
        });
        assert_eq!(ended.len() as u64, REQUESTS, "every request ended");
        let _ = rt.shutdown();
        m
    });
    release.store(true, std::sync::atomic::Ordering::Release);
    assert!(m.load_queue_skips > 0, "{m:?}");
    assert!(
        m.loads_dispatched <= 4096 + MAX_SEQS as u64 + 1,
        "loads dispatched past the bound: {m:?}"
    );
    assert_eq!(m.finished, REQUESTS, "{m:?}");
}

/// The bound on loads queued behind a hung connector holds within a step too: a step that
/// admits more requests than the workers' queue has room for dispatches loads for as many as
/// fit (shared out between the shards) and the rest compute (`load_queue_skips`), so at most
/// 4,096 jobs wait for a worker, whatever `max_seqs` lets one step admit.
#[test]
fn one_step_dispatches_no_more_loads_than_the_queue_has_room_for() {
    const REQUESTS: u32 = 4_300;
    for shards in [1, 2] {
        let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hung = Arc::clone(&release);
        let m = guarded("one step past the bound", move || {
            let mut rt = Runtime::builder()
                .groups(vec![CacheGroup::full_attention(16)])
                .pool_blocks(16_384)
                .shards(shards)
                .workers(1)
                .max_seqs(1 << 20)
                .token_budget(1 << 20)
                .settings(Settings::default().with_load_deadline(None))
                .connector(Arc::new(HungLoads(hung)))
                .shutdown_timeout(Duration::from_millis(50))
                .build()
                .unwrap();
            for i in 0..REQUESTS {
                let prompt = (0..17).map(|t| i * 17 + t).collect();
                rt.submit(req(&format!("q{i}"), prompt, 1)).unwrap();
            }
            for _ in 0..3 {
                let plan = rt.schedule().unwrap();
                rt.update(StepOutput::all_sampled(&plan));
            }
            let m = rt.metrics();
            let _ = rt.shutdown();
            m
        });
        release.store(true, std::sync::atomic::Ordering::Release);
        // 4,096 queued and the one the worker took.
        assert!(m.loads_dispatched <= 4_097, "{shards} shards: {m:?}");
        assert!(m.load_queue_skips > 0, "{m:?}");
    }
}

/// An idle engine waiting for work with a long timeout wakes at the deadline of a load that
/// never completes: the wait ends there, says there is work, and the next step fails the
/// load, so its request computes instead. (Waking only on completions, the wait would
/// sleep out its whole timeout.)
#[test]
fn an_idle_wait_ends_at_a_hung_loads_deadline() {
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hung = Arc::clone(&release);
    let (waited, m) = guarded("wait past a deadline", move || {
        let mut rt = Runtime::builder()
            .groups(vec![CacheGroup::full_attention(16)])
            .pool_blocks(256)
            .shards(2)
            .workers(1)
            .settings(Settings::default().with_load_deadline(Some(Duration::from_millis(50))))
            .connector(Arc::new(HungLoads(hung)))
            .shutdown_timeout(Duration::from_millis(50))
            .build()
            .unwrap();
        rt.submit(req("hung", (0..40).collect(), 1)).unwrap();
        let plan = rt.schedule().unwrap();
        assert!(plan.scheduled.is_empty(), "the request waits for its load");
        let t0 = std::time::Instant::now();
        // Far longer than the deadline: the test's bound below is what fails a wait that
        // sleeps past the deadline.
        let work = rt.wait_for_work(Duration::from_secs(20));
        let waited = t0.elapsed();
        assert!(work, "the deadline passing is work for the next step");
        let (m, ended) = drive(&mut rt, 1000);
        assert_eq!(ended, [("hung".to_owned(), EndState::Finished)]);
        let _ = rt.shutdown();
        (waited, m)
    });
    release.store(true, std::sync::atomic::Ordering::Release);
    assert!(
        waited < Duration::from_secs(10),
        "the wait slept {waited:?} past a 50 ms deadline"
    );
    // The first load's, and a retry's (dropped unstarted: the one worker is hung).
    assert!(m.deadlines_expired >= 1, "{m:?}");
}

/// A request submitted (or cancelled) from another thread wakes an engine idle in
/// `wait_for_work`, whatever its timeout.
#[test]
fn a_submit_from_another_thread_wakes_an_idle_wait() {
    let waits = guarded("submit wakes the engine", move || {
        let mut rt = Runtime::builder()
            .groups(vec![CacheGroup::full_attention(16)])
            .pool_blocks(256)
            .shards(2)
            .workers(1)
            .build()
            .unwrap();
        let mut waits = Vec::new();
        for (i, cancel) in [(0, false), (1, true)] {
            let _ = rt.schedule().unwrap();
            let handle = rt.handle();
            let client = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                if cancel {
                    handle.cancel("c0");
                } else {
                    handle
                        .submit(req(&format!("c{i}"), (0..40).collect(), 1))
                        .unwrap();
                }
            });
            let t0 = std::time::Instant::now();
            let work = rt.wait_for_work(Duration::from_secs(20));
            waits.push((work, t0.elapsed()));
            client.join().unwrap();
        }
        let (_, ended) = drive(&mut rt, 1000);
        assert_eq!(ended.len(), 1, "{ended:?}");
        let _ = rt.shutdown();
        waits
    });
    for (work, waited) in waits {
        assert!(work, "woken by a submit or cancel");
        assert!(
            waited < Duration::from_secs(10),
            "slept {waited:?} past a submit"
        );
    }
}

/// [`HungLoads`] counting the loads its worker started.
struct StartedHungLoads(HungLoads, Arc<std::sync::atomic::AtomicU64>);

impl KvConnector for StartedHungLoads {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        self.0.lookup(q)
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.load(job)
    }
}

/// A pool held by the blocks of a load past its deadline waits for that load to return: a
/// stall with blocks parked is counted as a wait for late loads (`late_load_stalls`), not as
/// a stall nothing will resolve (`no_progress_steps`), and the request finishes once the
/// load returns.
///
/// The case needs a load its worker started before the deadline (a job still queued at its
/// deadline is dropped unstarted and parks nothing). A loaded machine can wake the worker
/// late, so a run whose worker started no load is run again, up to five times.
#[test]
fn a_pool_full_of_parked_blocks_is_a_wait_not_a_stall() {
    let (mut m, mut ended) = (None, Vec::new());
    for _ in 0..5 {
        let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let started = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let connector = StartedHungLoads(HungLoads(Arc::clone(&release)), Arc::clone(&started));
        let (metrics, out) = guarded("parked pool", move || {
            let mut rt = Runtime::builder()
                .groups(vec![CacheGroup::full_attention(16)])
                .pool_blocks(4) // 3 usable: the request's whole prompt
                .shards(1)
                .workers(1)
                .settings(Settings::default().with_load_deadline(Some(Duration::from_millis(20))))
                .connector(Arc::new(connector))
                .build()
                .unwrap();
            rt.submit(req("p", (0..33).collect(), 1)).unwrap();
            // The load returns 200 ms from now; its 20 ms deadline has long passed by then,
            // so its two blocks are parked and the request, computing instead, cannot get
            // them.
            let releaser = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                release.store(true, std::sync::atomic::Ordering::Release);
            });
            let out = drive(&mut rt, 100_000);
            releaser.join().unwrap();
            let report = rt.shutdown();
            assert!(report.violations.is_empty(), "{report}");
            out
        });
        if started.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            (m, ended) = (Some(metrics), out);
            break;
        }
    }
    let m = m.expect("in five runs, the worker started no load before its deadline");
    assert_eq!(ended, [("p".to_owned(), EndState::Finished)]);
    assert!(m.deadlines_expired >= 1, "{m:?}");
    assert!(
        m.late_load_stalls > 0,
        "the pool waited for the late load: {m:?}"
    );
    assert_eq!(m.no_progress_steps, 0, "{m:?}");
}
