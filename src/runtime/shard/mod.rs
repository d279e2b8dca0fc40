//! A shard: the requests it owns and the per-step work on them (SPEC §7, ARCHITECTURE "one
//! step"). A shard's state is touched only by the thread running its step; everything else
//! reaches it through its lock-free inbox and completion queue, the claim table and the pool.
//!
//! The step is split into phases separated by barriers across all shards:
//!
//! 1. [`Shard::publish`]: take commands, drain completions, publish this shard's share of the
//!    step's report (and reset those blocks' claim words);
//! 2. [`Shard::claim`]: scan own requests against the whole report, one `fetch_min` per hit;
//! 3. [`Shard::finish_step`]: decide with ownership from the claim table, apply the last step's
//!    output, admit, allocate, dispatch loads, pick runnable requests within the budget.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::runtime::claim::{RequestKey, ClaimTable, Scan};
use crate::connector::{KvConnector, LoadJob, LoadOwner, LoadResult, LookupQuery};
use crate::rules::geometry::{BlockId, Geometry, GroupKind, MambaMode};
use crate::pool::{BlockHash, BlockPool, BlockRef, Generation};
use crate::runtime::quarantine::Quarantine;
use crate::rules::recovery::{
    self, Decision, Disposition, Hit, HitOwner, InvalidSet, Mode, Policy, RequestClass, RequestView,
};
use crate::runtime::worker::Completion;

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EndState {
    /// Generated all its tokens, or the engine finished it.
    Finished,
    /// Failed by recovery under policy `fail`.
    Failed,
    /// Cancelled by the engine or by shutdown.
    Cancelled,
}

/// A request as submitted.
#[derive(Clone, Debug)]
pub(crate) struct NewRequest {
    pub id: StdArc<str>,
    pub prompt: StdArc<[u32]>,
    pub max_new_tokens: u32,
    pub key: RequestKey,
    pub submitted_at: Instant,
    pub load_deadline: Option<Duration>,
}

/// What the engine thread sends a shard between steps.
#[derive(Debug)]
pub(crate) enum Command {
    Submit(NewRequest),
    Cancel(StdArc<str>),
    /// A sampled token for a request scheduled in the last step.
    Sampled(StdArc<str>),
    /// The engine finished this request (stop token, …).
    Finish(StdArc<str>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Waiting,
    Loading,
    Running,
}

#[derive(Debug)]
struct Req {
    id: StdArc<str>,
    /// Async-class key; the sync-class key is `key.with_sync(true)`.
    key: RequestKey,
    prompt: StdArc<[u32]>,
    max_new_tokens: u32,
    generated: u32,
    /// Per group: chained hashes of the prompt's full blocks.
    hashes: Vec<Vec<BlockHash>>,
    tables: Vec<Vec<BlockId>>,
    gens: Vec<Vec<Generation>>,
    /// Per group: entries below this index are registered in the prefix cache (or null).
    registered: Vec<usize>,
    num_computed_tokens: u64,
    /// Tokens scheduled in the last step (0 when not scheduled).
    last_scheduled: u64,
    phase: Phase,
    /// Blocks this request must not read until their owner recomputes them (mode `safe`).
    waits: Vec<BlockId>,
    /// `waits` was set by this step's decision: owners in other shards may not have set their
    /// pending marks yet (no barrier separates deciding from scheduling), so the request is not
    /// scheduled before the next step, whose start orders those marks before its reads.
    waits_step: u64,
    /// Blocks this request owns and has not recomputed yet.
    owned_pending: Vec<BlockId>,
    attempt: u32,
    /// Start of the in-flight load (tokens).
    load_start: u64,
    /// End of the in-flight load (tokens).
    load_end: u64,
    /// The in-flight load passed its deadline: treated as failed for all its blocks.
    timed_out: bool,
    /// External loads of this request that failed (completion or deadline).
    load_failures: u32,
    /// Prefix key of the external range, for quarantine.
    prefix_key: Option<u64>,
    /// Per-request load deadline (overrides the settings').
    load_deadline: Option<Duration>,
    /// Recovery's cap on the computed length when the in-flight load lands.
    load_cap: u64,
    /// The load completed this step: `Some(true)` ok, `Some(false)` failed.
    load_done: Option<(bool, Instant)>,
    /// An end decided while a load was in flight; applied when it lands.
    end_after_load: Option<EndState>,
    /// A sync load to run in the step that first schedules the request.
    sync_job: Option<LoadJob>,
    submitted_at: Instant,
    first_scheduled: bool,
    sampled_pending: bool,
    finish_pending: bool,
    skip: bool,
}

impl Req {
    fn seq_len(&self) -> u64 {
        self.prompt.len() as u64 + u64::from(self.generated)
    }
    fn class(&self) -> Option<RequestClass> {
        match self.phase {
            Phase::Loading => Some(RequestClass::Async),
            Phase::Running => Some(RequestClass::Sync),
            Phase::Waiting => None,
        }
    }
    fn view(&self) -> Option<RequestView<'_>> {
        let class = self.class()?;
        Some(RequestView {
            class,
            num_computed_tokens: self.num_computed_tokens,
            num_scheduled_tokens: if class == RequestClass::Sync {
                self.last_scheduled
            } else {
                0
            },
            block_tables: &self.tables,
        })
    }
}

/// A request scheduled in a step.
#[derive(Clone, Debug)]
pub struct ScheduledRequest {
    /// Request id.
    pub id: StdArc<str>,
    /// Canonical key.
    pub key: RequestKey,
    /// Computed tokens before this step.
    pub num_computed_tokens: u64,
    /// Tokens to compute in this step.
    pub num_tokens: u64,
    /// Whether the step computes the sequence's last token (the engine samples one).
    pub samples: bool,
    /// A synchronous load the engine runs in this step before computing.
    pub sync_load: Option<LoadJob>,
    /// Whether this is the request's first scheduling (its submit → first-schedule latency is
    /// in [`crate::runtime::StepPlan::first_schedule_latency_ns`]).
    pub first: bool,
}

/// One request's recovery in a step.
#[derive(Clone, Debug)]
pub struct RecoveredRequest {
    /// Request id.
    pub id: StdArc<str>,
    /// Canonical key (class bit included).
    pub key: RequestKey,
    /// Async or sync in this report.
    pub class: RequestClass,
    /// The rules' decision, owners as canonical keys.
    pub decision: Decision<RequestKey>,
}

