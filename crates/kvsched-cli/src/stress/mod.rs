//! `kvsched stress`: a simulated engine driving the public [`Runtime`] API (and, with
//! `--baseline mutex`, the [`MutexScheduler`] on the very same seeded workload), measured with
//! hdrhistogram and checked against the invariants of docs/runtime.md ("Invariants").
//!
//! # The simulated engine
//!
//! A loop of steps: submit the requests whose arrival time has come, [`Scheduler::update`] with
//! the last step's output (which says which outputs to discard), settle that step's KV reads,
//! [`Scheduler::schedule`], then "run the model": wait a fixed cost per step (`--model-us`)
//! and let the [`SimEngine`](kvsched_testkit::SimEngine) answer the plan on real KV bytes.
//!
//! # Real bytes
//!
//! Every run has a data plane: host KV memory sized to the pool
//! ([`HostKvMemory`](kvsched::kv::HostKvMemory), `--kv-bytes-per-token`, `--mamba-state-bytes`),
//! a [`TierConnector`](kvsched::kv::TierConnector) joining it to the store of `--store`
//! ([`store`]), and the verifying [`KvChecker`](kvsched_testkit::KvChecker) inside the engine. The
//! engine runs the plan's synchronous loads through the connector (failed blocks go into
//! [`StepOutput::invalid_blocks`]), reads every KV entry each scheduled request's tables name
//! and checks it against a reference computed from the request's own tokens, writes what the
//! step computes, samples a token for every request scheduled with `samples`, and — once
//! `update` has said which outputs to discard — counts the step's garbage as kept or
//! discarded and offers the kept requests' full prompt blocks to the store (write-behind).
//! Asynchronous loads run on the scheduler's workers through the same connector. kvsched and
//! the baseline run the same engine, each on its own memory, connector and store.
//!
//! On the sim store, `--hit-ratio` warms: before a request is submitted its reference chunks
//! of that share of its prompt are stored (`store_now`, on the engine thread, outside the
//! timed step). Real stores start as they are and fill from what the engine saves.
//!
//! With `--lockstep` the loop first waits until every asynchronous load dispatched so far has
//! delivered its completion and every save has been stored, so no decision depends on when a
//! worker finishes: on the same seed, one shard and the baseline then decide alike at every
//! step (the report's recovery section says whether they did, and why not). Each request's
//! length to generate (`max_new_tokens`) is drawn from a seeded geometric-like distribution;
//! the scheduler ends it when it has generated them.
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
//! * *load completions*: load completions applied by the scheduler (`loads_ok +
//!   loads_failed`), per second of run time; *finished requests* and *output tokens* (those
//!   of the finished requests) likewise;
//! * *CPU*: the process's user and system time over the run (`getrusage`), per wall-second
//!   and per finished request;
//! * *step overhead*: wall time of `schedule()` + `update()`, the simulated model excluded;
//! * *submit → first schedule*: scheduled arrival → the plan that first schedules the request;
//! * *completion → runnable*: [`StepPlan::runnable_latency_ns`];
//! * *KV bytes*: bytes loaded, saved and verified, garbage reads, and the connector's
//!   integrity counters (checksum, missing chunks, key, MAC, format, tier errors, saves
//!   dropped).
//!
//! Latencies are recorded in hdrhistogram per-thread recorders and merged at the end; the
//! same histograms give the report's percentiles and `--plot`'s curves. With `--repeat N`
//! each scheduler runs N times, interleaved, and every figure is reported as the median and
//! min–max of the runs, each ratio as that of the run pairs.
//!
//! # Faults
//!
//! `--faults deadline=R,panic=R,late=R,duplicate=R,stale=R,cancel=R` rehearses failures: the
//! connector is wrapped in a fault-injecting one (hangs past the load deadline, panics,
//! decided per request and load attempt from the seed and counted exactly), and the engine
//! damages its own output (cancels right after a load is dispatched, repeated step outputs,
//! stale blocks, cancels at random later steps). On a memory or disk store
//! `corrupt=R,truncate=R,evict=R,slow=R` damage the stored bytes ([`FaultyTier`]). The report
//! counts what was injected (`faults_injected`) and what the scheduler did about it
//! (`events`, `kv`); see [`render_json`].
//!
//! [`FaultyTier`]: kvsched_testkit::FaultyTier
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
//! In mode `safe`, a garbage read in a step whose output was kept is a violation.
//!
//! # Layout
//!
//! [`config`] (every setting, the `clap` arguments) over [`values`] (the flag value types,
//! their caps and parsers); [`workload`] (the seeded requests and arrivals); [`store`]
//! (`--store` and the tier each run opens); [`faults`]
//! (`--faults` and the fault-injecting connector); [`scheduler`] (the trait the engine drives,
//! for the runtime and the baseline); [`drive`](mod@drive) (the simulated engine) with
//! [`checks`] (its invariant checks and the reconciliation), [`histograms`] and [`cpu`];
//! [`report`] (the data, the median of repeated runs), [`figures`] (every row with its runs,
//! median, range and ratio), [`render`] (human and JSON), [`plot`] (the SVG) and [`progress`]
//! (the progress bar).
//!
//! [`Scheduler::update`]: scheduler::Scheduler::update
//! [`Scheduler::schedule`]: scheduler::Scheduler::schedule
//! [`Scheduler::check_invariants`]: scheduler::Scheduler::check_invariants
//! [`StepOutput::invalid_blocks`]: kvsched::runtime::StepOutput::invalid_blocks
//! [`StepPlan::runnable_latency_ns`]: kvsched::runtime::StepPlan::runnable_latency_ns
//! [`Report::violations`]: kvsched::runtime::Report::violations

