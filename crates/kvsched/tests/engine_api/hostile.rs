//! Hostile connectors against the runtime, with the engine of `support` checking every
//! byte it reads: connectors that panic, hang, write after their deadline without asking
//! `may_write`, report other requests' blocks or nonsense generations, and offer more than
//! the prompt holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::hostile::*;
use crate::support::*;
use kvsched::{BlockRef, CacheGroup, MambaMode, Settings, StepOutput};

fn groups() -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(12),
        CacheGroup::sliding_window(8, 20),
        CacheGroup::mamba(24, MambaMode::Align),
    ]
}

/// Round 0 fills the tier honestly; round 1 runs `n` requests on the same prefixes through
/// the hostile connector on a fresh runtime. Returns the engine, the hostile connector and
/// round 1's report.
fn hostile_round(
    h: Hostility,
    settings: Settings,
    pool: usize,
    n: u32,
    async_ratio: f64,
    workers: usize,
) -> (Engine, Arc<Hostile>, kvsched::Report) {
    let g = groups();
    let mut eng = Engine::new(g.clone(), pool).memory_tier(async_ratio);
    let mut rt = builder(&g, pool)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    for i in 0..4u32 {
        eng.submit(&rt, &format!("w{i}"), prompt(i, 96, 900 + i, 110), 2);
    }
    assert!(eng.run_until_idle(&mut rt, Duration::from_secs(10)));
    eng.flush();
    assert_report_clean(&rt.shutdown(), pool);

    let hc = Hostile::new(eng.tier_conn.clone().unwrap(), h);
    eng.sync_conn = Some(hc.clone());
    let mut rt = builder(&g, pool)
        .workers(workers)
        .settings(settings)
        .connector(hc.clone())
        .build()
        .unwrap();
    for i in 0..n {
        eng.submit(
            &rt,
            &format!("h{i}"),
            prompt(i % 4, 96, i, 100 + (i as usize % 3) * 7),
            3,
        );
    }
    let ended = eng.run_until_idle(&mut rt, Duration::from_secs(20));
    hc.release.store(true, Ordering::SeqCst);
    assert!(ended, "requests never ended: {:?}", rt.metrics());
    let r = rt.shutdown();
    (eng, hc, r)
}

/// Positive control: a connector that says Ok without writing makes the engine read
/// poison, and the checker sees it (the runtime cannot: Ok is the connector's word).
#[test]
fn checker_catches_a_connector_that_lies_ok() {
    let h = Hostility {
        ok_without_writing: true,
        ..Default::default()
    };
    let (eng, _, r) = hostile_round(h, Settings::default(), 1024, 8, 0.5, 2);
    assert_report_clean(&r, 1024);
    assert!(
        !eng.tally.garbage_kept.is_empty(),
        "the checker missed poison a lying connector left"
    );
}

#[test]
fn connector_panics_everywhere_are_caught_and_counted() {
    let h = Hostility {
        panic_every: 3,
        ..Default::default()
    };
    let (eng, _, r) = hostile_round(h, Settings::default(), 1024, 16, 0.5, 2);
    eng.assert_clean();
    assert_report_clean(&r, 1024);
    assert_eq!(r.metrics.finished, 16, "{r}");
    assert!(
        r.metrics.connector_panics > 0 && r.metrics.lookup_panics > 0,
        "{:?}",
        r.metrics
    );
}

/// Failures naming other requests' blocks, an out-of-range id, the null block and older
/// generations of the load's own blocks: counted, nobody else rolled back, no garbage.
#[test]
fn foreign_and_stale_reports_roll_back_nobody_else() {
    let h = Hostility {
        foreign_reports: true,
        ..Default::default()
    };
    let (eng, _, r) = hostile_round(h, Settings::default(), 1024, 16, 1.0, 2);
    eng.assert_clean();
    assert_report_clean(&r, 1024);
    assert_eq!(r.metrics.finished, 16, "{r}");
    assert!(
        r.metrics.foreign_blocks + r.metrics.stale_blocks > 0,
        "{:?}",
        r.metrics
    );
    assert_eq!(r.metrics.handoffs, 0);
}

