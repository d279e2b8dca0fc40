//! The simulated engine's arrivals: each request generated when its arrival time comes (open
//! loop) or a live request ended (closed loop), held while the connector asks a shared store
//! about its prompt (`held.rs`), warmed into the sim store (`--hit-ratio`) and submitted.

use std::sync::Arc;
use std::time::Instant;

use super::super::histograms::ns;
use super::super::scheduler::Scheduler;
use super::super::workload::Generated;
use super::{Engine, MAX_VIOLATIONS};
use crate::stress::values::MAX_LIVE_PROMPT_TOKENS;

/// The most requests that arrive between two steps.
const MAX_ARRIVALS_PER_STEP: u32 = 1 << 16;

impl<S: Scheduler> Engine<'_, S> {
    /// Submits the requests whose arrival time has come (open loop), or up to `--live` live
    /// requests (closed loop) — while the live requests' prompts hold fewer than
    /// [`MAX_LIVE_PROMPT_TOKENS`] tokens (one request always may arrive when none is live),
    /// at most [`MAX_ARRIVALS_PER_STEP`] between two steps (the rest come before the next
    /// ones), and until the run's `--duration` has passed: so a step takes in a bounded
    /// number of new requests, and the run ends within about a step of its duration.
    pub(super) fn arrivals(&mut self, now: Instant) {
        // Offsets, not instants: an offset that saturated (a tiny --rate) is never reached,
        // and `start + offset` is only formed for offsets already passed.
        let elapsed = now.saturating_duration_since(self.start);
        let mut arrived = 0;
        while self.next < self.cfg.requests && arrived < MAX_ARRIVALS_PER_STEP {
            let arrival = match self.next_at {
                Some(at) if at > elapsed => break,
                Some(at) => self.start + at,
                None if self.live() >= self.cfg.live as u64 => break,
                None => Instant::now(),
            };
            if self.live() > 0
                && self.sources.live_tokens() + self.held.tokens() >= MAX_LIVE_PROMPT_TOKENS
            {
                if self.held_back != Some(self.next) {
                    self.held_back = Some(self.next);
                    self.engine_events.arrivals_held_back += 1;
                }
                break;
            }
            if Instant::now().saturating_duration_since(self.start) >= self.duration {
                break;
            }
            arrived += 1;
            let g = self.work.request(self.next);
            self.held.arrive(g, arrival, &self.conn.inner);
            self.next += 1;
            self.next_at = self.work.next_arrival();
        }
        // Each submit hashes its prompt (here, on the engine thread): many long prompts due at
        // once take a while, so the run's end is checked between them too, and what is left
        // stays held (never submitted) once it has passed.
        while Instant::now().saturating_duration_since(self.start) < self.duration {
            let Some((g, arrival)) = self.held.pop_ready(Instant::now()) else {
                break;
            };
            self.submit_next(g, arrival);
        }
    }

    /// Requests submitted or held for submission that have not ended.
    fn live(&self) -> u64 {
        (self.submitted + self.held.len() as u64).saturating_sub(self.ended)
    }

    /// Whether requests are left: not arrived yet, held, or live.
    pub(super) fn requests_left(&self) -> bool {
        self.next < self.cfg.requests || self.live() > 0
    }

    /// Submits request `g`, arrived at `arrival`, and books its cancels. On the sim
    /// store it first stores the reference chunks of the request's `--hit-ratio` share of its
    /// prompt (rounded down to `S`, never the whole prompt), as a warm store holds them.
    fn submit_next(&mut self, g: Generated, arrival: Instant) {
        let id: Arc<str> = g.req.id.as_str().into();
        let max_new_tokens = g.req.max_new_tokens;
        if self.warm_share > 0.0 {
            self.warm(&g.req.prompt);
        }
        self.sim.add_request(&id, &g.req.prompt, arrival);
        self.sources.add(&id, g.req.prompt.len());
        match self.sched.submit(g.req) {
            Ok(()) => {
                self.submitted += 1;
                self.arrival_of.insert(id.clone(), arrival);
                self.samples_sent.insert(id.clone(), (0, max_new_tokens));
                if let Some(after) = g.cancel_after {
                    self.cancels
                        .entry(self.steps + after)
                        .or_default()
                        .push((id.to_string(), false));
                }
                if let Some(after) = g.fault_cancel_after {
                    self.cancels
                        .entry(self.steps + after)
                        .or_default()
                        .push((id.to_string(), true));
                }
            }
            Err(e) => {
                self.sim.end_request(&id);
                self.sources.ended(&id, kvsched::EndState::Failed);
                self.rejected += 1;
                if self.violations.len() < MAX_VIOLATIONS {
                    self.violations.push(format!("submit refused: {e}"));
                }
            }
        }
    }

    /// Warms the sim store for `prompt` (timed: it runs here, on the engine thread between
    /// two steps, never inside `schedule()` or `update()`).
    fn warm(&mut self, prompt: &[u32]) {
        let len = prompt.len() as u64;
        let s = self.block_size;
        let held = ((len as f64 * self.warm_share) as u64).min(len.saturating_sub(1));
        let held = held - held % s;
        if held == 0 {
            return;
        }
        let t = Instant::now();
        let stored = self.sim.warm(prompt, held);
        self.warm_ns += ns(t.elapsed());
        if let Err(e) = stored {
            if self.violations.len() < MAX_VIOLATIONS {
                self.violations
                    .push(format!("warming the sim store failed: {e}"));
            }
        }
    }
}
