//! The value types of the stress flags and their parsers: geometry presets, the arrival rate,
//! the baseline kind, recovery mode and policy, shares, seconds, latency ranges and integer
//! ranges.

use std::str::FromStr;
use std::time::Duration;

use serde::{Serialize, Serializer};

use kvsched::rules::geometry::{CacheGroup, MambaMode};
use kvsched::rules::recovery::{Mode, Policy};

/// The most pool blocks (`--pool-blocks`): 2^24, the runtime builder's cap.
pub const MAX_POOL_BLOCKS: usize = 1 << 24;
/// The most shard threads (`--shards`), as the runtime's builder.
pub const MAX_SHARDS: usize = 64;
/// The most worker threads (`--workers`), as the runtime's builder.
pub const MAX_WORKERS: usize = 256;
/// The most live requests kept by `--rate max` (`--live`): about 3.5 KB of the driver's
/// bookkeeping each, 3.6 GB at the most.
pub const MAX_LIVE: usize = 1 << 20;
/// The most prompt tokens of live requests (arrived, not ended) the driver holds — each
/// token about 20 bytes over the simulated engine, the prompt accounting and the scheduler:
/// past it no request arrives until enough have ended, so no workload the flags accept makes
/// the run's memory grow without bound (`engine.arrivals_held_back`).
pub const MAX_LIVE_PROMPT_TOKENS: u64 = 1 << 26;
/// The most sequences per step (`--max-seqs`).
pub const MAX_MAX_SEQS: usize = 1 << 20;
/// The longest run (`--duration`), seconds: a day.
pub const MAX_DURATION_S: f64 = 86_400.0;
/// The most runs of each scheduler (`--repeat`).
pub const MAX_REPEAT: u32 = 100;

/// `secs` seconds as a [`Duration`], saturating instead of panicking: NaN, negative and
/// zero give zero; a value too large for a `Duration` (or infinite) gives [`Duration::MAX`].
pub fn saturating_secs(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(if secs > 0.0 {
        Duration::MAX
    } else {
        Duration::ZERO
    })
}

/// A cache-group geometry preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Full attention, block size 16.
    Dense,
    /// Full attention 16 + sliding window 16 (window 128 tokens).
    HybridSwa,
    /// Full attention 16 + Mamba `align` 64 (`S` = 64).
    HybridMamba,
    /// Full attention 16 + full attention 32 + Mamba `all` 64.
    Mixed16_32_64,
    /// Full attention 16 + sliding window 16 (window 64) + Mamba `align` 16: every kind of
    /// group at once.
    HybridSwaMamba,
    /// The same with Mamba `all` (a state cached at every block end).
    HybridSwaMambaAll,
}

impl Preset {
    /// The preset's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Dense => "dense",
            Preset::HybridSwa => "hybrid-swa",
            Preset::HybridMamba => "hybrid-mamba",
            Preset::Mixed16_32_64 => "mixed-16-32-64",
            Preset::HybridSwaMamba => "hybrid-swa-mamba",
            Preset::HybridSwaMambaAll => "hybrid-swa-mamba-all",
        }
    }
    /// The cache groups.
    pub fn groups(self) -> Vec<CacheGroup> {
        match self {
            Preset::Dense => vec![CacheGroup::full_attention(16)],
            Preset::HybridSwa => vec![
                CacheGroup::full_attention(16),
                CacheGroup::sliding_window(16, 128),
            ],
            Preset::HybridMamba => vec![
                CacheGroup::full_attention(16),
                CacheGroup::mamba(64, MambaMode::Align),
            ],
            Preset::Mixed16_32_64 => vec![
                CacheGroup::full_attention(16),
                CacheGroup::full_attention(32),
                CacheGroup::mamba(64, MambaMode::All),
            ],
            Preset::HybridSwaMamba => vec![
                CacheGroup::full_attention(16),
                CacheGroup::sliding_window(16, 64),
                CacheGroup::mamba(16, MambaMode::Align),
            ],
            Preset::HybridSwaMambaAll => vec![
                CacheGroup::full_attention(16),
                CacheGroup::sliding_window(16, 64),
                CacheGroup::mamba(16, MambaMode::All),
            ],
        }
    }
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            Preset::Dense,
            Preset::HybridSwa,
            Preset::HybridMamba,
            Preset::Mixed16_32_64,
            Preset::HybridSwaMamba,
            Preset::HybridSwaMambaAll,
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| {
            format!(
                "unknown preset `{s}` (expected dense, hybrid-swa, hybrid-mamba, mixed-16-32-64, hybrid-swa-mamba or hybrid-swa-mamba-all)"
            )
        })
    }
}

