//! Admission: a waiting request gets the longest usable local prefix from the prefix cache,
//! whatever the connector offers to load past it, and fresh blocks for the rest of its
//! prompt. An external range is loaded asynchronously (the request is loading) or
//! synchronously in the step that first schedules it (the request runs).

use std::time::Instant;

use crate::connector::{CancelToken, LoadJob, LoadOwner, LookupQuery, LookupResult};
use crate::pool::{BlockRef, Generation};
use crate::rules::geometry::BlockId;
use crate::rules::recovery::Mode;
use crate::runtime::policy::admission::{blocks_needed_at, external_nulls, fewest_blocks_needed};
use crate::runtime::policy::alignment::branch_point;
use crate::runtime::policy::prefix::{prefix_candidates, prefix_cap, prefix_entries};

use super::strategy::{Pool, Strategy};
use super::{next_key, Env, HolderIndex, Metrics, Phase, Req, Shard, StepSettings};
use crate::runtime::claim::RequestKey;

/// What admitting one waiting request did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admitted {
    /// The pool cannot hold its prompt: nothing more is admitted in this step.
    PoolFull,
    /// No such request.
    Gone,
    /// Admitted, now in this phase (running, or loading asynchronously).
    Into(Phase),
}

impl<S: Strategy> Shard<S> {
    /// Longest usable local prefix (a multiple of the scheduler block size, below the
    /// prompt's end), retained, searched from `cap` ([`prefix_cap`]: the leading run of cached
    /// blocks of the groups that need every entry) down.
    fn local_prefix(env: &Env<'_, S>, r: &Req, cap: u64) -> (u64, Vec<Vec<(BlockId, Generation)>>) {
        let geo = env.geo;
        let groups = geo.groups();
        let prompt_len = r.prompt.len() as u64;
        let cached = |h| env.pool.contains_hash(h);
        // Each group's list, with room for the whole prompt's blocks (the rest are appended
        // at allocation), so it never grows.
        let lists = || -> Vec<Vec<(BlockId, Generation)>> {
            groups
                .iter()
                .map(|grp| Vec::with_capacity(grp.blocks_for_tokens(prompt_len) as usize))
                .collect()
        };
        for l in prefix_candidates(geo, cap, &r.hashes, cached) {
            let mut got = lists();
            let mut ok = true;
            'groups: for (g, grp) in groups.iter().enumerate() {
                let (nullable, n) = prefix_entries(grp, l);
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
            Self::release_prefix(env, got);
        }
        (0, lists())
    }

    /// Admits waiting requests in canonical order, at most `max_seqs` per step: each gets its
    /// local prefix, what the connector offers past it, and fresh blocks for the rest of its
    /// prompt. Stops at the first request the pool cannot hold (it is admitted again next
    /// step).
    pub(super) fn admit(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        loads_out: &mut Vec<LoadJob>,
    ) {
        let mut admitted = 0usize;
        let mut cursor = None;
        while let Some(key) = next_key(&self.waiting, cursor) {
            cursor = Some(key);
            if admitted >= settings.max_seqs {
                break;
            }
            match self.admit_one(env, settings, now, key, loads_out) {
                Admitted::PoolFull => break, // admit again next step
                Admitted::Gone => {}
                Admitted::Into(_) => admitted += 1,
            }
        }
    }

