//! `kvsched stress --engines N`: several engine processes on one shared store.
//!
//! With `--engines N` (or `--redis-restarts K`) the process that parsed the command line runs
//! no scheduler. It is the *parent*: it owns the shared store's server when `--store redis`
//! asks for one (a [`LocalRedis`](kvsched_testkit::redis::LocalRedis), or with `--redis-cluster M` a
//! [`LocalCluster`](kvsched_testkit::redis::LocalCluster), with `--redis-maxmemory`), and runs `N`
//! child processes of its own binary, each
//!
//! ```text
//! kvsched stress <the same arguments> --store redis://127.0.0.1:PORT[,…] --engine-index i --json
//! ```
//!
//! (the parent's own flags — `--engines`, `--redis-restarts`, `--store`, `--redis-cluster`,
//! `--redis-maxmemory`, `--json` — left out). With `--store redis://…` (a server the user
//! runs) the parent passes the URL on as it is. Only Redis is shared: `sim` and `memory` live
//! in one process and a disk tier belongs to one process at a time, so `--engines` above 1 is
//! refused with them. With any `--engines`, `--plot`, `--baseline` and `--repeat` above 1,
//! whose figures the combined report does not hold, are refused, and so is a `--trace`
//! replaying fewer requests than engines (an engine would have none): one line naming both
//! flags, before anything starts.
//!
//! # The engines
//!
//! `--engine-index i` (hidden from `--help`) prefixes the child's request ids with `e{i}-`
//! and changes nothing else: every engine runs the seeded workload of the same `--seed`, so
//! the same prompts (and their shared prefixes) recur across engines, and what one engine
//! saved is another's hit. Each child's `chunks_loaded_from_others` — chunks it loaded that it
//! did not save — is therefore its *cross-engine hits*.
//!
//! Children are spawned with `PR_SET_PDEATHSIG(SIGKILL)` from the parent's main thread, so
//! they die with the parent however it ends; their stdout (the JSON report) and stderr are
//! captured. A child reports its progress on stderr ([`progress_sink`]); every other line it
//! writes there is echoed on the parent's stderr prefixed by `e{i}: `.
//!
//! # Restarts
//!
//! `--redis-restarts K` restarts the parent's own server `K` times, spread over the run:
//! restart `k` comes when the engines' mean progress reaches `k / (K + 1)` (progress is the
//! share of requests ended, or of `--duration` elapsed if that is larger). A restart kills
//! the server and starts it again on the same port, empty; in a cluster the nodes take turns.
//! Refused against a user's server. The children must ride it out — loads in flight fail
//! and are recovered, lookups miss, saves resume after the tier reconnects — and their own
//! invariant checks (request accounting included) say whether they did.
//!
//! # The report
//!
//! The parent parses each child's JSON report and prints one combined report: a row per
//! engine (exit code, requests, garbage reads, cross-engine hits, bytes loaded, checksum
//! failures, tier errors, reconnects, throughput, step p99), their sum, the restarts, and
//! whether every request is accounted for in every engine (in each engine, submitted =
//! finished + failed + cancelled). With `--json` the combined report is JSON (keys in
//! [`combine`](mod@combine)). Exit code: the worst child's (1 for an invariant violation, 2
//! for bad input), 1 when the parent finds a violation itself (a child without a report,
//! an engine whose requests do not add up, a restart that did not happen), 130 when
//! interrupted.
//!
//! # Stopping
//!
//! On SIGINT or SIGTERM the parent stops the children and its server and exits 130; on an
//! error it stops them as it unwinds (each is stopped on drop). A child that has not ended
//! long after `--duration` is killed and counted as failed.

mod args;
mod children;
mod combine;
mod rows;
mod server;

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::config::StressConfig;
use super::store::StoreSpec;
use super::values::BaselineKind;
use super::{terminal_progress, Progress};
use args::{child_args, Plan};
use children::{Children, Interrupt};
use combine::{Combined, EngineOutcome, RestartEvent};
use server::OwnedServer;

/// The most engines (`--engines`).
pub const MAX_ENGINES: u8 = 16;
/// The most restarts (`--redis-restarts`).
pub const MAX_RESTARTS: u32 = 100;
/// The exit code of an interrupted run (128 + SIGINT, what a shell shows).
const EXIT_INTERRUPTED: u8 = 130;
/// How long past its expected end (`--duration` times its runs) a child may run before it
/// is killed.
const CHILD_GRACE: Duration = Duration::from_secs(120);
/// How often the parent looks at its children, its restarts and the signal flag.
const POLL: Duration = Duration::from_millis(20);

