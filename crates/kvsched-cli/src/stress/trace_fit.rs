//! Whether every request of a trace fits the device pool: the runtime refuses a request whose
//! prompt and output cap need more blocks than the pool has, so a trace holding one would
//! end its run with refused submits. `--trace` refuses it up front instead, in one line.

use super::config::{StressConfig, StressError};
use super::trace::TraceRequest;

/// The output cap the replay submits trace request `r` with (its recorded length, 1 at
/// least, at most what a submit carries).
pub(crate) fn max_new_tokens(r: &TraceRequest) -> u32 {
    r.output_length.clamp(1, u64::from(u32::MAX)) as u32
}

/// The first request of `reqs` the device pool of `cfg` cannot hold, as a `--trace` error
/// naming its line and the field that makes it too long (`input_length` if the prompt alone
/// does not fit, else `output_length`); the same count the runtime's submit makes.
pub(crate) fn check_fits(cfg: &StressConfig, reqs: &[TraceRequest]) -> Result<(), StressError> {
    let usable = (cfg.pool_blocks as u64).saturating_sub(1);
    let needed = |tokens: u64| -> u64 {
        cfg.groups
            .groups()
            .iter()
            .map(|g| g.blocks_for_tokens(tokens))
            .fold(0, u64::saturating_add)
    };
    for r in reqs {
        let total = r.input_length.saturating_add(u64::from(max_new_tokens(r)));
        let need = needed(total);
        if need > usable {
            let field = if needed(r.input_length) > usable {
                "input_length"
            } else {
                "output_length"
            };
            let file = cfg
                .trace
                .trace
                .as_deref()
                .map_or_else(String::new, |p| format!("{}: ", p.display()));
            return Err(StressError::Config {
                flag: "--trace",
                problem: format!(
                    "{file}line {}: {field}: {} prompt and {} output tokens need {need} blocks; \
                     --pool-blocks {} holds {usable} (and the null block)",
                    r.line, r.input_length, r.output_length, cfg.pool_blocks
                ),
            });
        }
    }
    Ok(())
}
