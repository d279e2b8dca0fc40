//! The `kvsched` command line: `kvsched replay` (one recovery scenario through the rules and
//! the runtime's claim path), `kvsched stress` (the runtime under a simulated workload, against
//! the mutex baseline it compares with); see `kvsched --help`. Built on the library's API and,
//! for the baseline and the claim path, on its `internals` feature.

mod baseline;
mod cli;
mod parallel;
mod plot_file;
mod replay;
mod stress;

#[cfg(test)]
mod tests;

use std::process::ExitCode;

#[cfg(not(kvsched_loom))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    ignore_file_size_signal();
    cli::main()
}

/// Under a file-size limit (`ulimit -f`) the first write past it would kill the process with
/// `SIGXFSZ` — no message, the output cut short, a disk store's pack left half-written.
/// Ignored, such a write fails with `EFBIG` and takes the path of any failed write: the report
/// or outcome that cannot be written is one `error:` line and exit 1, a disk store's save
/// fails (counted) and its temporary file is removed. The program's call, made here before
/// any thread starts: the library never changes a signal's disposition. Ignoring is inherited
/// by the processes it starts (`--engines`' children, a private `redis-server`).
fn ignore_file_size_signal() {
    #[cfg(unix)]
    // SAFETY: sets the disposition of one signal to "ignore"; no handler, no pointer.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}
