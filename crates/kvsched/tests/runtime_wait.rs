//! An engine that waits whenever a plan schedules nothing (`wait_for_work`) is woken for
//! work a step leaves to the next one, not only for completions, submits and cancels:
//! blocks a request ending at its length cap frees while another waits for admission, blocks
//! a shard frees after another shard could not grow, a pool two shards' admissions raced for
//! and both gave back, and a stall across shards that the next steps resolve by preempting;
//! and a request that blocks parked for a late load hold back is not restarted again and
//! again, so the engine does wait.
//!
//! Once the scenario is set up no event comes (the connectors' loads, where there are any,
//! have returned or hang): an empty plan with live requests must itself say there is work
//! (`poll_work`), or the engine, waiting with no timeout, would sleep for good.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use kvsched::runtime::route::shard_of;
use kvsched::{CacheGroup, EndState, Runtime, StepOutput, SubmitRequest};

mod support;
use support::{guarded, req};

/// The engine loop: update, schedule, sample everything scheduled; on an empty plan with live
/// requests, `poll_work` must say there is work, and `wait_for_work` with no timeout returns.
/// `before` runs before every step (to submit). Returns every end and the empty plans seen.
fn drive(
    rt: &mut Runtime,
    mut before: impl FnMut(&mut Runtime, &kvsched::StepPlan),
) -> (Vec<(String, EndState)>, usize) {
    let mut ended = Vec::new();
    let mut empty = 0;
    let mut plan = rt.schedule().expect("step");
    for _ in 0..10_000 {
        ended.extend(plan.ended.iter().map(|(id, e)| (id.to_string(), *e)));
        rt.update(StepOutput::all_sampled(&plan));
        before(rt, &plan);
        if rt.live() == 0 {
            break;
        }
        if plan.scheduled.is_empty() {
            empty += 1;
            assert!(
                rt.poll_work(),
                "step {}: empty plan, {} live, and nothing says there is work",
                plan.step,
                rt.live()
            );
            assert!(rt.wait_for_work(Duration::MAX));
        }
        plan = rt.schedule().expect("step");
    }
    (ended, empty)
}

/// A request with no token limit grows until the pool is full and ends at its length cap
/// inside a step, after that step's admissions; the request waiting for those blocks is
/// admitted at the next step, which the engine is told to take.
#[test]
fn blocks_freed_at_a_length_cap_wake_the_engine_for_a_waiting_request() {
    for shards in [1, 2] {
        for waiter in ["B", "B1", "B2", "B3"] {
            let ended = guarded("length cap", move || {
                let mut rt = Runtime::builder()
                    .groups(vec![CacheGroup::full_attention(16)])
                    .pool_blocks(8) // 7 usable blocks: 112 tokens
                    .shards(shards)
                    .build()
                    .unwrap();
                rt.submit(req("A", vec![1; 16], 0)).unwrap();
                let mut submitted = false;
                let (ended, _) = drive(&mut rt, |rt, plan| {
                    // B needs 5 blocks; once A holds 5 of the 7, B waits for admission.
                    let grown = plan
                        .scheduled
                        .first()
                        .is_some_and(|s| s.num_computed_tokens >= 70);
                    if !submitted && grown {
                        rt.submit(req(waiter, vec![2; 64], 2)).unwrap();
                        submitted = true;
                    }
                });
                drop(rt.shutdown());
                ended
            });
            let mut ended = ended;
            ended.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(
                ended,
                [
                    ("A".to_owned(), EndState::Finished),
                    (waiter.to_owned(), EndState::Finished)
                ],
                "{shards} shards, waiter {waiter}"
            );
        }
    }
}

