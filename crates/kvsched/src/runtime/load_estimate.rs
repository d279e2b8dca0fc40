//! [`LoadEstimate`]: a tier's load cost measured as the run goes — from the asynchronous loads
//! the shards dispatched and saw return — read at every admission by the load-or-recompute
//! rule (`runtime::policy::load_cost`) without a lock.
//!
//! What it keeps, each an exponentially weighted moving average over the tier's returned loads
//! (weight [`WEIGHT`] for the newest) in an `f64` stored as the bits of an atomic:
//!
//! * **service time against tokens**: the averages of `n`, `t`, `n²` and `n·t` over the loads
//!   that landed, of `n` tokens that a worker ran in `t` ns (from when it started the load to
//!   when it finished). Their weighted least-squares line gives the latency (intercept) and the
//!   time per token (slope); when the loads' sizes barely vary, all the time is taken as
//!   per-token. A landed load counts at most [`OUTLIER`] times what the line predicts (a busy
//!   machine's pauses are not the tier's cost). A failed load's time says what failing costs,
//!   not what loading does: it is kept apart.
//! * **failures**, damped (weight [`FAILURE_WEIGHT`]: about the last sixteen loads): the
//!   average of 1 (failed, or passed its deadline) and 0 (filled), with the average length of
//!   those same loads, from which the rule reads a failure risk per token; and the average time
//!   of the failed loads (to the failed completion; to the deadline for one that passed it,
//!   counted from its dispatch). Each average is a plain mean until it has as many samples as
//!   its weight's inverse, so the first loads are not taken for more than they are.
//! * **queue depth**: loads dispatched and not yet returned, now; a load dispatched now waits
//!   for the ones past the free workers, `workers` at a time, each the time of a landed load
//!   or of a failed one by their shares.
//! * **when** it last measured a load and last granted a probe: one admission per probe
//!   interval loads a hit the estimate would have recomputed, so a tier nobody loads any more
//!   is measured again and recovers its share when it recovers.
//!
//! # Guarantees / Limits
//!
//! * **Lock-free and cheap.** A return is a handful of `Relaxed` read-modify-writes, an
//!   admission a handful of loads; no ordering is needed (an estimate, not a protocol: shards
//!   racing on one average each apply their sample, in some order).
//! * The averages are updated one by one: a reader may see a sample in some of them and not
//!   yet in the others. The line fit tolerates that (it is clamped to non-negative latency and
//!   per-token time).
//! * Only asynchronous loads are measured: a sync load runs inside the engine's step, where
//!   the runtime cannot time it. Both kinds are decided by the same estimate.
//! * One estimate per runtime: the connector is one tier (`LookupResult` says nothing of which
//!   tier a hit is on). The rule itself takes a hit spread over several tiers.

use std::time::{Duration, Instant};

use crate::runtime::policy::load_cost::TierEstimate;
use crate::sync::{AtomicU64, Ordering};

/// Weight of the newest load in the service-time averages: about the last eight loads count.
pub const WEIGHT: f64 = 0.25;

/// A landed load counts at most this many times what the estimate says it should take: one
/// load a busy machine kept off its core for milliseconds must not make a fast tier look slow
/// (while it looks slow it is not loaded, so nothing corrects it but the probes). A tier that
/// really slows down is followed all the same: each load can raise the estimate by a quarter.
pub const OUTLIER: f64 = 2.0;

/// Weight of the newest load in the failure share and the mean load length: damped, so a
/// few loads do not flip the rule between loading and not (about the last sixteen count).
pub const FAILURE_WEIGHT: f64 = 0.125;

