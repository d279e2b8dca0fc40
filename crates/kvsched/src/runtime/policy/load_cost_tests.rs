//! The load-or-recompute rule: worked examples and properties.

use super::*;
use proptest::prelude::*;

/// 1 M tokens/s: a token recomputes in 1 µs.
const RATE: f64 = 1e6;

/// The engine at `RATE` with nobody waiting.
fn engine(rate: f64) -> Engine {
    Engine {
        compute_rate: rate,
        waiting_behind: 0,
    }
}

fn tier(latency_us: f64, ns_per_token: f64, queue_us: f64, failure: f64) -> TierEstimate {
    TierEstimate {
        samples: 10,
        latency_ns: latency_us * 1e3,
        ns_per_token,
        queue_ns: queue_us * 1e3,
        failure,
        mean_tokens: 1000.0,
        failed_ns: 0.0,
        in_flight: 0,
    }
}

fn one(tokens: u64, estimate: TierEstimate) -> [TierHit; 1] {
    [TierHit { tokens, estimate }]
}

fn decide(hit: &[TierHit], rate: f64, probe: bool) -> LoadDecision {
    load_tokens(LoadPolicy::Cost, hit, engine(rate), probe)
}

#[test]
fn a_fast_tier_is_loaded_whole_a_slow_one_recomputed() {
    // 1000 tokens: 1 ms to recompute. A load of 100 µs + 100 ns/token = 200 µs: loaded.
    let d = decide(&one(1000, tier(100.0, 100.0, 0.0, 0.0)), RATE, false);
    assert_eq!((d.load, d.reason), (1000, LoadReason::Cheaper));
    assert_eq!(d.recompute_all_ns, 1e6);
    assert_eq!(d.load_all_ns, 200e3);
    // 5 ms of latency: recomputed.
    let slow = one(1000, tier(5000.0, 100.0, 0.0, 0.0));
    assert_eq!(decide(&slow, RATE, false).load, 0);
    // ... unless it is the tier's probe (a tier that does not fail: the whole hit).
    let d = decide(&slow, RATE, true);
    assert_eq!((d.load, d.reason), (1000, LoadReason::Probe));
    // Always loads it whatever it costs.
    let d = load_tokens(LoadPolicy::Always, &slow, engine(RATE), false);
    assert_eq!((d.load, d.reason), (1000, LoadReason::Always));
}

#[test]
fn requests_waiting_behind_make_recomputing_dearer() {
    // 5 ms to load 1000 tokens the engine recomputes in 1 ms: recomputed while nobody waits;
    // with 9 requests waiting behind, recomputing delays each of them by 1 ms: loaded.
    let slow = one(1000, tier(5000.0, 0.0, 0.0, 0.0));
    assert_eq!(decide(&slow, RATE, false).load, 0);
    let busy = Engine {
        compute_rate: RATE,
        waiting_behind: 9,
    };
    let d = load_tokens(LoadPolicy::Cost, &slow, busy, false);
    assert_eq!((d.load, d.recompute_all_ns), (1000, 1e7));
}

#[test]
fn a_deep_queue_or_failures_make_a_fast_tier_recomputed() {
    let fast = tier(100.0, 100.0, 0.0, 0.0);
    assert_eq!(decide(&one(1000, fast), RATE, false).load, 1000);
    let queued = TierEstimate {
        queue_ns: 2e6,
        ..fast
    };
    assert_eq!(decide(&one(1000, queued), RATE, false).load, 0);
    // Every load fails after 20 ms: recomputed. (Planted bug `cost-ignores-failures` loads it.)
    let failing = TierEstimate {
        failure: 1.0,
        failed_ns: 20e6,
        ..fast
    };
    assert_eq!(decide(&one(1000, failing), RATE, false).load, 0);
    assert_eq!(failing.load_ns(1000, 1e3), 20e6 + 1e6);
}