/// A lookup offering far more than the prompt holds (or u64::MAX): no panic, no garbage.
#[test]
fn offers_past_the_prompt_are_harmless() {
    for offer in [u64::MAX, 1 << 40, 1000] {
        let h = Hostility {
            offer: Some(offer),
            ..Default::default()
        };
        let (eng, _, r) = hostile_round(h, Settings::default(), 1024, 8, 0.5, 2);
        eng.assert_clean();
        assert_report_clean(&r, 1024);
        assert_eq!(r.metrics.finished, 8, "offer {offer}: {r}");
    }
}

/// Every load sleeps past its deadline, then scribbles over its destinations without
/// asking may_write: the blocks were parked, so nobody reads the scribbles.
#[test]
fn late_scribbling_load_never_reaches_a_reused_block() {
    let h = Hostility {
        sleep: Duration::from_millis(60),
        late_scribble: true,
        ..Default::default()
    };
    let s = Settings::default().with_load_deadline(Some(Duration::from_millis(10)));
    let (eng, hc, r) = hostile_round(h, s, 160, 24, 1.0, 2);
    eng.assert_clean();
    assert_report_clean(&r, 160);
    assert_eq!(r.metrics.finished, 24, "{r}");
    assert!(hc.loads_started.load(Ordering::SeqCst) > 0);
    assert!(
        r.metrics.deadlines_expired > 0 && r.metrics.late_completions > 0,
        "{:?}",
        r.metrics
    );
}

/// A hung load: an idle engine's `wait_for_work` with an hour's timeout returns by the
/// load's deadline; the request then computes and ends.
#[test]
fn wait_for_work_returns_by_the_load_deadline() {
    let g = groups();
    let pool = 512;
    let mut eng = seeded(&g, pool, one_seed());
    let hc = Hostile::new(
        eng.tier_conn.clone().unwrap(),
        Hostility {
            hang_until_released: true,
            ..Default::default()
        },
    );
    let deadline = Duration::from_millis(150);
    let mut rt = builder(&g, pool)
        .settings(Settings::default().with_load_deadline(Some(deadline)))
        .connector(hc.clone())
        .build()
        .unwrap();
    eng.submit(&rt, "hung", prompt(0, 96, 2, 100), 2);
    let mut waited = Vec::new();
    let start = Instant::now();
    while rt.live() > 0 && start.elapsed() < Duration::from_secs(10) {
        let plan = eng.step(&mut rt);
        if plan.scheduled.is_empty() && rt.live() > 0 {
            let t = Instant::now();
            rt.wait_for_work(Duration::from_secs(3600));
            waited.push(t.elapsed());
        }
    }
    hc.release.store(true, Ordering::SeqCst);
    assert_eq!(rt.live(), 0, "the request never ended");
    assert!(
        waited
            .iter()
            .all(|w| *w < deadline + Duration::from_secs(1)),
        "slept past the deadline: {waited:?}"
    );
    let r = rt.shutdown();
    eng.assert_clean();
    assert_report_clean(&r, pool);
    assert!(r.metrics.deadlines_expired >= 1, "{:?}", r.metrics);
}

/// A connector that never returns while shutdown runs: shutdown returns by its timeout,
/// abandons exactly the hung loads' destinations and accounts for every request.
#[test]
fn shutdown_abandons_a_hung_load_and_only_its_blocks() {
    let g = groups();
    let pool = 512;
    let mut eng = seeded(&g, pool, one_seed());
    let hc = Hostile::new(
        eng.tier_conn.clone().unwrap(),
        Hostility {
            hang_until_released: true,
            ..Default::default()
        },
    );
    let mut rt = builder(&g, pool)
        .workers(1)
        .shutdown_timeout(Duration::from_millis(300))
        .connector(hc.clone())
        .build()
        .unwrap();
    eng.submit(&rt, "hung", prompt(0, 96, 2, 100), 2);
    eng.submit(&rt, "queued", prompt(0, 96, 3, 100), 2);
    let start = Instant::now();
    while hc.loads_started.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(5) {
        let plan = eng.step(&mut rt);
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_millis(5));
        }
    }
    assert_eq!(hc.loads_started.load(Ordering::SeqCst), 1);
    let t = Instant::now();
    let r = rt.shutdown();
    let took = t.elapsed();
    hc.release.store(true, Ordering::SeqCst);
    assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
    assert_eq!(r.loads_abandoned, 1, "{r}");
    assert!(r.blocks_abandoned > 0 && r.blocks_abandoned as usize == r.abandoned_block_ids.len());
    assert_report_clean(&r, pool);
    assert_eq!(r.metrics.cancelled, 2, "{r}");
}

