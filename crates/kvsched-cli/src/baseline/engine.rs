//! What the runtime's engine thread does around a step, for the baseline's one shard: the
//! engine's output recorded by `update` and checked against what the latest plan handed out
//! (its samples and finishes queued as the shard's commands, its failed sync-load blocks
//! kept for the next step's report), and the shard's result turned into the step's plan.

use std::sync::Arc as StdArc;

use rustc_hash::FxHashSet;

use super::state::State;
use kvsched::pool::BlockRef;
use kvsched::rules::geometry::BlockId;
use kvsched::runtime::discard::{discarded, HandedOut};
use kvsched::runtime::policy::trust::{sync_report, SyncReport};
use kvsched::runtime::shard::strategy::{Claims, Pool};
use kvsched::runtime::shard::{Command, ShardStepResult};
use kvsched::runtime::{EndState, StepOutput, StepPlan, StepRecovery};

/// What the runtime's engine thread keeps between steps.
#[derive(Default)]
pub(super) struct Engine {
    /// The failed blocks of the last step's sync loads the engine reported.
    sync_invalid: Vec<BlockRef>,
    /// Blocks owners left unrecomputed while another request held them: next step's report.
    handoffs: Vec<BlockRef>,
    /// What the latest plan handed out (sync destinations, reads).
    handed: HandedOut,
    /// Whether the latest plan scheduled work whose output must come back, and whether an
    /// output answering it came (its sync loads are counted once).
    expect_output: bool,
    answered: bool,
}

impl State {
    /// A plan left unanswered when the next step starts is lost: the shard re-offers its
    /// work (`Command::OutputLost`), as the runtime's.
    pub(super) fn take_lost_output(&mut self) {
        if self.engine.expect_output && !self.engine.answered {
            self.metrics.lost_outputs += 1;
            self.inbox.push(Command::OutputLost);
        }
    }

    /// The engine's share of the step's report: the last output's failed sync-load blocks
    /// that are still current (others are counted stale and lose their pending mark) and the
    /// hand-offs still current (others are forgotten); their claim words are reset.
    pub(super) fn engine_share(&mut self) -> Vec<BlockId> {
        let null = self.cx.geo.null_block();
        let (blocks, claims) = (&self.cx.blocks, &self.cx.claims);
        let (current, stale): (Vec<BlockRef>, Vec<BlockRef>) =
            std::mem::take(&mut self.engine.sync_invalid)
                .into_iter()
                .partition(|b| b.id != null && blocks.is_current(*b));
        self.metrics.stale_blocks += stale.len() as u64;
        let (handed, gone): (Vec<BlockRef>, Vec<BlockRef>) =
            std::mem::take(&mut self.engine.handoffs)
                .into_iter()
                .partition(|b| blocks.is_current(*b));
        stale.iter().chain(&gone).for_each(|b| claims.forget(b.id));
        let share: Vec<BlockId> = current.iter().chain(&handed).map(|b| b.id).collect();
        share.iter().for_each(|&id| claims.reset(id));
        share
    }

    /// Records the engine's output for the last step as the runtime's `update` does:
    /// finishes always apply; samples and failed blocks only in an output answering the
    /// latest plan (another is counted stale), samples only for requests it scheduled to
    /// sample (others: `unexpected_samples`, or `unknown_commands` for an id naming no live
    /// request, counted by the shard at the next step) and
    /// failed blocks only among its sync loads'
    /// destinations (an older generation of one: `stale_blocks`; a newer one: the destination
    /// as handed out; others: `foreign_blocks`).
    /// The first answer counts each sync load ok or failed. Returns the outputs to discard:
    /// the requests whose step read a block one of its sync loads failed to fill.
    pub(super) fn record_output(&mut self, out: StepOutput) -> Vec<StdArc<str>> {
        let current = out.step == self.step;
        let first_answer = current && !self.engine.answered;
        self.engine.answered |= current;
        self.inbox
            .extend(out.finished.into_iter().map(Command::Finish));
        if !current {
            let ignored = !out.sampled.is_empty() || !out.invalid_blocks.is_empty();
            self.metrics.stale_outputs += u64::from(ignored);
            return Vec::new();
        }
        // The shard keeps a sample only for a request the plan scheduled to sample: the
        // plan's own sampling ids in its order all at once, as the runtime's `update`.
        if self.engine.handed.sampled_as_planned(&out.sampled) {
            if !out.sampled.is_empty() {
                self.inbox.push(Command::SampledAll);
            }
        } else {
            self.inbox
                .extend(out.sampled.into_iter().map(Command::Sampled));
        }
        let dests = &self.engine.handed.sync_dests;
        let mut failed: FxHashSet<BlockId> = FxHashSet::default();
        for b in out.invalid_blocks {
            match sync_report(dests, b) {
                SyncReport::Destination(d) => {
                    if self.cx.blocks.is_current(d) {
                        failed.insert(d.id);
                    }
                    self.engine.sync_invalid.push(d);
                }
                SyncReport::Stale => self.metrics.stale_blocks += 1,
                SyncReport::Foreign => self.metrics.foreign_blocks += 1,
            }
        }
        if first_answer {
            let bad = dests
                .iter()
                .filter(|load| load.iter().any(|d| failed.contains(&d.id)))
                .count() as u64;
            self.metrics.sync_loads_failed += bad;
            self.metrics.sync_loads_ok += dests.len() as u64 - bad;
        }
        let reported: FxHashSet<BlockId> = self.engine.sync_invalid.iter().map(|b| b.id).collect();
        let discard = discarded(&self.cx.geo, &self.engine.handed.reads, &reported);
        self.inbox
            .extend(discard.iter().cloned().map(Command::Discarded));
        discard
    }

    /// The step's plan from the shard's result and the step's report `ids`: its counters and
    /// ends counted, its hand-offs kept for the next report, what the plan hands out recorded.
    pub(super) fn plan(&mut self, res: ShardStepResult, ids: Vec<BlockId>) -> StepPlan {
        self.metrics += &res.counters;
        self.metrics.steps += 1;
        let ends = |state| res.ended.iter().filter(|(_, e)| *e == state).count() as u64;
        self.metrics.finished += ends(EndState::Finished);
        self.metrics.failed += ends(EndState::Failed);
        self.metrics.cancelled += ends(EndState::Cancelled);
        for (id, _) in &res.ended {
            self.live.remove(id);
        }
        self.engine.handoffs.extend(res.handoffs);
        let mut recovered = res.recovered;
        recovered.sort_by_key(|r| r.key);
        let mut evicted = res.evicted;
        evicted.sort_unstable();
        evicted.dedup();
        let plan = StepPlan {
            step: self.step,
            scheduled: res.scheduled,
            recovery: StepRecovery {
                report: ids,
                recovered,
                evicted_blocks: evicted,
                scanned: res.scanned,
            },
            ended: res.ended,
            runnable_latency_ns: res.runnable_latency_ns,
            first_schedule_latency_ns: res.first_schedule_latency_ns,
        };
        self.engine.expect_output = !plan.scheduled.is_empty();
        self.engine.answered = false;
        self.engine.handed.record(&plan);
        plan
    }
}
