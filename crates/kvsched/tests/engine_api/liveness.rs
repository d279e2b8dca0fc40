//! Liveness against an engine that sleeps whenever a plan is empty (with an hour's timeout):
//! a pool held by parked blocks of late loads, pools split across shards, loads ended by a
//! cancel while their worker still writes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::support::hostile::*;
use crate::support::*;
use kvsched::{CacheGroup, Runtime, Settings};

/// Steps with an engine that waits for work with an hour's timeout whenever a plan schedules
/// nothing; a watchdog submits a no-op request after `limit` so a wait that never returns
/// still ends the test. Returns whether everything ended before the watchdog fired.
fn run_sleepy(eng: &mut Engine, rt: &mut Runtime, limit: Duration) -> bool {
    let dog = Watchdog::start(rt.handle(), limit);
    while rt.live() > 0 && !dog.fired() {
        let plan = eng.step(rt);
        if plan.scheduled.is_empty() && rt.live() > 0 {
            rt.wait_for_work(Duration::from_secs(3600));
        }
    }
    !dog.fired()
}

fn seeded_engine(groups: &[CacheGroup], pool: usize, prompts: &[Vec<u32>]) -> Engine {
    let mut eng = Engine::new(groups.to_vec(), pool).memory_tier(1.0);
    let mut rt = builder(groups, pool)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    for (i, p) in prompts.iter().enumerate() {
        eng.submit(&rt, &format!("seed{i}"), p.clone(), 1);
        assert!(eng.run_until_idle(&mut rt, Duration::from_secs(10)));
    }
    eng.flush();
    assert_report_clean(&rt.shutdown(), pool);
    eng
}

/// A late load's parked blocks are what a waiting request needs: the engine sleeps, and
/// the late completion landing must wake it.
#[test]
fn late_completion_wakes_an_engine_waiting_on_parked_blocks() {
    let g = vec![CacheGroup::full_attention(16)];
    let pool = 24;
    let a_prompt = prompt(1, 0, 1, 176);
    let mut eng = seeded_engine(&g, pool, &[a_prompt[..160].to_vec()]);
    let hc = Hostile::new(
        eng.tier_conn.clone().unwrap(),
        Hostility {
            sleep: Duration::from_millis(400),
            ..Default::default()
        },
    );
    let s = Settings::default().with_load_deadline(Some(Duration::from_millis(30)));
    let mut rt = builder(&g, pool)
        .settings(s)
        .connector(hc.clone())
        .build()
        .unwrap();
    eng.submit(&rt, "a", a_prompt, 1);
    let start = Instant::now();
    while rt.metrics().deadlines_expired == 0 && start.elapsed() < Duration::from_secs(5) {
        let plan = eng.step(&mut rt);
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_millis(5));
        }
    }
    assert_eq!(rt.metrics().deadlines_expired, 1, "the load never expired");
    // 15 blocks: more than the pool has while the 10 parked blocks are held.
    eng.submit(&rt, "b", prompt(2, 0, 2, 240), 1);
    let t = Instant::now();
    let ok = run_sleepy(&mut eng, &mut rt, Duration::from_secs(5));
    let took = t.elapsed();
    let m = rt.metrics();
    let r = rt.shutdown();
    assert!(ok, "the engine slept past the late completion: {m:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    eng.assert_clean();
    assert_report_clean(&r, pool);
    assert_eq!(r.metrics.finished, 2, "{r}");
    assert!(r.metrics.late_completions >= 1, "{:?}", r.metrics);
    if std::env::var("COLD_VERBOSE").is_ok() {
        eprintln!("{:?} took {took:?}", r.metrics);
    }
}

/// Two shards, each holding part of a small pool, every request growing: the runtime
/// preempts across shards, the sleepy engine is woken, and all end.
#[test]
fn pool_split_across_shards_never_stalls() {
    for shards in [2usize, 3, 4] {
        let g = vec![CacheGroup::full_attention(16)];
        let pool = 40;
        let mut eng = Engine::new(g.clone(), pool);
        let mut rt = builder(&g, pool)
            .shards(shards)
            .inline_steps_up_to(0)
            .parallel_step_work(0)
            .build()
            .unwrap();
        for i in 0..12u32 {
            eng.submit(
                &rt,
                &format!("g{i}"),
                prompt(i, 0, i, 100 + i as usize * 9),
                150,
            );
        }
        let ok = run_sleepy(&mut eng, &mut rt, Duration::from_secs(10));
        let m = rt.metrics();
        let r = rt.shutdown();
        assert!(ok, "{shards} shards: stalled: {m:?}");
        eng.assert_clean();
        assert_report_clean(&r, pool);
        assert_eq!(r.metrics.finished, 12, "{r}");
        assert_eq!(r.metrics.no_progress_steps, 0, "{:?}", r.metrics);
        if std::env::var("COLD_VERBOSE").is_ok() {
            eprintln!("{shards} shards: {:?}", r.metrics);
        }
    }
}

