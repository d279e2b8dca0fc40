//! The load-or-recompute rule: worked examples and properties.

use super::*;
use proptest::prelude::*;

/// 1 M tokens/s: a token recomputes in 1 µs.
const RATE: f64 = 1e6;

fn tier(latency_us: f64, ns_per_token: f64, queue_us: f64, failure: f64) -> TierEstimate {
    TierEstimate {
        samples: 10,
        latency_ns: latency_us * 1e3,
        ns_per_token,
        queue_ns: queue_us * 1e3,
        failure,
        in_flight: 0,
    }
}

fn one(tokens: u64, estimate: TierEstimate) -> [TierHit; 1] {
    [TierHit { tokens, estimate }]
}

#[test]
fn a_fast_tier_is_loaded_whole_a_slow_one_recomputed() {
    // 1000 tokens: 1 ms to recompute. A load of 100 µs + 100 ns/token = 200 µs: loaded.
    let d = load_tokens(
        LoadPolicy::Cost,
        &one(1000, tier(100.0, 100.0, 0.0, 0.0)),
        RATE,
        false,
    );
    assert_eq!((d.load, d.reason), (1000, LoadReason::Cheaper));
    assert_eq!(d.recompute_all_ns, 1e6);
    assert_eq!(d.load_all_ns, 200e3);
    // 5 ms of latency: recomputed.
    let d = load_tokens(
        LoadPolicy::Cost,
        &one(1000, tier(5000.0, 100.0, 0.0, 0.0)),
        RATE,
        false,
    );
    assert_eq!(d.load, 0);
    // ... unless it is the tier's probe.
    let d = load_tokens(
        LoadPolicy::Cost,
        &one(1000, tier(5000.0, 100.0, 0.0, 0.0)),
        RATE,
        true,
    );
    assert_eq!((d.load, d.reason), (1000, LoadReason::Probe));
    // Always loads it whatever it costs.
    let d = load_tokens(
        LoadPolicy::Always,
        &one(1000, tier(5000.0, 100.0, 0.0, 0.0)),
        RATE,
        false,
    );
    assert_eq!((d.load, d.reason), (1000, LoadReason::Always));
}

#[test]
fn a_deep_queue_or_failures_make_a_fast_tier_recomputed() {
    let fast = tier(100.0, 100.0, 0.0, 0.0);
    assert_eq!(
        load_tokens(LoadPolicy::Cost, &one(1000, fast), RATE, false).load,
        1000
    );
    let queued = TierEstimate {
        queue_ns: 2e6,
        ..fast
    };
    assert_eq!(
        load_tokens(LoadPolicy::Cost, &one(1000, queued), RATE, false).load,
        0
    );
    // 90% failed: 200 µs + 0.9 × 1 ms > 1 ms. (Planted bug `cost-ignores-failures` loads it.)
    let failing = TierEstimate {
        failure: 0.9,
        ..fast
    };
    assert_eq!(
        load_tokens(LoadPolicy::Cost, &one(1000, failing), RATE, false).load,
        0
    );
}

#[test]
fn an_unmeasured_tier_and_a_tie_are_loaded() {
    let unmeasured = TierEstimate {
        samples: 0,
        ..tier(1e6, 1e6, 1e6, 1.0)
    };
    assert_eq!(
        load_tokens(LoadPolicy::Cost, &one(64, unmeasured), RATE, false).load,
        64
    );
    // Exactly the recompute time: loaded.
    assert_eq!(
        load_tokens(
            LoadPolicy::Cost,
            &one(1000, tier(500.0, 500.0, 0.0, 0.0)),
            RATE,
            false
        )
        .load,
        1000
    );
    assert_eq!(load_tokens(LoadPolicy::Cost, &[], RATE, false).load, 0);
}

#[test]
fn a_fast_tier_then_a_slow_one_loads_the_fast_segment_only() {
    let hit = [
        TierHit {
            tokens: 512,
            estimate: tier(10.0, 10.0, 0.0, 0.0),
        },
        TierHit {
            tokens: 512,
            estimate: tier(10_000.0, 100.0, 0.0, 0.0),
        },
    ];
    let d = load_tokens(LoadPolicy::Cost, &hit, RATE, false);
    assert_eq!(d.load, 512);
    // A slow first tier hides a fast second one only when loading both costs more.
    let hit = [
        TierHit {
            tokens: 64,
            estimate: tier(100.0, 100.0, 0.0, 0.0),
        },
        TierHit {
            tokens: 4096,
            estimate: tier(10.0, 10.0, 0.0, 0.0),
        },
    ];
    assert_eq!(load_tokens(LoadPolicy::Cost, &hit, RATE, false).load, 4160);
}

