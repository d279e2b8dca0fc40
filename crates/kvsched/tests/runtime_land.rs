//! A load that passes its deadline while its worker still runs it: its blocks are parked
//! (the late load may still write them), and the request's claims on them with them. When
//! the request keeps a local prefix, the parked positions are given fresh blocks, so the
//! request runs on a whole table; when it does not, it starts over and takes none. A load the
//! worker finished past its deadline has failed, even when its completion is taken before
//! the step that would expire it.
//!
//! The scenarios run under a hang guard ([`guarded`]); no duration is asserted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use kvsched::{EndState, Report, Runtime, StepOutput, SubmitRequest};

mod support;
use support::guarded;

/// A prompt with a local prefix hit gets the rest (whole blocks) from the store,
/// asynchronously; a load never returns.
#[derive(Default)]
struct HangPastLocal {
    started: AtomicUsize,
}

impl KvConnector for HangPastLocal {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let whole = (q.prompt.len() as u64 - 1) / 16 * 16;
        LookupResult {
            external_tokens: if q.local_tokens > 0 {
                whole.saturating_sub(q.local_tokens)
            } else {
                0
            },
            load_async: true,
        }
    }
    fn load(&self, _job: &LoadJob) -> LoadResult {
        hang(&self.started)
    }
}

/// A load that counts itself started and never returns.
fn hang(started: &AtomicUsize) -> LoadResult {
    started.fetch_add(1, Ordering::SeqCst);
    loop {
        std::thread::park();
    }
}

/// Waits until a worker has started a load; returns when the wait began.
fn wait_started(started: &AtomicUsize) -> Instant {
    let t0 = Instant::now();
    while started.load(Ordering::SeqCst) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the load never started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    t0
}

/// "a" caches a 96-token prefix and finishes; "b" shares its first 64 tokens and loads the
/// next `loaded` blocks, a load that hangs past its 1 s deadline; then "b" runs for up to 20
/// steps. Returns shutdown's report, whether a table of "b" held the null block, and whether
/// "b" ran, always on the local prefix's blocks.
fn hang_past_local(loaded: u32) -> (Report, bool, bool) {
    let conn = Arc::new(HangPastLocal::default());
    let c = conn.clone();
    guarded("timed-out load past a local prefix", move || {
        let mut rt = Runtime::builder()
            .shards(1)
            .workers(1)
            .connector(c.clone())
            .shutdown_timeout(Duration::from_millis(100))
            .build()
            .unwrap();
        // "a" caches the prefix 0..96 (six blocks) and finishes.
        rt.submit(support::req("a", (0..100).collect(), 2)).unwrap();
        let mut a_done = false;
        let mut a_blocks: Vec<u64> = Vec::new();
        for _ in 0..100 {
            let plan = rt.schedule().expect("step");
            if let Some(s) = plan.scheduled.iter().find(|s| &*s.id == "a") {
                a_blocks = s.block_tables[0].iter().map(|b| b.id).collect();
            }
            a_done |= plan
                .ended
                .iter()
                .any(|(id, e)| &**id == "a" && *e == EndState::Finished);
            rt.update(StepOutput::all_sampled(&plan));
            if a_done {
                break;
            }
        }
        assert!(a_done, "a never finished");
        // "b" shares the first 64 tokens: 4 local blocks, the next `loaded` blocks loaded
        // (the last four tokens are computed).
        let prompt: Vec<u32> = (0..64).chain(1000..1004 + 16 * loaded).collect();
        rt.submit(SubmitRequest {
            // One the worker surely starts the load within (one taken after it is not run).
            load_deadline: Some(Duration::from_secs(1)),
            ..support::req("b", prompt, 2)
        })
        .unwrap();
        let plan = rt.schedule().expect("step");
        rt.update(StepOutput::all_sampled(&plan));
        wait_started(&c.started);
        // Past the deadline. From here "b" runs: every step that schedules it hands the
        // engine its table.
        std::thread::sleep(Duration::from_millis(1200));
        let mut null_seen = false;
        let mut prefix_kept = true;
        let mut b_ran = false;
        for _ in 0..20 {
            let plan = rt.schedule().expect("step");
            for s in plan.scheduled.iter().filter(|s| &*s.id == "b") {
                b_ran = true;
                null_seen |= s
                    .block_tables
                    .iter()
                    .flat_map(|t| t.iter())
                    .any(|b| b.id == 0);
                // The local prefix's four blocks are not the load's: they stay.
                let ids: Vec<u64> = s.block_tables[0].iter().map(|b| b.id).collect();
                prefix_kept &= ids.get(..4) == a_blocks.get(..4);
            }
            rt.update(StepOutput::all_sampled(&plan));
        }
        (rt.shutdown(), null_seen, b_ran && prefix_kept)
    })
}

