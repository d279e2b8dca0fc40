//! Where every prompt token of a finished request came from: the device prefix cache, a
//! load from the tier, or the engine's own computation (with what it computed because a
//! load failed shown apart).
//!
//! The engine's own accounting, not a model: per live request it keeps the lowest
//! `num_computed_tokens` of any step that computed prompt tokens (`L`: everything at and
//! past it the engine computed at least once, everything below it it never computed) and
//! the token ranges of every load run for it, and how far each filled its blocks (all of
//! its range, or up to its first failed block, or nothing) — asynchronous ones as the
//! connector's workers start and finish them ([`FaultConnector`](super::faults::FaultConnector)
//! records them) and, for those that failed before a worker started them, from the plan whose
//! recovery rolled their request back; synchronous ones from the plans that carry them and the
//! failed blocks of the engine's output. When the request finishes, its prompt of `P` tokens splits into
//!
//! * `tier_hit`: tokens below `L` that a load filled (verified chunks; the part of a failed
//!   load below its first failed block among them, and never the rest: a request whose load
//!   failed and that was admitted again over blocks another request computed meanwhile has
//!   those tokens from the device, not the tier);
//! * `device_hit`: the rest below `L`, which no load covered: the device prefix cache;
//! * `computed`: `P − L`, of which `computed_after_failed_load` lie inside the range of a
//!   load that failed (a damaged or missing chunk, a tier error, a passed deadline, a
//!   panic). Tokens a load filled but a preemption freed before the request ran again are
//!   computed, not counted there.
//!
//! A token is counted once, by the first source that gave it to the request: a request
//! preempted after a load and admitted again over the prefix cache still counts the loaded
//! tokens as tier hits. The three add up to the finished requests' prompt tokens exactly.

use std::sync::Arc;

use crossbeam_queue::SegQueue;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use kvsched::connector::LoadJob;
use kvsched::rules::recovery::RequestClass;
use kvsched::runtime::{EndState, StepOutput, StepPlan};
use kvsched::BlockRef;

/// The prompt tokens of the finished requests, by source (the JSON's `prompt_tokens`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PromptTokens {
    /// Finished requests counted.
    pub requests: u64,
    /// Their prompt tokens: `device_hit + tier_hit + computed`.
    pub total: u64,
    /// Served by the device prefix cache.
    pub device_hit: u64,
    /// Loaded from the tier (verified chunks).
    pub tier_hit: u64,
    /// Computed by the engine.
    pub computed: u64,
    /// Of `computed`, tokens in the range of a load that failed.
    pub computed_after_failed_load: u64,
}

/// One live request's accounting.
struct Track {
    prompt_len: u64,
    /// The lowest `num_computed_tokens` of a step that computed prompt tokens (`prompt_len`
    /// until one did).
    lowest_computed: u64,
    /// The loads run for it.
    loads: Vec<Load>,
}

/// One load of a request: tokens `start..end`, and the end of the tokens it filled once it
/// ended (`None` while running, or for good when it never returned: a panic). It failed
/// unless it filled all of them.
#[derive(Clone, Copy, Debug)]
struct Load {
    start: u64,
    end: u64,
    filled: Option<u64>,
}

impl Load {
    fn filled(&self) -> u64 {
        self.filled.unwrap_or(self.start)
    }

    fn failed(&self) -> bool {
        self.filled() < self.end
    }
}

/// What a load event says: it started, or it ended having filled its blocks up to `filled`
/// (its end: all of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LoadEvent {
    /// A worker (or the engine) started it.
    Started,
    /// It ended, its blocks filled up to token `filled`.
    Filled(u64),
}

/// The per-request accounting of a run and its totals.
#[derive(Default)]
pub(super) struct PromptSources {
    live: FxHashMap<Arc<str>, Track>,
    /// The prompt tokens of the requests in `live`.
    live_tokens: u64,
    totals: PromptTokens,
}

impl PromptSources {
    /// A request submitted with a prompt of `prompt_len` tokens.
    pub(super) fn add(&mut self, id: &Arc<str>, prompt_len: usize) {
        self.live_tokens += prompt_len as u64;
        let replaced = self.live.insert(
            id.clone(),
            Track {
                prompt_len: prompt_len as u64,
                lowest_computed: prompt_len as u64,
                loads: Vec::new(),
            },
        );
        if let Some(old) = replaced {
            self.live_tokens -= old.prompt_len;
        }
    }

    /// The prompt tokens of the requests submitted and not ended.
    pub(super) fn live_tokens(&self) -> u64 {
        self.live_tokens
    }

