//! The live [`Settings`]: validated when set, swapped in without a lock
//! ([`Runtime::update_settings`]), read by the shards as one snapshot per step.

use std::sync::Arc as StdArc;
use std::time::Duration;

use crate::rules::recovery::{Mode, Policy};
use crate::runtime::error::RuntimeError;
use crate::runtime::policy::load_cost::LoadPolicy;
use crate::runtime::step::Runtime;

/// Settings that can change while the runtime runs ([`Runtime::update_settings`]). Shards
/// read one snapshot per step, so a change applies from the next step, never mid-step.
///
/// Built from [`Settings::default`] and the `with_*` setters (or by assigning its fields):
/// it may grow, so it is `#[non_exhaustive]`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Settings {
    /// Recovery mode (default `safe`).
    pub mode: Mode,
    /// Recovery policy (default `recompute`).
    pub policy: Policy,
    /// Deadline of an async load from its dispatch (default 5 s; `None`: none). A load past it
    /// is treated as failed for all its blocks; its late completion is counted stale, and its
    /// blocks stay parked (never reused) until it lands. The steps judge it: a completion
    /// queued before the first step that finds the deadline passed is applied as it came.
    pub load_deadline: Option<Duration>,
    /// Failed external loads after which a request is offered no more (default 2): its next
    /// attempt recomputes locally.
    pub max_load_retries: u32,
    /// Consecutive failed loads of one prefix, across requests, that quarantine it (default 3;
    /// 0 disables quarantine).
    pub quarantine_after: u32,
    /// How long a quarantined prefix gets no external load (default 10 s).
    pub quarantine_for: Duration,
    /// How much of a lookup hit an admitted request loads (default `always`: all of it);
    /// `cost` loads what the tier's measured estimate says is cheaper than recomputing
    /// (docs/runtime.md, "Load or recompute"); `never` loads nothing.
    pub load_policy: LoadPolicy,
    /// The engine's compute rate in prompt tokens per second, which the `cost` load policy
    /// weighs a load against (default `None`; required by `cost`, finite and at least 0.001,
    /// a token per 1,000 s: below that a token's cost overflows the rule's arithmetic).
    pub compute_rate: Option<f64>,
    /// Under the `cost` load policy, how long the tier may go unmeasured before one admission
    /// loads a hit the estimate would recompute, to measure the tier again (default 1 s).
    pub load_probe_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mode: Mode::Safe,
            policy: Policy::Recompute,
            load_deadline: Some(Duration::from_secs(5)),
            max_load_retries: 2,
            quarantine_after: 3,
            quarantine_for: Duration::from_secs(10),
            load_policy: LoadPolicy::Always,
            compute_rate: None,
            load_probe_interval: Duration::from_secs(1),
        }
    }
}

with_setters!(Settings {
    with_mode: mode: Mode,
    with_policy: policy: Policy,
    with_load_deadline: load_deadline: Option<Duration>,
    with_max_load_retries: max_load_retries: u32,
    with_quarantine_after: quarantine_after: u32,
    with_quarantine_for: quarantine_for: Duration,
    with_load_policy: load_policy: LoadPolicy,
    with_compute_rate: compute_rate: Option<f64>,
    with_load_probe_interval: load_probe_interval: Duration,
});

impl Settings {
    pub(super) fn validate(&self) -> Result<(), RuntimeError> {
        if self.load_deadline.is_some_and(|d| d.is_zero()) {
            return Err(RuntimeError::Config {
                field: "load_deadline",
                problem: "must be > 0 (or None)".into(),
            });
        }
        if self
            .compute_rate
            .is_some_and(|r| !(r.is_finite() && r >= 1e-3))
        {
            return Err(RuntimeError::Config {
                field: "compute_rate",
                problem: "must be a finite number of tokens per second, at least 0.001 (or None)"
                    .into(),
            });
        }
        if self.load_policy == LoadPolicy::Cost && self.compute_rate.is_none() {
            return Err(RuntimeError::Config {
                field: "compute_rate",
                problem: "the cost load policy needs the engine's compute rate".into(),
            });
        }
        Ok(())
    }
}

impl Runtime {
    /// Replaces the live settings; they apply from the next step. Lock-free for the shards.
    pub fn update_settings(&self, s: Settings) -> Result<(), RuntimeError> {
        s.validate()?;
        self.inner.live_settings.store(StdArc::new(s));
        Ok(())
    }

    /// The live settings.
    pub fn settings(&self) -> Settings {
        Settings::clone(&self.inner.live_settings.load())
    }
}
