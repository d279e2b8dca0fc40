//! The mutex baseline of `kvsched stress --baseline mutex`: the same engine-facing API as
//! [`Runtime`](crate::runtime::Runtime), built the straightforward way, so one process can
//! compare the two on the same seeded workload.
//!
//! * **One global lock.** Every piece of scheduler state — requests, the block allocator (a
//!   `Vec` free list with plain reference counts), the prefix cache (a `HashMap`) and the
//!   pending-recompute marks — lives behind one [`crate::sync::Mutex`]. A step runs on the
//!   calling thread only.
//! * **Channel completions.** Worker threads take jobs from an `mpsc` channel (its receiver
//!   shared behind a mutex) and send completions back on another `mpsc` channel, drained at the
//!   start of every step.
//! * **Sequential recovery.** When a step's report is not empty, every loading and running
//!   request is scanned, those with hits are gathered in canonical order and handed to
//!   [`recovery::recover`] — the same rules as the runtime, ownership from marked sets.
//!
//! # Guarantees
//!
//! The same lifecycle rules as the runtime: every submitted request ends in exactly one of
//! finished, failed, cancelled; every completion is applied once or counted stale; sharers
//! (mode `safe`, policy `recompute`) are not scheduled while a block they wait for is pending,
//! and an owner that ends first hands its blocks off through the next step's report.
//!
//! # Limits
//!
//! Meant for comparison, not production: `O(live requests)` work per step under one lock.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc as StdArc;
// The baseline deliberately uses std's mpsc channels for jobs and completions: that is the
// design it stands for (the runtime uses lock-free queues from `crate::sync`).
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::connector::{KvConnector, LoadJob, LoadOwner, LoadResult, LookupQuery, NoConnector};
use crate::pool::{BlockRef, Census, Generation};
use crate::rules::geometry::{
    BlockId, CacheGroup, Geometry, GroupKind, MambaMode, DEFAULT_NULL_BLOCK,
};
use crate::rules::recovery::{
    self, Decision, Disposition, InvalidSet, Mode, Policy, Request, RequestClass,
};
use crate::runtime::claim::RequestKey;
use crate::runtime::worker::{run_load, Completion};
use crate::runtime::{
    EndState, Metrics, RecoveredRequest, Report, RuntimeError, ScheduledRequest, StepOutput,
    StepPlan, SubmitRequest,
};
use crate::sync::{thread, Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// Settings of a [`MutexScheduler`] (the same meaning as the runtime builder's).
#[derive(Clone)]
pub struct BaselineConfig {
    /// Cache groups.
    pub groups: Vec<CacheGroup>,
    /// Pool size in blocks, the null block included.
    pub pool_blocks: usize,
    /// Worker threads (1–256).
    pub workers: usize,
    /// Recovery mode.
    pub mode: Mode,
    /// Recovery policy.
    pub policy: Policy,
    /// Tokens per step.
    pub token_budget: u64,
    /// Sequences per step (also the admission limit per step).
    pub max_seqs: usize,
    /// The KV connector.
    pub connector: StdArc<dyn KvConnector>,
}

impl std::fmt::Debug for BaselineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaselineConfig")
            .field("groups", &self.groups)
            .field("pool_blocks", &self.pool_blocks)
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

impl Default for BaselineConfig {
    fn default() -> Self {
        BaselineConfig {
            groups: vec![CacheGroup::full_attention(16)],
            pool_blocks: 4096,
            workers: 2,
            mode: Mode::Safe,
            policy: Policy::Recompute,
            token_budget: 8192,
            max_seqs: 256,
            connector: StdArc::new(NoConnector),
        }
    }
}

/// Pending mark of a block whose owner ended before recomputing it.
const ORPHANED: u64 = u64::MAX;

/// The block allocator and prefix cache: plain counters, a free list and a hash map.
struct Blocks {
    ref_count: Vec<u32>,
    generation: Vec<Generation>,
    hash_of: Vec<Option<u64>>,
    queued: Vec<bool>,
    free: Vec<BlockId>,
    /// Cached, unreferenced blocks in release order (entries checked when popped).
    reclaim: VecDeque<BlockId>,
    index: FxHashMap<u64, BlockId>,
    double_frees: u64,
}

impl Blocks {
    fn new(n: usize) -> Self {
        Blocks {
            ref_count: vec![0; n],
            generation: vec![0; n],
            hash_of: vec![None; n],
            queued: vec![false; n],
            free: (1..n as BlockId).rev().collect(),
            reclaim: VecDeque::new(),
            index: FxHashMap::default(),
            double_frees: 0,
        }
    }
    fn is_current(&self, r: BlockRef) -> bool {
        r.id != DEFAULT_NULL_BLOCK && self.generation.get(r.id as usize) == Some(&r.generation)
    }
    fn allocate(&mut self) -> Option<BlockRef> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => loop {
                let id = self.reclaim.pop_front()?;
                let i = id as usize;
                self.queued[i] = false;
                if self.ref_count[i] == 0 {
                    if let Some(h) = self.hash_of[i].take() {
                        self.index.remove(&h);
                        break id;
                    }
                }
            },
        };
        let i = id as usize;
        self.generation[i] = self.generation[i].wrapping_add(1);
        self.ref_count[i] = 1;
        Some(BlockRef {
            id,
            generation: self.generation[i],
        })
    }
    fn allocate_n(&mut self, n: usize, out: &mut Vec<BlockRef>) -> bool {
        let start = out.len();
        for _ in 0..n {
            match self.allocate() {
                Some(b) => out.push(b),
                None => {
                    for b in out.drain(start..) {
                        self.release(b);
                    }
                    return false;
                }
            }
        }
        true
    }
    fn release(&mut self, r: BlockRef) {
        if !self.is_current(r) {
            return;
        }
        let i = r.id as usize;
        if self.ref_count[i] == 0 {
            self.double_frees += 1;
            return;
        }
        self.ref_count[i] -= 1;
        if self.ref_count[i] == 0 {
            if self.hash_of[i].is_some() {
                if !self.queued[i] {
                    self.queued[i] = true;
                    self.reclaim.push_back(r.id);
                }
            } else {
                self.free.push(r.id);
            }
        }
    }
    fn register(&mut self, hash: u64, r: BlockRef) -> bool {
        let i = r.id as usize;
        if !self.is_current(r) || self.hash_of[i].is_some() || self.index.contains_key(&hash) {
            return false;
        }
        self.index.insert(hash, r.id);
        self.hash_of[i] = Some(hash);
        true
    }
    fn lookup(&mut self, hash: u64) -> Option<BlockRef> {
        let id = *self.index.get(&hash)?;
        let i = id as usize;
        self.ref_count[i] += 1;
        Some(BlockRef {
            id,
            generation: self.generation[i],
        })
    }
    fn evict(&mut self, id: BlockId) {
        let i = id as usize;
        if let Some(h) = self.hash_of.get_mut(i).and_then(Option::take) {
            self.index.remove(&h);
            if self.ref_count[i] == 0 {
                self.free.push(id);
            }
        }
    }
    fn census(&self) -> Census {
        let mut c = Census {
            total: self.ref_count.len(),
            null: 1,
            ..Census::default()
        };
        for i in 1..self.ref_count.len() {
            match (self.ref_count[i], self.hash_of[i].is_some()) {
                (0, false) => c.free += 1,
                (0, true) => c.cached_unreferenced += 1,
                _ => c.referenced += 1,
            }
        }
        c
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Waiting,
    Loading,
    Running,
}

