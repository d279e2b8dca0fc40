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

/// The first request of `reqs` (numbered from 1) the device pool of `cfg` cannot hold, as a
/// `--trace` error; the same count the runtime's submit makes.
pub(crate) fn check_fits(cfg: &StressConfig, reqs: &[TraceRequest]) -> Result<(), StressError> {
    let usable = (cfg.pool_blocks as u64).saturating_sub(1);
    for (k, r) in reqs.iter().enumerate() {
        let total = r.input_length.saturating_add(u64::from(max_new_tokens(r)));
        let needed: u64 = cfg
            .groups
            .groups()
            .iter()
            .map(|g| g.blocks_for_tokens(total))
            .sum();
        if needed > usable {
            return Err(StressError::Config {
                flag: "--trace",
                problem: format!(
                    "request {} ({} prompt and {} output tokens) needs {needed} blocks; \
                     --pool-blocks {} holds {usable} (and the null block)",
                    k + 1,
                    r.input_length,
                    max_new_tokens(r),
                    cfg.pool_blocks
                ),
            });
        }
    }
    Ok(())
}
