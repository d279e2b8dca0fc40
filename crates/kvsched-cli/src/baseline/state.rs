//! Everything behind the baseline's global lock — the runtime's own [`Shard`] over the
//! baseline's strategy ([`Locked`]: plain blocks and claim words), its inbox, and what the
//! runtime's engine thread keeps — and one step: the shard's three phases run back to back
//! on the calling thread, as the runtime runs a step inline.

use std::sync::Arc as StdArc;
use std::time::Instant;

use rustc_hash::FxHashSet;

use super::blocks::Blocks;
use super::claims::ClaimWords;
use super::config::BaselineConfig;
use super::engine::Engine;
use kvsched::connector::{KvConnector, LoadJob};
use kvsched::rules::geometry::Geometry;
use kvsched::rules::recovery::InvalidSet;
use kvsched::runtime::load_estimate::LoadEstimate;
use kvsched::runtime::quarantine::Quarantine;
use kvsched::runtime::shard::strategy::Strategy;
use kvsched::runtime::shard::{Command, Env, Shard, ShardStepResult, StepSettings};
use kvsched::runtime::worker::Completion;
use kvsched::runtime::{Metrics, Settings, StepPlan, TierEstimate};

/// The baseline's strategy: the shard's pool and claim table are plain data behind the
/// global lock.
#[derive(Debug, Default)]
pub(super) struct Locked;

impl Strategy for Locked {
    type Pool = Blocks;
    type Claims = ClaimWords;
}

/// What the shard's step reads besides its own state: the geometry, the settings, the
/// connector, the pool, the claim words, the quarantine.
pub(super) struct Context {
    pub(super) geo: Geometry,
    pub(super) settings: StepSettings,
    connector: StdArc<dyn KvConnector>,
    pub(super) blocks: Blocks,
    pub(super) claims: ClaimWords,
    /// Never quarantines (the baseline runs without quarantine), but the shard consults it.
    quarantine: Quarantine,
    /// The tier's load cost as this scheduler measures it (the `cost` load policy's input).
    estimate: LoadEstimate,
}

impl Context {
    /// The load estimate as this scheduler measured it.
    pub(super) fn load_estimate(&self) -> TierEstimate {
        self.estimate.snapshot(self.settings.workers)
    }

    /// The shard's view of it.
    pub(super) fn env(&self) -> Env<'_, Locked> {
        Env {
            geo: &self.geo,
            pool: &self.blocks,
            claims: &self.claims,
            connector: self.connector.as_ref(),
            quarantine: &self.quarantine,
            estimate: &self.estimate,
            shard: 0,
            shards: 1,
        }
    }
}

/// Everything behind the global lock.
pub(super) struct State {
    pub(super) cx: Context,
    pub(super) shard: Shard<Locked>,
    /// Submissions, cancels, samples and engine finishes since the last step, applied by the
    /// shard at the next one in the order they came.
    pub(super) inbox: Vec<Command>,
    /// Live request ids (the duplicate check at submit).
    pub(super) live: FxHashSet<StdArc<str>>,
    /// The next admission sequence number.
    pub(super) seq: u64,
    /// What the runtime's engine thread keeps between steps.
    pub(super) engine: Engine,
    /// Completions a `wait_for_work` took off the channel before the step.
    pub(super) stash: Vec<Completion>,
    /// Asynchronous loads the last step dispatched, for the workers.
    pub(super) jobs: Vec<LoadJob>,
    pub(super) metrics: Metrics,
    pub(super) step: u64,
    pub(super) shut: bool,
}

impl State {
    /// The state of a scheduler with `geo` and `cfg`: no requests, every block free.
    pub(super) fn new(geo: Geometry, cfg: BaselineConfig) -> Self {
        let n = cfg.pool_blocks;
        let cx = Context {
            geo,
            // The mechanisms the baseline runs without: load deadlines, the retry budget and
            // quarantine.
            settings: StepSettings {
                workers: cfg.workers,
                ..StepSettings::new(
                    &Settings::default()
                        .with_mode(cfg.mode)
                        .with_policy(cfg.policy)
                        .with_load_deadline(None)
                        .with_max_load_retries(u32::MAX)
                        .with_quarantine_after(0)
                        .with_load_policy(cfg.load_policy)
                        .with_compute_rate(cfg.compute_rate),
                    cfg.token_budget,
                    cfg.max_seqs,
                    false,
                )
            },
            connector: cfg.connector,
            blocks: Blocks::new(n),
            claims: ClaimWords::new(n),
            quarantine: Quarantine::default(),
            estimate: LoadEstimate::default(),
        };
        State {
            cx,
            shard: Shard::for_blocks(n),
            inbox: Vec::new(),
            live: FxHashSet::default(),
            seq: 1,
            engine: Engine::default(),
            stash: Vec::new(),
            jobs: Vec::new(),
            metrics: Metrics::default(),
            step: 0,
            shut: false,
        }
    }

    /// One step: the engine's share of the report, then the shard's phases — commands and
    /// completions (its share of the report), claiming the report's hits, deciding, the last
    /// output, landed loads and (unless draining at shutdown) admission and scheduling.
    pub(super) fn step(&mut self, completions: Vec<Completion>, draining: bool) -> StepPlan {
        self.step += 1;
        self.take_lost_output();
        let share = self.engine_share();
        let (cx, env) = (&self.cx, self.cx.env());
        let commands = self.inbox.drain(..);
        let now = Instant::now();
        let mut ids = self
            .shard
            .publish(&env, &cx.settings, now, commands, completions);
        ids.extend(share);
        ids.sort_unstable();
        ids.dedup();
        if !ids.is_empty() {
            let report = InvalidSet::flat(ids.iter().copied(), &cx.geo);
            self.shard.claim(&env, &cx.settings, &report, &ids);
        }
        let (now, jobs) = (Instant::now(), &mut self.jobs);
        // The result moves once, into the plan (its lists become the plan's).
        let mut res = ShardStepResult::default();
        self.shard
            .finish_step(&env, &cx.settings, now, draining, jobs, &mut res);
        self.plan(res, ids)
    }

    /// Ends every request (shutdown, every worker finished): the shard's own.
    pub(super) fn cancel_all(&mut self) -> ShardStepResult {
        let none = FxHashSet::default();
        self.shard.cancel_all(&self.cx.env(), true, &none)
    }
}