/// The multi-engine flags of `kvsched stress` (flattened into its arguments).
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct EnginesArgs {
    /// Run N engine processes (1–16) on one shared Redis store instead of one engine in this
    /// process: this process then owns the server (with `--store redis`) or passes a
    /// `--store redis://…` URL on, runs the engines, and prints one combined report. Refused
    /// with what one process's report holds and the combined one does not (`--plot`,
    /// `--baseline`, `--repeat` above 1), with `--engine model`, and with a `--trace` replaying
    /// fewer requests than N.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = super::values::u8_in::<1, { MAX_ENGINES as u64 }>)]
    pub engines: Option<u8>,
    /// Restart the Redis server kvsched owns (`--store redis`) K times (0–100), spread over the
    /// run, on the same port and empty; the engines must ride it out. Implies `--engines 1`
    /// unless `--engines` is given.
    #[arg(long, value_name = "K", default_value_t = 0, allow_negative_numbers = true, value_parser = super::values::u32_in::<0, { MAX_RESTARTS as u64 }>)]
    pub redis_restarts: u32,
    /// Set by `--engines` for each engine it runs: its request ids start with `e{I}-`.
    #[arg(long, value_name = "I", hide = true, allow_negative_numbers = true, value_parser = clap::value_parser!(u8).range(0..MAX_ENGINES as i64))]
    pub engine_index: Option<u8>,
    /// Set by `--engines` for each engine it runs: how many it runs (a trace's requests are
    /// dealt over them, request `k` to engine `k mod N`).
    #[arg(long, value_name = "N", hide = true, allow_negative_numbers = true, value_parser = clap::value_parser!(u8).range(1..=MAX_ENGINES as i64))]
    pub engine_count: Option<u8>,
    /// Set by `--engines` for each engine it runs on the server it owns (`--store redis`):
    /// the `redis://` URL the engine gets is not a user's server, so store faults may act on
    /// it. Ignored without `--engine-index`.
    #[arg(long, hide = true)]
    pub store_owned: bool,
}

impl EnginesArgs {
    /// Whether this process is a parent running engines rather than an engine itself.
    pub fn runs_engines(&self) -> bool {
        self.engines.is_some() || self.redis_restarts > 0
    }

    /// The prefix of this engine's request ids: `e{i}-` for engine `i`, empty for a process
    /// run on its own.
    pub fn id_prefix(&self) -> String {
        self.engine_index
            .map_or_else(String::new, |i| format!("e{i}-"))
    }
}

/// The marker of a child's progress line on its stderr: `<marker> <share ended, 0 to 1>`.
const PROGRESS_MARKER: &str = "kvsched-engine-progress";

/// The progress sink of `kvsched stress`: the terminal bar, and for an engine run by
/// `--engines` (one with `--engine-index`) also a line per update on stderr that tells the
/// parent how far it is (see [`PROGRESS_MARKER`]).
pub fn progress_sink(cfg: &StressConfig) -> Box<dyn FnMut(&Progress)> {
    let mut bar = terminal_progress();
    if cfg.engines.engine_index.is_none() {
        return Box::new(bar);
    }
    let per_run = 1 + u32::from(matches!(cfg.baseline, Some(BaselineKind::Mutex)));
    let segments = f64::from(cfg.repeat.max(1) * per_run);
    let duration = cfg.duration_s;
    Box::new(move |p: &Progress| {
        bar(p);
        if p.nth.run == 0 {
            // A warm-up is not part of the measured runs the parent spreads restarts over.
            return;
        }
        let segment = (p.nth.run.saturating_sub(1)) * per_run + u32::from(p.scheduler != "kvsched");
        let within = share(p.ended, p.total).max(p.elapsed.as_secs_f64() / duration);
        let done = ((f64::from(segment) + within.clamp(0.0, 1.0)) / segments).clamp(0.0, 1.0);
        let _ = writeln!(std::io::stderr(), "{PROGRESS_MARKER} {done:.4}");
    })
}

