//! Load or recompute, by cost: how many tokens of a lookup hit an admitted request loads; the
//! rest of the hit is recomputed by the engine.
//!
//! A hit is a run of tokens past the local prefix, served by one or more tiers in order
//! ([`TierHit`]: the tokens a tier serves and that tier's [`TierEstimate`], measured as the run
//! goes by `runtime::load_estimate`). The rule, under [`LoadPolicy::Cost`]:
//!
//! * **What a recomputed token costs.** The engine recomputes a token in `c₀ = 1e9 /
//!   compute_rate` ns, and while it does, the `w` requests waiting behind this one for
//!   admission wait too; a load runs on a worker beside the engine and delays only its own
//!   request. A recomputed token therefore costs `c = c₀·(1 + w)`.
//! * **A load of `m` tokens fails** with probability `p(m) = 1 − (1 − f)^(m / n̄)`: the share `f`
//!   of the tier's recent loads that failed, of `n̄` tokens on average, read as a constant risk
//!   per token (a chunk read that times out or comes back damaged fails the load), so a long
//!   load fails more often than a short one.
//! * **The cost of loading the first `m` tokens of a tier's segment** is
//!   `E(m) = Q + (1 − p)·(L + m·B) + p·(T + m·c)`: the wait for a worker `Q`; if the load
//!   lands, the tier's latency `L` and per-token time `B` (1 / bandwidth); if it fails, the
//!   time a failed load took `T` (at least `L`: a deadline passed, typically) and the recompute
//!   it leaves behind. A tier with no measured load yet costs nothing (it is loaded: that is how
//!   it gets measured). A term an estimate does not know (NaN) reads as 0; a tier whose `Q`,
//!   `L` or `B` is infinite (or `T`, when it fails at all) is read as failing every load.
//! * **The cost of loading the first `k` tokens** of the hit is the sum of the costs of the
//!   segments they cover (the last one maybe in part), plus `(H − k)·c` to recompute the rest
//!   of the hit (`H` tokens). Inside a segment, `E(m) − m·c = Q + T − e^(−λm)·(T − L + m·(c −
//!   B))` with `λ = −ln(1 − f) / n̄`, least at `m* = 1/λ − (T − L)/(c − B)` (the function is
//!   unimodal): so the load stops at 0, at a segment's end, or at a segment's `m*`, where a
//!   longer load risks more in failures than it saves.
//! * **The request loads the `k` of least cost**, the largest such `k` on a tie (so a tier
//!   that never fails and whose loads cost no more than recomputing is loaded whole, as
//!   `always` would). The caller rounds `k` down to where every group can resume.
//! * **A probe** is granted by the caller once per tier and probe interval
//!   (`Settings::load_probe_interval`) to an admission the rule would load less of: it loads
//!   up to the tokens at which half the tier's loads would fail (`ln 2 / λ`; the whole hit for
//!   a tier that does not fail), so a tier that stopped being loaded is measured again, with a
//!   load likely to land, and recovers its share when it recovers.
//!
//! Monotone, one tier (the runtime's case; the properties test it): more failures, a deeper
//! queue or a faster engine never load more; a faster tier (a smaller latency, per-token and
//! failed-load time), more requests waiting behind, never load less. Under
//! [`LoadPolicy::Always`] the whole hit is loaded, under [`LoadPolicy::Never`] none of it.
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
    /// Fixed time of one load that landed, ns.
    pub latency_ns: f64,
    /// Time per loaded token of a load that landed, ns (1 / bandwidth).
    pub ns_per_token: f64,
    /// Wait before a worker starts a load dispatched now, ns (the loads ahead of it).
    pub queue_ns: f64,
    /// Share of the tier's recent loads that failed (0–1).
    pub failure: f64,
    /// Mean tokens of the tier's recent loads, those `failure` counts (0: unknown; the share
    /// is then taken for any load, whatever its length).
    pub mean_tokens: f64,
    /// Mean time a failed load took, ns (to its failed completion, or to its deadline).
    pub failed_ns: f64,
    /// Loads of the tier in flight now (dispatched, not returned).
    pub in_flight: u64,
}

/// One tier's estimate as the rule weighs it, for an engine recomputing a token in `c` ns:
/// every term non-negative, and finite but for a tier whose loads never land (`λ`, `Q` and `T`
/// infinite: every load fails, after waiting forever).
#[derive(Clone, Copy, Debug)]
struct Terms {
    q: f64,
    l: f64,
    b: f64,
    /// A failed load's time, at least `l`.
    t: f64,
    /// Failure risk per token (0: never fails; infinite: every load fails).
    lambda: f64,
    c: f64,
}

