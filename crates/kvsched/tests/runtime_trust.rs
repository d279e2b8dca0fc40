//! What the runtime is told is intersected with what it handed out: a connector's failure
//! naming blocks outside its job, an engine's failed blocks outside the step's sync loads, and
//! samples for requests the step did not schedule to sample are counted and ignored — never
//! applied to another request. Counters mean one thing each.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvsched::connector::{
    InvalidBlocks, KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult,
};
use kvsched::{BlockRef, Metrics, Runtime, StepOutput, StepPlan, SubmitRequest};
use kvsched_testkit::SimEngine;

fn req(id: &str, prompt: Vec<u32>) -> SubmitRequest {
    SubmitRequest {
        id: id.into(),
        prompt,
        max_new_tokens: 4,
        priority: 0,
        load_deadline: None,
    }
}

/// Offers every prompt but its last 16 tokens as an async (or sync) load (none to requests
/// named `plain…`); `load` answers
/// with what `answer` makes of the job, and remembers every job.
struct Scripted {
    sync: bool,
    answer: fn(&LoadJob, &[BlockRef]) -> LoadResult,
    jobs: Mutex<Vec<LoadJob>>,
}

impl KvConnector for Scripted {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        if q.request.starts_with("plain") {
            return LookupResult::default();
        }
        LookupResult {
            external_tokens: (q.prompt.len() as u64).saturating_sub(16 + q.local_tokens),
            load_async: !self.sync,
        }
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        let mut jobs = self.jobs.lock().unwrap();
        let others: Vec<BlockRef> = jobs.iter().flat_map(|j| j.all_loaded_blocks()).collect();
        jobs.push(job.clone());
        (self.answer)(job, &others)
    }
}

/// Runs `rt` until nothing is live (at most `steps`), answering every plan honestly (sync
/// loads through the connector); returns the metrics and every plan.
fn drive(rt: &mut Runtime, conn: &Scripted, steps: usize) -> (Metrics, Vec<StepPlan>) {
    let mut out = StepOutput::default();
    let mut plans = Vec::new();
    let mut engine = SimEngine::with_connector(conn);
    for _ in 0..steps {
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        out = engine.step(&plan);
        plans.push(plan);
        if rt.live() == 0 {
            break;
        }
        rt.wait_for_work(Duration::from_millis(1));
    }
    (rt.metrics(), plans)
}

fn runtime(conn: Arc<Scripted>) -> Runtime {
    Runtime::builder()
        .shards(2)
        .workers(1)
        .connector(conn)
        .build()
        .unwrap()
}

#[test]
fn a_failure_naming_another_jobs_blocks_rolls_back_no_one_else() {
    // The second load names the first job's blocks (not its own) as failed.
    let conn = Arc::new(Scripted {
        sync: false,
        answer: |_, others| {
            if others.is_empty() {
                LoadResult::Ok
            } else {
                LoadResult::Failed(InvalidBlocks::Flat(others.to_vec()))
            }
        },
        jobs: Mutex::new(Vec::new()),
    });
    let mut rt = runtime(conn.clone());
    rt.submit(req("a", (0..96).collect())).unwrap();
    rt.submit(req("b", (1000..1096).collect())).unwrap();
    let (m, plans) = drive(&mut rt, &conn, 500);
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{report}");
    // One worker runs the loads one after the other: the first to run succeeds, every later
    // one names the earlier jobs' blocks, never its own.
    let jobs = conn.jobs.lock().unwrap();
    let lucky = jobs[0].request.clone();
    for p in &plans {
        assert!(
            p.recovery.recovered.iter().all(|r| r.id != lucky),
            "{lucky} rolled back by another load's report"
        );
    }
    assert!(m.foreign_blocks > 0, "{m:?}");
    assert!(m.loads_failed >= 1, "{m:?}");
    let unlucky: Vec<_> = plans.iter().flat_map(|p| &p.recovery.recovered).collect();
    assert!(!unlucky.is_empty());
    for r in unlucky {
        assert_eq!(
            r.decision.num_computed_tokens, 0,
            "the whole load failed: {r:?}"
        );
    }
    assert_eq!(report.metrics.finished, 2);
}

