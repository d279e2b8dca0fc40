//! `--engine model`: the stress loop's plans answered by the tiny hand-written hybrid model
//! ([`TinyModel`] run by [`ModelEngine`], docs/model.md) instead of the simulated engine. Its
//! KV lives in host KV memory laid out for the model, reached through the plan's block
//! tables; sync loads, saves and the scheduler's async loads go through the same
//! [`TierConnector`] and store as the simulated engine's, so a failed, damaged, evicted or
//! late chunk reaches the model as it would an engine. Every kept sample is judged against
//! the request decoded alone: a wrong token in mode `safe` is an invariant violation.
//!
//! The default workload of `--engine model` ([`apply_defaults`]) is sized for seconds on two
//! cores and holds the case of vLLM #49250: bursts of requests sharing a prefix admitted in the
//! step another loads it synchronously, loads failing (`--failure-rate`), and a recompute spanning several
//! steps (a token budget below the rolled-back range). Each wrong token is counted by the vLLM
//! behaviour it comes from ([`WrongTokensByCause`], docs/model.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::config::{StressConfig, StressError};
use super::drive::Plane;
use super::report::Percentiles;
use super::store::Stores;
use super::values::{EngineKind, Rate};
use kvsched::kv::{HostKvMemory, KvMemory, TierConnector, TierError};
use kvsched::runtime::{StepOutput, StepPlan};
use kvsched_testkit::{ModelEngine, ModelShape, ModelStep, SimCounts, TinyModel};

/// `--engine`'s long help.
pub(super) const ENGINE_HELP: &str = "\
What answers the plans: `sim` (the simulated engine: reference bytes per block, every read \
checked) or `model` (a tiny hand-written hybrid model, a layer per cache group then a second \
layer of group 0, its KV in the blocks the plan names; every kept token and logit is \
compared with the request decoded alone, and a difference in mode safe is an invariant \
violation, exit 1).

With `model`, the flags left out take a workload sized for a run of a few seconds on two \
cores: --requests 600 --rate 200 --prompt-tokens 256 --output-tokens 16 --prefix-share 0.95 \
--prefix-burst 6 --hit-ratio 0.95 --token-budget 64 --async-ratio 0.5 --pool-blocks 400 \
--model-us 0 --prefixes 16. It holds the case of vLLM #49250: bursts of requests sharing a prefix, admitted \
in the step another loads it synchronously, loads failing (--failure-rate), recomputes \
spanning several steps, and a pool small enough that prefixes are evicted and loaded again. \
Given flags are kept.";

/// The flags `--engine model` sets when they are left out (`given` says whether a flag, by
/// its id, was given).
pub fn apply_defaults(cfg: &mut StressConfig, given: &dyn Fn(&str) -> bool) {
    if cfg.engine != EngineKind::Model {
        return;
    }
    let mut set = |id: &str, f: &mut dyn FnMut(&mut StressConfig)| {
        if !given(id) {
            f(cfg);
        }
    };
    set("requests", &mut |c| c.requests = 600);
    set("rate", &mut |c| c.rate = Rate::PerSecond(200.0));
    set("prompt_tokens", &mut |c| c.prompt_tokens = 256);
    set("output_tokens", &mut |c| c.output_tokens = 16);
    // Bursts of six requests on one base prefix, 95 % of each prompt shared and held by the
    // store: a loader computes a few tokens, so its sharers are admitted in its step.
    set("prefix_share", &mut |c| c.prefix_share = 0.95);
    set("prefix_burst", &mut |c| c.prefix_burst = 6);
    set("hit_ratio", &mut |c| c.hit_ratio = 0.95);
    // Below a rolled-back range: a recompute spans several steps.
    set("token_budget", &mut |c| c.token_budget = 64);
    set("async_ratio", &mut |c| c.async_ratio = 0.5);
    // Prefixes are evicted and loaded again: more loads, more of them failing.
    set("pool_blocks", &mut |c| c.pool_blocks = 400);
    set("model_us", &mut |c| c.model_us = 0);
    set("prefixes", &mut |c| c.prefix.prefixes = 16);
}