/// Two requests on two shards each hold part of the pool and cannot both grow: the runtime
/// preempts one after two steps in a row without progress. Those steps' plans are empty; the
/// engine is told to take them.
#[test]
fn a_stall_across_shards_wakes_the_engine_until_a_preemption_resolves_it() {
    let mut stalls_resolved = 0;
    for other in ["B", "B1", "B2", "B3"] {
        let (ended, preempted) = guarded("stall", move || {
            let mut rt = Runtime::builder()
                .groups(vec![CacheGroup::full_attention(16)])
                .pool_blocks(8) // 7 usable blocks; each request needs 5 at its full length
                .shards(2)
                .build()
                .unwrap();
            for id in ["A", other] {
                rt.submit(req(id, vec![id.len() as u32; 16], 60)).unwrap();
            }
            let (ended, _) = drive(&mut rt, |_, _| {});
            let report = rt.shutdown();
            assert!(report.violations.is_empty(), "{report}");
            (ended, report.metrics.cross_shard_preemptions)
        });
        assert_eq!(ended.len(), 2, "{other}: {ended:?}");
        assert!(ended.iter().all(|(_, e)| *e == EndState::Finished));
        stalls_resolved += preempted;
    }
    // Ids on two shards stall; a preemption across shards resolved each such stall.
    assert!(
        stalls_resolved > 0,
        "no pair of ids stalled: the scenario tests nothing"
    );
}

/// Requests on two shards share a small pool: one with no token limit grows until it cannot,
/// while the others run to their limits. When one ends, the blocks it frees let a running
/// request on the other shard grow at the next step (the shard that could not grow stepped
/// before the end): the engine is told to take it.
#[test]
fn blocks_freed_on_one_shard_wake_the_engine_for_a_request_running_on_another() {
    for ids in [
        ["A", "B", "C"],
        ["B", "A", "C"],
        ["A1", "B2", "C3"],
        ["B2", "A1", "C3"],
    ] {
        for limits in [[0, 40, 20], [0, 20, 60], [70, 0, 30]] {
            let ended = guarded("cross-shard growth", move || {
                let mut rt = Runtime::builder()
                    .groups(vec![CacheGroup::full_attention(16)])
                    .pool_blocks(9) // 8 usable blocks
                    .shards(2)
                    .build()
                    .unwrap();
                for (id, limit) in ids.iter().zip(limits) {
                    rt.submit(req(id, vec![id.len() as u32; 16], limit))
                        .unwrap();
                }
                let (ended, _) = drive(&mut rt, |_, _| {});
                let report = rt.shutdown();
                assert!(report.violations.is_empty(), "{report}");
                ended
            });
            assert_eq!(ended.len(), 3, "{ids:?} {limits:?}: {ended:?}");
        }
    }
}

/// Offers the prompt of requests named `L…` past its first block, asynchronously, at their
/// first lookup only; the load waits for the gate, then fails.
#[derive(Default)]
struct FailAtGate {
    gate: AtomicBool,
    offered: AtomicUsize,
}

impl KvConnector for FailAtGate {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let first = q.request.starts_with('L') && self.offered.fetch_add(1, Ordering::SeqCst) == 0;
        LookupResult {
            external_tokens: if first {
                (q.prompt.len() as u64 - 1) / 16 * 16
            } else {
                0
            },
            load_async: true,
        }
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        let t0 = Instant::now();
        while !self.gate.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(1));
        }
        LoadResult::all_failed(job)
    }
}