#[test]
fn engine_failures_outside_the_steps_sync_loads_and_stray_samples_are_ignored() {
    let conn = Arc::new(Scripted {
        sync: true,
        answer: |_, _| LoadResult::Ok,
        jobs: Mutex::new(Vec::new()),
    });
    // 32 tokens per shard per step: a 200-token prompt computed locally takes several steps
    // and samples only in its last.
    let mut rt = Runtime::builder()
        .shards(2)
        .workers(1)
        .token_budget(64)
        .connector(conn.clone())
        .build()
        .unwrap();
    rt.submit(req("loads", (0..96).collect())).unwrap();
    rt.submit(req("plain", (500..700).collect())).unwrap();
    let plan = rt.schedule().expect("step");
    let loads = plan
        .scheduled
        .iter()
        .find(|s| &*s.id == "loads")
        .expect("loads");
    let plain = plan
        .scheduled
        .iter()
        .find(|s| &*s.id == "plain")
        .expect("plain");
    assert!(loads.sync_load.is_some() && plain.sync_load.is_none());
    assert!(
        !plain.samples,
        "a prefill below the prompt's end samples nothing"
    );
    // The engine claims a block no sync load of the step wrote failed, and sends a sample
    // for "plain", which was not scheduled to sample.
    let mut out = StepOutput::for_plan(&plan);
    out.sampled.push("plain".into());
    if loads.samples {
        out.sampled.push("loads".into());
    }
    out.invalid_blocks.push(BlockRef {
        id: 1_000_000,
        generation: 0,
    });
    rt.update(out);
    let next = rt.schedule().expect("step");
    assert!(next.recovery.recovered.is_empty(), "nobody rolled back");
    let m = rt.metrics();
    assert_eq!(m.unexpected_samples, 1);
    assert_eq!(m.foreign_blocks, 1);
    assert_eq!((m.sync_loads_ok, m.sync_loads_failed), (1, 0));
    drop(rt.shutdown());
}

#[test]
fn a_failed_sync_load_is_counted_as_one() {
    let conn = Arc::new(Scripted {
        sync: true,
        answer: |job, _| LoadResult::Failed(InvalidBlocks::Flat(job.all_loaded_blocks())),
        jobs: Mutex::new(Vec::new()),
    });
    let mut rt = runtime(conn.clone());
    rt.submit(req("s", (0..96).collect())).unwrap();
    let (m, _) = drive(&mut rt, &conn, 500);
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{report}");
    assert!(m.sync_loads_failed >= 1, "{m:?}");
    assert_eq!(m.foreign_blocks, 0);
    assert_eq!(report.metrics.finished, 1);
}

#[test]
fn an_always_failing_connector_reports_no_phantom_handoffs_or_stale_blocks() {
    let conn = Arc::new(Scripted {
        sync: false,
        answer: |job, _| LoadResult::Failed(InvalidBlocks::Flat(job.all_loaded_blocks())),
        jobs: Mutex::new(Vec::new()),
    });
    let mut rt = runtime(conn.clone());
    for i in 0..20u32 {
        rt.submit(req(&format!("r{i}"), (i * 1000..i * 1000 + 96).collect()))
            .unwrap();
    }
    let (m, _) = drive(&mut rt, &conn, 2_000);
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.metrics.finished, 20);
    assert!(m.loads_failed >= 20, "{m:?}");
    // Nobody shares a block, so nobody waits and no block is handed to anyone.
    assert_eq!(m.handoffs, 0, "{m:?}");
    assert_eq!(m.stale_blocks, 0, "{m:?}");
}