    /// A load of tokens `start..end` for request `id` started, or ended (after its start)
    /// having filled its blocks up to a token: all of them, the load succeeded.
    pub(super) fn loaded(&mut self, id: &str, start: u64, end: u64, event: LoadEvent) {
        let Some(t) = self.live.get_mut(id).filter(|_| end > start) else {
            return;
        };
        match event {
            LoadEvent::Started => t.loads.push(Load {
                start,
                end,
                filled: None,
            }),
            LoadEvent::Filled(upto) => {
                if let Some(l) = t
                    .loads
                    .iter_mut()
                    .rev()
                    .find(|l| l.start == start && l.end == end && l.filled.is_none())
                {
                    l.filled = Some(upto.clamp(start, end));
                }
            }
        }
    }

    /// The loads the workers started so far (`started`, drained), then what a plan says:
    /// the asynchronous loads its recovery rolled back, its sync loads, where its requests
    /// compute from, how they ended.
    ///
    /// A load that failed without a worker ever starting it (its deadline passed while it was
    /// queued, or a worker handed it back unrun) never reaches the connector: its range is
    /// the one the plan's recovery rolled its request back over — an async request's tokens
    /// from its new `num_computed_tokens` on, `affected_tokens` of them — recorded as a load
    /// that filled nothing. A load the connector saw is recorded again the same way; the
    /// ranges are a union, so that changes nothing.
    pub(super) fn observe(
        &mut self,
        started: &SegQueue<(Arc<str>, u64, u64, LoadEvent)>,
        plan: &StepPlan,
    ) {
        while let Some((id, start, end, event)) = started.pop() {
            self.loaded(&id, start, end, event);
        }
        // Planted bug `failed-unstarted-load-uncounted` (scripts/plants.sh): a load that
        // failed before any worker started it is left out of `computed_after_failed_load`.
        if !cfg!(kvsched_plant = "failed-unstarted-load-uncounted") {
            for r in &plan.recovery.recovered {
                if r.class != RequestClass::Async || !r.decision.affected() {
                    continue;
                }
                let start = r.decision.num_computed_tokens;
                let end = start.saturating_add(r.decision.affected_tokens);
                self.loaded(&r.id, start, end, LoadEvent::Started);
                self.loaded(&r.id, start, end, LoadEvent::Filled(start));
            }
        }
        for s in &plan.scheduled {
            let Some(t) = self.live.get_mut(&s.id) else {
                continue;
            };
            if s.num_computed_tokens < t.prompt_len && s.num_tokens > 0 {
                t.lowest_computed = t.lowest_computed.min(s.num_computed_tokens);
            }
        }
        for (id, state) in &plan.ended {
            self.ended(id, *state);
        }
    }

    /// The sync loads of `plan` once the engine ran them: failed where `out` names one of
    /// their blocks invalid.
    pub(super) fn sync_loads(&mut self, plan: &StepPlan, out: &StepOutput) {
        for s in &plan.scheduled {
            let Some(job) = &s.sync_load else {
                continue;
            };
            let filled = filled_until(job, &out.invalid_blocks);
            self.loaded(&s.id, job.start_tokens, job.end_tokens, LoadEvent::Started);
            self.loaded(
                &s.id,
                job.start_tokens,
                job.end_tokens,
                LoadEvent::Filled(filled),
            );
        }
    }

    /// Request `id` ended: a finished one's prompt tokens join the totals.
    pub(super) fn ended(&mut self, id: &str, state: EndState) {
        let Some(t) = self.live.remove(id) else {
            return;
        };
        self.live_tokens -= t.prompt_len;
        if state != EndState::Finished {
            return;
        }
        let low = t.lowest_computed;
        let filled: Vec<(u64, u64)> = t.loads.iter().map(|l| (l.start, l.filled())).collect();
        let failed: Vec<(u64, u64)> = t
            .loads
            .iter()
            .filter(|l| l.failed())
            .map(|l| (l.start, l.end))
            .collect();
        let tier = covered(&filled, 0, low);
        let n = &mut self.totals;
        n.requests += 1;
        n.total += t.prompt_len;
        n.tier_hit += tier;
        n.device_hit += low - tier;
        n.computed += t.prompt_len - low;
        n.computed_after_failed_load += covered(&failed, low, t.prompt_len);
    }

    /// The totals so far.
    pub(super) fn totals(&self) -> PromptTokens {
        self.totals.clone()
    }
}

/// The end of the tokens `job` filled when `invalid` names its failed blocks: the start of
/// its first failed block in any group (every group's blocks below it were filled), its end
/// when none failed.
pub(super) fn filled_until(job: &LoadJob, invalid: &[BlockRef]) -> u64 {
    let mut first = job.end_tokens;
    for (table, &size) in job.block_tables.iter().zip(&job.block_sizes) {
        if let Some(i) = table.iter().position(|b| invalid.contains(b)) {
            first = first.min(i as u64 * size);
        }
    }
    first.max(job.start_tokens)
}

