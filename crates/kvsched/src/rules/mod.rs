//! The pure recovery rules: plain data in and out, no threads, clocks, I/O, tiers or bytes.
//!
//! * [`geometry`]: cache groups, the scheduler block size `S`, the null block;
//! * `blockset` (internal): a failure report's membership set;
//! * [`recovery`]: the rules of mode `vllm` and mode `safe` per request (scan, decide) and the
//!   sequential engine built from them.
//!
//! The rules themselves are specified in `docs/rules.md`.

pub(crate) mod blockset;
pub mod geometry;
pub mod recovery;
