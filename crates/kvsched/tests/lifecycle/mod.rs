//! The engine loop of `kv_lifecycle.rs`: a runtime on real bytes, driven step by step, with
//! engine finishes, lost outputs and a tier that hangs on demand (also `kv_lifecycle_outputs.rs`'s;
//! each file uses its part).
#![allow(dead_code)]

use std::sync::{Arc, Condvar, Mutex};

use kvsched::connector::{CancelToken, KvConnector};
use kvsched::kv::{
    ChunkKey, HostKvMemory, KvLayout, KvMemory, Tier, TierConnector, TierConnectorConfig, TierError,
};
use kvsched::{Builder, CacheGroup, Report, Runtime, StepOutput, StepPlan, SubmitRequest};
use kvsched_testkit::KvChecker;

const BPT: usize = 8;
const STATE: usize = 32;
const TAG: u64 = 7;

/// A runtime, its connector and the verifying checker, driven one step at a time.
pub struct Bench {
    pub rt: Runtime,
    pub conn: Arc<TierConnector>,
    pub checker: KvChecker,
    finish_next: Vec<Arc<str>>,
}

impl Bench {
    /// A bench on `tier` whose hits load asynchronously at `async_ratio`; `build` sets the
    /// runtime's sizes.
    pub fn new(
        groups: Vec<CacheGroup>,
        tier: Arc<dyn Tier>,
        async_ratio: f64,
        build: impl FnOnce(Builder) -> Builder,
    ) -> Bench {
        Self::wrapped(groups, tier, async_ratio, build, |c| c)
    }

    /// A bench whose runtime reaches the connector through `wrap`.
    pub fn wrapped(
        groups: Vec<CacheGroup>,
        tier: Arc<dyn Tier>,
        async_ratio: f64,
        build: impl FnOnce(Builder) -> Builder,
        wrap: impl FnOnce(Arc<dyn KvConnector>) -> Arc<dyn KvConnector>,
    ) -> Bench {
        let blocks = 2048;
        let layout = KvLayout::for_groups(&groups, BPT, STATE).expect("layout");
        let memory: Arc<dyn KvMemory> =
            Arc::new(HostKvMemory::new(layout, blocks).expect("memory"));
        let conn = Arc::new(
            TierConnector::new(
                tier,
                Arc::clone(&memory),
                TierConnectorConfig::default()
                    .with_groups(groups.clone())
                    .with_scheduler_block_size(Some(16))
                    .with_tag(TAG)
                    .with_async_ratio(async_ratio)
                    .with_seed(3),
            )
            .expect("connector"),
        );
        let dyn_conn: Arc<dyn KvConnector> = wrap(conn.clone());
        let rt = build(
            Runtime::builder()
                .groups(groups.clone())
                .scheduler_block_size(16)
                .connector(dyn_conn),
        )
        .build()
        .expect("runtime");
        let checker = KvChecker::new(groups, TAG, BPT, STATE, memory);
        Bench {
            rt,
            conn,
            checker,
            finish_next: Vec::new(),
        }
    }

    /// Stores the reference bytes of `prompt`'s blocks below `tokens` in the tier.
    pub fn warm(&mut self, prompt: &[u32], tokens: usize) {
        let groups = self.rt.geometry().groups().to_vec();
        for (g, grp) in groups.iter().enumerate() {
            for i in 0..tokens / grp.block_size as usize {
                let bytes = self
                    .checker
                    .reference_block(prompt, g, i)
                    .expect("full block");
                self.conn.store_now(prompt, g, i, &bytes).expect("store");
            }
        }
    }

    pub fn submit(&mut self, id: &str, prompt: &[u32], max_new_tokens: u32) {
        self.checker.add_request(id, prompt);
        self.rt
            .submit(SubmitRequest {
                id: id.into(),
                prompt: prompt.to_vec(),
                max_new_tokens,
                priority: 0,
                load_deadline: None,
            })
            .expect("submit");
    }

    /// The engine finishes `id` in the next output it sends.
    pub fn finish_next(&mut self, id: &str) {
        self.finish_next.push(id.into());
    }

    /// The next plan, not run yet. Checks what a plan promises an engine: a sync load
    /// fills exactly the range below the request's computed length, from its local prefix.
    pub fn plan(&mut self) -> StepPlan {
        let plan = self.rt.schedule().expect("step");
        for s in &plan.scheduled {
            if let Some(job) = &s.sync_load {
                assert_eq!(
                    job.end_tokens, s.num_computed_tokens,
                    "{}: a sync load ({}, {}) on a plan at {}",
                    s.id, job.start_tokens, job.end_tokens, s.num_computed_tokens
                );
                assert!(job.deadline.is_some(), "a sync load without a deadline");
            }
        }
        for (id, _) in &plan.ended {
            self.checker.end_request(id);
        }
        plan
    }

