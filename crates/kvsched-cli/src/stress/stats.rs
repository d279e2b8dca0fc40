//! [`Stats`]: the median and min–max of one figure over the runs of a report, and
//! [`median_value`]: the median run of a report, key by key.

use serde::Serialize;
use serde_json::Value;

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

/// The median of the JSON values `vs` (of one key, `key`, in each run), see
/// `RunReport::median`.
pub(super) fn median_value(key: &str, vs: &[&Value]) -> Value {
    let Some(first) = vs.first() else {
        return Value::Null;
    };
    match first {
        Value::Object(o) => Value::Object(
            o.keys()
                .map(|k| {
                    let sub: Vec<&Value> = vs.iter().filter_map(|v| v.get(k)).collect();
                    (k.clone(), median_value(k, &sub))
                })
                .collect(),
        ),
        Value::Bool(_) => {
            let b = vs.iter().filter_map(|v| v.as_bool());
            Value::Bool(if key == "timed_out" {
                b.into_iter().any(|b| b)
            } else {
                b.into_iter().all(|b| b)
            })
        }
        Value::Array(_) => Value::Array(
            vs.iter()
                .enumerate()
                .flat_map(|(i, v)| {
                    v.as_array().into_iter().flatten().map(move |x| match x {
                        Value::String(s) => Value::String(format!("run {}: {s}", i + 1)),
                        x => x.clone(),
                    })
                })
                .collect(),
        ),
        _ => {
            let ints: Option<Vec<u64>> = vs.iter().map(|v| v.as_u64()).collect();
            if let Some(mut ints) = ints {
                ints.sort_unstable();
                let n = ints.len();
                let m = if n % 2 == 1 {
                    ints[n / 2]
                } else {
                    (u128::from(ints[n / 2 - 1]) + u128::from(ints[n / 2])).div_ceil(2) as u64
                };
                return Value::from(m);
            }
            let floats: Vec<f64> = vs.iter().filter_map(|v| v.as_f64()).collect();
            match Stats::of(floats) {
                Some(s) => Value::from((s.median * 1000.0).round() / 1000.0),
                None => (*first).clone(),
            }
        }
    }
}