/// A scanned request's inputs, recorded for differential checks.
#[derive(Clone, Debug)]
pub struct ScannedRequest {
    /// Request id.
    pub id: StdArc<str>,
    /// Canonical key (class bit included).
    pub key: RequestKey,
    /// Async or sync.
    pub class: RequestClass,
    /// Computed tokens at scan time.
    pub num_computed_tokens: u64,
    /// Tokens scheduled in the step the report belongs to.
    pub num_scheduled_tokens: u64,
    /// Block tables at scan time.
    pub block_tables: Vec<Vec<BlockId>>,
}

/// Counters of a runtime since start. Each shard counts its events of a step into one of
/// these and the runtime sums them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Requests accepted by `submit`.
    pub submitted: u64,
    /// Ended finished.
    pub finished: u64,
    /// Ended failed.
    pub failed: u64,
    /// Ended cancelled.
    pub cancelled: u64,
    /// Loads dispatched (async and sync).
    pub loads_dispatched: u64,
    /// Async loads that completed ok.
    pub loads_ok: u64,
    /// Async loads that completed failed.
    pub loads_failed: u64,
    /// Completions for unknown, ended or superseded loads, ignored.
    pub stale_completions: u64,
    /// Reported blocks whose generation changed (freed and reused) or out of range, ignored.
    pub stale_blocks: u64,
    /// Blocks claimed for recompute.
    pub claims: u64,
    /// Owned blocks handed off because the owner ended first.
    pub handoffs: u64,
    /// Tokens rolled back by recovery.
    pub tokens_recomputed: u64,
    /// Requests preempted for lack of blocks.
    pub preemptions: u64,
    /// Connector panics caught by workers.
    pub connector_panics: u64,
    /// Commands (sampled, finish, cancel) naming no live request, ignored.
    pub unknown_commands: u64,
    /// Async loads that passed their deadline (counted in `loads_failed` too).
    pub deadlines_expired: u64,
    /// Completions of loads that had passed their deadline (counted in `stale_completions`).
    pub late_completions: u64,
    /// Sampled / finish commands repeated for one request in one step, applied once.
    pub duplicate_commands: u64,
    /// Queued loads whose deadline had passed when a worker took them: handed back unrun.
    pub loads_expired_unrun: u64,
    /// Loads still running when shutdown stopped waiting for them.
    pub loads_abandoned: u64,
    /// Admissions offered no external load because the request's retry budget was spent.
    pub retry_budget_skips: u64,
    /// Admissions offered no external load because the prefix was quarantined.
    pub quarantine_skips: u64,
    /// Times a prefix entered quarantine.
    pub prefixes_quarantined: u64,
    /// Steps run.
    pub steps: u64,
    /// Step outputs naming a step other than the latest plan's (their samples and invalid
    /// blocks ignored).
    pub stale_outputs: u64,
}

impl std::ops::AddAssign<&Metrics> for Metrics {
    fn add_assign(&mut self, other: &Metrics) {
        self.submitted += other.submitted;
        self.finished += other.finished;
        self.failed += other.failed;
        self.cancelled += other.cancelled;
        self.loads_dispatched += other.loads_dispatched;
        self.loads_ok += other.loads_ok;
        self.loads_failed += other.loads_failed;
        self.stale_completions += other.stale_completions;
        self.stale_blocks += other.stale_blocks;
        self.claims += other.claims;
        self.handoffs += other.handoffs;
        self.tokens_recomputed += other.tokens_recomputed;
        self.preemptions += other.preemptions;
        self.connector_panics += other.connector_panics;
        self.unknown_commands += other.unknown_commands;
        self.deadlines_expired += other.deadlines_expired;
        self.late_completions += other.late_completions;
        self.duplicate_commands += other.duplicate_commands;
        self.loads_expired_unrun += other.loads_expired_unrun;
        self.loads_abandoned += other.loads_abandoned;
        self.retry_budget_skips += other.retry_budget_skips;
        self.quarantine_skips += other.quarantine_skips;
        self.prefixes_quarantined += other.prefixes_quarantined;
        self.steps += other.steps;
        self.stale_outputs += other.stale_outputs;
    }
}

/// What a shard hands back from a step.
#[derive(Debug, Default)]
pub(crate) struct ShardStepResult {
    pub scheduled: Vec<ScheduledRequest>,
    pub recovered: Vec<RecoveredRequest>,
    pub scanned: Vec<ScannedRequest>,
    pub evicted: Vec<BlockId>,
    pub ended: Vec<(StdArc<str>, EndState)>,
    pub handoffs: Vec<BlockRef>,
    pub runnable_latency_ns: Vec<u64>,
    pub first_schedule_latency_ns: Vec<u64>,
    pub counters: Metrics,
}

/// The settings a step runs with (a snapshot; never changes mid-step).
#[derive(Clone, Debug)]
pub(crate) struct StepSettings {
    pub mode: Mode,
    pub policy: Policy,
    pub token_budget: u64,
    pub max_seqs: usize,
    pub record_inputs: bool,
    pub load_deadline: Option<Duration>,
    pub max_load_retries: u32,
    pub quarantine_after: u32,
    pub quarantine_for: Duration,
}

/// Shared, read-only context of the runtime, as a shard sees it.
pub(crate) struct Env<'a> {
    pub geo: &'a Geometry,
    pub pool: &'a BlockPool,
    pub claims: &'a ClaimTable,
    pub connector: &'a dyn KvConnector,
    pub quarantine: &'a Quarantine,
    pub shard: usize,
}

/// Which of the shard's requests hold each block: the claim phase scans only the holders of
/// reported blocks, so its cost follows the report, not the number of live requests.
#[derive(Debug, Default)]
struct HolderIndex {
    map: FxHashMap<BlockId, Holders>,
}

#[derive(Debug)]
enum Holders {
    One(u64),
    Many(Vec<u64>),
}

impl HolderIndex {
    fn add(&mut self, id: BlockId, seq: u64) {
        match self.map.get_mut(&id) {
            None => {
                self.map.insert(id, Holders::One(seq));
            }
            Some(h) => {
                let first = match h {
                    Holders::One(s) => *s,
                    Holders::Many(v) => {
                        v.push(seq);
                        return;
                    }
                };
                *h = Holders::Many(vec![first, seq]);
            }
        }
    }

