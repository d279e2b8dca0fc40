//! The `kvsched` command line: thin front-ends over the library.
//!
//! * `kvsched replay FILE|-` — replay one scenario (`docs/replay.md`), print the outcome as
//!   JSON.
//! * `kvsched stress [FLAGS]` — drive the runtime with a simulated engine and print a report
//!   (exit 1 when an invariant was violated).
//!
//! Errors print `error: <one line>` on stderr and exit with code 2.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use crate::tools::replay::{load_scenario, render_outcome};
use crate::tools::stress::{
    render_human, render_json, render_svg, run_stress_with_progress, terminal_progress,
    StressConfig,
};
use clap::{Args, Parser, Subcommand};

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
    /// percentile plot to FILE (kvsched and the baseline overlaid, one line per run).
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
}

#[derive(Args)]
struct ReplayArgs {
    /// Scenario file (JSON), or `-` for standard input.
    #[arg(value_name = "FILE")]
    file: OsString,
    /// Also time the recovery (not the parsing) N times and print `recovery_ns_median=<ns>`
    /// on stderr.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    bench: Option<u64>,
    /// Which engine applies the rules: `sequential` (marked sets in canonical order) or
    /// `runtime` (the runtime's claim path: requests spread over shard threads, the real claim
    /// table). Both print the same outcome.
    #[arg(long, value_enum, default_value_t = Engine::Sequential)]
    engine: Engine,
    /// Shard threads for `--engine runtime` (1–64).
    #[arg(long, value_name = "K", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    shards: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Engine {
    Sequential,
    Runtime,
}

/// Exit code for bad input and usage errors.
const EXIT_BAD_INPUT: u8 = 2;

/// Parses the command line, runs the command and returns its exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help / --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(&clap_error_line(&e)),
    };
    let result = match cli.command {
        Command::Replay(args) => replay(&args).map(|()| ExitCode::SUCCESS),
        Command::Stress(args) => stress(&args),
    };
    match result {
        Ok(code) => code,
        Err(message) => fail(&message),
    }
}

/// Exit code when a stress run violated an invariant.
const EXIT_INVARIANT: u8 = 1;

fn stress(args: &StressArgs) -> Result<ExitCode, String> {
    // Before the run, so that a path that cannot be written costs no run.
    let plot = args
        .plot
        .as_ref()
        .map(|path| {
            std::fs::File::create(path)
                .map(|f| (path, f))
                .map_err(|e| format!("--plot: cannot create {}: {e}", path.display()))
        })
        .transpose()?;
    let mut progress = terminal_progress();
    let report =
        run_stress_with_progress(&args.config, &mut progress).map_err(|e| e.to_string())?;
    if let Some((path, mut file)) = plot {
        file.write_all(render_svg(&report).as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| format!("--plot: cannot write {}: {e}", path.display()))?;
    }
    let text = if args.json {
        render_json(&report)
    } else {
        render_human(&report)
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))?;
    if report.invariants_ok() {
        return Ok(ExitCode::SUCCESS);
    }
    for v in report.violations() {
        let _ = writeln!(std::io::stderr(), "invariant violated: {v}");
    }
    Ok(ExitCode::from(EXIT_INVARIANT))
}

fn replay(args: &ReplayArgs) -> Result<(), String> {
    let scenario = load_scenario(&args.file).map_err(|e| e.to_string())?;
    let outcome = match args.engine {
        Engine::Sequential => scenario.run(),
        Engine::Runtime => crate::tools::parallel::recover_sharded(
            &scenario.geometry,
            scenario.mode,
            scenario.policy,
            &scenario.requests,
            &scenario.invalid,
            args.shards as usize,
        ),
    };
    let text = render_outcome(&scenario, &outcome);
    if let Some(runs) = args.bench {
        let ns = scenario.bench_recovery_ns(runs);
        let _ = writeln!(std::io::stderr(), "recovery_ns_median={ns}");
    }
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))
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
