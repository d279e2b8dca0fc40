//! The engine's output and commands: recorded under the lock by `update` and `cancel` as
//! commands, checked against what the latest plan handed out (as the runtime's `update`
//! does), applied at the next step in the order they came, and the last step's output
//! applied after recovery (samples, finishes, recomputed blocks no longer pending).

use std::sync::Arc as StdArc;

use rustc_hash::FxHashSet;

use super::request::Phase;
use super::state::State;
use kvsched::rules::geometry::BlockId;
use kvsched::runtime::discard::discarded;
use kvsched::runtime::policy::trust::is_sync_destination;
use kvsched::runtime::{EndState, StepOutput};

/// What the engine asked between two steps, applied at the next one in order.
#[derive(Debug)]
pub(super) enum Command {
    /// End the request (once its in-flight load lands, if it is loading).
    Cancel(StdArc<str>),
    /// A sampled token for a request the last plan scheduled to sample.
    Sampled(StdArc<str>),
    /// The engine finished the request.
    Finish(StdArc<str>),
}

impl State {
    /// Records the engine's output for the last step as the runtime's `update` does:
    /// finishes always apply; samples and failed blocks only in an output answering the
    /// latest plan (another is counted stale), samples only for requests it scheduled to
    /// sample (others: `unexpected_samples`) and failed blocks only among its sync loads'
    /// destinations (others: `foreign_blocks`). The first answer counts each sync load ok or
    /// failed. Returns the outputs to discard, as the runtime's `update`: the requests whose
    /// step read a block one of its sync loads failed to fill.
    pub(super) fn record_output(&mut self, out: StepOutput) -> Vec<StdArc<str>> {
        let current = out.step == self.step;
        let first_answer = current && !self.answered;
        if current {
            self.answered = true;
        }
        self.inbox
            .extend(out.finished.into_iter().map(Command::Finish));
        if !current {
            if !out.sampled.is_empty() || !out.invalid_blocks.is_empty() {
                self.metrics.stale_outputs += 1;
            }
            return Vec::new();
        }
        for id in out.sampled {
            if self.handed.samplers.contains(&*id) {
                self.inbox.push(Command::Sampled(id));
            } else {
                self.metrics.unexpected_samples += 1;
            }
        }
        let mut failed: FxHashSet<BlockId> = FxHashSet::default();
        for b in out.invalid_blocks {
            if is_sync_destination(&self.handed.sync_dests, b) {
                if self.blocks.is_current(b) {
                    failed.insert(b.id);
                }
                self.sync_invalid.push(b);
            } else {
                self.metrics.foreign_blocks += 1;
            }
        }
        if first_answer {
            for load in &self.handed.sync_dests {
                if load.iter().any(|d| failed.contains(&d.id)) {
                    self.metrics.sync_loads_failed += 1;
                } else {
                    self.metrics.sync_loads_ok += 1;
                }
            }
        }
        let reported: FxHashSet<BlockId> = self.sync_invalid.iter().map(|b| b.id).collect();
        discarded(&self.geo, &self.handed.reads, &reported)
    }

    /// Applies one command, as a shard does: a cancel ends the request (once its in-flight
    /// load lands, if it is loading); a sample or finish is marked, and applied after
    /// recovery. A command naming no live request (or a sample for one not running a
    /// scheduled step) is counted unknown.
    pub(super) fn apply_command(&mut self, cmd: Command) {
        let (Command::Cancel(id) | Command::Sampled(id) | Command::Finish(id)) = &cmd;
        let Some(&key) = self.by_id.get(&**id) else {
            self.metrics.unknown_commands += 1;
            return;
        };
        let Some(r) = self.reqs.get_mut(&key) else {
            self.metrics.unknown_commands += 1;
            return;
        };
        match cmd {
            Command::Cancel(_) if r.phase == Phase::Loading => {
                r.end_after_load = Some(EndState::Cancelled);
            }
            Command::Cancel(_) => self.end(key, EndState::Cancelled),
            Command::Sampled(_) if r.phase == Phase::Running && r.last_scheduled > 0 => {
                r.sampled_pending = true;
            }
            Command::Sampled(_) => self.metrics.unknown_commands += 1,
            Command::Finish(_) => {
                r.finish_pending = true;
                self.touched.push(key);
            }
        }
    }

    /// Applies the last step's output once recovery has decided, to the requests it touched
    /// (scheduled in it, finished by the engine, recovered now), in admission order (as a
    /// shard): a running one takes its sampled token (unless recovery discarded the step),
    /// confirms its progress (pending marks of recomputed owned blocks cleared, full prompt
    /// blocks registered) and ends when finished; an engine finish of one not running applies
    /// too.
    pub(super) fn apply_outputs(&mut self) {
        let mut keys = std::mem::take(&mut self.touched);
        keys.sort_unstable_by_key(|k| k.seq());
        keys.dedup();
        let mut not_running = Vec::new();
        for key in keys {
            let Some(r) = self.reqs.get_mut(&key) else {
                continue;
            };
            if r.phase != Phase::Running {
                if r.finish_pending {
                    not_running.push(key);
                }
                continue;
            }
            let skip = std::mem::take(&mut r.skip);
            let sampled = std::mem::take(&mut r.sampled_pending);
            let finish = std::mem::take(&mut r.finish_pending);
            let ran = std::mem::take(&mut r.last_scheduled) > 0;
            if !skip && ran {
                r.generated += u32::from(sampled);
                let nct = r.num_computed_tokens;
                r.written = nct;
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
        for key in not_running {
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
}