    /// Admits the waiting request `key`: its local prefix, what the connector offers past it,
    /// fresh blocks for the rest of its prompt, and its load (async: dispatched into
    /// `loads_out`, the request loading; sync: carried by the step that first schedules it,
    /// the request running).
    pub(super) fn admit_one(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        key: RequestKey,
        loads_out: &mut Vec<LoadJob>,
    ) -> Admitted {
        let geo = env.geo;
        let seq = key.seq();
        let Some(r) = self.reqs.get_mut(&seq) else {
            return Admitted::Gone;
        };
        debug_assert!(
            r.tables.iter().all(Vec::is_empty),
            "a waiting request holds blocks"
        );
        // A prompt the pool cannot hold whatever the connector offers is not admitted: checked
        // first as if every block below the cap were a hit (before any is revived), then for
        // the local prefix found — before the connector is asked, or a cached block reclaimed
        // for an allocation that would fail.
        let prompt_len = r.prompt.len() as u64;
        // Full-attention-like groups need every entry below the local prefix.
        let cached = prefix_cap(geo, prompt_len, &r.hashes, |h| env.pool.contains_hash(h));
        let at_best = geo.groups().iter().map(|g| prefix_entries(g, cached).1);
        let need = fewest_blocks_needed(geo, prompt_len, cached, at_best);
        if need > env.pool.allocatable() {
            self.result.want(need);
            return Admitted::PoolFull;
        }
        let (local, got) = Self::local_prefix(env, r, cached);
        let held = got.iter().map(Vec::len);
        let need = fewest_blocks_needed(geo, prompt_len, local, held);
        if need > env.pool.allocatable() {
            self.result
                .want(need + Self::release_prefix_unheld(env, got));
            return Admitted::PoolFull;
        }
        // The prefix the connector would load from: the chained hash of group 0's first
        // block past the local hit (the same for every request sharing that prefix).
        let b0 = geo.groups()[0].block_size;
        r.prefix_key = r.hashes[0].get((local / b0) as usize).copied();
        // Planted bug `load-room-whole-step` (scripts/plants.sh): a step that began with any
        // room in the workers' queue dispatches a load for every request it admits, past the
        // bound.
        let room = if planted!("load-room-whole-step") {
            settings.load_room > 0
        } else {
            self.load_room > 0
        };
        let look = Self::lookup_external(
            env,
            settings,
            now,
            r,
            local,
            room,
            &mut self.result.counters,
        );
        let counters = &mut self.result.counters;
        // The requests still waiting once this one is admitted.
        let behind = self.waiting.len().saturating_sub(1) as u64;
        let ext = look.external_tokens;
        let ext_end = Self::loaded_end(env, settings, now, r, local, ext, behind, counters);
        let fresh = &mut self.fresh;
        if let Err(need) =
            Self::allocate_prompt(env, r, seq, (local, ext_end), got, &mut self.index, fresh)
        {
            self.result.want(need);
            return Admitted::PoolFull;
        }
        // Admitted: what the connector prepared for its lookups is not kept (a restart looks
        // the request up unprepared). A value whose `Drop` panics is a connector's panic.
        if r.prepared.clear() {
            counters.connector_panics += 1;
        }
        r.branch = branch_point(geo, ext_end, cached);
        // The local prefix is written (it is in the prefix cache); the external range is
        // not until its load lands or the step that carries it is answered.
        r.written = local;
        r.admissions += 1;
        r.num_computed_tokens = ext_end;
        if ext_end <= local {
            Self::register_and_trim(env, r, &mut self.index);
            self.set_phase(seq, Phase::Running);
            return Admitted::Into(Phase::Running);
        }
        r.attempt += 1;
        let job = Self::load_job(env, r, local, ext_end);
        self.result.counters.loads_dispatched += 1;
        if !look.load_async {
            r.sync_job = Some(job);
            if settings.mode == Mode::Vllm {
                // vLLM's design: a sync load's destinations are hashed at allocation, so a
                // request admitted later finds them in the prefix cache before the load has
                // run (and keeps them if it fails: vLLM #49250). Mode vllm admits a sync
                // loader only into the step that runs its load (`step_order`). Nothing is
                // trimmed: the load still writes every destination. What it registers is
                // recorded until known written (`unconfirmed`).
                let before = r.registered.clone();
                Self::register_upto(env, r, ext_end);
                self.record_unconfirmed(env, seq, &before);
            }
            self.set_phase(seq, Phase::Running);
            return Admitted::Into(Phase::Running);
        }
        env.estimate.dispatched();
        r.load_dispatched_at = Some(now);
        r.load_start = local;
        r.load_end = ext_end;
        r.load_cap = u64::MAX;
        let mut job = job;
        // A deadline past what an Instant can hold is no deadline.
        let deadline = r
            .load_deadline
            .or(settings.load_deadline)
            .and_then(|d| now.checked_add(d));
        job.deadline = deadline;
        r.load_deadline_at = deadline;
        // The load owns its destinations' bytes until its completion is applied.
        env.pool.guard_fills(&mut job);
        r.cancel = Some(job.cancel.clone());
        let attempt = r.attempt;
        if let Some(at) = deadline {
            let reqs = &self.reqs;
            self.deadlines.push(at, seq, attempt, |s, a| {
                // Planted bug (scripts/plants.sh): compacting drops the entries of loads
                // still in flight, so a hung load's deadline never comes.
                !planted!("deadline-compact-in-flight")
                    && reqs.get(&s).is_some_and(|r| r.awaits_load(a))
            });
        }
        loads_out.push(job);
        self.load_room = self.load_room.saturating_sub(1);
        self.set_phase(seq, Phase::Loading);
        Admitted::Into(Phase::Loading)
    }