#[test]
fn a_long_hit_on_a_tier_failing_now_and_then_loads_its_head() {
    // Loads of 1,000 tokens fail one in ten, after 20 ms; landed ones take 100 µs + 100 ns
    // a token; the engine recomputes a token in 10 µs. The risk per token is −ln 0.9 / 1000.
    let e = TierEstimate {
        failed_ns: 20e6,
        ..tier(100.0, 100.0, 0.0, 0.1)
    };
    let lambda = -(0.9f64.ln()) / 1000.0;
    assert!((e.failure_of(1000) - 0.1).abs() < 1e-12);
    assert!((e.failure_of(10_000) - (1.0 - 0.9f64.powi(10))).abs() < 1e-12);
    // m* = 1/λ − (T − L)/(c − B) = 9,491 − 19.9 ms / 9.9 µs = 7,481 tokens.
    let m = 1.0 / lambda - (20e6 - 100e3) / (10e3 - 100.0);
    let d = decide(&one(100_000, e), 1e5, false);
    assert_eq!((d.load, d.reason), (m.floor() as u64, LoadReason::Cheaper));
    // A hit shorter than m* is loaded whole; one much too risky is loaded in part.
    assert_eq!(decide(&one(5_000, e), 1e5, false).load, 5_000);
    // The probe loads up to where half the loads would fail (ln 2 / λ = 6,579 tokens).
    let far = TierEstimate { failure: 0.9, ..e };
    assert_eq!(decide(&one(100_000, far), 1e5, false).load, 0);
    let p = decide(&one(100_000, far), 1e5, true);
    let half = (std::f64::consts::LN_2 / (-(1.0f64 - 0.9).ln() / 1000.0)) as u64;
    assert_eq!((p.load, p.reason), (half, LoadReason::Probe));
}

#[test]
fn an_unmeasured_tier_and_a_tie_are_loaded() {
    let unmeasured = TierEstimate {
        samples: 0,
        ..tier(1e6, 1e6, 1e6, 1.0)
    };
    assert_eq!(decide(&one(64, unmeasured), RATE, false).load, 64);
    // Exactly the recompute time: loaded.
    assert_eq!(
        decide(&one(1000, tier(500.0, 500.0, 0.0, 0.0)), RATE, false).load,
        1000
    );
    assert_eq!(decide(&[], RATE, false).load, 0);
}

#[test]
fn a_tier_whose_loads_take_forever_is_never_loaded_and_unknowns_read_as_zero() {
    let inf = f64::INFINITY;
    for e in [
        TierEstimate {
            latency_ns: inf,
            ..tier(10.0, 10.0, 0.0, 0.0)
        },
        TierEstimate {
            queue_ns: inf,
            ..tier(10.0, 10.0, 0.0, 0.0)
        },
        TierEstimate {
            ns_per_token: inf,
            ..tier(10.0, 10.0, 0.0, 0.0)
        },
        // Failed loads that take forever, on a tier that fails now and then.
        TierEstimate {
            failed_ns: inf,
            ..tier(10.0, 10.0, 0.0, 0.01)
        },
    ] {
        let d = decide(&one(1000, e), RATE, false);
        assert_eq!((d.load, d.reason), (0, LoadReason::Cheaper), "{e:?}");
        assert_eq!(d.load_all_ns, inf, "{e:?}");
        assert_eq!(e.failure_of(1000), 1.0, "{e:?}");
        // Its probe still measures it, with a token.
        assert_eq!(decide(&one(1000, e), RATE, true).load, 1, "{e:?}");
    }
    // On a tier that never fails, a failed load's time weighs nothing, infinite or not.
    let never_fails = TierEstimate {
        failed_ns: inf,
        ..tier(10.0, 10.0, 0.0, 0.0)
    };
    assert_eq!(decide(&one(1000, never_fails), RATE, false).load, 1000);
    // An unknown (NaN) term reads as 0: the fast tier above, loaded whole.
    let nan = f64::NAN;
    let unknown = TierEstimate {
        latency_ns: nan,
        failed_ns: nan,
        ..tier(10.0, 10.0, 0.0, 0.0)
    };
    assert_eq!(decide(&one(1000, unknown), RATE, false).load, 1000);
    // An engine that recomputes forever loads whatever lands.
    let slow = one(1000, tier(1e9, 1e6, 1e9, 0.0));
    assert_eq!(decide(&slow, 1e-300, false).load, 1000);
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
    assert_eq!(decide(&hit, RATE, false).load, 512);
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
    assert_eq!(decide(&hit, RATE, false).load, 4160);
}