/// "R" runs on one shard and grows until the pool is full, while "L" loads 32 tokens into
/// blocks of its own; "W", urgent and too long for what is left, waits on L's shard. L's load
/// fails: its shard frees L's blocks and, with W first in its admission order, admits
/// nothing. When R's shard stepped first it could not grow in that step, and the plan is
/// empty: the freed blocks are work for the next step that no event announces, and the
/// engine must be told. Ids are tried in triples (their shards are the runtime's choice)
/// until that order happened.
#[test]
fn blocks_freed_by_a_failed_load_wake_the_engine_for_a_request_on_another_shard() {
    let unannounced = guarded("blocks freed by a failed load", || {
        let mut unannounced = 0;
        for (r, l, w) in
            (0..4).flat_map(|i| (0..4).flat_map(move |j| (0..3).map(move |k| (i, j, k))))
        {
            let (r, l, w) = (format!("R{r}"), format!("L{l}"), format!("W{w}"));
            let conn = Arc::new(FailAtGate::default());
            let mut rt = Runtime::builder()
                .groups(vec![CacheGroup::full_attention(16)])
                .pool_blocks(9) // 8 usable blocks
                .shards(2)
                .workers(1)
                .connector(conn.clone())
                .build()
                .unwrap();
            rt.submit(req(&r, vec![7; 16], 100)).unwrap();
            rt.submit(req(&l, (100..148).collect(), 4)).unwrap();
            // R grows until the pool is full (5 blocks besides L's 3): a plan without it.
            let mut plan = rt.schedule().unwrap();
            for _ in 0..200 {
                rt.update(StepOutput::all_sampled(&plan));
                plan = rt.schedule().unwrap();
                if plan.scheduled.is_empty() {
                    break;
                }
            }
            assert!(plan.scheduled.is_empty(), "{r}: R never filled the pool");
            rt.submit(SubmitRequest {
                priority: -1,
                ..req(&w, (200..312).collect(), 2)
            })
            .unwrap();
            plan = rt.schedule().unwrap();
            rt.update(StepOutput::all_sampled(&plan));
            conn.gate.store(true, Ordering::SeqCst);
            assert!(rt.wait_for_work(Duration::from_secs(30)), "the load's end");
            // The step that takes the failure in.
            let plan = rt.schedule().unwrap();
            if plan.scheduled.is_empty() {
                unannounced += 1;
                assert!(
                    rt.poll_work(),
                    "{r} {l} {w}: blocks freed, R unscheduled, and nothing says there is work"
                );
            }
            rt.update(StepOutput::all_sampled(&plan));
            let (ended, _) = drive(&mut rt, |_, _| {});
            let report = rt.shutdown();
            assert!(report.violations.is_empty(), "{report}");
            assert_eq!(ended.len(), 3, "{r} {l} {w}: {ended:?}");
            assert!(
                ended.iter().all(|(_, e)| *e == EndState::Finished),
                "{ended:?}"
            );
        }
        unannounced
    });
    // The order that leaves the freed blocks to the next step happened.
    assert!(
        unannounced > 0,
        "no ids put R's shard first: the scenario tests nothing"
    );
}

/// Offers the first lookup the prompt's full blocks as an asynchronous load that does not
/// return until the test lets it (later lookups: nothing); counts the loads started.
#[derive(Default)]
struct HangOnce {
    release: AtomicBool,
    offered: AtomicBool,
    started: AtomicUsize,
}

impl KvConnector for HangOnce {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let first = !self.offered.swap(true, Ordering::SeqCst);
        LookupResult {
            external_tokens: if first {
                (q.prompt.len() as u64 - 1) / 16 * 16
            } else {
                0
            },
            load_async: true,
        }
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        self.started.fetch_add(1, Ordering::SeqCst);
        let t0 = Instant::now();
        while !self.release.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        LoadResult::Ok
    }
}

