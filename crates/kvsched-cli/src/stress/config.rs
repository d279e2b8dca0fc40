//! Every setting of a stress run ([`StressConfig`], the `clap` arguments of `kvsched stress`),
//! its defaults, the checks across settings, and what the runtime and connector are built with.

use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;

use super::faults::{Faults, FAULT_NAMES};
use super::load_args::LoadArgs;
use super::prefixes::PrefixArgs;
use super::processes::EnginesArgs;
use super::store::{StoreParser, StoreSpec};
use super::trace::TraceArgs;
use super::values::{
    parse_check_every, parse_cluster, parse_live, parse_max_seqs, parse_mode, parse_model_us,
    parse_policy, parse_pool, parse_seconds, parse_shards, parse_size, parse_unit, parse_workers,
    saturating_secs, ser_mode, ser_policy, BaselineKind, EngineKind, LatencyRange, Preset, Rate,
    Verify, MAX_DURATION_S, MAX_KV_BYTES_PER_TOKEN, MAX_KV_MEMORY_BYTES, MAX_LIVE,
    MAX_MAMBA_STATE_BYTES, MAX_MAX_SEQS, MAX_POOL_BLOCKS, MAX_REPEAT, MAX_SHARDS, MAX_STORE_BYTES,
    MAX_WORKERS, MIN_STORE_BYTES,
};
use kvsched::rules::recovery::{Mode, Policy};
use kvsched::runtime::{RuntimeError, Settings};

pub use super::limits::*;

