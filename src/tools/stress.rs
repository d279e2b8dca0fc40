//! `kvsched stress`: a simulated engine driving the public [`Runtime`] API (and, with
//! `--baseline mutex`, the [`MutexScheduler`] on the very same seeded workload), measured with
//! hdrhistogram and checked against the SPEC §7 invariants.
//!
//! # The simulated engine
//!
//! A loop of steps: submit the requests whose arrival time has come, [`Scheduler::update`] with
//! the last step's output, [`Scheduler::schedule`], then "run the model": wait a fixed cost per
//! step (`--model-us`), run the plan's synchronous loads through the [`SimConnector`]'s
//! [`decide`](SimConnector::decide) (failed blocks go into [`StepOutput::invalid_blocks`]) and
//! sample a token for every request scheduled with `samples`. Asynchronous loads run on the
//! scheduler's worker threads through the same connector. Each request's length to generate
//! (`max_new_tokens`) is drawn from a seeded geometric-like distribution; the scheduler ends it
//! when it has generated them.
//!
//! # Arrivals
//!
//! * `--rate R` (open loop): arrival times follow a seeded Poisson process of rate `R`/s,
//!   fixed in advance; requests are submitted when their time has come, never waiting for
//!   completions, and latencies are measured from the *scheduled arrival* time, so a stalled
//!   scheduler cannot hide its stall (no coordinated omission).
//! * `--rate max` (closed loop): the number of live requests is kept at `--live`.
//!
//! The run ends when all `--requests` have ended or after `--duration` seconds, whichever comes
//! first; shutdown then cancels whatever is live.
//!
//! # Measurements
//!
//! * *completions*: load completions applied by the scheduler (`loads_ok + loads_failed`),
//!   per second of run time;
//! * *step overhead*: wall time of `schedule()` + `update()`, the simulated model excluded;
//! * *submit → first schedule*: scheduled arrival → the plan that first schedules the request;
//! * *completion → runnable*: [`StepPlan::runnable_latency_ns`].
//!
//! Latencies are recorded in hdrhistogram per-thread recorders and merged at the end.
//!
//! # Faults
//!
//! `--faults deadline=R,panic=R,late=R,duplicate=R,stale=R,cancel=R` rehearses failures: the
//! connector is wrapped in a fault-injecting one (hangs past the load deadline, panics,
//! decided per request and load attempt from the seed and counted exactly), and the engine
//! damages its own output (cancels right after a load is dispatched, repeated step outputs,
//! stale blocks, cancels at random later steps). The report counts what was injected
//! (`faults_injected`) and what the scheduler did about it (`events`); see [`render_json`].
//!
//! # Invariants
//!
//! Checked every `--check-every` steps and at the end ([`Scheduler::check_invariants`]), at
//! every step on the plan (no request scheduled in the step that told it to wait; no block
//! claimed twice in one marked set), at shutdown ([`Report::violations`], every block released),
//! and by reconciliation (submitted = finished + failed + cancelled; completions applied,
//! stale or cancelled never exceed loads dispatched, a load past its deadline counted once;
//! late completions never exceed expired deadlines; every injected panic caught; no request
//! finished with fewer samples sent than tokens to generate, so no sample was applied twice).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use hdrhistogram::sync::{Recorder, SyncHistogram};
use hdrhistogram::Histogram;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Serialize, Serializer};
use thiserror::Error;

use crate::connector::{
    KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult, SimConfig, SimConnector,
    SimulatedPanic, SplitMix64,
};
use crate::pool::BlockRef;
use crate::rng::hash_str;
use crate::rules::geometry::{CacheGroup, MambaMode};
use crate::rules::recovery::{Mode, Policy, RequestClass};
use crate::runtime::{
    EndState, Metrics, Report, Runtime, RuntimeError, Settings, StepOutput, StepPlan, SubmitRequest,
};
use crate::tools::baseline::{BaselineConfig, MutexScheduler};

/// What the stress loop needs from a scheduler: the engine-facing API of [`Runtime`], also
/// implemented by the [`MutexScheduler`] baseline.
pub trait Scheduler {
    /// Queues a request.
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError>;
    /// Cancels a request.
    fn cancel(&self, id: &str);
    /// Runs one step.
    fn schedule(&mut self) -> StepPlan;
    /// Applies the engine's output of the last step.
    fn update(&mut self, out: StepOutput);
    /// Counters so far.
    fn metrics(&self) -> Metrics;
    /// SPEC §7 invariants checkable between steps; the violations.
    fn check_invariants(&self) -> Vec<String>;
    /// Waits until a load completes or `timeout` passes.
    fn wait_for_work(&self, timeout: Duration) -> bool;
    /// Stops, cancels everything live and reports.
    fn shutdown(self) -> Report
    where
        Self: Sized;
}

impl Scheduler for Runtime {
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        Runtime::submit(self, req)
    }
    fn cancel(&self, id: &str) {
        Runtime::cancel(self, id)
    }
    fn schedule(&mut self) -> StepPlan {
        Runtime::schedule(self)
    }
    fn update(&mut self, out: StepOutput) {
        Runtime::update(self, out)
    }
    fn metrics(&self) -> Metrics {
        Runtime::metrics(self)
    }
    fn check_invariants(&self) -> Vec<String> {
        Runtime::check_invariants(self)
    }
    fn wait_for_work(&self, timeout: Duration) -> bool {
        Runtime::wait_for_work(self, timeout)
    }
    fn shutdown(self) -> Report {
        Runtime::shutdown(self)
    }
}

impl Scheduler for MutexScheduler {
    fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        MutexScheduler::submit(self, req)
    }
    fn cancel(&self, id: &str) {
        MutexScheduler::cancel(self, id)
    }
    fn schedule(&mut self) -> StepPlan {
        MutexScheduler::schedule(self)
    }
    fn update(&mut self, out: StepOutput) {
        MutexScheduler::update(self, out)
    }
    fn metrics(&self) -> Metrics {
        MutexScheduler::metrics(self)
    }
    fn check_invariants(&self) -> Vec<String> {
        MutexScheduler::check_invariants(self)
    }
    fn wait_for_work(&self, timeout: Duration) -> bool {
        MutexScheduler::wait_for_work(self, timeout)
    }
    fn shutdown(self) -> Report {
        MutexScheduler::shutdown(self)
    }
}

// ---------------------------------------------------------------------------------------------
// Settings.
// ---------------------------------------------------------------------------------------------

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
}

impl Preset {
    /// The preset's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Dense => "dense",
            Preset::HybridSwa => "hybrid-swa",
            Preset::HybridMamba => "hybrid-mamba",
            Preset::Mixed16_32_64 => "mixed-16-32-64",
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
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| {
            format!(
                "unknown preset `{s}` (expected dense, hybrid-swa, hybrid-mamba or mixed-16-32-64)"
            )
        })
    }
}

impl Serialize for Preset {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
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
            Rate::PerSecond(r) => write!(f, "{r}/s"),
            Rate::Max => f.write_str("max"),
        }
    }
}

/// Which baseline to run beside kvsched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaselineKind {
    /// [`MutexScheduler`]: one global mutex, mpsc completions, sequential recovery.
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

