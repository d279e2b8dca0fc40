//! [`SimEngine`]: one plan in, its output out — on simulated KV, or on real KV bytes through
//! a [`TierConnector`] and a verifying [`KvChecker`].

use std::fmt;
use std::sync::Arc as StdArc;

use super::kv_check::{KvCheckCounts, KvChecker, StepCheck};
use kvsched::connector::{KvConnector, LoadJob, LoadResult};
use kvsched::kv::{TierConnector, TierError};
use kvsched::{ScheduledRequest, StepOutput, StepPlan};

/// What a [`SimEngine`] has done, summed over the plans it ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounts {
    /// Plans run (each answered by one output).
    pub steps: u64,
    /// Scheduled requests computed.
    pub scheduled: u64,
    /// Tokens computed.
    pub tokens: u64,
    /// Synchronous loads run.
    pub sync_loads: u64,
    /// Of those, loads that failed (their failed blocks went into the output).
    pub sync_loads_failed: u64,
    /// Tokens sampled (one per request scheduled with `samples`).
    pub samples: u64,
    /// Requests the engine finished on its own (see [`SimEngine::step_with`]).
    pub finishes: u64,
    /// Chunks stored in the tier by [`SimEngine::warm`].
    pub chunks_warmed: u64,
    /// Save offers made by [`SimEngine::settle`] (blocks offered to the tier's write-behind).
    pub blocks_offered: u64,
}