    /// One step run and answered.
    pub fn step(&mut self) -> StepPlan {
        let plan = self.plan();
        self.answer(&plan);
        plan
    }

    /// Runs `plan` and answers it.
    pub fn answer(&mut self, plan: &StepPlan) {
        self.answer_leaving_out(plan, |_| false);
    }

    /// Runs `plan` and answers it with the samples of the requests `left_out` names left out
    /// (never sent); returns the samples the engine emits (those `update` does not discard).
    pub fn answer_leaving_out(
        &mut self,
        plan: &StepPlan,
        left_out: impl Fn(&str) -> bool,
    ) -> Vec<Arc<str>> {
        let mut plan = plan.clone();
        let check = self.checker.run_step(&plan, Some(self.conn.as_ref()));
        for s in &mut plan.scheduled {
            s.samples &= !left_out(&s.id);
        }
        let mut out = StepOutput::for_plan(&plan);
        out.sampled = plan
            .scheduled
            .iter()
            .filter(|s| s.samples)
            .map(|s| s.id.clone())
            .collect();
        out.invalid_blocks = check.invalid_blocks.clone();
        out.finished = std::mem::take(&mut self.finish_next);
        let discard = self.rt.update(out);
        let emitted = self.checker.settle(&plan, check, &discard);
        for s in plan.scheduled.iter().filter(|s| !discard.contains(&s.id)) {
            if let Some(prompt) = self.checker.prompt(&s.id) {
                let prompt = prompt.to_vec();
                self.conn.save_step(&prompt, s);
            }
        }
        self.rt.wait_for_work(std::time::Duration::from_millis(1));
        emitted
    }

    /// One step whose output never reaches the runtime: with `ran`, the engine ran all of it
    /// (its sync loads, reads and writes happened) before the output was lost; without, it
    /// crashed before running any of it.
    pub fn step_lost(&mut self, ran: bool) -> StepPlan {
        let plan = self.plan();
        self.lose(&plan, ran);
        plan
    }

    /// `plan`'s output never reaches the runtime (`ran`: as in [`step_lost`](Self::step_lost)).
    pub fn lose(&mut self, plan: &StepPlan, ran: bool) {
        if ran {
            let _ = self.checker.run_step(plan, Some(self.conn.as_ref()));
        }
    }

    /// Steps until nothing is live, at most `max` steps.
    pub fn run_to_end(&mut self, max: usize) {
        self.run_to_end_with(max, |_| {});
    }

    /// Steps until nothing is live, at most `max` steps, showing each plan to `f`.
    pub fn run_to_end_with(&mut self, max: usize, mut f: impl FnMut(&StepPlan)) {
        for _ in 0..max {
            if self.rt.live() == 0 {
                return;
            }
            let plan = self.step();
            f(&plan);
        }
    }