/// Every setting of a stress run (the `config` key of the JSON report).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct StressConfig {
    /// Requests to submit in all.
    #[arg(long, default_value_t = DEFAULT_REQUESTS, allow_negative_numbers = true, value_parser = super::values::u64_in::<1, MAX_REQUESTS>)]
    pub requests: u64,
    /// Arrival rate: requests per second (open loop, Poisson), or `max` (closed loop at --live).
    /// Any positive rate is accepted; arrivals that would fall after --duration never come.
    /// Whatever the rate, requests wait to arrive while the live ones' prompts hold 2^26 =
    /// 67,108,864 tokens (the run's memory bound; the report counts them).
    #[arg(long, default_value = "2000", allow_negative_numbers = true, value_parser = Rate::from_str)]
    pub rate: Rate,
    /// Live requests kept by `--rate max` (1 to 2^20 = 1,048,576).
    #[arg(long, default_value_t = DEFAULT_LIVE, allow_negative_numbers = true, value_parser = parse_live)]
    pub live: usize,
    /// Longest run time in seconds, at most 86400 (the run ends at whichever of --requests and
    /// --duration comes first). It bounds every wait inside the run: a load on a slow store
    /// stops waiting when it is up, whatever --load-deadline-ms says. With --trace and no
    /// --duration: the replay's last arrival plus 20 s; a --duration shorter than the replay
    /// replays the requests that arrive within it.
    #[arg(long = "duration", default_value_t = DEFAULT_DURATION_S, allow_negative_numbers = true, value_parser = parse_seconds)]
    #[serde(rename = "duration_s")]
    pub duration_s: f64,
    /// Shard threads (1–64).
    #[arg(long, default_value_t = 2, allow_negative_numbers = true, value_parser = parse_shards)]
    pub shards: usize,
    /// Worker threads running loads (1–256).
    #[arg(long, default_value_t = 2, allow_negative_numbers = true, value_parser = parse_workers)]
    pub workers: usize,
    /// What answers the plans: `sim` (the simulated engine) or `model` (the tiny hybrid model,
    /// its tokens judged against each request decoded alone; flags left out size a run of
    /// seconds).
    #[arg(long, default_value = "sim", value_parser = EngineKind::from_str, long_help = super::model::ENGINE_HELP)]
    pub engine: EngineKind,
    /// Cache-group geometry: dense, hybrid-swa, hybrid-mamba, mixed-16-32-64,
    /// hybrid-swa-mamba or hybrid-swa-mamba-all.
    #[arg(long, default_value = "dense", value_parser = Preset::from_str)]
    pub groups: Preset,
    /// Pool size in blocks, the null block included (2 to 2^24 = 16777216).
    #[arg(long, default_value_t = DEFAULT_POOL_BLOCKS, allow_negative_numbers = true, value_parser = parse_pool)]
    pub pool_blocks: usize,
    /// Share of each prompt taken from one of the `--prefixes` shared base prefixes (0–1).
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true, value_parser = parse_unit)]
    pub prefix_share: f64,
    /// Requests arriving together on one base prefix: each run of N consecutive requests
    /// shares its base and its arrival time (1: each request picks its base and arrives on
    /// its own).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = super::values::u32_in::<1, 64>)]
    pub prefix_burst: u32,
    /// Share of the chunks loaded from the sim store that arrive damaged, each on its own (a
    /// flipped byte, caught by the chunk checksum) (0–1): a load of n chunks loses one or
    /// more with probability 1 − (1 − R)^n. Another store takes `--faults corrupt=R` instead
    /// (a rate above 0 given with one is refused).
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true, value_parser = parse_unit)]
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
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = super::values::u64_in::<0, { u64::MAX }>)]
    pub seed: u64,
    /// Simulated model time per step with scheduled work, µs (0–1000000; excluded from step
    /// overhead).
    #[arg(long, default_value_t = DEFAULT_MODEL_US, allow_negative_numbers = true, value_parser = parse_model_us)]
    pub model_us: u64,
    /// Tokens per step.
    #[arg(long, default_value_t = 8192, allow_negative_numbers = true, value_parser = super::values::u64_in::<1, MAX_TOKEN_BUDGET>)]
    pub token_budget: u64,
    /// Sequences per step.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true, value_parser = parse_max_seqs)]
    pub max_seqs: usize,
    /// Longest prompt in tokens; prompts are uniform in [max/4, max].
    #[arg(long, default_value_t = 512, allow_negative_numbers = true, value_parser = super::values::u32_in::<{ MIN_PROMPT_TOKENS as u64 }, { MAX_PROMPT_TOKENS as u64 }>)]
    pub prompt_tokens: u32,
    /// Mean tokens generated per request (geometric-like, capped at 8× the mean).
    #[arg(long, default_value_t = 16, allow_negative_numbers = true, value_parser = super::values::u32_in::<1, { MAX_OUTPUT_TOKENS as u64 }>)]
    pub output_tokens: u32,
    /// Share of each prompt warmed into the sim store before the request is submitted (0–1,
    /// rounded down to the scheduler block size; default 0: every store, the sim store too,
    /// holds only what the run saved).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = parse_unit)]
    pub hit_ratio: f64,
    /// Share of loads that are asynchronous (0–1); the rest run inside the engine's step.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true, value_parser = parse_unit)]
    pub async_ratio: f64,
    /// Latency of a load from the sim store, `MIN..MAX` microseconds, uniform (`N`: always N;
    /// a real store takes what it takes). Sync loads pay it inside their step.
    #[arg(long, default_value = "50..500", allow_hyphen_values = true, value_parser = LatencyRange::from_str)]
    pub load_latency_us: LatencyRange,
    /// Share of requests the client cancels a few steps after submitting (0–1).
    #[arg(long, default_value_t = 0.005, allow_negative_numbers = true, value_parser = parse_unit)]
    pub cancel_ratio: f64,
    /// Check the scheduler's invariants every N steps, N at least 1 (and always at the end).
    #[arg(long, default_value_t = DEFAULT_CHECK_EVERY, allow_negative_numbers = true, value_parser = parse_check_every)]
    pub check_every: u64,
    /// Also run the same workload through a baseline scheduler: `mutex`. The baseline first
    /// runs once unmeasured (a warm-up), so that neither scheduler pays in its figures for
    /// the process's first use of memory.
    #[arg(long, value_parser = BaselineKind::from_str)]
    pub baseline: Option<BaselineKind>,
    /// Where the KV chunks live: `sim` (in memory, behind simulated latency and damage),
    /// `memory`, `disk=DIR`, `redis` (a private redis-server started for the run) or
    /// `redis://HOST:PORT[,…]` (your server or cluster). Store faults (`--faults
    /// corrupt/truncate/evict/slow`) act on memory, disk=DIR and the private redis; the sim
    /// store takes `--failure-rate` instead. Redis is in the default build (not in one built
    /// with `--no-default-features`).
    #[arg(long, default_value = "sim", value_name = "STORE", value_parser = StoreParser)]
    pub store: StoreSpec,
    /// Capacity of a sim, memory or disk store, e.g. 512M or 1G (1M to 16T).
    #[arg(long, default_value = "1G", value_name = "SIZE", allow_hyphen_values = true, value_parser = parse_size)]
    pub store_capacity: u64,
    /// With `--store redis`: start a Redis Cluster of N nodes (3–16) instead of one server.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_cluster)]
    pub redis_cluster: Option<usize>,
    /// With `--store redis`: the private server's maxmemory, e.g. 64M (keys evicted LRU past it).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = parse_size)]
    pub redis_maxmemory: Option<u64>,
    /// Bytes of KV per token in each attention group (1–65536).
    #[arg(long, default_value_t = 16, allow_negative_numbers = true, value_parser = super::values::u64_in::<1, MAX_KV_BYTES_PER_TOKEN>)]
    pub kv_bytes_per_token: u64,
    /// Bytes of one Mamba state (1–1048576).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true, value_parser = super::values::u64_in::<1, MAX_MAMBA_STATE_BYTES>)]
    pub mamba_state_bytes: u64,
    /// Whether the engine checks every KV byte it reads against its reference: `on` or `off`
    /// (off, the bytes still move; compare the step figures to see what verifying costs).
    #[arg(long, default_value = "on", value_parser = Verify::from_str)]
    pub verify: Verify,
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
    ///   blocks (a block seen in a sync load, at a generation older than the one it had
    ///   there, or an id past the pool): counted `stale_blocks` when the step's own sync
    ///   load wrote that block, `foreign_blocks` otherwise, dropped either way;
    /// * `cancel=R`: share R of requests are cancelled by the client at a random later step
    ///   (1–128 steps after submission; on top of --cancel-ratio).
    ///
    /// On a real store kvsched may damage — `--store memory`, `disk=DIR` or `redis` (the
    /// private server it starts); refused on a `redis://` server it does not own, whose
    /// values they would rewrite — the stored bytes themselves:
    ///
    /// * `corrupt=R`: share R of stored chunks get one bit flipped at rest;
    /// * `truncate=R`: share R of stored chunks are cut short at rest;
    /// * `evict=R`: share R of chunk reads find the chunk deleted since the lookup;
    /// * `slow=R`: share R of chunk reads delay their load 4× the load deadline.
    ///
    /// Deadline and panic faults are decided per (request, load attempt), store faults per
    /// chunk key, the others per request or step, all from --seed. Injected counts and what
    /// the runtime did about them are reported (`faults_injected`, `events`, `kv`).
    #[arg(long, value_name = "FAULTS", value_parser = Faults::from_str, verbatim_doc_comment)]
    pub faults: Option<Faults>,
    /// Deadline of an asynchronous load in ms (default: 20 with `--faults deadline=R` or
    /// `slow=R`, R > 0; else the runtime's default of 5000).
    #[arg(long, allow_negative_numbers = true, value_parser = super::values::u64_in::<1, MAX_LOAD_DEADLINE_MS>)]
    pub load_deadline_ms: Option<u64>,
    /// kvsched: work units (about a request touched each) from which a step runs in parallel
    /// on the shard threads (0–16777216; default: the runtime's, 2048, about 1 ms of work).
    #[arg(long, allow_negative_numbers = true, value_parser = super::values::u64_in::<0, MAX_PARALLEL_STEP_WORK>)]
    pub parallel_step_work: Option<u64>,
    /// Before every step, wait until every asynchronous load dispatched so far has delivered
    /// its completion, so that no decision depends on when a worker finishes a load: on the
    /// same seed kvsched and the baseline then see the same inputs at every step. Loads then
    /// never pass their deadline (each lands before the step that would expire it). The wait
    /// ends when --duration is up, however long the store takes. Meant for comparing
    /// decisions (with `--load-latency-us 0..0`), not for measuring latency.
    #[arg(long)]
    pub lockstep: bool,
    /// Run each scheduler N times (1–100), interleaved ABBA (kvsched, baseline, baseline,
    /// kvsched, …) so that drift hits both; every figure is then the median and min–max of
    /// the runs.
    #[arg(long, value_name = "N", default_value_t = 1, allow_negative_numbers = true, value_parser = super::values::u32_in::<1, { MAX_REPEAT as u64 }>)]
    pub repeat: u32,
    /// Several engine processes on one shared store (`--engines`, `--redis-restarts`).
    #[command(flatten)]
    #[serde(flatten)]
    pub engines: EnginesArgs,
    /// `--trace`, `--trace-speed`, `--trace-requests`.
    #[command(flatten)]
    #[serde(flatten)]
    pub trace: TraceArgs,
    /// The synthetic workload's shared prefixes (`--prefixes`).
    #[command(flatten)]
    #[serde(flatten)]
    pub prefix: PrefixArgs,
    /// `--load-policy`, `--compute-rate`.
    #[command(flatten)]
    #[serde(flatten)]
    pub load: LoadArgs,
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
            engine: EngineKind::Sim,
            groups: Preset::Dense,
            pool_blocks: DEFAULT_POOL_BLOCKS,
            prefix_share: 0.5,
            prefix_burst: 1,
            failure_rate: 0.01,
            policy: Policy::Recompute,
            mode: Mode::Safe,
            seed: 1,
            model_us: DEFAULT_MODEL_US,
            token_budget: 8192,
            max_seqs: 256,
            prompt_tokens: 512,
            output_tokens: 16,
            hit_ratio: 0.0,
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
            parallel_step_work: None,
            lockstep: false,
            repeat: 1,
            store: StoreSpec::Sim,
            store_capacity: 1 << 30,
            redis_cluster: None,
            redis_maxmemory: None,
            kv_bytes_per_token: 16,
            mamba_state_bytes: 64,
            verify: Verify::On,
            engines: EnginesArgs::default(),
            trace: TraceArgs::default(),
            prefix: PrefixArgs::default(),
            load: LoadArgs::default(),
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
    /// The KV data plane (memory, connector) could not be set up.
    #[error("kv: {0}")]
    Kv(String),
}