/// Parses a positive, finite number of seconds.
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= 86_400.0 => Ok(x),
        _ => Err(format!(
            "expected a number of seconds in (0, 86400], got `{s}`"
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

/// The fault names of `--faults`, in order.
pub const FAULT_NAMES: [&str; 6] = ["deadline", "panic", "late", "duplicate", "stale", "cancel"];

/// Fault rates of `--faults deadline=R,panic=R,late=R,duplicate=R,stale=R,cancel=R` (each
/// 0–1; a fault not named is off). See [`StressConfig::faults`] for what each one injects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Faults {
    /// Share of asynchronous loads that hang past the load deadline.
    pub deadline: f64,
    /// Share of asynchronous loads that panic inside the connector.
    pub panic: f64,
    /// Share of requests with an asynchronous load the engine cancels right after dispatch.
    pub late: f64,
    /// Share of steps whose engine output is reported twice.
    pub duplicate: f64,
    /// Share of steps whose engine output names a stale block.
    pub stale: f64,
    /// Share of requests the client cancels at a random later step.
    pub cancel: f64,
}

impl Faults {
    fn rates(&self) -> [f64; 6] {
        [
            self.deadline,
            self.panic,
            self.late,
            self.duplicate,
            self.stale,
            self.cancel,
        ]
    }
}

impl FromStr for Faults {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let names = "deadline, panic, late, duplicate, stale or cancel";
        if s.trim().is_empty() {
            return Err(format!(
                "expected NAME=RATE[,NAME=RATE...] with NAME one of {names}, got an empty list"
            ));
        }
        let mut f = Faults::default();
        let mut seen: Vec<&str> = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (name, rate) = part.split_once('=').ok_or_else(|| {
                format!("`{part}`: missing `=` (expected NAME=RATE, e.g. panic=0.01)")
            })?;
            let name = name.trim();
            let slot = match name {
                "deadline" => &mut f.deadline,
                "panic" => &mut f.panic,
                "late" => &mut f.late,
                "duplicate" => &mut f.duplicate,
                "stale" => &mut f.stale,
                "cancel" => &mut f.cancel,
                _ => return Err(format!("unknown fault `{name}` (expected {names})")),
            };
            if seen.contains(&name) {
                return Err(format!("fault `{name}` given twice"));
            }
            seen.push(name);
            let rate = rate.trim();
            *slot = rate
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| format!("{name}: expected a rate from 0 to 1, got `{rate}`"))?;
        }
        Ok(f)
    }
}

fn ser_mode<S: Serializer>(m: &Mode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match m {
        Mode::Safe => "safe",
        Mode::Vllm => "vllm",
    })
}

fn ser_policy<S: Serializer>(p: &Policy, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match p {
        Policy::Recompute => "recompute",
        Policy::Fail => "fail",
    })
}

/// Default of `--requests`.
pub const DEFAULT_REQUESTS: u64 = 20_000;
/// Default of `--rate` (requests per second).
pub const DEFAULT_RATE: f64 = 2_000.0;
/// Default of `--live`.
pub const DEFAULT_LIVE: usize = 4096;
/// Default of `--duration` (seconds).
pub const DEFAULT_DURATION_S: f64 = 20.0;
/// Default of `--pool-blocks`.
pub const DEFAULT_POOL_BLOCKS: usize = 1 << 17;
/// Default of `--model-us`.
pub const DEFAULT_MODEL_US: u64 = 200;
/// Default of `--load-deadline-ms` with deadline faults.
pub const DEFAULT_FAULT_DEADLINE_MS: u64 = 20;
/// How long a load injected with a deadline fault hangs, in load deadlines.
pub const HANG_DEADLINES: u32 = 4;
/// Default of `--check-every` (steps).
pub const DEFAULT_CHECK_EVERY: u64 = 1000;

/// Every setting of a stress run (the `config` key of the JSON report).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct StressConfig {
    /// Requests to submit in all.
    #[arg(long, default_value_t = DEFAULT_REQUESTS, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub requests: u64,
    /// Arrival rate: requests per second (open loop, Poisson), or `max` (closed loop at --live).
    #[arg(long, default_value = "2000", value_parser = Rate::from_str)]
    pub rate: Rate,
    /// Live requests kept by `--rate max`.
    #[arg(long, default_value_t = DEFAULT_LIVE, value_parser = parse_live)]
    pub live: usize,
    /// Longest run time in seconds (the run ends at whichever of --requests and --duration
    /// comes first).
    #[arg(long = "duration", default_value_t = DEFAULT_DURATION_S, value_parser = parse_seconds)]
    #[serde(rename = "duration_s")]
    pub duration_s: f64,
    /// Shard threads (1–64).
    #[arg(long, default_value_t = 2, value_parser = parse_shards)]
    pub shards: usize,
    /// Worker threads running loads (1–256).
    #[arg(long, default_value_t = 2, value_parser = parse_workers)]
    pub workers: usize,
    /// Cache-group geometry: dense, hybrid-swa, hybrid-mamba or mixed-16-32-64.
    #[arg(long, default_value = "dense", value_parser = Preset::from_str)]
    pub groups: Preset,
    /// Pool size in blocks, the null block included.
    #[arg(long, default_value_t = DEFAULT_POOL_BLOCKS, value_parser = parse_pool)]
    pub pool_blocks: usize,
    /// Share of each prompt taken from one of a few shared base prefixes (0–1).
    #[arg(long, default_value_t = 0.5, value_parser = parse_unit)]
    pub prefix_share: f64,
    /// Share of loads that fail (0–1).
    #[arg(long, default_value_t = 0.01, value_parser = parse_unit)]
    pub failure_rate: f64,
    /// Recovery policy: recompute or fail.
    #[arg(long, default_value = "recompute", value_parser = parse_policy)]
    #[serde(serialize_with = "ser_policy")]
    pub policy: Policy,
    /// Recovery mode: safe or vllm.
    #[arg(long, default_value = "safe", value_parser = parse_mode)]
    #[serde(serialize_with = "ser_mode")]
    pub mode: Mode,
    /// Seed of every random choice (workload, arrivals, connector).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Simulated model time per step with scheduled work, µs (excluded from step overhead).
    #[arg(long, default_value_t = DEFAULT_MODEL_US, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub model_us: u64,
    /// Tokens per step.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..=1 << 32))]
    pub token_budget: u64,
    /// Sequences per step.
    #[arg(long, default_value_t = 256, value_parser = parse_max_seqs)]
    pub max_seqs: usize,
    /// Longest prompt in tokens; prompts are uniform in [max/4, max].
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(8..=1 << 20))]
    pub prompt_tokens: u32,
    /// Mean tokens generated per request (geometric-like, capped at 8× the mean).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1 << 16))]
    pub output_tokens: u32,
    /// Share of each prompt the simulated external store holds (0–1).
    #[arg(long, default_value_t = 0.75, value_parser = parse_unit)]
    pub hit_ratio: f64,
    /// Share of loads that are asynchronous (0–1); the rest run inside the engine's step.
    #[arg(long, default_value_t = 0.8, value_parser = parse_unit)]
    pub async_ratio: f64,
    /// Asynchronous load latency, `MIN..MAX` microseconds (uniform).
    #[arg(long, default_value = "50..500", value_parser = LatencyRange::from_str)]
    pub load_latency_us: LatencyRange,
    /// Share of requests the client cancels a few steps after submitting (0–1).
    #[arg(long, default_value_t = 0.005, value_parser = parse_unit)]
    pub cancel_ratio: f64,
    /// Check the scheduler's invariants every N steps (and always at the end).
    #[arg(long, default_value_t = DEFAULT_CHECK_EVERY, value_parser = clap::value_parser!(u64).range(1..))]
    pub check_every: u64,
    /// Also run the same workload through a baseline scheduler: `mutex`.
    #[arg(long, value_parser = BaselineKind::from_str)]
    pub baseline: Option<BaselineKind>,
    /// Inject faults: `NAME=RATE[,NAME=RATE...]`, each rate 0–1 (a fault not named is off).
    ///
    /// * `deadline=R`: share R of asynchronous loads hang (the connector sleeps 4× the load
    ///   deadline), so the load deadline expires and their completion lands late;
    /// * `panic=R`: share R of asynchronous loads panic inside the connector (the worker
    ///   catches it and fails every block of the load);
    /// * `late=R`: share R of the requests offered an asynchronous load are cancelled by the
    ///   engine right after the step that dispatched it, so the load lands for a cancelled
    ///   request (the runtime ends the request once the load lands);
    /// * `duplicate=R`: in share R of steps the engine reports its output twice (every sampled
    ///   and finished id, every failed sync-load block);
    /// * `stale=R`: in share R of steps the engine names a stale block among the failed
    ///   blocks (a block seen in an earlier sync load with a wrong generation, or an id past
    ///   the pool);
    /// * `cancel=R`: share R of requests are cancelled by the client at a random later step
    ///   (1–128 steps after submission; on top of --cancel-ratio).
    ///
    /// Deadline and panic faults are decided per (request, load attempt), the others per
    /// request or step, all from --seed. Injected counts and what the runtime did about them
    /// are reported (`faults_injected`, `events`).
    #[arg(long, value_name = "FAULTS", value_parser = Faults::from_str, verbatim_doc_comment)]
    pub faults: Option<Faults>,
    /// Deadline of an asynchronous load in ms (default: 20 with `--faults deadline=R`, R > 0;
    /// else the runtime's default of 5000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub load_deadline_ms: Option<u64>,
}

