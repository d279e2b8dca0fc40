//! The simulated engine: the loop of steps that drives a [`Scheduler`] through the workload —
//! arrivals, due cancels, one step, the simulated model with the plan's synchronous loads and
//! samples, the engine-side faults on its output, periodic checks and progress — and the end
//! of the run (final checks, shutdown, reconciliation and the run's report).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};

use super::checks::{check_plan, reconcile, EngineCounts, MAX_VIOLATIONS};
use super::config::{StressConfig, StressError};
use super::faults::{draw_for, FaultConnector, Faults};
use super::histograms::{ns, Hists, Recorders};
use super::progress::Progress;
use super::report::{Events, FaultCounts, Invariants, LoadCounts, RequestCounts, RunReport};
use super::scheduler::Scheduler;
use super::workload::Workload;
use crate::connector::{LoadJob, LoadResult, SplitMix64};
use crate::pool::BlockRef;
use crate::runtime::{EndState, Metrics, Report, StepOutput, StepPlan};

/// Drives `sched` through the workload of `cfg`.
pub(super) fn drive<S: Scheduler>(
    sched: S,
    name: &'static str,
    cfg: &StressConfig,
    conn: &FaultConnector,
    progress: &mut dyn FnMut(&Progress),
) -> Result<RunReport, StressError> {
    let mut hists = Hists::new()?;
    let mut engine = Engine::new(sched, name, cfg, conn, hists.recorders());
    let timed_out = engine.run(progress);
    // Consumes the engine, its recorders with it, before the histograms are read.
    let end = engine.finish(progress);
    Ok(end.run_report(name, timed_out, &mut hists))
}

/// Waits `d` (the simulated model): sleeps most of it, spins the rest for precision.
fn simulate_model(d: Duration) {
    if d.is_zero() {
        return;
    }
    let end = Instant::now() + d;
    let slack = Duration::from_micros(80);
    if d > slack {
        std::thread::sleep(d - slack);
    }
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// The simulated engine driving one scheduler.
struct Engine<'a, S> {
    sched: S,
    name: &'static str,
    cfg: &'a StressConfig,
    conn: &'a FaultConnector,
    faults: Faults,
    injected: FaultCounts,
    /// The engine's fault stream: two draws per step (duplicate, stale) and one per stale block.
    frng: SplitMix64,
    late_done: FxHashSet<Arc<str>>,
    last_sync_block: Option<BlockRef>,
    /// Samples sent per live request, and its max_new_tokens: a request that finishes having
    /// been sent fewer samples than that had one applied twice.
    samples_sent: FxHashMap<Arc<str>, (u32, u32)>,
    rec: Recorders,
    work: Workload,
    model: Duration,
    duration: Duration,
    violations: Vec<String>,
    /// The output of the last step, given to the scheduler at the next.
    out: StepOutput,
    /// Scheduled arrival of each request not scheduled yet.
    arrival_of: FxHashMap<Arc<str>, Instant>,
    /// Step → requests to cancel then (`true`: a `cancel` fault).
    cancels: BTreeMap<u64, Vec<(String, bool)>>,
    /// The next request to submit.
    next: u64,
    submitted: u64,
    ended: u64,
    rejected: u64,
    sync_run: u64,
    steps: u64,
    /// Arrival offset of request `next` (open loop).
    next_at: Option<Duration>,
    last_progress: Instant,
    start: Instant,
}

impl<'a, S: Scheduler> Engine<'a, S> {
    fn new(
        sched: S,
        name: &'static str,
        cfg: &'a StressConfig,
        conn: &'a FaultConnector,
        rec: Recorders,
    ) -> Self {
        let mut work = Workload::new(cfg);
        let next_at = work.next_arrival();
        Engine {
            sched,
            name,
            cfg,
            conn,
            faults: cfg.fault_rates(),
            injected: FaultCounts::default(),
            frng: SplitMix64::new(cfg.seed ^ 0xE561_FA17),
            late_done: FxHashSet::default(),
            last_sync_block: None,
            samples_sent: FxHashMap::default(),
            rec,
            work,
            model: Duration::from_micros(cfg.model_us),
            duration: cfg.duration(),
            violations: Vec::new(),
            out: StepOutput::default(),
            arrival_of: FxHashMap::default(),
            cancels: BTreeMap::new(),
            next: 0,
            submitted: 0,
            ended: 0,
            rejected: 0,
            sync_run: 0,
            steps: 0,
            next_at,
            last_progress: Instant::now(),
            start: Instant::now(),
        }
    }