fn estimate() -> impl Strategy<Value = TierEstimate> {
    (
        0u64..4,
        (0.0..5e6f64, 0.0..5e3f64, 0.0..5e6f64),
        (0.0..=1.0f64, 1.0..20_000.0f64, 0.0..5e7f64),
        0u64..64,
    )
        .prop_map(
            |(
                samples,
                (latency_ns, ns_per_token, queue_ns),
                (failure, mean_tokens, failed_ns),
                in_flight,
            )| {
                TierEstimate {
                    samples,
                    latency_ns,
                    ns_per_token,
                    queue_ns,
                    failure,
                    mean_tokens,
                    failed_ns,
                    in_flight,
                }
            },
        )
}

fn measured() -> impl Strategy<Value = TierEstimate> {
    estimate().prop_map(|e| TierEstimate { samples: 1, ..e })
}

fn hits() -> impl Strategy<Value = Vec<TierHit>> {
    proptest::collection::vec(
        (0u64..20_000, estimate()).prop_map(|(tokens, estimate)| TierHit { tokens, estimate }),
        0..4,
    )
}

/// The cost, ns, of loading the first `k` tokens of `hit` and recomputing the rest at `c` ns a
/// token, written out from the module docs (not from the rule's code).
fn cost_of(hit: &[TierHit], k: u64, c: f64) -> f64 {
    let mut start = 0u64;
    let mut t = 0.0;
    for h in hit {
        let m = k.saturating_sub(start).min(h.tokens);
        let rest = h.tokens - m;
        start += h.tokens;
        t += rest as f64 * c;
        if m == 0 {
            continue;
        }
        let e = h.estimate;
        if e.samples == 0 {
            continue; // unmeasured: costs nothing
        }
        let f = e.failure;
        let m = m as f64;
        if f >= 1.0 {
            return f64::INFINITY; // every load fails: never loaded
        }
        let p = 1.0 - (1.0 - f).powf(m / e.mean_tokens);
        let landed = e.latency_ns + m * e.ns_per_token;
        let failed = e.failed_ns.max(e.latency_ns) + m * c;
        t += e.queue_ns + (1.0 - p) * landed + p * failed;
    }
    t
}

