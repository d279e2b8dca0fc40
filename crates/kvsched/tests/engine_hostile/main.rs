//! A hostile and careless engine on the public API, over a connector that fails in every way
//! a connector can (see `harness`): no kept output reads a byte a failed or unfinished load
//! left, no plan hands a block out twice or exceeds its budgets, no wait sleeps past work,
//! and every request ends exactly once, reported, with its tokens.

mod connector;
mod harness;
mod sweep;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use connector::{tag, Act};
use harness::*;
use kvsched::connector::KvConnector;
use kvsched::{CacheGroup, EndState, RuntimeError, Settings};

#[test]
fn mixed_faults_never_read_garbage() {
    for (shards, sloppy) in [(1, false), (2, false), (1, true), (2, true)] {
        for asyncl in [true, false] {
            let mut e = engine(
                vec![
                    CacheGroup::full_attention(4),
                    CacheGroup::sliding_window(4, 6),
                ],
                400,
                shards,
                asyncl,
                Settings::default(),
                |job| match (job.request.len() + job.attempt as usize + job.start_tokens as usize)
                    % 5
                {
                    0 => Act::FailAll,
                    1 => Act::FailHalf,
                    2 => Act::FailForeign,
                    3 => Act::Panic,
                    _ => Act::Ok,
                },
            );
            e.sloppy = sloppy;
            let mut n = 0;
            for round in 0..30u32 {
                for i in 0..4u32 {
                    let id = format!("r{round}-{i}{}", "x".repeat((round % 3) as usize));
                    e.submit(&id, shared_prompt(round % 3, i, 10 + (i as usize * 5)), 3)
                        .unwrap();
                    n += 1;
                }
                for _ in 0..3 {
                    e.step().unwrap();
                }
            }
            e.run_to_end(5000);
            let t = finish_checks(e, n);
            eprintln!(
                "shards {shards} async {asyncl}: discarded {}",
                t.garbage_discarded
            );
        }
    }
}

#[test]
fn hybrid_mamba_geometries_never_read_garbage() {
    use kvsched::MambaMode;
    let geos = [
        vec![
            CacheGroup::full_attention(4),
            CacheGroup::mamba(4, MambaMode::Align),
        ],
        vec![
            CacheGroup::full_attention(4),
            CacheGroup::mamba(4, MambaMode::All),
        ],
        vec![
            CacheGroup::full_attention(4),
            CacheGroup::sliding_window(4, 5),
            CacheGroup::mamba(8, MambaMode::All),
        ],
    ];
    for geo in geos {
        for asyncl in [true, false] {
            let mut e = engine(geo.clone(), 600, 2, asyncl, Settings::default(), faulty);
            let mut n = 0;
            for round in 0..20u32 {
                for i in 0..3u32 {
                    let id = format!("m{round}-{i}{}", "y".repeat((round % 4) as usize));
                    e.submit(&id, shared_prompt(round % 3, i, 17 + (i as usize * 7)), 3)
                        .unwrap();
                    n += 1;
                }
                for _ in 0..3 {
                    e.step().unwrap();
                }
            }
            e.sloppy = true;
            e.run_to_end(5000);
            finish_checks(e, n);
        }
    }
}

#[test]
fn switching_vllm_to_safe_recovers_what_vllm_shared() {
    use kvsched::MambaMode;
    let geos = [
        fa(),
        vec![
            CacheGroup::full_attention(4),
            CacheGroup::sliding_window(4, 5),
        ],
        vec![
            CacheGroup::full_attention(4),
            CacheGroup::mamba(4, MambaMode::Align),
        ],
    ];
    for geo in geos {
        for (shards, asyncl) in [(1, false), (2, false), (2, true)] {
            let s = Settings::default().with_mode(kvsched::Mode::Vllm);
            let mut e = engine(geo.clone(), 600, shards, asyncl, s, faulty);
            e.exact_kernels = true;
            let mut n = 0;
            for round in 0..24u32 {
                let vllm = round % 8 < 4;
                let mode = if vllm {
                    kvsched::Mode::Vllm
                } else {
                    kvsched::Mode::Safe
                };
                e.rt.update_settings(e.rt.settings().with_mode(mode))
                    .unwrap();
                for i in 0..3u32 {
                    let id = format!("v{round}-{i}{}", "z".repeat((round % 2) as usize));
                    e.submit(&id, shared_prompt(round % 2, i, 14 + (i as usize * 5)), 4)
                        .unwrap();
                    n += 1;
                }
                for k in 0..4 {
                    // The first safe step after a switch may still run what vllm planned.
                    e.judge = !vllm && (round % 8 != 4 || k > 0);
                    e.step().unwrap();
                }
            }
            e.judge = true;
            e.run_to_end(5000);
            finish_checks(e, n);
        }
    }
}

