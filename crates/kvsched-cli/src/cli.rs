//! The `kvsched` command line: thin front-ends over the library.
//!
//! * `kvsched replay FILE|-` — replay one scenario (`docs/replay.md`), print the outcome as
//!   JSON.
//! * `kvsched stress [FLAGS]` — drive the runtime with a simulated engine and print a report
//!   (exit 1 when an invariant was violated).
//!
//! Errors print `error: <one line>` on stderr. Bad input and usage errors exit with code 2;
//! output that cannot be written (a closed stdout, a full disk, a file-size limit, a plot file
//! that stops taking bytes) exits with code 1, or quietly with 141 when the
//! reader went away (a broken pipe).

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use crate::plot_file::PlotFile;
use crate::replay::{
    load_scenario, render_explain_text, render_outcome, render_outcome_explained,
    DEFAULT_MAX_INPUT_BYTES, MAX_BENCH_RUNS,
};
use crate::stress::{
    apply_engine_defaults, follow_trace_duration, parse_u64_range, progress_sink, render_human,
    render_json, render_svg, run_engines, run_stress_with_progress, StressConfig,
};
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// Scheduler core for asynchronous KV-cache loads and their failure recovery.
#[derive(Parser)]
#[command(name = "kvsched", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay one scenario (JSON, format in docs/replay.md) and print the recovery outcome as
    /// JSON on stdout.
    Replay(ReplayArgs),
    /// Drive the runtime with a simulated engine and report throughput, latencies and the
    /// runtime's invariants (exit 1 if one was violated).
    Stress(Box<StressArgs>),
}

#[derive(Args)]
struct StressArgs {
    #[command(flatten)]
    config: StressConfig,
    /// Print the report as JSON (keys documented in README and docs/stress.md).
    #[arg(long)]
    json: bool,
    /// Also write the step-overhead and completion → runnable latency distributions as an SVG
    /// percentile plot to FILE (kvsched and the baseline overlaid, one line per run). Written
    /// when the run ends: a refused or failed run leaves an existing FILE as it was.
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
}

#[derive(Args)]
struct ReplayArgs {
    /// Scenario file (JSON), or `-` for standard input.
    #[arg(value_name = "FILE")]
    file: OsString,
    /// Also time the recovery (not the parsing) N times (1 to 1,000,000) and print
    /// `recovery_ns_median=<ns>` on stderr.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_bench)]
    bench: Option<u64>,
    /// Explain every decision: `--explain` (or `--explain=json`) adds an `explain` key to the
    /// outcome JSON; `--explain=text` prints the explanation as plain lines instead.
    #[arg(long, value_enum, value_name = "FORMAT", num_args = 0..=1, require_equals = true, default_missing_value = "json")]
    explain: Option<ExplainFormat>,
    /// Which engine applies the rules: `sequential` (marked sets in canonical order) or
    /// `runtime` (the runtime's claim path: requests spread over shard threads, the real claim
    /// table). Both print the same outcome.
    #[arg(long, value_enum, default_value_t = Engine::Sequential)]
    engine: Engine,
    /// Read at most N bytes of input (default 256 MiB, at most 4 GiB: the scenario is held in
    /// memory whole); a longer input is an error.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_INPUT_BYTES, allow_negative_numbers = true, value_parser = parse_max_input_bytes)]
    max_input_bytes: u64,
    /// Shard threads for `--engine runtime` (1–64).
    #[arg(long, value_name = "K", default_value_t = 2, allow_negative_numbers = true, value_parser = parse_replay_shards)]
    shards: u64,
}

