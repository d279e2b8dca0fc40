//! Time to first token of the simulated engine's requests: from a request's scheduled arrival
//! to the end of the engine step that sampled its first token (the tiny model records its own,
//! `model`). What a load that does not pay costs shows here: the request waits for it before
//! its prompt's last chunk can run.

use std::time::Instant;

use rustc_hash::FxHashMap;

use super::model::{percentiles, ModelReport};
use super::report::Percentiles;
use kvsched::runtime::StepOutput;

/// Arrivals of the requests that have not sampled yet, and the times of those that have.
#[derive(Debug, Default)]
pub(super) struct FirstTokens {
    arrivals: FxHashMap<String, Instant>,
    ttft_ns: Vec<u64>,
}

impl FirstTokens {
    /// Request `id` arrived at `arrival`.
    pub(super) fn arrived(&mut self, id: &str, arrival: Instant) {
        self.arrivals.insert(id.to_owned(), arrival);
    }

    /// Request `id` ended (or was refused) before its first token.
    pub(super) fn forget(&mut self, id: &str) {
        self.arrivals.remove(id);
    }

    /// The engine answered a step with `out`, now.
    pub(super) fn sampled(&mut self, out: &StepOutput) {
        if out.sampled.is_empty() {
            return;
        }
        let now = Instant::now();
        for id in &out.sampled {
            if let Some(at) = self.arrivals.remove(&**id) {
                let ns = now.saturating_duration_since(at).as_nanos();
                self.ttft_ns.push(u64::try_from(ns).unwrap_or(u64::MAX));
            }
        }
    }

    /// The percentiles, µs.
    pub(super) fn percentiles(&self) -> Percentiles {
        percentiles(&self.ttft_ns)
    }
}

/// The engine's timing sections of a run's report: the model's (tiny model only) and the
/// simulated engine's time to first token (sim engine only).
#[derive(Debug, Default)]
pub(super) struct EngineTimes {
    pub(super) model: Option<ModelReport>,
    pub(super) first_token_us: Option<Percentiles>,
}