#[test]
fn waiting_for_good_on_empty_plans_never_sleeps_with_work() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use kvsched::MambaMode;
        for seed in 0..12u32 {
            let geo = match seed % 3 {
                0 => fa(),
                1 => vec![
                    CacheGroup::full_attention(4),
                    CacheGroup::sliding_window(4, 5),
                ],
                _ => vec![
                    CacheGroup::full_attention(4),
                    CacheGroup::mamba(4, MambaMode::Align),
                ],
            };
            let shards = [1, 2, 4][(seed % 3) as usize];
            let pool = 14 + (seed as usize % 4) * 6;
            let mut e = engine_with(
                geo,
                pool,
                shards,
                seed % 2 == 0,
                with_deadline(15),
                move |j| match (j.attempt + seed + j.request.len() as u32) % 5 {
                    0 => Act::FailAll,
                    1 => Act::Slow(2),
                    2 => Act::HangUntilCancel,
                    3 => Act::Panic,
                    _ => Act::Ok,
                },
                8 * shards as u64,
                3 * shards,
            );
            eprintln!("seed {seed}");
            e.wait = Duration::MAX;
            let h = e.rt.handle();
            let mut n = 0;
            for i in 0..30u32 {
                e.submit(
                    &format!("w{seed}-{i}"),
                    shared_prompt(i % 3, i, 5 + (i % 4) as usize * 3),
                    1 + i % 4,
                )
                .unwrap();
                n += 1;
                if i % 5 == 4 {
                    e.step().unwrap();
                    h.cancel(&format!("w{seed}-{}", i - 2));
                }
            }
            e.run_to_end(100_000);
            e.conn.gate.store(true, Ordering::SeqCst);
            finish_checks(e, n);
        }
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("hung or panicked");
}

#[test]
fn every_request_is_reported_once_at_shutdown() {
    for (shards, steps) in [(1, 0), (1, 3), (2, 5), (2, 12)] {
        let mut e = engine(fa(), 400, shards, true, with_deadline(40), |j| {
            match j.request.len() % 3 {
                0 => Act::Slow(20),
                1 => Act::HangThenScribble,
                _ => Act::FailHalf,
            }
        });
        e.wait = Duration::from_millis(1);
        let mut ids = HashSet::new();
        for i in 0..30u32 {
            let id = format!("e{i}{}", "k".repeat((i % 3) as usize));
            e.submit(&id, shared_prompt(i % 4, i, 9 + (i % 4) as usize * 4), 3)
                .unwrap();
            ids.insert(id);
        }
        for i in 0..steps {
            e.step().unwrap();
            if i == 1 {
                e.rt.cancel("e3");
                e.finish_next.push("e4".into());
            }
        }
        let h = e.rt.handle();
        let conn = Arc::clone(&e.conn);
        let Engine { rt, t, .. } = e;
        let report = rt.shutdown();
        conn.gate.store(true, Ordering::SeqCst);
        let mut seen: Vec<String> = t.ended.keys().cloned().collect();
        seen.extend(report.ended_at_shutdown.iter().map(|(id, _)| id.clone()));
        seen.extend(report.cancelled_at_shutdown.iter().cloned());
        let set: HashSet<String> = seen.iter().cloned().collect();
        assert_eq!(set.len(), seen.len(), "an id reported twice: {seen:?}");
        assert_eq!(set, ids, "shards {shards} steps {steps}");
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        let m = &report.metrics;
        assert_eq!(m.submitted, m.finished + m.failed + m.cancelled);
        assert_eq!(report.census.referenced, report.blocks_abandoned as usize);
        assert!(matches!(
            h.submit(req("z", vec![1], 1)),
            Err(RuntimeError::ShutDown)
        ));
    }
}

