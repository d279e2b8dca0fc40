//! [`MutexScheduler`]: the engine-facing API, each call taking the global lock.

use std::sync::Arc as StdArc;
// The baseline deliberately uses std's mpsc channels for jobs and completions: that is the
// design it stands for (the runtime uses lock-free queues from `kvsched::sync`).
use std::sync::mpsc;
use std::time::Duration;

use super::config::BaselineConfig;
use super::state::State;
use super::workers::Workers;
use kvsched::connector::KvConnector;
use kvsched::rules::geometry::{Geometry, DEFAULT_NULL_BLOCK};
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::shard::strategy::Pool;
use kvsched::runtime::shard::{Command, NewRequest, PreparedPrompt};
use kvsched::runtime::worker::Completion;
use kvsched::runtime::{Metrics, Report, RuntimeError, StepOutput, StepPlan, SubmitRequest};
use kvsched::sync::Mutex;

/// The baseline scheduler. See the module docs.
pub struct MutexScheduler {
    state: Mutex<State>,
    /// The connector, reached without the lock by `submit` (its `prepare`).
    connector: StdArc<dyn KvConnector>,
    completions: Mutex<mpsc::Receiver<Completion>>,
    workers: Workers,
}

impl std::fmt::Debug for MutexScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MutexScheduler {{ workers: {}, .. }}",
            self.workers.len()
        )
    }
}

impl MutexScheduler {
    /// Validates the settings and starts the worker threads.
    pub fn new(cfg: BaselineConfig) -> Result<Self, RuntimeError> {
        let geo = Geometry::new(cfg.groups.clone(), None, DEFAULT_NULL_BLOCK)?;
        let bad = |field, problem: &str| {
            Err(RuntimeError::Config {
                field,
                problem: problem.to_owned(),
            })
        };
        if cfg.pool_blocks < 2 || cfg.pool_blocks > u32::MAX as usize {
            return bad("pool_blocks", "must be 2 to 2^32 - 1");
        }
        if !(1..=256).contains(&cfg.workers) {
            return bad("workers", "must be 1 to 256");
        }
        if cfg.token_budget == 0 || cfg.max_seqs == 0 {
            return bad("token_budget", "token budget and max_seqs must be > 0");
        }
        let (workers, done_rx) = Workers::start(cfg.workers, &cfg.connector)?;
        Ok(MutexScheduler {
            connector: cfg.connector.clone(),
            state: Mutex::new(State::new(geo, cfg)),
            completions: Mutex::new(done_rx),
            workers,
        })
    }

    /// Queues a request; it is admitted at a following step. The runtime's checks: an id, a
    /// prompt, a length the pool can ever hold, an id not live, a scheduler not shut down.
    pub fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        // The connector's work on the prompt, before the lock (as the runtime does it).
        let prepared = PreparedPrompt::by(self.connector.as_ref(), &req.id, &req.prompt);
        let mut s = self.state.lock();
        if s.shut {
            return Err(RuntimeError::ShutDown);
        }
        NewRequest::check(&s.cx.geo, s.cx.blocks.num_blocks(), &req)?;
        let id: StdArc<str> = req.id.as_str().into();
        if !s.live.insert(id.clone()) {
            return Err(RuntimeError::DuplicateId(req.id));
        }
        let key = RequestKey::new(false, req.priority, s.seq);
        s.seq += 1;
        s.metrics.submitted += 1;
        let new = NewRequest::new(&s.cx.geo, req, id, key).with_prepared(prepared);
        s.inbox.push(Command::Submit(Box::new(new)));
        Ok(())
    }

    /// Cancels a request at the next step (once its in-flight load, if any, lands), as the
    /// runtime does. Unknown ids are counted in [`Metrics::unknown_commands`] then.
    pub fn cancel(&self, id: &str) {
        self.state.lock().inbox.push(Command::Cancel(id.into()));
    }

    fn take_completions(&self) -> Vec<Completion> {
        self.completions.lock().try_iter().collect()
    }

    /// Runs one step under the global lock and returns what to compute.
    pub fn schedule(&mut self) -> StepPlan {
        self.step(false)
    }

    fn step(&mut self, draining: bool) -> StepPlan {
        let mut fresh = self.take_completions();
        let mut s = self.state.lock();
        let mut completions = std::mem::take(&mut s.stash);
        completions.append(&mut fresh);
        let plan = s.step(completions, draining);
        let jobs = std::mem::take(&mut s.jobs);
        drop(s);
        self.workers.send(jobs);
        plan
    }

    /// Applies the engine's output for the last step (at the next [`MutexScheduler::schedule`])
    /// and returns the outputs to discard, as [`Runtime::update`](kvsched::runtime::Runtime::update)
    /// does: the requests whose output of the step was computed from a block one of its sync
    /// loads failed to fill.
    pub fn update(&mut self, out: StepOutput) -> Vec<StdArc<str>> {
        self.state.lock().record_output(out)
    }

    /// Asynchronous loads queued for the workers whose completion has not been sent back yet
    /// (0: the next step takes every completion of every load dispatched so far).
    pub fn loads_in_flight(&self) -> u64 {
        self.workers.in_flight()
    }

    /// Counters so far.
    pub fn metrics(&self) -> Metrics {
        self.state.lock().metrics.clone()
    }

    /// Waits until a load completes or `timeout` passes; returns whether something happened.
    pub fn wait_for_work(&self, timeout: Duration) -> bool {
        let got = self.completions.lock().recv_timeout(timeout);
        match got {
            Ok(c) => {
                self.state.lock().stash.push(c);
                true
            }
            Err(_) => false,
        }
    }

    /// invariants of docs/runtime.md ("Invariants") that can be checked between steps; returns the violations.
    pub fn check_invariants(&self) -> Vec<String> {
        self.state.lock().violations()
    }

    /// Stops the workers (loads in flight finish and are applied), cancels every live request,
    /// releases every block and reports.
    pub fn shutdown(mut self) -> Report {
        self.state.lock().shut = true;
        self.workers.stop();
        let loads_cancelled = self.workers.loads_cancelled();
        let ended_at_shutdown = self
            .step(true)
            .ended
            .into_iter()
            .map(|(id, state)| (id.to_string(), state))
            .collect();
        let mut s = self.state.lock();
        s.jobs.clear();
        // Every worker finished: no load can still write a block.
        let res = s.cancel_all();
        let cancelled_at_shutdown: Vec<String> =
            res.ended.iter().map(|(id, _)| id.to_string()).collect();
        s.metrics += &res.counters;
        s.metrics.cancelled += cancelled_at_shutdown.len() as u64;
        s.live.clear();
        let census = s.cx.blocks.census();
        // The baseline waits for every load in flight: nothing is abandoned.
        let mut report = Report::new(s.metrics.clone(), census);
        report.loads_cancelled = loads_cancelled;
        report.cancelled_at_shutdown = cancelled_at_shutdown;
        report.ended_at_shutdown = ended_at_shutdown;
        report.violations = s.violations();
        report.load_estimate = s.cx.load_estimate();
        report
    }
}

impl Drop for MutexScheduler {
    fn drop(&mut self) {
        self.workers.stop();
    }
}