#[test]
fn a_timed_out_load_past_a_local_prefix_leaves_no_hole_in_the_table() {
    let (report, null_seen, b_ran) = hang_past_local(2);
    assert!(b_ran, "b never ran on its local prefix's blocks: {report}");
    assert!(
        !null_seen,
        "b ran with the null block in its table: {report}"
    );
    assert!(report.metrics.deadlines_expired >= 1, "{report}");
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(report.census.conserved());
}

/// The blocks of a timed-out load are parked, and with them goes the request's claim on each
/// (set when the deadline's report rolled the request back): none stays with the request to
/// be handed off when it ends, since nobody waits on a parked block. An odd number of blocks,
/// so that forgetting the claims of the wrong blocks cannot come out even.
#[test]
fn a_timed_out_loads_parked_blocks_are_not_handed_off() {
    let (report, null_seen, b_ran) = hang_past_local(3);
    assert!(b_ran && !null_seen, "{report}");
    assert!(report.metrics.deadlines_expired >= 1, "{report}");
    assert!(
        report.ended_at_shutdown.is_empty() && report.cancelled_at_shutdown.is_empty(),
        "b finished before shutdown: {report}"
    );
    assert_eq!(report.metrics.handoffs, 0, "{report}");
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

/// Request "b" is offered its whole blocks asynchronously, once; the load never returns.
#[derive(Default)]
struct HangFirstLookup {
    offered: AtomicUsize,
    started: AtomicUsize,
}

impl KvConnector for HangFirstLookup {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let first = q.request == "b" && self.offered.fetch_add(1, Ordering::SeqCst) == 0;
        LookupResult {
            external_tokens: if first {
                (q.prompt.len() as u64 - 1) / 16 * 16
            } else {
                0
            },
            load_async: true,
        }
    }
    fn load(&self, _job: &LoadJob) -> LoadResult {
        hang(&self.started)
    }
}