mod answerer;
mod checks;
mod config;
mod cpu;
mod drive;
mod faults;
mod figure_rows;
mod figures;
mod figures_prompt;
mod first_token;
mod held;
mod histograms;
mod kv_sizes;
mod limits;
mod load_args;
mod load_bandwidth;
mod load_policy;
mod merge;
mod model;
mod model_time;
mod plot;
mod prefixes;
mod processes;
mod progress;
mod prompt_sources;
mod redis_traffic;
mod render;
mod report;
mod run_end;
mod scheduler;
mod stats;
mod step_cost;
mod store;
mod trace;
mod trace_fit;
mod trace_reference;
mod values;
mod workload;

use std::sync::Arc;

pub use config::{StressConfig, StressError};
pub use model::apply_defaults as apply_engine_defaults;
pub use plot::render_svg;
pub use processes::{progress_sink, run_engines};
pub use progress::{terminal_progress, Progress};
pub use render::{render_human, render_json};
pub use report::StressReport;
pub use trace::follow_trace_duration;
pub(crate) use values::parse_u64_range;
pub use values::BaselineKind;
// Named by the tools' tests (`crate::stress::{Preset, Rate, Scheduler}`); nothing else outside
// this module does.
#[cfg(test)]
pub use scheduler::Scheduler;
#[cfg(test)]
pub use values::{Preset, Rate};

use crate::baseline::{BaselineConfig, MutexScheduler};
use drive::{drive, Plane};
use faults::{silence_simulated_panics, FaultConnector};
use kvsched::kv::{HostKvMemory, KvLayout, KvMemory, TierConnector, TierConnectorConfig};
use kvsched::rules::geometry::CacheGroup;
use kvsched::runtime::Runtime;
use kvsched_testkit::{KvChecker, SimEngine};
use progress::Nth;
use report::RunReport;
use store::Stores;
use values::{EngineKind, Verify};

/// Runs the stress test of `cfg` (and its baseline, if any) without a progress display.
#[cfg(test)]
pub fn run_stress(cfg: &StressConfig) -> Result<StressReport, StressError> {
    run_stress_with_progress(cfg, &mut |_| {})
}

/// Runs the stress test of `cfg`, reporting progress to `progress` about every 100 ms. With
/// `--repeat N`, kvsched and the baseline run N times each, interleaved ABBA (kvsched,
/// baseline, baseline, kvsched, kvsched, …), so drift over time hits both alike. With a
/// baseline, the baseline first runs once unmeasured (see [`warm_up`]), so that neither pays
/// in its figures for the process's first use of memory.
pub fn run_stress_with_progress(
    cfg: &StressConfig,
    progress: &mut dyn FnMut(&Progress),
) -> Result<StressReport, StressError> {
    cfg.validate()?;
    let cfg = &trace::load(cfg)?;
    if cfg.fault_rates().panic > 0.0 {
        silence_simulated_panics();
    }
    // Lives over every run: a private Redis server is stopped when it drops.
    let stores = Stores::start(cfg)?;
    let mut runs = Vec::new();
    let mut baseline_runs = Vec::new();
    if let Some(warm) = warm_up(cfg) {
        let nth = Nth {
            run: 0,
            of: cfg.repeat,
        };
        run_mutex(warm, &stores, nth, progress)?;
    }
    for i in 0..cfg.repeat {
        let nth = Nth {
            run: i + 1,
            of: cfg.repeat,
        };
        // ABBA: the scheduler that runs first alternates from round to round, so neither
        // always runs on a process (allocator, page cache, CPU frequency) the other warmed.
        let mutex = matches!(cfg.baseline, Some(BaselineKind::Mutex));
        if mutex && i % 2 == 1 {
            baseline_runs.push(run_mutex(cfg, &stores, nth, progress)?);
        }
        runs.push(run_kvsched(cfg, &stores, nth, progress)?);
        if mutex && i % 2 == 0 {
            baseline_runs.push(run_mutex(cfg, &stores, nth, progress)?);
        }
    }
    let mut config = cfg.clone();
    config.load_deadline_ms = cfg
        .effective_load_deadline()
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    StressReport::of(runs, baseline_runs, config).ok_or(StressError::Config {
        flag: "--repeat",
        problem: "no run".to_owned(),
    })
}