fn estimate() -> impl Strategy<Value = TierEstimate> {
    (
        0u64..4,
        0.0..5e6f64,
        0.0..5e3f64,
        0.0..5e6f64,
        0.0..=1.0f64,
        0u64..64,
    )
        .prop_map(
            |(samples, latency_ns, ns_per_token, queue_ns, failure, in_flight)| TierEstimate {
                samples,
                latency_ns,
                ns_per_token,
                queue_ns,
                failure,
                in_flight,
            },
        )
}

fn hits() -> impl Strategy<Value = Vec<TierHit>> {
    proptest::collection::vec(
        (0u64..20_000, estimate()).prop_map(|(tokens, estimate)| TierHit { tokens, estimate }),
        0..4,
    )
}

/// The boundaries a load may stop at: 0, each segment's end.
fn boundaries(hit: &[TierHit]) -> Vec<u64> {
    let mut b = vec![0];
    let mut end = 0;
    for h in hit {
        end += h.tokens;
        b.push(end);
    }
    b
}

proptest! {
    #[test]
    fn never_more_than_the_hit_always_the_whole_hit(
        hit in hits(), rate in 1e3..1e9f64, probe in any::<bool>(),
    ) {
        let total: u64 = hit.iter().map(|h| h.tokens).sum();
        let d = load_tokens(LoadPolicy::Cost, &hit, rate, probe);
        prop_assert!(d.load <= total);
        prop_assert!(boundaries(&hit).contains(&d.load), "stops at a segment end: {}", d.load);
        if probe {
            prop_assert_eq!(d.load, total);
        }
        let a = load_tokens(LoadPolicy::Always, &hit, rate, probe);
        prop_assert_eq!((a.load, a.reason), (total, LoadReason::Always));
        let n = load_tokens(LoadPolicy::Never, &hit, rate, probe);
        prop_assert_eq!((n.load, n.reason), (0, LoadReason::Never));
    }

    #[test]
    fn the_load_is_the_cheapest_boundary(hit in hits(), rate in 1e3..1e9f64) {
        let c = 1e9 / rate;
        let cost = |k: u64| {
            let mut end = 0;
            let mut t = 0.0;
            for h in &hit {
                end += h.tokens;
                if end <= k {
                    t += h.estimate.load_ns(h.tokens, c);
                } else {
                    t += h.tokens as f64 * c;
                }
            }
            t
        };
        let d = load_tokens(LoadPolicy::Cost, &hit, rate, false);
        for k in boundaries(&hit) {
            // Float sums in another order: allow a rounding error.
            let slack = 1e-9 * (cost(k).abs() + cost(d.load).abs()) + 1e-6;
            prop_assert!(cost(d.load) <= cost(k) + slack, "k={} cheaper than {}", k, d.load);
        }
    }

    #[test]
    fn a_faster_tier_never_gets_fewer_tokens(
        hit in hits(), i in 0usize..4, scale in 0.0..1.0f64, rate in 1e3..1e9f64,
    ) {
        let before = load_tokens(LoadPolicy::Cost, &hit, rate, false).load;
        let mut faster = hit.clone();
        if let Some(h) = faster.get_mut(i) {
            h.estimate.latency_ns *= scale;
            h.estimate.ns_per_token *= scale;
        }
        prop_assert!(load_tokens(LoadPolicy::Cost, &faster, rate, false).load >= before);
    }

    #[test]
    fn a_deeper_queue_or_more_failures_never_get_more(
        hit in hits(), i in 0usize..4, more_queue in 0.0..1e7f64, more_failure in 0.0..1.0f64,
        rate in 1e3..1e9f64,
    ) {
        let before = load_tokens(LoadPolicy::Cost, &hit, rate, false).load;
        let mut queued = hit.clone();
        let mut failing = hit.clone();
        if let (Some(q), Some(f)) = (queued.get_mut(i), failing.get_mut(i)) {
            q.estimate.queue_ns += more_queue;
            f.estimate.failure = (f.estimate.failure + more_failure).min(1.0);
        }
        prop_assert!(load_tokens(LoadPolicy::Cost, &queued, rate, false).load <= before);
        prop_assert!(load_tokens(LoadPolicy::Cost, &failing, rate, false).load <= before);
    }

    #[test]
    fn a_faster_engine_never_loads_more(hit in hits(), rate in 1e3..1e9f64, up in 1.0..100.0f64) {
        let slow = load_tokens(LoadPolicy::Cost, &hit, rate, false).load;
        prop_assert!(load_tokens(LoadPolicy::Cost, &hit, rate * up, false).load <= slow);
    }

    #[test]
    fn a_tier_cheaper_than_recomputing_is_loaded_whole(
        tokens in 1u64..100_000, e in estimate(), rate in 1e3..1e9f64,
    ) {
        let c = 1e9 / rate;
        let d = load_tokens(LoadPolicy::Cost, &one(tokens, e), rate, false);
        let loads = e.load_ns(tokens, c) <= tokens as f64 * c;
        prop_assert_eq!(d.load, if loads { tokens } else { 0 });
    }
}
