//! The scheduler's own cost, apart from the simulated engine's: each step's `update()` and
//! `schedule()` timed on two clocks — wall time (step overhead) and the engine thread's own
//! CPU time (`CLOCK_THREAD_CPUTIME_ID`) — and the run's CPU split into the scheduler's calls,
//! the simulated engine around them, and the other threads.
//!
//! On a machine whose cores the simulator's threads (load workers, the write-behind, the
//! store) share with the scheduler, wall time counts every moment the engine thread waited
//! for a core or for a shard thread; its CPU time counts only the instructions it ran. The
//! gap between the two is contention, not scheduling work.

use std::time::{Duration, Instant};

use hdrhistogram::sync::Recorder;
use serde::{Deserialize, Serialize};

use super::cpu::CpuReport;
use super::histograms::ns;

/// The calling thread's CPU time, ns (`CLOCK_THREAD_CPUTIME_ID`), or `None` where it is
/// unavailable.
pub(super) fn thread_cpu_ns() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: `timespec` is a plain C struct of integers, for which all zeroes is valid.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: `ts` is a valid, writable `timespec`; clock_gettime writes only into it.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
            return None;
        }
        let s = u64::try_from(ts.tv_sec).ok()?;
        let n = u64::try_from(ts.tv_nsec).ok()?;
        Some(s.saturating_mul(1_000_000_000).saturating_add(n))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Times the scheduler's calls of each step on both clocks and keeps the run's totals.
#[derive(Default)]
pub(super) struct StepTimer {
    /// This step's wall time so far.
    wall: Duration,
    /// This step's engine-thread CPU so far, ns (`None` without the clock).
    cpu_ns: Option<u64>,
    /// The run's sums over every step.
    total_wall: Duration,
    total_cpu_ns: Option<u64>,
}

impl StepTimer {
    /// Runs `f`, one of the scheduler's calls, adding its wall and CPU time to the step's.
    /// Both clocks cover the same interval: the wall clock is read outside the CPU clock's
    /// reads, so the wall holds every instant the CPU figure can count (the two CPU clock
    /// reads' own cost included, about half a microsecond) and CPU ≤ wall for every call.
    pub(super) fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let c0 = thread_cpu_ns();
        let r = f();
        let c1 = thread_cpu_ns();
        self.wall += t0.elapsed();
        if let (Some(a), Some(b)) = (c0, c1) {
            self.cpu_ns = Some(self.cpu_ns.unwrap_or(0) + b.saturating_sub(a));
        }
        r
    }

    /// Ends the step: records its wall time in `wall` and its CPU time in `cpu` (ns), adds
    /// both to the run's totals and starts the next step from zero.
    pub(super) fn end_step(&mut self, wall: &mut Recorder<u64>, cpu: &mut Recorder<u64>) {
        wall.saturating_record(ns(self.wall));
        self.total_wall += self.wall;
        if let Some(c) = self.cpu_ns.take() {
            cpu.saturating_record(c.max(1));
            self.total_cpu_ns = Some(self.total_cpu_ns.unwrap_or(0) + c);
        }
        self.wall = Duration::ZERO;
    }

    /// The run's cost split, from the totals and the run's CPU report.
    pub(super) fn cost(&self, cpu: Option<&CpuReport>, finished: u64) -> StepCost {
        StepCost::of(
            self.total_wall.as_secs_f64(),
            self.total_cpu_ns.map(|n| n as f64 / 1e9),
            cpu,
            finished,
        )
    }
}

/// Where a run's time went (JSON `cost`): the scheduler's calls on both clocks, the simulated
/// engine's CPU on the engine thread around them, and every other thread's CPU.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StepCost {
    /// Wall time of every `schedule()` + `update()`, seconds (the sum of step overhead).
    pub step_wall_s: f64,
    /// Engine-thread CPU time of those calls, seconds: the scheduler's own work on the
    /// engine thread (`null` without a thread CPU clock).
    pub step_cpu_s: Option<f64>,
    /// `step_cpu_s` per finished request, µs.
    pub step_cpu_us_per_finished: Option<f64>,
    /// Engine-thread CPU outside those calls, seconds: the simulated engine — warming the
    /// store, checking and writing KV bytes, sync loads, the model's spin — and the loop.
    pub engine_cpu_s: Option<f64>,
    /// CPU of every other thread, seconds: load workers, the write-behind, the store, and
    /// the runtime's shard threads.
    pub other_threads_cpu_s: Option<f64>,
}