/// Workers stuck in loads that never return: the blocks held are bounded by the workers
/// stuck, so a request needing all the rest of the pool still runs.
#[test]
fn hung_workers_hold_only_their_own_loads_blocks() {
    let g = vec![CacheGroup::full_attention(16)];
    let pool = 64;
    let mut eng = Engine::new(g.clone(), pool).memory_tier(1.0);
    let mut rt = builder(&g, pool)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    for i in 0..4u32 {
        eng.submit(&rt, &format!("s{i}"), prompt(i, 160, i, 176), 1);
        assert!(eng.run_until_idle(&mut rt, Duration::from_secs(10)));
    }
    eng.flush();
    rt.shutdown();
    let hc = Hostile::new(
        eng.tier_conn.clone().unwrap(),
        Hostility {
            hang_until_released: true,
            ..Default::default()
        },
    );
    let s = Settings::default().with_load_deadline(Some(Duration::from_millis(30)));
    let mut rt = builder(&g, pool)
        .workers(1)
        .settings(s)
        .connector(hc.clone())
        .build()
        .unwrap();
    for i in 0..4u32 {
        eng.submit(&rt, &format!("h{i}"), prompt(i, 160, 10 + i, 176), 1);
    }
    let ok = eng.run_until_idle(&mut rt, Duration::from_secs(10));
    // One load hangs in the one worker (176 tokens: 11 blocks parked at most); the rest of
    // the pool (63 usable) must serve a 47-block request.
    eng.submit(&rt, "big", prompt(9, 0, 99, 47 * 16 - 4), 2);
    let ok2 = eng.run_until_idle(&mut rt, Duration::from_secs(10));
    let m = rt.metrics();
    hc.release.store(true, Ordering::SeqCst);
    assert!(ok, "hung loads kept requests from ending: {m:?}");
    assert!(
        ok2,
        "a request fitting the pool minus one hung load never ended: {m:?}"
    );
    let r = rt.shutdown();
    eng.assert_clean();
    assert_report_clean(&r, pool);
}

/// Cancels (from another thread) and engine finishes of requests whose loads are in flight:
/// they end once, their blocks come back, the others read no garbage.
#[test]
fn cancel_and_finish_mid_load() {
    let h = Hostility {
        sleep: Duration::from_millis(20),
        ..Default::default()
    };
    let g = groups();
    let pool = 1024;
    let mut eng = seeded(&g, pool, four(2));
    let hc = Hostile::new(eng.tier_conn.clone().unwrap(), h);
    let mut rt = builder(&g, pool).connector(hc.clone()).build().unwrap();
    for i in 0..12u32 {
        eng.submit(&rt, &format!("c{i}"), prompt(i % 4, 96, i, 100), 3);
    }
    let handle = rt.handle();
    let mut n = 0;
    let start = Instant::now();
    while rt.live() > 0 && start.elapsed() < Duration::from_secs(10) {
        n += 1;
        let plan = rt.schedule().unwrap();
        let (mut out, checks) = eng.run_plan(&plan);
        if n == 2 {
            let h2 = handle.clone();
            std::thread::spawn(move || {
                for i in (0..12).step_by(3) {
                    h2.cancel(&format!("c{i}"));
                }
            })
            .join()
            .unwrap();
            out.finished.extend(
                (1..12)
                    .step_by(3)
                    .map(|i| Arc::<str>::from(format!("c{i}"))),
            );
        }
        eng.answer(&mut rt, &plan, out, checks);
        if plan.scheduled.is_empty() && rt.live() > 0 {
            rt.wait_for_work(Duration::from_millis(5));
        }
    }
    let r = rt.shutdown();
    eng.assert_clean();
    assert_report_clean(&r, pool);
    assert_eq!(r.metrics.cancelled, 4, "{r}");
    assert_eq!(r.metrics.finished, 8, "{r}");
}