fn parse_range(s: &str, lo: usize, hi: usize) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("expected an integer from {lo} to {hi}, got `{s}`")),
    }
}
fn parse_live(s: &str) -> Result<usize, String> {
    parse_range(s, 1, 1 << 24)
}
fn parse_shards(s: &str) -> Result<usize, String> {
    parse_range(s, 1, 64)
}
fn parse_workers(s: &str) -> Result<usize, String> {
    parse_range(s, 1, 256)
}
fn parse_pool(s: &str) -> Result<usize, String> {
    parse_range(s, 2, u32::MAX as usize)
}
fn parse_max_seqs(s: &str) -> Result<usize, String> {
    parse_range(s, 1, 1 << 20)
}

impl Default for StressConfig {
    fn default() -> Self {
        StressConfig {
            requests: DEFAULT_REQUESTS,
            rate: Rate::PerSecond(DEFAULT_RATE),
            live: DEFAULT_LIVE,
            duration_s: DEFAULT_DURATION_S,
            shards: 2,
            workers: 2,
            groups: Preset::Dense,
            pool_blocks: DEFAULT_POOL_BLOCKS,
            prefix_share: 0.5,
            failure_rate: 0.01,
            policy: Policy::Recompute,
            mode: Mode::Safe,
            seed: 1,
            model_us: DEFAULT_MODEL_US,
            token_budget: 8192,
            max_seqs: 256,
            prompt_tokens: 512,
            output_tokens: 16,
            hit_ratio: 0.75,
            async_ratio: 0.8,
            load_latency_us: LatencyRange {
                min_us: 50,
                max_us: 500,
            },
            cancel_ratio: 0.005,
            check_every: DEFAULT_CHECK_EVERY,
            baseline: None,
            faults: None,
            load_deadline_ms: None,
        }
    }
}

/// Why a stress run could not start.
#[derive(Debug, Error)]
pub enum StressError {
    /// A setting is out of range (the message names the flag).
    #[error("{flag}: {problem}")]
    Config {
        /// The command-line flag.
        flag: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The scheduler refused its settings or could not start its threads.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A histogram could not be created.
    #[error("histogram: {0}")]
    Histogram(String),
}

impl StressConfig {
    /// The longest generation a request may draw.
    fn max_output_tokens(&self) -> u64 {
        u64::from(self.output_tokens) * 8
    }

    /// Checks the settings together (each one is range-checked when parsed).
    pub fn validate(&self) -> Result<(), StressError> {
        let bad = |flag, problem: String| Err(StressError::Config { flag, problem });
        let unit = [
            ("--prefix-share", self.prefix_share),
            ("--failure-rate", self.failure_rate),
            ("--hit-ratio", self.hit_ratio),
            ("--async-ratio", self.async_ratio),
            ("--cancel-ratio", self.cancel_ratio),
        ];
        for (flag, x) in unit {
            if !(0.0..=1.0).contains(&x) {
                return bad(flag, format!("must be from 0 to 1, got {x}"));
            }
        }
        if let Some(f) = &self.faults {
            for (name, x) in FAULT_NAMES.iter().zip(f.rates()) {
                if !(0.0..=1.0).contains(&x) {
                    return bad("--faults", format!("{name}: must be from 0 to 1, got {x}"));
                }
            }
        }
        if self.load_deadline_ms == Some(0) {
            return bad("--load-deadline-ms", "must be positive".to_owned());
        }
        if let Rate::PerSecond(r) = self.rate {
            if !(r.is_finite() && r > 0.0) {
                return bad("--rate", format!("must be positive, got {r}"));
            }
        }
        if !(self.duration_s.is_finite() && self.duration_s > 0.0) {
            return bad(
                "--duration",
                format!("must be positive, got {}", self.duration_s),
            );
        }
        if !(1..=64).contains(&self.shards) {
            return bad("--shards", format!("must be 1 to 64, got {}", self.shards));
        }
        if !(1..=256).contains(&self.workers) {
            return bad(
                "--workers",
                format!("must be 1 to 256, got {}", self.workers),
            );
        }
        if self.token_budget < self.shards as u64 {
            return bad(
                "--token-budget",
                format!("must be at least --shards ({})", self.shards),
            );
        }
        if self.max_seqs < self.shards {
            return bad(
                "--max-seqs",
                format!("must be at least --shards ({})", self.shards),
            );
        }
        if self.load_latency_us.min_us > self.load_latency_us.max_us {
            return bad("--load-latency-us", "MIN must not exceed MAX".to_owned());
        }
        let tokens = u64::from(self.prompt_tokens) + self.max_output_tokens();
        let needed: u64 = self
            .groups
            .groups()
            .iter()
            .map(|g| g.blocks_for_tokens(tokens))
            .sum();
        if needed + 1 > self.pool_blocks as u64 {
            return bad(
                "--pool-blocks",
                format!(
                    "{} blocks cannot hold one request of up to {tokens} tokens ({needed} blocks + the null block)",
                    self.pool_blocks
                ),
            );
        }
        Ok(())
    }

    /// The fault rates (all 0 without `--faults`).
    fn fault_rates(&self) -> Faults {
        self.faults.unwrap_or_default()
    }

    /// The async-load deadline the run uses (see `--load-deadline-ms`).
    pub fn effective_load_deadline(&self) -> Option<Duration> {
        match self.load_deadline_ms {
            Some(ms) => Some(Duration::from_millis(ms)),
            None if self.fault_rates().deadline > 0.0 => {
                Some(Duration::from_millis(DEFAULT_FAULT_DEADLINE_MS))
            }
            None => Settings::default().load_deadline,
        }
    }

    /// The runtime's live settings.
    fn runtime_settings(&self) -> Settings {
        Settings {
            mode: self.mode,
            policy: self.policy,
            load_deadline: self.effective_load_deadline(),
            ..Settings::default()
        }
    }