impl Serialize for Preset {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// What answers the plans (`--engine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// The simulated engine: reference bytes per block, checked by the `KvChecker`.
    #[default]
    Sim,
    /// The tiny hand-written hybrid model, every kept token judged against the request
    /// decoded alone.
    Model,
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sim" => Ok(EngineKind::Sim),
            "model" => Ok(EngineKind::Model),
            _ => Err(format!("expected sim or model, got `{s}`")),
        }
    }
}

impl Serialize for EngineKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            EngineKind::Sim => "sim",
            EngineKind::Model => "model",
        })
    }
}

/// Arrival rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// Open loop: Poisson arrivals at this many requests per second.
    PerSecond(f64),
    /// Closed loop: keep `--live` requests live.
    Max,
}

impl FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "max" {
            return Ok(Rate::Max);
        }
        match s.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(Rate::PerSecond(r)),
            _ => Err(format!(
                "expected a positive number of requests per second or `max`, got `{s}`"
            )),
        }
    }
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Rate::PerSecond(r) => s.serialize_f64(*r),
            Rate::Max => s.serialize_str("max"),
        }
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // As typed for everyday rates; in exponent form past 6 digits either way, so
            // `--rate 5e-324` is not printed as 300 digits.
            Rate::PerSecond(r) if *r != 0.0 && !(1e-3..1e6).contains(r) => write!(f, "{r:e}/s"),
            Rate::PerSecond(r) => write!(f, "{r}/s"),
            Rate::Max => f.write_str("max"),
        }
    }
}

/// Which baseline to run beside kvsched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaselineKind {
    /// [`MutexScheduler`](crate::baseline::MutexScheduler): one global mutex, mpsc
    /// completions, sequential recovery.
    Mutex,
}

impl FromStr for BaselineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mutex" => Ok(BaselineKind::Mutex),
            _ => Err(format!("unknown baseline `{s}` (expected mutex)")),
        }
    }
}

impl Serialize for BaselineKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("mutex")
    }
}

/// Parses a recovery mode: `safe` or `vllm`.
pub fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "safe" => Ok(Mode::Safe),
        "vllm" => Ok(Mode::Vllm),
        _ => Err(format!("unknown mode `{s}` (expected safe or vllm)")),
    }
}

/// Parses a recovery policy: `recompute` or `fail`.
pub fn parse_policy(s: &str) -> Result<Policy, String> {
    match s {
        "recompute" => Ok(Policy::Recompute),
        "fail" => Ok(Policy::Fail),
        _ => Err(format!("unknown policy `{s}` (expected recompute or fail)")),
    }
}

/// Parses a share in `[0, 1]`.
pub fn parse_unit(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("expected a number from 0 to 1, got `{s}`")),
    }
}

/// Parses a positive, finite number of seconds, at most [`MAX_DURATION_S`].
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= MAX_DURATION_S => Ok(x),
        _ => Err(format!(
            "expected a number of seconds in (0, {MAX_DURATION_S}], got `{s}`"
        )),
    }
}

/// A load latency range in microseconds, `MIN..MAX` (or one number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LatencyRange {
    /// Shortest load, µs.
    pub min_us: u64,
    /// Longest load, µs.
    pub max_us: u64,
}

impl FromStr for LatencyRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected MIN..MAX microseconds (MIN <= MAX <= 1000000), got `{s}`");
        let (a, b) = s.split_once("..").unwrap_or((s, s));
        let (min_us, max_us) = (
            a.trim().parse::<u64>().map_err(|_| bad())?,
            b.trim().parse::<u64>().map_err(|_| bad())?,
        );
        if min_us > max_us || max_us > 1_000_000 {
            return Err(bad());
        }
        Ok(LatencyRange { min_us, max_us })
    }
}

pub(super) fn ser_mode<S: Serializer>(m: &Mode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match m {
        Mode::Safe => "safe",
        Mode::Vllm => "vllm",
    })
}

pub(super) fn ser_policy<S: Serializer>(p: &Policy, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match p {
        Policy::Recompute => "recompute",
        Policy::Fail => "fail",
    })
}

