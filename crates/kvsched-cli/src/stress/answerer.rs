//! What answers each plan of a stress run (`--engine`): the [`SimEngine`] (reference bytes per
//! block, every read checked by the `KvChecker`) or the tiny model ([`ModelDriver`], every
//! kept token judged against the request decoded alone). The stress loop calls the same five
//! things of either: register a request, warm the sim store for it, answer a plan, settle it
//! once `update` said what to discard, and the counts at the end.

use std::time::{Duration, Instant};

use super::first_token::{EngineTimes, FirstTokens};
use super::model::ModelDriver;
use kvsched::kv::TierError;
use kvsched::rules::recovery::Mode;
use kvsched::runtime::{StepOutput, StepPlan};
use kvsched_testkit::{KvCheckCounts, SimCounts, SimEngine};

/// The engine of one run.
pub(super) enum Answerer {
    /// `--engine sim`, with its requests' times to first token.
    Sim(SimEngine<'static>, FirstTokens),
    /// `--engine model`.
    Model(ModelDriver),
}

impl Answerer {
    /// Registers request `id`, arrived at `arrival`, before it is submitted.
    pub(super) fn add_request(&mut self, id: &str, prompt: &[u32], arrival: Instant) {
        match self {
            Answerer::Sim(e, t) => {
                t.arrived(id, arrival);
                e.add_request(id, prompt)
            }
            Answerer::Model(m) => m.add_request(id, prompt, arrival),
        }
    }

    /// Forgets a request whose submission was refused.
    pub(super) fn end_request(&mut self, id: &str) {
        match self {
            Answerer::Sim(e, t) => {
                t.forget(id);
                e.end_request(id)
            }
            Answerer::Model(m) => m.end_request(id),
        }
    }

    /// Stores what a warm store holds for `prompt`'s first `tokens` tokens (the sim store's
    /// `--hit-ratio`); returns the chunks stored.
    pub(super) fn warm(&mut self, prompt: &[u32], tokens: u64) -> Result<u64, TierError> {
        match self {
            Answerer::Sim(e, _) => e.warm(prompt, tokens),
            Answerer::Model(m) => m.warm(prompt, tokens),
        }
    }

    /// Answers `plan`: its sync loads, the computation, a sample per sampling request.
    pub(super) fn step(&mut self, plan: &StepPlan) -> StepOutput {
        match self {
            Answerer::Sim(e, t) => {
                let out = e.step(plan);
                t.sampled(&out);
                out
            }
            Answerer::Model(m) => m.step(plan),
        }
    }

    /// Settles the last step once the scheduler said which outputs to discard.
    pub(super) fn settle(&mut self, plan: &StepPlan, discarded: &[std::sync::Arc<str>]) {
        match self {
            Answerer::Sim(e, _) => {
                e.settle(plan, discarded);
            }
            Answerer::Model(m) => m.settle(plan, discarded),
        }
    }

    /// The engine's counts (the model fills sync loads and chunks warmed).
    pub(super) fn counts(&self) -> SimCounts {
        match self {
            Answerer::Sim(e, _) => e.counts(),
            Answerer::Model(m) => m.sim_counts(),
        }
    }

    /// The `KvChecker`'s counters (`None` for the model, which the judge checks instead).
    pub(super) fn kv_counts(&self) -> Option<&KvCheckCounts> {
        match self {
            Answerer::Sim(e, _) => e.kv_counts(),
            Answerer::Model(_) => None,
        }
    }

    /// The engine's timing sections of the report, for a run of `elapsed`: the model's, or
    /// the sim engine's time to first token.
    pub(super) fn model_report(&self, elapsed: Duration) -> EngineTimes {
        match self {
            Answerer::Sim(_, t) => EngineTimes {
                model: None,
                first_token_us: Some(t.percentiles()),
            },
            Answerer::Model(m) => EngineTimes {
                model: Some(m.report(elapsed)),
                first_token_us: None,
            },
        }
    }

    /// What the judge found that mode `mode` forbids: in mode `safe`, any kept token or
    /// logit that differs from the request decoded alone.
    pub(super) fn violations(&self, mode: Mode) -> Vec<String> {
        match self {
            Answerer::Model(m) if mode == Mode::Safe => m.violations(),
            _ => Vec::new(),
        }
    }
}