/// A request whose growth the blocks parked for a late load hold back is preempted to let it
/// start over at most once: started over, it stops at the same place, and preempting it
/// again frees nothing anyone else could use — the engine is told to wait for the late load
/// instead (an engine that waits on empty plans sleeps), and the request finishes once the
/// load returns. Restarting it step after step would recompute its prefix for nothing while
/// the load hangs, and an engine waiting on empty plans would never sleep.
#[test]
fn a_request_parked_blocks_hold_back_waits_for_the_late_load_not_restarts_again_and_again() {
    for shards in [1, 2] {
        let mut done = false;
        for _ in 0..5 {
            let conn = Arc::new(HangOnce::default());
            let c = Arc::clone(&conn);
            let out = guarded("parked blocks hold a request back", move || {
                let mut rt = Runtime::builder()
                    .groups(vec![CacheGroup::full_attention(16)])
                    .pool_blocks(6) // 5 usable
                    .shards(shards)
                    .workers(1)
                    .settings(
                        kvsched::Settings::default()
                            .with_load_deadline(Some(Duration::from_millis(20))),
                    )
                    .connector(c.clone())
                    .build()
                    .unwrap();
                // 33 tokens: the load of 32 parks two blocks at its deadline; started over,
                // the request computes and grows to the three blocks left, short of the five
                // its 40 new tokens need.
                rt.submit(req("p", (0..33).collect(), 40)).unwrap();
                let mut slept = false;
                for _ in 0..2_000 {
                    let plan = rt.schedule().unwrap();
                    rt.update(StepOutput::all_sampled(&plan));
                    if plan.scheduled.is_empty() && !rt.wait_for_work(Duration::from_millis(500)) {
                        slept = true;
                        break;
                    }
                }
                let preemptions = rt.metrics().preemptions;
                let started = c.started.load(Ordering::SeqCst);
                c.release.store(true, Ordering::SeqCst);
                // The late load's return is the event the engine waits for.
                assert!(
                    rt.wait_for_work(Duration::from_secs(30)),
                    "the late load's return"
                );
                let (ended, _) = drive(&mut rt, |_, _| {});
                let report = rt.shutdown();
                assert!(report.violations.is_empty(), "{report}");
                (started, slept, preemptions, ended, report.metrics)
            });
            let (started, slept, preemptions, ended, m) = out;
            if started == 0 {
                continue; // the deadline passed before the worker took the load
            }
            assert!(
                slept,
                "{shards} shards: never told to wait ({preemptions} preemptions): {m:?}"
            );
            assert!(
                preemptions <= 1,
                "{shards} shards: {preemptions} preemptions: {m:?}"
            );
            assert!(m.late_load_stalls > 0, "{shards} shards: {m:?}");
            assert_eq!(
                ended,
                [("p".to_owned(), EndState::Finished)],
                "{shards} shards"
            );
            done = true;
            break;
        }
        assert!(
            done,
            "{shards} shards: in five runs the worker started no load in time"
        );
    }
}

/// Two shards stepping in parallel each admit a request that needs two thirds of an empty
/// pool. When both allocate at the same time each takes part of the pool, fails, and gives it
/// back: neither is admitted, and the plan is empty while the whole pool is free — work for
/// the next step that no event announces, and the engine must be told. The race needs both
/// shard threads running at once: allocations of 2,000 blocks meet in about a third of the
/// trials on an idle two-core machine, fewer on a loaded one (the count is printed). A trial
/// that does not race admits one request, a step like any other.
#[test]
fn two_shards_refused_by_their_own_race_wake_the_engine() {
    let raced = guarded("admissions racing", || {
        let mut raced = 0;
        for _ in 0..200 {
            let mut rt = Runtime::builder()
                .groups(vec![CacheGroup::full_attention(16)])
                .pool_blocks(3_001) // room for one request, not two
                .shards(2)
                .inline_steps_up_to(0)
                .parallel_step_work(0)
                .build()
                .unwrap();
            let a = "a".to_owned();
            let b = (0..)
                .map(|i| format!("b{i}"))
                .find(|b| shard_of(b, 2) != shard_of(&a, 2))
                .unwrap();
            for id in [&a, &b] {
                rt.submit(req(id, vec![3; 16 * 1_999], 1)).unwrap();
            }
            let plan = rt.schedule().unwrap();
            if plan.scheduled.is_empty() {
                raced += 1;
                assert!(
                    rt.poll_work(),
                    "both refused, the pool free, and nothing says there is work"
                );
            }
            drop(rt.shutdown());
        }
        raced
    });
    eprintln!("{raced} of 200 trials raced");
}
