//! A shard: the requests it owns and the per-step work on them (docs/runtime.md, "The step" and
//! "Invariants"). A shard's state is touched only by the thread running its step; everything else
//! reaches it through its lock-free inbox and completion queue, the claim table and the pool.
//!
//! The step is split into phases separated by barriers across all shards:
//!
//! 1. [`Shard::publish`]: take commands, drain completions, publish this shard's share of the
//!    step's report (and reset those blocks' claim words);
//! 2. [`Shard::claim`]: scan own requests against the whole report, one `fetch_min` per hit;
//! 3. [`Shard::finish_step`]: decide with ownership from the claim table, apply the last step's
//!    output, admit, allocate, dispatch loads, pick runnable requests within the budget.
//!
//! Each mechanism of a step is an `impl Shard` block in its own file: `commands` (the
//! engine's commands) and `completions` (load completions and deadlines) feed phase 1;
//! `claim` scans in phase 2 and decides at the start of phase 3; then `outputs` (the last
//! step's output), `land` (landed loads), `admit` (with `load_choice`: how much of a lookup
//! hit it loads) and `schedule`, in the order `step_order` gives each mode. `end` ends
//! requests and releases what they hold; `holders` indexes who holds each block. `strategy`
//! is how a shard reaches the pool and claim table it shares: the runtime's lock-free ones,
//! or the mutex baseline's plain ones.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::connector::{KvConnector, LoadJob};
use crate::pool::BlockRef;
use crate::rules::geometry::{BlockId, CacheGroup, Geometry, GroupKind, MambaMode};
use crate::rules::recovery::{Hit, Mode, Policy, RequestClass};
use crate::runtime::claim::RequestKey;
use crate::runtime::load_estimate::LoadEstimate;
use crate::runtime::policy::load_cost::LoadPolicy;
use crate::runtime::quarantine::Quarantine;
use crate::runtime::settings::Settings;
use crate::runtime::worker::Completion;

mod admit;
mod claim;
mod commands;
mod completions;
#[cfg(all(test, not(kvsched_loom)))]
mod deadline_tests;
mod deadlines;
mod end;
mod holders;
mod land;
mod load_choice;
mod metrics;
mod outputs;
#[cfg(test)]
mod release_tests;
mod request;
mod schedule;
mod scheduled;
mod step_order;
pub mod strategy;
mod unconfirmed;

use deadlines::Deadlines;
use holders::HolderIndex;
pub use metrics::Metrics;
pub use request::{Command, NewRequest, PreparedPrompt};
use request::{Phase, Req};
pub use scheduled::{BlockTable, EndState, RecoveredRequest, ScannedRequest, ScheduledRequest};
use strategy::{Claims, LockFree, Strategy};

/// What a shard hands back from a step.
#[derive(Debug, Default)]
pub struct ShardStepResult {
    /// The requests it scheduled, in canonical order.
    pub scheduled: Vec<ScheduledRequest>,
    /// The requests recovery decided on.
    pub recovered: Vec<RecoveredRequest>,
    /// Every scannable request's inputs (with `record_inputs`).
    pub scanned: Vec<ScannedRequest>,
    /// Blocks its decisions evicted from the prefix cache.
    pub evicted: Vec<BlockId>,
    /// The requests that ended, and how.
    pub ended: Vec<(StdArc<str>, EndState)>,
    /// Blocks owners left unrecomputed while another request holds them: the next step's
    /// report.
    pub handoffs: Vec<BlockRef>,
    /// Landed load → runnable latencies.
    pub runnable_latency_ns: Vec<u64>,
    /// Submit → first schedule latencies.
    pub first_schedule_latency_ns: Vec<u64>,
    /// What it counted (its requests' ends are in `ended`, not here).
    pub counters: Metrics,
    /// Requests waiting for an async load at the end of the step.
    pub loading: usize,
    /// Requests waiting for admission at the end of the step.
    pub waiting: usize,
    /// The shard's latest running request, for cross-shard preemption.
    pub latest_running: Option<RequestKey>,
    /// Loads past their deadline whose blocks are parked until they return.
    pub parked: usize,
    /// The step admitted nothing here (a cross-shard preemption's hold) while requests wait:
    /// the next step admits, work no event announces.
    pub admission_held: bool,
    /// The fewest blocks an allocation of this step refused one of its requests (admission, or
    /// growth; `None`: none was refused): when the pool holds that many at the step's end —
    /// freed after the refusal by another shard's recovery, failed load or end, or held for a
    /// moment by another shard's allocation that failed too — the next step can do what this
    /// one could not, work that no event announces.
    pub blocks_wanted: Option<usize>,
    /// Tokens this step counted generated (samples kept, by the last step's output or a
    /// restart that keeps one): progress a preemption across shards is judged by.
    pub generated: u64,
}