/// The settings `--engine model` refuses.
pub(super) fn check(cfg: &StressConfig) -> Result<(), StressError> {
    if cfg.engine == EngineKind::Model && cfg.engines.runs_engines() {
        return Err(StressError::Config {
            flag: "--engine",
            problem: "model runs in one process: leave out --engines".to_owned(),
        });
    }
    Ok(())
}

/// The data plane of one run of scheduler `who` on the model: the store, host KV memory laid
/// out for the model (`--kv-bytes-per-token` and `--mamba-state-bytes` do not apply), the
/// connector and the model's engine.
pub(super) fn plane(cfg: &StressConfig, stores: &Stores, who: &str) -> Result<Plane, StressError> {
    let kv = |e: &dyn std::fmt::Display| StressError::Kv(e.to_string());
    let groups = cfg.groups.groups();
    let model = Arc::new(TinyModel::new(
        &groups,
        ModelShape::default(),
        cfg.seed ^ 0x7e57,
    ));
    let layout = model.kv_layout(&groups).map_err(|e| kv(&e))?;
    let chunk_bytes = super::max_chunk_bytes(&layout);
    let store = stores.open(cfg, who, chunk_bytes)?;
    let memory: Arc<dyn KvMemory> =
        Arc::new(HostKvMemory::new(layout, cfg.pool_blocks).map_err(|e| kv(&e))?);
    let connector = Arc::new(
        TierConnector::new(
            Arc::clone(&store.tier),
            Arc::clone(&memory),
            // The model's weights follow the seed: a store holding another model's chunks
            // (a disk directory reused) never offers them.
            super::connector_config(cfg, &groups, chunk_bytes)
                .with_tag(cfg.kv_tag() ^ kvsched_testkit::hash_str(&format!("model:{}", cfg.seed))),
        )
        .map_err(|e| kv(&e))?,
    );
    let engine = ModelEngine::new(model, groups, memory);
    Ok(Plane {
        engine: super::answerer::Answerer::Model(ModelDriver::new(engine, Arc::clone(&connector))),
        connector,
        store,
    })
}

/// With `--repeat`, the judge's counts of `median` (the runs' medians) replaced by their
/// sums over `runs`: a wrong token or logit of any run stays in the report (a median of
/// 0, 1 and 4 wrong tokens would read 1, of 0, 0 and 4 would read 0).
pub(super) fn sum_judged<'a>(
    median: &mut Option<ModelReport>,
    runs: impl Iterator<Item = &'a ModelReport>,
) {
    let Some(m) = median else {
        return;
    };
    let runs: Vec<&ModelReport> = runs.collect();
    let sum = |f: fn(&ModelReport) -> u64| runs.iter().map(|r| f(r)).sum::<u64>();
    m.tokens_checked = sum(|r| r.tokens_checked);
    m.token_mismatches = sum(|r| r.token_mismatches);
    m.logit_mismatches = sum(|r| r.logit_mismatches);
    m.requests_affected = sum(|r| r.requests_affected);
    m.read_mismatches = sum(|r| r.read_mismatches);
    m.failed_load_sharers = sum(|r| r.failed_load_sharers);
    m.tainted_reads = sum(|r| r.tainted_reads);
    m.unreadable_reads = sum(|r| r.unreadable_reads);
    m.scheduled_past_tokens = sum(|r| r.scheduled_past_tokens);
    let c = &mut m.wrong_tokens_by_cause;
    c.sharers_read_failed_load = sum(|r| r.wrong_tokens_by_cause.sharers_read_failed_load);
    c.rolled_back_blocks_cached = sum(|r| r.wrong_tokens_by_cause.rolled_back_blocks_cached);
    c.unattributed = sum(|r| r.wrong_tokens_by_cause.unattributed);
}