/// A simulated engine: [`step`](SimEngine::step) takes a [`StepPlan`] and returns the
/// [`StepOutput`] that answers it.
///
/// For each scheduled request, in plan order, it
///
/// 1. runs the request's synchronous load, if it has one, through the sync-load runner the
///    engine was built with (a failure's blocks go into [`StepOutput::invalid_blocks`]);
/// 2. computes the scheduled tokens — on simulated KV, nothing is read or written; on real
///    KV ([`with_kv`](SimEngine::with_kv)) the [`KvChecker`] reads every entry the request's
///    tables name, checks each read against its reference, and writes what the step computes;
/// 3. samples a token if the request was scheduled with `samples`
///    ([`StepOutput::sampled`]);
/// 4. finishes the request if the caller's finish rule says so
///    ([`StepOutput::finished`], with [`step_with`](SimEngine::step_with)).
///
/// # Real KV bytes
///
/// An engine built [`with_kv`](SimEngine::with_kv) runs the KV data plane of a serving
/// engine on host memory: the sync loads go through the [`TierConnector`] (which writes the
/// KV memory the checker reads), and the caller completes each step with
/// [`settle`](SimEngine::settle) once the scheduler's `update` has said which outputs to
/// discard — the step's garbage is then counted as kept or discarded, the kept samplers'
/// tokens join their requests, and the full prompt blocks the kept requests computed are
/// offered to the tier (write-behind: `settle` copies their bytes, never waits for the tier).
/// The loop is
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use kvsched::kv::{HostKvMemory, KvLayout, KvMemory, MemoryTier, TierConnector, TierConnectorConfig};
/// use kvsched_testkit::{KvChecker, SimEngine};
/// use kvsched::{CacheGroup, Runtime, SubmitRequest};
///
/// let groups = vec![CacheGroup::full_attention(16)];
/// let layout = KvLayout::for_groups(&groups, 8, 0)?; // 8 bytes of KV per token
/// let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 256)?);
/// let config = TierConnectorConfig::default().with_groups(groups.clone());
/// let tag = config.tag;
/// let connector = Arc::new(TierConnector::new(
///     Arc::new(MemoryTier::new(16 << 20, 4)),
///     Arc::clone(&memory),
///     config,
/// )?);
/// let mut rt = Runtime::builder()
///     .groups(groups.clone())
///     .pool_blocks(256)
///     .connector(connector.clone())
///     .build()?;
/// let checker = KvChecker::new(groups, tag, 8, 0, memory);
/// let mut engine = SimEngine::with_kv(connector.clone(), checker);
/// let prompt: Vec<u32> = (1..=70).collect();
/// engine.warm(&prompt, 48)?; // the store holds the first 3 blocks
/// engine.add_request("r1", &prompt); // before submitting it
/// rt.submit(SubmitRequest { id: "r1".into(), prompt, max_new_tokens: 4,
///                           priority: 0, load_deadline: None })?;
/// while rt.live() > 0 {
///     let plan = rt.schedule()?;
///     let out = engine.step(&plan); // sync loads, every read checked, computed KV written
///     let discard = rt.update(out);
///     engine.settle(&plan, &discard); // before the next step: garbage counted, saves offered
///     if plan.scheduled.is_empty() {
///         rt.wait_for_work(Duration::from_millis(1)); // an async load is running
///     }
/// }
/// rt.shutdown();
/// connector.flush();
/// let checked = engine.kv_counts().expect("real KV");
/// assert_eq!(checked.garbage_reads, 0);
/// assert!(checked.kv_bytes_verified > 0);
/// assert_eq!(connector.counts().chunks_loaded, 3); // the warmed prefix, loaded and verified
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`kv_counts`](SimEngine::kv_counts) has the checker's counts (`garbage_reads` must be
/// 0 in mode `safe`), the connector's [`counts`](TierConnector::counts) the bytes moved.
///
/// # Guarantees
///
/// * The output answers the plan it was made from ([`StepOutput::step`] is the plan's).
/// * Deterministic: the output depends only on the plan, the sync-load runner and the finish
///   rule; the engine keeps no state between steps besides its [`SimCounts`].
/// * Sync loads run on the calling thread, one after the other, in plan order.
/// * `Send`: an engine may be built on one thread and run on another.
///
/// # Limits
///
/// It takes no time beyond its loads and checks: a caller that wants a model's cost waits
/// itself. A panic in the sync-load runner, the connector or the finish rule propagates to the
/// caller. On real KV it keeps, per request added and not yet ended, its tokens (prompt and
/// samples kept): memory linear in the live requests' lengths.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use kvsched_testkit::SimEngine;
/// use kvsched::{Runtime, StepOutput, SubmitRequest};
///
/// let mut rt = Runtime::builder().shards(1).build()?;
/// rt.submit(SubmitRequest {
///     id: "r1".into(),
///     prompt: vec![7; 40],
///     max_new_tokens: 3,
///     priority: 0,
///     load_deadline: None,
/// })?;
/// let mut engine = SimEngine::default(); // no connector: every sync load succeeds
/// let mut out = StepOutput::default();
/// while rt.live() > 0 {
///     rt.update(std::mem::take(&mut out));
///     let plan = rt.schedule()?;
///     out = engine.step(&plan);
///     if plan.scheduled.is_empty() {
///         rt.wait_for_work(Duration::from_millis(1));
///     }
/// }
/// assert_eq!(engine.counts().samples, 3);
/// assert_eq!(rt.shutdown().metrics.finished, 1);
/// # Ok::<(), kvsched::RuntimeError>(())
/// ```
pub struct SimEngine<'a> {
    sync_loads: Box<dyn FnMut(&LoadJob) -> LoadResult + Send + 'a>,
    kv: Option<KvPlane>,
    counts: SimCounts,
}

/// The real-bytes side of an engine built [`SimEngine::with_kv`].
struct KvPlane {
    connector: StdArc<TierConnector>,
    checker: KvChecker,
    /// The last step's reads, until [`SimEngine::settle`].
    pending: Option<StepCheck>,
}

impl fmt::Debug for SimEngine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimEngine")
            .field("counts", &self.counts)
            .field("kv", &self.kv.as_ref().map(|k| k.checker.counts()))
            .finish_non_exhaustive()
    }
}