impl ShardStepResult {
    /// Records that an allocation of `n` blocks was refused a request in this step
    /// ([`blocks_wanted`](Self::blocks_wanted)).
    pub(super) fn want(&mut self, n: usize) {
        self.blocks_wanted = Some(self.blocks_wanted.map_or(n, |m| m.min(n)));
    }

    /// Empties every list (keeping its room) and zeroes every count: what a step's result
    /// starts from. A result is cleared and refilled in place, step after step, so a step
    /// neither allocates its lists anew nor zeroes or copies the whole value.
    pub fn clear(&mut self) {
        let ShardStepResult {
            scheduled,
            recovered,
            scanned,
            evicted,
            ended,
            handoffs,
            runnable_latency_ns,
            first_schedule_latency_ns,
            counters,
            loading,
            waiting,
            latest_running,
            parked,
            admission_held,
            blocks_wanted,
            generated,
        } = self;
        scheduled.clear();
        recovered.clear();
        scanned.clear();
        evicted.clear();
        ended.clear();
        handoffs.clear();
        runnable_latency_ns.clear();
        first_schedule_latency_ns.clear();
        // Planted bug (scripts/plants.sh): a result reused from step to step keeps an
        // earlier step's counts, so the runtime counts them again.
        if !planted!("result-keeps-counts") {
            *counters = Metrics::default();
        }
        *loading = 0;
        *waiting = 0;
        *latest_running = None;
        *parked = 0;
        *admission_held = false;
        *blocks_wanted = None;
        *generated = 0;
    }
}

/// The settings a step runs with (a snapshot; never changes mid-step).
/// (The meaning of each field is the runtime setting of the same name.)
#[derive(Clone, Debug)]
pub struct StepSettings {
    /// Recovery mode.
    pub mode: Mode,
    /// Recovery policy.
    pub policy: Policy,
    /// This shard's share of the step's token budget.
    pub token_budget: u64,
    /// This shard's share of the sequences per step (also its admissions per step).
    pub max_seqs: usize,
    /// Record every scannable request's inputs in the step's recovery.
    pub record_inputs: bool,
    /// Deadline of an asynchronous load (`None`: none).
    pub load_deadline: Option<Duration>,
    /// Failed external loads after which a request is offered none.
    pub max_load_retries: u32,
    /// Consecutive failures that quarantine a prefix (0: never).
    pub quarantine_after: u32,
    /// How long a quarantine lasts.
    pub quarantine_for: Duration,
    /// How much of a lookup hit to load.
    pub load_policy: LoadPolicy,
    /// The engine's compute rate, tokens/s (0: unknown).
    pub compute_rate: f64,
    /// How long the tier may go unmeasured before a probe.
    pub load_probe_interval: Duration,
    /// Workers running async loads (the load estimate's queue).
    pub workers: usize,
    /// Asynchronous loads this shard may dispatch this step: its share of the room left in
    /// the workers' queue (0 while the queue is full; `usize::MAX` for no bound).
    pub load_room: usize,
}

impl StepSettings {
    /// A shard's settings: the live `settings`, its share of the budgets, and whether it
    /// records its scanned requests' inputs.
    pub fn new(
        settings: &Settings,
        token_budget: u64,
        max_seqs: usize,
        record_inputs: bool,
    ) -> StepSettings {
        StepSettings {
            mode: settings.mode,
            policy: settings.policy,
            token_budget,
            max_seqs,
            record_inputs,
            load_deadline: settings.load_deadline,
            max_load_retries: settings.max_load_retries,
            quarantine_after: settings.quarantine_after,
            quarantine_for: settings.quarantine_for,
            load_policy: settings.load_policy,
            compute_rate: settings.compute_rate.unwrap_or(0.0),
            load_probe_interval: settings.load_probe_interval,
            workers: 1,
            load_room: usize::MAX,
        }
    }
}