struct Req {
    id: StdArc<str>,
    prompt: StdArc<[u32]>,
    max_new_tokens: u32,
    generated: u32,
    hashes: Vec<Vec<u64>>,
    tables: Vec<Vec<BlockId>>,
    gens: Vec<Vec<Generation>>,
    registered: Vec<usize>,
    num_computed_tokens: u64,
    last_scheduled: u64,
    phase: Phase,
    waits: Vec<BlockId>,
    owned_pending: Vec<BlockId>,
    attempt: u32,
    load_cap: u64,
    load_done: Option<Instant>,
    end_after_load: Option<EndState>,
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
}

/// Everything behind the global lock.
struct State {
    geo: Geometry,
    cfg: BaselineConfig,
    blocks: Blocks,
    reqs: FxHashMap<RequestKey, Req>,
    by_id: FxHashMap<StdArc<str>, RequestKey>,
    waiting: BTreeSet<RequestKey>,
    loading: BTreeSet<RequestKey>,
    running: BTreeSet<RequestKey>,
    /// Block → owner key (raw) that must recompute it, or [`ORPHANED`].
    pending: FxHashMap<BlockId, u64>,
    sync_invalid: Vec<BlockRef>,
    handoffs: Vec<BlockRef>,
    ended: Vec<(StdArc<str>, EndState)>,
    stash: Vec<Completion>,
    jobs: Vec<LoadJob>,
    metrics: Metrics,
    seq: u64,
    step: u64,
    shut: bool,
}