    fn sim_config(&self) -> SimConfig {
        let groups = self.groups.groups();
        let s = crate::rules::geometry::Geometry::new(groups, None, 0)
            .map(|g| g.scheduler_block_size())
            .unwrap_or(16);
        SimConfig {
            seed: self.seed ^ 0x5eed_c0de,
            hit_ratio: self.hit_ratio,
            align_tokens: s,
            async_ratio: self.async_ratio,
            failure_rate: self.failure_rate,
            shared_failure_share: 0.5,
            max_invalid_per_failure: 2,
            latency_min: Duration::from_micros(self.load_latency_us.min_us),
            latency_max: Duration::from_micros(self.load_latency_us.max_us),
            ..SimConfig::default()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The workload.
// ---------------------------------------------------------------------------------------------

const BASE_PREFIXES: u64 = 16;

/// The seeded workload: request `i` and its arrival time depend on the seed and `i` only, so
/// kvsched and the baseline see the same requests.
struct Workload {
    seed: u64,
    bases: Vec<Vec<u32>>,
    min_prompt: u64,
    max_prompt: u64,
    share: f64,
    output_mean: f64,
    output_cap: u64,
    cancel_ratio: f64,
    fault_cancel: f64,
    arrivals: SplitMix64,
    rate: Option<f64>,
    next_arrival_s: f64,
}

/// One generated request.
struct Generated {
    req: SubmitRequest,
    /// Steps after submission at which the client cancels it.
    cancel_after: Option<u64>,
    /// Steps after submission at which a `cancel` fault cancels it.
    fault_cancel_after: Option<u64>,
}

impl Workload {
    fn new(cfg: &StressConfig) -> Self {
        let mut rng = SplitMix64::new(cfg.seed ^ 0xBA5E);
        let max_prompt = u64::from(cfg.prompt_tokens);
        let bases = (0..BASE_PREFIXES)
            .map(|_| (0..max_prompt).map(|_| rng.next_u64() as u32).collect())
            .collect();
        Workload {
            seed: cfg.seed,
            bases,
            min_prompt: (max_prompt / 4).max(2),
            max_prompt,
            share: cfg.prefix_share,
            output_mean: f64::from(cfg.output_tokens),
            output_cap: cfg.max_output_tokens(),
            cancel_ratio: cfg.cancel_ratio,
            fault_cancel: cfg.fault_rates().cancel,
            arrivals: SplitMix64::new(cfg.seed ^ 0xA221_7A15),
            rate: match cfg.rate {
                Rate::PerSecond(r) => Some(r),
                Rate::Max => None,
            },
            next_arrival_s: 0.0,
        }
    }

    fn request(&self, i: u64) -> Generated {
        let mut rng = SplitMix64::new(self.seed ^ (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let len = self.min_prompt + rng.below(self.max_prompt - self.min_prompt + 1);
        let shared = ((len as f64) * self.share) as usize;
        let base = &self.bases[rng.below(BASE_PREFIXES) as usize];
        let mut prompt = Vec::with_capacity(len as usize);
        prompt.extend_from_slice(&base[..shared.min(base.len())]);
        while (prompt.len() as u64) < len {
            prompt.push(rng.next_u64() as u32);
        }
        let exp = -(1.0 - rng.unit()).ln();
        let out = 1 + (exp * (self.output_mean - 1.0)) as u64;
        let max_new_tokens = out.min(self.output_cap).max(1) as u32;
        let cancel_after = (rng.unit() < self.cancel_ratio).then(|| 1 + rng.below(64));
        // A separate stream, so faults do not change the workload.
        let mut frng =
            SplitMix64::new(self.seed ^ 0xFA17_CA2C ^ (i + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let fault_cancel_after = (self.fault_cancel > 0.0 && frng.unit() < self.fault_cancel)
            .then(|| 1 + frng.below(128));
        Generated {
            req: SubmitRequest {
                id: format!("r{i}"),
                prompt,
                max_new_tokens,
                priority: 0,
                load_deadline: None,
            },
            cancel_after,
            fault_cancel_after,
        }
    }

    /// The next request's arrival offset from the start (open loop), advancing the process.
    fn next_arrival(&mut self) -> Option<Duration> {
        let rate = self.rate?;
        let at = self.next_arrival_s;
        self.next_arrival_s += -(1.0 - self.arrivals.unit()).ln() / rate;
        Some(Duration::from_secs_f64(at))
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements and the report.
// ---------------------------------------------------------------------------------------------

/// Request counts.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct RequestCounts {
    /// Accepted by `submit`.
    pub submitted: u64,
    /// Ended finished.
    pub finished: u64,
    /// Ended failed (policy `fail`).
    pub failed: u64,
    /// Ended cancelled (by the client, or by shutdown at the end of `--duration`).
    pub cancelled: u64,
}

/// Load counts.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct LoadCounts {
    /// Asynchronous loads completed ok and applied.
    pub ok: u64,
    /// Asynchronous loads completed failed and applied.
    pub failed: u64,
    /// Completions ignored as stale (ended, superseded or unknown loads).
    pub stale: u64,
    /// Loads dispatched, asynchronous and synchronous.
    pub dispatched: u64,
    /// Reported blocks ignored as stale (freed and reused since).
    pub stale_blocks: u64,
    /// Synchronous loads run by the simulated engine.
    pub sync_run: u64,
}

/// Percentiles in microseconds (`p90` only for step overhead).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Maximum.
    pub max: f64,
    /// Number of samples.
    pub count: u64,
}

/// Faults injected by `--faults` (exact counts).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct FaultCounts {
    /// Asynchronous loads the connector hung past the load deadline.
    pub deadline: u64,
    /// Asynchronous loads that panicked in the connector.
    pub panic: u64,
    /// Requests the engine cancelled right after their asynchronous load was dispatched.
    pub late: u64,
    /// Steps whose output the engine reported twice.
    pub duplicate: u64,
    /// Stale blocks the engine named among the failed blocks.
    pub stale: u64,
    /// Cancels issued by the `cancel` fault (some may name a request already ended).
    pub cancel: u64,
}

/// What the scheduler did about faults (its counters at the end of the run).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Events {
    /// Asynchronous loads that passed their deadline (failed for all their blocks).
    pub deadlines_expired: u64,
    /// Completions of loads that had passed their deadline (also in `stale_completions`).
    pub late_completions: u64,
    /// Connector panics caught by workers.
    pub connector_panics: u64,
    /// Completions ignored as stale (ended, superseded, unknown or late loads).
    pub stale_completions: u64,
    /// Reported blocks ignored as stale (wrong generation or out of range).
    pub stale_blocks: u64,
    /// Commands (sampled, finish, cancel) naming no live request, ignored.
    pub unknown_commands: u64,
    /// Sampled / finish commands repeated within a step, applied once.
    pub duplicate_commands: u64,
    /// Queued loads past their deadline that a worker handed back without running.
    pub loads_expired_unrun: u64,
    /// Admissions offered no external load because the request's retry budget was spent.
    pub retry_budget_skips: u64,
    /// Admissions offered no external load because the prefix was quarantined.
    pub quarantine_skips: u64,
    /// Times a prefix entered quarantine.
    pub prefixes_quarantined: u64,
    /// Owned blocks handed off because their owner ended first.
    pub handoffs: u64,
}

impl Events {
    fn of(m: &Metrics) -> Self {
        Events {
            deadlines_expired: m.deadlines_expired,
            late_completions: m.late_completions,
            connector_panics: m.connector_panics,
            stale_completions: m.stale_completions,
            stale_blocks: m.stale_blocks,
            unknown_commands: m.unknown_commands,
            duplicate_commands: m.duplicate_commands,
            loads_expired_unrun: m.loads_expired_unrun,
            retry_budget_skips: m.retry_budget_skips,
            quarantine_skips: m.quarantine_skips,
            prefixes_quarantined: m.prefixes_quarantined,
            handoffs: m.handoffs,
        }
    }
}

/// The invariant verdict.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Invariants {
    /// Whether every invariant held (`reconciled` included).
    pub ok: bool,
    /// Whether the request accounts reconcile: submitted (by the engine and as counted by
    /// the scheduler) = finished + failed + cancelled.
    pub reconciled: bool,
    /// What was violated, one line each.
    pub violations: Vec<String>,
}

/// One scheduler's run.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// `kvsched` or `mutex`.
    pub scheduler: &'static str,
    /// Request counts.
    pub requests: RequestCounts,
    /// Load counts.
    pub loads: LoadCounts,
    /// Tokens rolled back by recovery.
    pub tokens_recomputed: u64,
    /// Blocks claimed for recompute.
    pub claims: u64,
    /// Owned blocks handed off because their owner ended first.
    pub handoffs: u64,
    /// Requests preempted for lack of blocks.
    pub preemptions: u64,
    /// Load completions applied per second of run time.
    pub completions_per_s: f64,
    /// `schedule()` + `update()` wall time per step, µs.
    pub step_overhead_us: Percentiles,
    /// Scheduled arrival → first scheduled, µs.
    pub submit_to_schedule_us: Percentiles,
    /// Load completion → runnable, µs.
    pub completion_to_runnable_us: Percentiles,
    /// Steps run.
    pub steps: u64,
    /// Run time (seconds), shutdown excluded.
    pub elapsed_s: f64,
    /// Whether `--duration` ended the run before every request ended.
    pub timed_out: bool,
    /// Faults injected (all 0 without `--faults`).
    pub faults_injected: FaultCounts,
    /// What the scheduler did about faults.
    pub events: Events,
    /// Invariants.
    pub invariants: Invariants,
}

/// kvsched ÷ baseline for throughput, baseline ÷ kvsched for latency: > 1 means kvsched is
/// better. `None` (JSON `null`) when a divisor is 0.
#[derive(Clone, Debug, Serialize)]
pub struct Ratios {
    /// kvsched completions/s ÷ baseline completions/s.
    pub completions_per_s: Option<f64>,
    /// Baseline p99 step overhead ÷ kvsched p99 step overhead.
    pub step_overhead_p99: Option<f64>,
}

/// The result of `kvsched stress` (see [`render_json`] for the JSON layout).
#[derive(Clone, Debug, Serialize)]
pub struct StressReport {
    /// The kvsched run (its keys are at the top level of the JSON).
    #[serde(flatten)]
    pub run: RunReport,
    /// Every setting used.
    pub config: StressConfig,
    /// The baseline run, with `--baseline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<RunReport>,
    /// kvsched/baseline ratios, with `--baseline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratios: Option<Ratios>,
}

impl StressReport {
    /// Whether every invariant held in every run.
    pub fn invariants_ok(&self) -> bool {
        self.run.invariants.ok && self.baseline.as_ref().is_none_or(|b| b.invariants.ok)
    }

    /// Every violation, prefixed by the scheduler it was found in.
    pub fn violations(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .run
            .invariants
            .violations
            .iter()
            .map(|s| format!("kvsched: {s}"))
            .collect();
        if let Some(b) = &self.baseline {
            v.extend(
                b.invariants
                    .violations
                    .iter()
                    .map(|s| format!("mutex baseline: {s}")),
            );
        }
        v
    }
}

/// Progress of a run, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// `kvsched` or `mutex`.
    pub scheduler: &'static str,
    /// Requests to run in all.
    pub total: u64,
    /// Requests ended so far.
    pub ended: u64,
    /// Time since the run started.
    pub elapsed: Duration,
    /// Load completions applied so far.
    pub completions: u64,
}

/// A progress sink drawing an indicatif bar on standard error when it is a terminal, and
/// nothing otherwise.
pub fn terminal_progress() -> impl FnMut(&Progress) {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let mut current: Option<(&'static str, indicatif::ProgressBar)> = None;
    move |p: &Progress| {
        if !tty {
            return;
        }
        if current.as_ref().is_none_or(|(s, _)| *s != p.scheduler) {
            if let Some((_, bar)) = current.take() {
                bar.finish_and_clear();
            }
            let bar = indicatif::ProgressBar::new(p.total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{prefix:>8} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
            ) {
                bar.set_style(style);
            }
            bar.set_prefix(p.scheduler);
            current = Some((p.scheduler, bar));
        }
        if let Some((_, bar)) = &current {
            bar.set_position(p.ended);
            let secs = p.elapsed.as_secs_f64().max(1e-9);
            bar.set_message(format!("{:.0} completions/s", p.completions as f64 / secs));
            if p.ended >= p.total {
                bar.finish_and_clear();
            }
        }
    }
}

const HIST_MAX_NS: u64 = 3_600_000_000_000;

struct Hist(SyncHistogram<u64>);

impl Hist {
    fn new() -> Result<Self, StressError> {
        Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3)
            .map(|h| Hist(h.into_sync()))
            .map_err(|e| StressError::Histogram(format!("{e:?}")))
    }
    fn percentiles(&mut self, p90: bool) -> Percentiles {
        self.0.refresh_timeout(Duration::from_secs(1));
        let h: &Histogram<u64> = &self.0;
        if h.is_empty() {
            return Percentiles {
                p90: p90.then_some(0.0),
                ..Percentiles::default()
            };
        }
        let us = |ns: u64| (ns as f64 / 100.0).round() / 10.0;
        Percentiles {
            p50: us(h.value_at_quantile(0.5)),
            p90: p90.then(|| us(h.value_at_quantile(0.9))),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            count: h.len(),
        }
    }
}

/// One thread's recorders (the engine thread's; any thread that records gets its own).
struct Recorders {
    step: Recorder<u64>,
    first_schedule: Recorder<u64>,
    runnable: Recorder<u64>,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// Waits `d` (the simulated model): sleeps most of it, spins the rest for precision.
fn simulate_model(d: Duration) {
    if d.is_zero() {
        return;
    }
    let end = Instant::now() + d;
    let slack = Duration::from_micros(80);
    if d > slack {
        std::thread::sleep(d - slack);
    }
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// Checks one plan: nobody scheduled in the step that told it to wait; every claimed block is
/// in the report and claimed once per marked set.
fn check_plan(mode: Mode, plan: &StepPlan, violations: &mut Vec<String>) {
    let rec = &plan.recovery;
    if rec.recovered.is_empty() {
        return;
    }
    let waiting: FxHashSet<&str> = rec
        .recovered
        .iter()
        .filter(|r| !r.decision.waits_for.is_empty())
        .map(|r| &*r.id)
        .collect();
    if !waiting.is_empty() {
        for s in &plan.scheduled {
            if waiting.contains(&*s.id) {
                violations.push(format!(
                    "step {}: request {} scheduled while waiting for an owner",
                    plan.step, s.id
                ));
            }
        }
    }
    let mut claimed = FxHashSet::default();
    for r in &rec.recovered {
        let set = mode == Mode::Vllm && r.class == RequestClass::Sync;
        for &b in &r.decision.claimed_blocks {
            if rec.report.binary_search(&b).is_err() {
                violations.push(format!(
                    "step {}: block {b} claimed by {} but not in the report",
                    plan.step, r.id
                ));
            }
            if !claimed.insert((set, b)) {
                violations.push(format!(
                    "step {}: block {b} claimed by more than one request",
                    plan.step
                ));
            }
        }
    }
}

const MAX_VIOLATIONS: usize = 50;

/// The simulated connector wrapped with the connector-side faults of `--faults`: each
/// asynchronous load draws, from its own seeded stream per (request, attempt), whether it
/// panics (`panic=R`) or hangs for `hang` (`deadline=R`), counting both exactly; every other
/// load is the [`SimConnector`]'s. With `late=R` it also records the requests it offers an
/// asynchronous load, for the engine to cancel.
struct FaultConnector {
    sim: Arc<SimConnector>,
    seed: u64,
    hang_rate: f64,
    panic_rate: f64,
    hang: Duration,
    record_offers: bool,
    hangs: AtomicU64,
    panics: AtomicU64,
    offers: SegQueue<Arc<str>>,
}

impl FaultConnector {
    fn new(cfg: &StressConfig, sim: Arc<SimConnector>) -> Self {
        let f = cfg.fault_rates();
        let hang = cfg
            .effective_load_deadline()
            .map_or(Duration::from_millis(50), |d| d * HANG_DEADLINES);
        FaultConnector {
            sim,
            seed: cfg.seed ^ 0xFA17_C044,
            hang_rate: f.deadline,
            panic_rate: f.panic,
            hang,
            record_offers: f.late > 0.0,
            hangs: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            offers: SegQueue::new(),
        }
    }
}

impl KvConnector for FaultConnector {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let r = self.sim.lookup(q);
        if self.record_offers && r.load_async && r.external_tokens > 0 {
            self.offers.push(q.request.into());
        }
        r
    }

    fn load(&self, job: &LoadJob) -> LoadResult {
        if self.hang_rate > 0.0 || self.panic_rate > 0.0 {
            let mut rng = SplitMix64::new(
                self.seed
                    ^ hash_str(&job.request).rotate_left(29)
                    ^ u64::from(job.attempt)
                        .wrapping_add(1)
                        .wrapping_mul(0xD6E8_FEB8_6659_FD93),
            );
            let (p, h) = (rng.unit(), rng.unit());
            if p < self.panic_rate {
                self.panics.fetch_add(1, Ordering::Relaxed);
                std::panic::panic_any(SimulatedPanic);
            }
            if h < self.hang_rate {
                self.hangs.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(self.hang);
                return self.sim.decide(job);
            }
        }
        self.sim.load(job)
    }
}

/// Installs (once per process) a panic hook that prints nothing for [`SimulatedPanic`]
/// payloads and defers to the previous hook for every other panic.
fn silence_simulated_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<SimulatedPanic>() {
                prev(info);
            }
        }));
    });
}