/// Submits racing shutdown from another thread: every accepted submit is accounted for.
#[test]
fn submits_racing_shutdown_are_never_lost() {
    let g = groups();
    let rt = builder(&g, 256).build().unwrap();
    let h = rt.handle();
    let t = std::thread::spawn(move || {
        let mut ok = 0u64;
        for i in 0..100_000u32 {
            match h.submit(kvsched::SubmitRequest {
                id: format!("x{i}"),
                prompt: vec![1, 2, 3],
                max_new_tokens: 1,
                priority: 0,
                load_deadline: None,
            }) {
                Ok(()) => ok += 1,
                Err(kvsched::RuntimeError::ShutDown) => return ok,
                Err(e) => panic!("{e}"),
            }
        }
        ok
    });
    std::thread::sleep(Duration::from_millis(20));
    let r = rt.shutdown();
    let ok = t.join().unwrap();
    assert_eq!(r.metrics.submitted, ok);
    assert_eq!(r.metrics.cancelled + r.metrics.finished, ok, "{r}");
    assert!(r.violations.is_empty());
}

/// An engine that reports sync-load failures naming blocks of requests that had no sync
/// load: counted as foreign, discards nothing, rolls back nobody.
#[test]
fn engine_naming_foreign_blocks_rolls_back_nobody() {
    let g = groups();
    let pool = 256;
    let mut eng = Engine::new(g.clone(), pool);
    let mut rt = builder(&g, pool).build().unwrap();
    for i in 0..4u32 {
        eng.submit(&rt, &format!("f{i}"), prompt(0, 48, i, 60), 4);
    }
    while rt.live() > 0 {
        let plan = rt.schedule().unwrap();
        assert!(
            plan.recovery.recovered.is_empty(),
            "step {} rolled back {:?}",
            plan.step,
            plan.recovery.recovered
        );
        let (mut out, checks) = eng.run_plan(&plan);
        for s in &plan.scheduled {
            for t in s.block_tables.iter() {
                out.invalid_blocks.extend(t.iter().copied());
            }
        }
        out.invalid_blocks.push(BlockRef {
            id: 1 << 31,
            generation: 7,
        });
        let discard = rt.update(out.clone());
        assert!(discard.is_empty(), "{discard:?}");
        let discard = rt.update(StepOutput {
            step: out.step,
            ..Default::default()
        });
        assert!(discard.is_empty());
        eng.answer(&mut rt, &plan, StepOutput::all_sampled(&plan), checks);
    }
    let r = rt.shutdown();
    eng.assert_clean();
    assert_report_clean(&r, pool);
    assert!(r.metrics.foreign_blocks > 0);
    assert_eq!(r.metrics.finished, 4);
}

/// A load that fills nothing and fails naming its own destinations at the wrong generation
/// (older or newer): the runtime cannot take those blocks as loaded.
#[test]
fn failed_async_load_naming_its_blocks_at_wrong_generations() {
    for delta in [1u32, u32::MAX, 1 << 31] {
        let h = Hostility {
            poison_misnamed: Some(delta),
            ..Default::default()
        };
        let (eng, _, r) = hostile_round(h, Settings::default(), 1024, 8, 1.0, 2);
        assert!(r.metrics.loads_failed > 0, "{:?}", r.metrics);
        eng.assert_clean();
        assert_report_clean(&r, 1024);
        assert_eq!(r.metrics.finished, 8, "{r}");
    }
}

/// A load that fills nothing and fails naming no block at all.
#[test]
fn failed_async_load_naming_no_block() {
    let h = Hostility {
        poison_fail_empty: true,
        ..Default::default()
    };
    let (eng, _, r) = hostile_round(h, Settings::default(), 1024, 8, 1.0, 2);
    assert!(r.metrics.loads_failed > 0, "{:?}", r.metrics);
    eng.assert_clean();
    assert_report_clean(&r, 1024);
    assert_eq!(r.metrics.finished, 8, "{r}");
}

