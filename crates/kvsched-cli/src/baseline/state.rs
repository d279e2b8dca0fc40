//! Everything behind the baseline's global lock, and the bookkeeping every mechanism shares:
//! phases, releasing a request's blocks (handing off what it owned), ending a request,
//! registering computed blocks in the prefix cache; and one step, phase by phase — the
//! shard's phases in the shard's order, so that on the same input both decide alike.

use std::collections::BTreeSet;
use std::sync::Arc as StdArc;
use std::time::Instant;

use rustc_hash::FxHashMap;

use super::blocks::Blocks;
use super::config::BaselineConfig;
use super::outputs::Command;
use super::request::{Phase, Req};
use kvsched::connector::LoadJob;
use kvsched::pool::BlockRef;
use kvsched::rules::geometry::{BlockId, Geometry};
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::discard::HandedOut;
use kvsched::runtime::worker::Completion;
use kvsched::runtime::{EndState, Metrics, StepPlan};

/// Pending mark of a block whose owner ended before recomputing it.
pub(super) const ORPHANED: u64 = u64::MAX;

/// Everything behind the global lock.
pub(super) struct State {
    pub(super) geo: Geometry,
    pub(super) cfg: BaselineConfig,
    pub(super) blocks: Blocks,
    pub(super) reqs: FxHashMap<RequestKey, Req>,
    pub(super) by_id: FxHashMap<StdArc<str>, RequestKey>,
    pub(super) waiting: BTreeSet<RequestKey>,
    pub(super) loading: BTreeSet<RequestKey>,
    pub(super) running: BTreeSet<RequestKey>,
    /// Block → owner key (raw) that must recompute it, or [`ORPHANED`].
    pub(super) pending: FxHashMap<BlockId, u64>,
    /// Requests with something to apply after recovery (as a shard's): scheduled in the last
    /// step, named by a finish, or recovered this step. Only their progress is confirmed — a
    /// request admitted with a sync load it has not run yet registers nothing.
    pub(super) touched: Vec<RequestKey>,
    /// Cancels, samples and engine finishes since the last step, applied at the next one in
    /// the order they came (as a shard's inbox).
    pub(super) inbox: Vec<Command>,
    /// The failed blocks of the last step's sync loads the engine reported.
    pub(super) sync_invalid: Vec<BlockRef>,
    /// Blocks owners left unrecomputed while another request held them: next step's report.
    pub(super) handoffs: Vec<BlockRef>,
    /// What the latest plan handed out (samplers, sync destinations, reads), recorded as
    /// the runtime records it.
    pub(super) handed: HandedOut,
    /// Whether an output answering the latest plan came (its sync loads are counted once).
    pub(super) answered: bool,
    pub(super) ended: Vec<(StdArc<str>, EndState)>,
    pub(super) stash: Vec<Completion>,
    pub(super) jobs: Vec<(RequestKey, LoadJob)>,
    pub(super) metrics: Metrics,
    pub(super) seq: u64,
    pub(super) step: u64,
    pub(super) shut: bool,
}

impl State {
    /// The state of a scheduler with `geo` and `cfg`: no requests, every block free.
    pub(super) fn new(geo: Geometry, cfg: BaselineConfig) -> Self {
        let n = cfg.pool_blocks;
        State {
            geo,
            cfg,
            blocks: Blocks::new(n),
            reqs: FxHashMap::default(),
            by_id: FxHashMap::default(),
            waiting: BTreeSet::new(),
            loading: BTreeSet::new(),
            running: BTreeSet::new(),
            pending: FxHashMap::default(),
            touched: Vec::new(),
            inbox: Vec::new(),
            sync_invalid: Vec::new(),
            handoffs: Vec::new(),
            handed: HandedOut::default(),
            answered: false,
            ended: Vec::new(),
            stash: Vec::new(),
            jobs: Vec::new(),
            metrics: Metrics::default(),
            seq: 1,
            step: 0,
            shut: false,
        }
    }

    pub(super) fn null(&self) -> BlockId {
        self.geo.null_block()
    }

