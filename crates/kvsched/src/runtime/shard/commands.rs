//! The engine's commands, taken at the start of a step: submissions, cancels, sampled tokens
//! and engine finishes.

use super::strategy::Strategy;
use super::{Command, EndState, Env, Phase, Req, Shard};

impl<S: Strategy> Shard<S> {
    /// Applies one command: a submission waits for admission; a cancel ends the request (once
    /// its in-flight load lands, if it is loading); a sampled token or an engine finish is
    /// marked, and applied after recovery.
    pub(super) fn apply_command(&mut self, env: &Env<'_, S>, cmd: Command) {
        match cmd {
            Command::Submit(n) => {
                if n.prepared.panicked {
                    self.result.counters.connector_panics += 1;
                }
                let seq = n.key.seq();
                let req = Req::new(env.geo, *n);
                self.by_id.insert(req.id.clone(), seq);
                self.waiting.insert(req.key, ());
                self.reqs.insert(seq, req);
            }
            Command::Cancel(id) => match self.by_id.get(&id).copied() {
                Some(seq) => {
                    let landed_unapplied = self
                        .reqs
                        .get(&seq)
                        .is_some_and(|r| r.phase == Phase::Loading && !r.load_may_be_running());
                    if landed_unapplied {
                        // Its completion is taken but not landed yet: end it when it lands.
                        if let Some(r) = self.reqs.get_mut(&seq) {
                            r.end_after_load = Some(EndState::Cancelled);
                        }
                    } else {
                        self.end_when_load_stops(env, seq, EndState::Cancelled);
                    }
                }
                None => self.result.counters.unknown_commands += 1,
            },
            Command::Sampled(id) => {
                let seq = self.by_id.get(&id).copied();
                self.sampled(seq);
            }
            Command::SampledAll => {
                let sampling = std::mem::take(&mut self.sampling);
                for &seq in &sampling {
                    self.sampled(Some(seq));
                }
                // Kept: another answer to the same plan samples them again (duplicates).
                self.sampling = sampling;
            }
            Command::Discarded(id) => {
                if let Some(r) = self.by_id.get(&id).and_then(|s| self.reqs.get_mut(s)) {
                    r.discard_told = true;
                }
            }
            Command::Finish(id) => match self.by_id.get(&id).and_then(|s| self.reqs.get_mut(s)) {
                Some(r) => {
                    if std::mem::replace(&mut r.finish_pending, true) {
                        self.result.counters.duplicate_commands += 1;
                    }
                    self.touched.push(r.key.seq());
                }
                None => self.result.counters.unknown_commands += 1,
            },
            Command::OutputLost => {
                for &seq in &self.touched {
                    if let Some(r) = self.reqs.get_mut(&seq) {
                        if r.phase == Phase::Running && r.last_scheduled > 0 {
                            r.output_lost = true;
                        }
                    }
                }
            }
            Command::Preempt(seq) => {
                if self
                    .reqs
                    .get(&seq)
                    .is_some_and(|r| r.phase == Phase::Running)
                {
                    self.preempt(env, seq);
                    self.hold_admission = true;
                    self.result.counters.preemptions += 1;
                    self.result.counters.cross_shard_preemptions += 1;
                }
            }
        }
    }

    /// A sample for request `seq` (`None`: an id naming no live request). Only a request the
    /// answered plan scheduled to sample takes a sample; a sample for another request is
    /// ignored, as one naming no request (ended since, or never).
    fn sampled(&mut self, seq: Option<u64>) {
        match seq.and_then(|s| self.reqs.get_mut(&s)) {
            Some(r) if r.samples_last_step() => {
                if std::mem::replace(&mut r.sampled_pending, true) {
                    self.result.counters.duplicate_commands += 1;
                }
            }
            Some(_) => self.result.counters.unexpected_samples += 1,
            None => self.result.counters.unknown_commands += 1,
        }
    }
}