impl State {
    fn null(&self) -> BlockId {
        self.geo.null_block()
    }

    /// Releases every block of `r`; owned, unrecomputed blocks go into the next report.
    fn release_all(&mut self, key: RequestKey) {
        let Some(r) = self.reqs.get_mut(&key) else {
            return;
        };
        r.sync_job = None;
        for id in r.owned_pending.drain(..) {
            if self.pending.get(&id) == Some(&key.raw()) {
                self.pending.insert(id, ORPHANED);
            }
            if let Some(&generation) = self.blocks.generation.get(id as usize) {
                self.handoffs.push(BlockRef { id, generation });
                self.metrics.handoffs += 1;
            }
        }
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
        r.registered.iter_mut().for_each(|x| *x = 0);
        r.waits.clear();
    }

    fn end(&mut self, key: RequestKey, state: EndState) {
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

    fn set_phase(&mut self, key: RequestKey, phase: Phase) {
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

    fn register_and_trim(&mut self, key: RequestKey) {
        let null = self.null();
        let Some(r) = self.reqs.get_mut(&key) else {
            return;
        };
        let nct = r.num_computed_tokens;
        for (g, grp) in self.geo.groups().iter().enumerate() {
            let full = ((nct / grp.block_size) as usize)
                .min(r.hashes[g].len())
                .min(r.tables[g].len());
            while r.registered[g] < full {
                let i = r.registered[g];
                if r.tables[g][i] != null {
                    let b = BlockRef {
                        id: r.tables[g][i],
                        generation: r.gens[g][i],
                    };
                    self.blocks.register(r.hashes[g][i], b);
                }
                r.registered[g] += 1;
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

    /// The step's report: completions drained, last output's sync failures, hand-offs.
    fn drain_completions(&mut self, completions: Vec<Completion>) -> Vec<BlockRef> {
        let mut bad: Vec<BlockRef> = self
            .sync_invalid
            .drain(..)
            .chain(self.handoffs.drain(..))
            .collect();
        for c in completions {
            let Some(r) = self.reqs.get_mut(&c.key) else {
                self.metrics.stale_completions += 1;
                continue;
            };
            if r.phase != Phase::Loading || r.attempt != c.attempt || r.load_done.is_some() {
                self.metrics.stale_completions += 1;
                continue;
            }
            self.metrics.connector_panics += u64::from(c.panicked);
            r.load_done = Some(c.finished_at);
            match c.result {
                LoadResult::Ok => self.metrics.loads_ok += 1,
                LoadResult::Failed(blocks) => {
                    self.metrics.loads_failed += 1;
                    bad.extend(blocks.into_flat());
                }
            }
        }
        bad
    }

    fn recover(&mut self, bad: Vec<BlockRef>, plan: &mut StepPlan) {
        let mut ids = Vec::with_capacity(bad.len());
        for b in bad {
            if b.id != self.null() && self.blocks.is_current(b) {
                ids.push(b.id);
            } else {
                self.metrics.stale_blocks += 1;
                self.pending.remove(&b.id);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return;
        }
        for id in &ids {
            self.pending.remove(id); // re-claimed below
        }
        let invalid = InvalidSet::flat(ids.iter().copied(), &self.geo);
        plan.recovery.report = ids;
        // Gather, in canonical order, every request with a hit.
        let mut keys = Vec::new();
        let mut requests = Vec::new();
        let mut hits = Vec::new();
        for (set, class) in [
            (&self.loading, RequestClass::Async),
            (&self.running, RequestClass::Sync),
        ] {
            for k in set {
                let Some(r) = self.reqs.get(k) else { continue };
                let scheduled = if class == RequestClass::Sync {
                    r.last_scheduled
                } else {
                    0
                };
                let req = Request {
                    id: r.id.to_string(),
                    class,
                    num_computed_tokens: r.num_computed_tokens,
                    num_scheduled_tokens: scheduled,
                    block_tables: Vec::new(),
                };
                let view = recovery::RequestView {
                    block_tables: &r.tables,
                    ..req.view()
                };
                hits.clear();
                recovery::scan_request(&self.geo, view, &invalid, &mut hits);
                if !hits.is_empty() {
                    keys.push((*k, class));
                    requests.push(Request {
                        block_tables: r.tables.clone(),
                        ..req
                    });
                }
            }
        }
        let out = recovery::recover(
            &self.geo,
            self.cfg.mode,
            self.cfg.policy,
            &requests,
            &invalid,
        );
        let safe_recompute = self.cfg.mode == Mode::Safe && self.cfg.policy == Policy::Recompute;
        let mut evicted = Vec::new();
        for (i, d) in out.requests.into_iter().enumerate() {
            let (key, class) = keys[i];
            self.metrics.claims += d.claimed_blocks.len() as u64;
            self.metrics.tokens_recomputed += d.affected_tokens;
            for &id in &d.evicted_blocks {
                self.blocks.evict(id);
            }
            evicted.extend_from_slice(&d.evicted_blocks);
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            r.waits = d.waits_for.iter().map(|(b, _)| *b).collect();
            let nct = d.num_computed_tokens;
            match d.disposition {
                Disposition::Unaffected | Disposition::Failed => {}
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
                for (reg, grp) in r.registered.iter_mut().zip(self.geo.groups()) {
                    *reg = (*reg).min((r.num_computed_tokens / grp.block_size) as usize);
                }
                if safe_recompute {
                    for &b in &d.claimed_blocks {
                        self.pending.insert(b, key.raw());
                        if !r.owned_pending.contains(&b) {
                            r.owned_pending.push(b);
                        }
                    }
                }
            }
            let failed = d.disposition == Disposition::Failed;
            let loading_unlanded = r.phase == Phase::Loading && r.load_done.is_none();
            let id = r.id.clone();
            let decision = Decision {
                disposition: d.disposition,
                num_computed_tokens: d.num_computed_tokens,
                affected_tokens: d.affected_tokens,
                claimed_blocks: d.claimed_blocks,
                waits_for: d
                    .waits_for
                    .into_iter()
                    .map(|(b, o)| (b, keys[o].0.with_sync(keys[o].1 == RequestClass::Sync)))
                    .collect(),
                evicted_blocks: d.evicted_blocks,
            };
            let class_key = key.with_sync(class == RequestClass::Sync);
            plan.recovery.recovered.push(RecoveredRequest {
                id,
                key: class_key,
                class,
                decision,
            });
            if failed {
                if loading_unlanded {
                    if let Some(r) = self.reqs.get_mut(&key) {
                        r.end_after_load = Some(EndState::Failed);
                    }
                } else {
                    self.end(key, EndState::Failed);
                }
            }
        }
        evicted.sort_unstable();
        evicted.dedup();
        plan.recovery.evicted_blocks = evicted;
    }

    fn apply_outputs(&mut self) {
        let keys: Vec<RequestKey> = self.running.iter().copied().collect();
        for key in keys {
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            let skip = std::mem::take(&mut r.skip);
            let sampled = std::mem::take(&mut r.sampled_pending);
            let finish = std::mem::take(&mut r.finish_pending);
            r.last_scheduled = 0;
            if !skip {
                r.generated += u32::from(sampled);
                let nct = r.num_computed_tokens;
                let groups = self.geo.groups();
                let pending = &mut self.pending;
                let tables = &r.tables;
                r.owned_pending.retain(|&id| {
                    let done = tables.iter().zip(groups).any(|(t, grp)| {
                        t.iter()
                            .position(|&x| x == id)
                            .is_some_and(|i| (i as u64 + 1) * grp.block_size <= nct)
                    });
                    if done && pending.get(&id) == Some(&key.raw()) {
                        pending.remove(&id);
                    }
                    !done
                });
                self.register_and_trim(key);
            }
            let Some(r) = self.reqs.get(&key) else {
                continue;
            };
            if finish
                || (!skip && sampled && r.max_new_tokens > 0 && r.generated >= r.max_new_tokens)
            {
                self.end(key, EndState::Finished);
            }
        }
        let others: Vec<RequestKey> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.finish_pending && r.phase != Phase::Running)
            .map(|(k, _)| *k)
            .collect();
        for key in others {
            if let Some(r) = self.reqs.get_mut(&key) {
                r.finish_pending = false;
                if r.phase == Phase::Loading && r.load_done.is_none() {
                    r.end_after_load = Some(EndState::Finished);
                    continue;
                }
            }
            self.end(key, EndState::Finished);
        }
    }

    fn land_loads(&mut self, now: Instant, plan: &mut StepPlan) {
        let keys: Vec<RequestKey> = self.loading.iter().copied().collect();
        for key in keys {
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            let Some(finished_at) = r.load_done.take() else {
                continue;
            };
            if let Some(state) = r.end_after_load.take() {
                self.end(key, state);
                continue;
            }
            r.num_computed_tokens = r.num_computed_tokens.min(r.load_cap);
            r.load_cap = u64::MAX;
            if r.num_computed_tokens == 0 {
                r.attempt += 1;
                self.release_all(key);
                self.set_phase(key, Phase::Waiting);
                continue;
            }
            self.register_and_trim(key);
            plan.runnable_latency_ns
                .push(now.saturating_duration_since(finished_at).as_nanos() as u64);
            self.set_phase(key, Phase::Running);
        }
    }

    /// Longest usable local prefix (a multiple of `S` below the prompt's end), referenced.
    fn local_prefix(&mut self, key: RequestKey) -> (u64, Vec<Vec<BlockRef>>) {
        let groups = self.geo.groups().to_vec();
        let mut got = vec![Vec::new(); groups.len()];
        let Some(r) = self.reqs.get(&key) else {
            return (0, got);
        };
        let mut cap = self
            .geo
            .round_down_to_s((r.prompt.len() as u64).saturating_sub(1));
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
                    .take_while(|h| self.blocks.index.contains_key(h))
                    .count() as u64;
                cap = cap.min(n * grp.block_size);
            }
        }
        let mut l = self.geo.round_down_to_s(cap);
        while l > 0 {
            let ok = groups.iter().enumerate().all(|(g, grp)| {
                let n = (l / grp.block_size) as usize;
                ((grp.nullable_below(l) as usize)..n).all(|i| {
                    r.hashes[g]
                        .get(i)
                        .is_some_and(|h| self.blocks.index.contains_key(h))
                })
            });
            if ok {
                let hashes = r.hashes.clone();
                for (g, grp) in groups.iter().enumerate() {
                    let n = (l / grp.block_size) as usize;
                    let nullable = grp.nullable_below(l) as usize;
                    for (i, &h) in hashes[g].iter().take(n).enumerate() {
                        let b = if i < nullable {
                            None
                        } else {
                            self.blocks.lookup(h)
                        };
                        got[g].push(b.unwrap_or(BlockRef {
                            id: self.geo.null_block(),
                            generation: 0,
                        }));
                    }
                }
                return (l, got);
            }
            l -= self.geo.scheduler_block_size();
        }
        (0, got)
    }

    fn admit(&mut self) {
        let keys: Vec<RequestKey> = self
            .waiting
            .iter()
            .take(self.cfg.max_seqs)
            .copied()
            .collect();
        for key in keys {
            let (local, mut got) = self.local_prefix(key);
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            let look = self.cfg.connector.lookup(LookupQuery {
                request: &r.id,
                prompt: &r.prompt,
                local_tokens: local,
            });
            let len = r.prompt.len() as u64;
            let limit = self.geo.round_down_to_s(len.saturating_sub(1));
            let ext_end = self
                .geo
                .round_down_to_s(local.saturating_add(look.external_tokens))
                .clamp(local, limit.max(local));
            let need: usize = self
                .geo
                .groups()
                .iter()
                .zip(&got)
                .map(|(g, t)| (g.blocks_for_tokens(len) as usize).saturating_sub(t.len()))
                .sum();
            let mut fresh = Vec::with_capacity(need);
            if !self.blocks.allocate_n(need, &mut fresh) {
                for b in got.into_iter().flatten() {
                    self.blocks.release(b);
                }
                break;
            }
            let mut fresh = fresh.into_iter();
            for (g, grp) in self.geo.groups().iter().enumerate() {
                while got[g].len() < grp.blocks_for_tokens(len) as usize {
                    got[g].extend(fresh.next());
                }
                r.tables[g] = got[g].iter().map(|b| b.id).collect();
                r.gens[g] = got[g].iter().map(|b| b.generation).collect();
                r.registered[g] = (local / grp.block_size) as usize;
            }
            r.num_computed_tokens = ext_end;
            if ext_end > local {
                r.attempt += 1;
                let job = LoadJob {
                    request: r.id.clone(),
                    owner: LoadOwner {
                        shard: 0,
                        key: key.raw(),
                    },
                    attempt: r.attempt,
                    start_tokens: local,
                    end_tokens: ext_end,
                    block_tables: got,
                    block_sizes: self.geo.groups().iter().map(|g| g.block_size).collect(),
                    deadline: None,
                };
                self.metrics.loads_dispatched += 1;
                if look.load_async {
                    r.load_cap = u64::MAX;
                    self.jobs.push(job);
                    self.set_phase(key, Phase::Loading);
                } else {
                    r.sync_job = Some(job);
                    self.set_phase(key, Phase::Running);
                }
            } else {
                self.register_and_trim(key);
                self.set_phase(key, Phase::Running);
            }
        }
    }

    fn grow(&mut self, key: RequestKey, upto: u64) -> bool {
        let Some(r) = self.reqs.get_mut(&key) else {
            return false;
        };
        let groups = self.geo.groups();
        let need: usize = groups
            .iter()
            .zip(&r.tables)
            .map(|(g, t)| (g.blocks_for_tokens(upto) as usize).saturating_sub(t.len()))
            .sum();
        let mut fresh = Vec::with_capacity(need);
        if !self.blocks.allocate_n(need, &mut fresh) {
            return false;
        }
        let mut fresh = fresh.into_iter();
        for (g, grp) in groups.iter().enumerate() {
            while (r.tables[g].len() as u64) < grp.blocks_for_tokens(upto) {
                let Some(b) = fresh.next() else { break };
                r.tables[g].push(b.id);
                r.gens[g].push(b.generation);
            }
        }
        true
    }

    fn schedule(&mut self, now: Instant, plan: &mut StepPlan) {
        let mut budget = self.cfg.token_budget;
        let mut seqs_left = self.cfg.max_seqs;
        let keys: Vec<RequestKey> = self.running.iter().copied().collect();
        for key in keys {
            if budget == 0 || seqs_left == 0 {
                break;
            }
            let pending = &self.pending;
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            r.waits.retain(|b| pending.contains_key(b));
            if !r.waits.is_empty() {
                continue;
            }
            let n = r
                .seq_len()
                .saturating_sub(r.num_computed_tokens)
                .min(budget);
            if n == 0 {
                continue;
            }
            let upto = r.num_computed_tokens + n;
            if !self.grow(key, upto) {
                if let Some(&victim) = self.running.last() {
                    if victim != key {
                        self.preempt(victim);
                    }
                }
                if !self.grow(key, upto) {
                    continue;
                }
            }
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            let first = !r.first_scheduled;
            if first {
                r.first_scheduled = true;
                plan.first_schedule_latency_ns
                    .push(now.saturating_duration_since(r.submitted_at).as_nanos() as u64);
            }
            plan.scheduled.push(ScheduledRequest {
                id: r.id.clone(),
                key,
                num_computed_tokens: r.num_computed_tokens,
                num_tokens: n,
                samples: upto == r.seq_len(),
                sync_load: r.sync_job.take(),
                first,
            });
            r.num_computed_tokens = upto;
            r.last_scheduled = n;
            budget -= n;
            seqs_left -= 1;
        }
    }

    fn preempt(&mut self, key: RequestKey) {
        self.release_all(key);
        if let Some(r) = self.reqs.get_mut(&key) {
            r.num_computed_tokens = 0;
            r.last_scheduled = 0;
            self.metrics.preemptions += 1;
        }
        self.set_phase(key, Phase::Waiting);
    }

    fn step(&mut self, completions: Vec<Completion>, draining: bool) -> StepPlan {
        self.step += 1;
        self.metrics.steps += 1;
        let mut plan = StepPlan {
            step: self.step,
            ..StepPlan::default()
        };
        let bad = self.drain_completions(completions);
        self.recover(bad, &mut plan);
        self.apply_outputs();
        let now = Instant::now();
        self.land_loads(now, &mut plan);
        if !draining {
            self.admit();
            self.schedule(now, &mut plan);
        }
        plan.ended = std::mem::take(&mut self.ended);
        plan
    }

    fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let census = self.blocks.census();
        if !census.conserved() || census.free != self.blocks.free.len() {
            v.push(format!(
                "pool conservation: {census:?}, free list {}",
                self.blocks.free.len()
            ));
        }
        if self.blocks.double_frees > 0 {
            v.push(format!("double frees: {}", self.blocks.double_frees));
        }
        let null = self.null();
        let mut held = FxHashMap::<BlockId, u32>::default();
        for r in self.reqs.values() {
            for &id in r.tables.iter().flatten().filter(|&&id| id != null) {
                *held.entry(id).or_default() += 1;
            }
        }
        for i in 1..self.blocks.ref_count.len() {
            let (n, rc) = (
                held.get(&(i as BlockId)).copied().unwrap_or(0),
                self.blocks.ref_count[i],
            );
            if n != rc {
                v.push(format!("block {i}: held by {n} requests, ref count {rc}"));
            }
        }
        let m = &self.metrics;
        if m.finished + m.failed + m.cancelled + self.reqs.len() as u64 != m.submitted {
            v.push(format!(
                "accounting: submitted {} != finished {} + failed {} + cancelled {} + live {}",
                m.submitted,
                m.finished,
                m.failed,
                m.cancelled,
                self.reqs.len()
            ));
        }
        v
    }
}

/// The worker threads: jobs in by one channel, completions out by another.
struct Workers {
    jobs: Option<mpsc::Sender<LoadJob>>,
    stop: Arc<AtomicBool>,
    cancelled: Arc<AtomicU64>,
    handles: Vec<thread::JoinHandle<()>>,
}

/// The baseline scheduler. See the module docs.
pub struct MutexScheduler {
    state: Mutex<State>,
    completions: Mutex<mpsc::Receiver<Completion>>,
    workers: Workers,
}

impl std::fmt::Debug for MutexScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MutexScheduler")
            .field("workers", &self.workers.handles.len())
            .finish_non_exhaustive()
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
        let (job_tx, job_rx) = mpsc::channel::<LoadJob>();
        let (done_tx, done_rx) = mpsc::channel::<Completion>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let stop = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for i in 0..cfg.workers {
            let (rx, tx, conn) = (
                Arc::clone(&job_rx),
                done_tx.clone(),
                StdArc::clone(&cfg.connector),
            );
            let (stop, cancelled) = (Arc::clone(&stop), Arc::clone(&cancelled));
            let h = thread::Builder::new()
                .name(format!("baseline-worker-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().recv();
                    let Ok(job) = job else { return };
                    // Acquire: pairs with the Release store in `shutdown`.
                    if stop.load(Ordering::Acquire) {
                        cancelled.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let (result, panicked) = run_load(conn.as_ref(), &job);
                    let c = Completion {
                        key: RequestKey::from_raw(job.owner.key),
                        attempt: job.attempt,
                        result,
                        panicked,
                        finished_at: Instant::now(),
                    };
                    if tx.send(c).is_err() {
                        return;
                    }
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    drop(job_tx);
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(e.into());
                }
            }
        }
        let n = cfg.pool_blocks;
        let state = State {
            geo,
            cfg,
            blocks: Blocks::new(n),
            reqs: FxHashMap::default(),
            by_id: FxHashMap::default(),
            waiting: BTreeSet::new(),
            loading: BTreeSet::new(),
            running: BTreeSet::new(),
            pending: FxHashMap::default(),
            sync_invalid: Vec::new(),
            handoffs: Vec::new(),
            ended: Vec::new(),
            stash: Vec::new(),
            jobs: Vec::new(),
            metrics: Metrics::default(),
            seq: 1,
            step: 0,
            shut: false,
        };
        Ok(MutexScheduler {
            state: Mutex::new(state),
            completions: Mutex::new(done_rx),
            workers: Workers {
                jobs: Some(job_tx),
                stop,
                cancelled,
                handles,
            },
        })
    }

    /// Queues a request; it is admitted at a following step.
    pub fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        let mut s = self.state.lock();
        if s.shut {
            return Err(RuntimeError::ShutDown);
        }
        if req.prompt.is_empty() {
            return Err(RuntimeError::EmptyPrompt(req.id));
        }
        let total = req.prompt.len() as u64 + u64::from(req.max_new_tokens.max(1));
        let needed: u64 = s
            .geo
            .groups()
            .iter()
            .map(|g| g.blocks_for_tokens(total))
            .sum();
        let usable = s.blocks.ref_count.len() as u64 - 1;
        if needed > usable {
            return Err(RuntimeError::TooLong {
                id: req.id,
                needed,
                usable,
            });
        }
        if s.by_id.contains_key(req.id.as_str()) {
            return Err(RuntimeError::DuplicateId(req.id));
        }
        let seq = s.seq;
        s.seq += 1;
        let key = RequestKey::new(false, req.priority, seq);
        let hashes = s
            .geo
            .groups()
            .iter()
            .enumerate()
            .map(|(g, grp)| {
                let mut parent = 0;
                req.prompt
                    .chunks_exact(grp.block_size as usize)
                    .map(|c| {
                        parent = crate::pool::chain_hash(parent, g, c);
                        parent
                    })
                    .collect()
            })
            .collect();
        let groups = s.geo.num_groups();
        let id: StdArc<str> = req.id.into();
        let r = Req {
            id: id.clone(),
            prompt: req.prompt.into(),
            max_new_tokens: req.max_new_tokens,
            generated: 0,
            hashes,
            tables: vec![Vec::new(); groups],
            gens: vec![Vec::new(); groups],
            registered: vec![0; groups],
            num_computed_tokens: 0,
            last_scheduled: 0,
            phase: Phase::Waiting,
            waits: Vec::new(),
            owned_pending: Vec::new(),
            attempt: 0,
            load_cap: u64::MAX,
            load_done: None,
            end_after_load: None,
            sync_job: None,
            submitted_at: Instant::now(),
            first_scheduled: false,
            sampled_pending: false,
            finish_pending: false,
            skip: false,
        };
        s.by_id.insert(id, key);
        s.reqs.insert(key, r);
        s.waiting.insert(key);
        s.metrics.submitted += 1;
        Ok(())
    }