/// `part / whole`, 0 for an empty whole.
fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Runs `kvsched stress` as a parent of engines (see the [module docs](self)): `cfg` is the
/// parsed command line, `argv` the process's arguments (the children get the same ones),
/// `json` and `plot` the report flags. Returns the exit code; `Err` is a one-line message
/// for exit code 2 (bad input, or a server that could not be started).
pub fn run_engines(
    cfg: &StressConfig,
    argv: impl IntoIterator<Item = OsString>,
    json: bool,
    plot: Option<&Path>,
) -> Result<ExitCode, String> {
    cfg.validate().map_err(|e| e.to_string())?;
    let stress_args = args::stress_args(argv);
    let plan = Plan::of(cfg, &stress_args)?;
    refuse_one_process_flags(cfg, plot.is_some())?;
    // A user's server that cannot be reached (a wrong password, nothing listening) is bad
    // input: one line, before any engine runs.
    super::store::check_user_store(cfg).map_err(|e| e.to_string())?;
    // On a trace, the reference of every request the engines replay together (each engine's
    // own report has that of its share); a bad trace is refused here, before any engine runs.
    let loaded = super::trace::load(cfg).map_err(|e| e.to_string())?;
    check_trace_covers_engines(&loaded, plan.engines)?;
    let trace_reference = loaded.trace.trace_reference;
    let interrupt = Interrupt::install();
    let mut server = OwnedServer::start(&plan)?;
    let store = match &server {
        Some(s) => Some(s.url()),
        None => plan.store_arg.clone(),
    };
    let info = combine::server_info(&plan, server.as_ref().map(OwnedServer::shape));
    if interrupt.raised() {
        // Caught while the server started (a cluster takes seconds): no engine runs yet.
        let _ = writeln!(
            std::io::stderr(),
            "error: interrupted: the server was stopped"
        );
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut children = Children::default();
    for i in 0..plan.engines {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(child_args(&stress_args, store.as_deref(), i));
        cmd.args(["--engine-count".to_owned(), plan.engines.to_string()]);
        if server.is_some() {
            cmd.arg("--store-owned");
        }
        children
            .spawn(i, cmd)
            .map_err(|e| format!("cannot start engine {i}: {e}"))?;
    }
    let expected = Duration::try_from_secs_f64(cfg.duration_s * f64::from(runs_per_child(cfg)))
        .unwrap_or(Duration::MAX);
    let limit = expected.saturating_add(CHILD_GRACE);
    let started = Instant::now();
    let mut restarts: Vec<RestartEvent> = Vec::new();
    while !children.all_ended() {
        if interrupt.raised() {
            // The children now; the server when `server` goes out of scope on return.
            children.kill_all();
            let _ = writeln!(
                std::io::stderr(),
                "error: interrupted: the engines and the server were stopped"
            );
            return Ok(ExitCode::from(EXIT_INTERRUPTED));
        }
        let due = restarts.len() < plan.restarts as usize
            && children.mean_progress()
                >= (restarts.len() + 1) as f64 / f64::from(plan.restarts + 1);
        if let (true, Some(s)) = (due, server.as_mut()) {
            let at_s = started.elapsed().as_secs_f64();
            let t = Instant::now();
            let node = s
                .restart(restarts.len())
                .map_err(|e| format!("--redis-restarts: restart {}: {e}", restarts.len() + 1))?;
            restarts.push(RestartEvent {
                at_s,
                node,
                down_ms: t.elapsed().as_secs_f64() * 1e3,
            });
        }
        children.kill_overdue(started, limit);
        std::thread::sleep(POLL);
    }
    let outcomes: Vec<EngineOutcome> = children.finish();
    let shown = match &store {
        Some(url) if plan.store == StoreSpec::Redis => url.clone(),
        _ => cfg.store.shown(),
    };
    let mut combined = Combined::of(&plan, &shown, info, outcomes, restarts);
    combined.trace_reference = trace_reference;
    let text = if json {
        combined.render_json()
    } else {
        combined.render_human()
    };
    if let Some(code) = crate::cli::emit(text.as_bytes()) {
        return Ok(code);
    }
    for v in &combined.violations {
        let _ = writeln!(std::io::stderr(), "invariant violated: {v}");
    }
    Ok(ExitCode::from(combined.exit_code))
}

/// The flags whose output lives in one process's report and not in the combined one
/// (`--plot`, `--baseline`, `--repeat` above 1): refused with `--engines` (or
/// `--redis-restarts`, which runs engines) in one line naming both flags, before anything
/// starts, rather than run and dropped from the report.
fn refuse_one_process_flags(cfg: &StressConfig, plot: bool) -> Result<(), String> {
    let parent = if cfg.engines.engines.is_some() {
        "--engines"
    } else {
        "--redis-restarts"
    };
    if plot {
        return Err(format!(
            "--plot: draws one process's run; leave it out with {parent}"
        ));
    }
    if cfg.baseline.is_some() {
        return Err(format!(
            "--baseline: the combined report of {parent} compares no baseline; leave it out \
             with {parent}"
        ));
    }
    if cfg.repeat > 1 {
        return Err(format!(
            "--repeat {}: the combined report of {parent} has one run per engine; leave it out \
             with {parent}",
            cfg.repeat
        ));
    }
    Ok(())
}

/// A trace replayed by `engines` engines deals request `k` to engine `k mod N`: with fewer
/// requests than engines an engine would have none to replay. `loaded` is the parent's
/// configuration with the trace loaded (all the requests that arrive within `--duration`);
/// the refusal is one line naming `--trace`, `--engines` and what cut the requests short.
fn check_trace_covers_engines(loaded: &StressConfig, engines: u8) -> Result<(), String> {
    let Some(reqs) = &loaded.trace.loaded else {
        return Ok(());
    };
    let replayed = reqs.len();
    if replayed >= usize::from(engines) {
        return Ok(());
    }
    let t = &loaded.trace;
    let why = match t.cut_by_duration {
        Some(cut) => format!(
            "of the first {}, those arriving within --duration {} s",
            cut.asked, loaded.duration_s
        ),
        None if (replayed as u64) == t.trace_requests => {
            format!("--trace-requests {}", t.trace_requests)
        }
        None => "all the file holds".to_owned(),
    };
    let noun = if replayed == 1 { "request" } else { "requests" };
    Err(format!(
        "--trace: {replayed} {noun} replayed ({why}), fewer than --engines {engines}: each \
         engine replays its share (request k on engine k mod {engines}) and needs one at least"
    ))
}

/// How many runs a child makes (`--repeat`, times 2 with a baseline, plus the baseline's
/// warm-up).
fn runs_per_child(cfg: &StressConfig) -> u32 {
    let mutex = u32::from(matches!(cfg.baseline, Some(BaselineKind::Mutex)));
    cfg.repeat.max(1) * (1 + mutex) + mutex
}