    /// Releases every block of `r`; an owned, unrecomputed block that another request still
    /// holds is handed off (into the next report), one nobody holds any more is forgotten —
    /// the shard's rule.
    pub(super) fn release_all(&mut self, key: RequestKey) {
        let Some(r) = self.reqs.get_mut(&key) else {
            return;
        };
        r.sync_job = None;
        let null = self.geo.null_block();
        for (t, g) in r.tables.iter_mut().zip(r.gens.iter_mut()) {
            for (&id, &generation) in t.iter().zip(g.iter()) {
                if id != null {
                    self.blocks.release(BlockRef { id, generation });
                }
            }
            t.clear();
            g.clear();
        }
        for id in r.owned_pending.drain(..) {
            if self.pending.get(&id) == Some(&key.raw()) {
                self.pending.insert(id, ORPHANED);
            }
            match self.blocks.generation.get(id as usize) {
                Some(&generation) if self.blocks.ref_count[id as usize] > 0 => {
                    self.handoffs.push(BlockRef { id, generation });
                    self.metrics.handoffs += 1;
                }
                _ => {
                    self.pending.remove(&id);
                }
            }
        }
        r.registered.iter_mut().for_each(|x| *x = 0);
        r.written = 0;
        r.waits.clear();
    }

    pub(super) fn end(&mut self, key: RequestKey, state: EndState) {
        self.release_all(key);
        if let Some(r) = self.reqs.remove(&key) {
            self.waiting.remove(&key);
            self.loading.remove(&key);
            self.running.remove(&key);
            self.by_id.remove(&r.id);
            match state {
                EndState::Finished => self.metrics.finished += 1,
                EndState::Failed => self.metrics.failed += 1,
                EndState::Cancelled => self.metrics.cancelled += 1,
            }
            self.ended.push((r.id, state));
        }
    }

    pub(super) fn set_phase(&mut self, key: RequestKey, phase: Phase) {
        let Some(r) = self.reqs.get_mut(&key) else {
            return;
        };
        match r.phase {
            Phase::Waiting => self.waiting.remove(&key),
            Phase::Loading => self.loading.remove(&key),
            Phase::Running => self.running.remove(&key),
        };
        r.phase = phase;
        match phase {
            Phase::Waiting => self.waiting.insert(key),
            Phase::Loading => self.loading.insert(key),
            Phase::Running => self.running.insert(key),
        };
    }

    pub(super) fn register_and_trim(&mut self, key: RequestKey) {
        self.register_upto(key, None);
    }

    /// Registers the request's full blocks below `upto` (what is known written when `None`)
    /// and, for `None`, trims the entries its groups no longer need (as a shard).
    pub(super) fn register_upto(&mut self, key: RequestKey, upto: Option<u64>) {
        let null = self.null();
        let Some(r) = self.reqs.get_mut(&key) else {
            return;
        };
        let nct = upto.unwrap_or(r.written.min(r.num_computed_tokens));
        for (g, grp) in self.geo.groups().iter().enumerate() {
            let full = ((nct / grp.block_size) as usize)
                .min(r.hashes[g].len())
                .min(r.tables[g].len());
            while r.registered[g] < full {
                let i = r.registered[g];
                if r.tables[g][i] != null
                    && kvsched::runtime::policy::caching::cacheable(grp, i, nct)
                {
                    let b = BlockRef {
                        id: r.tables[g][i],
                        generation: r.gens[g][i],
                    };
                    self.blocks.register(r.hashes[g][i], b);
                }
                r.registered[g] += 1;
            }
            if upto.is_some() {
                continue;
            }
            for i in 0..(grp.nullable_below(nct) as usize).min(r.tables[g].len()) {
                if r.tables[g][i] != null {
                    self.blocks.release(BlockRef {
                        id: r.tables[g][i],
                        generation: r.gens[g][i],
                    });
                    r.tables[g][i] = null;
                    r.gens[g][i] = 0;
                }
            }
        }
    }

    /// One step, in a shard's phases: the engine's share of the report (last output's sync
    /// failures, hand-offs) and the commands since the last step, then completions drained
    /// into the report; recovery; the last output applied; landed loads moved on; then
    /// (unless draining at shutdown) admission and scheduling.
    pub(super) fn step(&mut self, completions: Vec<Completion>, draining: bool) -> StepPlan {
        self.step += 1;
        self.metrics.steps += 1;
        let mut plan = StepPlan {
            step: self.step,
            ..StepPlan::default()
        };
        let mut report = self.engine_share();
        for cmd in std::mem::take(&mut self.inbox) {
            self.apply_command(cmd);
        }
        self.drain_completions(completions, &mut report);
        self.recover(report, &mut plan);
        self.apply_outputs();
        let now = Instant::now();
        self.land_loads(now, &mut plan);
        if !draining {
            self.admit();
            self.schedule(now, &mut plan);
        }
        plan.ended = std::mem::take(&mut self.ended);
        self.answered = false;
        self.handed.record(&plan);
        plan
    }
}