/// The unmeasured warm-up of a comparison (`--baseline`): one run of the baseline on the whole
/// workload before the measured runs. The first run in a fresh process pays for the allocator
/// taking memory from the system (page faults, huge pages zeroed, inside the scheduler's
/// steps as elsewhere), and the first measured run is always kvsched's; a warm-up shorter
/// than a run leaves part of that growth to it. `None` without a baseline.
fn warm_up(cfg: &StressConfig) -> Option<&StressConfig> {
    cfg.baseline.map(|_| cfg)
}

/// The data plane of one run of scheduler `who`: the store opened for it, host KV memory
/// sized to the pool, the connector joining them and the verifying engine.
fn plane(cfg: &StressConfig, stores: &Stores, who: &str) -> Result<Plane, StressError> {
    if cfg.engine == EngineKind::Model {
        return model::plane(cfg, stores, who);
    }
    let kv = |e: &dyn std::fmt::Display| StressError::Kv(e.to_string());
    let groups = cfg.groups.groups();
    // Both fit: validate() caps them far below usize::MAX.
    let bpt = usize::try_from(cfg.kv_bytes_per_token).map_err(|e| kv(&e))?;
    let state = usize::try_from(cfg.mamba_state_bytes).map_err(|e| kv(&e))?;
    let layout = KvLayout::for_groups(&groups, bpt, state).map_err(|e| kv(&e))?;
    let chunk_bytes = max_chunk_bytes(&layout);
    let store = stores.open(cfg, who, chunk_bytes)?;
    let memory: Arc<dyn KvMemory> =
        Arc::new(HostKvMemory::new(layout, cfg.pool_blocks).map_err(|e| kv(&e))?);
    let connector = Arc::new(
        TierConnector::new(
            Arc::clone(&store.tier),
            Arc::clone(&memory),
            connector_config(cfg, &groups, chunk_bytes),
        )
        .map_err(|e| kv(&e))?,
    );
    let mut checker = KvChecker::new(groups, cfg.kv_tag(), bpt, state, memory);
    checker.set_verify(cfg.verify == Verify::On);
    Ok(Plane {
        engine: answerer::Answerer::Sim(
            SimEngine::with_kv(Arc::clone(&connector), checker),
            Default::default(),
        ),
        connector,
        store,
    })
}

/// One kvsched run.
fn run_kvsched(
    cfg: &StressConfig,
    stores: &Stores,
    nth: Nth,
    progress: &mut dyn FnMut(&Progress),
) -> Result<RunReport, StressError> {
    let plane = plane(cfg, stores, "kvsched")?;
    let conn = Arc::new(FaultConnector::new(cfg, Arc::clone(&plane.connector)));
    let mut rt = Runtime::builder();
    if let Some(units) = cfg.parallel_step_work {
        rt = rt.parallel_step_work(usize::try_from(units).unwrap_or(usize::MAX));
    }
    let rt = rt
        .groups(cfg.groups.groups())
        .pool_blocks(cfg.pool_blocks)
        .shards(cfg.shards)
        .workers(cfg.workers)
        .settings(cfg.load.settings(cfg, cfg.runtime_settings()))
        .token_budget(cfg.token_budget)
        .max_seqs(cfg.max_seqs)
        .connector(conn.clone())
        .build()?;
    drive(rt, "kvsched", nth, cfg, &conn, plane, progress)
}

/// One run of the mutex baseline: the same workload, faults, engine and verification, on its
/// own memory, connector and store, counted afresh.
fn run_mutex(
    cfg: &StressConfig,
    stores: &Stores,
    nth: Nth,
    progress: &mut dyn FnMut(&Progress),
) -> Result<RunReport, StressError> {
    let plane = plane(cfg, stores, "mutex")?;
    let conn = Arc::new(FaultConnector::new(cfg, Arc::clone(&plane.connector)));
    let b = MutexScheduler::new(BaselineConfig {
        groups: cfg.groups.groups(),
        pool_blocks: cfg.pool_blocks,
        workers: cfg.workers,
        mode: cfg.mode,
        policy: cfg.policy,
        token_budget: cfg.token_budget,
        max_seqs: cfg.max_seqs,
        connector: conn.clone(),
        load_policy: cfg.load.load_policy,
        compute_rate: Some(cfg.load.compute_rate(cfg)),
    })?;
    drive(b, "mutex", nth, cfg, &conn, plane, progress)
}

