//! `--prefixes`: how many shared base prefixes the synthetic workload's prompts draw from.
//! The default is sized so that the prefixes in play outgrow the default device pool: a
//! prefix comes back after the pool's prefix cache let go of it, and the tier (the run's own
//! saves) serves it — what a KV tier is for.

use serde::Serialize;

use super::config::{StressConfig, StressError};

/// Default of `--prefixes`: 4,096 bases of up to `--prompt-tokens` tokens, of which a prompt
/// takes its first `--prefix-share`. With the defaults (20,000 requests, prompts of 128–512
/// tokens, half from a base) each base comes back about 5 times, 2 s apart at 2,000/s, while
/// the 16,384-block device pool (262,144 tokens) turns over in well under a second.
pub const DEFAULT_PREFIXES: u64 = 4096;
/// The most `--prefixes`.
pub const MAX_PREFIXES: u64 = 1 << 24;

/// `--prefixes N`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct PrefixArgs {
    /// Shared base prefixes the synthetic prompts draw their `--prefix-share` from (1 to
    /// 16777216): a prompt takes the start of one, picked at random. Many prefixes outgrow
    /// the device pool, so that prefixes come back from the tier after the pool evicted them.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PREFIXES, allow_negative_numbers = true, value_parser = super::values::u64_in::<1, MAX_PREFIXES>)]
    pub prefixes: u64,
}

impl Default for PrefixArgs {
    fn default() -> Self {
        PrefixArgs {
            prefixes: DEFAULT_PREFIXES,
        }
    }
}

/// `--prefixes` within its range (a `StressConfig` built in code gets the flag's check).
pub(super) fn check(cfg: &StressConfig) -> Result<(), StressError> {
    let n = cfg.prefix.prefixes;
    if !(1..=MAX_PREFIXES).contains(&n) {
        return Err(StressError::Config {
            flag: "--prefixes",
            problem: format!("must be from 1 to {MAX_PREFIXES}, got {n}"),
        });
    }
    Ok(())
}
