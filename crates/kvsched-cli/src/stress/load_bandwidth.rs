//! [`LoadBandwidth`]: how fast a run's loads moved KV bytes out of its store — payload bytes
//! written into KV memory over the wall time spent inside loads (`TierCounts::kv_bytes_loaded`
//! and `TierCounts::load_ns`), named by the tier that served them. The report's KV section
//! shows it (JSON `kv.load_bandwidth`, the human table's "load bandwidth" row).

use serde::{Deserialize, Serialize};

use super::figures::{row, Format, Row};
use super::report::RunReport;
use kvsched::kv::TierCounts;

/// The load bandwidth of a run's store.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LoadBandwidth {
    /// The tier loads read from (`memory`, `disk`, `redis`, `sim`; `+faults` when faulted).
    pub tier: String,
    /// Wall time inside loads, summed over loads (ns): loads running at once each count
    /// theirs, so this is the bandwidth one load sees, failed chunks' time included.
    pub load_ns: u64,
    /// `load_ns` in milliseconds, 3 decimals (the human table's "time in loads, ms").
    #[serde(default)]
    pub load_ms: f64,
    /// `kv_bytes_loaded / load_ns`, GB/s (10⁹ bytes); `null` when no time was spent loading.
    pub gb_per_s: Option<f64>,
}

impl LoadBandwidth {
    /// The bandwidth a connector's counters show, for the tier called `tier`.
    pub(super) fn of(tier: &str, t: &TierCounts) -> LoadBandwidth {
        LoadBandwidth {
            tier: tier.to_string(),
            load_ns: t.load_ns,
            load_ms: ms(t.load_ns),
            gb_per_s: gb_per_s(t.kv_bytes_loaded, t.load_ns),
        }
    }

    /// Two runs' (engines') together: their time summed, the bandwidth of their bytes
    /// (`bytes`, already summed) over it; the tier named once when both name the same one.
    pub(super) fn merge(&self, o: &Self, bytes: u64) -> LoadBandwidth {
        let tier = match (self.tier.as_str(), o.tier.as_str()) {
            (a, "") => a.to_string(),
            ("", b) => b.to_string(),
            (a, b) if a == b => a.to_string(),
            (a, b) => format!("{a}, {b}"),
        };
        let load_ns = self.load_ns.saturating_add(o.load_ns);
        LoadBandwidth {
            tier,
            load_ns,
            load_ms: ms(load_ns),
            gb_per_s: gb_per_s(bytes, load_ns),
        }
    }
}

/// Nanoseconds as milliseconds, rounded to 3 decimals.
fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e3).round() / 1e3
}

/// Bytes per nanosecond, which is GB/s; rounded to 3 decimals.
fn gb_per_s(bytes: u64, ns: u64) -> Option<f64> {
    (ns > 0).then(|| (bytes as f64 / ns as f64 * 1e3).round() / 1e3)
}

/// The KV section's rows for it: GB/s, and the time spent loading.
pub(super) fn rows() -> Vec<Row> {
    vec![
        row!(
            "kv.load_bandwidth.gb_per_s",
            "load bandwidth, GB/s (bytes over time in loads)",
            Format::Fixed(3),
            None,
            |r| r.kv.load_bandwidth.gb_per_s
        ),
        row!(
            "kv.load_bandwidth.load_ms",
            "time in loads, ms",
            Format::Fixed(1),
            None,
            |r| Some(r.kv.load_bandwidth.load_ms)
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_is_bytes_over_load_time_and_merges_over_the_sum() {
        let mut t = TierCounts::default();
        (t.kv_bytes_loaded, t.load_ns) = (3_000_000, 1_000_000);
        let a = LoadBandwidth::of("disk", &t);
        assert_eq!(a.gb_per_s, Some(3.0));
        let b = LoadBandwidth {
            tier: "disk".into(),
            load_ns: 2_000_000,
            load_ms: 2.0,
            gb_per_s: Some(0.5),
        };
        let m = a.merge(&b, 3_000_000 + 1_000_000);
        assert_eq!(
            (m.tier.as_str(), m.load_ns, m.load_ms),
            ("disk", 3_000_000, 3.0)
        );
        assert_eq!(m.gb_per_s, Some(1.333));
        assert_eq!(
            LoadBandwidth::of("memory", &TierCounts::default()).gb_per_s,
            None
        );
        let other = LoadBandwidth {
            tier: "redis".into(),
            ..b
        };
        assert_eq!(a.merge(&other, 1).tier, "disk, redis");
    }
}
