//! The step hand-off between the engine thread and the shard threads.
//!
//! Shard 0 runs on the engine thread; shards `1..K` each run [`shard_loop`] on a thread of
//! their own. The engine publishes its share of the report and the step's settings
//! snapshot, then bumps `go` ([`Runtime::start_step`]); each shard thread runs its part
//! ([`Inner::run_shard_step`]) and bumps `done`, which the engine waits for
//! ([`Runtime::wait_for_shards`]). Inside a step the shards meet at the phase barriers.
//! `stop` ends the threads ([`Runtime::stop_shards`]).

use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::rules::geometry::BlockId;
use crate::rules::recovery::InvalidSet;
use crate::runtime::error::RuntimeError;
use crate::runtime::settings::Settings;
use crate::runtime::shard::{Shard, StepSettings};
use crate::runtime::shared::Inner;
use crate::runtime::step::Runtime;
use crate::sync::{thread, Arc, Backoff, Ordering, Parker, Unparker};

/// How long a shard thread keeps checking for the next step (spinning, then yielding)
/// before it parks. Busy engines start steps closer together than this, so the next one
/// usually starts without a wake-up; an idle runtime pays it once, then sleeps.
const SHARD_SPIN_WINDOW: Duration = Duration::from_micros(100);

/// How long the engine thread keeps checking for the other shards of a step before it parks.
const ENGINE_SPIN_WINDOW: Duration = Duration::from_micros(200);

impl Runtime {
    /// Hands the step to shard threads `1..K`: publishes the engine thread's share of the
    /// report and the settings snapshot, then bumps `go` and wakes them.
    pub(super) fn start_step(&self, share: &[BlockId], live: &StdArc<Settings>) {
        *self.inner.report.lock() = Some((share.to_vec(), StdArc::clone(live)));
        self.inner.done.store(0, Ordering::Relaxed);
        // Release: pairs with the Acquire load of `go` in `shard_loop`.
        self.inner.go.fetch_add(1, Ordering::Release);
        // Planted bug `handoff-shard-unpark-dropped` (scripts/plants.sh): parked shard
        // threads are not woken for the step.
        if planted!("handoff-shard-unpark-dropped") {
            return;
        }
        for u in &self.unparkers {
            u.unpark();
        }
    }

    /// Waits until shard threads `1..K` have finished the step: spins briefly (they usually
    /// finish within microseconds of shard 0), then parks until a shard thread unparks it.
    pub(super) fn wait_for_shards(&self) {
        let others = self.inner.shards.len() - 1;
        let backoff = Backoff::new();
        let mut park_after = None;
        // Acquire: pairs with the Release increments of `done` by the shard threads.
        while self.inner.done.load(Ordering::Acquire) < others {
            if !backoff.is_completed() {
                backoff.snooze();
                continue;
            }
            let deadline = *park_after.get_or_insert_with(|| Instant::now() + ENGINE_SPIN_WINDOW);
            if Instant::now() < deadline {
                thread::yield_now();
            } else {
                // Each shard thread unparks the engine after its increment of `done`; one
                // landing before this park makes it return at once.
                self.engine_parker.park();
            }
        }
    }