/// Shared, read-only context of a step, as a shard sees it: the geometry, the pool and claim
/// table of its [`Strategy`], the connector, the quarantine and the shard's index.
pub struct Env<'a, S: Strategy = LockFree> {
    /// The validated geometry.
    pub geo: &'a Geometry,
    /// The block pool and prefix cache.
    pub pool: &'a S::Pool,
    /// The claim table.
    pub claims: &'a S::Claims,
    /// The KV connector (its `lookup`, at admission).
    pub connector: &'a dyn KvConnector,
    /// Prefix quarantine.
    pub quarantine: &'a Quarantine,
    /// The tier's measured load cost.
    pub estimate: &'a LoadEstimate,
    /// This shard's index (where its loads' completions go).
    pub shard: usize,
    /// The shards sharing the pool: work every shard could do on the whole report is split
    /// among them by index.
    pub shards: usize,
}

/// One shard's requests, its step generic over how it reaches the shared pool and claim
/// table ([`strategy`]).
#[derive(Debug)]
pub struct Shard<S: Strategy = LockFree> {
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
    /// The requests (by admission sequence) the latest step scheduled to sample, in the
    /// shard's order: what a [`Command::SampledAll`] answering its plan samples.
    sampling: Vec<u64>,
    /// The running keys [`schedule`](Self::schedule) visits next, kept for its capacity.
    key_chunk: Vec<RequestKey>,
    /// Loading requests whose load completed this step.
    landed: Vec<u64>,
    /// Deadlines of in-flight async loads.
    deadlines: Deadlines,
    /// Blocks of loads that passed their deadline, held (not freed, not read) until the late
    /// completion lands, so a worker still writing into them never writes into a reused block.
    parked: FxHashMap<(u64, u32), Vec<BlockRef>>,
    /// Blocks of loads still running when shutdown gave up waiting: held for good (a detached
    /// worker may still write them), reported.
    abandoned: Vec<BlockRef>,
    /// A cross-shard preemption freed blocks for another shard this step: admit nothing here
    /// in this step, so the freed blocks are not taken straight back.
    hold_admission: bool,
    /// Per step scratch: hits of each scanned request.
    hits: Vec<(u64, RequestClass, Vec<Hit>)>,
    /// Hit buffers kept for reuse.
    spare_hits: Vec<Vec<Hit>>,
    /// Admission's scratch: the fresh blocks of the prompt being admitted.
    fresh: Vec<BlockRef>,
    /// Asynchronous loads this step may still dispatch (`StepSettings::load_room`, less
    /// those admission dispatched so far).
    load_room: usize,
    /// What mode `vllm` cached before it was known written.
    unconfirmed: unconfirmed::Unconfirmed,
    /// Requests a mode `vllm` recovery rounded down (`Req::rounded_down`), for mode `safe` to
    /// restart.
    rounded: Vec<u64>,
    result: ShardStepResult,
    strategy: PhantomData<fn() -> S>,
}

impl<S: Strategy> Default for Shard<S> {
    fn default() -> Self {
        Shard {
            reqs: FxHashMap::default(),
            by_id: FxHashMap::default(),
            waiting: BTreeMap::new(),
            loading: BTreeMap::new(),
            running: BTreeMap::new(),
            step: 0,
            index: HolderIndex::default(),
            touched: Vec::new(),
            sampling: Vec::new(),
            key_chunk: Vec::new(),
            landed: Vec::new(),
            deadlines: Deadlines::default(),
            parked: FxHashMap::default(),
            abandoned: Vec::new(),
            hold_admission: false,
            hits: Vec::new(),
            spare_hits: Vec::new(),
            fresh: Vec::new(),
            load_room: 0,
            unconfirmed: unconfirmed::Unconfirmed::default(),
            rounded: Vec::new(),
            result: ShardStepResult::default(),
            strategy: PhantomData,
        }
    }
}

impl<S: Strategy> Shard<S> {
    /// A shard of a pool of `num_blocks` ids, its holder index made up front
    /// (`HolderIndex::for_blocks`).
    pub fn for_blocks(num_blocks: usize) -> Self {
        Shard {
            index: HolderIndex::for_blocks(num_blocks),
            ..Shard::default()
        }
    }