/// A load that starts past a prefix the device already holds (written by an earlier request,
/// not by the load) and fails naming none of its own blocks fails the whole load — its own
/// blocks, from its start on — and nothing below: the request resumes at the load's start.
#[test]
fn a_failed_load_past_a_local_prefix_rolls_back_its_own_blocks_only() {
    let conn = Arc::new(Scripted {
        sync: false,
        // Names only a block no job has: none of its own.
        answer: |_, _| {
            LoadResult::Failed(InvalidBlocks::Flat(vec![BlockRef {
                id: 1_000_000,
                generation: 0,
            }]))
        },
        jobs: Mutex::new(Vec::new()),
    });
    let mut rt = Runtime::builder()
        .shards(1)
        .workers(1)
        .connector(conn.clone())
        .build()
        .unwrap();
    // `plain-a` computes the first 96 tokens; `b` finds them in the prefix cache and loads the
    // rest.
    rt.submit(req("plain-a", (0..96).collect())).unwrap();
    let (_, mut plans) = drive(&mut rt, &conn, 500);
    rt.submit(req("b", (0..192).collect())).unwrap();
    let (m, more) = drive(&mut rt, &conn, 500);
    plans.extend(more);
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{report}");
    let jobs = conn.jobs.lock().unwrap();
    let load = jobs.first().expect("b loaded");
    assert_eq!(
        load.start_tokens, 96,
        "the load starts past the local prefix"
    );
    let rolled: Vec<_> = plans
        .iter()
        .flat_map(|p| &p.recovery.recovered)
        .filter(|r| &*r.id == "b")
        .collect();
    let first = rolled.first().expect("b's failed load rolled back");
    assert_eq!(
        first.decision.num_computed_tokens, 96,
        "back to the load's start, the prefix kept: {first:?} ({m:?})"
    );
    assert_eq!(report.metrics.finished, 2);
}

/// The plan's sampling entries' ids, in plan order (as an engine answering honestly sends).
fn sampling(plan: &StepPlan) -> Vec<std::sync::Arc<str>> {
    plan.scheduled
        .iter()
        .filter(|s| s.samples)
        .map(|s| s.id.clone())
        .collect()
}

/// The counters of samples and commands that were not applied as sent: duplicates,
/// samples for requests not scheduled to sample, ids naming no live request.
fn sample_counts(m: &Metrics) -> (u64, u64, u64) {
    (
        m.duplicate_commands,
        m.unexpected_samples,
        m.unknown_commands,
    )
}

#[test]
fn samples_as_planned_apply_at_once_and_others_one_by_one() {
    for shards in [1, 2] {
        let mut rt = Runtime::builder().shards(shards).build().unwrap();
        for id in ["a", "b", "c"] {
            rt.submit(req(id, (0..8).map(|t| t + id.len() as u32).collect()))
                .unwrap();
        }
        // Honest answers, the plan's own ids in its order: every request decodes, and
        // nothing is counted twice or as unexpected.
        let mut plan = rt.schedule().expect("step");
        for _ in 0..2 {
            let ids = sampling(&plan);
            assert_eq!(ids.len(), 3, "{shards} shards: all three sample");
            rt.update(StepOutput {
                sampled: ids,
                ..StepOutput::for_plan(&plan)
            });
            plan = rt.schedule().expect("step");
        }
        let m = rt.metrics();
        assert_eq!(sample_counts(&m), (0, 0, 0), "{shards} shards: {m:?}");
        // As many samples as planned, but not the plan's: the first id twice, the last left
        // out. Only what was sent counts: one duplicate, and the request left out takes no
        // token — its step is taken as lost and offered again where it started, asking for
        // the sample once more.
        let ids = sampling(&plan);
        let (first, last) = (ids[0].clone(), ids[2].clone());
        let computed_before: u64 = plan
            .scheduled
            .iter()
            .find(|s| s.id == last)
            .map(|s| s.num_computed_tokens + s.num_tokens)
            .expect("last");
        rt.update(StepOutput {
            sampled: vec![first.clone(), first.clone(), ids[1].clone()],
            ..StepOutput::for_plan(&plan)
        });
        let next = rt.schedule().expect("step");
        let m = rt.metrics();
        assert_eq!(m.duplicate_commands, 1, "{shards} shards: {m:?}");
        assert_eq!(m.missing_samples, 1, "{shards} shards: {m:?}");
        let left_out = next.scheduled.iter().find(|s| s.id == last);
        assert!(
            left_out.is_some_and(
                |s| s.samples && s.num_computed_tokens + s.num_tokens == computed_before
            ),
            "{shards} shards: {last} is not asked for its sample again: {left_out:?}"
        );
        // The same texts in other allocations, in another order: each looked up by id.
        let ids: Vec<std::sync::Arc<str>> = sampling(&next)
            .iter()
            .rev()
            .map(|id| std::sync::Arc::from(&**id))
            .collect();
        assert!(!ids.is_empty());
        rt.update(StepOutput {
            sampled: ids,
            ..StepOutput::for_plan(&next)
        });
        rt.schedule().expect("step");
        let m = rt.metrics();
        assert_eq!(sample_counts(&m), (1, 0, 0), "{shards} shards: {m:?}");
        drop(rt.shutdown());
    }
}