/// The model's section of a run's report (`model` in JSON).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ModelReport {
    /// Kept samples compared with the request decoded alone.
    pub tokens_checked: u64,
    /// Kept samples whose token differs.
    pub token_mismatches: u64,
    /// Kept samples whose logit differs in any bit (a wrong read that kept the token too).
    pub logit_mismatches: u64,
    /// Requests with at least one logit mismatch.
    pub requests_affected: u64,
    /// Values read from KV memory (one layer's K and V at a position, or a recurrent state)
    /// whose bits differ from the request's decoded alone, whether or not a logit changed.
    #[serde(default)]
    pub read_mismatches: u64,
    /// `token_mismatches` by the vLLM behaviour each comes from, from what the mismatching
    /// request actually read (docs/model.md, "Which vLLM behaviour each wrong token is").
    #[serde(default)]
    pub wrong_tokens_by_cause: WrongTokensByCause,
    /// Requests scheduled in the step a sync load failed in holding its blocks (its sharers),
    /// over every failed sync load.
    #[serde(default)]
    pub failed_load_sharers: u64,
    /// Reads of what a failed sync load left unwritten (or of what a request that read it
    /// wrote since), the failing step's own reads included (their samples are discarded).
    #[serde(default)]
    pub tainted_reads: u64,
    /// Reads through a null entry or of an unreadable block.
    pub unreadable_reads: u64,
    /// Scheduled requests the model could not run: unknown to it, or scheduled past the
    /// tokens they have (each an invariant violation).
    #[serde(default)]
    pub scheduled_past_tokens: u64,
    /// Tokens the model computed (prefill, decode and recompute).
    pub tokens_computed: u64,
    /// Sync loads the model's engine ran, and those that reported invalid blocks.
    pub sync_loads: u64,
    /// See `sync_loads`.
    pub sync_loads_failed: u64,
    /// Scheduled arrival → first kept sample, µs.
    pub time_to_first_token_us: Percentiles,
    /// Wall time the model spent running steps (sync loads included), s.
    pub model_s: f64,
    /// Wall time the judge spent (the reference decodes), s.
    pub judge_s: f64,
    /// `model_s` ÷ run time.
    pub model_share: f64,
    /// Tokens computed per second of model time.
    pub tokens_per_s: f64,
}

/// Wrong tokens by the reads that made them (the model's engine tracks every slot a failed
/// sync load left unwritten, and who read it).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct WrongTokensByCause {
    /// vLLM #49250: a request that held a sync load's destinations when the load failed (a
    /// sharer admitted onto them before the load ran, or the loader) read them before they
    /// were rewritten: the rules sent it back to its pre-step length while another request
    /// recomputes them.
    pub sharers_read_failed_load: u64,
    /// A request admitted after the failure hit the rolled-back blocks the prefix cache kept
    /// (vLLM evicts them only under policy `fail`).
    pub rolled_back_blocks_cached: u64,
    /// The mismatching request read nothing a failed sync load left.
    pub unattributed: u64,
}

impl From<&kvsched_testkit::WrongTokenCauses> for WrongTokensByCause {
    fn from(c: &kvsched_testkit::WrongTokenCauses) -> Self {
        WrongTokensByCause {
            sharers_read_failed_load: c.sharers_read_failed_load,
            rolled_back_blocks_cached: c.rolled_back_blocks_cached,
            unattributed: c.unattributed,
        }
    }
}