    /// Runs steps until every request has ended or `--duration` has passed; returns whether
    /// the duration ended it with requests left.
    fn run(&mut self, progress: &mut dyn FnMut(&Progress)) -> bool {
        loop {
            let now = Instant::now();
            if now.duration_since(self.start) >= self.duration {
                return self.next < self.cfg.requests || self.submitted > self.ended;
            }
            self.arrivals(now);
            if self.next >= self.cfg.requests && self.submitted == self.ended {
                return false;
            }
            self.cancel_due();
            let plan = self.step();
            self.cancel_late();
            self.ended += plan.ended.len() as u64;
            if self.violations.len() < MAX_VIOLATIONS {
                check_plan(self.cfg.mode, &plan, &mut self.violations);
            }
            self.run_model(&plan);
            if self.cfg.faults.is_some() {
                self.damage_output();
            }
            if plan.scheduled.is_empty() && plan.ended.is_empty() {
                self.idle();
            }
            self.periodic_check();
            self.report_progress(progress);
        }
    }

    /// Submits the requests whose arrival time has come (open loop), or up to `--live` live
    /// requests (closed loop).
    fn arrivals(&mut self, now: Instant) {
        // Offsets, not instants: an offset that saturated (a tiny --rate) is never reached,
        // and `start + offset` is only formed for offsets already passed.
        let elapsed = now.saturating_duration_since(self.start);
        while self.next < self.cfg.requests {
            let arrival = match self.next_at {
                Some(at) if at > elapsed => break,
                Some(at) => self.start + at,
                None if self.submitted - self.ended >= self.cfg.live as u64 => break,
                None => Instant::now(),
            };
            self.submit_next(arrival);
            self.next += 1;
            self.next_at = self.work.next_arrival();
        }
    }

    /// Submits request `next`, arrived at `arrival`, and books its cancels.
    fn submit_next(&mut self, arrival: Instant) {
        let g = self.work.request(self.next);
        let id: Arc<str> = g.req.id.as_str().into();
        let max_new_tokens = g.req.max_new_tokens;
        match self.sched.submit(g.req) {
            Ok(()) => {
                self.submitted += 1;
                self.arrival_of.insert(id.clone(), arrival);
                self.samples_sent.insert(id.clone(), (0, max_new_tokens));
                if let Some(after) = g.cancel_after {
                    self.cancels
                        .entry(self.steps + after)
                        .or_default()
                        .push((id.to_string(), false));
                }
                if let Some(after) = g.fault_cancel_after {
                    self.cancels
                        .entry(self.steps + after)
                        .or_default()
                        .push((id.to_string(), true));
                }
            }
            Err(e) => {
                self.rejected += 1;
                if self.violations.len() < MAX_VIOLATIONS {
                    self.violations.push(format!("submit refused: {e}"));
                }
            }
        }
    }

    /// Issues the client cancels and `cancel` faults due by this step.
    fn cancel_due(&mut self) {
        while let Some(entry) = self.cancels.first_entry() {
            if *entry.key() > self.steps {
                break;
            }
            for (id, fault) in entry.remove() {
                self.injected.cancel += u64::from(fault);
                self.sched.cancel(&id);
            }
        }
    }

    /// The step: the last output in, the plan out (timed), its latencies recorded and the
    /// requests it ended settled.
    fn step(&mut self) -> StepPlan {
        let t0 = Instant::now();
        self.sched.update(std::mem::take(&mut self.out));
        let plan = self.sched.schedule();
        self.out.step = plan.step;
        let t1 = Instant::now();
        self.steps += 1;
        self.rec.step.saturating_record(ns(t1 - t0));
        for &l in &plan.runnable_latency_ns {
            self.rec.runnable.saturating_record(l.max(1));
        }
        for s in &plan.scheduled {
            if let Some(at) = self.arrival_of.remove(&*s.id) {
                self.rec
                    .first_schedule
                    .saturating_record(ns(t1.saturating_duration_since(at)));
            }
        }
        self.settle_ended(&plan);
        plan
    }