/// A uniform draw in `[0, 1)` that depends on the seed, a salt and a request id only.
fn draw_for(seed: u64, salt: u64, id: &str) -> f64 {
    SplitMix64::new(seed ^ salt ^ hash_str(id).rotate_left(7)).unit()
}

/// Drives `sched` through the workload of `cfg`.
fn drive<S: Scheduler>(
    mut sched: S,
    name: &'static str,
    cfg: &StressConfig,
    conn: &FaultConnector,
    progress: &mut dyn FnMut(&Progress),
) -> Result<RunReport, StressError> {
    let sim = &*conn.sim;
    let faults = cfg.fault_rates();
    let mut injected = FaultCounts::default();
    // The engine's fault stream: two draws per step (duplicate, stale) and one per stale block.
    let mut frng = SplitMix64::new(cfg.seed ^ 0xE561_FA17);
    let mut late_done: FxHashSet<Arc<str>> = FxHashSet::default();
    let mut last_sync_block: Option<BlockRef> = None;
    // Samples sent per live request, and its max_new_tokens: a request that finishes having
    // been sent fewer samples than that had one applied twice.
    let mut samples_sent: FxHashMap<Arc<str>, (u32, u32)> = FxHashMap::default();
    let mut h_step = Hist::new()?;
    let mut h_first = Hist::new()?;
    let mut h_runnable = Hist::new()?;
    let mut rec = Recorders {
        step: h_step.0.recorder(),
        first_schedule: h_first.0.recorder(),
        runnable: h_runnable.0.recorder(),
    };
    let mut work = Workload::new(cfg);
    let model = Duration::from_micros(cfg.model_us);
    let duration = Duration::from_secs_f64(cfg.duration_s);
    let mut violations = Vec::new();
    let mut out = StepOutput::default();
    let mut arrival_of: FxHashMap<Arc<str>, Instant> = FxHashMap::default();
    let mut cancels: BTreeMap<u64, Vec<(String, bool)>> = BTreeMap::new();
    let (mut next, mut submitted, mut ended, mut rejected, mut sync_run, mut steps) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut next_at = work.next_arrival();
    let mut last_progress = Instant::now();
    let start = Instant::now();
    let mut timed_out = false;
    loop {
        let now = Instant::now();
        if now.duration_since(start) >= duration {
            timed_out = next < cfg.requests || submitted > ended;
            break;
        }
        // Arrivals.
        while next < cfg.requests {
            let arrival = match next_at {
                Some(at) if start + at > now => break,
                Some(at) => start + at,
                None if submitted - ended >= cfg.live as u64 => break,
                None => Instant::now(),
            };
            let g = work.request(next);
            let id: Arc<str> = g.req.id.as_str().into();
            let max_new_tokens = g.req.max_new_tokens;
            match sched.submit(g.req) {
                Ok(()) => {
                    submitted += 1;
                    arrival_of.insert(id.clone(), arrival);
                    samples_sent.insert(id.clone(), (0, max_new_tokens));
                    if let Some(after) = g.cancel_after {
                        cancels
                            .entry(steps + after)
                            .or_default()
                            .push((id.to_string(), false));
                    }
                    if let Some(after) = g.fault_cancel_after {
                        cancels
                            .entry(steps + after)
                            .or_default()
                            .push((id.to_string(), true));
                    }
                }
                Err(e) => {
                    rejected += 1;
                    if violations.len() < MAX_VIOLATIONS {
                        violations.push(format!("submit refused: {e}"));
                    }
                }
            }
            next += 1;
            next_at = work.next_arrival();
        }
        if next >= cfg.requests && submitted == ended {
            break;
        }
        while let Some(entry) = cancels.first_entry() {
            if *entry.key() > steps {
                break;
            }
            for (id, fault) in entry.remove() {
                injected.cancel += u64::from(fault);
                sched.cancel(&id);
            }
        }
        // The step.
        let t0 = Instant::now();
        sched.update(std::mem::take(&mut out));
        let plan = sched.schedule();
        out.step = plan.step;
        let t1 = Instant::now();
        steps += 1;
        rec.step.saturating_record(ns(t1 - t0));
        for &l in &plan.runnable_latency_ns {
            rec.runnable.saturating_record(l.max(1));
        }
        for s in &plan.scheduled {
            if let Some(at) = arrival_of.remove(&*s.id) {
                rec.first_schedule
                    .saturating_record(ns(t1.saturating_duration_since(at)));
            }
        }
        for (id, state) in &plan.ended {
            arrival_of.remove(&**id);
            if let Some((sent, max)) = samples_sent.remove(&**id) {
                if *state == EndState::Finished && sent < max && violations.len() < MAX_VIOLATIONS {
                    violations.push(format!(
                        "step {steps}: request {id} finished after {sent} samples, fewer than its {max} tokens to generate (a sample applied twice?)"
                    ));
                }
            }
        }
        // `late`: cancel requests offered an async load in this step, right after dispatch.
        if faults.late > 0.0 {
            while let Some(id) = conn.offers.pop() {
                if draw_for(cfg.seed, 0x1A7E_CA2C, &id) < faults.late
                    && late_done.insert(id.clone())
                {
                    injected.late += 1;
                    sched.cancel(&id);
                }
            }
        }
        ended += plan.ended.len() as u64;
        if violations.len() < MAX_VIOLATIONS {
            check_plan(cfg.mode, &plan, &mut violations);
        }
        // The simulated model.
        if !plan.scheduled.is_empty() {
            simulate_model(model);
        }
        for s in &plan.scheduled {
            if let Some(job) = &s.sync_load {
                sync_run += 1;
                if faults.stale > 0.0 {
                    if let Some(&b) = job.all_loaded_blocks().first() {
                        last_sync_block = Some(b);
                    }
                }
                if let LoadResult::Failed(bad) = sim.decide(job) {
                    out.invalid_blocks.extend(bad.into_flat());
                }
            }
            if s.samples {
                out.sampled.push(s.id.to_string());
                if let Some((sent, _)) = samples_sent.get_mut(&*s.id) {
                    *sent += 1;
                }
            }
        }
        // `duplicate` and `stale`: the engine's output, damaged.
        if cfg.faults.is_some() {
            let (dup, stale) = (frng.unit(), frng.unit());
            let empty =
                out.sampled.is_empty() && out.finished.is_empty() && out.invalid_blocks.is_empty();
            if dup < faults.duplicate && !empty {
                injected.duplicate += 1;
                out.sampled.extend_from_within(..);
                out.finished.extend_from_within(..);
                out.invalid_blocks.extend_from_within(..);
            }
            if stale < faults.stale {
                injected.stale += 1;
                let b = match last_sync_block {
                    Some(b) if frng.unit() < 0.5 => BlockRef {
                        id: b.id,
                        generation: b.generation.wrapping_add(0x8000_0000),
                    },
                    _ => BlockRef {
                        id: cfg.pool_blocks as u64 + frng.below(1024),
                        generation: 1,
                    },
                };
                out.invalid_blocks.push(b);
            }
        }
        if plan.scheduled.is_empty() && plan.ended.is_empty() {
            let mut wait = Duration::from_micros(200);
            if let Some(at) = next_at {
                wait = wait.min((start + at).saturating_duration_since(Instant::now()));
            }
            if !wait.is_zero() {
                sched.wait_for_work(wait);
            }
        }
        if steps % cfg.check_every == 0 && violations.len() < MAX_VIOLATIONS {
            violations.extend(
                sched
                    .check_invariants()
                    .into_iter()
                    .map(|v| format!("step {steps}: {v}")),
            );
        }
        if last_progress.elapsed() >= Duration::from_millis(100) {
            last_progress = Instant::now();
            let m = sched.metrics();
            progress(&Progress {
                scheduler: name,
                total: cfg.requests,
                ended,
                elapsed: start.elapsed(),
                completions: m.loads_ok + m.loads_failed,
            });
        }
    }
    let elapsed = start.elapsed();
    let m = sched.metrics();
    progress(&Progress {
        scheduler: name,
        total: cfg.requests,
        ended: cfg.requests,
        elapsed,
        completions: m.loads_ok + m.loads_failed,
    });
    violations.extend(
        sched
            .check_invariants()
            .into_iter()
            .map(|v| format!("end: {v}")),
    );
    // The engine's output for the last step still goes to the scheduler: shutdown's final
    // step applies it (and counts whatever in it is stale).
    sched.update(std::mem::take(&mut out));
    let report = sched.shutdown();
    violations.extend(report.violations.iter().map(|v| format!("shutdown: {v}")));
    let fm = &report.metrics;
    if fm.submitted != submitted {
        violations.push(format!(
            "accounting: the engine submitted {submitted}, the scheduler counted {}",
            fm.submitted
        ));
    }
    let reconciled =
        fm.submitted == submitted && fm.finished + fm.failed + fm.cancelled == fm.submitted;
    if fm.finished + fm.failed + fm.cancelled != fm.submitted {
        violations.push(format!(
            "accounting: submitted {} != finished {} + failed {} + cancelled {}",
            fm.submitted, fm.finished, fm.failed, fm.cancelled
        ));
    }
    // A load past its deadline is counted failed when it expires, and again when its
    // completion lands (late, in stale) or, still queued at shutdown, in cancelled: count it
    // once.
    let late = fm.late_completions.min(fm.stale_completions);
    let expired_unlanded = fm
        .deadlines_expired
        .saturating_sub(late)
        .min(report.loads_cancelled);
    let applied = fm.loads_ok
        + fm.loads_failed
        + (fm.stale_completions - late)
        + (report.loads_cancelled - expired_unlanded);
    if applied + sync_run > fm.loads_dispatched {
        violations.push(format!(
            "completions: {applied} applied, stale or cancelled + {sync_run} sync loads run > {} dispatched",
            fm.loads_dispatched
        ));
    }
    if fm.late_completions > fm.deadlines_expired {
        violations.push(format!(
            "deadlines: {} late completions > {} deadlines expired",
            fm.late_completions, fm.deadlines_expired
        ));
    }
    injected.deadline = conn.hangs.load(Ordering::Relaxed);
    injected.panic = conn.panics.load(Ordering::Relaxed);
    if name == "kvsched" && fm.connector_panics != injected.panic {
        violations.push(format!(
            "panics: {} injected, {} caught by the workers",
            injected.panic, fm.connector_panics
        ));
    }
    if !report.census.conserved() || report.census.referenced != 0 {
        violations.push(format!("pool after shutdown: {:?}", report.census));
    }
    if rejected > 0 {
        violations.push(format!("{rejected} submissions refused"));
    }
    violations.truncate(MAX_VIOLATIONS);
    drop(rec);
    let secs = elapsed.as_secs_f64().max(1e-9);
    Ok(RunReport {
        scheduler: name,
        requests: RequestCounts {
            submitted: fm.submitted,
            finished: fm.finished,
            failed: fm.failed,
            cancelled: fm.cancelled,
        },
        loads: LoadCounts {
            ok: fm.loads_ok,
            failed: fm.loads_failed,
            stale: fm.stale_completions,
            dispatched: fm.loads_dispatched,
            stale_blocks: fm.stale_blocks,
            sync_run,
        },
        tokens_recomputed: fm.tokens_recomputed,
        claims: fm.claims,
        handoffs: fm.handoffs,
        preemptions: fm.preemptions,
        completions_per_s: ((m.loads_ok + m.loads_failed) as f64 / secs * 10.0).round() / 10.0,
        step_overhead_us: h_step.percentiles(true),
        submit_to_schedule_us: h_first.percentiles(false),
        completion_to_runnable_us: h_runnable.percentiles(false),
        steps,
        elapsed_s: (secs * 1000.0).round() / 1000.0,
        timed_out,
        faults_injected: injected,
        events: Events::of(fm),
        invariants: Invariants {
            ok: violations.is_empty(),
            reconciled,
            violations,
        },
    })
}

