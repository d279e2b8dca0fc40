//! Stalls across shards: each shard preempts only its own requests, so pool pressure spread
//! over shards can leave every shard unable to grow or admit. [`Progress`] sums what a step's
//! shards did; [`Runtime::resolve_stall`] counts steps without progress and preempts across
//! shards (`docs/runtime.md#liveness`).

use crate::runtime::claim::RequestKey;
#[cfg(doc)]
use crate::runtime::shard::Metrics;
use crate::runtime::shard::{Command, ShardStepResult};
use crate::runtime::step::Runtime;

/// Steps without progress before the runtime preempts across shards.
const STALL_STEPS: u32 = 2;

/// What a step's shards did, for stall detection.
#[derive(Default)]
pub(super) struct Progress {
    /// Something was ended, started loading, or is still loading.
    pub(super) moved: bool,
    /// Requests waiting for admission.
    pub(super) waiting: usize,
    /// The latest running request over all shards, with its shard.
    pub(super) latest: Option<(RequestKey, usize)>,
    /// Loads parked past their deadline over all shards: their blocks come back when they
    /// return.
    pub(super) parked: usize,
    /// A shard admitted nothing in the step (a cross-shard preemption's hold) while requests
    /// wait there: the next step admits.
    pub(super) admission_held: bool,
    /// The fewest blocks an allocation of the step refused a request, over the shards
    /// ([`ShardStepResult::blocks_wanted`]).
    pub(super) blocks_wanted: Option<usize>,
    /// A request generated a token or ended in the step: what a preemption across shards
    /// is for.
    pub(super) served: bool,
}

impl Progress {
    pub(super) fn add(&mut self, shard: usize, res: &ShardStepResult, loads: usize) {
        self.moved |= !res.ended.is_empty() || res.loading > 0 || loads > 0;
        self.waiting += res.waiting;
        self.parked += res.parked;
        self.admission_held |= res.admission_held;
        self.served |= res.generated > 0 || !res.ended.is_empty();
        if let Some(n) = res.blocks_wanted {
            self.blocks_wanted = Some(self.blocks_wanted.map_or(n, |m| m.min(n)));
        }
        if let Some(k) = res.latest_running {
            if self.latest.is_none_or(|(best, _)| k > best) {
                self.latest = Some((k, shard));
            }
        }
    }
}