fn parse_range(s: &str, lo: usize, hi: usize) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("expected an integer from {lo} to {hi}, got `{s}`")),
    }
}
/// Parses an integer from `lo` to `hi`; a value that is not one (`-1`, `1e3`, past `hi`)
/// says the range, as every integer flag does: "expected an integer from 0 to 1000000, got
/// `-1`". With `hi` = `u64::MAX` the range is "at least `lo`".
pub(crate) fn parse_u64_range(s: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ if hi == u64::MAX => Err(format!(
            "expected an integer of at least {lo} (at most 2^64 - 1), got `{s}`"
        )),
        _ => Err(format!("expected an integer from {lo} to {hi}, got `{s}`")),
    }
}
/// The value parser of an integer flag from `LO` to `HI` ([`parse_u64_range`]'s message).
pub(crate) fn u64_in<const LO: u64, const HI: u64>(s: &str) -> Result<u64, String> {
    parse_u64_range(s, LO, HI)
}
/// [`u64_in`] for a flag held in a `u32` (`HI` at most `u32::MAX`).
pub(crate) fn u32_in<const LO: u64, const HI: u64>(s: &str) -> Result<u32, String> {
    const { assert!(HI <= u32::MAX as u64) };
    parse_u64_range(s, LO, HI).map(|n| n as u32)
}
/// [`u64_in`] for a flag held in a `u8` (`HI` at most `u8::MAX`).
pub(crate) fn u8_in<const LO: u64, const HI: u64>(s: &str) -> Result<u8, String> {
    const { assert!(HI <= u8::MAX as u64) };
    parse_u64_range(s, LO, HI).map(|n| n as u8)
}
pub(super) fn parse_model_us(s: &str) -> Result<u64, String> {
    parse_u64_range(s, 0, super::limits::MAX_MODEL_US)
}
pub(super) fn parse_check_every(s: &str) -> Result<u64, String> {
    parse_u64_range(s, 1, u64::MAX)
}
pub(super) fn parse_live(s: &str) -> Result<usize, String> {
    parse_range(s, 1, MAX_LIVE)
}
pub(super) fn parse_shards(s: &str) -> Result<usize, String> {
    parse_range(s, 1, MAX_SHARDS)
}
pub(super) fn parse_workers(s: &str) -> Result<usize, String> {
    parse_range(s, 1, MAX_WORKERS)
}
pub(super) fn parse_pool(s: &str) -> Result<usize, String> {
    parse_range(s, 2, MAX_POOL_BLOCKS).map_err(|_| {
        format!(
            "expected an integer from 2 to {MAX_POOL_BLOCKS} (2^24, the runtime's cap), got `{s}`"
        )
    })
}
pub(super) fn parse_max_seqs(s: &str) -> Result<usize, String> {
    parse_range(s, 1, MAX_MAX_SEQS)
}

/// The least `--store-capacity` and `--redis-maxmemory`: 1 MiB.
pub const MIN_STORE_BYTES: u64 = 1 << 20;
/// The largest `--store-capacity` and `--redis-maxmemory`: 16 TiB.
pub const MAX_STORE_BYTES: u64 = 1 << 44;

/// Parses a size in bytes: an integer with an optional binary suffix `K`, `M`, `G` or `T`
/// (also `KB`/`KiB`…, any case), from [`MIN_STORE_BYTES`] to [`MAX_STORE_BYTES`].
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("expected a size such as 64M or 1G (1M to 16T, binary units), got `{s}`");
    let t = s.trim();
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1 << shift)
        .filter(|b| (MIN_STORE_BYTES..=MAX_STORE_BYTES).contains(b))
        .ok_or_else(bad)
}

/// A size as it is written back: the largest binary unit that divides it.
pub fn show_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}")
}

/// `--verify`: whether the simulated engine checks the KV bytes it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Every read unit is compared against its reference (the default).
    On,
    /// Nothing is read: the bytes still move (loads, computed writes, saves), so comparing
    /// with `on` measures what verifying costs.
    Off,
}

impl Verify {
    /// Whether reads are checked.
    pub fn is_on(self) -> bool {
        self == Verify::On
    }
}

impl FromStr for Verify {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on" => Ok(Verify::On),
            "off" => Ok(Verify::Off),
            _ => Err(format!("expected on or off, got `{s}`")),
        }
    }
}

impl Serialize for Verify {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            Verify::On => "on",
            Verify::Off => "off",
        })
    }
}

/// The most `--kv-bytes-per-token`.
pub const MAX_KV_BYTES_PER_TOKEN: u64 = 1 << 16;
/// The most `--mamba-state-bytes`.
pub const MAX_MAMBA_STATE_BYTES: u64 = 1 << 20;
/// The most host KV memory a run allocates (`--pool-blocks` × the largest block's bytes).
pub const MAX_KV_MEMORY_BYTES: u64 = 4 << 30;

/// Parses `--redis-cluster`: 3 to 16 nodes.
pub(super) fn parse_cluster(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (3..=16).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a number of nodes from 3 to 16, got `{s}`"
        )),
    }
}
