//! Writes the recovery benchmark's scenario as `kvsched replay` input (JSON, docs/replay.md) to stdout.
//!
//! ```text
//! cargo run --release --example gen_scenario -- [--mode vllm|safe] [--policy recompute|fail]
//!     [--variant reference|hybrid] [--invalid-percent N] [--seed N] > scenario.json
//! kvsched replay scenario.json
//! ```
//! Defaults: mode `safe`, policy `recompute`, the reference scenario (1,000 sync requests ×
//! 1,000 blocks of one full-attention group of 16, 25 % sharing a 500-block prefix, 1 % with
//! an invalid block).

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use kvsched::rules::recovery::{Mode, Policy};

#[path = "../benches/common/mod.rs"]
mod common;

fn usage(msg: &str) -> ExitCode {
    eprintln!("gen_scenario: {msg}");
    eprintln!(
        "usage: gen_scenario [--mode vllm|safe] [--policy recompute|fail] \
         [--variant reference|hybrid] [--invalid-percent N] [--seed N]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut mode = Mode::Safe;
    let mut policy = Policy::Recompute;
    let mut params = common::ScenarioParams::reference();
    let mut invalid_percent = None;
    let mut seed = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let Some(value) = args.next() else {
            return usage(&format!("{flag} needs a value"));
        };
        match (flag.as_str(), value.as_str()) {
            ("--mode", "vllm") => mode = Mode::Vllm,
            ("--mode", "safe") => mode = Mode::Safe,
            ("--policy", "recompute") => policy = Policy::Recompute,
            ("--policy", "fail") => policy = Policy::Fail,
            ("--variant", "reference") => params = common::ScenarioParams::reference(),
            ("--variant", "hybrid") => params = common::ScenarioParams::hybrid(),
            ("--invalid-percent", v) => match v.parse::<u32>() {
                Ok(p) if p <= 100 => invalid_percent = Some(p),
                _ => return usage(&format!("--invalid-percent: {v:?} is not 0..=100")),
            },
            ("--seed", v) => match v.parse::<u64>() {
                Ok(s) => seed = Some(s),
                Err(_) => return usage(&format!("--seed: {v:?} is not a number")),
            },
            (f, v) => return usage(&format!("unknown option or value: {f} {v}")),
        }
    }
    if let Some(p) = invalid_percent {
        params.invalid_percent = p;
    }
    if let Some(s) = seed {
        params.seed = s;
    }
    let scenario = common::generate(&params);
    let mut out = BufWriter::new(io::stdout().lock());
    match scenario
        .write_json(mode, policy, &mut out)
        .and_then(|()| out.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen_scenario: {e}");
            ExitCode::FAILURE
        }
    }
}
