//! [`Stats`]: the median and min–max of one figure over the runs of a report.

use serde::Serialize;

/// A figure's values over the runs of one scheduler.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stats {
    /// The median (the mean of the middle two for an even number of runs).
    pub median: f64,
    /// The least run.
    pub min: f64,
    /// The greatest run.
    pub max: f64,
    /// Every run's value, in run order (the runs that have one).
    pub runs: Vec<f64>,
}

impl Stats {
    /// The statistics of `values` (`None` when there are none).
    pub(super) fn of(values: Vec<f64>) -> Option<Stats> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Stats {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            runs: values,
        })
    }

    /// Whether the runs disagree on which side of 1 the value is (min < 1 < max).
    pub fn crosses_1(&self) -> bool {
        self.min < 1.0 && self.max > 1.0
    }
}