    /// Forgets the requests `plan` ended; one finished with fewer samples sent than tokens to
    /// generate had a sample applied twice.
    fn settle_ended(&mut self, plan: &StepPlan) {
        let steps = self.steps;
        for (id, state) in &plan.ended {
            self.arrival_of.remove(&**id);
            if let Some((sent, max)) = self.samples_sent.remove(&**id) {
                if *state == EndState::Finished
                    && sent < max
                    && self.violations.len() < MAX_VIOLATIONS
                {
                    self.violations.push(format!(
                        "step {steps}: request {id} finished after {sent} samples, fewer than its {max} tokens to generate (a sample applied twice?)"
                    ));
                }
            }
        }
    }

    /// `late`: cancels the requests offered an async load in this step, right after dispatch.
    fn cancel_late(&mut self) {
        if self.faults.late > 0.0 {
            while let Some(id) = self.conn.offers.pop() {
                if draw_for(self.cfg.seed, 0x1A7E_CA2C, &id) < self.faults.late
                    && self.late_done.insert(id.clone())
                {
                    self.injected.late += 1;
                    self.sched.cancel(&id);
                }
            }
        }
    }

    /// The simulated model: the model time if anything is scheduled, then the plan's
    /// synchronous loads (failed blocks into the output) and a sample for every request
    /// scheduled with `samples`.
    fn run_model(&mut self, plan: &StepPlan) {
        if !plan.scheduled.is_empty() {
            simulate_model(self.model);
        }
        for s in &plan.scheduled {
            if let Some(job) = &s.sync_load {
                self.run_sync_load(job);
            }
            if s.samples {
                self.out.sampled.push(s.id.to_string());
                if let Some((sent, _)) = self.samples_sent.get_mut(&*s.id) {
                    *sent += 1;
                }
            }
        }
    }

    /// Runs one synchronous load through the simulated connector.
    fn run_sync_load(&mut self, job: &LoadJob) {
        self.sync_run += 1;
        if self.faults.stale > 0.0 {
            if let Some(&b) = job.all_loaded_blocks().first() {
                self.last_sync_block = Some(b);
            }
        }
        if let LoadResult::Failed(bad) = self.conn.sim.decide(job) {
            self.out.invalid_blocks.extend(bad.into_flat());
        }
    }

    /// `duplicate` and `stale`: the engine's output, damaged.
    fn damage_output(&mut self) {
        let (dup, stale) = (self.frng.unit(), self.frng.unit());
        let out = &mut self.out;
        let empty =
            out.sampled.is_empty() && out.finished.is_empty() && out.invalid_blocks.is_empty();
        if dup < self.faults.duplicate && !empty {
            self.injected.duplicate += 1;
            out.sampled.extend_from_within(..);
            out.finished.extend_from_within(..);
            out.invalid_blocks.extend_from_within(..);
        }
        if stale < self.faults.stale {
            self.injected.stale += 1;
            let b = match self.last_sync_block {
                Some(b) if self.frng.unit() < 0.5 => BlockRef {
                    id: b.id,
                    generation: b.generation.wrapping_add(0x8000_0000),
                },
                _ => BlockRef {
                    id: self.cfg.pool_blocks as u64 + self.frng.below(1024),
                    generation: 1,
                },
            };
            out.invalid_blocks.push(b);
        }
    }

    /// Nothing scheduled or ended: waits for a load to complete, at most 200 µs and not past
    /// the next arrival.
    fn idle(&self) {
        let mut wait = Duration::from_micros(200);
        if let Some(at) = self.next_at {
            wait = wait.min(at.saturating_sub(self.start.elapsed()));
        }
        if !wait.is_zero() {
            self.sched.wait_for_work(wait);
        }
    }

    /// The scheduler's invariants, every `--check-every` steps.
    fn periodic_check(&mut self) {
        if self.steps % self.cfg.check_every == 0 && self.violations.len() < MAX_VIOLATIONS {
            let steps = self.steps;
            self.violations.extend(
                self.sched
                    .check_invariants()
                    .into_iter()
                    .map(|v| format!("step {steps}: {v}")),
            );
        }
    }

