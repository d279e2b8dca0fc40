//! Limits and settings at their edges: impossible requests, zero budgets, prompts at the
//! pool's edge, requests without a token limit, extreme cost-policy rates and durations.

use std::time::Duration;

use crate::support::*;
use kvsched::{CacheGroup, MambaMode, Runtime, Settings};

fn dense() -> Vec<CacheGroup> {
    vec![CacheGroup::full_attention(16)]
}

fn hybrid_odd(mamba: MambaMode) -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(12),
        CacheGroup::sliding_window(8, 20),
        CacheGroup::mamba(24, mamba),
    ]
}

/// `TooLong` for a prompt the pool can never hold; 0 budgets refused at build.
#[test]
fn impossible_requests_and_zero_budgets_are_typed_errors() {
    let g = dense();
    let rt = builder(&g, 8).build().unwrap();
    let e = rt.submit(kvsched::SubmitRequest {
        id: "big".into(),
        prompt: vec![1; 16 * 8],
        max_new_tokens: 1,
        priority: 0,
        load_deadline: None,
    });
    assert!(
        matches!(e, Err(kvsched::RuntimeError::TooLong { .. })),
        "{e:?}"
    );
    let e = rt.submit(kvsched::SubmitRequest {
        id: "".into(),
        prompt: vec![1],
        max_new_tokens: 1,
        priority: 0,
        load_deadline: None,
    });
    assert!(e.is_err());
    let e = rt.submit(kvsched::SubmitRequest {
        id: "e".into(),
        prompt: vec![],
        max_new_tokens: 1,
        priority: 0,
        load_deadline: None,
    });
    assert!(
        matches!(e, Err(kvsched::RuntimeError::EmptyPrompt { .. })),
        "{e:?}"
    );
    let r = rt.shutdown();
    assert_report_clean(&r, 8);
    for b in [
        builder(&g, 64).token_budget(0),
        builder(&g, 64).max_seqs(0),
        builder(&g, 1),
        builder(&g, 64).shards(0),
        builder(&g, 64).workers(0),
    ] {
        assert!(matches!(
            b.build(),
            Err(kvsched::RuntimeError::Config { .. } | kvsched::RuntimeError::Pool(_))
        ));
    }
    let e = Runtime::builder()
        .groups(vec![CacheGroup::full_attention(0)])
        .build();
    assert!(e.is_err());
    let e = Runtime::builder().groups(vec![]).build();
    assert!(e.is_err());
    let rt = builder(&g, 64).build().unwrap();
    assert!(rt
        .update_settings(Settings::default().with_load_deadline(Some(Duration::ZERO)))
        .is_err());
    rt.shutdown();
}

/// Prompts at the edge of what the pool can hold, with and without room for their output:
/// each is refused as `TooLong` or ends (finished or length-capped); none is left live.
#[test]
fn prompts_at_the_pool_edge_end_or_are_refused() {
    for groups in [
        dense(),
        hybrid_odd(MambaMode::Align),
        hybrid_odd(MambaMode::All),
    ] {
        let pool = 24;
        for len in (150..330).step_by(7) {
            for max_new in [1u32, 40, 0] {
                let mut eng = Engine::new(groups.clone(), pool);
                let mut rt = builder(&groups, pool).shards(2).build().unwrap();
                let req = kvsched::SubmitRequest {
                    id: "edge".into(),
                    prompt: prompt(0, 0, len as u32, len),
                    max_new_tokens: max_new,
                    priority: 0,
                    load_deadline: None,
                };
                eng.seqs.insert("edge".into(), Seq::new(req.prompt.clone()));
                match rt.submit(req) {
                    Err(kvsched::RuntimeError::TooLong { .. }) => continue,
                    Err(e) => panic!("{e}"),
                    Ok(()) => {}
                }
                let ended = eng.run_until_idle(&mut rt, Duration::from_secs(3));
                let m = rt.metrics();
                let r = rt.shutdown();
                assert!(
                    ended,
                    "{groups:?} len {len} max_new {max_new}: accepted, never ended: {m:?}"
                );
                eng.assert_clean();
                assert_report_clean(&r, pool);
                assert_eq!(r.metrics.finished, 1, "{r}");
            }
        }
    }
}

