//! The load policy's section of a run's report (`load_policy` in the JSON): what the `cost`
//! policy left to recompute, the tier's estimate it decided by (at shutdown), and the
//! simulated engine's time to first token, by which a policy is judged.

use serde::{Deserialize, Serialize};

use super::report::Percentiles;
use kvsched::runtime::{Metrics, TierEstimate};

/// What the load policy did, and the estimate behind it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LoadPolicyReport {
    /// Admissions whose hit `cost` did not load whole (0 under `always`).
    pub declined_requests: u64,
    /// Tokens of those hits recomputed instead of loaded.
    pub declined_tokens: u64,
    /// Of those admissions, the ones that loaded part of their hit (its head, up to where a
    /// longer load would risk more in failures than it saves).
    #[serde(default)]
    pub partial_requests: u64,
    /// Admissions that loaded a hit the estimate would have recomputed, to measure the tier
    /// again.
    pub probes: u64,
    /// The tier's estimate at shutdown: loads measured.
    pub estimate_samples: u64,
    /// Its latency per load, µs.
    pub estimate_latency_us: f64,
    /// Its time per loaded token, ns.
    pub estimate_ns_per_token: f64,
    /// Its share of recent loads that failed (0–1).
    pub estimate_failure: f64,
    /// The mean length of those loads, tokens.
    #[serde(default)]
    pub estimate_mean_tokens: f64,
    /// The mean time a failed load took, µs.
    #[serde(default)]
    pub estimate_failed_us: f64,
    /// The simulated engine's time to first token, µs (absent for the tiny model, which
    /// reports its own under `model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_first_token_us: Option<Percentiles>,
}

impl LoadPolicyReport {
    /// The section of a run with counters `m`, estimate `e` and first-token times `ttft`.
    pub(super) fn of(m: &Metrics, e: &TierEstimate, ttft: Option<Percentiles>) -> Self {
        let round = |x: f64, d: f64| (x * d).round() / d;
        LoadPolicyReport {
            declined_requests: m.cost_declined_requests,
            declined_tokens: m.cost_declined_tokens,
            partial_requests: m.cost_partial_requests,
            probes: m.cost_probes,
            estimate_samples: e.samples,
            estimate_latency_us: round(e.latency_ns / 1e3, 10.0),
            estimate_ns_per_token: round(e.ns_per_token, 10.0),
            estimate_failure: round(e.failure, 1000.0),
            estimate_mean_tokens: round(e.mean_tokens, 1.0),
            estimate_failed_us: round(e.failed_ns / 1e3, 10.0),
            time_to_first_token_us: ttft,
        }
    }

    /// Two engines' sections merged: counts added, the first engine's estimate and times.
    pub(super) fn merge(&self, o: &LoadPolicyReport) -> LoadPolicyReport {
        LoadPolicyReport {
            declined_requests: self.declined_requests.saturating_add(o.declined_requests),
            declined_tokens: self.declined_tokens.saturating_add(o.declined_tokens),
            partial_requests: self.partial_requests.saturating_add(o.partial_requests),
            probes: self.probes.saturating_add(o.probes),
            ..self.clone()
        }
    }
}
