//! CPU time around a run: the process's user and system time from `getrusage(RUSAGE_SELF)`,
//! and the engine thread's own from `getrusage(RUSAGE_THREAD)` (Linux), both read before and
//! after the run and reported per wall-second and per finished request.

use serde::{Deserialize, Serialize};

/// User and system CPU time consumed so far, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct CpuTime {
    user_s: f64,
    sys_s: f64,
}

impl CpuTime {
    /// The whole process's CPU time so far (every thread, those ended included), or `None`
    /// where `getrusage` is unavailable.
    pub(super) fn process() -> Option<CpuTime> {
        #[cfg(unix)]
        {
            rusage(libc::RUSAGE_SELF)
        }
        #[cfg(not(unix))]
        {
            None
        }
    }

    /// The calling thread's CPU time so far (Linux only).
    pub(super) fn thread() -> Option<CpuTime> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            rusage(libc::RUSAGE_THREAD)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            None
        }
    }

    /// The time consumed between `earlier` and `self` (never negative).
    pub(super) fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user_s: (self.user_s - earlier.user_s).max(0.0),
            sys_s: (self.sys_s - earlier.sys_s).max(0.0),
        }
    }

    fn total_s(self) -> f64 {
        self.user_s + self.sys_s
    }
}

#[cfg(unix)]
fn rusage(who: libc::c_int) -> Option<CpuTime> {
    // SAFETY: `rusage` is a plain C struct of integers, for which all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage`; getrusage writes only into it and `who` is
    // one of the constants it accepts.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return None;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(CpuTime {
        user_s: secs(ru.ru_utime),
        sys_s: secs(ru.ru_stime),
    })
}

/// CPU over one run (JSON `cpu`): the whole process — the simulated engine, the scheduler's
/// shard and worker threads — from the first step to the end of the run (shutdown excluded,
/// like `elapsed_s`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuReport {
    /// User CPU seconds.
    pub user_s: f64,
    /// System CPU seconds.
    pub sys_s: f64,
    /// (user + sys) ÷ run time: CPU-seconds per wall-second (2.0 = two cores busy).
    pub per_wall_s: f64,
    /// (user + sys) ÷ finished requests, µs (`null` when none finished).
    pub us_per_finished: Option<f64>,
    /// The engine thread's own user + sys CPU seconds (the simulated engine, its model wait
    /// and the scheduler's calls on that thread; `null` where unavailable).
    pub engine_thread_s: Option<f64>,
}

impl CpuReport {
    /// The report of a run that used `process` (and `engine` on the engine thread) over
    /// `elapsed_s` seconds and finished `finished` requests.
    pub(super) fn of(
        process: CpuTime,
        engine: Option<CpuTime>,
        elapsed_s: f64,
        finished: u64,
    ) -> Self {
        let total = process.total_s();
        let round = |x: f64, digits: i32| {
            let f = 10f64.powi(digits);
            (x * f).round() / f
        };
        CpuReport {
            user_s: round(process.user_s, 4),
            sys_s: round(process.sys_s, 4),
            per_wall_s: round(total / elapsed_s.max(1e-9), 3),
            us_per_finished: (finished > 0).then(|| round(total * 1e6 / finished as f64, 1)),
            engine_thread_s: engine.map(|e| round(e.total_s(), 4)),
        }
    }
}

/// Both clocks, read at the start of a run.
#[derive(Clone, Copy, Debug)]
pub(super) struct CpuStart {
    process: Option<CpuTime>,
    thread: Option<CpuTime>,
}

impl CpuStart {
    /// Reads both clocks (on the engine thread).
    pub(super) fn now() -> Self {
        CpuStart {
            process: CpuTime::process(),
            thread: CpuTime::thread(),
        }
    }

    /// The CPU since `self` (read again on the same thread), or `None` without getrusage.
    pub(super) fn report(self, elapsed_s: f64, finished: u64) -> Option<CpuReport> {
        let process = CpuTime::process()?.since(self.process?);
        let thread = self.thread.and_then(|t| Some(CpuTime::thread()?.since(t)));
        Some(CpuReport::of(process, thread, elapsed_s, finished))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_loop_is_counted() {
        // Spin until the clocks move (they tick coarsely on some kernels), at most 10 s.
        let start = CpuStart::now();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        let r = loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let r = start
                .report(t.elapsed().as_secs_f64(), 3)
                .expect("getrusage");
            if r.user_s + r.sys_s > 0.0 || t.elapsed() > std::time::Duration::from_secs(10) {
                break r;
            }
        };
        assert!(r.user_s + r.sys_s > 0.0, "{r:?}");
        assert!(r.per_wall_s > 0.0, "{r:?}");
        assert!(r.us_per_finished.is_some_and(|u| u > 0.0), "{r:?}");
        #[cfg(target_os = "linux")]
        assert!(r.engine_thread_s.is_some(), "{r:?}");
        let none = CpuReport::of(CpuTime::default(), None, 1.0, 0);
        assert_eq!(none.us_per_finished, None);
        assert_eq!(none.per_wall_s, 0.0);
    }
}