/// A request whose timed-out load started at token 0 starts over: it takes no fresh blocks
/// for the parked positions (they would be freed at once), so it reclaims no cached block.
/// Here the pool is full: "b" holds three blocks (two loading, one to compute) and "a", the
/// same prompt computed while b's load hangs, left its two full blocks cached and one free.
/// When b starts over it must find a's blocks in the prefix cache.
#[test]
fn a_timed_out_load_from_token_zero_reclaims_no_cached_block() {
    let conn = Arc::new(HangFirstLookup::default());
    let c = conn.clone();
    let (report, a_blocks, b_tables) = guarded("timed-out load from token 0", move || {
        let mut rt = Runtime::builder()
            .shards(1)
            .workers(1)
            .pool_blocks(7) // six usable
            .connector(c.clone())
            .shutdown_timeout(Duration::from_millis(100))
            .build()
            .unwrap();
        let prompt: Vec<u32> = (0..36).collect();
        rt.submit(SubmitRequest {
            load_deadline: Some(Duration::from_secs(1)),
            ..support::req("b", prompt.clone(), 2)
        })
        .unwrap();
        let plan = rt.schedule().expect("step");
        rt.update(StepOutput::all_sampled(&plan));
        let t0 = wait_started(&c.started);
        rt.submit(support::req("a", prompt, 2)).unwrap();
        let mut a_done = false;
        let mut a_blocks: Vec<u64> = Vec::new();
        for _ in 0..20 {
            let plan = rt.schedule().expect("step");
            if let Some(s) = plan.scheduled.iter().find(|s| &*s.id == "a") {
                a_blocks = s.block_tables[0].iter().map(|b| b.id).collect();
            }
            a_done |= plan.ended.iter().any(|(id, _)| &**id == "a");
            rt.update(StepOutput::all_sampled(&plan));
            if a_done {
                break;
            }
        }
        assert!(a_done, "a never finished");
        // A few steps, well within b's 1 s deadline.
        assert_eq!(rt.metrics().deadlines_expired, 0, "b's deadline came first");
        std::thread::sleep(Duration::from_millis(1200).saturating_sub(t0.elapsed()));
        let mut b_tables = Vec::new();
        for _ in 0..20 {
            let plan = rt.schedule().expect("step");
            for s in plan.scheduled.iter().filter(|s| &*s.id == "b") {
                b_tables.push(s.block_tables[0].iter().map(|b| b.id).collect::<Vec<_>>());
            }
            rt.update(StepOutput::all_sampled(&plan));
        }
        (rt.shutdown(), a_blocks, b_tables)
    });
    assert!(report.metrics.deadlines_expired >= 1, "{report}");
    assert_eq!(a_blocks.len(), 3, "{report}");
    let first = b_tables.first().expect("b never ran after starting over");
    assert_eq!(
        first.get(..2),
        a_blocks.get(..2),
        "b started over without a's cached prefix: {report}"
    );
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

/// Offers every whole block of the prompt once, asynchronously (a request retrying finds
/// nothing); a load that started before its deadline sleeps until past it, then says it
/// succeeded.
#[derive(Default)]
struct OkPastDeadline {
    lookups: AtomicUsize,
    ran: AtomicUsize,
}

impl KvConnector for OkPastDeadline {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let first = self.lookups.fetch_add(1, Ordering::SeqCst) == 0;
        LookupResult {
            external_tokens: if first {
                (q.prompt.len() as u64 - 1) / 16 * 16 - q.local_tokens
            } else {
                0
            },
            load_async: true,
        }
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        let Some(deadline) = job.deadline else {
            return LoadResult::all_failed(job);
        };
        if Instant::now() < deadline {
            self.ran.fetch_add(1, Ordering::SeqCst);
        }
        while Instant::now() <= deadline + Duration::from_millis(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        LoadResult::Ok
    }
}

/// A load the worker finishes past its deadline has failed, whatever it returns — also when
/// its completion is already queued when the next step starts, which applies completions
/// before it expires deadlines: the request recomputes its prompt instead of running on the
/// load's blocks. (It was taken as landed: a connector that gives up on its deadline and says
/// `Ok` anyway, having written part of the blocks, had its bytes read.) Planted bug
/// `late-ok-accepted`.
#[test]
fn a_load_finished_past_its_deadline_fails_though_its_completion_comes_first() {
    let conn = Arc::new(OkPastDeadline::default());
    let c = conn.clone();
    let (report, first_chunk_from) = guarded("a load finished past its deadline", move || {
        let mut rt = Runtime::builder()
            .shards(1)
            .workers(1)
            .connector(c.clone())
            .build()
            .unwrap();
        rt.submit(SubmitRequest {
            // One the worker surely starts the load within (one taken after it is not run).
            load_deadline: Some(Duration::from_secs(1)),
            ..support::req("r", (0..65).collect(), 2)
        })
        .unwrap();
        let plan = rt.schedule().expect("step");
        assert!(plan.scheduled.is_empty(), "the request loads first");
        rt.update(StepOutput::all_sampled(&plan));
        // The load ends past its deadline; its completion is queued before the next step.
        let t0 = Instant::now();
        while rt.loads_in_flight() > 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the load never ended"
            );
            rt.wait_for_work(Duration::from_millis(10));
        }
        let mut first_chunk_from = None;
        for _ in 0..50 {
            let plan = rt.schedule().expect("step");
            if let Some(s) = plan.scheduled.iter().find(|s| &*s.id == "r") {
                first_chunk_from.get_or_insert(s.num_computed_tokens);
            }
            rt.update(StepOutput::all_sampled(&plan));
            if rt.live() == 0 {
                break;
            }
        }
        (rt.shutdown(), first_chunk_from)
    });
    assert_eq!(
        conn.ran.load(Ordering::SeqCst),
        1,
        "the worker started the load before its deadline"
    );
    let m = &report.metrics;
    assert_eq!(
        (m.loads_ok, m.loads_failed, m.deadlines_expired),
        (0, 1, 1),
        "{m:?}"
    );
    assert_eq!(m.finished, 1, "{m:?}");
    assert_eq!(
        first_chunk_from,
        Some(0),
        "the request ran on the late load's blocks"
    );
}
