//! Child processes that must not outlive their parent: the local Redis servers of
//! `redis` (feature `redis`) and the engine processes of `kvsched stress --processes`.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Sets `PR_SET_PDEATHSIG(SIGKILL)` in the child of `cmd`: it is killed when the thread that
/// spawned it ends (spawn from the main thread, and that is: when the parent ends). Spawning
/// fails with `ESRCH` if the parent died between fork and exec.
pub fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed: `prctl` and `getppid` are system calls, and the error is built from
    // a raw errno without allocating. It touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then no signal would come.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}