#[test]
fn lost_outputs_are_reoffered() {
    let mut e = engine(fa(), 200, 2, false, Settings::default(), |j| {
        if j.attempt % 2 == 0 {
            Act::FailHalf
        } else {
            Act::Ok
        }
    });
    let mut n = 0;
    for i in 0..8u32 {
        e.submit(&format!("l{i}"), shared_prompt(i % 2, i, 11), 5)
            .unwrap();
        n += 1;
    }
    for k in 0..400 {
        if e.rt.live() == 0 {
            break;
        }
        if k % 3 == 1 {
            // A step the engine ran (writes included) whose output is lost.
            let plan = e.rt.schedule().unwrap();
            for (id, st) in &plan.ended {
                e.reqs.remove(&**id);
                e.t.ended.insert(id.to_string(), *st);
            }
            for s in &plan.scheduled {
                if let Some(job) = &s.sync_load {
                    let _ = e.conn.load(job);
                }
                let Some(r) = e.reqs.get(&*s.id) else {
                    continue;
                };
                let nn = s.num_computed_tokens as usize;
                for pos in nn..nn + s.num_tokens as usize {
                    let blk = s.block_tables[0][pos / 4];
                    // The lost step computed from whatever it read.
                    e.conn
                        .mem
                        .set(blk, pos % 4, tag(0, &r.prompt, &s.id, pos) ^ 1);
                }
            }
        } else {
            e.step().unwrap();
        }
    }
    let m = e.rt.metrics();
    assert!(m.lost_outputs > 0);
    let Engine { rt, t, .. } = e;
    let report = rt.shutdown();
    assert!(t.garbage_kept.is_empty(), "{:?}", t.garbage_kept);
    assert!(report.violations.is_empty());
    assert_eq!(t.ended.len(), n);
    assert_eq!(report.census.referenced, 0);
}

/// A request ended (cancelled, or finished by the engine) while its load hangs stays until
/// the load's deadline passes, its blocks parked under pressure on the pool; the load then
/// scribbles on them late, and nothing kept reads it. The deadline is long enough that the
/// 44 steps before it run well inside it on a loaded machine (at 300 ms they once did not).
#[test]
fn ending_a_loading_request_and_a_late_scribble() {
    const DEADLINE_MS: u64 = 2_000;
    for cancel_by_finish in [false, true] {
        let mut e = engine(fa(), 48, 2, true, with_deadline(DEADLINE_MS), |j| {
            if &*j.request == "hung" {
                Act::HangThenScribble
            } else {
                Act::Ok
            }
        });
        e.wait = Duration::from_millis(2);
        e.submit("hung", (0..33).collect(), 2).unwrap();
        for _ in 0..3 {
            e.step().unwrap();
        }
        assert_eq!(e.rt.loads_in_flight(), 1);
        if cancel_by_finish {
            e.finish_next.push("hung".into());
        } else {
            e.rt.handle().cancel("hung");
        }
        e.step().unwrap();
        // Pressure on the pool while the hung load's blocks are parked.
        let mut n = 1;
        for i in 0..12u32 {
            e.submit(&format!("o{i}"), (100 * i..100 * i + 9).collect(), 3)
                .unwrap();
            n += 1;
        }
        for _ in 0..40 {
            e.step().unwrap();
        }
        assert!(!e.t.ended.contains_key("hung"), "ended while its load runs");
        std::thread::sleep(Duration::from_millis(DEADLINE_MS + 10));
        for _ in 0..10 {
            e.step().unwrap();
        }
        e.conn.gate.store(true, Ordering::SeqCst);
        for i in 12..20u32 {
            e.submit(&format!("o{i}"), (100 * i..100 * i + 9).collect(), 3)
                .unwrap();
            n += 1;
        }
        e.run_to_end(3000);
        let m = e.rt.metrics();
        assert!(m.deadlines_expired >= 1, "{m:?}");
        let t = finish_checks(e, n);
        let want = if cancel_by_finish {
            EndState::Finished
        } else {
            EndState::Cancelled
        };
        assert_eq!(t.ended.get("hung"), Some(&want));
    }
}

/// Under policy `fail` requests whose loads failed end failed, and every request ends once,
/// reported, in either mode; in mode `safe` nothing kept reads garbage.
#[test]
fn policy_fail_ends_requests_failed_and_reads_no_garbage() {
    for mode in [kvsched::Mode::Safe, kvsched::Mode::Vllm] {
        for (shards, asyncl) in [(1, true), (2, false)] {
            let s = Settings::default()
                .with_policy(kvsched::Policy::Fail)
                .with_mode(mode);
            let geo = vec![
                CacheGroup::full_attention(4),
                CacheGroup::sliding_window(4, 6),
            ];
            let mut e = engine(geo, 300, shards, asyncl, s, faulty);
            e.sloppy = true;
            // Mode vllm lets sharers read what a failed sync load left (its known flaw).
            e.judge = mode == kvsched::Mode::Safe;
            e.exact_kernels = mode == kvsched::Mode::Vllm;
            let mut n = 0;
            for round in 0..12u32 {
                for i in 0..4u32 {
                    let id = format!("f{round}-{i}");
                    e.submit(&id, shared_prompt(round % 3, i, 10 + i as usize * 5), 3)
                        .unwrap();
                    n += 1;
                }
                e.step().unwrap();
            }
            e.run_to_end(5000);
            let t = finish_checks(e, n);
            let failed = t.ended.values().filter(|s| **s == EndState::Failed).count();
            assert!(failed > 0, "{mode:?}: no request failed");
        }
    }
}