/// Per-request load deadlines of zero, one nanosecond and `Duration::MAX`: a typed error or
/// a run where every request ends and nothing kept is wrong.
#[test]
fn per_request_deadlines_at_the_edges() {
    let g = groups();
    let pool = 1024;
    let mut eng = seeded(&g, pool, four(1));
    let hc = Hostile::new(
        eng.tier_conn.clone().unwrap(),
        Hostility {
            sleep: Duration::from_millis(5),
            ..Default::default()
        },
    );
    let mut rt = builder(&g, pool).connector(hc).build().unwrap();
    let mut accepted = 0;
    for (i, d) in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::MAX,
        Duration::from_secs(u64::MAX),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("d{i}");
        let p = prompt(i as u32 % 4, 96, 50 + i as u32, 100);
        eng.seqs.insert(id.clone(), Seq::new(p.clone()));
        match rt.submit(kvsched::SubmitRequest {
            id,
            prompt: p,
            max_new_tokens: 2,
            priority: 0,
            load_deadline: Some(d),
        }) {
            Ok(()) => accepted += 1,
            // A zero deadline is refused by name; every other one is accepted.
            Err(kvsched::RuntimeError::ZeroLoadDeadline(_)) => assert_eq!(d, Duration::ZERO),
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(
        eng.run_until_idle(&mut rt, Duration::from_secs(10)),
        "{:?}",
        rt.metrics()
    );
    let r = rt.shutdown();
    eng.assert_clean();
    assert_report_clean(&r, pool);
    assert_eq!(r.metrics.finished, accepted, "{r}");
}

/// Dropping a runtime without `shutdown` while a load hangs: the drop returns within about
/// the second it waits for workers.
#[test]
fn dropping_a_runtime_with_a_hung_load_returns() {
    let g = groups();
    let pool = 512;
    let mut eng = seeded(&g, pool, one_seed());
    let hc = Hostile::new(
        eng.tier_conn.clone().unwrap(),
        Hostility {
            hang_until_released: true,
            ..Default::default()
        },
    );
    let mut rt = builder(&g, pool).connector(hc.clone()).build().unwrap();
    eng.submit(&rt, "hung", prompt(0, 96, 2, 100), 2);
    let start = Instant::now();
    while hc.loads_started.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(5) {
        let plan = eng.step(&mut rt);
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_millis(5));
        }
    }
    assert_eq!(hc.loads_started.load(Ordering::SeqCst), 1);
    let t = Instant::now();
    drop(rt);
    let took = t.elapsed();
    hc.release.store(true, Ordering::SeqCst);
    assert!(took < Duration::from_secs(3), "drop took {took:?}");
}

/// An engine whose memory tier holds the chunks of `prompts` (id, tokens, tokens to
/// generate), saved by a first runtime that ran them to the end and shut down.
fn seeded(g: &[CacheGroup], pool: usize, prompts: Vec<(String, Vec<u32>, u32)>) -> Engine {
    let mut eng = Engine::new(g.to_vec(), pool).memory_tier(1.0);
    let mut rt = builder(g, pool)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    for (id, tokens, max_new) in prompts {
        eng.submit(&rt, &id, tokens, max_new);
    }
    assert!(eng.run_until_idle(&mut rt, Duration::from_secs(10)));
    eng.flush();
    rt.shutdown();
    eng
}

/// The seed prompt of the hung-load cases.
fn one_seed() -> Vec<(String, Vec<u32>, u32)> {
    vec![("seed".into(), prompt(0, 96, 1, 110), 1)]
}

/// Four prompts, `w0`–`w3`, each generating `max_new` tokens.
fn four(max_new: u32) -> Vec<(String, Vec<u32>, u32)> {
    (0..4u32)
        .map(|i| (format!("w{i}"), prompt(i, 96, 900 + i, 110), max_new))
        .collect()
}