/// Tokens of `lo..hi` inside at least one of `ranges`.
fn covered(ranges: &[(u64, u64)], lo: u64, hi: u64) -> u64 {
    let mut clipped: Vec<(u64, u64)> = ranges
        .iter()
        .map(|&(s, e)| (s.max(lo), e.min(hi)))
        .filter(|(s, e)| s < e)
        .collect();
    clipped.sort_unstable();
    let (mut total, mut reach) = (0, lo);
    for (s, e) in clipped {
        let s = s.max(reach);
        if e > s {
            total += e - s;
            reach = e;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_ranges_are_counted_once() {
        assert_eq!(covered(&[(0, 10), (5, 20), (30, 40)], 0, 100), 30);
        assert_eq!(covered(&[(0, 10), (5, 20), (30, 40)], 8, 35), 17);
        assert_eq!(covered(&[], 0, 100), 0);
        assert_eq!(covered(&[(50, 60)], 0, 40), 0);
    }

    /// The live prompt tokens the driver's memory bound reads follow adds and ends, whatever
    /// the end, and an id added again replaces its first prompt.
    #[test]
    fn live_tokens_follow_the_requests_not_ended() {
        let mut p = PromptSources::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        p.add(&a, 100);
        p.add(&b, 30);
        assert_eq!(p.live_tokens(), 130);
        p.add(&a, 40);
        assert_eq!(p.live_tokens(), 70);
        p.ended("b", EndState::Cancelled);
        assert_eq!(p.live_tokens(), 40);
        p.ended("a", EndState::Finished);
        p.ended("a", EndState::Finished);
        assert_eq!(p.live_tokens(), 0);
    }

    #[test]
    fn a_finished_request_splits_its_prompt_and_others_are_left_out() {
        let mut p = PromptSources::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        p.add(&a, 100);
        p.add(&b, 100);
        // a: device prefix 0..32, a load 32..64 that landed, a load 64..96 that failed and
        // was recomputed from 64.
        p.loaded("a", 32, 64, LoadEvent::Started);
        p.loaded("a", 32, 64, LoadEvent::Filled(64));
        p.loaded("a", 64, 96, LoadEvent::Started);
        if let Some(t) = p.live.get_mut("a") {
            t.lowest_computed = 64;
        }
        p.ended("a", EndState::Finished);
        p.ended("b", EndState::Cancelled);
        let t = p.totals();
        assert_eq!(
            (t.requests, t.total, t.device_hit, t.tier_hit, t.computed),
            (1, 100, 32, 32, 36)
        );
        assert_eq!(t.computed_after_failed_load, 32);
    }

    #[test]
    fn a_failed_load_counts_as_tier_only_what_it_filled() {
        let mut p = PromptSources::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        p.add(&a, 100);
        p.add(&b, 100);
        // a: a load of 0..64 failed at its first block, and never ran a step; admitted again
        // over blocks another request computed meanwhile, it computes from 80: its 0..80 came
        // from the device, none from the tier.
        p.loaded("a", 0, 64, LoadEvent::Started);
        p.loaded("a", 0, 64, LoadEvent::Filled(0));
        // b: a load of 0..64 that filled up to 32 (its block at 32 failed); b computes from 32.
        p.loaded("b", 0, 64, LoadEvent::Started);
        p.loaded("b", 0, 64, LoadEvent::Filled(32));
        for (id, low) in [("a", 80), ("b", 32)] {
            if let Some(t) = p.live.get_mut(id) {
                t.lowest_computed = low;
            }
        }
        p.ended("a", EndState::Finished);
        let t = p.totals();
        assert_eq!((t.device_hit, t.tier_hit, t.computed), (80, 0, 20));
        p.ended("b", EndState::Finished);
        let t = p.totals();
        assert_eq!((t.device_hit, t.tier_hit, t.computed), (80, 32, 88));
        assert_eq!(t.computed_after_failed_load, 32);
    }

    #[test]
    fn a_load_is_filled_up_to_its_first_failed_block_in_any_group() {
        let r = |id| BlockRef { id, generation: 1 };
        let mut job = LoadJob::new(
            "r",
            &[0; 64],
            16,
            64,
            vec![vec![r(1), r(2), r(3), r(4)], vec![r(5), r(6)]],
            vec![16, 32],
        );
        assert_eq!(filled_until(&job, &[]), 64);
        assert_eq!(filled_until(&job, &[r(4)]), 48);
        assert_eq!(filled_until(&job, &[r(4), r(6)]), 32);
        // A block below the load's start: nothing of it filled.
        assert_eq!(filled_until(&job, &[r(5)]), 16);
        job.end_tokens = 40;
        assert_eq!(filled_until(&job, &[r(9)]), 40);
    }
}