impl Runtime {
    /// Pool pressure across shards can leave every shard unable to grow or admit: each holds
    /// part of the pool and preempts only its own requests. After [`STALL_STEPS`] steps with
    /// live requests and no progress — nothing scheduled, ended, recovered or loading, no load
    /// started — the latest running request in canonical order (lowest priority, latest
    /// admission), whichever shard holds it, is preempted at the next step. With no running
    /// request to preempt the stall is counted: in [`Metrics::late_load_stalls`] while blocks
    /// are parked for late loads (the pool waits for them), else in
    /// [`Metrics::no_progress_steps`].
    ///
    /// While blocks are parked, a preemption that no request's token or end followed is not
    /// repeated: the request it restarted stopped where it was, short of blocks only the late
    /// loads give back, and a second one would recompute its prefix again for nothing, step
    /// after step, for as long as the loads hang. The stall is counted a wait for them
    /// instead (`late_load_stalls`), and the engine waits for an event (their return, say).
    ///
    /// Returns whether the next step goes on resolving the stall (counting it towards a
    /// preemption, or applying one): work for the next step that no event announces.
    pub(super) fn resolve_stall(&mut self, p: &Progress) -> bool {
        if p.served {
            self.preempted_unserved = false;
        }
        // Planted bug `stall-preempts-for-nothing` (scripts/plants.sh): a preemption nothing
        // came of is repeated while the pool waits for late loads.
        let futile =
            p.parked > 0 && self.preempted_unserved && !planted!("stall-preempts-for-nothing");
        if p.moved || (p.waiting == 0 && p.latest.is_none()) {
            self.stalled_steps = 0;
            return false;
        }
        self.stalled_steps += 1;
        if self.stalled_steps < STALL_STEPS {
            return p.latest.is_some() && !futile;
        }
        self.stalled_steps = 0;
        // Planted bug for the liveness tests: never preempt across shards.
        let never = Progress {
            latest: None,
            ..Progress::default()
        };
        let p = if planted!("no-cross-shard-preempt") {
            &never
        } else {
            p
        };
        match p.latest {
            Some((key, shard)) if !futile => {
                self.inner.shards[shard]
                    .inbox
                    .push(Command::Preempt(key.seq()));
                self.preempted_unserved = true;
                return true;
            }
            _ if p.parked > 0 => self.metrics.late_load_stalls += 1,
            _ => self.metrics.no_progress_steps += 1,
        }
        false
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use crate::pool::BlockRef;
    use crate::rules::geometry::CacheGroup;
    use crate::runtime::shard::Command;
    use crate::runtime::{Runtime, StepOutput, SubmitRequest};

    /// A step whose report recovered nothing anyone runs has still moved the runtime: the stall
    /// count starts over, and a stall across shards it leaves is counted from the next step,
    /// which the engine must be told to take, or, waiting, it sleeps for good. The report here
    /// names a block nobody holds any more, as a failed load's does once its request started
    /// over and freed it.
    #[test]
    fn a_stall_left_by_a_step_that_recovered_is_work_for_the_next_step() {
        let full = CacheGroup::full_attention(16);
        let mut rt = Runtime::builder()
            .groups(vec![full, full])
            .pool_blocks(10) // 9 usable: two requests growing two blocks at a time stall on one
            .shards(2)
            .build()
            .unwrap();
        let mut ids = (0..).map(|i| format!("r{i}"));
        let a = ids.next().unwrap();
        let b = ids
            .find(|id| rt.inner.shard_of(id) != rt.inner.shard_of(&a))
            .unwrap();
        for id in [&a, &b] {
            rt.submit(SubmitRequest {
                id: id.as_str().into(),
                prompt: vec![1; 16],
                max_new_tokens: 40,
                priority: 0,
                load_deadline: None,
            })
            .unwrap();
        }
        let mut plan = rt.schedule().unwrap();
        for _ in 0..100 {
            if plan.scheduled.is_empty() {
                break;
            }
            rt.update(StepOutput::all_sampled(&plan));
            plan = rt.schedule().unwrap();
        }
        assert!(plan.scheduled.is_empty() && rt.live() == 2, "stalled");
        let free = (1..10)
            .find(|&id| rt.inner.pool.ref_count(id) == 0)
            .expect("a free block");
        let generation = rt.inner.pool.generation(free).unwrap();
        rt.sync_invalid.push(BlockRef {
            id: free,
            generation,
        });
        let plan = rt.schedule().unwrap();
        assert!(plan.scheduled.is_empty());
        assert_eq!(plan.recovery.report, [free]);
        assert!(
            rt.poll_work(),
            "the stall left by the step that recovered is work"
        );
        // Taken, the next steps count the stall and preempt.
        for _ in 0..10 {
            if !rt.poll_work() {
                break;
            }
            let plan = rt.schedule().unwrap();
            rt.update(StepOutput::all_sampled(&plan));
        }
        assert_eq!(rt.metrics().cross_shard_preemptions, 1);
        drop(rt.shutdown());
    }

    /// The step that applies a cross-shard preemption admits nothing on the victim's shard
    /// (so the freed blocks are not taken straight back): when the victim is all there is, that
    /// step's plan is empty, and the victim's admission is work for the next step that no
    /// event announces — the engine must be told, or, waiting, it sleeps for good.
    #[test]
    fn admission_held_by_a_preemption_is_work_for_the_next_step() {
        for shards in [1, 2] {
            let mut rt = Runtime::builder()
                .shards(shards)
                .token_budget(32)
                .build()
                .unwrap();
            rt.submit(SubmitRequest {
                id: "a".into(),
                prompt: (0..40).collect(),
                max_new_tokens: 2,
                priority: 0,
                load_deadline: None,
            })
            .unwrap();
            // A first chunk that samples nothing: no output is pending at the preemption.
            let plan = rt.schedule().unwrap();
            let s = &plan.scheduled[0];
            assert!(!s.samples);
            let seq = s.key.sequence();
            rt.update(StepOutput::all_sampled(&plan));
            // What `resolve_stall` sends to end a stall across shards.
            let shard = rt.inner.shard_of("a");
            rt.inner.shards[shard].inbox.push(Command::Preempt(seq));
            let plan = rt.schedule().unwrap();
            assert!(plan.scheduled.is_empty(), "{shards} shards: preempted");
            assert!(
                rt.poll_work(),
                "{shards} shards: the held admission is work"
            );
            let plan = rt.schedule().unwrap();
            assert_eq!(plan.scheduled.len(), 1, "{shards} shards: admitted again");
            assert_eq!(rt.metrics().cross_shard_preemptions, 1);
            drop(rt.shutdown());
        }
    }
}