/// Runs the stress test of `cfg` (and its baseline, if any) without a progress display.
#[cfg(test)]
pub fn run_stress(cfg: &StressConfig) -> Result<StressReport, StressError> {
    run_stress_with_progress(cfg, &mut |_| {})
}

/// Runs the stress test of `cfg`, reporting progress to `progress` about every 100 ms.
pub fn run_stress_with_progress(
    cfg: &StressConfig,
    progress: &mut dyn FnMut(&Progress),
) -> Result<StressReport, StressError> {
    cfg.validate()?;
    if cfg.fault_rates().panic > 0.0 {
        silence_simulated_panics();
    }
    let sim = Arc::new(SimConnector::new(cfg.sim_config()));
    let conn = Arc::new(FaultConnector::new(cfg, sim.clone()));
    let rt = Runtime::builder()
        .groups(cfg.groups.groups())
        .pool_blocks(cfg.pool_blocks)
        .shards(cfg.shards)
        .workers(cfg.workers)
        .settings(cfg.runtime_settings())
        .token_budget(cfg.token_budget)
        .max_seqs(cfg.max_seqs)
        .connector(conn.clone())
        .build()?;
    let run = drive(rt, "kvsched", cfg, &conn, progress)?;
    let baseline = match cfg.baseline {
        None => None,
        Some(BaselineKind::Mutex) => {
            // The same faults, counted afresh.
            let conn = Arc::new(FaultConnector::new(cfg, sim.clone()));
            let b = MutexScheduler::new(BaselineConfig {
                groups: cfg.groups.groups(),
                pool_blocks: cfg.pool_blocks,
                workers: cfg.workers,
                mode: cfg.mode,
                policy: cfg.policy,
                token_budget: cfg.token_budget,
                max_seqs: cfg.max_seqs,
                connector: conn.clone(),
            })?;
            Some(drive(b, "mutex", cfg, &conn, progress)?)
        }
    };
    let ratio = |a: f64, b: f64| (b > 0.0).then(|| (a / b * 100.0).round() / 100.0);
    let ratios = baseline.as_ref().map(|b| Ratios {
        completions_per_s: ratio(run.completions_per_s, b.completions_per_s),
        step_overhead_p99: ratio(b.step_overhead_us.p99, run.step_overhead_us.p99),
    });
    let mut config = cfg.clone();
    config.load_deadline_ms = cfg
        .effective_load_deadline()
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok(StressReport {
        run,
        config,
        baseline,
        ratios,
    })
}