/// The largest chunk of `layout`: one block of one group, behind its header and (with a key)
/// its MAC.
fn max_chunk_bytes(layout: &KvLayout) -> usize {
    kvsched::kv::HEADER_LEN
        .saturating_add(layout.max_block_bytes())
        .saturating_add(kvsched::kv::MAC_LEN)
}

/// Bytes of chunks the write-behind queue of a run holds at most (at least the library's
/// default queue of 4,096 chunks): a trace's prompt of 10k+ tokens offers hundreds of chunks
/// in one step, and a chunk dropped from a prompt's chain makes every later one unreachable
/// by a prefix lookup.
const SAVE_QUEUE_BYTES: usize = 64 << 20;

/// Most keys a run's connector index remembers (16 bytes each and the set's overhead).
const MAX_INDEX_KEYS: usize = 1 << 24;

/// How long dropping a run's connector waits for its threads (the library's default is
/// 10 s): the run's end has given its saves 2 s to be stored already, so a thread still in a
/// store call then waits on a store that stopped answering, and the report waits for it no
/// longer than this.
const CONNECTOR_DROP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The connector of a run over `groups` with chunks of at most `chunk_bytes`: the run's tag,
/// async share and seed, a save queue of [`SAVE_QUEUE_BYTES`], an index of the keys of as
/// many chunks as the store holds, a drop that waits [`CONNECTOR_DROP_WAIT`] at most; a disk
/// store's saves (kernel work) take a quarter of a core at most, in puts of up to 1,024
/// chunks (one pack file each).
fn connector_config(
    cfg: &StressConfig,
    groups: &[CacheGroup],
    chunk_bytes: usize,
) -> TierConnectorConfig {
    let defaults = TierConnectorConfig::default();
    let chunk_bytes = chunk_bytes.max(1);
    let queue = (SAVE_QUEUE_BYTES / chunk_bytes).max(defaults.save_queue);
    // The index remembers as many keys as the store holds chunks (a Redis without
    // maxmemory: as many as the default store), so a lookup finds what the tier still has.
    let held = if cfg.store.is_redis() {
        cfg.redis_maxmemory.unwrap_or(cfg.store_capacity)
    } else {
        cfg.store_capacity
    };
    let index = usize::try_from(held).unwrap_or(usize::MAX) / chunk_bytes;
    TierConnectorConfig::default()
        .with_save_queue(queue)
        .with_index_capacity(index.clamp(defaults.index_capacity, MAX_INDEX_KEYS))
        .with_groups(groups.to_vec())
        .with_scheduler_block_size(Some(cfg.scheduler_block_size()))
        .with_tag(cfg.kv_tag())
        .with_async_ratio(cfg.async_ratio)
        .with_seed(cfg.seed ^ 0x5eed_c0de)
        .with_drop_timeout(CONNECTOR_DROP_WAIT)
        .with_save_cpu_share(if matches!(cfg.store, store::StoreSpec::Disk(_)) {
            0.25
        } else {
            1.0
        })
        .with_save_batch(if matches!(cfg.store, store::StoreSpec::Disk(_)) {
            1024
        } else {
            32
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--repeat` runs the schedulers interleaved ABBA after a warm-up run of the baseline
    /// (run 0, not kept), and every measured run is kept.
    #[test]
    fn repeat_interleaves_the_schedulers() {
        let cfg = StressConfig {
            requests: 40,
            rate: Rate::Max,
            live: 16,
            duration_s: 10.0,
            model_us: 0,
            baseline: Some(BaselineKind::Mutex),
            repeat: 2,
            ..StressConfig::default()
        };
        let mut order: Vec<(&str, u32)> = Vec::new();
        let r = run_stress_with_progress(&cfg, &mut |p| {
            let who = (p.scheduler, p.nth.run);
            if order.last() != Some(&who) {
                order.push(who);
            }
        })
        .expect("stress");
        assert_eq!(
            order,
            [
                ("mutex", 0),
                ("kvsched", 1),
                ("mutex", 1),
                ("mutex", 2),
                ("kvsched", 2)
            ]
        );
        assert_eq!((r.runs.len(), r.baseline_runs.len()), (2, 2));
        assert!(r.invariants_ok(), "{:?}", r.violations());
        let f = r.figures.get("steps").expect("steps");
        assert_eq!(f.kvsched.as_ref().map(|s| s.runs.len()), Some(2));
    }
}