/// The model as the stress loop's engine: runs each plan, settles it, saves what kept steps
/// completed, times itself and the judge, and records each request's time to first token.
pub(crate) struct ModelDriver {
    engine: ModelEngine,
    connector: Arc<TierConnector>,
    /// The last step, until it is settled.
    pending: Option<ModelStep>,
    /// Scheduled arrival of each request without a kept sample yet.
    arrivals: FxHashMap<Arc<str>, Instant>,
    ttft_ns: Vec<u64>,
    model_ns: u64,
    judge_ns: u64,
    chunks_warmed: u64,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl ModelDriver {
    fn new(engine: ModelEngine, connector: Arc<TierConnector>) -> Self {
        ModelDriver {
            engine,
            connector,
            pending: None,
            arrivals: FxHashMap::default(),
            ttft_ns: Vec::new(),
            model_ns: 0,
            judge_ns: 0,
            chunks_warmed: 0,
        }
    }

    pub(super) fn add_request(&mut self, id: &str, prompt: &[u32], arrival: Instant) {
        self.engine.add_request(id, prompt);
        self.arrivals.insert(id.into(), arrival);
    }

    pub(super) fn end_request(&mut self, id: &str) {
        self.engine.end_request(id);
        self.arrivals.remove(id);
    }

    /// Stores the model's own bytes of `prompt`'s first `tokens` tokens (what another engine
    /// computing the prefix alone would have saved).
    pub(super) fn warm(&mut self, prompt: &[u32], tokens: u64) -> Result<u64, TierError> {
        let n = usize::try_from(tokens)
            .unwrap_or(usize::MAX)
            .min(prompt.len());
        let prefix = &prompt[..n];
        let mut stored = 0;
        for (g, i, bytes) in self.engine.reference_blocks(prefix) {
            if self.connector.store_now(prefix, g, i, &bytes)? {
                stored += 1;
            }
        }
        self.chunks_warmed += stored;
        Ok(stored)
    }

    /// Runs `plan` on the model (timed; the judge's reference decodes apart) and returns its output: the sync loads' failed
    /// blocks and a sample for every request scheduled to sample.
    pub(super) fn step(&mut self, plan: &StepPlan) -> StepOutput {
        for (id, _) in &plan.ended {
            self.end_request(id);
        }
        // The judge's reference decodes first, timed as the judge's.
        let t = Instant::now();
        self.engine.decode_references(plan);
        let t1 = Instant::now();
        self.judge_ns += ns(t1 - t);
        let step = self.engine.run_step(plan, Some(self.connector.as_ref()));
        self.model_ns += ns(t1.elapsed());
        let mut out = StepOutput::all_sampled(plan);
        out.invalid_blocks = step.invalid_blocks.clone();
        self.pending = Some(step);
        out
    }

    /// Settles the last step: its kept samples judged (timed), each request's first kept
    /// sample recorded, and the prompt blocks kept requests completed offered to the store.
    pub(super) fn settle(&mut self, plan: &StepPlan, discarded: &[Arc<str>]) {
        let Some(step) = self.pending.take() else {
            return;
        };
        let t = Instant::now();
        let emitted = self.engine.settle(plan, step, discarded);
        let now = Instant::now();
        self.judge_ns += ns(now - t);
        for id in &emitted {
            if let Some(at) = self.arrivals.remove(id) {
                self.ttft_ns.push(ns(now.saturating_duration_since(at)));
            }
        }
        for s in plan.scheduled.iter().filter(|s| !discarded.contains(&s.id)) {
            if let Some(prompt) = self.engine.prompt(&s.id) {
                self.connector.save_step(prompt, s);
            }
        }
    }

    pub(super) fn sim_counts(&self) -> SimCounts {
        let c = self.engine.counts();
        SimCounts {
            sync_loads: c.sync_loads,
            sync_loads_failed: c.sync_loads_failed,
            chunks_warmed: self.chunks_warmed,
            ..SimCounts::default()
        }
    }

    pub(super) fn report(&self, elapsed: Duration) -> ModelReport {
        let c = self.engine.counts();
        let secs = |n: u64| (n as f64 / 1e6).round() / 1e3;
        let model_s = self.model_ns as f64 / 1e9;
        ModelReport {
            tokens_checked: c.tokens_checked,
            token_mismatches: c.token_mismatches,
            logit_mismatches: c.logit_mismatches,
            requests_affected: c.requests_affected,
            read_mismatches: c.read_mismatches,
            wrong_tokens_by_cause: (&c.wrong_token_causes).into(),
            failed_load_sharers: c.failed_load_sharers,
            tainted_reads: c.tainted_reads,
            unreadable_reads: c.unreadable_reads,
            scheduled_past_tokens: c.scheduled_past_tokens,
            tokens_computed: c.tokens_computed,
            sync_loads: c.sync_loads,
            sync_loads_failed: c.sync_loads_failed,
            time_to_first_token_us: percentiles(&self.ttft_ns),
            model_s: secs(self.model_ns),
            judge_s: secs(self.judge_ns),
            model_share: (model_s / elapsed.as_secs_f64().max(1e-9) * 1000.0).round() / 1000.0,
            tokens_per_s: (c.tokens_computed as f64 / model_s.max(1e-9)).round(),
        }
    }

    pub(super) fn violations(&self) -> Vec<String> {
        let c = self.engine.counts();
        let mut out = Vec::new();
        if c.token_mismatches != 0 || c.logit_mismatches != 0 {
            out.push(format!(
                "model: {} of {} kept tokens ({} logits) differ from the requests decoded alone, in {} requests, in mode safe",
                c.token_mismatches, c.tokens_checked, c.logit_mismatches, c.requests_affected
            ));
        }
        if c.read_mismatches != 0 {
            out.push(format!(
                "model: {} values read from KV memory differ from the requests decoded alone, in mode safe",
                c.read_mismatches
            ));
        }
        if c.scheduled_past_tokens != 0 {
            out.push(format!(
                "model: {} scheduled requests the model could not run (unknown, or past the tokens they have)",
                c.scheduled_past_tokens
            ));
        }
        out
    }
}

/// Percentiles (µs) of `ns` (nearest rank).
pub(super) fn percentiles(ns: &[u64]) -> Percentiles {
    let mut v = ns.to_vec();
    v.sort_unstable();
    let at = |q: f64| {
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1;
        v.get(i).map_or(0.0, |&x| (x as f64 / 100.0).round() / 10.0)
    };
    Percentiles {
        p50: at(0.5),
        p90: None,
        p99: at(0.99),
        p999: at(0.999),
        max: at(1.0),
        count: v.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With `--repeat`, the judge's counts are the runs' sums: runs that kept 0, 1 and 4
    /// wrong tokens report 5 (their median, 1, would hide the 4), the rest stays the median's.
    #[test]
    fn repeated_runs_sum_the_judges_counts() {
        let run = |wrong: u64, model_s: f64| ModelReport {
            tokens_checked: 100,
            token_mismatches: wrong,
            logit_mismatches: wrong,
            requests_affected: wrong.min(1),
            unreadable_reads: wrong,
            model_s,
            ..ModelReport::default()
        };
        let runs = [run(0, 1.0), run(1, 2.0), run(4, 3.0)];
        let mut median = Some(run(1, 2.0));
        sum_judged(&mut median, runs.iter());
        let m = median.expect("model");
        assert_eq!(
            (m.tokens_checked, m.token_mismatches, m.logit_mismatches),
            (300, 5, 5)
        );
        assert_eq!((m.requests_affected, m.unreadable_reads), (2, 5));
        assert_eq!(m.model_s, 2.0);
        let mut none = None;
        sum_judged(&mut none, runs.iter());
        assert!(none.is_none());
    }

    /// `--engine model` sizes only the flags left out, and the simulated engine keeps its own.
    #[test]
    fn model_defaults_apply_to_the_flags_left_out() {
        let mut cfg = StressConfig {
            engine: EngineKind::Model,
            requests: 7,
            ..StressConfig::default()
        };
        apply_defaults(&mut cfg, &|id| id == "requests");
        assert_eq!((cfg.requests, cfg.token_budget, cfg.model_us), (7, 64, 0));
        assert_eq!((cfg.prefix_burst, cfg.pool_blocks), (6, 400));
        assert_eq!(cfg.rate, Rate::PerSecond(200.0));
        let mut sim = StressConfig::default();
        apply_defaults(&mut sim, &|_| false);
        assert_eq!(sim.requests, StressConfig::default().requests);
        assert_eq!(sim.token_budget, StressConfig::default().token_budget);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let p = percentiles(&(1..=100).map(|i| i * 1000).collect::<Vec<_>>());
        assert_eq!((p.p50, p.p99, p.max, p.count), (50.0, 99.0, 100.0, 100));
        assert_eq!(percentiles(&[]).count, 0);
    }
}
