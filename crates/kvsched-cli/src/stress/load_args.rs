//! `--load-policy` and `--compute-rate`: how much of a lookup hit a request loads, and the
//! engine's compute rate the `cost` policy weighs a load against.

use serde::{Serialize, Serializer};

use super::config::StressConfig;
use kvsched::runtime::{LoadPolicy, Settings};

/// The load-policy flags of `kvsched stress`.
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct LoadArgs {
    /// How much of a lookup hit a request loads: `always` (all of it), `cost` (what the
    /// tier's estimate, measured as the run goes, says is cheaper to load than to recompute at
    /// --compute-rate; docs/runtime.md, "Load or recompute") or `never` (none: to compare).
    #[arg(long, default_value = "always", value_parser = parse_load_policy)]
    #[serde(serialize_with = "ser_load_policy")]
    pub load_policy: LoadPolicy,
    /// The engine's compute rate in prompt tokens per second, for `--load-policy cost`
    /// (default: the simulated engine's, --token-budget tokens per --model-us, at least 1 µs).
    #[arg(long, value_name = "TOKENS_PER_S", allow_negative_numbers = true, value_parser = parse_compute_rate)]
    pub compute_rate: Option<f64>,
}

impl LoadArgs {
    /// The compute rate the run's scheduler is given: `--compute-rate`, or the simulated
    /// engine's (its step takes --model-us whatever it computes, up to --token-budget).
    pub fn compute_rate(&self, cfg: &StressConfig) -> f64 {
        self.compute_rate
            .unwrap_or(cfg.token_budget as f64 * 1e6 / cfg.model_us.max(1) as f64)
    }

    /// `settings` with the run's load policy and compute rate.
    pub(super) fn settings(&self, cfg: &StressConfig, settings: Settings) -> Settings {
        settings
            .with_load_policy(self.load_policy)
            .with_compute_rate(Some(self.compute_rate(cfg)))
    }
}

/// Parses `--load-policy`.
pub fn parse_load_policy(s: &str) -> Result<LoadPolicy, String> {
    match s {
        "always" => Ok(LoadPolicy::Always),
        "cost" => Ok(LoadPolicy::Cost),
        "never" => Ok(LoadPolicy::Never),
        _ => Err(format!("expected `always`, `cost` or `never`, got `{s}`")),
    }
}

/// Parses `--compute-rate`: a finite number of tokens per second, at least 0.001 (the
/// runtime's bound: below it a token's cost overflows the rule's arithmetic).
fn parse_compute_rate(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r >= 1e-3)
        .ok_or_else(|| format!("expected tokens per second, a number ≥ 0.001, got `{s}`"))
}

fn ser_load_policy<S: Serializer>(p: &LoadPolicy, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}