proptest! {
    #[test]
    fn never_more_than_the_hit_always_the_whole_hit(
        hit in hits(), rate in 1e3..1e9f64, probe in any::<bool>(),
    ) {
        let total: u64 = hit.iter().map(|h| h.tokens).sum();
        let d = decide(&hit, rate, probe);
        prop_assert!(d.load <= total);
        let plain = decide(&hit, rate, false);
        if probe {
            prop_assert!(d.load >= plain.load, "a probe never loads less");
        }
        let a = load_tokens(LoadPolicy::Always, &hit, engine(rate), probe);
        prop_assert_eq!((a.load, a.reason), (total, LoadReason::Always));
        let n = load_tokens(LoadPolicy::Never, &hit, engine(rate), probe);
        prop_assert_eq!((n.load, n.reason), (0, LoadReason::Never));
    }

    #[test]
    fn the_load_is_the_cheapest_of_every_length(hit in hits(), rate in 1e3..1e9f64) {
        let c = 1e9 / rate;
        let d = decide(&hit, rate, false);
        let total: u64 = hit.iter().map(|h| h.tokens).sum();
        let chosen = cost_of(&hit, d.load, c);
        prop_assert!(chosen.is_finite(), "a load that cannot land was chosen: {}", d.load);
        // Every length on a grid of 1/256 of the hit, and each segment's ends.
        let mut ks: Vec<u64> = (0..=256u64).map(|i| total * i / 256).collect();
        let mut end = 0;
        for h in &hit {
            ks.push(end + 1);
            end += h.tokens;
            ks.push(end);
        }
        for k in ks.into_iter().filter(|&k| k <= total) {
            let other = cost_of(&hit, k, c);
            // Float sums in another order, and m* taken to a whole token: a small slack.
            let slack = 1e-6 * (chosen.abs().min(1e18) + other.abs().min(1e18)) + c + 1.0;
            prop_assert!(chosen <= other + slack, "k={} ({}) cheaper than {} ({})", k, other, d.load, chosen);
        }
    }

    #[test]
    fn a_faster_tier_never_gets_fewer_tokens(
        tokens in 0u64..100_000, e in measured(), scale in 0.0..1.0f64, rate in 1e3..1e9f64,
    ) {
        let before = decide(&one(tokens, e), rate, false).load;
        let faster = TierEstimate {
            latency_ns: e.latency_ns * scale,
            ns_per_token: e.ns_per_token * scale,
            failed_ns: e.failed_ns * scale,
            ..e
        };
        prop_assert!(decide(&one(tokens, faster), rate, false).load >= before);
    }

    #[test]
    fn a_deeper_queue_or_more_failures_never_get_more(
        tokens in 0u64..100_000, e in measured(), more_queue in 0.0..1e7f64,
        more_failure in 0.0..1.0f64, rate in 1e3..1e9f64,
    ) {
        let before = decide(&one(tokens, e), rate, false).load;
        let queued = TierEstimate { queue_ns: e.queue_ns + more_queue, ..e };
        let failing = TierEstimate { failure: (e.failure + more_failure).min(1.0), ..e };
        prop_assert!(decide(&one(tokens, queued), rate, false).load <= before);
        prop_assert!(decide(&one(tokens, failing), rate, false).load <= before);
    }

    #[test]
    fn a_faster_engine_never_loads_more_a_longer_wait_behind_never_less(
        tokens in 0u64..100_000, e in measured(), rate in 1e3..1e9f64, up in 1.0..100.0f64,
        behind in 0u64..100,
    ) {
        let slow = decide(&one(tokens, e), rate, false).load;
        prop_assert!(decide(&one(tokens, e), rate * up, false).load <= slow);
        let busy = Engine { compute_rate: rate, waiting_behind: behind };
        prop_assert!(load_tokens(LoadPolicy::Cost, &one(tokens, e), busy, false).load >= slow);
    }

    #[test]
    fn a_tier_that_never_fails_is_loaded_whole_when_cheaper(
        tokens in 1u64..100_000, e in estimate(), rate in 1e3..1e9f64,
    ) {
        let e = TierEstimate { failure: 0.0, ..e };
        let c = 1e9 / rate;
        let d = decide(&one(tokens, e), rate, false);
        let loads = e.load_ns(tokens, c) <= tokens as f64 * c;
        prop_assert_eq!(d.load, if loads { tokens } else { 0 });
    }

    #[test]
    fn any_float_in_an_estimate_gives_a_decision_within_the_hit(
        tokens in 0u64..u64::MAX, floats in proptest::collection::vec(
            prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY),
                        Just(f64::MAX), Just(f64::MIN_POSITIVE), Just(0.0), Just(-1.0),
                        0.0..1e9f64], 7),
        rate in prop_oneof![Just(0.0), Just(f64::MIN_POSITIVE), Just(f64::INFINITY), Just(f64::NAN), 1e-3..1e12f64],
        probe in any::<bool>(),
    ) {
        let e = TierEstimate {
            samples: 1,
            latency_ns: floats[0],
            ns_per_token: floats[1],
            queue_ns: floats[2],
            failure: floats[3],
            mean_tokens: floats[4],
            failed_ns: floats[5],
            in_flight: 0,
        };
        let d = decide(&one(tokens, e), rate, probe);
        prop_assert!(d.load <= tokens);
        prop_assert!(!d.load_all_ns.is_nan() && !d.recompute_all_ns.is_nan(), "{:?}", d);
        let f = e.failure_of(tokens);
        prop_assert!((0.0..=1.0).contains(&f), "{}", f);
        if [e.latency_ns, e.ns_per_token, e.queue_ns].contains(&f64::INFINITY) && tokens > 0 {
            prop_assert!(d.load <= 1, "a tier whose loads never land got {} tokens", d.load);
        }
    }
}
