//! The `kvsched` command line: `kvsched replay` (one recovery scenario through the rules and
//! the runtime's claim path), `kvsched stress` (the runtime under a simulated workload, against
//! the mutex baseline it compares with); see `kvsched --help`. Built on the library's API and,
//! for the baseline and the claim path, on its `internals` feature.

mod baseline;
mod cli;
mod parallel;
mod replay;
mod stress;

#[cfg(test)]
mod tests;

use std::process::ExitCode;

#[cfg(not(kvsched_loom))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cli::main()
}
