//! Which way a step runs — inline on the engine thread, or in parallel on the shard
//! threads — decided from the step's work, not only from how many requests are live.
//!
//! A parallel step pays a hand-off: waking each shard thread (a futex wake-up, more when its
//! core is busy), two phase barriers, and waiting for the slowest shard. It pays off only
//! when each shard's part is larger than that. A step's work is what it touches, not what
//! waits: the commands and completions queued for it, the requests it will schedule (at most
//! `max_seqs`, about as many as the last step scheduled), the waiting ones it may admit and
//! the engine's share of the report. [`StepWork`] estimates it from counters and queue
//! lengths before the step (no lock on shard state) and [`StepWork::parallel`] compares it
//! with [`Builder::parallel_step_work`](crate::runtime::Builder::parallel_step_work).
//!
//! Inline and parallel run the same phases in the same order, so the outcome does not depend
//! on the choice; only the step's cost does.
//!
//! # Limits
//!
//! The estimate counts work units, each about one request touched; a unit's cost in time
//! varies with the tables' lengths and the machine. The threshold's default (see
//! [`DEFAULT_PARALLEL_STEP_WORK`]) was chosen on a 2-core machine whose cores the engine's
//! own threads share; a machine with free cores may lower it.

use crate::runtime::shared::Inner;

/// Default [`Builder::parallel_step_work`](crate::runtime::Builder::parallel_step_work):
/// a step runs in parallel only from this many work units (about 1 ms of inline work).
pub(super) const DEFAULT_PARALLEL_STEP_WORK: usize = 2048;

/// What the last step did that predicts the next one's work.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LastStep {
    /// Requests the last plan scheduled.
    pub(super) scheduled: usize,
    /// Requests waiting for admission after the last step.
    pub(super) waiting: usize,
}

/// A step's work estimate, in units of about one request touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StepWork(pub(super) usize);

impl StepWork {
    /// The estimate for the step about to run: its queued commands and completions, the
    /// engine's share of its report, and what the last step says it will schedule and admit
    /// (admission takes at most `max_seqs` per step).
    pub(super) fn estimate(inner: &Inner, last: LastStep, share: usize, max_seqs: usize) -> Self {
        let queued: usize = inner
            .shards
            .iter()
            .map(|s| s.inbox.len() + s.completions.len())
            .sum();
        StepWork(
            queued
                .saturating_add(share)
                .saturating_add(last.scheduled)
                .saturating_add(last.waiting.min(max_seqs)),
        )
    }

    /// Whether a step of this work, with `live` requests live, runs in parallel on a runtime
    /// of `shards` shards: never with one shard; always when `inline_up_to` is 0 (every step
    /// in parallel, as tests force it); otherwise only when more than `inline_up_to` requests
    /// are live and the work reaches `threshold`.
    pub(super) fn parallel(
        self,
        shards: usize,
        live: usize,
        inline_up_to: usize,
        threshold: usize,
    ) -> bool {
        if Self::inline_whatever_the_work(shards, live, inline_up_to) {
            return false;
        }
        inline_up_to == 0 || self.0 >= threshold
    }

    /// Whether a step runs inline whatever its work (one shard, or at most `inline_up_to`
    /// live unless that is 0), so its work need not be estimated.
    pub(super) fn inline_whatever_the_work(
        shards: usize,
        live: usize,
        inline_up_to: usize,
    ) -> bool {
        shards <= 1 || (inline_up_to != 0 && live <= inline_up_to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_goes_parallel_only_when_its_work_pays_for_the_hand_off() {
        let big = StepWork(5000);
        let small = StepWork(300);
        // One shard: always inline.
        assert!(!big.parallel(1, 100_000, 256, 2048));
        // Forced parallel (inline_steps_up_to(0)).
        assert!(small.parallel(2, 10, 0, 2048));
        // Many live, little work: inline; much work: parallel.
        assert!(!small.parallel(2, 65_536, 256, 2048));
        assert!(big.parallel(2, 65_536, 256, 2048));
        // Few live: inline whatever the work.
        assert!(!big.parallel(2, 200, 256, 2048));
        // The work need not be estimated exactly where it cannot change the answer.
        for (shards, live, up_to) in [(1, 9, 4), (2, 4, 4), (2, 5, 4), (2, 1, 0), (3, 100, 4)] {
            let regardless = StepWork::inline_whatever_the_work(shards, live, up_to);
            let any = [0, 1, usize::MAX].map(|w| StepWork(w).parallel(shards, live, up_to, 2));
            assert_eq!(
                regardless,
                any.iter().all(|p| !p),
                "{shards} {live} {up_to}"
            );
        }
        // Threshold 0: the live count alone decides, as before.
        assert!(small.parallel(2, 257, 256, 0));
        assert!(!small.parallel(2, 256, 256, 0));
    }
}