/// The largest finite term: products with a token count (at most 2⁶⁴) stay finite, so the
/// rule's arithmetic never meets `∞ − ∞` or `0·∞`.
const CAP: f64 = 1e280;

/// A time or size term: unknown (NaN) or negative reads as 0, `+∞` as itself, anything else
/// at most [`CAP`].
fn term(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else if x == f64::INFINITY {
        x
    } else {
        x.clamp(0.0, CAP)
    }
}

impl Terms {
    fn of(e: &TierEstimate, c: f64) -> Terms {
        // (Planted bug `cost-ignores-failures`: a failing tier costs what a healthy one does.)
        let f = if planted!("cost-ignores-failures") || e.failure.is_nan() {
            0.0
        } else {
            e.failure.clamp(0.0, 1.0)
        };
        let (q, l, b) = (term(e.queue_ns), term(e.latency_ns), term(e.ns_per_token));
        let t = term(e.failed_ns).max(l);
        // A load that waits or takes forever never lands, and one that fails now and then
        // after waiting forever costs forever: the rule reads such a tier as one whose every
        // load fails, which it never loads (an infinite time read as 0 made it free).
        let never_lands = [q, l, b].iter().any(|x| x.is_infinite()) || (f > 0.0 && t.is_infinite());
        let n = term(e.mean_tokens).min(CAP);
        let lambda = if never_lands || f >= 1.0 {
            f64::INFINITY
        } else if f <= 0.0 {
            0.0
        } else if n > 0.0 && !planted!("failure-share-read-per-token") {
            // (Planted bug `failure-share-read-per-token`, scripts/plants.sh: the share of
            // loads that failed is taken for the risk of each token, as if loads were one
            // token long, so any hit longer than a few tokens looks certain to fail.)
            -(1.0 - f).ln() / n
        } else {
            // No sizes known: the share is taken for any load (a risk reached at one token).
            -(1.0 - f).ln()
        };
        let (q, t) = if never_lands {
            (f64::INFINITY, f64::INFINITY)
        } else {
            // A tier that never fails: a failed load's time weighs nothing.
            (q, t.min(CAP))
        };
        Terms {
            q,
            l,
            b,
            t,
            lambda,
            // An engine that recomputes forever (a compute rate of almost 0): as dear as can be.
            c: term(c).min(CAP),
        }
    }

    /// `P(the load of m tokens lands)`.
    fn lands(&self, m: f64) -> f64 {
        if self.lambda == 0.0 {
            1.0
        } else if self.lambda.is_infinite() {
            0.0
        } else {
            (-self.lambda * m).exp()
        }
    }

    /// `E(m) − m·c`: what loading the first `m` tokens of the segment adds to recomputing
    /// them (negative: the load saves time); 0 for `m = 0`.
    fn delta(&self, m: f64) -> f64 {
        if m <= 0.0 {
            return 0.0;
        }
        if self.lambda.is_infinite() {
            // Every load fails: never loaded (nor anything past it).
            return f64::INFINITY;
        }
        let g = self.lands(m);
        let d = self.q + g * (self.l + m * self.b) + (1.0 - g) * (self.t + m * self.c) - m * self.c;
        if d.is_nan() {
            0.0
        } else {
            d
        }
    }

    /// The interior `m*` (`1/λ − (T − L)/(c − B)`) where a longer load starts to risk more
    /// than it saves, when it lies inside `(0, n)`.
    fn interior(&self, n: f64) -> Option<f64> {
        let d = self.c - self.b;
        if self.lambda == 0.0 || self.lambda.is_infinite() || d <= 0.0 {
            return None;
        }
        let m = 1.0 / self.lambda - (self.t - self.l) / d;
        (m > 0.0 && m < n).then_some(m)
    }
}

impl TierEstimate {
    /// The expected cost, ns, of loading `tokens` tokens from the tier for an engine that
    /// recomputes a token in `recompute_ns` (the module docs give the formula: the failed
    /// share of loads that long recomputes them); 0 for an unmeasured tier or no tokens.
    pub fn load_ns(&self, tokens: u64, recompute_ns: f64) -> f64 {
        if self.samples == 0 || tokens == 0 {
            return 0.0;
        }
        let n = tokens as f64;
        let terms = Terms::of(self, recompute_ns);
        if terms.lambda.is_infinite() {
            // Every load fails: its wait, then the recompute.
            return terms.q + terms.t + n * terms.c;
        }
        terms.delta(n) + n * terms.c
    }

