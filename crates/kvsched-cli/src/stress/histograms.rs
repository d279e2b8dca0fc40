//! Latency histograms (hdrhistogram, one recorder per recording thread, merged at the end)
//! and their percentiles in microseconds.

use std::time::Duration;

use hdrhistogram::sync::{Recorder, SyncHistogram};
use hdrhistogram::Histogram;

use super::config::StressError;
use super::report::Percentiles;

/// The largest latency a histogram records, ns (an hour).
const HIST_MAX_NS: u64 = 3_600_000_000_000;

/// One latency histogram, in nanoseconds.
pub(super) struct Hist(SyncHistogram<u64>);

impl Hist {
    fn new() -> Result<Self, StressError> {
        Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3)
            .map(|h| Hist(h.into_sync()))
            .map_err(|e| StressError::Histogram(format!("{e:?}")))
    }
    /// The percentile curve (see [`Curve`]), from the same data as [`Hist::percentiles`].
    pub(super) fn curve(&mut self) -> Curve {
        self.0.refresh_timeout(Duration::from_secs(1));
        let h: &Histogram<u64> = &self.0;
        if h.is_empty() {
            return Curve::new();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        let top = (h.len() as f64).log10().min(CURVE_MAX_NINES);
        let mut points = Vec::new();
        let mut i = 0u32;
        loop {
            let x = f64::from(i) * CURVE_STEP;
            if x >= top {
                break;
            }
            points.push((x, us(h.value_at_quantile(1.0 - 10f64.powf(-x)))));
            i += 1;
        }
        points.push((top, us(h.max())));
        points
    }

    pub(super) fn percentiles(&mut self, p90: bool) -> Percentiles {
        self.0.refresh_timeout(Duration::from_secs(1));
        let h: &Histogram<u64> = &self.0;
        if h.is_empty() {
            return Percentiles {
                p90: p90.then_some(0.0),
                ..Percentiles::default()
            };
        }
        let us = |ns: u64| (ns as f64 / 100.0).round() / 10.0;
        Percentiles {
            p50: us(h.value_at_quantile(0.5)),
            p90: p90.then(|| us(h.value_at_quantile(0.9))),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            count: h.len(),
        }
    }
}

/// How finely a curve samples the percentile axis, in nines (x = −log10(1 − q)).
const CURVE_STEP: f64 = 0.025;
/// The most nines a curve reaches (p99.9999).
const CURVE_MAX_NINES: f64 = 6.0;

/// A latency distribution as a percentile curve: points (x, µs) where x = −log10(1 − q) is
/// the quantile q in "nines" (0 = the minimum, 1 = p90, 2 = p99, 3 = p99.9), up to the
/// nines its sample count resolves, ending at the maximum.
pub type Curve = Vec<(f64, f64)>;

/// The latency curves a plot draws, one run's.
#[derive(Clone, Debug, Default)]
pub struct Curves {
    /// Step overhead.
    pub step: Curve,
    /// Load completion → runnable.
    pub runnable: Curve,
}

/// One thread's recorders (the engine thread's; any thread that records gets its own).
pub(super) struct Recorders {
    pub(super) step: Recorder<u64>,
    pub(super) step_cpu: Recorder<u64>,
    pub(super) first_schedule: Recorder<u64>,
    pub(super) runnable: Recorder<u64>,
}

/// `d` in nanoseconds, at least 1 (the histograms' lowest value).
pub(super) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// The latency histograms of a run.
pub(super) struct Hists {
    /// `schedule()` + `update()` wall time.
    pub(super) step: Hist,
    /// `schedule()` + `update()` CPU time of the engine thread.
    pub(super) step_cpu: Hist,
    /// Scheduled arrival → first scheduled.
    pub(super) first_schedule: Hist,
    /// Load completion → runnable.
    pub(super) runnable: Hist,
}

impl Hists {
    pub(super) fn new() -> Result<Self, StressError> {
        Ok(Hists {
            step: Hist::new()?,
            step_cpu: Hist::new()?,
            first_schedule: Hist::new()?,
            runnable: Hist::new()?,
        })
    }

    /// Recorders for the calling thread (drop them before reading the percentiles).
    pub(super) fn recorders(&self) -> Recorders {
        Recorders {
            step: self.step.0.recorder(),
            step_cpu: self.step_cpu.0.recorder(),
            first_schedule: self.first_schedule.0.recorder(),
            runnable: self.runnable.0.recorder(),
        }
    }
}