/// Requests cancelled while their loads sleep and then scribble over their destinations
/// without asking `may_write` (no deadline): the blocks stay held until the load returns,
/// so requests admitted meanwhile on a tight pool read none of the scribbles.
#[test]
fn cancelled_loads_scribbling_late_reach_no_one_else() {
    let g = vec![CacheGroup::full_attention(16)];
    let pool = 48;
    let shared: Vec<Vec<u32>> = (0..4).map(|i| prompt(i, 0, 50 + i, 160)).collect();
    let mut eng = seeded_engine(&g, pool, &shared);
    let h = Hostility {
        sleep: Duration::from_millis(80),
        late_scribble: true,
        ..Default::default()
    };
    let hc = Hostile::new(eng.tier_conn.clone().unwrap(), h);
    let s = Settings::default().with_load_deadline(None);
    let mut rt = builder(&g, pool)
        .workers(4)
        .settings(s)
        .connector(hc.clone())
        .build()
        .unwrap();
    for (i, p) in shared.iter().enumerate() {
        let mut p = p.clone();
        p.extend([7, 7, 7]);
        eng.submit(&rt, &format!("x{i}"), p, 2);
    }
    let start = Instant::now();
    while hc.loads_started.load(Ordering::SeqCst) < 4 && start.elapsed() < Duration::from_secs(5) {
        let plan = eng.step(&mut rt);
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_millis(2));
        }
    }
    for i in 0..4 {
        rt.cancel(&format!("x{i}"));
    }
    for i in 0..10u32 {
        eng.submit(&rt, &format!("y{i}"), prompt(9, 0, 100 + i, 60), 3);
    }
    let ok = run_sleepy(&mut eng, &mut rt, Duration::from_secs(10));
    let r = rt.shutdown();
    assert!(ok);
    eng.assert_clean();
    assert_report_clean(&r, pool);
    assert_eq!(r.metrics.cancelled, 4, "{r}");
    assert_eq!(r.metrics.finished, 10, "{r}");
}

/// Four threads submitting and cancelling through handles while the engine steps, loads
/// running on a tier: every accepted submit ends exactly once, nothing kept reads a wrong
/// byte, and the engine's sleeps are always woken.
#[test]
fn handles_on_many_threads_while_the_engine_steps() {
    let g = vec![
        CacheGroup::full_attention(12),
        CacheGroup::sliding_window(8, 20),
        CacheGroup::mamba(24, kvsched::MambaMode::All),
    ];
    let pool = 128;
    let shared: Vec<Vec<u32>> = (0..3).map(|i| prompt(i, 72, 500 + i, 80)).collect();
    let mut eng = seeded_engine(&g, pool, &shared);
    let mut rt = builder(&g, pool)
        .shards(3)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    // The engine must know each prompt to check bytes: register them all up front.
    for t in 0..4u32 {
        for i in 0..60u32 {
            eng.seqs.insert(
                format!("t{t}-{i}"),
                Seq::new(prompt(i % 3, 72, t * 1000 + i, 80 + (i as usize % 7))),
            );
        }
    }
    let reqs: Vec<Vec<kvsched::SubmitRequest>> = (0..4u32)
        .map(|t| {
            (0..60u32)
                .map(|i| {
                    let id = format!("t{t}-{i}");
                    kvsched::SubmitRequest {
                        prompt: eng.seqs[&id].prompt.clone(),
                        id,
                        max_new_tokens: 3,
                        priority: (i % 3) as i16,
                        load_deadline: None,
                    }
                })
                .collect()
        })
        .collect();
    let threads: Vec<_> = reqs
        .into_iter()
        .enumerate()
        .map(|(t, rs)| {
            let h = rt.handle();
            std::thread::spawn(move || {
                for (i, r) in rs.into_iter().enumerate() {
                    let id = r.id.clone();
                    h.submit(r).unwrap();
                    if i % 5 == t % 5 {
                        std::thread::sleep(Duration::from_micros(300));
                        h.cancel(&id);
                    }
                }
            })
        })
        .collect();
    let dog = Watchdog::start(rt.handle(), Duration::from_secs(15));
    let mut idle_rounds = 0;
    while !dog.fired() {
        let plan = eng.step(&mut rt);
        if rt.live() == 0 {
            if threads.iter().all(|t| t.is_finished()) {
                idle_rounds += 1;
                if idle_rounds > 3 {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        } else if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_secs(3600));
        }
    }
    assert!(!dog.fired(), "stalled: {:?}", rt.metrics());
    for t in threads {
        t.join().unwrap();
    }
    let r = rt.shutdown();
    eng.assert_clean();
    assert_report_clean(&r, pool);
    assert_eq!(r.metrics.submitted, 240);
    assert!(r.metrics.cancelled > 0 && r.metrics.finished > 0, "{r}");
}

/// A request without a token limit ends at its length cap after the step's admissions,
/// freeing the pool another request waits for: the sleeping engine is woken at once.
#[test]
fn length_cap_frees_the_pool_for_a_waiter_and_wakes_the_engine() {
    for (groups, waiter_len) in [
        (vec![CacheGroup::full_attention(16)], 272),
        (
            vec![
                CacheGroup::full_attention(12),
                CacheGroup::sliding_window(8, 20),
            ],
            80,
        ),
    ] {
        let pool = 20;
        let mut eng = Engine::new(groups.clone(), pool);
        let mut rt = builder(&groups, pool).shards(2).build().unwrap();
        eng.submit(&rt, "capped", prompt(0, 0, 1, 40), 0);
        eng.step(&mut rt);
        eng.submit(&rt, "waiter", prompt(0, 0, 2, waiter_len), 1);
        let t = Instant::now();
        let ok = run_sleepy(&mut eng, &mut rt, Duration::from_secs(5));
        let took = t.elapsed();
        let r = rt.shutdown();
        assert!(ok, "slept with work to do");
        assert!(took < Duration::from_secs(2), "{took:?}");
        eng.assert_clean();
        assert_report_clean(&r, pool);
        assert_eq!(r.metrics.length_capped, 1, "{r}");
        assert_eq!(r.metrics.finished, 2, "{r}");
    }
}