    /// Steps until nothing is live or `limit` of wall time has passed: for runs whose end
    /// waits on load deadlines (wall time), which a step count cannot bound on a loaded
    /// machine. A step that schedules nothing sleeps a millisecond before the next.
    pub fn run_until_idle(&mut self, limit: std::time::Duration) {
        let start = std::time::Instant::now();
        while self.rt.live() > 0 && start.elapsed() < limit {
            if self.step().scheduled.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    /// Shuts the runtime down; flushes the connector. Every sample the engine emitted was
    /// asked for at its request's next token (`KvCheckCounts::misplaced_samples`).
    pub fn finish(self) -> Report {
        let misplaced = self.checker.counts().misplaced_samples;
        assert_eq!(misplaced, 0, "samples asked for at another position");
        let report = self.rt.shutdown();
        self.conn.flush();
        report
    }

    /// [`finish`](Self::finish) after a run of `submitted` requests that all ended: none is
    /// left live, each is counted finished, cancelled or failed, and no invariant was broken.
    pub fn finish_all_ended(self, submitted: u64, run: &str) -> Report {
        assert_eq!(self.rt.live(), 0, "{run}: requests left");
        let report = self.finish();
        let m = &report.metrics;
        assert_eq!(
            m.finished + m.cancelled + m.failed,
            submitted,
            "{run}: {m:?}"
        );
        assert!(
            report.violations.is_empty(),
            "{run}: {:?}",
            report.violations
        );
        report
    }
}

/// A memory tier (64 MiB) behind faults of `seed` damaging a share `corrupt` of the chunks it
/// reads and losing a share `evict`.
pub fn faulty_memory_tier(seed: u64, corrupt: f64, evict: f64) -> Arc<dyn Tier> {
    let faults = kvsched_testkit::FaultConfig {
        seed,
        corrupt,
        evict,
        ..kvsched_testkit::FaultConfig::default()
    };
    Arc::new(
        kvsched_testkit::FaultyTier::new(kvsched::kv::MemoryTier::new(64 << 20, 4), faults)
            .expect("faults"),
    )
}

/// Three prompts' 64-token prefixes, stored in `e`'s tier.
pub fn warmed_prefixes(e: &mut Bench) -> Vec<Vec<u32>> {
    let prefixes: Vec<Vec<u32>> = (0..3u32)
        .map(|p| (0..64).map(|t| p * 1000 + t + 1).collect())
        .collect();
    for p in &prefixes {
        e.warm(p, 64);
    }
    prefixes
}

/// A tier whose `get` of a key chosen at `rate` (seeded, per key) never returns until
/// [`release`](Self::release): a store that hangs.
pub struct HangingTier {
    inner: Arc<dyn Tier>,
    rate: f64,
    seed: u64,
    released: Mutex<bool>,
    wake: Condvar,
    hung: Mutex<u64>,
}

impl HangingTier {
    pub fn new(inner: Arc<dyn Tier>, rate: f64, seed: u64) -> HangingTier {
        HangingTier {
            inner,
            rate,
            seed,
            released: Mutex::new(false),
            wake: Condvar::new(),
            hung: Mutex::new(0),
        }
    }

    fn hangs(&self, key: ChunkKey) -> bool {
        let mut r =
            kvsched_testkit::SplitMix64::new(self.seed ^ key.0 as u64 ^ (key.0 >> 64) as u64);
        r.unit() < self.rate
    }

    /// Gets that hung so far.
    pub fn hung(&self) -> u64 {
        *self.hung.lock().expect("lock")
    }

    /// Lets every hung get return (as a tier error).
    pub fn release(&self) {
        *self.released.lock().expect("lock") = true;
        self.wake.notify_all();
    }
}

impl Tier for HangingTier {
    fn name(&self) -> &str {
        "hanging"
    }
    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        self.inner.exists(keys, cancel)
    }
    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        if keys.iter().any(|&k| self.hangs(k)) {
            *self.hung.lock().expect("lock") += 1;
            let mut released = self.released.lock().expect("lock");
            while !*released {
                released = self.wake.wait(released).expect("lock");
            }
            return Err(TierError::Unavailable("hung".into()));
        }
        self.inner.get(keys, cancel)
    }
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        self.inner.put(chunks)
    }
}

/// A connector whose `load` of the requests `hangs` names never returns until
/// [`release`](Self::release): a connector (not a tier) that hangs its worker.
pub struct HangingConnector {
    inner: Arc<dyn KvConnector>,
    hangs: fn(&str) -> bool,
    released: Mutex<bool>,
    wake: Condvar,
    hung: Mutex<u64>,
}

impl HangingConnector {
    pub fn new(inner: Arc<dyn KvConnector>, hangs: fn(&str) -> bool) -> HangingConnector {
        HangingConnector {
            inner,
            hangs,
            released: Mutex::new(false),
            wake: Condvar::new(),
            hung: Mutex::new(0),
        }
    }

    /// Loads that hung so far.
    pub fn hung(&self) -> u64 {
        *self.hung.lock().expect("lock")
    }

    /// Lets every hung load return (failed).
    pub fn release(&self) {
        *self.released.lock().expect("lock") = true;
        self.wake.notify_all();
    }
}

impl KvConnector for HangingConnector {
    fn lookup(&self, q: kvsched::connector::LookupQuery<'_>) -> kvsched::connector::LookupResult {
        self.inner.lookup(q)
    }
    fn load(&self, job: &kvsched::LoadJob) -> kvsched::LoadResult {
        if (self.hangs)(&job.request) {
            *self.hung.lock().expect("lock") += 1;
            let mut released = self.released.lock().expect("lock");
            while !*released {
                released = self.wake.wait(released).expect("lock");
            }
            return kvsched::LoadResult::all_failed(job);
        }
        self.inner.load(job)
    }
}
