//! The defaults and bounds of `kvsched stress`'s settings.

/// Default of `--requests`.
pub const DEFAULT_REQUESTS: u64 = 20_000;
/// Default of `--rate` (requests per second).
pub const DEFAULT_RATE: f64 = 2_000.0;
/// Default of `--live`.
pub const DEFAULT_LIVE: usize = 4096;
/// Default of `--duration` (seconds).
pub const DEFAULT_DURATION_S: f64 = 20.0;
/// Default of `--pool-blocks`: 16,384 blocks (262,144 tokens of 16-token blocks), fewer than
/// the default workload's prefixes in play (`--prefixes`), so that the tier serves what the
/// pool lets go of.
pub const DEFAULT_POOL_BLOCKS: usize = 1 << 14;
/// Default of `--model-us`.
pub const DEFAULT_MODEL_US: u64 = 200;
/// Default of `--load-deadline-ms` with deadline faults.
pub const DEFAULT_FAULT_DEADLINE_MS: u64 = 20;
/// How long a load injected with a deadline fault hangs, in load deadlines.
pub const HANG_DEADLINES: u32 = 4;
/// Default of `--check-every` (steps).
pub const DEFAULT_CHECK_EVERY: u64 = 1000;
/// The most `--requests`.
pub const MAX_REQUESTS: u64 = 100_000_000;
/// The longest `--model-us`.
pub const MAX_MODEL_US: u64 = 1_000_000;
/// The largest `--token-budget`.
pub const MAX_TOKEN_BUDGET: u64 = 1 << 32;
/// The shortest `--prompt-tokens`.
pub const MIN_PROMPT_TOKENS: i64 = 8;
/// The longest `--prompt-tokens`.
pub const MAX_PROMPT_TOKENS: i64 = 1 << 20;
/// The largest `--output-tokens`.
pub const MAX_OUTPUT_TOKENS: i64 = 1 << 16;
/// The longest `--load-latency-us` bound.
pub const MAX_LOAD_LATENCY_US: u64 = 1_000_000;
/// The longest `--load-deadline-ms`: an hour.
pub const MAX_LOAD_DEADLINE_MS: u64 = 3_600_000;
/// The largest `--parallel-step-work`.
pub const MAX_PARALLEL_STEP_WORK: u64 = 1 << 24;
