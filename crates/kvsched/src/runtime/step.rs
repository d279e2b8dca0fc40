//! The [`Runtime`] the engine thread drives: each [`schedule`](Runtime::schedule) runs a
//! step on every shard and merges their results into a [`StepPlan`]; [`update`](Runtime::update)
//! queues the engine's [`StepOutput`] for the next one.

use std::sync::Arc as StdArc;
use std::time::Duration;

use crate::pool::BlockRef;
use crate::rules::geometry::{BlockId, Geometry};
use crate::runtime::builder::Builder;
use crate::runtime::discard::{discarded, HandedOut};
use crate::runtime::error::RuntimeError;
#[cfg(doc)]
use crate::runtime::handle::Handle;
use crate::runtime::handoff::{ShardOutcome, StepScratch};
use crate::runtime::merge::{in_request_order, MergeScratch};
use crate::runtime::plan::{StepOutput, StepPlan};
use crate::runtime::policy::trust::{sync_report, SyncReport};
use crate::runtime::shard::{Command, EndState, Metrics};
use crate::runtime::shared::{Inner, MAX_QUEUED_LOADS};
use crate::runtime::signal::WorkSignal;
use crate::runtime::stall::Progress;
use crate::runtime::step_mode::{LastStep, StepWork};
use crate::runtime::worker::WorkerPool;
use crate::sync::{thread, Arc, Ordering, Parker, Unparker};

/// The scheduler core an engine embeds: one engine thread drives [`schedule`](Runtime::schedule)
/// and [`update`](Runtime::update); other threads submit and cancel through a [`Handle`].
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use kvsched_testkit::{SimConfig, SimConnector};
/// use kvsched::{CacheGroup, MambaMode, Runtime, StepOutput, SubmitRequest};
///
/// let mut rt = Runtime::builder()
///     .groups(vec![CacheGroup::full_attention(16), CacheGroup::mamba(64, MambaMode::Align)])
///     .pool_blocks(4096)
///     .shards(2)
///     .workers(2)
///     .connector(Arc::new(SimConnector::new(SimConfig::default())))
///     .build()?;
/// rt.submit(SubmitRequest {
///     id: "r1".into(),
///     prompt: vec![1; 300],
///     max_new_tokens: 8,
///     priority: 0,
///     load_deadline: None,
/// })?;
/// let mut out = StepOutput::default();
/// while rt.live() > 0 {
///     rt.update(std::mem::take(&mut out));
///     let plan = rt.schedule()?; // recovery, admission, loads, scheduling
///     out.step = plan.step; // the output answers this plan
///     // … the engine runs the model on plan.scheduled (and the sync loads they carry) …
///     for s in &plan.scheduled {
///         if s.samples {
///             out.sampled.push(s.id.clone());
///         }
///     }
///     if plan.scheduled.is_empty() && rt.live() > 0 {
///         rt.wait_for_work(Duration::from_millis(1));
///     }
/// }
/// let report = rt.shutdown();
/// assert_eq!(report.metrics.finished, 1);
/// assert!(report.violations.is_empty());
/// # Ok::<(), kvsched::RuntimeError>(())
/// ```
pub struct Runtime {
    pub(super) inner: Arc<Inner>,
    pub(super) workers: Option<WorkerPool>,
    pub(super) shard_threads: Vec<thread::JoinHandle<()>>,
    pub(super) unparkers: Vec<Unparker>,
    pub(super) engine_parker: Parker,
    pub(super) sync_invalid: Vec<BlockRef>,
    pub(super) handoffs: Vec<BlockRef>,
    pub(super) metrics: Metrics,
    pub(super) signal: StdArc<WorkSignal>,
    pub(super) shutdown_timeout: Duration,
    /// Workers' count of expired jobs handed back unrun, kept once the workers are gone.
    pub(super) expired_unrun_at_shutdown: u64,
    /// Completions signalled before the last `schedule` started draining.
    pub(super) events_at_schedule: u64,
    /// The latest plan's step number (0 before the first).
    pub(super) step: u64,
    /// Steps with at most this many live requests run inline on the engine thread.
    pub(super) inline_up_to: usize,
    /// Work units from which a step runs in parallel ([`Builder::parallel_step_work`]).
    pub(super) parallel_work: usize,
    /// What the last step did, for the next one's work estimate.
    pub(super) last_step: LastStep,
    /// Whether the latest plan scheduled work whose output must come back.
    pub(super) expect_output: bool,
    /// Whether `update` brought the latest plan's output.
    pub(super) answered: bool,
    /// Consecutive steps without progress (see [`Runtime::schedule`]).
    pub(super) stalled_steps: u32,
    /// No token or end has followed the latest preemption across shards (`resolve_stall`).
    pub(super) preempted_unserved: bool,
    /// The latest step left the next one work that no event announces (see
    /// [`Runtime::wait_for_work`]): `poll_work` and `wait_for_work` return `true` at once.
    pub(super) work_pending: bool,
    /// Set once a shard panicked: (shard, step, message). No step runs after it.
    pub(super) panicked: Option<(usize, u64, String)>,
    /// What the latest plan handed out (sync destinations, reads).
    pub(super) handed: HandedOut,
    /// Room the plan list's merge keeps from step to step.
    pub(super) merge: MergeScratch,
    /// Asynchronous loads handed to the workers.
    pub(super) loads_sent: u64,
    /// `loads_sent` when the workers' queue was last found with room, and that room
    /// ([`workers_room`](Self::workers_room)).
    pub(super) room_at_loads_sent: Option<(u64, usize)>,
    /// `update`'s per-shard command lists, empty between calls (kept for their capacity).
    pub(super) command_batches: Vec<Vec<Command>>,
    /// The lists a step fills and empties, kept for their capacity.
    pub(super) scratch: StepScratch,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("step", &self.step)
            .field("shards", &self.inner.shards.len())
            .finish()
    }
}