    fn remove(&mut self, id: BlockId, seq: u64) {
        let empty = match self.map.get_mut(&id) {
            None => false,
            Some(Holders::One(s)) => *s == seq,
            Some(Holders::Many(v)) => {
                if let Some(i) = v.iter().position(|&x| x == seq) {
                    v.swap_remove(i);
                }
                v.is_empty()
            }
        };
        if empty {
            self.map.remove(&id);
        }
    }

    fn holders(&self, id: BlockId) -> &[u64] {
        match self.map.get(&id) {
            None => &[],
            Some(Holders::One(s)) => std::slice::from_ref(s),
            Some(Holders::Many(v)) => v,
        }
    }

    fn len(&self) -> usize {
        self.map
            .values()
            .map(|h| match h {
                Holders::One(_) => 1,
                Holders::Many(v) => v.len(),
            })
            .sum()
    }
}

/// One shard's requests.
#[derive(Debug, Default)]
pub(crate) struct Shard {
    reqs: FxHashMap<u64, Req>,
    by_id: FxHashMap<StdArc<str>, u64>,
    /// Canonical order (async-class key) of each phase.
    waiting: BTreeMap<RequestKey, ()>,
    loading: BTreeMap<RequestKey, ()>,
    running: BTreeMap<RequestKey, ()>,
    /// Steps run by this shard.
    step: u64,
    index: HolderIndex,
    /// Requests with something to apply after recovery: scheduled in the last step, named by a
    /// command, or recovered this step. Keeps that phase proportional to what changed.
    touched: Vec<u64>,
    /// Loading requests whose load completed this step.
    landed: Vec<u64>,
    /// Deadlines of in-flight async loads: (deadline, seq, attempt).
    deadlines: BinaryHeap<Reverse<(Instant, u64, u32)>>,
    /// Blocks of loads that passed their deadline, held (not freed, not read) until the late
    /// completion lands, so a worker still writing into them never writes into a reused block.
    parked: FxHashMap<(u64, u32), Vec<BlockRef>>,
    /// Blocks of loads still running when shutdown gave up waiting: held for good (a detached
    /// worker may still write them), reported.
    abandoned: Vec<BlockRef>,
    /// Per step scratch: hits of each scanned request.
    hits: Vec<(u64, RequestClass, Vec<Hit>)>,
    /// Hit buffers kept for reuse.
    spare_hits: Vec<Vec<Hit>>,
    result: ShardStepResult,
}

impl Shard {
    fn release_entry(env: &Env<'_>, id: BlockId, gen: Generation) {
        if id != env.geo.null_block() {
            let _ = env.pool.release(BlockRef {
                id,
                generation: gen,
            });
        }
    }

    /// Releases every block of `r` and hands off the blocks it owned but did not recompute.
    fn release_all(env: &Env<'_>, r: &mut Req, res: &mut ShardStepResult, index: &mut HolderIndex) {
        let key = r.key;
        let null = env.geo.null_block();
        for &id in r.tables.iter().flatten() {
            if id != null {
                index.remove(id, key.seq());
            }
        }
        r.sync_job = None;
        for id in r.owned_pending.drain(..) {
            env.claims.orphan(id, key);
            if let Some(generation) = env.pool.generation(id) {
                res.handoffs.push(BlockRef { id, generation });
                res.counters.handoffs += 1;
            }
        }
        for (t, g) in r.tables.iter_mut().zip(r.gens.iter_mut()) {
            for (&id, &gen) in t.iter().zip(g.iter()) {
                Self::release_entry(env, id, gen);
            }
            t.clear();
            g.clear();
        }
        for reg in &mut r.registered {
            *reg = 0;
        }
        r.waits.clear();
    }

    fn end(&mut self, env: &Env<'_>, seq: u64, state: EndState) {
        if let Some(mut r) = self.reqs.remove(&seq) {
            self.waiting.remove(&r.key);
            self.loading.remove(&r.key);
            self.running.remove(&r.key);
            self.by_id.remove(&r.id);
            Self::release_all(env, &mut r, &mut self.result, &mut self.index);
            self.result.ended.push((r.id.clone(), state));
        }
    }

    fn set_phase(&mut self, seq: u64, phase: Phase) {
        let Some(r) = self.reqs.get_mut(&seq) else {
            return;
        };
        let k = r.key;
        match r.phase {
            Phase::Waiting => self.waiting.remove(&k),
            Phase::Loading => self.loading.remove(&k),
            Phase::Running => self.running.remove(&k),
        };
        r.phase = phase;
        match phase {
            Phase::Waiting => self.waiting.insert(k, ()),
            Phase::Loading => self.loading.insert(k, ()),
            Phase::Running => self.running.insert(k, ()),
        };
    }

