//! [`SimEngine`]: one plan in, its output out.

use std::fmt;

use crate::connector::{KvConnector, LoadJob, LoadResult};
use crate::runtime::{ScheduledRequest, StepOutput, StepPlan};

/// What a [`SimEngine`] has done, summed over the plans it ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounts {
    /// Plans run (each answered by one output).
    pub steps: u64,
    /// Scheduled requests computed.
    pub scheduled: u64,
    /// Tokens computed.
    pub tokens: u64,
    /// Synchronous loads run.
    pub sync_loads: u64,
    /// Of those, loads that failed (their failed blocks went into the output).
    pub sync_loads_failed: u64,
    /// Tokens sampled (one per request scheduled with `samples`).
    pub samples: u64,
    /// Requests the engine finished on its own (see [`SimEngine::step_with`]).
    pub finishes: u64,
}

/// A simulated engine: [`step`](SimEngine::step) takes a [`StepPlan`] and returns the
/// [`StepOutput`] that answers it.
///
/// For each scheduled request, in plan order, it
///
/// 1. runs the request's synchronous load, if it has one, through the sync-load runner the
///    engine was built with (a failure's blocks go into [`StepOutput::invalid_blocks`]);
/// 2. computes the scheduled tokens — simulated: no model runs and no KV bytes are read or
///    written yet;
/// 3. samples a token if the request was scheduled with `samples`
///    ([`StepOutput::sampled`]);
/// 4. finishes the request if the caller's finish rule says so
///    ([`StepOutput::finished`], with [`step_with`](SimEngine::step_with)).
///
/// # Guarantees
///
/// * The output answers the plan it was made from ([`StepOutput::step`] is the plan's).
/// * Deterministic: the output depends only on the plan, the sync-load runner and the finish
///   rule; the engine keeps no state between steps besides its [`SimCounts`].
/// * Sync loads run on the calling thread, one after the other, in plan order.
/// * `Send`: an engine may be built on one thread and run on another.
///
/// # Limits
///
/// It takes no time: a caller that wants a model's cost waits itself. A panic in the sync-load
/// runner or the finish rule propagates to the caller.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use kvsched::sim::SimEngine;
/// use kvsched::{Runtime, StepOutput, SubmitRequest};
///
/// let mut rt = Runtime::builder().shards(1).build()?;
/// rt.submit(SubmitRequest {
///     id: "r1".into(),
///     prompt: vec![7; 40],
///     max_new_tokens: 3,
///     priority: 0,
///     load_deadline: None,
/// })?;
/// let mut engine = SimEngine::default(); // no connector: every sync load succeeds
/// let mut out = StepOutput::default();
/// while rt.live() > 0 {
///     rt.update(std::mem::take(&mut out));
///     let plan = rt.schedule()?;
///     out = engine.step(&plan);
///     if plan.scheduled.is_empty() {
///         rt.wait_for_work(Duration::from_millis(1));
///     }
/// }
/// assert_eq!(engine.counts().samples, 3);
/// assert_eq!(rt.shutdown().metrics.finished, 1);
/// # Ok::<(), kvsched::RuntimeError>(())
/// ```
pub struct SimEngine<'a> {
    sync_loads: Box<dyn FnMut(&LoadJob) -> LoadResult + Send + 'a>,
    counts: SimCounts,
}

impl fmt::Debug for SimEngine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimEngine")
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

impl Default for SimEngine<'_> {
    /// An engine whose sync loads all succeed (there is no KV store behind them).
    fn default() -> Self {
        SimEngine::new(|_| LoadResult::Ok)
    }
}

impl<'a> SimEngine<'a> {
    /// An engine that runs each synchronous load with `sync_loads` (for a
    /// [`SimConnector`](crate::connector::SimConnector), its
    /// [`decide`](crate::connector::SimConnector::decide): the connector's failure decision
    /// without its latency).
    pub fn new(sync_loads: impl FnMut(&LoadJob) -> LoadResult + Send + 'a) -> Self {
        SimEngine {
            sync_loads: Box::new(sync_loads),
            counts: SimCounts::default(),
        }
    }

    /// An engine that runs each synchronous load through `connector`'s
    /// [`load`](KvConnector::load), on the calling thread.
    pub fn with_connector(connector: &'a dyn KvConnector) -> Self {
        SimEngine::new(move |job| connector.load(job))
    }

    /// Runs `plan` and returns the output that answers it. The engine finishes no request
    /// on its own: requests end when they have generated their tokens.
    pub fn step(&mut self, plan: &StepPlan) -> StepOutput {
        self.step_with(plan, |_| false)
    }

    /// Runs `plan` and returns the output that answers it, finishing each scheduled request
    /// for which `finish` returns true (a stop token, a client gone). `finish` is called once
    /// per scheduled request, in plan order, after its sample.
    pub fn step_with(
        &mut self,
        plan: &StepPlan,
        mut finish: impl FnMut(&ScheduledRequest) -> bool,
    ) -> StepOutput {
        self.counts.steps += 1;
        let mut out = StepOutput::for_plan(plan);
        for s in &plan.scheduled {
            self.run(s, &mut out);
            if finish(s) {
                self.counts.finishes += 1;
                out.finished.push(s.id.to_string());
            }
        }
        out
    }

    /// What the engine has done so far.
    pub fn counts(&self) -> SimCounts {
        self.counts
    }

    /// Runs one scheduled request of the step into `out`: its synchronous load first (the
    /// blocks of tokens `start..end` filled from the KV store), then the computation of its
    /// `num_tokens` tokens from `num_computed_tokens` on, then its sample. The computation is
    /// where a real engine reads the KV entries below those tokens and writes theirs; here
    /// nothing is read or written.
    fn run(&mut self, s: &ScheduledRequest, out: &mut StepOutput) {
        if let Some(job) = &s.sync_load {
            self.counts.sync_loads += 1;
            if let LoadResult::Failed(bad) = (self.sync_loads)(job) {
                self.counts.sync_loads_failed += 1;
                out.invalid_blocks.extend(bad.into_flat());
            }
        }
        self.counts.scheduled += 1;
        self.counts.tokens += s.num_tokens;
        if s.samples {
            self.counts.samples += 1;
            out.sampled.push(s.id.to_string());
        }
    }
}