    /// Cancels a request (once its in-flight load, if any, lands). Unknown ids are counted in
    /// [`Metrics::unknown_commands`].
    pub fn cancel(&self, id: &str) {
        let mut s = self.state.lock();
        let Some(&key) = s.by_id.get(id) else {
            s.metrics.unknown_commands += 1;
            return;
        };
        match s.reqs.get_mut(&key) {
            Some(r) if r.phase == Phase::Loading => r.end_after_load = Some(EndState::Cancelled),
            _ => s.end(key, EndState::Cancelled),
        }
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
        if let Some(tx) = &self.workers.jobs {
            for j in jobs {
                let _ = tx.send(j);
            }
        }
        plan
    }

    /// Applies the engine's output for the last step (at the next [`MutexScheduler::schedule`]).
    pub fn update(&mut self, out: StepOutput) {
        let mut s = self.state.lock();
        let current = out.step == s.step;
        if !current && (!out.sampled.is_empty() || !out.invalid_blocks.is_empty()) {
            s.metrics.stale_outputs += 1;
        }
        let (sampled, invalid_blocks) = if current {
            (out.sampled, out.invalid_blocks)
        } else {
            (Vec::new(), Vec::new())
        };
        for id in sampled {
            match s
                .by_id
                .get(id.as_str())
                .copied()
                .and_then(|k| s.reqs.get_mut(&k))
            {
                Some(r) if r.phase == Phase::Running && r.last_scheduled > 0 => {
                    r.sampled_pending = true
                }
                _ => s.metrics.unknown_commands += 1,
            }
        }
        for id in out.finished {
            match s
                .by_id
                .get(id.as_str())
                .copied()
                .and_then(|k| s.reqs.get_mut(&k))
            {
                Some(r) => r.finish_pending = true,
                None => s.metrics.unknown_commands += 1,
            }
        }
        let cap = s.blocks.ref_count.len() as u64;
        for b in invalid_blocks {
            if b.id < cap {
                s.sync_invalid.push(b);
            } else {
                s.metrics.stale_blocks += 1;
            }
        }
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

    /// SPEC §7 invariants that can be checked between steps; returns the violations.
    pub fn check_invariants(&self) -> Vec<String> {
        self.state.lock().violations()
    }

    /// Stops the workers (loads in flight finish and are applied), cancels every live request,
    /// releases every block and reports.
    pub fn shutdown(mut self) -> Report {
        self.state.lock().shut = true;
        // Release: pairs with the Acquire load in the worker loop; queued jobs are skipped.
        self.workers.stop.store(true, Ordering::Release);
        self.workers.jobs = None;
        for h in self.workers.handles.drain(..) {
            let _ = h.join();
        }
        let loads_cancelled = self.workers.cancelled.load(Ordering::Relaxed);
        let _ = self.step(true);
        let mut s = self.state.lock();
        s.jobs.clear();
        let keys: Vec<RequestKey> = s.reqs.keys().copied().collect();
        let mut ids = Vec::new();
        for k in keys {
            if let Some(r) = s.reqs.get(&k) {
                ids.push(r.id.to_string());
            }
            s.end(k, EndState::Cancelled);
        }
        s.ended.clear();
        // The baseline waits for every load in flight: nothing is abandoned.
        Report {
            metrics: s.metrics.clone(),
            loads_cancelled,
            loads_abandoned: 0,
            blocks_abandoned: 0,
            census: s.blocks.census(),
            cancelled_at_shutdown: ids,
            violations: s.violations(),
        }
    }
}

impl Drop for MutexScheduler {
    fn drop(&mut self) {
        self.workers.stop.store(true, Ordering::Release);
        self.workers.jobs = None;
        for h in self.workers.handles.drain(..) {
            let _ = h.join();
        }
    }
}
