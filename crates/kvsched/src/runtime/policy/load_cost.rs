//! Load or recompute, by cost: how many tokens of a lookup hit an admitted request loads; the
//! rest of the hit is recomputed by the engine.
//!
//! A hit is a run of tokens past the local prefix, served by one or more tiers in order
//! ([`TierHit`]: the tokens a tier serves and that tier's [`TierEstimate`], measured as the run
//! goes by `runtime::load_estimate`). The engine recomputes a token in `c = 1e9 / compute_rate`
//! ns. The rule, under [`LoadPolicy::Cost`]:
//!
//! * **The cost of loading a tier's segment** of `n` tokens is `Q + L + n·B + f·n·c`: the wait
//!   for a worker `Q`, the tier's latency `L` and per-token time `B` (1 / bandwidth), and, with
//!   the share `f` of its recent loads that failed, the recompute a failed load leaves behind.
//!   A tier with no measured load yet costs nothing (it is loaded: that is how it gets
//!   measured).
//! * **The cost of loading the first `k` tokens** of the hit is the sum of the costs of the
//!   segments they cover, plus `(H − k)·c` to recompute the rest of the hit (`H` tokens). The
//!   load stops only at a segment's end (`k` is 0, a segment boundary or `H`): inside one
//!   segment the cost is linear in the tokens, so its best point is one of its ends.
//! * **The request loads the `k` of least cost**, the largest such `k` on a tie (so a tier
//!   whose loads cost no more than recomputing is loaded whole, as `always` would).
//! * **A probe loads the whole hit** whatever the estimate says: the caller grants one probe
//!   per tier and probe interval (`Settings::load_probe_interval`), so a tier that stopped
//!   being loaded is measured again and recovers its share when it recovers.
//!
//! Monotone by construction: a segment whose cost goes down (a faster tier, a shorter queue,
//! fewer failures) can only move the least-cost `k` to or past its end, never before it; a
//! segment whose cost goes up, only to or before its start. A faster engine (a smaller `c`)
//! never loads more. Under [`LoadPolicy::Always`] the whole hit is loaded, under
//! [`LoadPolicy::Never`] none of it.
//!
//! Plain data in, plain data out: no atomics, no allocation (called at every admission).

/// Which share of a lookup hit an admitted request loads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadPolicy {
    /// Every hit is loaded whole, whatever it costs.
    #[default]
    Always,
    /// The share of a hit whose load the tier's measured estimate says is cheaper than
    /// recomputing it at the engine's compute rate (`runtime::policy::load_cost`).
    Cost,
    /// No hit is loaded: every prompt recomputes past its local prefix (a baseline to compare
    /// the other two with).
    Never,
}

impl LoadPolicy {
    /// The policy's name as the command line spells it: `always` or `cost`.
    pub fn name(self) -> &'static str {
        match self {
            LoadPolicy::Always => "always",
            LoadPolicy::Cost => "cost",
            LoadPolicy::Never => "never",
        }
    }
}

/// A tier's measured load cost, as the admission reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct TierEstimate {
    /// Loads measured so far (0: nothing is known, and the tier's loads cost nothing).
    pub samples: u64,
    /// Fixed time of one load, ns.
    pub latency_ns: f64,
    /// Time per loaded token, ns (1 / bandwidth).
    pub ns_per_token: f64,
    /// Wait before a worker starts a load dispatched now, ns (the loads ahead of it).
    pub queue_ns: f64,
    /// Share of the tier's recent loads that failed (0–1).
    pub failure: f64,
    /// Loads of the tier in flight now (dispatched, not returned).
    pub in_flight: u64,
}

impl TierEstimate {
    /// The expected cost, ns, of loading `tokens` tokens from the tier for an engine that
    /// recomputes a token in `recompute_ns` (the module docs give the formula); 0 for an
    /// unmeasured tier or no tokens.
    pub fn load_ns(&self, tokens: u64, recompute_ns: f64) -> f64 {
        if self.samples == 0 || tokens == 0 {
            return 0.0;
        }
        let n = tokens as f64;
        let f = if planted!("cost-ignores-failures") {
            0.0 // a failing tier costs what a healthy one does
        } else {
            self.failure.clamp(0.0, 1.0)
        };
        let cost = self.queue_ns.max(0.0)
            + self.latency_ns.max(0.0)
            + n * self.ns_per_token.max(0.0)
            + f * n * recompute_ns;
        if cost.is_nan() {
            0.0
        } else {
            cost
        }
    }
}

/// The tokens one tier serves of a hit, with that tier's estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TierHit {
    /// Tokens of the hit this tier serves (its segment follows the previous tier's).
    pub tokens: u64,
    /// The tier's estimate.
    pub estimate: TierEstimate,
}

/// Why a hit was loaded as far as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadReason {
    /// Policy `always`, or no hit: the whole hit is loaded.
    Always,
    /// Loading the chosen tokens costs no more than recomputing them.
    Cheaper,
    /// The estimate said recompute, but this admission is its tier's probe: loaded whole.
    Probe,
    /// Policy `never`: nothing is loaded.
    Never,
}

/// A decision: the tokens of the hit to load (the rest is recomputed), why, and the two
/// costs it weighed, ns (for the report: what loading the whole hit would cost, and what
/// recomputing it would).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadDecision {
    /// Tokens of the hit to load, from its start.
    pub load: u64,
    /// Why.
    pub reason: LoadReason,
    /// Estimated cost of loading the whole hit, ns.
    pub load_all_ns: f64,
    /// Cost of recomputing the whole hit, ns.
    pub recompute_all_ns: f64,
}

/// The tokens of a hit (`hit`, one entry per tier in order) to load under `policy` for an
/// engine computing `compute_rate` tokens per second; `probe` when this admission is its
/// tier's probe. Never more than the hit's tokens; see the module docs for the rule.
pub fn load_tokens(
    policy: LoadPolicy,
    hit: &[TierHit],
    compute_rate: f64,
    probe: bool,
) -> LoadDecision {
    let total = hit.iter().fold(0u64, |t, h| t.saturating_add(h.tokens));
    let c = if compute_rate > 0.0 && compute_rate.is_finite() {
        1e9 / compute_rate
    } else {
        0.0
    };
    let recompute_all_ns = total as f64 * c;
    let mut decision = LoadDecision {
        load: total,
        reason: LoadReason::Always,
        load_all_ns: 0.0,
        recompute_all_ns,
    };
    if policy == LoadPolicy::Never {
        decision.load = 0;
        decision.reason = LoadReason::Never;
        return decision;
    }
    if policy == LoadPolicy::Always || total == 0 {
        decision.load_all_ns = hit.iter().map(|h| h.estimate.load_ns(h.tokens, c)).sum();
        return decision;
    }
    // cost(0) = H·c; each segment loaded swaps its recompute for its load cost.
    let mut best = (recompute_all_ns, 0u64);
    let mut cost = recompute_all_ns;
    let mut end = 0u64;
    for h in hit.iter().filter(|h| h.tokens > 0) {
        cost += h.estimate.load_ns(h.tokens, c) - h.tokens as f64 * c;
        end = end.saturating_add(h.tokens);
        // `<=`: on a tie the longer load wins.
        if cost <= best.0 {
            best = (cost, end);
        }
    }
    decision.load_all_ns = hit.iter().map(|h| h.estimate.load_ns(h.tokens, c)).sum();
    decision.load = best.1;
    decision.reason = LoadReason::Cheaper;
    if best.1 < total && probe {
        decision.load = total;
        decision.reason = LoadReason::Probe;
    }
    decision
}

#[cfg(test)]
#[path = "load_cost_tests.rs"]
mod tests;