    /// Sets `stop`, wakes the shard threads and joins them (at shutdown, or on drop).
    pub(super) fn stop_shards(&mut self) {
        // Release: pairs with the Acquire load of `stop` in `shard_loop`.
        self.inner.stop.store(true, Ordering::Release);
        for u in &self.unparkers {
            u.unpark();
        }
        for t in self.shard_threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Inner {
    /// Shard `i`'s settings for this step: its static share with the live snapshot on top.
    fn step_settings(&self, i: usize, live: &Settings) -> StepSettings {
        StepSettings {
            mode: live.mode,
            policy: live.policy,
            load_deadline: live.load_deadline,
            max_load_retries: live.max_load_retries,
            quarantine_after: live.quarantine_after,
            quarantine_for: live.quarantine_for,
            load_policy: live.load_policy,
            compute_rate: live.compute_rate.unwrap_or(0.0),
            load_probe_interval: live.load_probe_interval,
            // Relaxed: set by the engine thread before the `go` Release that started this
            // step (or on this very thread, for a step run inline).
            load_room: share_of(self.load_room.load(Ordering::Relaxed), self.shards.len(), i),
            ..self.settings[i].clone()
        }
    }

    /// Phase 1 of shard `i` at `now`: apply commands and completions; returns its share of
    /// the report (those claim words reset).
    fn phase_publish(
        &self,
        i: usize,
        shard: &mut Shard,
        settings: &StepSettings,
        now: Instant,
    ) -> Vec<BlockId> {
        let slot = &self.shards[i];
        let completions = std::iter::from_fn(|| slot.completions.pop());
        slot.inbox
            .take(|commands| shard.publish(&self.env(i), settings, now, commands, completions))
    }

    /// The step's whole report: the engine's share and every shard's, once all are published
    /// in the shards' slots.
    fn step_report(&self, engine_share: &[BlockId]) -> (Vec<BlockId>, InvalidSet) {
        let mut ids: Vec<BlockId> = engine_share.to_vec();
        for s in &self.shards {
            ids.extend_from_slice(&s.published.lock());
        }
        self.report_of(ids)
    }

    /// The report of the invalid block ids `ids` (the engine's share and the shards'): the ids
    /// sorted, without duplicates, and the set the claims and decisions test against.
    fn report_of(&self, mut ids: Vec<BlockId>) -> (Vec<BlockId>, InvalidSet) {
        ids.sort_unstable();
        ids.dedup();
        let report = InvalidSet::flat(ids.iter().copied(), &self.geo);
        (ids, report)
    }

    /// Phase 3 of shard `i` at `now`, once every hit of every shard is claimed: decide, land,
    /// admit, schedule; the shard's result and the loads it started go into `out`, which
    /// holds an emptied outcome (its lists' room is reused).
    fn phase_finish(
        &self,
        i: usize,
        shard: &mut Shard,
        settings: &StepSettings,
        now: Instant,
        out: &mut ShardOutcome,
    ) {
        let slot = &self.shards[i];
        // Relaxed: set by the engine thread before the `go` Release that started this step
        // (or on this very thread, for a step run inline).
        let draining = self.draining.load(Ordering::Relaxed);
        let (res, loads) = out;
        shard.finish_step(&self.env(i), settings, now, draining, loads, res);
        if !res.ended.is_empty() {
            let mut live = slot.ids.lock();
            for (id, _) in &res.ended {
                live.remove(id);
            }
        }
    }

    /// Runs `f`, one phase of shard `i`, unless an earlier phase of this step panicked; a
    /// panic poisons the runtime (the first one is kept) and skips the shard's later phases,
    /// while the shard still meets the others at every barrier, so no thread waits forever.
    fn guarded(&self, i: usize, failed: &mut bool, f: impl FnOnce()) {
        if *failed {
            return;
        }
        // Planted bug for the poison test: a shard's panic is not caught.
        if planted!("shard-panic-escapes") {
            return f();
        }
        if let Err(message) = crate::panics::caught(f) {
            *failed = true;
            self.poison.lock().get_or_insert((i, message));
        }
    }

    /// Test hook: panics in the shard chosen by `panic_in_shard`.
    #[cfg(test)]
    fn test_panic(&self, i: usize) {
        if self
            .panic_in_shard
            .compare_exchange(i, usize::MAX, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            panic!("test panic in shard {i}");
        }
    }

    /// Test hook: shard `i`'s claims, when `slow_claims_in_shard` names it, start only after
    /// a pause far longer than any other shard's claims and decisions take.
    #[cfg(test)]
    fn test_slow_claims(&self, i: usize) {
        if self
            .slow_claims_in_shard
            .compare_exchange(i, usize::MAX, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            thread::sleep(Duration::from_millis(300));
        }
    }

    /// One shard's part of a step run in parallel: every shard runs it concurrently, meeting
    /// at the phase barrier between publishing and claiming, and between claiming and
    /// deciding (skipped by every shard alike when the report is empty).
    ///
    /// Returns the step's whole report (sorted ids), which the engine thread's call hands
    /// to the plan.
    pub(super) fn run_shard_step(
        &self,
        i: usize,
        engine_share: &[BlockId],
        live: &Settings,
    ) -> Vec<BlockId> {
        let settings = &self.step_settings(i, live);
        // The other shards mutate the pool alongside.
        let _pool = self.pool.shared();
        let mut shard = self.shards[i].state.lock();
        let mut failed = false;
        // A share left from an earlier step must not stand in for one a panic never wrote.
        self.shards[i].published.lock().clear();
        self.guarded(i, &mut failed, || {
            #[cfg(test)]
            self.test_panic(i);
            let mine = self.phase_publish(i, &mut shard, settings, Instant::now());
            *self.shards[i].published.lock() = mine;
        });
        // Barrier 1: every share of the report is published and its claim words reset.
        self.barrier.wait();
        let (ids, report) = self.step_report(engine_share);
        if !report.is_empty() {
            self.guarded(i, &mut failed, || {
                #[cfg(test)]
                self.test_slow_claims(i);
                shard.claim(&self.env(i), settings, &report, &ids);
            });
            // Barrier 2: every hit of every shard is claimed before anyone decides.
            if !planted!("decide-early") {
                self.barrier.wait();
            }
        }
        let early = planted!("decide-early") && !report.is_empty();
        self.guarded(i, &mut failed, || {
            let mut outcome = ShardOutcome::default();
            self.phase_finish(i, &mut shard, settings, Instant::now(), &mut outcome);
            *self.shards[i].result.lock() = Some(outcome);
        });
        if early {
            self.barrier.wait();
        }
        ids
    }

    /// The whole step on the calling thread, phase by phase across the shards: every shard
    /// publishes, then every shard claims, then every shard decides — the same order the
    /// barriers impose in parallel, with no hand-off at all: the shares of the report and
    /// the results stay on this thread, never in the shards' slots.
    ///
    /// The shards schedule into one list, each appending to the last one's, so the plan's
    /// list is made once, with room for all any shard may schedule, and never copied or grown
    /// while it is merged.
    ///
    /// Returns the step's whole report (the engine's share and every shard's, sorted, without
    /// duplicates); each shard's outcome is in `scratch.outcomes`, filled unless
    /// `scratch.failed` says the shard panicked.
    pub(super) fn run_step_inline(
        &self,
        engine_share: Vec<BlockId>,
        live: &Settings,
        scratch: &mut StepScratch,
    ) -> Vec<BlockId> {
        let k = self.shards.len();
        let StepScratch {
            settings,
            failed,
            outcomes,
        } = scratch;
        settings.clear();
        settings.extend((0..k).map(|i| self.step_settings(i, live)));
        failed.clear();
        failed.resize(k, false);
        outcomes.resize_with(k, ShardOutcome::default);
        // Every shard runs on this thread: the pool has one mutator for the step.
        // SAFETY: outside shutdown (which takes the runtime by value, so no step overlaps it),
        // only the shards' steps mutate the pool or reach its index: this one, and parallel
        // steps' shards, which hold `shared` for theirs. Loads' workers only read fill flags,
        // and submits and cancels only queue commands.
        let _pool = unsafe { self.pool.exclusive() };
        let mut shards: SmallVec<[_; INLINE_GUARDS]> =
            self.shards.iter().map(|s| s.state.lock()).collect();
        let mut ids = engine_share;
        // One clock read per phase, not per shard: the shards of an inline step run back to
        // back, and their deadlines and load timings are judged at the same instant.
        let now = Instant::now();
        for (i, shard) in shards.iter_mut().enumerate() {
            self.guarded(i, &mut failed[i], || {
                #[cfg(test)]
                self.test_panic(i);
                ids.extend(self.phase_publish(i, shard, &settings[i], now));
            });
        }
        let (ids, report) = self.report_of(ids);
        if !report.is_empty() {
            for (i, shard) in shards.iter_mut().enumerate() {
                self.guarded(i, &mut failed[i], || {
                    shard.claim(&self.env(i), &settings[i], &report, &ids);
                });
            }
        }
        // Room for the most the shards can schedule, rounded up to a power of two: the list's
        // size then stays in one allocator size class while the live count is steady, so the
        // list the engine dropped is the one reused, not fresh memory. None for a step that
        // can schedule nothing (an idle runtime's).
        let bound: usize = shards
            .iter()
            .zip(settings.iter())
            .map(|(shard, s)| shard.schedule_bound(s))
            .sum();
        let mut list = match bound {
            0 => Vec::new(),
            n => Vec::with_capacity(n.next_power_of_two()),
        };
        let now = Instant::now();
        for (i, shard) in shards.iter_mut().enumerate() {
            // The list comes with the shards' before this one: its own entries follow.
            shard.schedule_after(std::mem::take(&mut list));
            // The outcome is written into the shard's slot of `outcomes`, kept from step to
            // step: a large value (its lists and a step's counters) never moved whole.
            let out = &mut outcomes[i];
            self.guarded(i, &mut failed[i], || {
                self.phase_finish(i, shard, &settings[i], now, out);
            });
            if !failed[i] && i + 1 < k {
                list = std::mem::take(&mut out.0.scheduled);
            }
        }
        ids
    }
}

/// Shard `i`'s share of `room` split between `k` shards: equal shares, the first `room mod k`
/// shards one more, so the shares add up to `room` (`usize::MAX`, no bound, stays unbounded).
fn share_of(room: usize, k: usize, i: usize) -> usize {
    if room == usize::MAX || k == 0 {
        return room;
    }
    room / k + usize::from(i < room % k)
}

/// A shard's result for a step and the loads it started.
pub(super) type ShardOutcome = (
    crate::runtime::shard::ShardStepResult,
    Vec<crate::connector::LoadJob>,
);

/// Lists every step fills and empties again, kept by the runtime from step to step for
/// their room: a step allocates none of them.
#[derive(Default)]
pub(super) struct StepScratch {
    /// Each shard's settings for a step run inline.
    settings: Vec<StepSettings>,
    /// Whether each shard panicked in a phase of this step: its later phases are skipped and
    /// its outcome is not filled.
    pub(super) failed: Vec<bool>,
    /// Each shard's outcome, by shard number: filled by the step (unless the shard
    /// `failed`), emptied by [`Runtime::collect`], kept for its lists' room.
    pub(super) outcomes: Vec<ShardOutcome>,
}

/// Shards whose guards a step run inline keeps on the stack (more take one allocation).
const INLINE_GUARDS: usize = 4;

/// Shard `i`'s thread: waits for each step's `go`, runs its part of it, counts it in `done`.
pub(super) fn shard_loop(inner: &Inner, i: usize, parker: Parker) {
    let mut seen = 0u64;
    let backoff = Backoff::new();
    let mut idle_since = Instant::now();
    loop {
        // Acquire: pairs with the Release increment of `go` in `Runtime::start_step`; the
        // step's report share and settings written before it are visible.
        let go = inner.go.load(Ordering::Acquire);
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
        if go == seen {
            // Steps of a busy engine come close together: spin briefly so the next one can
            // start without a wake-up, then park untimed (`start_step` and `stop_shards`
            // unpark; one landing before the park makes it return at once).
            if !backoff.is_completed() {
                backoff.snooze();
            } else if idle_since.elapsed() < SHARD_SPIN_WINDOW {
                thread::yield_now();
            } else {
                parker.park();
            }
            continue;
        }
        backoff.reset();
        seen = go;
        let Some((share, live)) = inner.report.lock().clone() else {
            continue;
        };
        let _ = inner.run_shard_step(i, &share, &live);
        // Release: publishes this shard's result slot to the engine, which Acquire-loads
        // `done` in `Runtime::wait_for_shards`.
        inner.done.fetch_add(1, Ordering::Release);
        // Planted bug `handoff-engine-unpark-dropped` (scripts/plants.sh): a parked engine is
        // not woken by the shard that finished its part.
        if !planted!("handoff-engine-unpark-dropped") {
            inner.engine.unpark();
        }
        idle_since = Instant::now();
    }
}

/// The threads of shards `1..K` and the unparkers that wake them.
pub(super) type ShardThreads = (Vec<thread::JoinHandle<()>>, Vec<Unparker>);

/// Starts a thread per shard `1..K`, each running [`shard_loop`] with its own parker. If one
/// cannot be started, those already running are stopped and joined.
pub(super) fn spawn_shard_threads(inner: &Arc<Inner>) -> Result<ShardThreads, RuntimeError> {
    let k = inner.shards.len();
    let mut threads = Vec::new();
    let mut unparkers = Vec::new();
    for i in 1..k {
        let p = Parker::new();
        unparkers.push(p.unparker());
        let inner2 = Arc::clone(inner);
        let h = thread::Builder::new()
            .name(format!("kvsched-shard-{i}"))
            .spawn(move || shard_loop(&inner2, i, p));
        match h {
            Ok(h) => threads.push(h),
            Err(e) => {
                inner.stop.store(true, Ordering::Release);
                for u in &unparkers {
                    u.unpark();
                }
                for t in threads {
                    let _ = t.join();
                }
                return Err(e.into());
            }
        }
    }
    Ok((threads, unparkers))
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use std::time::Duration;

    use crate::rules::recovery::{Mode, Policy};
    use crate::runtime::policy::load_cost::LoadPolicy;
    use crate::runtime::{Runtime, Settings};

    /// A change made by `update_settings` applies from the next step on every shard: each
    /// setting a shard's step reads comes from the live snapshot the step started with, none
    /// from the settings the runtime was built with (the shard's static share holds only its
    /// budgets and its recording flag).
    #[test]
    fn every_shard_steps_with_the_live_settings() {
        let rt = Runtime::builder()
            .shards(3)
            .settings(Settings::default())
            .build()
            .expect("runtime");
        let live = Settings {
            mode: Mode::Vllm,
            policy: Policy::Fail,
            load_deadline: Some(Duration::from_millis(7)),
            max_load_retries: 9,
            quarantine_after: 11,
            quarantine_for: Duration::from_secs(13),
            load_policy: LoadPolicy::Cost,
            compute_rate: Some(17.0),
            load_probe_interval: Duration::from_millis(19),
        };
        rt.update_settings(live.clone()).expect("valid settings");
        let snapshot = rt.inner.live_settings.load_full();
        for i in 0..3 {
            let s = rt.inner.step_settings(i, &snapshot);
            assert_eq!(
                (s.mode, s.policy, s.load_deadline, s.max_load_retries),
                (
                    live.mode,
                    live.policy,
                    live.load_deadline,
                    live.max_load_retries
                ),
                "shard {i}"
            );
            assert_eq!(
                (s.quarantine_after, s.quarantine_for, s.load_policy),
                (live.quarantine_after, live.quarantine_for, live.load_policy),
                "shard {i}"
            );
            assert_eq!(
                (s.compute_rate, s.load_probe_interval),
                (17.0, live.load_probe_interval),
                "shard {i}"
            );
        }
        let _ = rt.shutdown();
    }
}