/// Extreme but legal settings (and illegal ones, refused): the cost policy with compute
/// rates from 0.001 (the least: below it a token's cost overflows) to `f64::MAX`, durations
/// of zero and `Duration::MAX`; every request ends, nothing kept is wrong.
#[test]
fn extreme_settings_are_refused_or_run() {
    let g = hybrid_odd(MambaMode::Align);
    let rt = builder(&g, 64).build().unwrap();
    for bad in [
        f64::NAN,
        f64::INFINITY,
        -1.0,
        0.0,
        f64::MIN_POSITIVE,
        1e-300,
        9.9e-4,
    ] {
        let s = Settings::default()
            .with_load_policy(kvsched::LoadPolicy::Cost)
            .with_compute_rate(Some(bad));
        assert!(
            rt.update_settings(s.clone()).is_err(),
            "compute rate {bad} accepted"
        );
        assert!(builder(&g, 64).settings(s).build().is_err());
    }
    assert!(
        rt.update_settings(Settings::default().with_load_policy(kvsched::LoadPolicy::Cost))
            .is_err(),
        "cost without a compute rate"
    );
    rt.shutdown();
    for rate in [1e-3, 1.0, 1e300, f64::MAX] {
        for (deadline, probe, quarantine) in [
            (Some(Duration::MAX), Duration::ZERO, Duration::MAX),
            (None, Duration::MAX, Duration::ZERO),
            (
                Some(Duration::from_nanos(1)),
                Duration::from_nanos(1),
                Duration::from_nanos(1),
            ),
        ] {
            let pool = 512;
            let mut eng = Engine::new(g.clone(), pool).memory_tier(0.5);
            let s = Settings::default()
                .with_load_policy(kvsched::LoadPolicy::Cost)
                .with_compute_rate(Some(rate))
                .with_load_deadline(deadline)
                .with_load_probe_interval(probe)
                .with_quarantine_for(quarantine)
                .with_quarantine_after(1)
                .with_max_load_retries(u32::MAX);
            for round in 0..2u32 {
                let mut rt = builder(&g, pool)
                    .settings(s.clone())
                    .connector(eng.tier_conn.clone().unwrap())
                    .build()
                    .unwrap();
                for i in 0..6u32 {
                    eng.submit(
                        &rt,
                        &format!("x{round}-{i}"),
                        prompt(i % 2, 72, round * 10 + i, 90),
                        2,
                    );
                }
                assert!(
                    eng.run_until_idle(&mut rt, Duration::from_secs(10)),
                    "rate {rate}: never ended: {:?}",
                    rt.metrics()
                );
                eng.flush();
                let est = rt.load_estimate();
                let r = rt.shutdown();
                assert_report_clean(&r, pool);
                assert_eq!(r.metrics.finished, 6, "{r}");
                for x in [0.0, f64::MAX, f64::NAN, -1.0] {
                    let _ = est.load_ns(u64::MAX, x);
                }
                let _ = est.failure_of(u64::MAX);
            }
            eng.assert_clean();
        }
    }
}

/// A request with no token limit on a tiny pool ends at its length cap.
#[test]
fn unlimited_request_ends_at_length_cap() {
    let g = hybrid_odd(MambaMode::All);
    let pool = 24;
    let mut eng = Engine::new(g.clone(), pool);
    let mut rt = builder(&g, pool).build().unwrap();
    eng.submit(&rt, "u", prompt(0, 0, 1, 30), 0);
    assert!(eng.run_until_idle(&mut rt, Duration::from_secs(20)));
    let r = rt.shutdown();
    eng.assert_clean();
    assert_report_clean(&r, pool);
    assert_eq!(r.metrics.length_capped, 1, "{r}");
}