// Replay's integer flags read a leading `-` as a value, as stress's do: `--bench -1` is
// refused naming `--bench` and its range, not as an unknown flag `-1`.
fn parse_bench(s: &str) -> Result<u64, String> {
    parse_u64_range(s, 1, MAX_BENCH_RUNS)
}
fn parse_max_input_bytes(s: &str) -> Result<u64, String> {
    parse_u64_range(s, 1, 4 << 30)
}
fn parse_replay_shards(s: &str) -> Result<u64, String> {
    parse_u64_range(s, 1, 64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ExplainFormat {
    Json,
    Text,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Engine {
    Sequential,
    Runtime,
}

/// The synthetic workload's flags a trace replay does not use: (clap id, flag).
const TRACE_UNUSED: [(&str, &str); 9] = [
    ("requests", "--requests"),
    ("rate", "--rate"),
    ("live", "--live"),
    ("prompt_tokens", "--prompt-tokens"),
    ("output_tokens", "--output-tokens"),
    ("prefix_share", "--prefix-share"),
    ("prefix_burst", "--prefix-burst"),
    ("prefixes", "--prefixes"),
    ("hit_ratio", "--hit-ratio"),
];

/// The flags typed where nothing reads them, each refused rather than dropped without a
/// word: a trace's flags without `--trace`, `--store-capacity` with a Redis store (the
/// server's memory is its own), and `--engine-index`, which `--engines` sets for each engine
/// it runs (always with `--json`), typed by hand.
fn unused_flags(args: &StressArgs, given: &dyn Fn(&str) -> bool) -> Option<String> {
    let c = &args.config;
    if c.trace.trace.is_none() {
        let unused = [
            ("trace_speed", "--trace-speed"),
            ("trace_requests", "--trace-requests"),
        ];
        if let Some((_, flag)) = unused.iter().find(|(id, _)| given(id)) {
            return Some(format!(
                "{flag}: unused without --trace (it sets how a trace replays)"
            ));
        }
    }
    if given("store_capacity") && c.store.is_redis() {
        return Some(format!(
            "--store-capacity: sizes a sim, memory or disk store; --store {} holds what the Redis server's memory allows (--redis-maxmemory for the one kvsched starts)",
            c.store.shown()
        ));
    }
    if c.engines.engine_index.is_some() && !args.json {
        return Some(
            "--engine-index: set by --engines for each engine it runs; leave it out".to_owned(),
        );
    }
    None
}

/// Exit code for bad input and usage errors.
const EXIT_BAD_INPUT: u8 = 2;

/// Parses the command line, runs the command and returns its exit code.
pub fn main() -> ExitCode {
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) if !e.use_stderr() => {
            // --help / --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(&clap_error_line(&e)),
    };
    let result = match cli.command {
        Command::Replay(args) => return replay(&args),
        Command::Stress(mut args) => {
            // `--engine model` sizes the flags left out for its own workload.
            let sub = matches.subcommand_matches("stress");
            let given = |id: &str| {
                sub.and_then(|m| m.value_source(id))
                    .is_some_and(|s| s != ValueSource::DefaultValue)
            };
            apply_engine_defaults(&mut args.config, &given);
            // `--failure-rate` damages the sim store's chunks in transfer; a real store runs
            // without it (its faults are `--faults`), so a rate typed for one is refused.
            if given("failure_rate")
                && args.config.failure_rate > 0.0
                && args.config.store.is_real()
            {
                return fail(&format!(
                    "--failure-rate: damages chunks of the sim store only; with --store {} \
                     damage them with --faults corrupt=R",
                    args.config.store.shown()
                ));
            }
            // `--hit-ratio` warms the sim store; a real store holds what runs saved, so a
            // ratio typed for one would be dropped: refused the same way.
            if given("hit_ratio") && args.config.hit_ratio > 0.0 && args.config.store.is_real() {
                return fail(&format!(
                    "--hit-ratio: warms the sim store only; --store {} holds what runs saved \
                     (leave --hit-ratio out, or use --store sim)",
                    args.config.store.shown()
                ));
            }
            // A trace says its requests' arrivals, prompts and lengths: a flag of the synthetic
            // workload typed with it would be dropped without a word, so it is refused.
            if args.config.trace.trace.is_some() {
                if let Some((_, flag)) = TRACE_UNUSED.iter().find(|(id, _)| given(id)) {
                    return fail(&format!(
                        "{flag}: unused with --trace (the trace gives its requests; --trace-requests N replays its first N)"
                    ));
                }
            }
            if let Some(message) = unused_flags(&args, &given) {
                return fail(&message);
            }
            match follow_trace_duration(&mut args.config, given("duration_s")) {
                Ok(()) => stress(&args),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    match result {
        Ok(code) => code,
        Err(message) => fail(&message),
    }
}

/// Exit code when the output could not be written (stdout closed, a full disk, …).
const EXIT_OUTPUT: u8 = 1;
/// Exit code, without a message, when the reader of stdout went away (a broken pipe): the
/// status a shell shows for a process killed by SIGPIPE.
const EXIT_BROKEN_PIPE: u8 = 141;

/// Exit code when a stress run violated an invariant.
const EXIT_INVARIANT: u8 = 1;

fn stress(args: &StressArgs) -> Result<ExitCode, String> {
    if args.config.engines.runs_engines() {
        return run_engines(
            &args.config,
            std::env::args_os(),
            args.json,
            args.plot.as_deref(),
        );
    }
    // Before the run, so that an output that cannot be written costs no run.
    if stdout_was_closed() {
        let _ = writeln!(
            std::io::stderr(),
            "error: stdout: closed (the report would be lost)"
        );
        return Ok(ExitCode::from(EXIT_OUTPUT));
    }
    // Checked before the run (a FIFO, a directory, the --trace file, no room for a file
    // there), so that a plot that cannot be written costs no run; written after it, and only
    // then put in place of an existing file (`plot_file`).
    let plot = args
        .plot
        .as_deref()
        .map(|path| PlotFile::prepare(path, args.config.trace.trace.as_deref()))
        .transpose()?;
    let mut progress = progress_sink(&args.config);
    let report =
        run_stress_with_progress(&args.config, &mut progress).map_err(|e| e.to_string())?;
    if let Some(plot) = plot {
        // Its file was created before the run: failing to write it now is the disk's doing
        // (exit 1), not the input's.
        let path = plot.path().display().to_string();
        if let Err(e) = plot.commit(&render_svg(&report)) {
            let _ = writeln!(std::io::stderr(), "error: --plot: cannot write {path}: {e}");
            return Ok(ExitCode::from(EXIT_OUTPUT));
        }
    }
    let text = if args.json {
        render_json(&report)
    } else {
        render_human(&report)
    };
    if let Some(code) = emit(text.as_bytes()) {
        return Ok(code);
    }
    if report.invariants_ok() {
        return Ok(ExitCode::SUCCESS);
    }
    for v in report.violations() {
        let _ = writeln!(std::io::stderr(), "invariant violated: {v}");
    }
    Ok(ExitCode::from(EXIT_INVARIANT))
}

fn replay(args: &ReplayArgs) -> ExitCode {
    let scenario = match load_scenario(&args.file, args.max_input_bytes) {
        Ok(s) => s,
        Err(e) => return fail(&e.to_string()),
    };
    let text = match (args.explain, args.engine) {
        (Some(_), Engine::Runtime) => {
            return fail("--explain explains the sequential engine; leave out --engine runtime")
        }
        (Some(format), Engine::Sequential) => {
            let (outcome, traces) = scenario.run_explained();
            match format {
                ExplainFormat::Json => render_outcome_explained(&scenario, &outcome, &traces),
                ExplainFormat::Text => render_explain_text(&scenario, &outcome, &traces),
            }
        }
        (None, engine) => {
            let outcome = match engine {
                Engine::Sequential => scenario.run(),
                Engine::Runtime => crate::parallel::recover_sharded(
                    &scenario.geometry,
                    scenario.mode,
                    scenario.policy,
                    &scenario.requests,
                    &scenario.invalid,
                    args.shards as usize,
                ),
            };
            render_outcome(&scenario, &outcome)
        }
    };
    if let Some(runs) = args.bench {
        let ns = scenario.bench_recovery_ns(runs);
        let _ = writeln!(std::io::stderr(), "recovery_ns_median={ns}");
    }
    drop(scenario);
    emit(text.as_bytes()).unwrap_or(ExitCode::SUCCESS)
}

/// Writes a command's output: `None` once written, else the exit code to end with — quietly
/// 141 for a reader gone away (a broken pipe), else 1 after one line saying why (a closed
/// stdout, a full disk).
pub(crate) fn emit(bytes: &[u8]) -> Option<ExitCode> {
    match write_stdout(bytes) {
        Ok(()) => None,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            Some(ExitCode::from(EXIT_BROKEN_PIPE))
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: stdout: {e}");
            Some(ExitCode::from(EXIT_OUTPUT))
        }
    }
}

/// Writes `bytes` to standard output and flushes it. A closed stdout is an error: Rust's
/// runtime reopens a closed standard descriptor on `/dev/null` before `main`, where writes
/// would vanish, so that case is recognised (on Linux: stdout is `/dev/null` opened for
/// reading and writing, which a shell's `> /dev/null` never does).
fn write_stdout(bytes: &[u8]) -> std::io::Result<()> {
    if stdout_was_closed() {
        return Err(std::io::Error::other("closed (the output would be lost)"));
    }
    let mut out = std::io::stdout().lock();
    out.write_all(bytes).and_then(|()| out.flush())
}

#[cfg(target_os = "linux")]
fn stdout_was_closed() -> bool {
    let is_null =
        std::fs::read_link("/proc/self/fd/1").is_ok_and(|p| p == std::path::Path::new("/dev/null"));
    is_null
        && std::fs::read_to_string("/proc/self/fdinfo/1").is_ok_and(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                .is_some_and(|flags| flags & 0o3 == 0o2) // O_RDWR
        })
}

#[cfg(not(target_os = "linux"))]
fn stdout_was_closed() -> bool {
    false
}

/// Prints `error: <message>` (forced onto one line) and returns exit code 2.
fn fail(message: &str) -> ExitCode {
    let line: String = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let _ = writeln!(std::io::stderr(), "error: {line}");
    ExitCode::from(EXIT_BAD_INPUT)
}

/// clap's message without its usage and tips: the first paragraph, on one line.
fn clap_error_line(e: &clap::Error) -> String {
    if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        return "a subcommand is required (try `kvsched --help`)".to_owned();
    }
    let text = e.render().to_string();
    let text = text.trim_start();
    let text = text.strip_prefix("error:").unwrap_or(text);
    text.split("\n\n").next().unwrap_or("").to_owned()
}
