//! The order of a step's admission and scheduling, per mode.
//!
//! Every mode but `vllm` admits first and schedules after: every waiting request the pool can
//! hold is admitted (at most `max_seqs`), then the running requests, the new ones included,
//! get tokens in canonical order within the budget. A request admitted may so be left out of
//! the step that admitted it, and its sync load run a step or more later — harmless where a
//! block enters the prefix cache only once its bytes are written (mode `safe`).
//!
//! Mode `vllm` takes vLLM's order (its v1 scheduler's `schedule`): the running requests first,
//! within the budget; then, only when that preempted nothing, the waiting ones in order while
//! the budget lasts, each scheduled into this step as it is admitted (a sync loader with its
//! load) or, loading asynchronously, taking no tokens. A sync loader's destinations enter the
//! prefix cache as it is admitted (`admit_one`), so a request admitted after it in the same
//! step, or in a later one, gets a local hit on blocks whose load may still fail — the
//! caching behind vLLM #49250 — and a loader is never left out of the step it was admitted
//! in, so no request hits destinations whose load has not run.

use std::time::Instant;

use crate::connector::LoadJob;
use crate::rules::recovery::Mode;
use crate::runtime::policy::alignment::chunk_alignment;
use crate::runtime::policy::scheduling::StepBudget;

use super::admit::Admitted;
use super::request::Phase;
use super::strategy::Strategy;
use super::{next_key, Env, Shard, StepSettings};

impl<S: Strategy> Shard<S> {
    /// Admission and scheduling of one step, in the order of `settings.mode` (module docs).
    /// `admit`: whether this step may admit (no cross-shard preemption held it).
    pub(super) fn admit_and_schedule(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        admit: bool,
        loads_out: &mut Vec<LoadJob>,
    ) {
        let vllm = settings.mode == Mode::Vllm && !planted!("vllm-admits-before-schedule");
        if !vllm {
            if admit {
                self.admit(env, settings, now, loads_out);
            }
            let _ = self.schedule(env, settings, now);
            return;
        }
        let preempted = self.result.counters.preemptions;
        let mut budget = self.schedule(env, settings, now);
        if admit && self.result.counters.preemptions == preempted {
            self.admit_into_step(env, settings, now, &mut budget, loads_out);
        }
    }

    /// Mode `vllm`: admits waiting requests in canonical order while `budget` lasts (at most
    /// `max_seqs`), scheduling each running one into this step as it is admitted. Stops at the
    /// first request the pool cannot hold.
    fn admit_into_step(
        &mut self,
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        budget: &mut StepBudget,
        loads_out: &mut Vec<LoadJob>,
    ) {
        let align = chunk_alignment(env.geo);
        let mut admitted = 0usize;
        let mut cursor = None;
        while let Some(key) = next_key(&self.waiting, cursor) {
            cursor = Some(key);
            // A budget with a token and a sequence left grants any request at least one
            // token (`aligned_chunk` never cuts a grant to 0), so what is admitted runs.
            if admitted >= settings.max_seqs || budget.exhausted() {
                break;
            }
            match self.admit_one(env, settings, now, key, loads_out) {
                Admitted::PoolFull => break,
                Admitted::Gone => {}
                Admitted::Into(phase) => {
                    admitted += 1;
                    if phase == Phase::Running {
                        // Its prompt's blocks are allocated; its first chunk may need more
                        // (a resumed request's chunk past its prompt, a window's or a Mamba
                        // state's entry). Short of blocks it preempts only a request this
                        // step has not planned (`schedule_one`), or waits for a later step.
                        let _ = self.schedule_one(env, settings, now, key, budget, align);
                    }
                }
            }
        }
    }
}