/// A tier's measured load cost (see the module docs).
#[derive(Debug)]
pub struct LoadEstimate {
    base: Instant,
    mean_n: AtomicU64,
    mean_t: AtomicU64,
    mean_nn: AtomicU64,
    mean_nt: AtomicU64,
    failure: AtomicU64,
    mean_tokens: AtomicU64,
    failed_ns: AtomicU64,
    samples: AtomicU64,
    /// Loads that landed (the service-time averages') and that failed (`failed_ns`'s).
    landed: AtomicU64,
    failed: AtomicU64,
    dispatched: AtomicU64,
    returned: AtomicU64,
    /// ns since `base` of the last sample and of the last probe granted (`u64::MAX`: never).
    last_sample: AtomicU64,
    last_probe: AtomicU64,
}

impl Default for LoadEstimate {
    fn default() -> Self {
        LoadEstimate {
            base: Instant::now(),
            mean_n: AtomicU64::new(0),
            mean_t: AtomicU64::new(0),
            mean_nn: AtomicU64::new(0),
            mean_nt: AtomicU64::new(0),
            failure: AtomicU64::new(0),
            mean_tokens: AtomicU64::new(0),
            failed_ns: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            landed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dispatched: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            last_sample: AtomicU64::new(0),
            last_probe: AtomicU64::new(0),
        }
    }
}

/// Moves the average in `a` toward its `nth` sample `x` (from 1) by `weight`, or by `1/nth`
/// while that is more (a plain mean of the first samples; the first sets it).
fn average(a: &AtomicU64, x: f64, nth: u64, weight: f64) {
    let w = weight.max(1.0 / nth.max(1) as f64);
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        let m = f64::from_bits(bits);
        Some((m + w * (x - m)).to_bits())
    });
}

fn read(a: &AtomicU64) -> f64 {
    f64::from_bits(a.load(Ordering::Relaxed))
}