    /// Phase 1: commands, completions, and this shard's share of the report (returned; the
    /// claim words of those blocks are reset).
    pub fn publish(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        commands: impl IntoIterator<Item = Command>,
        completions: impl IntoIterator<Item = Completion>,
    ) -> Vec<BlockId> {
        self.result.clear();
        self.step += 1;
        for cmd in commands {
            self.apply_command(env, cmd);
        }
        let mut published = Vec::new();
        for c in completions {
            self.take_completion(env, settings, now, c, &mut published);
        }
        self.expire_deadlines(env, settings, now, &mut published);
        if settings.mode == Mode::Safe {
            self.restart_rounded_down(env);
            self.publish_unconfirmed(env, &mut published);
        }
        for &id in &published {
            env.claims.reset(id);
        }
        published
    }

    /// The most requests a step with `settings` can schedule here: one per request the shard
    /// holds (commands applied), at most `max_seqs`.
    pub fn schedule_bound(&self, settings: &StepSettings) -> usize {
        settings.max_seqs.min(self.reqs.len())
    }

    /// Makes this step's list of scheduled requests `list`, which holds what earlier shards
    /// of the same step scheduled: this shard appends to it (between [`publish`](Self::publish)
    /// and [`finish_step`](Self::finish_step); an inline step chains its shards' lists
    /// this way). Its entries stay in the result this shard returns.
    pub fn schedule_after(&mut self, list: Vec<ScheduledRequest>) {
        self.result.scheduled = list;
    }

    /// Phase 3: decide, apply the last step's output, admit, schedule. While `draining`
    /// (shutdown) nothing is admitted or scheduled. The step's result is swapped into `out`:
    /// what `out` held (a result the caller has emptied, its lists' room) becomes the shard's
    /// next result, cleared by the next [`publish`](Self::publish). A caller that keeps one
    /// `out` per shard from step to step neither allocates nor copies a result whole.
    pub fn finish_step(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        draining: bool,
        loads_out: &mut Vec<LoadJob>,
        out: &mut ShardStepResult,
    ) {
        self.decide(env, settings);
        self.apply_outputs(env);
        // The last plan's samples are applied: this step's schedule lists its own.
        // (Planted bug `sampling-kept`, scripts/plants.sh: the list keeps every earlier
        // step's entries.)
        if !planted!("sampling-kept") {
            self.sampling.clear();
        }
        self.land_loads(env, now);
        if !draining {
            self.load_room = settings.load_room;
            let admit = !std::mem::take(&mut self.hold_admission);
            self.admit_and_schedule(env, settings, now, admit, loads_out);
            // (Planted bug `held-admission-unannounced`, scripts/plants.sh: the hold is not
            // reported, so an engine waiting on an empty plan sleeps while the preempted
            // request could be admitted.)
            self.result.admission_held =
                !admit && !self.waiting.is_empty() && !planted!("held-admission-unannounced");
        }
        self.result.loading = self.loading.len();
        self.result.waiting = self.waiting.len();
        self.result.latest_running = self.latest_running();
        self.result.parked = self.parked.len();
        std::mem::swap(out, &mut self.result);
    }

    /// The earliest deadline of an async load still in flight: when an idle engine must step
    /// again, completion or not. Asked between steps only (an idle wait), never in one.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let reqs = &self.reqs;
        self.deadlines
            .next(|s, a| reqs.get(&s).is_some_and(|r| r.awaits_load(a)))
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
}

/// A running request's table entry that holds no real block though the request needs one
/// ([`Shard::unbacked_entries`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnbackedEntry {
    /// The request's id.
    pub id: StdArc<str>,
    /// Its computed length.
    pub computed: u64,
    /// The cache group.
    pub group: usize,
    /// The entry: the null block, or past the end of a table too short.
    pub index: usize,
}

impl UnbackedEntry {
    /// The invariant violations `entries` make: one line for each of the first five, then
    /// one line counting the rest (the runtime's and the mutex baseline's checks).
    pub fn violations(entries: &[UnbackedEntry]) -> Vec<String> {
        let mut v: Vec<String> = entries
            .iter()
            .take(5)
            .map(|e| {
                format!(
                    "request {} (computed {}): group {} entry {} holds no real block",
                    e.id, e.computed, e.group, e.index
                )
            })
            .collect();
        if entries.len() > 5 {
            v.push(format!(
                "… {} more entries of running requests that hold no real block",
                entries.len() - 5
            ));
        }
        v
    }
}