/// An output that leaves out a sample its plan asked for (an engine that dropped a request
/// from its batch, or lost its token) says nothing about whether the request ran: the
/// request's step is lost, and offered again, so it is asked for the sample once more —
/// never left with every token computed and no sample to come, which no later step would
/// schedule (the engine, told there is no work, would sleep). Every request ends with
/// exactly its tokens, on one or two shards, dense or with a Mamba group (whose state the
/// step may have advanced in place: restarted rather than re-offered), whichever of its
/// samples is left out — the prompt's or a decode step's, once or twice.
#[test]
fn a_left_out_sample_is_asked_for_again() {
    use kvsched::{CacheGroup, EndState, MambaMode};
    let hybrid = || {
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(32, MambaMode::Align),
        ]
    };
    for shards in [1, 2] {
        for groups in [vec![CacheGroup::full_attention(16)], hybrid()] {
            // (request, which of its samples) left out.
            for omit in [
                &[("a", 0)][..],
                &[("a", 1)],
                &[("b", 0), ("b", 0), ("a", 2)],
            ] {
                let case = format!("{shards} shards, {} groups, omit {omit:?}", groups.len());
                let mut rt = Runtime::builder()
                    .groups(groups.clone())
                    .pool_blocks(64)
                    .shards(shards)
                    .build()
                    .unwrap();
                for (id, len) in [("a", 40), ("b", 70)] {
                    rt.submit(req(id, (0..len).collect())).unwrap();
                }
                let mut to_omit = omit.to_vec();
                let mut sent = std::collections::HashMap::<String, u64>::new();
                let mut ended = Vec::new();
                for _ in 0..200 {
                    let plan = rt.schedule().expect("step");
                    ended.extend(plan.ended.iter().map(|(id, e)| (id.to_string(), *e)));
                    let mut out = StepOutput::for_plan(&plan);
                    for s in plan.scheduled.iter().filter(|s| s.samples) {
                        let n = sent.entry(s.id.to_string()).or_default();
                        if let Some(i) = to_omit.iter().position(|&(id, k)| *s.id == *id && k == *n)
                        {
                            to_omit.remove(i);
                        } else {
                            *n += 1;
                            out.sampled.push(s.id.clone());
                        }
                    }
                    rt.update(out);
                    if rt.live() == 0 {
                        break;
                    }
                    if plan.scheduled.is_empty() {
                        assert!(
                            rt.poll_work(),
                            "{case}: step {}: live requests and no work",
                            plan.step
                        );
                    }
                }
                ended.sort_by(|x, y| x.0.cmp(&y.0));
                assert_eq!(
                    ended,
                    [
                        ("a".to_owned(), EndState::Finished),
                        ("b".to_owned(), EndState::Finished)
                    ],
                    "{case}"
                );
                assert!(to_omit.is_empty(), "{case}: never asked for {to_omit:?}");
                assert_eq!(sent["a"], 4, "{case}: tokens of a");
                assert_eq!(sent["b"], 4, "{case}: tokens of b");
                let report = rt.shutdown();
                assert!(report.violations.is_empty(), "{case}: {report}");
                assert_eq!(report.metrics.missing_samples, omit.len() as u64, "{case}");
            }
        }
    }
}