/// The report as JSON (one object, pretty-printed, newline-terminated).
///
/// Stable keys: `requests.{submitted,finished,failed,cancelled}`, `loads.{ok,failed,stale}`,
/// `tokens_recomputed`, `claims`, `handoffs`, `completions_per_s`,
/// `step_overhead_us.{p50,p90,p99,p999,max}`, `submit_to_schedule_us.{p50,p99,p999,max}`,
/// `completion_to_runnable_us.{p50,p99,p999,max}`, `invariants.ok`, `invariants.reconciled`,
/// `invariants.violations`, `faults_injected.{deadline,panic,late,duplicate,stale,cancel}`,
/// `events.{deadlines_expired,late_completions,connector_panics,stale_completions,stale_blocks,
/// unknown_commands,duplicate_commands,loads_expired_unrun,retry_budget_skips,quarantine_skips,
/// prefixes_quarantined,handoffs}`,
/// `config` (every setting; `config.faults` is `null` without `--faults`, and
/// `config.load_deadline_ms` is the deadline used, `null` for none); with `--baseline mutex` also `baseline` (the same keys but
/// `config`, for the baseline run) and `ratios.{completions_per_s,step_overhead_p99}`
/// (kvsched ÷ baseline for throughput, baseline ÷ kvsched for latency: > 1 means kvsched is
/// better; `null` when a divisor is 0). Additional keys (`scheduler`, `preemptions`, `steps`,
/// `elapsed_s`, `timed_out`, `loads.{dispatched,stale_blocks,sync_run}`, `count` in each
/// latency object) are informative.
///
/// `faults_injected` counts what `--faults` injected, exactly (all 0 without it):
///
/// * `deadline`: asynchronous loads the connector hung for 4× the load deadline
///   (`deadline=R`: share R of loads, per request and attempt);
/// * `panic`: asynchronous loads that panicked in the connector (`panic=R`);
/// * `late`: requests the engine cancelled right after the step that dispatched their
///   asynchronous load (`late=R`: share R of requests offered one), so that load's completion
///   arrives for a cancelled request (the runtime applies it, then ends the request);
/// * `duplicate`: steps whose output the engine reported twice — every sampled and finished
///   id and every failed sync-load block (`duplicate=R`: share R of steps with output);
/// * `stale`: stale blocks the engine named among a step's failed blocks — a block of an
///   earlier sync load with a wrong generation, or an id past the pool (`stale=R`: share R of
///   steps);
/// * `cancel`: client cancels issued at a random later step (`cancel=R`: share R of
///   requests; a cancel may find its request already ended).
///
/// `events` are the scheduler's counters at the end ([`Metrics`]): how it absorbed them
/// (`deadlines_expired`, `late_completions` ⊆ `stale_completions`, `connector_panics`,
/// `stale_blocks`, `unknown_commands`, and the retry-budget / quarantine / hand-off counts).
/// `invariants.reconciled` is whether submitted = finished + failed + cancelled (and the
/// engine's submissions = the scheduler's); it is part of `invariants.ok`.
pub fn render_json(report: &StressReport) -> String {
    let mut s =
        serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}

