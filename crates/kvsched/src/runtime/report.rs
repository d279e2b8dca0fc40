//! The [`Report`] that [`Runtime::shutdown`] returns, and its few-line [`Display`] form.
//!
//! [`Display`]: std::fmt::Display

use crate::pool::Census;
use crate::rules::geometry::BlockId;
use crate::runtime::policy::load_cost::TierEstimate;
use crate::runtime::shard::{EndState, Metrics};
#[cfg(doc)]
use crate::runtime::step::Runtime;

/// The final account of a runtime.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Report {
    /// Counters at the end.
    pub metrics: Metrics,
    /// Loads queued but never started, cancelled by shutdown.
    pub loads_cancelled: u64,
    /// Loads still running when shutdown stopped waiting (see [`Runtime::shutdown`]).
    pub loads_abandoned: u64,
    /// Blocks still held after shutdown: those of abandoned loads (0 when none was abandoned).
    /// Their bytes in the engine's KV memory may still be written by a detached worker: see
    /// [`Runtime::shutdown`](crate::Runtime::shutdown) before reusing that memory.
    pub blocks_abandoned: u64,
    /// The ids of those blocks, ascending, each once: the part of the engine's KV memory a
    /// detached worker may still write. Every other block's memory is free to reuse.
    pub abandoned_block_ids: Vec<BlockId>,
    /// The pool's census after every block was released.
    pub census: Census,
    /// Requests still live at shutdown (all cancelled), with their ids.
    pub cancelled_at_shutdown: Vec<String>,
    /// Requests that ended in shutdown's last step, which applies the last output and the
    /// loads that landed (a finish, a failure, a cancel that waited for its load), with how
    /// they ended. Counted in the metrics like any other end.
    pub ended_at_shutdown: Vec<(String, EndState)>,
    /// Invariant violations found at shutdown (empty when all hold).
    pub violations: Vec<String>,
    /// The tier's load estimate at shutdown (`Runtime::load_estimate`), measured under either
    /// load policy.
    pub load_estimate: TierEstimate,
}

impl Report {
    /// A report of `metrics` and `census` with nothing cancelled, abandoned or violated: for
    /// a scheduler standing in for the runtime (a baseline it is compared with) to fill in.
    pub fn new(metrics: Metrics, census: Census) -> Report {
        Report {
            metrics,
            loads_cancelled: 0,
            loads_abandoned: 0,
            blocks_abandoned: 0,
            abandoned_block_ids: Vec::new(),
            census,
            cancelled_at_shutdown: Vec::new(),
            ended_at_shutdown: Vec::new(),
            violations: Vec::new(),
            load_estimate: TierEstimate::default(),
        }
    }
}

impl std::fmt::Display for Report {
    /// A few lines: what happened to the requests and loads, and whether the invariants held.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = &self.metrics;
        writeln!(
            f,
            "requests: {} submitted, {} finished, {} failed, {} cancelled",
            m.submitted, m.finished, m.failed, m.cancelled
        )?;
        writeln!(
            f,
            "loads: {} dispatched, {} ok, {} failed, {} stale, {} cancelled at shutdown, {} abandoned",
            m.loads_dispatched,
            m.loads_ok,
            m.loads_failed,
            m.stale_completions,
            self.loads_cancelled,
            self.loads_abandoned
        )?;
        writeln!(
            f,
            "recovery: {} claims, {} hand-offs, {} tokens recomputed, {} preemptions over {} steps",
            m.claims, m.handoffs, m.tokens_recomputed, m.preemptions, m.steps
        )?;
        match self.violations.len() {
            0 => write!(f, "invariants: ok"),
            n => write!(
                f,
                "invariants: {n} violated: {}",
                self.violations.join("; ")
            ),
        }
    }
}
