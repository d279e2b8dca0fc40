//! Completions of async loads, and their deadlines: what landed, what failed (its bad blocks
//! join this shard's share of the report), and which late loads to treat as failed.

use std::time::{Duration, Instant};

use crate::connector::{InvalidBlocks, LoadResult};
use crate::rules::geometry::BlockId;
use crate::runtime::policy::trust::{failed_load_blocks, for_each_load_block, load_blocks};
use crate::runtime::worker::Completion;

use super::strategy::{Pool, Strategy};
use super::{Env, Metrics, Phase, Req, Shard, StepSettings};

impl<S: Strategy> Shard<S> {
    /// Takes one completion: a late one frees its parked blocks; a stale one is counted; a
    /// current one marks the load done and, when it failed, publishes its current bad blocks.
    pub(super) fn take_completion(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        c: Completion,
        published: &mut Vec<BlockId>,
    ) {
        let seq = c.key.seq();
        env.estimate.returned();
        if c.panicked {
            self.result.counters.connector_panics += 1;
        }
        // A load that passed its deadline: its blocks were parked; now they can go.
        if let Some(blocks) = self.parked.remove(&(seq, c.attempt)) {
            // Planted bug for the fault matrix: a late completion forgets its parked blocks.
            if planted!("late-leak") {
                drop(blocks);
            } else {
                for b in blocks {
                    // The load is done writing: its blocks' bytes are no longer its own.
                    let _ = env.pool.end_fill(b);
                    let _ = env.pool.release(b);
                }
            }
            self.result.counters.late_completions += 1;
            self.result.counters.stale_completions += 1;
            return;
        }
        let Some(r) = self.reqs.get_mut(&seq) else {
            self.result.counters.stale_completions += 1;
            return;
        };
        if r.phase != Phase::Loading || r.attempt != c.attempt || r.load_done.is_some() {
            self.result.counters.stale_completions += 1;
            return;
        }
        // The worker sent this after its last write: the destinations' bytes are readable.
        r.cancel = None;
        // The deadline is when the scheduler stops waiting: a load the worker finished past
        // it failed for all its blocks, whatever it returned — also when its completion is
        // applied before the step that would have expired it (completions come first in a
        // step). Planted bug `late-ok-accepted` (scripts/plants.sh): such a load counts.
        let past_deadline =
            r.load_deadline_at.is_some_and(|d| c.finished_at > d) && !planted!("late-ok-accepted");
        env.estimate.measured(
            r.load_end.saturating_sub(r.load_start),
            c.finished_at.saturating_duration_since(c.started_at),
            c.result == LoadResult::Ok && !c.panicked && !past_deadline,
            now,
        );
        Self::end_fills(env, r);
        // Planted bug for the fault matrix: a connector panic taken for a successful load.
        let c = if planted!("panic-ok") && c.panicked {
            Completion {
                result: LoadResult::Ok,
                ..c
            }
        } else if past_deadline {
            self.result.counters.deadlines_expired += 1;
            Completion {
                result: LoadResult::Failed(InvalidBlocks::Flat(Self::load_blocks(env, r))),
                ..c
            }
        } else {
            c
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
                // Only the blocks this load wrote are the connector's to report: any other is
                // counted and ignored, never applied to another request. A failure naming
                // none of its own blocks fails the whole load (the connector is not trusted
                // to know which of them are fine).
                let own = Self::load_blocks(env, r);
                let ignored = failed_load_blocks(
                    &own,
                    bad.into_flat(),
                    |b| env.pool.is_current(b),
                    published,
                );
                self.result.counters.foreign_blocks += ignored.foreign;
                self.result.counters.stale_blocks += ignored.stale;
            }
        }
    }

    /// Ends the current load's ownership of its destinations (its completion was applied, or
    /// it is known never to have run).
    pub(super) fn end_fills(env: &Env<'_, S>, r: &Req) {
        for_each_load_block(env.geo, &r.tables, &r.gens, r.load_start, r.load_end, |b| {
            let _ = env.pool.end_fill(b);
        });
    }

    /// The non-null blocks the request's current load writes, in every group, with the
    /// generations it holds them at.
    fn load_blocks(env: &Env<'_, S>, r: &Req) -> Vec<crate::pool::BlockRef> {
        load_blocks(env.geo, &r.tables, &r.gens, r.load_start, r.load_end)
    }

    /// Fails the in-flight loads whose deadline has passed and publishes all their blocks.
    pub(super) fn expire_deadlines(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        published: &mut Vec<BlockId>,
    ) {
        // Loads past their deadline fail for all their blocks.
        while let Some((seq, attempt)) = self.deadlines.pop_due(now) {
            let Some(r) = self.reqs.get_mut(&seq) else {
                continue;
            };
            if !r.awaits_load(attempt) {
                continue; // landed in time, or superseded
            }
            self.result.counters.deadlines_expired += 1;
            // A load past its deadline took at least the time since its dispatch.
            env.estimate.measured(
                r.load_end.saturating_sub(r.load_start),
                r.load_dispatched_at
                    .map_or(Duration::ZERO, |d| now.saturating_duration_since(d)),
                false,
                now,
            );
            if r.drop_load() {
                // No worker took it: it never writes, its blocks need no parking.
                Self::end_fills(env, r);
                self.result.counters.loads_dropped_unstarted += 1;
                env.estimate.returned();
            } else {
                r.timed_out = true;
            }
            Self::load_failed(env, settings, now, r, now, &mut self.result.counters);
            self.landed.push(seq);
            published.extend(Self::load_blocks(env, r).into_iter().map(|b| b.id));
        }
    }

    /// Bookkeeping of a failed async load (its completion said so, or its deadline passed):
    /// the request's retry budget and its prefix's quarantine streak.
    fn load_failed(
        env: &Env<'_, S>,
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
}