impl StepCost {
    fn of(wall_s: f64, step_cpu_s: Option<f64>, cpu: Option<&CpuReport>, finished: u64) -> Self {
        let round = |x: f64| (x * 1e4).round() / 1e4;
        let engine_thread = cpu.and_then(|c| c.engine_thread_s);
        let process = cpu.map(|c| c.user_s + c.sys_s);
        StepCost {
            step_wall_s: round(wall_s),
            step_cpu_s: step_cpu_s.map(round),
            step_cpu_us_per_finished: step_cpu_s
                .filter(|_| finished > 0)
                .map(|s| (s * 1e7 / finished as f64).round() / 10.0),
            engine_cpu_s: engine_thread
                .zip(step_cpu_s)
                .map(|(t, s)| round((t - s).max(0.0))),
            other_threads_cpu_s: process
                .zip(engine_thread)
                .map(|(p, t)| round((p - t).max(0.0))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_call_is_counted_on_both_clocks() {
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("histogram")
            .into_sync();
        let mut h2 = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("histogram")
            .into_sync();
        let (mut wall, mut cpu) = (h.recorder(), h2.recorder());
        let mut t = StepTimer::default();
        let spun = t.time(|| {
            let start = Instant::now();
            let mut x = 0u64;
            while start.elapsed() < Duration::from_millis(20) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            x
        });
        assert!(spun > 0);
        t.end_step(&mut wall, &mut cpu);
        // A sleep costs wall time and (almost) no CPU.
        t.time(|| std::thread::sleep(Duration::from_millis(20)));
        t.end_step(&mut wall, &mut cpu);
        drop((wall, cpu));
        h.refresh();
        h2.refresh();
        assert_eq!(h.len(), 2);
        assert!(
            t.total_wall >= Duration::from_millis(40),
            "{:?}",
            t.total_wall
        );
        #[cfg(target_os = "linux")]
        {
            assert_eq!(h2.len(), 2);
            let cpu_s = t.total_cpu_ns.expect("thread clock") as f64 / 1e9;
            // The spin ran for 20 ms of wall; on a shared machine it got some of it.
            assert!(cpu_s > 0.002, "{cpu_s}");
            assert!(cpu_s < t.total_wall.as_secs_f64() - 0.015, "{cpu_s}");
            let report = CpuReport {
                user_s: 1.0,
                sys_s: 0.5,
                per_wall_s: 0.0,
                us_per_finished: None,
                engine_thread_s: Some(1.0),
            };
            let c = t.cost(Some(&report), 10);
            assert_eq!(c.other_threads_cpu_s, Some(0.5));
            assert!(c.engine_cpu_s.is_some_and(|e| e < 1.0), "{c:?}");
            assert!(c.step_cpu_us_per_finished.is_some_and(|u| u > 0.0), "{c:?}");
        }
    }

    /// Both clocks time the same interval: over many short calls (where the CPU clock's
    /// own cost is most of the call) the CPU time never exceeds the wall time.
    #[cfg(target_os = "linux")]
    #[test]
    fn short_calls_take_no_more_cpu_than_wall() {
        let mut t = StepTimer::default();
        let mut wall_ns = 0u128;
        let mut cpu_ns = 0u64;
        for _ in 0..20_000 {
            t.time(|| std::hint::black_box(1u64));
            wall_ns += t.wall.as_nanos();
            cpu_ns += t.cpu_ns.take().expect("thread clock");
            t.wall = Duration::ZERO;
        }
        assert!(
            u128::from(cpu_ns) <= wall_ns,
            "cpu {cpu_ns} ns > wall {wall_ns} ns"
        );
    }
}