impl StressConfig {
    /// The longest generation a request may draw.
    pub(super) fn max_output_tokens(&self) -> u64 {
        u64::from(self.output_tokens) * 8
    }

    /// Checks every setting: the ranges the flags' parsers enforce (a `StressConfig` built in
    /// code gets the same checks) and the checks across settings. A run never panics on a
    /// configuration this accepts.
    pub fn validate(&self) -> Result<(), StressError> {
        self.check_shares()?;
        self.check_ranges()?;
        self.check_rate_and_duration()?;
        super::model::check(self)?;
        super::prefixes::check(self)?;
        self.check_across()
    }

    /// The shares and rates from 0 to 1, `--faults`' included.
    fn check_shares(&self) -> Result<(), StressError> {
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
        Ok(())
    }

    /// The integer settings, each within its flag's range.
    fn check_ranges(&self) -> Result<(), StressError> {
        for (flag, x, lo, hi) in self.ranges() {
            if !(lo..=hi).contains(&x) {
                return bad(flag, format!("must be from {lo} to {hi}, got {x}"));
            }
        }
        Ok(())
    }

    /// Each integer setting's flag, value, least and greatest value, in the order checked.
    fn ranges(&self) -> [(&'static str, u64, u64, u64); 19] {
        [
            ("--requests", self.requests, 1, MAX_REQUESTS),
            ("--live", self.live as u64, 1, MAX_LIVE as u64),
            ("--shards", self.shards as u64, 1, MAX_SHARDS as u64),
            ("--workers", self.workers as u64, 1, MAX_WORKERS as u64),
            (
                "--pool-blocks",
                self.pool_blocks as u64,
                2,
                MAX_POOL_BLOCKS as u64,
            ),
            ("--model-us", self.model_us, 0, MAX_MODEL_US),
            ("--token-budget", self.token_budget, 1, MAX_TOKEN_BUDGET),
            ("--max-seqs", self.max_seqs as u64, 1, MAX_MAX_SEQS as u64),
            (
                "--prompt-tokens",
                u64::from(self.prompt_tokens),
                MIN_PROMPT_TOKENS as u64,
                MAX_PROMPT_TOKENS as u64,
            ),
            (
                "--output-tokens",
                u64::from(self.output_tokens),
                1,
                MAX_OUTPUT_TOKENS as u64,
            ),
            (
                "--load-latency-us",
                self.load_latency_us.max_us,
                0,
                MAX_LOAD_LATENCY_US,
            ),
            ("--check-every", self.check_every, 1, u64::MAX),
            (
                "--load-deadline-ms",
                self.load_deadline_ms.unwrap_or(1),
                1,
                MAX_LOAD_DEADLINE_MS,
            ),
            ("--repeat", u64::from(self.repeat), 1, u64::from(MAX_REPEAT)),
            (
                "--kv-bytes-per-token",
                self.kv_bytes_per_token,
                1,
                MAX_KV_BYTES_PER_TOKEN,
            ),
            (
                "--mamba-state-bytes",
                self.mamba_state_bytes,
                1,
                MAX_MAMBA_STATE_BYTES,
            ),
            (
                "--store-capacity",
                self.store_capacity,
                MIN_STORE_BYTES,
                MAX_STORE_BYTES,
            ),
            (
                "--redis-cluster",
                self.redis_cluster.map_or(3, |n| n as u64),
                3,
                16,
            ),
            (
                "--redis-maxmemory",
                self.redis_maxmemory.unwrap_or(MIN_STORE_BYTES),
                MIN_STORE_BYTES,
                MAX_STORE_BYTES,
            ),
        ]
    }

    /// `--rate` (a positive rate, or `max`) and `--duration` (positive, at most a day).
    fn check_rate_and_duration(&self) -> Result<(), StressError> {
        if let Rate::PerSecond(r) = self.rate {
            if !(r.is_finite() && r > 0.0) {
                return bad("--rate", format!("must be positive, got {r}"));
            }
        }
        if !(self.duration_s.is_finite()
            && self.duration_s > 0.0
            && self.duration_s <= MAX_DURATION_S)
        {
            return bad(
                "--duration",
                format!(
                    "must be more than 0 and at most {MAX_DURATION_S} seconds, got {}",
                    self.duration_s
                ),
            );
        }
        Ok(())
    }

    /// The checks across settings: enough budget and sequences for every shard, a latency
    /// range in order, and a pool that holds the longest synthetic request.
    fn check_across(&self) -> Result<(), StressError> {
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
        // A trace's requests have their own lengths: `--trace` checks each against the pool
        // once it is read (`trace_fit`), naming the first that does not fit.
        if self.trace.trace.is_none() && needed + 1 > self.pool_blocks as u64 {
            return bad(
                "--pool-blocks",
                format!(
                    "{} blocks cannot hold one request of up to {tokens} tokens ({needed} blocks + the null block)",
                    self.pool_blocks
                ),
            );
        }
        let memory = self
            .kv_block_bytes()
            .saturating_mul(self.pool_blocks as u64);
        if memory > MAX_KV_MEMORY_BYTES {
            return bad(
                "--pool-blocks",
                format!(
                    "{} blocks × {} bytes per block (--kv-bytes-per-token, --mamba-state-bytes) = {memory} bytes of KV memory, over the {MAX_KV_MEMORY_BYTES}-byte cap",
                    self.pool_blocks,
                    self.kv_block_bytes()
                ),
            );
        }
        self.check_store()
    }

    /// The store's flags: store faults only on a store they can damage, the Redis flags only
    /// with the private Redis store.
    fn check_store(&self) -> Result<(), StressError> {
        if self.fault_rates().has_store_faults() && !self.store.takes_faults() {
            return bad(
                "--faults",
                "corrupt, truncate, evict and slow damage a real store's bytes: use them with --store memory, disk=DIR or redis (the sim store has simulated damage instead: --failure-rate)".to_owned(),
            );
        }
        let owned = self.engines.store_owned && self.engines.engine_index.is_some();
        if self.fault_rates().has_store_faults()
            && matches!(self.store, StoreSpec::RedisUrl { .. })
            && !owned
        {
            return bad(
                "--faults",
                "corrupt, truncate, evict and slow rewrite and delete values on the store: refused on a Redis server kvsched does not own (--store redis://…); use --store redis (a private server kvsched starts), memory or disk=DIR".to_owned(),
            );
        }
        if self.store != StoreSpec::Redis {
            if self.redis_cluster.is_some() {
                return bad(
                    "--redis-cluster",
                    "only with --store redis (the private server it starts)".to_owned(),
                );
            }
            if self.redis_maxmemory.is_some() {
                return bad(
                    "--redis-maxmemory",
                    "only with --store redis (the private server it starts)".to_owned(),
                );
            }
        }
        Ok(())
    }

    /// The longest run, `--duration`.
    pub(super) fn duration(&self) -> Duration {
        saturating_secs(self.duration_s)
    }

    /// The fault rates (all 0 without `--faults`).
    pub(super) fn fault_rates(&self) -> Faults {
        self.faults.unwrap_or_default()
    }

    /// The async-load deadline the run uses (see `--load-deadline-ms`).
    pub fn effective_load_deadline(&self) -> Option<Duration> {
        match self.load_deadline_ms {
            Some(ms) => Some(Duration::from_millis(ms)),
            None if self.fault_rates().deadline > 0.0 || self.fault_rates().slow > 0.0 => {
                Some(Duration::from_millis(DEFAULT_FAULT_DEADLINE_MS))
            }
            None => Settings::default().load_deadline,
        }
    }

    /// The runtime's live settings, but for the load policy's (`load_args`).
    pub(super) fn runtime_settings(&self) -> Settings {
        Settings::default()
            .with_mode(self.mode)
            .with_policy(self.policy)
            .with_load_deadline(self.effective_load_deadline())
    }

    /// The scheduler block size `S` of the geometry.
    pub(super) fn scheduler_block_size(&self) -> u64 {
        kvsched::rules::geometry::Geometry::new(self.groups.groups(), None, 0)
            .map(|g| g.scheduler_block_size())
            .unwrap_or(16)
    }

    /// How long a `slow` store fault delays a load: [`HANG_DEADLINES`] load deadlines (so the
    /// deadline passes first), at most an hour.
    pub(super) fn slow_for(&self) -> Duration {
        self.effective_load_deadline()
            .unwrap_or(Duration::from_millis(DEFAULT_FAULT_DEADLINE_MS))
            .saturating_mul(HANG_DEADLINES)
            .min(Duration::from_secs(3600))
    }
}

/// The error of a setting out of range: `flag` and what is wrong with it.
fn bad(flag: &'static str, problem: String) -> Result<(), StressError> {
    Err(StressError::Config { flag, problem })
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