impl Default for SimEngine<'_> {
    /// An engine whose sync loads all succeed (there is no KV store behind them).
    fn default() -> Self {
        SimEngine::new(|_| LoadResult::Ok)
    }
}

impl<'a> SimEngine<'a> {
    /// An engine that runs each synchronous load with `sync_loads` (for a
    /// [`SimConnector`](crate::SimConnector), its
    /// [`decide`](crate::SimConnector::decide): the connector's failure decision
    /// without its latency).
    pub fn new(sync_loads: impl FnMut(&LoadJob) -> LoadResult + Send + 'a) -> Self {
        SimEngine {
            sync_loads: Box::new(sync_loads),
            kv: None,
            counts: SimCounts::default(),
        }
    }

    /// An engine that runs each synchronous load through `connector`'s
    /// [`load`](KvConnector::load), on the calling thread.
    pub fn with_connector(connector: &'a dyn KvConnector) -> Self {
        SimEngine::new(move |job| connector.load(job))
    }

    /// An engine on real KV bytes: sync loads through `connector` (on the calling thread),
    /// every read checked by `checker`, whose KV memory must be the connector's (see the type's
    /// docs for the loop). The scheduler's asynchronous loads go through the same connector on
    /// its workers.
    pub fn with_kv(connector: StdArc<TierConnector>, checker: KvChecker) -> SimEngine<'static> {
        SimEngine {
            sync_loads: Box::new(|_| LoadResult::Ok),
            kv: Some(KvPlane {
                connector,
                checker,
                pending: None,
            }),
            counts: SimCounts::default(),
        }
    }

    /// Registers a request's prompt with the checker before it is submitted (its reads are
    /// checked against references of these tokens). Without real KV: nothing.
    pub fn add_request(&mut self, id: &str, prompt: &[u32]) {
        if let Some(kv) = &mut self.kv {
            kv.checker.add_request(id, prompt);
        }
    }

    /// Forgets a request that will not be stepped (its submission was refused). Requests a
    /// plan ends are forgotten by [`step`](Self::step).
    pub fn end_request(&mut self, id: &str) {
        if let Some(kv) = &mut self.kv {
            kv.checker.end_request(id);
        }
    }

    /// Stores in the tier, now and on the calling thread, the reference chunks of every block
    /// of `prompt`'s first `tokens` tokens in every group (what a warm store holds for the
    /// prefix: the bytes the engine would have computed). Returns the chunks stored; without
    /// real KV, 0.
    ///
    /// # Errors
    ///
    /// The tier's error (the chunks before it are stored).
    pub fn warm(&mut self, prompt: &[u32], tokens: u64) -> Result<u64, TierError> {
        let Some(kv) = &self.kv else {
            return Ok(0);
        };
        let tokens = usize::try_from(tokens)
            .unwrap_or(usize::MAX)
            .min(prompt.len());
        // A block's key and reference depend on the tokens up to its end only, so the
        // prefix's full blocks are those of the prefix alone.
        let prefix = &prompt[..tokens];
        let mut stored = 0;
        for g in 0..kv.connector.memory().layout().num_groups() {
            for (i, bytes) in kv.checker.reference_blocks(prefix, g).iter().enumerate() {
                if kv.connector.store_now(prefix, g, i, bytes)? {
                    stored += 1;
                }
            }
        }
        self.counts.chunks_warmed += stored;
        Ok(stored)
    }

    /// Completes the last step on real KV once the scheduler said which outputs to discard
    /// (`discarded`: what its `update` returned for the output of `plan`): counts the step's
    /// garbage as kept or discarded, appends the kept samplers' tokens to their requests and
    /// offers the full prompt blocks every kept request computed to the tier. Returns the
    /// requests whose samples the engine may emit. Call it once per [`step`](Self::step),
    /// before the next; without real KV it only returns the samplers not discarded.
    pub fn settle(&mut self, plan: &StepPlan, discarded: &[StdArc<str>]) -> Vec<StdArc<str>> {
        let Some(kv) = &mut self.kv else {
            return plan
                .scheduled
                .iter()
                .filter(|s| s.samples && !discarded.contains(&s.id))
                .map(|s| s.id.clone())
                .collect();
        };
        let Some(check) = kv.pending.take() else {
            return Vec::new();
        };
        let emitted = kv.checker.settle(plan, check, discarded);
        for s in plan.scheduled.iter().filter(|s| !discarded.contains(&s.id)) {
            let blocks = kv.checker.completed_prompt_blocks(s);
            if blocks.is_empty() {
                continue;
            }
            if let Some(prompt) = kv.checker.prompt(&s.id) {
                self.counts.blocks_offered += blocks.len() as u64;
                kv.connector.save_blocks(prompt, &blocks);
            }
        }
        emitted
    }

    /// The checker's counters (real KV only).
    pub fn kv_counts(&self) -> Option<&KvCheckCounts> {
        self.kv.as_ref().map(|k| k.checker.counts())
    }

    /// The connector (real KV only).
    pub fn connector(&self) -> Option<&StdArc<TierConnector>> {
        self.kv.as_ref().map(|k| &k.connector)
    }

    /// Runs `plan` and returns the output that answers it. The engine finishes no request
    /// on its own: requests end when they have generated their tokens.
    pub fn step(&mut self, plan: &StepPlan) -> StepOutput {
        self.step_with(plan, |_| false)
    }

    /// Runs `plan` and returns the output that answers it, finishing each scheduled request
    /// for which `finish` returns true (a stop token, a client gone). `finish` is called once
    /// per scheduled request, in plan order, after its sample.
    pub fn step_with(
        &mut self,
        plan: &StepPlan,
        mut finish: impl FnMut(&ScheduledRequest) -> bool,
    ) -> StepOutput {
        self.counts.steps += 1;
        let mut out = StepOutput::for_plan(plan);
        if let Some(kv) = &mut self.kv {
            for (id, _) in &plan.ended {
                kv.checker.end_request(id);
            }
            let before = kv.checker.counts().clone();
            let check = kv.checker.run_step(plan, Some(kv.connector.as_ref()));
            let after = kv.checker.counts();
            self.counts.sync_loads += after.sync_loads - before.sync_loads;
            self.counts.sync_loads_failed += after.sync_loads_failed - before.sync_loads_failed;
            out.invalid_blocks.extend_from_slice(&check.invalid_blocks);
            kv.pending = Some(check);
        }
        for s in &plan.scheduled {
            self.run(s, &mut out);
            if finish(s) {
                self.counts.finishes += 1;
                out.finished.push(s.id.clone());
            }
        }
        out
    }

    /// What the engine has done so far.
    pub fn counts(&self) -> SimCounts {
        self.counts
    }

    /// Runs one scheduled request of the step into `out`: its synchronous load first (the
    /// blocks of tokens `start..end` filled from the KV store), then the computation of its
    /// `num_tokens` tokens from `num_computed_tokens` on, then its sample. The computation is
    /// where a real engine reads the KV entries below those tokens and writes theirs: on
    /// simulated KV nothing is read or written; on real KV the checker did both (and the
    /// sync loads) for the whole step before.
    fn run(&mut self, s: &ScheduledRequest, out: &mut StepOutput) {
        if let Some(job) = s.sync_load.as_deref().filter(|_| self.kv.is_none()) {
            self.counts.sync_loads += 1;
            if let LoadResult::Failed(bad) = (self.sync_loads)(job) {
                self.counts.sync_loads_failed += 1;
                out.invalid_blocks.extend(bad.into_flat());
            }
        }
        self.counts.scheduled += 1;
        self.counts.tokens += s.num_tokens;
        if s.samples {
            self.counts.samples += 1;
            out.sampled.push(s.id.clone());
        }
    }
}