    /// Phase 1: commands, completions, and this shard's share of the report (returned; the
    /// claim words of those blocks are reset).
    pub fn publish(
        &mut self,
        env: &Env<'_>,
        settings: &StepSettings,
        now: Instant,
        commands: impl IntoIterator<Item = Command>,
        completions: impl IntoIterator<Item = Completion>,
    ) -> Vec<BlockId> {
        self.result = ShardStepResult::default();
        self.step += 1;
        for cmd in commands {
            match cmd {
                Command::Submit(n) => {
                    let seq = n.key.seq();
                    let groups = env.geo.groups();
                    let hashes = groups
                        .iter()
                        .enumerate()
                        .map(|(g, grp)| {
                            let mut parent = 0u64;
                            n.prompt
                                .chunks_exact(grp.block_size as usize)
                                .map(|c| {
                                    parent = crate::pool::chain_hash(parent, g, c);
                                    parent
                                })
                                .collect()
                        })
                        .collect();
                    let req = Req {
                        id: n.id.clone(),
                        key: n.key,
                        prompt: n.prompt,
                        max_new_tokens: n.max_new_tokens,
                        generated: 0,
                        hashes,
                        tables: vec![Vec::new(); groups.len()],
                        gens: vec![Vec::new(); groups.len()],
                        registered: vec![0; groups.len()],
                        num_computed_tokens: 0,
                        last_scheduled: 0,
                        phase: Phase::Waiting,
                        waits: Vec::new(),
                        waits_step: 0,
                        owned_pending: Vec::new(),
                        attempt: 0,
                        load_start: 0,
                        load_end: 0,
                        timed_out: false,
                        load_failures: 0,
                        prefix_key: None,
                        load_deadline: n.load_deadline,
                        load_cap: u64::MAX,
                        load_done: None,
                        end_after_load: None,
                        sync_job: None,
                        submitted_at: n.submitted_at,
                        first_scheduled: false,
                        sampled_pending: false,
                        finish_pending: false,
                        skip: false,
                    };
                    self.by_id.insert(n.id, seq);
                    self.waiting.insert(req.key, ());
                    self.reqs.insert(seq, req);
                }
                Command::Cancel(id) => match self.by_id.get(&id).copied() {
                    Some(seq) => {
                        let loading = self
                            .reqs
                            .get(&seq)
                            .is_some_and(|r| r.phase == Phase::Loading);
                        if loading {
                            if let Some(r) = self.reqs.get_mut(&seq) {
                                r.end_after_load = Some(EndState::Cancelled);
                            }
                        } else {
                            self.end(env, seq, EndState::Cancelled);
                        }
                    }
                    None => self.result.counters.unknown_commands += 1,
                },
                Command::Sampled(id) => {
                    match self.by_id.get(&id).and_then(|s| self.reqs.get_mut(s)) {
                        Some(r) if r.phase == Phase::Running && r.last_scheduled > 0 => {
                            if std::mem::replace(&mut r.sampled_pending, true) {
                                self.result.counters.duplicate_commands += 1;
                            }
                        }
                        _ => self.result.counters.unknown_commands += 1,
                    }
                }
                Command::Finish(id) => match self.by_id.get(&id).and_then(|s| self.reqs.get_mut(s))
                {
                    Some(r) => {
                        if std::mem::replace(&mut r.finish_pending, true) {
                            self.result.counters.duplicate_commands += 1;
                        }
                        self.touched.push(r.key.seq());
                    }
                    None => self.result.counters.unknown_commands += 1,
                },
            }
        }
        let mut published = Vec::new();
        for c in completions {
            let seq = c.key.seq();
            if c.panicked {
                self.result.counters.connector_panics += 1;
            }
            // A load that passed its deadline: its blocks were parked; now they can go.
            if let Some(blocks) = self.parked.remove(&(seq, c.attempt)) {
                // Planted bug for the fault matrix: a late completion forgets its parked blocks.
                #[cfg(not(kvsched_plant = "late-leak"))]
                for b in blocks {
                    let _ = env.pool.release(b);
                }
                #[cfg(kvsched_plant = "late-leak")]
                drop(blocks);
                self.result.counters.late_completions += 1;
                self.result.counters.stale_completions += 1;
                continue;
            }
            let Some(r) = self.reqs.get_mut(&seq) else {
                self.result.counters.stale_completions += 1;
                continue;
            };
            if r.phase != Phase::Loading || r.attempt != c.attempt || r.load_done.is_some() {
                self.result.counters.stale_completions += 1;
                continue;
            }
            // Planted bug for the fault matrix: a connector panic taken for a successful load.
            #[cfg(kvsched_plant = "panic-ok")]
            let c = Completion {
                result: if c.panicked { LoadResult::Ok } else { c.result },
                ..c
            };
            match c.result {
                LoadResult::Ok => {
                    self.result.counters.loads_ok += 1;
                    r.load_done = Some((true, c.finished_at));
                    self.landed.push(seq);
                    if let Some(k) = r.prefix_key {
                        env.quarantine.record_success(k);
                    }
                }
                LoadResult::Failed(bad) => {
                    Self::load_failed(
                        env,
                        settings,
                        now,
                        r,
                        c.finished_at,
                        &mut self.result.counters,
                    );
                    self.landed.push(seq);
                    for b in bad.into_flat() {
                        if b.id != env.geo.null_block() && env.pool.is_current(b) {
                            published.push(b.id);
                        } else {
                            self.result.counters.stale_blocks += 1;
                        }
                    }
                }
            }
        }
        // Loads past their deadline fail for all their blocks.
        while let Some(&Reverse((at, seq, attempt))) = self.deadlines.peek() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            if r.phase != Phase::Loading || r.attempt != attempt || r.load_done.is_some() {
                continue; // landed in time, or superseded
            }
            self.result.counters.deadlines_expired += 1;
            r.timed_out = true;
            Self::load_failed(env, settings, now, r, now, &mut self.result.counters);
            self.landed.push(seq);
            let null = env.geo.null_block();
            for (grp, t) in env.geo.groups().iter().zip(&r.tables) {
                let lo = (r.load_start / grp.block_size) as usize;
                let hi = (grp.blocks_for_tokens(r.load_end) as usize).min(t.len());
                published.extend(
                    t.get(lo..hi)
                        .unwrap_or(&[])
                        .iter()
                        .copied()
                        .filter(|&id| id != null),
                );
            }
        }
        for &id in &published {
            env.claims.reset(id);
        }
        published
    }

    /// Bookkeeping of a failed async load (its completion said so, or its deadline passed):
    /// the request's retry budget and its prefix's quarantine streak.
    fn load_failed(
        env: &Env<'_>,
        settings: &StepSettings,
        now: Instant,
        r: &mut Req,
        at: Instant,
        counters: &mut Metrics,
    ) {
        counters.loads_failed += 1;
        r.load_done = Some((false, at));
        r.load_failures += 1;
        if let Some(k) = r.prefix_key {
            if env.quarantine.record_failure(
                k,
                now,
                settings.quarantine_after,
                settings.quarantine_for,
            ) {
                counters.prefixes_quarantined += 1;
            }
        }
    }

    /// Moves the blocks of a timed-out load out of `r`'s tables into the parked set (held
    /// until the late completion lands) and returns the emptied positions.
    fn park_timed_out(&mut self, env: &Env<'_>, seq: u64) -> Vec<(usize, usize)> {
        let Some(r) = self.reqs.get_mut(&seq) else {
            return Vec::new();
        };
        r.timed_out = false;
        let null = env.geo.null_block();
        let mut holes = Vec::new();
        let mut parked = Vec::new();
        for (g, grp) in env.geo.groups().iter().enumerate() {
            let lo = (r.load_start / grp.block_size) as usize;
            let hi = (grp.blocks_for_tokens(r.load_end) as usize).min(r.tables[g].len());
            for i in lo..hi {
                let id = r.tables[g][i];
                if id == null {
                    continue;
                }
                self.index.remove(id, seq);
                if let Some(p) = r.owned_pending.iter().position(|&x| x == id) {
                    r.owned_pending.swap_remove(p);
                    env.claims.forget(id);
                }
                parked.push(BlockRef {
                    id,
                    generation: r.gens[g][i],
                });
                r.tables[g][i] = null;
                r.gens[g][i] = 0;
                holes.push((g, i));
            }
        }
        if !parked.is_empty() {
            self.parked.insert((seq, r.attempt), parked);
        }
        holes
    }

    /// Phase 2: scans the loading (async) and running (sync) requests that hold a reported
    /// block (found through the holder index) against the step's whole report and claims
    /// each hit. With `record_inputs`, every scannable request's inputs are recorded too, so a
    /// differential check also covers requests the index would have missed.
    pub fn claim(
        &mut self,
        env: &Env<'_>,
        settings: &StepSettings,
        report: &InvalidSet,
        report_ids: &[BlockId],
    ) {
        self.hits.clear();
        if settings.record_inputs {
            for key in self.loading.keys().chain(self.running.keys()) {
                let Some(r) = self.reqs.get(&key.seq()) else {
                    continue;
                };
                let Some(view) = r.view() else { continue };
                self.result.scanned.push(ScannedRequest {
                    id: r.id.clone(),
                    key: r.key.with_sync(view.class == RequestClass::Sync),
                    class: view.class,
                    num_computed_tokens: view.num_computed_tokens,
                    num_scheduled_tokens: view.num_scheduled_tokens,
                    block_tables: r.tables.clone(),
                });
            }
        }
        let mut candidates: Vec<u64> = report_ids
            .iter()
            .flat_map(|&id| self.index.holders(id))
            .copied()
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        for seq in candidates {
            let Some(r) = self.reqs.get(&seq) else {
                continue;
            };
            let Some(view) = r.view() else { continue };
            let mut hits = self.spare_hits.pop().unwrap_or_default();
            hits.clear();
            recovery::scan_request(env.geo, view, report, &mut hits);
            if hits.is_empty() {
                self.spare_hits.push(hits);
                continue;
            }
            let class_key = r.key.with_sync(view.class == RequestClass::Sync);
            let scan = scan_of(settings.mode, view.class);
            for h in &hits {
                env.claims.claim(h.block, scan, class_key);
            }
            self.hits.push((seq, view.class, hits));
        }
    }

    /// Whether the holder index lists exactly the non-null entries of every request.
    pub fn index_consistent(&self, null: BlockId) -> bool {
        let mut n = 0;
        for (seq, r) in &self.reqs {
            for &id in r.tables.iter().flatten() {
                if id != null {
                    n += 1;
                    if !self.index.holders(id).contains(seq) {
                        return false;
                    }
                }
            }
        }
        n == self.index.len()
    }

    /// Phase 3: decide, apply the last step's output, admit, schedule. While `draining`
    /// (shutdown) nothing is admitted or scheduled.
    pub fn finish_step(
        &mut self,
        env: &Env<'_>,
        settings: &StepSettings,
        now: Instant,
        draining: bool,
        loads_out: &mut Vec<LoadJob>,
    ) -> ShardStepResult {
        self.decide(env, settings);
        self.apply_outputs(env);
        self.land_loads(env, now);
        if !draining {
            self.admit(env, settings, now, loads_out);
            self.schedule(env, settings, now);
        }
        std::mem::take(&mut self.result)
    }

    fn decide(&mut self, env: &Env<'_>, settings: &StepSettings) {
        let hits = std::mem::take(&mut self.hits);
        let mut owners = Vec::new();
        for (seq, class, hits) in &hits {
            let Some(r) = self.reqs.get_mut(seq) else {
                continue;
            };
            let Some(view) = r.view() else { continue };
            let key = r.key.with_sync(*class == RequestClass::Sync);
            let scan = scan_of(settings.mode, *class);
            owners.clear();
            owners.extend(hits.iter().map(|h| match env.claims.winner(h.block, scan) {
                Some(w) if w != key => HitOwner::Other(w),
                _ => HitOwner::Mine,
            }));
            let d = recovery::decide(env.geo, settings.mode, settings.policy, view, hits, &owners);
            self.result.counters.claims += d.claimed_blocks.len() as u64;
            self.result.counters.tokens_recomputed += d.affected_tokens;
            for &id in &d.evicted_blocks {
                env.pool.evict(id);
            }
            self.result.evicted.extend_from_slice(&d.evicted_blocks);
            r.waits = d.waits_for.iter().map(|(b, _)| *b).collect();
            r.waits_step = self.step;
            let nct = d.num_computed_tokens;
            match d.disposition {
                Disposition::Unaffected => {}
                Disposition::Failed => {}
                Disposition::FailedRecving => {
                    r.load_cap = r.load_cap.min(nct);
                    r.num_computed_tokens = r.num_computed_tokens.min(nct);
                }
                Disposition::Skip => {
                    r.num_computed_tokens = nct;
                    r.skip = true;
                }
            }
            if d.disposition != Disposition::Failed {
                // Rolled back: entries at or past the boundary are rewritten and registered
                // again once recomputed.
                for (reg, grp) in r.registered.iter_mut().zip(env.geo.groups()) {
                    *reg = (*reg).min((r.num_computed_tokens / grp.block_size) as usize);
                }
                if settings.mode == Mode::Safe && settings.policy == Policy::Recompute {
                    for &b in &d.claimed_blocks {
                        env.claims.set_pending(b, r.key);
                        if !r.owned_pending.contains(&b) {
                            r.owned_pending.push(b);
                        }
                    }
                }
            }
            let failed = d.disposition == Disposition::Failed;
            self.touched.push(*seq);
            self.result.recovered.push(RecoveredRequest {
                id: r.id.clone(),
                key,
                class: *class,
                decision: d,
            });
            if failed {
                if r.phase == Phase::Loading && r.load_done.is_none() {
                    r.end_after_load = Some(EndState::Failed);
                } else {
                    self.end(env, *seq, EndState::Failed);
                }
            }
        }
        self.hits = hits;
        for (_, _, h) in self.hits.drain(..) {
            self.spare_hits.push(h);
        }
    }

    /// Applies the engine's output for the last step: sampled tokens (unless recovery
    /// discarded the step), engine finishes, owners' recomputed blocks.
    fn apply_outputs(&mut self, env: &Env<'_>) {
        let mut seqs = std::mem::take(&mut self.touched);
        seqs.sort_unstable();
        seqs.dedup();
        let mut not_running = Vec::new();
        for seq in seqs {
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            if r.phase != Phase::Running {
                if r.finish_pending {
                    not_running.push(seq);
                }
                continue;
            }
            let skip = std::mem::take(&mut r.skip);
            let sampled = std::mem::take(&mut r.sampled_pending);
            let finish = std::mem::take(&mut r.finish_pending);
            r.last_scheduled = 0;
            if !skip {
                if sampled {
                    r.generated += 1;
                }
                Self::confirm_progress(env, r, &mut self.index);
            }
            if finish
                || (!skip && r.generated >= r.max_new_tokens && r.max_new_tokens > 0 && sampled)
            {
                self.end(env, seq, EndState::Finished);
            }
        }
        // Engine finishes of requests not running (loading/waiting): applied too.
        for seq in not_running {
            if let Some(r) = self.reqs.get_mut(&seq) {
                r.finish_pending = false;
                // Planted bug for the fault matrix: end a loading request at once, freeing
                // blocks a worker may still be filling.
                #[cfg(not(kvsched_plant = "end-while-loading"))]
                if r.phase == Phase::Loading && r.load_done.is_none() {
                    r.end_after_load = Some(EndState::Finished);
                    continue;
                }
            }
            self.end(env, seq, EndState::Finished);
        }
    }

    /// The computed length is confirmed (the step ran and was not discarded): clear pending
    /// marks of recomputed owned blocks, register full prompt blocks, trim nullable entries.
    fn confirm_progress(env: &Env<'_>, r: &mut Req, index: &mut HolderIndex) {
        let nct = r.num_computed_tokens;
        let key = r.key;
        let groups = env.geo.groups();
        r.owned_pending.retain(|&id| {
            // Find the block's end in whichever group holds it.
            let done = r.tables.iter().zip(groups).any(|(t, grp)| {
                t.iter()
                    .position(|&x| x == id)
                    .is_some_and(|i| (i as u64 + 1) * grp.block_size <= nct)
            });
            if done {
                env.claims.clear_pending(id, key);
            }
            !done
        });
        Self::register_and_trim(env, r, index);
    }

    fn register_and_trim(env: &Env<'_>, r: &mut Req, index: &mut HolderIndex) {
        let nct = r.num_computed_tokens;
        let null = env.geo.null_block();
        for (g, grp) in env.geo.groups().iter().enumerate() {
            let full = ((nct / grp.block_size) as usize)
                .min(r.hashes[g].len())
                .min(r.tables[g].len());
            while r.registered[g] < full {
                let i = r.registered[g];
                let id = r.tables[g][i];
                if id != null {
                    let _ = env.pool.register(
                        r.hashes[g][i],
                        BlockRef {
                            id,
                            generation: r.gens[g][i],
                        },
                    );
                }
                r.registered[g] += 1;
            }
            let nullable = (grp.nullable_below(nct) as usize).min(r.tables[g].len());
            for i in 0..nullable {
                let id = r.tables[g][i];
                if id != null {
                    Self::release_entry(env, id, r.gens[g][i]);
                    index.remove(id, r.key.seq());
                    r.tables[g][i] = null;
                    r.gens[g][i] = 0;
                }
            }
        }
    }

    /// Loading requests whose load landed this step become runnable (or restart at 0).
    fn land_loads(&mut self, env: &Env<'_>, now: Instant) {
        let mut seqs = std::mem::take(&mut self.landed);
        seqs.sort_unstable();
        for seq in seqs {
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            if r.phase != Phase::Loading {
                continue;
            }
            let Some((_ok, finished_at)) = r.load_done.take() else {
                continue;
            };
            let holes = if r.timed_out {
                self.park_timed_out(env, seq)
            } else {
                Vec::new()
            };
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            if let Some(state) = r.end_after_load.take() {
                self.end(env, seq, state);
                continue;
            }
            r.num_computed_tokens = r.num_computed_tokens.min(r.load_cap);
            r.load_cap = u64::MAX;
            // Refill the parked positions with fresh blocks (they are recomputed).
            if r.num_computed_tokens > 0 && !holes.is_empty() {
                let mut fresh = Vec::with_capacity(holes.len());
                if env.pool.allocate_n(holes.len(), &mut fresh) {
                    for (&(g, i), b) in holes.iter().zip(fresh) {
                        r.tables[g][i] = b.id;
                        r.gens[g][i] = b.generation;
                        self.index.add(b.id, seq);
                    }
                } else {
                    r.num_computed_tokens = 0; // no room: start over
                }
            }
            if r.num_computed_tokens == 0 {
                // Start over: free everything, admit again.
                Self::release_all(env, r, &mut self.result, &mut self.index);
                r.attempt += 1;
                self.set_phase(seq, Phase::Waiting);
                continue;
            }
            Self::register_and_trim(env, r, &mut self.index);
            self.result
                .runnable_latency_ns
                .push(now.saturating_duration_since(finished_at).as_nanos() as u64);
            self.set_phase(seq, Phase::Running);
        }
    }

    /// Longest usable local prefix (a multiple of `S`, below the prompt's end), retained.
    fn local_prefix(env: &Env<'_>, r: &Req) -> (u64, Vec<Vec<(BlockId, Generation)>>) {
        let geo = env.geo;
        let groups = geo.groups();
        let limit = (r.prompt.len() as u64).saturating_sub(1);
        let mut cap = geo.round_down_to_s(limit);
        // Full-attention-like groups need every entry below L.
        for (g, grp) in groups.iter().enumerate() {
            if matches!(
                grp.kind,
                GroupKind::FullAttention
                    | GroupKind::Mamba {
                        mode: MambaMode::All
                    }
            ) {
                let n = r.hashes[g]
                    .iter()
                    .take_while(|&&h| probe(env.pool, h))
                    .count() as u64;
                cap = cap.min(n * grp.block_size);
            }
        }
        let mut l = geo.round_down_to_s(cap);
        let mut tries = 0;
        while l > 0 && tries < 8 {
            tries += 1;
            let mut got: Vec<Vec<(BlockId, Generation)>> = vec![Vec::new(); groups.len()];
            let mut ok = true;
            'groups: for (g, grp) in groups.iter().enumerate() {
                let n = (l / grp.block_size) as usize;
                let nullable = grp.nullable_below(l) as usize;
                for i in 0..n {
                    if i < nullable {
                        got[g].push((geo.null_block(), 0));
                        continue;
                    }
                    match r.hashes[g].get(i).and_then(|&h| env.pool.lookup(h)) {
                        Some(b) => got[g].push((b.id, b.generation)),
                        None => {
                            ok = false;
                            break 'groups;
                        }
                    }
                }
            }
            if ok {
                return (l, got);
            }
            for t in got {
                for (id, gen) in t {
                    Self::release_entry(env, id, gen);
                }
            }
            l -= geo.scheduler_block_size();
        }
        (0, vec![Vec::new(); groups.len()])
    }

    fn admit(
        &mut self,
        env: &Env<'_>,
        settings: &StepSettings,
        now: Instant,
        loads_out: &mut Vec<LoadJob>,
    ) {
        let geo = env.geo;
        let mut admitted = 0usize;
        let mut cursor = None;
        while let Some(key) = next_key(&self.waiting, cursor) {
            cursor = Some(key);
            if admitted >= settings.max_seqs {
                break;
            }
            let seq = key.seq();
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            debug_assert!(
                r.tables.iter().all(Vec::is_empty),
                "a waiting request holds blocks"
            );
            let (local, mut got) = Self::local_prefix(env, r);
            // The prefix the connector would load from: the chained hash of group 0's first
            // block past the local hit (the same for every request sharing that prefix).
            let b0 = geo.groups()[0].block_size;
            r.prefix_key = r.hashes[0].get((local / b0) as usize).copied();
            let offer_external = if r.load_failures >= settings.max_load_retries {
                self.result.counters.retry_budget_skips += 1;
                false
            } else if r
                .prefix_key
                .is_some_and(|k| env.quarantine.is_quarantined(k, now))
            {
                self.result.counters.quarantine_skips += 1;
                false
            } else {
                true
            };
            let look = if !offer_external {
                crate::connector::LookupResult::default()
            } else {
                env.connector.lookup(LookupQuery {
                    request: &r.id,
                    prompt: &r.prompt,
                    local_tokens: local,
                })
            };
            let limit = geo.round_down_to_s((r.prompt.len() as u64).saturating_sub(1));
            let ext_end = geo
                .round_down_to_s(local.saturating_add(look.external_tokens))
                .clamp(local, limit.max(local));
            // Allocate the rest of the prompt in every group.
            let mut fresh: Vec<BlockRef> = Vec::new();
            let need: usize = geo
                .groups()
                .iter()
                .zip(&got)
                .map(|(grp, t)| {
                    (grp.blocks_for_tokens(r.prompt.len() as u64) as usize).saturating_sub(t.len())
                })
                .sum();
            if !env.pool.allocate_n(need, &mut fresh) {
                for t in got {
                    for (id, gen) in t {
                        Self::release_entry(env, id, gen);
                    }
                }
                break; // pool exhausted: admit again next step
            }
            let mut fresh = fresh.into_iter();
            for (g, grp) in geo.groups().iter().enumerate() {
                let total = grp.blocks_for_tokens(r.prompt.len() as u64) as usize;
                while got[g].len() < total {
                    if let Some(b) = fresh.next() {
                        got[g].push((b.id, b.generation));
                    }
                }
                for &(id, _) in &got[g] {
                    if id != geo.null_block() {
                        self.index.add(id, seq);
                    }
                }
                r.tables[g] = got[g].iter().map(|x| x.0).collect();
                r.gens[g] = got[g].iter().map(|x| x.1).collect();
                r.registered[g] = (local / grp.block_size) as usize;
            }
            got.clear();
            r.num_computed_tokens = ext_end;
            admitted += 1;
            if ext_end > local {
                r.attempt += 1;
                let job = LoadJob {
                    request: r.id.clone(),
                    owner: LoadOwner {
                        shard: env.shard,
                        key: r.key.raw(),
                    },
                    attempt: r.attempt,
                    start_tokens: local,
                    end_tokens: ext_end,
                    block_tables: r
                        .tables
                        .iter()
                        .zip(&r.gens)
                        .map(|(t, g)| {
                            t.iter()
                                .zip(g)
                                .map(|(&id, &generation)| BlockRef { id, generation })
                                .collect()
                        })
                        .collect(),
                    block_sizes: geo.groups().iter().map(|g| g.block_size).collect(),
                    deadline: None,
                };
                self.result.counters.loads_dispatched += 1;
                if look.load_async {
                    r.load_start = local;
                    r.load_end = ext_end;
                    r.load_cap = u64::MAX;
                    let mut job = job;
                    if let Some(d) = r.load_deadline.or(settings.load_deadline) {
                        job.deadline = Some(now + d);
                        self.deadlines.push(Reverse((now + d, seq, r.attempt)));
                    }
                    loads_out.push(job);
                    self.set_phase(seq, Phase::Loading);
                } else {
                    r.sync_job = Some(job);
                    self.set_phase(seq, Phase::Running);
                }
            } else {
                Self::register_and_trim(env, r, &mut self.index);
                self.set_phase(seq, Phase::Running);
            }
        }
    }

    /// Makes room in the tables of `r` for `upto` computed tokens.
    fn grow(env: &Env<'_>, r: &mut Req, upto: u64, index: &mut HolderIndex) -> bool {
        let groups = env.geo.groups();
        let need: usize = groups
            .iter()
            .zip(&r.tables)
            .map(|(grp, t)| (grp.blocks_for_tokens(upto) as usize).saturating_sub(t.len()))
            .sum();
        if need == 0 {
            return true;
        }
        let mut fresh = Vec::with_capacity(need);
        if !env.pool.allocate_n(need, &mut fresh) {
            return false;
        }
        let mut fresh = fresh.into_iter();
        for (g, grp) in groups.iter().enumerate() {
            while (r.tables[g].len() as u64) < grp.blocks_for_tokens(upto) {
                if let Some(b) = fresh.next() {
                    r.tables[g].push(b.id);
                    index.add(b.id, r.key.seq());
                    r.gens[g].push(b.generation);
                }
            }
        }
        true
    }

    fn schedule(&mut self, env: &Env<'_>, settings: &StepSettings, now: Instant) {
        let mut budget = settings.token_budget;
        let mut seqs_left = settings.max_seqs;
        let mut cursor = None;
        while let Some(key) = next_key(&self.running, cursor) {
            cursor = Some(key);
            if budget == 0 || seqs_left == 0 {
                break;
            }
            let seq = key.seq();
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            if r.phase != Phase::Running {
                continue; // preempted earlier in this loop
            }
            // Sharers wait for owners (mode `safe`): never scheduled to read a pending block.
            if r.waits_step == self.step && !r.waits.is_empty() {
                continue;
            }
            r.waits.retain(|&b| env.claims.pending_owner(b).is_some());
            if !r.waits.is_empty() {
                continue;
            }
            let remaining = r.seq_len().saturating_sub(r.num_computed_tokens);
            let n = remaining.min(budget);
            if n == 0 {
                continue;
            }
            let upto = r.num_computed_tokens + n;
            if !Self::grow(env, r, upto, &mut self.index) {
                // Preempt the latest running request of this shard, if it is not this one.
                let victim = self.running.keys().next_back().copied();
                match victim {
                    Some(v) if v != key => {
                        self.preempt(env, v.seq());
                        self.result.counters.preemptions += 1;
                    }
                    _ => {}
                }
                let Some(r) = self.reqs.get_mut(&seq) else {
                    continue;
                };
                if !Self::grow(env, r, upto, &mut self.index) {
                    continue;
                }
            }
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            let first = !r.first_scheduled;
            if first {
                r.first_scheduled = true;
                self.result
                    .first_schedule_latency_ns
                    .push(now.saturating_duration_since(r.submitted_at).as_nanos() as u64);
            }
            let sync_load = r.sync_job.take();
            self.result.scheduled.push(ScheduledRequest {
                id: r.id.clone(),
                key: r.key,
                num_computed_tokens: r.num_computed_tokens,
                num_tokens: n,
                samples: upto == r.seq_len(),
                sync_load,
                first,
            });
            r.num_computed_tokens = upto;
            r.last_scheduled = n;
            self.touched.push(seq);
            budget -= n;
            seqs_left -= 1;
        }
    }

    fn preempt(&mut self, env: &Env<'_>, seq: u64) {
        if let Some(r) = self.reqs.get_mut(&seq) {
            Self::release_all(env, r, &mut self.result, &mut self.index);
            r.num_computed_tokens = 0;
            r.last_scheduled = 0;
            r.sync_job = None;
            self.set_phase(seq, Phase::Waiting);
        }
    }

    /// Ends every request (shutdown): loading ones only once their load is known finished by
    /// the caller. Returns how many were cancelled.
    pub fn cancel_all(
        &mut self,
        env: &Env<'_>,
        workers_finished: bool,
        never_started: &rustc_hash::FxHashSet<(u64, u32)>,
    ) -> ShardStepResult {
        self.result = ShardStepResult::default();
        // Once every worker finished no load can still write into parked blocks; otherwise a
        // parked (timed-out) load may still be running: its blocks stay held.
        for ((seq, attempt), blocks) in self.parked.drain() {
            if workers_finished || never_started.contains(&(seq, attempt)) {
                for b in blocks {
                    let _ = env.pool.release(b);
                }
            } else {
                self.result.counters.loads_abandoned += 1;
                self.abandoned.extend(blocks);
            }
        }
        self.deadlines.clear();
        if !workers_finished {
            // Loads still in flight: take their blocks out of the requests before ending them.
            let in_flight: Vec<u64> = self
                .reqs
                .iter()
                .filter(|(seq, r)| {
                    r.phase == Phase::Loading
                        && r.load_done.is_none()
                        && !never_started.contains(&(**seq, r.attempt))
                })
                .map(|(seq, _)| *seq)
                .collect();
            let null = env.geo.null_block();
            for seq in in_flight {
                let Some(r) = self.reqs.get_mut(&seq) else {
                    continue;
                };
                for (t, g) in r.tables.iter_mut().zip(r.gens.iter_mut()) {
                    for (id, gen) in t.iter_mut().zip(g.iter_mut()) {
                        if *id != null {
                            self.index.remove(*id, seq);
                            self.abandoned.push(BlockRef {
                                id: *id,
                                generation: *gen,
                            });
                            *id = null;
                        }
                    }
                }
                self.result.counters.loads_abandoned += 1;
            }
        }
        let seqs: Vec<u64> = self.reqs.keys().copied().collect();
        for seq in seqs {
            self.end(env, seq, EndState::Cancelled);
        }
        std::mem::take(&mut self.result)
    }

    /// Blocks each live request holds a reference on, for invariant checks.
    pub fn held_blocks(&self, null: BlockId) -> Vec<BlockId> {
        self.parked
            .values()
            .flatten()
            .chain(&self.abandoned)
            .map(|b| b.id)
            .chain(self.held_by_requests(null))
            .collect()
    }

    fn held_by_requests(&self, null: BlockId) -> Vec<BlockId> {
        self.reqs
            .values()
            .flat_map(|r| {
                r.tables
                    .iter()
                    .flatten()
                    .copied()
                    .filter(move |&id| id != null)
            })
            .collect()
    }
}

/// The first key after `after` (the first key when `None`): a cursor that stays valid while
/// the loop body moves requests between phases.
fn next_key(set: &BTreeMap<RequestKey, ()>, after: Option<RequestKey>) -> Option<RequestKey> {
    match after {
        None => set.keys().next().copied(),
        Some(k) => set.range((Excluded(k), Unbounded)).next().map(|(k, _)| *k),
    }
}

/// Whether `hash` is in the prefix cache (a hint: it may be gone by the time it is looked up).
fn probe(pool: &BlockPool, hash: BlockHash) -> bool {
    pool.contains_hash(hash)
}

fn scan_of(mode: Mode, class: RequestClass) -> Scan {
    match (mode, class) {
        (Mode::Vllm, RequestClass::Sync) => Scan::Sync,
        _ => Scan::Async,
    }
}