    /// What the connector offers past the local prefix of `r`: nothing (counted) when the
    /// request's retry budget is spent or its prefix is quarantined, or when the offer is an
    /// asynchronous load and the workers' queue has no room left for it (`room`: this
    /// shard's share of the room is not spent yet).
    fn lookup_external(
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        r: &Req,
        local: u64,
        room: bool,
        counters: &mut Metrics,
    ) -> LookupResult {
        let offer_external = if r.load_failures >= settings.max_load_retries {
            counters.retry_budget_skips += 1;
            false
        } else if r
            .prefix_key
            .is_some_and(|k| env.quarantine.is_quarantined(k, now))
        {
            counters.quarantine_skips += 1;
            false
        } else {
            true
        };
        if !offer_external {
            return LookupResult::default();
        }
        let query = LookupQuery {
            request: &r.id,
            prompt: &r.prompt,
            local_tokens: local,
            prepared: r.prepared.get().map(|p| &**p),
        };
        // A connector that panics in `lookup` offers nothing: the request recomputes locally
        // and the panic is counted; the step goes on. (Planted bug `lookup-uncaught` lets
        // the panic through.)
        let look = if planted!("lookup-uncaught") {
            env.connector.lookup(query)
        } else {
            match crate::panics::caught(|| env.connector.lookup(query)) {
                Ok(look) => look,
                Err(_) => {
                    counters.connector_panics += 1;
                    counters.lookup_panics += 1;
                    LookupResult::default()
                }
            }
        };
        if look.load_async && look.external_tokens > 0 && !room {
            counters.load_queue_skips += 1;
            return LookupResult::default();
        }
        look
    }

    /// Fills the tables of `r` for its whole prompt: the local prefix `got` first, the null
    /// block for the entries of the external range `local..ext_end` that hold nothing (a
    /// Mamba `align` group's states before the one at `ext_end`: `policy::admission`), fresh
    /// blocks after it, entries below `local` counted as registered. When the pool cannot supply
    /// the fresh blocks, releases the prefix and returns the blocks an attempt needs
    /// allocatable: the fresh ones and the prefix's that nobody else holds. `fresh` is scratch
    /// (left empty).
    fn allocate_prompt(
        env: &Env<'_, S>,
        r: &mut Req,
        seq: u64,
        (local, ext_end): (u64, u64),
        mut got: Vec<Vec<(BlockId, Generation)>>,
        index: &mut HolderIndex,
        fresh: &mut Vec<BlockRef>,
    ) -> Result<(), usize> {
        let geo = env.geo;
        for (g, grp) in geo.groups().iter().enumerate() {
            while got[g].len() < external_nulls(grp, ext_end) {
                got[g].push((geo.null_block(), 0));
            }
        }
        // Allocate the rest of the prompt in every group: the need `admit_one` bounded
        // (`fewest_blocks_needed`) before asking the connector.
        fresh.clear();
        let prompt_len = r.prompt.len() as u64;
        let need = blocks_needed_at(geo, prompt_len, ext_end, got.iter().map(Vec::len));
        if !env.pool.allocate_n(need, fresh) {
            return Err(need + Self::release_prefix_unheld(env, got));
        }
        let mut fresh = fresh.drain(..);
        for (g, grp) in geo.groups().iter().enumerate() {
            let total = grp.blocks_for_tokens(r.prompt.len() as u64) as usize;
            while got[g].len() < total {
                if let Some(b) = fresh.next() {
                    got[g].push((b.id, b.generation));
                }
            }
            for &(id, _) in &got[g] {
                if id != geo.null_block() {
                    index.add(id, seq);
                }
            }
            r.tables[g] = got[g].iter().map(|x| x.0).collect();
            r.snapshot = None;
            r.gens[g] = got[g].iter().map(|x| x.1).collect();
            r.registered[g] = (local / grp.block_size) as usize;
        }
        Ok(())
    }

    /// [`release_prefix`](Self::release_prefix), returning how many of its blocks nobody holds
    /// once released: allocatable blocks a new attempt would take up again with the prefix,
    /// so they count with what it must allocate.
    fn release_prefix_unheld(env: &Env<'_, S>, got: Vec<Vec<(BlockId, Generation)>>) -> usize {
        let null = env.geo.null_block();
        let ids: Vec<BlockId> = got
            .iter()
            .flatten()
            .map(|&(id, _)| id)
            .filter(|&id| id != null)
            .collect();
        Self::release_prefix(env, got);
        ids.into_iter()
            .filter(|&id| env.pool.ref_count(id) == 0)
            .count()
    }

    /// Releases the entries of a prefix [`local_prefix`](Self::local_prefix) took (nulls
    /// included, which release skips).
    fn release_prefix(env: &Env<'_, S>, got: Vec<Vec<(BlockId, Generation)>>) {
        for t in got {
            for (id, gen) in t {
                Self::release_entry(env, id, gen);
            }
        }
    }

    /// The load of `r`'s external range `start..end` into its tables, without a deadline.
    fn load_job(env: &Env<'_, S>, r: &Req, start: u64, end: u64) -> LoadJob {
        LoadJob {
            request: r.id.clone(),
            tokens: r.prompt.clone(),
            cancel: CancelToken::new(),
            fill: None,
            owner: LoadOwner {
                shard: env.shard,
                key: r.key.raw(),
            },
            attempt: r.attempt,
            start_tokens: start,
            end_tokens: end,
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
            block_sizes: env.geo.groups().iter().map(|g| g.block_size).collect(),
            deadline: None,
        }
    }
}