impl Runtime {
    /// A builder with the defaults.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The validated geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.inner.geo
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.inner.shards.len()
    }

    /// Runs one step on every shard and returns what to compute. A step runs its shards in
    /// parallel (shard 0 on this thread, the others on theirs) when more than
    /// [`Builder::inline_steps_up_to`] requests are live and its work estimate (queued
    /// commands and completions, what the last step scheduled, the waiting it may admit)
    /// reaches [`Builder::parallel_step_work`]; otherwise all on this thread — the same
    /// phases in the same order, without waking a thread. The recovery decisions do not
    /// depend on which; what a parallel step's shards admit, from one pool at the same time,
    /// may (docs/runtime.md#idle-cost).
    ///
    /// # Errors
    ///
    /// [`RuntimeError::ShardPanicked`] when a shard panicked during this step or an earlier
    /// one: the step was released on every shard (no thread is left waiting), and the
    /// runtime takes no more steps. Panics in a connector never get here: they are caught
    /// where they happen and counted ([`Metrics::connector_panics`]).
    pub fn schedule(&mut self) -> Result<StepPlan, RuntimeError> {
        if let Some(e) = self.poisoned() {
            return Err(e);
        }
        self.step += 1;
        // Acquire: pairs with the Release increment in `WorkSignal::notify`; read before the
        // shards drain, so a completion counted after this point may still be undrained and
        // `wait_for_work` must not sleep past it.
        self.events_at_schedule = self.signal.events.load(Ordering::Acquire);
        if self.expect_output && !self.answered {
            // The last plan's output never came back: its shards re-offer its work.
            self.metrics.lost_outputs += 1;
            for slot in &self.inner.shards {
                slot.inbox.push(Command::OutputLost);
            }
        }
        let share = self.engine_share();
        // Planted bug (scripts/plants.sh): the workers' queue is never full, so loads pile up
        // behind a connector that never returns.
        let room = if planted!("load-queue-unbounded") {
            usize::MAX
        } else {
            self.workers_room()
        };
        // Relaxed: read by the shards of this step, after the `go` Release (or on this thread).
        self.inner.load_room.store(room, Ordering::Relaxed);
        // One snapshot of the live settings for the whole step, on every shard.
        let live = self.inner.live_settings.load_full();
        let span = tracing::debug_span!("kvsched_step", step = self.step);
        let _enter = span.enter();
        let mut scratch = std::mem::take(&mut self.scratch);
        let plan = if !self.runs_parallel(share.len()) {
            let report = self.inner.run_step_inline(share, &live, &mut scratch);
            self.collect(report, &mut scratch.outcomes, &scratch.failed)
        } else {
            self.metrics.parallel_steps += 1;
            self.start_step(&share, &live);
            let report = self.inner.run_shard_step(0, &share, &live);
            self.wait_for_shards();
            // Every shard's result, from the shards' slots.
            let k = self.inner.shards.len();
            scratch.outcomes.resize_with(k, ShardOutcome::default);
            // A shard that panicked left no result in its slot.
            scratch.failed.clear();
            scratch.failed.resize(k, true);
            for (i, slot) in self.inner.shards.iter().enumerate() {
                if let Some(r) = slot.result.lock().take() {
                    scratch.outcomes[i] = r;
                    scratch.failed[i] = false;
                }
            }
            self.collect(report, &mut scratch.outcomes, &scratch.failed)
        };
        self.scratch = scratch;
        if let Some((shard, message)) = self.inner.poison.lock().clone() {
            self.panicked = Some((shard, self.step, message));
            // Poisoned: no step runs again, so handles queue nothing more (`Handle`).
            *self.inner.open.write() = false;
        }
        if let Some(e) = self.poisoned() {
            return Err(e);
        }
        self.expect_output = !plan.scheduled.is_empty();
        self.answered = false;
        self.handed.record(&plan);
        Ok(plan)
    }

    /// The error of a poisoned runtime (a shard panicked), if it is one.
    pub(super) fn poisoned(&self) -> Option<RuntimeError> {
        self.panicked
            .as_ref()
            .map(|(shard, step, message)| RuntimeError::ShardPanicked {
                shard: *shard,
                step: *step,
                message: message.clone(),
            })
    }

    /// The engine thread's share of the report: sync-load failures of the last step and
    /// blocks handed off by owners that ended, minus stale ones. Their claim words are reset.
    fn engine_share(&mut self) -> Vec<BlockId> {
        let mut share = Vec::new();
        for b in self.sync_invalid.drain(..) {
            // Planted bug for the fault matrix: trust a report whatever its generation.
            let current = if planted!("trust-stale") {
                b.id < self.inner.pool.num_blocks() as u64
            } else {
                self.inner.pool.is_current(b)
            };
            if b.id != self.inner.geo.null_block() && current {
                share.push(b.id);
            } else {
                self.metrics.stale_blocks += 1;
                self.inner.claims.forget(b.id);
            }
        }
        // A handed-off block freed and reused since has no sharer left to recompute it.
        for b in self.handoffs.drain(..) {
            if self.inner.pool.is_current(b) {
                share.push(b.id);
            } else {
                self.inner.claims.forget(b.id);
            }
        }
        for &id in &share {
            self.inner.claims.reset(id);
        }
        share
    }

    /// Merges the result of every shard that finished the step (not `failed[i]`: its outcome
    /// is `outcomes[i]`) into the step's plan, in canonical order, dispatching the loads they
    /// started and counting what they did; every list of those outcomes is left empty, with
    /// what room the plan did not take. `report` is the step's whole report, as the shards
    /// claimed against it: sorted, without duplicates.
    fn collect(
        &mut self,
        report: Vec<BlockId>,
        outcomes: &mut [ShardOutcome],
        failed: &[bool],
    ) -> StepPlan {
        let mut plan = StepPlan {
            step: self.step,
            ..StepPlan::default()
        };
        let mut evicted = Vec::new();
        let mut progress = Progress::default();
        // The plan's list is the longest shard list, the others appended to it (one growth at
        // most, often in place): no fresh list per step, whose pages the allocator may have
        // returned to the system since the last one.
        let finished = || {
            outcomes
                .iter()
                .zip(failed)
                .enumerate()
                .filter(|(_, (_, failed))| !**failed)
        };
        let total: usize = finished().map(|(_, ((r, _), _))| r.scheduled.len()).sum();
        let longest = finished()
            .max_by_key(|(_, ((r, _), _))| r.scheduled.len())
            .map(|(i, _)| i);
        if let Some((longest, _)) = longest.and_then(|i| outcomes.get_mut(i)) {
            plan.scheduled = std::mem::take(&mut longest.scheduled);
            plan.scheduled.reserve(total - plan.scheduled.len());
        }
        // Each outcome's lists are taken where they lie.
        for (i, ((res, loads), _)) in outcomes
            .iter_mut()
            .zip(failed)
            .enumerate()
            .filter(|(_, (_, failed))| !**failed)
        {
            progress.add(i, res, loads.len());
            if let Some(w) = &self.workers {
                self.loads_sent += loads.len() as u64;
                for j in loads.drain(..) {
                    w.dispatch(j);
                }
            }
            // Without workers (shut down) a load started is dropped, as it always was.
            loads.clear();
            self.metrics += &res.counters;
            for (_, state) in &res.ended {
                match state {
                    EndState::Finished => self.metrics.finished += 1,
                    EndState::Failed => self.metrics.failed += 1,
                    EndState::Cancelled => self.metrics.cancelled += 1,
                }
            }
            plan.scheduled.append(&mut res.scheduled);
            absorb(&mut plan.recovery.recovered, &mut res.recovered);
            absorb(&mut plan.recovery.scanned, &mut res.scanned);
            absorb(&mut evicted, &mut res.evicted);
            absorb(&mut plan.ended, &mut res.ended);
            self.handoffs.append(&mut res.handoffs);
            absorb(&mut plan.runnable_latency_ns, &mut res.runnable_latency_ns);
            absorb(
                &mut plan.first_schedule_latency_ns,
                &mut res.first_schedule_latency_ns,
            );
        }
        evicted.sort_unstable();
        evicted.dedup();
        plan.recovery.report = report;
        plan.recovery.evicted_blocks = evicted;
        plan.scheduled = in_request_order(std::mem::take(&mut plan.scheduled), &mut self.merge);
        plan.recovery.recovered.sort_by_key(|r| r.key);
        plan.recovery.scanned.sort_by_key(|r| r.key);
        if !plan.recovery.recovered.is_empty() {
            let tokens: u64 = plan
                .recovery
                .recovered
                .iter()
                .map(|r| r.decision.affected_tokens)
                .sum();
            tracing::warn!(
                step = self.step,
                invalid_blocks = plan.recovery.report.len(),
                affected_requests = plan.recovery.recovered.len(),
                affected_tokens = tokens,
                "recovered from failed KV loads"
            );
        }
        self.metrics.steps += 1;
        self.last_step = LastStep {
            scheduled: plan.scheduled.len(),
            waiting: progress.waiting,
        };
        progress.moved |= !plan.scheduled.is_empty() || !plan.recovery.report.is_empty();
        let stall_resolves = self.resolve_stall(&progress);
        self.work_pending = self.work_left(&plan, &progress, stall_resolves);
        plan
    }

    /// Applies the engine's output for the last step. It takes effect at the next
    /// [`Runtime::schedule`], after that step's recovery (which may discard it).
    ///
    /// The engine contract: every plan that schedules work is answered by one `update` whose
    /// [`StepOutput::step`] is the plan's, before the next `schedule`. A plan left unanswered
    /// when the next `schedule` starts is taken as lost (a crashed step;
    /// [`Metrics::lost_outputs`]): the engine may have run none, part or all of it. Each of its
    /// requests is offered the step again at its length before it when the bytes read there
    /// are known written and the step cannot have changed them; otherwise (the step carried a
    /// sync load, or may have advanced a Mamba state in place) the request restarts from what
    /// the prefix cache holds ([`Metrics::lost_output_restarts`]). An output arriving after
    /// that is stale and ignored.
    ///
    /// What the output claims is checked against what the plan handed out: a sample counts
    /// only for a request the plan scheduled to sample (others: `unexpected_samples`, or
    /// `unknown_commands` for an id naming no live request, counted by the next `schedule`,
    /// whose shards take the samples), and a failed block only if it is a destination of one
    /// of the plan's sync loads (others: `foreign_blocks`; at an older generation than the
    /// plan's: `stale_blocks`; at a newer one, which no earlier use of the slot had, the
    /// destination as handed out). Neither can roll back a request the step did not load
    /// for.
    ///
    /// # Returns: the outputs to discard
    ///
    /// The requests whose output of this step was computed from a block one of the step's
    /// sync loads failed to fill (the loader itself and every request whose table holds that
    /// block below its pre-step length), in plan order. The engine must not emit their
    /// samples: call `update` after running the step and before sending any token, and send
    /// only the samples of requests not returned. The next [`Runtime::schedule`]'s recovery
    /// discards exactly these outputs (`skip`, or `failed` under policy `fail`). Empty for an
    /// output that names another step or no invalid block.
    pub fn update(&mut self, out: StepOutput) -> Vec<StdArc<str>> {
        let first_answer = out.step == self.step && !self.answered;
        if out.step == self.step {
            self.answered = true;
        }
        // Each shard's commands go to its inbox as one batch, in the output's order.
        let mut batches = std::mem::take(&mut self.command_batches);
        batches.resize_with(self.inner.shards.len(), Vec::new);
        let one_shard = batches.len() == 1;
        for id in out.finished {
            let i = self.inner.shard_of(&id);
            batches[i].push(Command::Finish(id));
        }
        let current = out.step == self.step;
        if !current {
            if !out.sampled.is_empty() || !out.invalid_blocks.is_empty() {
                self.metrics.stale_outputs += 1;
            }
        } else if self.handed.sampled_as_planned(&out.sampled) {
            // The plan's own sampling ids, in its order: each shard samples the requests it
            // scheduled to sample, with no sample routed or looked up by id.
            if !out.sampled.is_empty() {
                for batch in &mut batches {
                    batch.push(Command::SampledAll);
                }
            }
        } else if one_shard {
            // Every sample goes to the one shard: nothing to route.
            if let Some(batch) = batches.first_mut() {
                batch.extend(out.sampled.into_iter().map(Command::Sampled));
            }
        } else {
            // Each shard keeps a sample only for a request the plan scheduled to sample.
            for id in out.sampled {
                let i = self.inner.shard_of(&id);
                batches[i].push(Command::Sampled(id));
            }
        }
        for (slot, batch) in self.inner.shards.iter().zip(&mut batches) {
            slot.inbox.push_all(batch);
        }
        self.command_batches = batches;
        if !current {
            return Vec::new();
        }
        let mut failed_ids = rustc_hash::FxHashSet::default();
        for b in out.invalid_blocks {
            match sync_report(&self.handed.sync_dests, b) {
                SyncReport::Destination(d) => {
                    if self.inner.pool.is_current(d) {
                        failed_ids.insert(d.id);
                    }
                    self.sync_invalid.push(d);
                }
                SyncReport::Stale => self.metrics.stale_blocks += 1,
                SyncReport::Foreign => self.metrics.foreign_blocks += 1,
            }
        }
        if first_answer {
            for load in &self.handed.sync_dests {
                if load.iter().any(|d| failed_ids.contains(&d.id)) {
                    self.metrics.sync_loads_failed += 1;
                } else {
                    self.metrics.sync_loads_ok += 1;
                }
            }
        }
        let reported: rustc_hash::FxHashSet<BlockId> =
            self.sync_invalid.iter().map(|b| b.id).collect();
        let discard = discarded(&self.inner.geo, &self.handed.reads, &reported);
        // Each shard learns what the engine was told to discard: every other sample that
        // came, the engine kept, whatever the next step's recovery decides. One push a shard.
        if !discard.is_empty() {
            let mut batches = std::mem::take(&mut self.command_batches);
            for id in &discard {
                batches[self.inner.shard_of(id)].push(Command::Discarded(id.clone()));
            }
            for (slot, batch) in self.inner.shards.iter().zip(&mut batches) {
                slot.inbox.push_all(batch);
            }
            self.command_batches = batches;
        }
        discard
    }

    /// Counters so far.
    pub fn metrics(&self) -> Metrics {
        let mut m = self.metrics.clone();
        m.submitted = self.inner.submitted.load(Ordering::Relaxed);
        if let Some(w) = &self.workers {
            m.loads_expired_unrun = w.counts().expired_unrun.load(Ordering::Relaxed);
        } else {
            m.loads_expired_unrun = self.expired_unrun_at_shutdown;
        }
        m
    }

    /// Asynchronous loads handed to the workers whose completion has not reached its shard's
    /// queue yet. 0 means the next [`Runtime::schedule`] takes every completion of every load
    /// dispatched so far (a lockstep engine waits for that, so no decision depends on when a
    /// worker finishes).
    pub fn loads_in_flight(&self) -> u64 {
        let Some(w) = &self.workers else {
            return 0;
        };
        // Acquire: pairs with the Release increment after a worker's push, so every
        // completion counted here is in its queue for the next step to drain.
        let delivered = w.counts().delivered.load(Ordering::Acquire);
        self.loads_sent.saturating_sub(delivered)
    }

    /// Requests submitted and not yet ended: a submission counts at once (before the step
    /// that admits it), an end once the step that ends it has run (`schedule` returned it in
    /// [`StepPlan::ended`](crate::StepPlan::ended)).
    pub fn live(&self) -> usize {
        self.inner.shards.iter().map(|s| s.ids.lock().len()).sum()
    }

    /// Whether the step about to run, with `share` blocks of the engine's in its report,
    /// runs in parallel ([`crate::runtime::step_mode`]).
    fn runs_parallel(&self, share: usize) -> bool {
        let shards = self.inner.shards.len();
        let live = self.live_estimate();
        if StepWork::inline_whatever_the_work(shards, live, self.inline_up_to) {
            // Its work, which takes each inbox's lock to estimate, cannot change the answer.
            return false;
        }
        let max_seqs = self.inner.settings.iter().map(|s| s.max_seqs).sum();
        StepWork::estimate(&self.inner, self.last_step, share, max_seqs).parallel(
            shards,
            live,
            self.inline_up_to,
            self.parallel_work,
        )
    }

    /// Room in the workers' queue: how many more jobs it may hold before [`MAX_QUEUED_LOADS`].
    /// The queue only shrinks between dispatches, so room found once lasts (at least) until
    /// the next load is dispatched: the queue's length, on cache lines the workers write, is
    /// read only after a step that dispatched loads or found it full.
    fn workers_room(&mut self) -> usize {
        let Some(w) = &self.workers else {
            return MAX_QUEUED_LOADS;
        };
        if let Some((sent, room)) = self.room_at_loads_sent {
            if sent == self.loads_sent {
                return room;
            }
        }
        let room = MAX_QUEUED_LOADS.saturating_sub(w.queued());
        self.room_at_loads_sent = (room > 0).then_some((self.loads_sent, room));
        room
    }

    /// Requests submitted and not yet ended, from counters (no lock): a step's size hint.
    fn live_estimate(&self) -> usize {
        let m = &self.metrics;
        // Relaxed: a hint; submissions racing this read change only which mode runs.
        let submitted = self.inner.submitted.load(Ordering::Relaxed);
        submitted.saturating_sub(m.finished + m.failed + m.cancelled) as usize
    }
}

/// Moves `from`'s items to the end of `into`, taking `from`'s list whole when `into` is
/// empty (the first shard's share of a plan list), so a one-shard step copies and allocates
/// nothing.
fn absorb<T>(into: &mut Vec<T>, from: &mut Vec<T>) {
    if into.is_empty() {
        std::mem::swap(into, from);
    } else {
        into.append(from);
    }
}