    /// The probability that a load of `tokens` tokens from the tier fails, by the estimate.
    pub fn failure_of(&self, tokens: u64) -> f64 {
        if self.samples == 0 || tokens == 0 {
            return 0.0;
        }
        1.0 - Terms::of(self, 0.0).lands(tokens as f64)
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

/// What the engine's side of the comparison is: its compute rate, and the requests that wait
/// behind this one while it recomputes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Engine {
    /// Prompt tokens a second (0 or not finite: recomputing is taken as free).
    pub compute_rate: f64,
    /// Requests waiting for admission behind this one.
    pub waiting_behind: u64,
}

impl Engine {
    /// `c`, ns: what a recomputed token costs (module docs).
    pub fn recompute_ns(&self) -> f64 {
        if self.compute_rate > 0.0 && self.compute_rate.is_finite() {
            1e9 / self.compute_rate * (1.0 + self.waiting_behind as f64)
        } else {
            0.0
        }
    }
}

/// Why a hit was loaded as far as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadReason {
    /// Policy `always`, or no hit: the whole hit is loaded.
    Always,
    /// Loading the chosen tokens (all, part or none of the hit) costs least.
    Cheaper,
    /// The estimate said load less, but this admission is its tier's probe.
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

/// The tokens of a hit (`hit`, one entry per tier in order) to load under `policy` for
/// `engine`; `probe` when this admission is its tier's probe. Never more than the hit's
/// tokens; see the module docs for the rule.
pub fn load_tokens(
    policy: LoadPolicy,
    hit: &[TierHit],
    engine: Engine,
    probe: bool,
) -> LoadDecision {
    let total = hit.iter().fold(0u64, |t, h| t.saturating_add(h.tokens));
    let c = engine.recompute_ns();
    let recompute_all_ns = total as f64 * c;
    let load_all_ns = hit.iter().map(|h| h.estimate.load_ns(h.tokens, c)).sum();
    let mut decision = LoadDecision {
        load: total,
        reason: LoadReason::Always,
        load_all_ns,
        recompute_all_ns,
    };
    if policy == LoadPolicy::Never {
        decision.load = 0;
        decision.reason = LoadReason::Never;
        return decision;
    }
    if policy == LoadPolicy::Always || total == 0 {
        return decision;
    }
    // Costs relative to recomputing the whole hit: cost(k) − H·c. Loading nothing adds 0;
    // each whole segment loaded adds its delta, a segment loaded in part (at its end or its
    // m*) ends the load.
    let mut best = (0.0f64, 0u64);
    let mut before = 0.0f64;
    let mut start = 0u64;
    for h in hit.iter().filter(|h| h.tokens > 0) {
        let n = h.tokens as f64;
        let delta = |m: f64| {
            if h.estimate.samples == 0 {
                -m * c // unmeasured: loaded, to be measured
            } else {
                Terms::of(&h.estimate, c).delta(m)
            }
        };
        let interior = if h.estimate.samples == 0 {
            None
        } else {
            Terms::of(&h.estimate, c).interior(n)
        };
        if let Some(m) = interior {
            // Whole tokens: the load stops at or before m*.
            let m = m.floor();
            let cost = before + delta(m);
            let k = start.saturating_add(m as u64);
            if m >= 1.0 && (cost < best.0 || (cost == best.0 && k > best.1)) {
                best = (cost, k);
            }
        }
        before += delta(n);
        start = start.saturating_add(h.tokens);
        // `<=`: on a tie the longer load wins.
        if before <= best.0 {
            best = (before, start);
        }
    }
    decision.load = best.1.min(total);
    decision.reason = LoadReason::Cheaper;
    if probe && decision.load < total {
        let first = hit.iter().find(|h| h.tokens > 0).map(|h| h.estimate);
        let half = first.map_or(f64::INFINITY, |e| {
            let lambda = Terms::of(&e, c).lambda;
            if lambda > 0.0 {
                std::f64::consts::LN_2 / lambda
            } else {
                f64::INFINITY
            }
        });
        // At least one token: a probe loads something.
        let size = if half >= total as f64 {
            total
        } else {
            (half as u64).max(1)
        };
        if size > decision.load {
            decision.load = size;
            decision.reason = LoadReason::Probe;
        }
    }
    decision
}

#[cfg(test)]
#[path = "load_cost_tests.rs"]
mod tests;