/// The report as a human-readable table (kvsched and, with a baseline, the baseline and the
/// ratio side by side), newline-terminated.
pub fn render_human(report: &StressReport) -> String {
    let c = &report.config;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "kvsched stress: {} · {} shards · {} workers · rate {} · {} requests · mode {} · policy {} · failure rate {} · seed {}",
        c.groups.name(),
        c.shards,
        c.workers,
        c.rate,
        c.requests,
        match c.mode {
            Mode::Safe => "safe",
            Mode::Vllm => "vllm",
        },
        match c.policy {
            Policy::Recompute => "recompute",
            Policy::Fail => "fail",
        },
        c.failure_rate,
        c.seed
    );
    if let Some(f) = &c.faults {
        let list: Vec<String> = FAULT_NAMES
            .iter()
            .zip(f.rates())
            .filter(|(_, r)| *r > 0.0)
            .map(|(n, r)| format!("{n}={r}"))
            .collect();
        let _ = writeln!(
            o,
            "faults: {} · load deadline {}",
            if list.is_empty() {
                "none".to_owned()
            } else {
                list.join(",")
            },
            c.load_deadline_ms
                .map_or("none".to_owned(), |ms| format!("{ms} ms"))
        );
    }
    let runs: Vec<&RunReport> = std::iter::once(&report.run)
        .chain(report.baseline.as_ref())
        .collect();
    let mut header = format!("{:<34}", "");
    for r in &runs {
        let _ = write!(header, "{:>14}", r.scheduler);
    }
    if report.ratios.is_some() {
        let _ = write!(header, "{:>10}", "ratio");
    }
    let _ = writeln!(o, "\n{}", header.trim_end());
    type Row = (&'static str, fn(&RunReport) -> String);
    let mut sections: Vec<(&str, Vec<Row>)> = vec![
        (
            "requests",
            vec![
                ("submitted", |r| r.requests.submitted.to_string()),
                ("finished", |r| r.requests.finished.to_string()),
                ("failed", |r| r.requests.failed.to_string()),
                ("cancelled", |r| r.requests.cancelled.to_string()),
            ],
        ),
        (
            "loads",
            vec![
                ("ok", |r| r.loads.ok.to_string()),
                ("failed", |r| r.loads.failed.to_string()),
                ("stale", |r| r.loads.stale.to_string()),
            ],
        ),
        (
            "recovery",
            vec![
                ("tokens recomputed", |r| r.tokens_recomputed.to_string()),
                ("blocks claimed", |r| r.claims.to_string()),
                ("hand-offs", |r| r.handoffs.to_string()),
                ("preemptions", |r| r.preemptions.to_string()),
            ],
        ),
        (
            "throughput",
            vec![
                ("completions/s", |r| format!("{:.0}", r.completions_per_s)),
                ("steps", |r| r.steps.to_string()),
                ("run time (s)", |r| format!("{:.2}", r.elapsed_s)),
            ],
        ),
        (
            "step overhead (µs)",
            vec![
                ("p50", |r| format!("{:.1}", r.step_overhead_us.p50)),
                ("p90", |r| {
                    format!("{:.1}", r.step_overhead_us.p90.unwrap_or(0.0))
                }),
                ("p99", |r| format!("{:.1}", r.step_overhead_us.p99)),
                ("p99.9", |r| format!("{:.1}", r.step_overhead_us.p999)),
                ("max", |r| format!("{:.1}", r.step_overhead_us.max)),
            ],
        ),
        (
            "submit → first schedule (µs)",
            vec![
                ("p50", |r| format!("{:.1}", r.submit_to_schedule_us.p50)),
                ("p99", |r| format!("{:.1}", r.submit_to_schedule_us.p99)),
                ("p99.9", |r| format!("{:.1}", r.submit_to_schedule_us.p999)),
                ("max", |r| format!("{:.1}", r.submit_to_schedule_us.max)),
            ],
        ),
        (
            "completion → runnable (µs)",
            vec![
                ("p50", |r| format!("{:.1}", r.completion_to_runnable_us.p50)),
                ("p99", |r| format!("{:.1}", r.completion_to_runnable_us.p99)),
                ("p99.9", |r| {
                    format!("{:.1}", r.completion_to_runnable_us.p999)
                }),
                ("max", |r| format!("{:.1}", r.completion_to_runnable_us.max)),
            ],
        ),
    ];
    if c.faults.is_some() {
        sections.push((
            "faults injected",
            vec![
                ("deadline (loads hung)", |r| {
                    r.faults_injected.deadline.to_string()
                }),
                ("panic (loads panicked)", |r| {
                    r.faults_injected.panic.to_string()
                }),
                ("late (cancelled in load)", |r| {
                    r.faults_injected.late.to_string()
                }),
                ("duplicate (steps)", |r| {
                    r.faults_injected.duplicate.to_string()
                }),
                ("stale (blocks)", |r| r.faults_injected.stale.to_string()),
                ("cancel (cancels)", |r| r.faults_injected.cancel.to_string()),
            ],
        ));
        sections.push((
            "fault events",
            vec![
                ("deadlines expired", |r| {
                    r.events.deadlines_expired.to_string()
                }),
                ("late completions", |r| {
                    r.events.late_completions.to_string()
                }),
                ("connector panics", |r| {
                    r.events.connector_panics.to_string()
                }),
                ("stale completions", |r| {
                    r.events.stale_completions.to_string()
                }),
                ("stale blocks", |r| r.events.stale_blocks.to_string()),
                ("unknown commands", |r| {
                    r.events.unknown_commands.to_string()
                }),
                ("duplicate commands", |r| {
                    r.events.duplicate_commands.to_string()
                }),
                ("expired loads not run", |r| {
                    r.events.loads_expired_unrun.to_string()
                }),
                ("retry budget skips", |r| {
                    r.events.retry_budget_skips.to_string()
                }),
                ("quarantine skips", |r| {
                    r.events.quarantine_skips.to_string()
                }),
                ("prefixes quarantined", |r| {
                    r.events.prefixes_quarantined.to_string()
                }),
                ("hand-offs", |r| r.events.handoffs.to_string()),
            ],
        ));
    }
    for (title, rows) in sections {
        let _ = writeln!(o, "{title}");
        for (label, f) in rows {
            let mut line = format!("  {label:<32}");
            for r in &runs {
                let _ = write!(line, "{:>14}", f(r));
            }
            if let Some(ratios) = &report.ratios {
                let ratio = match (title, label) {
                    ("throughput", "completions/s") => Some(ratios.completions_per_s),
                    ("step overhead (µs)", "p99") => Some(ratios.step_overhead_p99),
                    _ => None,
                };
                if let Some(x) = ratio {
                    let _ = write!(
                        line,
                        "{:>10}",
                        x.map_or("n/a".to_owned(), |x| format!("{x:.2}×"))
                    );
                }
            }
            let _ = writeln!(o, "{}", line.trim_end());
        }
    }
    let _ = writeln!(o, "invariants");
    for r in &runs {
        let _ = writeln!(
            o,
            "  {:<32}{:>14}",
            format!("{} reconciled", r.scheduler),
            if r.invariants.reconciled { "yes" } else { "NO" }
        );
        if r.invariants.ok {
            let _ = writeln!(o, "  {:<32}{:>14}", r.scheduler, "ok");
        } else {
            let _ = writeln!(o, "  {:<32}{:>14}", r.scheduler, "VIOLATED");
            for v in &r.invariants.violations {
                let _ = writeln!(o, "    - {v}");
            }
        }
    }
    o
}
