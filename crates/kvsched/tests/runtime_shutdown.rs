//! Shutdown with loads in flight: a cooperative connector is told to stop (its load's cancel
//! token fires before shutdown waits for the workers), and a load that passed its deadline
//! and is still running when the wait ends is abandoned, its parked blocks held for good.
//! Loads that land while shutdown waits are applied, however small the completion queue.
//!
//! Every scenario runs under a hang guard ([`guarded`]); no duration is asserted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use kvsched::{Runtime, SubmitRequest};

mod support;
use support::guarded;

/// A request of a 100-token prompt, `load_deadline` its own (`None`: the runtime's).
fn req(id: &str, load_deadline: Option<Duration>) -> SubmitRequest {
    SubmitRequest {
        load_deadline,
        ..support::req(id, (0..100).collect(), 2)
    }
}

/// Everything past the first token is external, loaded asynchronously.
fn async_hit(q: &LookupQuery<'_>) -> LookupResult {
    LookupResult {
        external_tokens: (q.prompt.len() as u64 - 1) / 16 * 16,
        load_async: true,
    }
}

/// Waits (at most 30 s) until `done` holds.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(30), "{what}: never");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A load waits for its cancel token (30 s at most) and notes whether it fired.
#[derive(Default)]
struct Cooperative {
    started: AtomicUsize,
    saw_cancel: AtomicUsize,
}

impl KvConnector for Cooperative {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        async_hit(&q)
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        self.started.fetch_add(1, Ordering::SeqCst);
        let t0 = Instant::now();
        while !job.cancel.is_cancelled() && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if job.cancel.is_cancelled() {
            self.saw_cancel.fetch_add(1, Ordering::SeqCst);
        }
        LoadResult::all_failed(job)
    }
}

#[test]
fn shutdown_cancels_the_loads_in_flight_before_waiting_for_them() {
    let conn = Arc::new(Cooperative::default());
    let c = conn.clone();
    let report = guarded("cooperative shutdown", move || {
        let mut rt = Runtime::builder()
            .shards(1)
            .workers(1)
            .connector(c.clone())
            // Long enough that the load, told nothing, would return on its own first.
            .shutdown_timeout(Duration::from_secs(100))
            .build()
            .unwrap();
        rt.submit(req("c", None)).unwrap();
        rt.schedule().expect("step");
        wait_until("the load starts", || c.started.load(Ordering::SeqCst) == 1);
        rt.shutdown()
    });
    assert_eq!(
        conn.saw_cancel.load(Ordering::SeqCst),
        1,
        "the running load was not told to stop"
    );
    assert_eq!(report.loads_abandoned, 0);
    assert!(report.abandoned_block_ids.is_empty());
    assert_eq!(report.cancelled_at_shutdown, vec!["c".to_string()]);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(report.census.conserved());
}

/// A load never returns; the ids of the blocks it loads are noted.
#[derive(Default)]
struct Hang {
    started: Mutex<Vec<u64>>,
}

impl KvConnector for Hang {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        async_hit(&q)
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        if let Ok(mut started) = self.started.lock() {
            started.extend(job.all_loaded_blocks().iter().map(|b| b.id));
        }
        loop {
            std::thread::park();
        }
    }
}

#[test]
fn a_timed_out_load_still_running_at_shutdown_is_abandoned_with_its_parked_blocks() {
    let hang = Arc::new(Hang::default());
    let h = hang.clone();
    let (report, started) = guarded("parked at shutdown", move || {
        let mut rt = Runtime::builder()
            .shards(1)
            .workers(1)
            .connector(h.clone())
            // Past the next attempt's deadline (below), however slow the machine.
            .shutdown_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        // A deadline the worker surely starts the load within (a load taken after its
        // deadline is not run).
        rt.submit(req("p", Some(Duration::from_secs(1)))).unwrap();
        rt.schedule().expect("step");
        wait_until("the load starts", || {
            h.started.lock().map(|s| !s.is_empty()).unwrap_or(false)
        });
        // Past the deadline: the next step fails the load, which is running, so its blocks
        // are parked until it returns (never), and the request starts over.
        std::thread::sleep(Duration::from_millis(1200));
        rt.schedule().expect("step");
        let started = h.started.lock().map(|s| s.clone()).unwrap_or_default();
        (rt.shutdown(), started)
    });
    // The second attempt's load, queued behind the stuck one, expires in shutdown's last
    // step; its cancel token already fired, so its blocks are parked too. It never started:
    // its blocks are released. The first attempt's is the one load abandoned: its blocks stay
    // held, listed by id.
    assert!(report.metrics.deadlines_expired >= 1, "{report}");
    assert_eq!(report.loads_abandoned, 1, "{report}");
    assert_eq!(report.blocks_abandoned, 6); // the 96 tokens it loads, 16 a block
    let mut started = started;
    started.sort_unstable();
    assert_eq!(report.abandoned_block_ids, started);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(report.census.conserved());
}

/// A load that ignores its cancel token and succeeds after 200 ms.
struct Slow {
    started: AtomicUsize,
}

impl KvConnector for Slow {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        async_hit(&q)
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        self.started.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(200));
        LoadResult::Ok
    }
}

/// Eight loads land while shutdown waits for the workers, into a completion queue of one
/// place: each is applied (`loads_ok`), none counted stale. (The completions drained while
/// the workers stopped used to go back into the queue once, the rest counted stale.)
#[test]
fn loads_landing_during_shutdown_are_applied_whatever_the_queue_capacity() {
    guarded("shutdown with a one-place completion queue", || {
        let slow = Arc::new(Slow {
            started: AtomicUsize::new(0),
        });
        let mut rt = Runtime::builder()
            .shards(1)
            .workers(8)
            .completion_queue_capacity(1)
            .shutdown_timeout(Duration::from_secs(20))
            .connector(Arc::clone(&slow) as Arc<dyn KvConnector>)
            .build()
            .expect("runtime");
        for i in 0..8 {
            rt.submit(req(&format!("r{i}"), Some(Duration::from_secs(30))))
                .expect("submit");
        }
        let plan = rt.schedule().expect("step");
        assert!(
            plan.scheduled.is_empty(),
            "every request waits for its load"
        );
        wait_until("every load started", || {
            slow.started.load(Ordering::SeqCst) == 8
        });
        let report = rt.shutdown();
        assert_eq!(report.metrics.loads_ok, 8, "{:?}", report.metrics);
        assert_eq!(report.metrics.stale_completions, 0, "{:?}", report.metrics);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
    });
}
