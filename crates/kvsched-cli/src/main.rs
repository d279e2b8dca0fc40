//! The `kvsched` command line (`kvsched replay`, `kvsched stress`); see `kvsched --help`.

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    kvsched::cli_main()
}