    /// Reports progress, about every 100 ms.
    fn report_progress(&mut self, progress: &mut dyn FnMut(&Progress)) {
        if self.last_progress.elapsed() >= Duration::from_millis(100) {
            self.last_progress = Instant::now();
            let m = self.sched.metrics();
            progress(&Progress {
                scheduler: self.name,
                total: self.cfg.requests,
                ended: self.ended,
                elapsed: self.start.elapsed(),
                completions: m.loads_ok + m.loads_failed,
            });
        }
    }

    /// Ends the run: the last progress, the final invariant check, the last output applied,
    /// shutdown and the reconciliation of the accounts.
    fn finish(mut self, progress: &mut dyn FnMut(&Progress)) -> Finished {
        let elapsed = self.start.elapsed();
        let metrics = self.sched.metrics();
        progress(&Progress {
            scheduler: self.name,
            total: self.cfg.requests,
            ended: self.cfg.requests,
            elapsed,
            completions: metrics.loads_ok + metrics.loads_failed,
        });
        self.violations.extend(
            self.sched
                .check_invariants()
                .into_iter()
                .map(|v| format!("end: {v}")),
        );
        // The engine's output for the last step still goes to the scheduler: shutdown's final
        // step applies it (and counts whatever in it is stale).
        self.sched.update(std::mem::take(&mut self.out));
        let report = self.sched.shutdown();
        self.injected.deadline = self.conn.hangs.load(Ordering::Relaxed);
        self.injected.panic = self.conn.panics.load(Ordering::Relaxed);
        let counts = EngineCounts {
            submitted: self.submitted,
            rejected: self.rejected,
            sync_run: self.sync_run,
        };
        let mut violations = self.violations;
        let reconciled = reconcile(self.name, &report, &counts, &self.injected, &mut violations);
        violations.truncate(MAX_VIOLATIONS);
        Finished {
            report,
            metrics,
            elapsed,
            steps: self.steps,
            sync_run: self.sync_run,
            injected: self.injected,
            violations,
            reconciled,
        }
    }
}

/// A run's end, for its report.
struct Finished {
    /// The scheduler's shutdown report.
    report: Report,
    /// The scheduler's counters when the run ended, before shutdown.
    metrics: Metrics,
    /// Run time, shutdown excluded.
    elapsed: Duration,
    steps: u64,
    sync_run: u64,
    injected: FaultCounts,
    violations: Vec<String>,
    reconciled: bool,
}

impl Finished {
    /// The run's report, with the percentiles of `hists` (their recorders dropped).
    fn run_report(self, name: &'static str, timed_out: bool, hists: &mut Hists) -> RunReport {
        let (fm, m) = (&self.report.metrics, &self.metrics);
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        RunReport {
            scheduler: name,
            requests: RequestCounts {
                submitted: fm.submitted,
                finished: fm.finished,
                failed: fm.failed,
                cancelled: fm.cancelled,
            },
            loads: LoadCounts {
                ok: fm.loads_ok,
                failed: fm.loads_failed,
                stale: fm.stale_completions,
                dispatched: fm.loads_dispatched,
                stale_blocks: fm.stale_blocks,
                sync_run: self.sync_run,
            },
            tokens_recomputed: fm.tokens_recomputed,
            claims: fm.claims,
            handoffs: fm.handoffs,
            preemptions: fm.preemptions,
            completions_per_s: ((m.loads_ok + m.loads_failed) as f64 / secs * 10.0).round() / 10.0,
            step_overhead_us: hists.step.percentiles(true),
            submit_to_schedule_us: hists.first_schedule.percentiles(false),
            completion_to_runnable_us: hists.runnable.percentiles(false),
            steps: self.steps,
            elapsed_s: (secs * 1000.0).round() / 1000.0,
            timed_out,
            faults_injected: self.injected,
            events: Events::of(fm),
            invariants: Invariants {
                ok: self.violations.is_empty(),
                reconciled: self.reconciled,
                violations: self.violations,
            },
        }
    }
}
