//! The step hand-off between the engine thread and the shard threads.
//!
//! Shard 0 runs on the engine thread; shards `1..K` each run [`shard_loop`] on a thread of
//! their own. The engine publishes its share of the report and the step's settings
//! snapshot, then bumps `go` ([`Runtime::start_step`]); each shard thread runs its part
//! ([`Inner::run_shard_step`]) and bumps `done`, which the engine waits for
//! ([`Runtime::wait_for_shards`]). Inside a step the shards meet at the phase barriers.
//! `stop` ends the threads ([`Runtime::stop_shards`]).

use std::sync::Arc as StdArc;
use std::time::Instant;

use crate::rules::geometry::BlockId;
use crate::rules::recovery::InvalidSet;
use crate::runtime::engine::Runtime;
use crate::runtime::error::RuntimeError;
use crate::runtime::settings::Settings;
use crate::runtime::shard::StepSettings;
use crate::runtime::shared::Inner;
use crate::sync::{thread, Arc, Backoff, Ordering, Parker, Unparker};

impl Runtime {
    /// Hands the step to shard threads `1..K`: publishes the engine thread's share of the
    /// report and the settings snapshot, then bumps `go` and wakes them.
    pub(super) fn start_step(&self, share: &[BlockId], live: &StdArc<Settings>) {
        *self.inner.report.lock() = Some((share.to_vec(), StdArc::clone(live)));
        self.inner.done.store(0, Ordering::Relaxed);
        // Release: pairs with the Acquire load of `go` in `shard_loop`.
        self.inner.go.fetch_add(1, Ordering::Release);
        for u in &self.unparkers {
            u.unpark();
        }
    }

    /// Waits until shard threads `1..K` have finished the step: spins briefly (they usually
    /// finish within microseconds of shard 0), then parks until a shard thread unparks it.
    pub(super) fn wait_for_shards(&self) {
        let others = self.inner.shards.len() - 1;
        let backoff = Backoff::new();
        // Acquire: pairs with the Release increments of `done` by the shard threads.
        while self.inner.done.load(Ordering::Acquire) < others {
            if backoff.is_completed() {
                // Each shard thread unparks the engine after its increment of `done`; one
                // landing before this park makes it return at once.
                self.engine_parker.park();
            } else {
                backoff.snooze();
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
    /// One shard's part of a step; every shard runs it concurrently.
    pub(super) fn run_shard_step(&self, i: usize, engine_share: &[BlockId], live: &Settings) {
        let slot = &self.shards[i];
        let env = self.env(i);
        let settings = &StepSettings {
            mode: live.mode,
            policy: live.policy,
            load_deadline: live.load_deadline,
            max_load_retries: live.max_load_retries,
            quarantine_after: live.quarantine_after,
            quarantine_for: live.quarantine_for,
            ..self.settings[i].clone()
        };
        let mut shard = slot.state.lock();
        let commands = std::iter::from_fn(|| slot.inbox.pop());
        let completions = std::iter::from_fn(|| slot.completions.pop());
        let mine = shard.publish(&env, settings, Instant::now(), commands, completions);
        *slot.published.lock() = mine;
        // Barrier 1: every share of the report is published and its claim words reset.
        self.barrier.wait();
        let mut ids: Vec<BlockId> = engine_share.to_vec();
        for s in &self.shards {
            ids.extend_from_slice(&s.published.lock());
        }
        ids.sort_unstable();
        ids.dedup();
        let report = InvalidSet::flat(ids.iter().copied(), &self.geo);
        if !report.is_empty() {
            shard.claim(&env, settings, &report, &ids);
            // Barrier 2: every hit of every shard is claimed before anyone decides.
            #[cfg(not(kvsched_plant = "decide-early"))]
            self.barrier.wait();
        }
        let now = Instant::now();
        let mut loads = Vec::new();
        // Relaxed: set by the engine thread before the `go` Release that started this step.
        let draining = self.draining.load(Ordering::Relaxed);
        let res = shard.finish_step(&env, settings, now, draining, &mut loads);
        #[cfg(kvsched_plant = "decide-early")]
        if !report.is_empty() {
            self.barrier.wait();
        }
        {
            let mut live = slot.ids.lock();
            for (id, _) in &res.ended {
                live.remove(id);
            }
        }
        *slot.result.lock() = Some((res, loads));
    }
}

/// Shard `i`'s thread: waits for each step's `go`, runs its part of it, counts it in `done`.
pub(super) fn shard_loop(inner: &Inner, i: usize, parker: Parker) {
    let mut seen = 0u64;
    let backoff = Backoff::new();
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
            if backoff.is_completed() {
                parker.park();
            } else {
                backoff.snooze();
            }
            continue;
        }
        backoff.reset();
        seen = go;
        let Some((share, live)) = inner.report.lock().clone() else {
            continue;
        };
        inner.run_shard_step(i, &share, &live);
        // Release: publishes this shard's result slot to the engine, which Acquire-loads
        // `done` in `Runtime::wait_for_shards`.
        inner.done.fetch_add(1, Ordering::Release);
        inner.engine.unpark();
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