impl<S: Strategy> Shard<S> {
    /// The entries its running requests need and do not hold a real block in: the null block,
    /// or past the end of a short table (docs/runtime.md, "Invariants"). A request computed up
    /// to `c` tokens (its last schedule's included), whose last step computes from `p` (`p = c`
    /// when it is not scheduled), needs in a group of block size `b`: every entry holding a
    /// token below `c` (full attention, Mamba `all`); the entries holding tokens
    /// `[p − window + 1, c)` (a sliding window: those its step attends to); the entries holding
    /// tokens `p − 1` and `c − 1`, the states after `p` and after `c` tokens (Mamba `align`).
    /// For a request mode vllm rolled back only full-attention and Mamba `all` groups are
    /// checked (a window or a state may then be missing: vLLM's recovery). Waiting requests hold nothing; a loading
    /// request's table is read only once its load lands.
    pub fn unbacked_entries(&self, geo: &Geometry) -> Vec<UnbackedEntry> {
        let null = geo.null_block();
        let mut out = Vec::new();
        for r in self.reqs.values().filter(|r| r.phase == Phase::Running) {
            let c = r.num_computed_tokens;
            let p = if r.last_scheduled > 0 {
                r.pre_step.min(c)
            } else {
                c
            };
            for (g, (grp, table)) in geo.groups().iter().zip(&r.tables).enumerate() {
                for i in needed_entries(grp, p, c, r.rounded_down) {
                    if table.get(i).is_none_or(|&id| id == null) {
                        out.push(UnbackedEntry {
                            id: r.id.clone(),
                            computed: c,
                            group: g,
                            index: i,
                        });
                    }
                }
            }
        }
        out
    }
}

/// The entries of group `grp` that a running request whose step computes its tokens `p..c`
/// needs real ([`Shard::unbacked_entries`]); with `every_only`, none of a group that may hold
/// null entries (a sliding window, Mamba `align`).
fn needed_entries(
    grp: &CacheGroup,
    p: u64,
    c: u64,
    every_only: bool,
) -> impl Iterator<Item = usize> {
    let b = grp.block_size;
    let hi = c.div_ceil(b);
    // The entry holding token `t − 1`, where the state after `t` tokens is (none at 0).
    let state = |t: u64| t.checked_sub(1).map(|last| last / b);
    let (range, states) = match grp.kind {
        GroupKind::FullAttention
        | GroupKind::Mamba {
            mode: MambaMode::All,
        } => (0..hi, [None, None]),
        _ if every_only => (0..0, [None, None]),
        GroupKind::SlidingWindow { window } => (p.saturating_sub(window - 1) / b..hi, [None, None]),
        GroupKind::Mamba {
            mode: MambaMode::Align,
        } => {
            let last = state(c);
            (0..0, [state(p).filter(|&s| Some(s) != last), last])
        }
    };
    range
        .chain(states.into_iter().flatten())
        .map(|i| usize::try_from(i).unwrap_or(usize::MAX))
}

/// The first key after `after` (the first key when `None`): a cursor that stays valid while
/// the loop body moves requests between phases.
fn next_key(set: &BTreeMap<RequestKey, ()>, after: Option<RequestKey>) -> Option<RequestKey> {
    match after {
        None => set.keys().next().copied(),
        Some(k) => set.range((Excluded(k), Unbounded)).next().map(|(k, _)| *k),
    }
}

/// The first `n` keys after `after` (from the first when `None`) into `out`, which is
/// cleared first: [`next_key`] a chunk at a time, one descent of the tree per chunk rather
/// than per key. A key the loop body adds behind the chunk's last is met by the next chunk;
/// one it adds inside the chunk is not (the caller's loop must not need it to be).
fn next_keys(
    set: &BTreeMap<RequestKey, ()>,
    after: Option<RequestKey>,
    n: usize,
    out: &mut Vec<RequestKey>,
) {
    out.clear();
    match after {
        None => out.extend(set.keys().take(n).copied()),
        Some(k) => out.extend(set.range((Excluded(k), Unbounded)).take(n).map(|(k, _)| *k)),
    }
}