impl LoadEstimate {
    fn since_base(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// An asynchronous load was dispatched to the workers.
    pub(crate) fn dispatched(&self) {
        self.dispatched.fetch_add(1, Ordering::Relaxed);
    }

    /// A dispatched load came back, or will never run (dropped before a worker started it):
    /// it no longer queues.
    pub(crate) fn returned(&self) {
        self.returned.fetch_add(1, Ordering::Relaxed);
    }

    /// A load of `tokens` tokens took `service` and filled its blocks (`ok`) or not (then
    /// `service` is what failing took).
    pub(crate) fn measured(&self, tokens: u64, service: Duration, ok: bool, now: Instant) {
        if tokens == 0 {
            return;
        }
        let nth = self.samples.fetch_add(1, Ordering::Relaxed) + 1;
        let n = tokens as f64;
        let t = service.as_nanos() as f64;
        average(
            &self.failure,
            if ok { 0.0 } else { 1.0 },
            nth,
            FAILURE_WEIGHT,
        );
        average(&self.mean_tokens, n, nth, FAILURE_WEIGHT);
        if ok {
            let nth = self.landed.fetch_add(1, Ordering::Relaxed) + 1;
            // Once the line has as many loads as its weight's inverse, a load counts at most
            // OUTLIER times what it predicts.
            let t = match self.line() {
                Some((latency, per_token, _)) if nth > (1.0 / WEIGHT) as u64 => {
                    let bound = OUTLIER * (latency + per_token * n);
                    if bound > 0.0 {
                        t.min(bound)
                    } else {
                        t
                    }
                }
                _ => t,
            };
            average(&self.mean_n, n, nth, WEIGHT);
            average(&self.mean_t, t, nth, WEIGHT);
            average(&self.mean_nn, n * n, nth, WEIGHT);
            average(&self.mean_nt, n * t, nth, WEIGHT);
        } else {
            let nth = self.failed.fetch_add(1, Ordering::Relaxed) + 1;
            average(&self.failed_ns, t, nth, WEIGHT);
        }
        self.last_sample
            .store(self.since_base(now), Ordering::Relaxed);
    }

    /// Whether the admission asking at `now` is the tier's probe: granted to one caller once
    /// nothing was measured or probed for `interval` (never when nothing was ever measured:
    /// an unmeasured tier is loaded anyway).
    pub(crate) fn try_probe(&self, now: Instant, interval: Duration) -> bool {
        if self.samples.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let at = self.since_base(now);
        let gap = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        let quiet_since = self.last_sample.load(Ordering::Relaxed);
        if at.saturating_sub(quiet_since) < gap {
            return false;
        }
        let probed = self.last_probe.load(Ordering::Relaxed);
        if probed != 0 && at.saturating_sub(probed) < gap {
            return false;
        }
        self.last_probe
            .compare_exchange(probed, at.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// The landed loads' line: latency and time per token, ns, and their mean time (`None`
    /// before a load landed).
    fn line(&self) -> Option<(f64, f64, f64)> {
        if self.landed.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let (n, t) = (read(&self.mean_n), read(&self.mean_t));
        let var = read(&self.mean_nn) - n * n;
        let cov = read(&self.mean_nt) - n * t;
        // A line only when the sizes spread (relative spread ≥ 1%); otherwise all per-token.
        let (mut latency, mut per_token) = if n > 0.0 && var > 1e-4 * n * n && cov > 0.0 {
            let b = cov / var;
            (t - b * n, b)
        } else {
            (0.0, if n > 0.0 { t / n } else { 0.0 })
        };
        if latency < 0.0 {
            latency = 0.0;
            per_token = if n > 0.0 { t / n } else { 0.0 };
        }
        Some((latency.max(0.0), per_token.max(0.0), t.max(0.0)))
    }

    /// The estimate as the rule reads it, for a tier served by `workers` workers.
    pub fn snapshot(&self, workers: usize) -> TierEstimate {
        let samples = self.samples.load(Ordering::Relaxed);
        let returned = self.returned.load(Ordering::Relaxed);
        let in_flight = self
            .dispatched
            .load(Ordering::Relaxed)
            .saturating_sub(returned);
        if samples == 0 {
            return TierEstimate {
                in_flight,
                ..TierEstimate::default()
            };
        }
        let (latency, per_token, t) = self.line().unwrap_or((0.0, 0.0, 0.0));
        let w = workers.max(1) as f64;
        let ahead = (in_flight as f64 + 1.0 - w).max(0.0);
        let failure = read(&self.failure).clamp(0.0, 1.0);
        let failed_ns = read(&self.failed_ns).max(0.0);
        // A load ahead takes what landed loads take, or what failed ones do, by their shares.
        let service = (1.0 - failure) * t.max(0.0) + failure * failed_ns;
        TierEstimate {
            samples,
            latency_ns: latency,
            ns_per_token: per_token,
            queue_ns: ahead * service / w,
            failure,
            mean_tokens: read(&self.mean_tokens).max(0.0),
            failed_ns,
            in_flight,
        }
    }
}

impl crate::runtime::Runtime {
    /// The tier's load estimate as the `cost` load policy reads it now (measured under either
    /// policy).
    pub fn load_estimate(&self) -> TierEstimate {
        let workers = self.inner.settings.first().map_or(1, |s| s.workers);
        self.inner.load_estimate.snapshot(workers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_and_bandwidth_come_from_loads_of_several_sizes() {
        let e = LoadEstimate::default();
        let now = Instant::now();
        // 1 ms + 1 µs per token, exactly.
        for &n in [100u64, 1000, 5000, 200, 3000, 800].iter().cycle().take(60) {
            e.measured(n, Duration::from_nanos(1_000_000 + 1000 * n), true, now);
        }
        let s = e.snapshot(2);
        assert_eq!(s.samples, 60);
        assert!((s.latency_ns - 1e6).abs() < 1e3, "{s:?}");
        assert!((s.ns_per_token - 1e3).abs() < 1.0, "{s:?}");
        assert_eq!((s.failure, s.queue_ns, s.in_flight), (0.0, 0.0, 0));
    }

    #[test]
    fn a_failing_tier_is_seen_failing_and_recovers() {
        let e = LoadEstimate::default();
        let now = Instant::now();
        let ms = Duration::from_millis(1);
        for _ in 0..20 {
            e.measured(512, ms, false, now);
        }
        assert!(e.snapshot(1).failure > 0.99);
        // Damped: a few loads that land do not clear it, enough of them do.
        for _ in 0..4 {
            e.measured(512, ms, true, now);
        }
        let s = e.snapshot(1);
        assert!(s.failure > 0.5, "{s:?}");
        for _ in 0..40 {
            e.measured(512, ms, true, now);
        }
        let s = e.snapshot(1);
        assert!(s.failure < 0.01, "{s:?}");
        assert_eq!(s.mean_tokens, 512.0);
        assert!((s.failed_ns - 1e6).abs() < 1.0, "{s:?}");
    }

    #[test]
    fn one_slow_load_does_not_make_a_fast_tier_slow() {
        let e = LoadEstimate::default();
        let now = Instant::now();
        for _ in 0..20 {
            e.measured(100, Duration::from_micros(20), true, now);
        }
        // A load kept off its core for 5 ms counts as twice the 20 µs expected.
        e.measured(100, Duration::from_millis(5), true, now);
        let s = e.snapshot(1);
        assert!((s.ns_per_token - 250.0).abs() < 1.0, "{s:?}");
        // A tier that really slowed down is followed, a quarter a load.
        for _ in 0..40 {
            e.measured(100, Duration::from_millis(5), true, now);
        }
        assert!(e.snapshot(1).ns_per_token > 40_000.0);
    }

    #[test]
    fn failed_loads_stay_out_of_the_service_line() {
        let e = LoadEstimate::default();
        let now = Instant::now();
        // Landed: 100 µs + 10 ns a token. Failed: 20 ms (a deadline), whatever the length.
        for &n in [1000u64, 4000, 2000, 8000].iter().cycle().take(40) {
            e.measured(n, Duration::from_nanos(100_000 + 10 * n), true, now);
            e.measured(n, Duration::from_millis(20), false, now);
        }
        let s = e.snapshot(1);
        assert!((s.latency_ns - 1e5).abs() < 1e2, "{s:?}");
        assert!((s.ns_per_token - 10.0).abs() < 0.1, "{s:?}");
        assert!((s.failed_ns - 2e7).abs() < 1.0, "{s:?}");
        assert!((s.failure - 0.5).abs() < 0.1, "{s:?}");
        assert!(s.mean_tokens > 1000.0 && s.mean_tokens < 8000.0, "{s:?}");
    }

    #[test]
    fn loads_past_the_free_workers_queue() {
        let e = LoadEstimate::default();
        let now = Instant::now();
        e.measured(100, Duration::from_micros(400), true, now);
        for _ in 0..5 {
            e.dispatched();
        }
        // 5 in flight on 2 workers: a new one waits for 4 of them, two at a time.
        let s = e.snapshot(2);
        assert_eq!(s.in_flight, 5);
        assert!((s.queue_ns - 2.0 * 400e3).abs() < 1.0, "{s:?}");
        for _ in 0..5 {
            e.returned();
        }
        assert_eq!(e.snapshot(2).queue_ns, 0.0);
    }

    #[test]
    fn one_probe_per_quiet_interval() {
        let e = LoadEstimate::default();
        let t0 = Instant::now();
        let i = Duration::from_millis(100);
        assert!(!e.try_probe(t0 + i * 5, i), "nothing measured: no probe");
        e.measured(100, Duration::from_micros(10), false, t0);
        assert!(!e.try_probe(t0 + i / 2, i), "measured recently");
        assert!(e.try_probe(t0 + i * 2, i));
        assert!(!e.try_probe(t0 + i * 2, i), "one probe per interval");
        assert!(e.try_probe(t0 + i * 3, i));
    }
}
