//! The engine of the `engine_hostile` tests: it drives a runtime through the public API only
//! and checks what every plan asks it to read. A step that read a wrong tag writes poison (what
//! it computed is garbage); a read of a wrong tag in a step whose output `update` did not
//! return for discard is a garbage read the runtime let through.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{KvConnector, LoadJob, LoadResult};
use kvsched::{
    BlockRef, CacheGroup, EndState, Runtime, RuntimeError, Settings, StepOutput, SubmitRequest,
};

use super::connector::{tag, Act, Conn, Mem, POISON};

pub struct Req {
    pub prompt: Vec<u32>,
    pub max_new: u32,
    pub emitted: u32,
    pub engine_finished: bool,
}

#[derive(Default, Debug)]
pub struct Tally {
    pub garbage_kept: Vec<String>,
    pub garbage_discarded: u64,
    pub null_reads: Vec<String>,
    pub ended: HashMap<String, EndState>,
    pub wrong_emits: Vec<String>,
    pub plan_errors: Vec<String>,
    pub steps: u64,
}

pub struct Engine {
    pub rt: Runtime,
    pub conn: Arc<Conn>,
    pub groups: Vec<CacheGroup>,
    pub reqs: HashMap<String, Req>,
    pub t: Tally,
    /// Ids to finish (engine side) at the next output.
    pub finish_next: Vec<String>,
    /// Computing from garbage still writes the right tags (only failed loads' poison shows).
    pub exact_kernels: bool,
    /// Count garbage reads (off while in mode vllm).
    pub judge: bool,
    /// How long to wait when a plan schedules nothing.
    pub wait: Duration,
    /// Leave samples out, repeat them, reorder them, answer a plan twice.
    pub sloppy: bool,
    pub rng: u64,
    pub budget: u64,
    pub max_seqs: usize,
    /// Lose the output of every step whose number is a multiple of this (0: none): the
    /// engine ran it, its writes garbage, and never answered it.
    pub lose_every: u64,
}

impl Engine {
    pub fn submit(&mut self, id: &str, prompt: Vec<u32>, max_new: u32) -> Result<(), RuntimeError> {
        self.rt.submit(SubmitRequest {
            id: id.into(),
            prompt: prompt.clone(),
            max_new_tokens: max_new,
            priority: 0,
            load_deadline: None,
        })?;
        self.reqs.insert(
            id.into(),
            Req {
                prompt,
                max_new,
                emitted: 0,
                engine_finished: false,
            },
        );
        Ok(())
    }

    /// One honest step: sync loads, reads checked, writes, update, emit.
    pub fn step(&mut self) -> Result<usize, RuntimeError> {
        let plan = self.rt.schedule()?;
        self.t.steps += 1;
        for (id, st) in &plan.ended {
            if let Some(r) = self.reqs.get(&**id) {
                if *st == EndState::Finished && !r.engine_finished && r.emitted != r.max_new {
                    self.t
                        .wrong_emits
                        .push(format!("{id}: emitted {} of {}", r.emitted, r.max_new));
                }
            }
            self.reqs.remove(&**id);
            self.t.ended.insert(id.to_string(), *st);
        }
        let mut out = StepOutput::for_plan(&plan);
        let mem = Arc::clone(&self.conn.mem);
        for s in &plan.scheduled {
            if let Some(job) = &s.sync_load {
                let mut r = catch_unwind(AssertUnwindSafe(|| self.conn.load(job)))
                    .unwrap_or_else(|_| LoadResult::all_failed(job));
                // A load not done by its deadline has failed, all its blocks.
                if job.deadline.is_some_and(|d| Instant::now() > d) {
                    r = LoadResult::all_failed(job);
                }
                if let LoadResult::Failed(bad) = r {
                    let bad = bad.into_flat();
                    let own: HashSet<BlockRef> = job.all_loaded_blocks().into_iter().collect();
                    if bad.iter().any(|b| own.contains(b)) {
                        out.invalid_blocks.extend(bad);
                    } else {
                        out.invalid_blocks.extend(own);
                    }
                }
            }
        }
        // A plan names each block at one generation; no block one request writes is read or
        // written by another in the same step.
        let tokens: u64 = plan.scheduled.iter().map(|s| s.num_tokens).sum();
        if tokens > self.budget || plan.scheduled.len() > self.max_seqs {
            self.t.plan_errors.push(format!(
                "step {}: {tokens} tokens, {} requests",
                plan.step,
                plan.scheduled.len()
            ));
        }
        if plan.scheduled.iter().any(|s| s.num_tokens == 0) {
            self.t.plan_errors.push(format!(
                "step {}: a request scheduled for 0 tokens",
                plan.step
            ));
        }
        let mut gens: HashMap<u64, u32> = HashMap::new();
        let mut writer: HashMap<u64, Arc<str>> = HashMap::new();
        for s in &plan.scheduled {
            for (g, grp) in self.groups.iter().enumerate() {
                let b = grp.block_size as usize;
                for blk in s.block_tables[g].iter().filter(|b| b.id != 0) {
                    if *gens.entry(blk.id).or_insert(blk.generation) != blk.generation {
                        self.t.plan_errors.push(format!(
                            "step {}: block {} at two generations",
                            plan.step, blk.id
                        ));
                    }
                }
                let n = s.num_computed_tokens as usize;
                let k = s.num_tokens as usize;
                if k == 0 {
                    continue;
                }
                for e in n / b..=(n + k - 1) / b {
                    if let Some(blk) = s.block_tables[g].get(e).filter(|b| b.id != 0) {
                        if let Some(w) = writer.insert(blk.id, s.id.clone()) {
                            if w != s.id {
                                self.t.plan_errors.push(format!(
                                    "step {}: block {} written by {w} and {}",
                                    plan.step, blk.id, s.id
                                ));
                            }
                        }
                    }
                }
            }
        }
        for s in &plan.scheduled {
            for (g, grp) in self.groups.iter().enumerate() {
                let b = grp.block_size as usize;
                let n = s.num_computed_tokens as usize;
                for e in 0..n.div_ceil(b) {
                    if let Some(blk) = s.block_tables[g].get(e).filter(|b| b.id != 0) {
                        if let Some(w) = writer.get(&blk.id).filter(|w| ***w != *s.id) {
                            if self.judge && self.rt.settings().mode == kvsched::Mode::Safe {
                                self.t.plan_errors.push(format!(
                                    "step {}: block {} written by {w}, read by {}",
                                    plan.step, blk.id, s.id
                                ));
                            }
                        }
                    }
                }
            }
        }
        let lost = self.lose_every > 0
            && self.t.steps % self.lose_every == 0
            && !plan.scheduled.is_empty();
        let mut bad_read = HashSet::new();
        let mut sent = HashSet::new();
        for s in &plan.scheduled {
            let Some(r) = self.reqs.get(&*s.id) else {
                continue;
            };
            let n = s.num_computed_tokens as usize;
            for (g, grp) in self.groups.iter().enumerate() {
                let b = grp.block_size as usize;
                let lo = match grp.kind {
                    kvsched::GroupKind::SlidingWindow { window } => {
                        (n + 1).saturating_sub(window as usize)
                    }
                    kvsched::GroupKind::Mamba { .. } => n.saturating_sub(1),
                    _ => 0,
                };
                for pos in lo..n {
                    let e = s.block_tables[g].get(pos / b).copied();
                    match e {
                        Some(blk) if blk.id != 0 => {
                            if mem.get(blk, pos % b) != tag(g, &r.prompt, &s.id, pos) {
                                bad_read.insert(s.id.clone());
                            }
                        }
                        _ if !self.judge => {}
                        _ => {
                            self.t.null_reads.push(format!("{} g{g} pos {pos}", s.id));
                            bad_read.insert(s.id.clone());
                        }
                    }
                }
            }
        }
        for s in &plan.scheduled {
            let Some(r) = self.reqs.get(&*s.id) else {
                continue;
            };
            let n = s.num_computed_tokens as usize;
            for (g, grp) in self.groups.iter().enumerate() {
                let b = grp.block_size as usize;
                let end = n + s.num_tokens as usize;
                for pos in n..end {
                    if let kvsched::GroupKind::Mamba { mode } = grp.kind {
                        let all_end = mode == kvsched::MambaMode::All && pos % b + 1 == b;
                        if pos + 1 != end && !all_end {
                            continue;
                        }
                    }
                    if let Some(blk) = s.block_tables[g].get(pos / b) {
                        if blk.id != 0 {
                            let v = if lost || (bad_read.contains(&s.id) && !self.exact_kernels) {
                                POISON
                            } else {
                                tag(g, &r.prompt, &s.id, pos)
                            };
                            mem.set(*blk, pos % b, v);
                        }
                    } else {
                        self.t
                            .null_reads
                            .push(format!("{} g{g} write {pos} past table", s.id));
                    }
                }
            }
            if s.samples && !lost {
                self.rng = self
                    .rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let roll = (self.rng >> 33) % 8;
                if self.sloppy && roll == 0 {
                    continue; // the engine lost this sample
                }
                out.sampled.push(s.id.clone());
                if self.sloppy && roll == 1 {
                    out.sampled.push(s.id.clone());
                }
                sent.insert(s.id.clone());
            }
        }
        if lost {
            // Nothing of the step is answered; the next `schedule` takes it as lost.
            return Ok(plan.scheduled.len());
        }
        if self.sloppy && self.rng % 3 == 0 {
            out.sampled.reverse();
            out.sampled.push("ghost".into());
        }
        for id in self.finish_next.drain(..) {
            if let Some(r) = self.reqs.get_mut(&id) {
                r.engine_finished = true;
            }
            out.finished.push(id.into());
        }
        let again = (self.sloppy && self.rng % 5 == 0).then(|| out.clone());
        let discard: HashSet<_> = self.rt.update(out).into_iter().collect();
        if let Some(again) = again {
            let d2 = self.rt.update(again);
            assert!(
                d2.iter().all(|d| discard.contains(d)),
                "a repeated output discarded more"
            );
        }
        for id in bad_read.iter().filter(|_| self.judge) {
            if discard.contains(id) {
                self.t.garbage_discarded += 1;
            } else {
                self.t
                    .garbage_kept
                    .push(format!("step {}: {id}", plan.step));
            }
        }
        for s in &plan.scheduled {
            if s.samples && sent.contains(&s.id) && !discard.contains(&s.id) {
                if let Some(r) = self.reqs.get_mut(&*s.id) {
                    r.emitted += 1;
                }
            }
        }
        if plan.scheduled.is_empty() && self.rt.live() > 0 {
            let t0 = Instant::now();
            self.rt.wait_for_work(self.wait);
            if t0.elapsed() > Duration::from_secs(5) {
                self.t.plan_errors.push(format!(
                    "step {}: asleep {:?} with work",
                    plan.step,
                    t0.elapsed()
                ));
            }
        }
        Ok(plan.scheduled.len())
    }

    pub fn run_to_end(&mut self, max_steps: u64) {
        let t0 = Instant::now();
        while self.rt.live() > 0 {
            assert!(
                self.t.steps < max_steps,
                "not done after {max_steps} steps: {:?}",
                self.rt.metrics()
            );
            assert!(t0.elapsed() < Duration::from_secs(30), "hang");
            self.step().expect("step");
        }
    }
}

pub fn engine(
    groups: Vec<CacheGroup>,
    pool: usize,
    shards: usize,
    offer_async: bool,
    settings: Settings,
    act: impl Fn(&LoadJob) -> Act + Send + Sync + 'static,
) -> Engine {
    engine_with(groups, pool, shards, offer_async, settings, act, 64, 256)
}

#[allow(clippy::too_many_arguments)]
pub fn engine_with(
    groups: Vec<CacheGroup>,
    pool: usize,
    shards: usize,
    offer_async: bool,
    settings: Settings,
    act: impl Fn(&LoadJob) -> Act + Send + Sync + 'static,
    budget: u64,
    max_seqs: usize,
) -> Engine {
    let bs = groups.iter().map(|g| g.block_size).max().unwrap() as usize;
    let conn = Arc::new(Conn {
        mem: Arc::new(Mem::new(pool, bs)),
        groups: groups.clone(),
        offer_async,
        act: Box::new(act),
        gate: AtomicBool::new(false),
        loads: AtomicU64::new(0),
        lookup_panic: AtomicBool::new(false),
    });
    let rt = Runtime::builder()
        .groups(groups.clone())
        .pool_blocks(pool)
        .shards(shards)
        .workers(2)
        .token_budget(budget)
        .max_seqs(max_seqs)
        .settings(settings)
        .shutdown_timeout(Duration::from_millis(500))
        // Several shards: every step on the shard threads; one: every step inline.
        .inline_steps_up_to(if shards > 1 { 0 } else { usize::MAX })
        .parallel_step_work(0)
        .connector(conn.clone())
        .build()
        .expect("build");
    Engine {
        rt,
        conn,
        groups,
        reqs: HashMap::new(),
        t: Tally::default(),
        finish_next: vec![],
        exact_kernels: false,
        judge: true,
        wait: Duration::MAX,
        sloppy: false,
        rng: 1,
        budget,
        max_seqs,
        lose_every: 0,
    }
}

pub fn shared_prompt(prefix: u32, i: u32, len: usize) -> Vec<u32> {
    let mut p: Vec<u32> = (0..len as u32 / 2).map(|t| prefix * 1000 + t).collect();
    p.extend((0..len as u32 - len as u32 / 2).map(|t| i * 7919 + t));
    p
}

pub fn finish_checks(e: Engine, n: usize) -> Tally {
    let Engine { rt, t, .. } = e;
    let report = rt.shutdown();
    assert!(
        t.garbage_kept.is_empty(),
        "garbage kept: {:?}",
        t.garbage_kept
    );
    assert!(t.null_reads.is_empty(), "null reads: {:?}", t.null_reads);
    assert!(t.wrong_emits.is_empty(), "wrong emits: {:?}", t.wrong_emits);
    assert!(t.plan_errors.is_empty(), "plan errors: {:?}", t.plan_errors);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(t.ended.len(), n, "every request ended");
    let m = &report.metrics;
    assert_eq!(m.submitted, m.finished + m.failed + m.cancelled, "{m:?}");
    assert!(report.census.conserved());
    assert_eq!(
        report.census.referenced, report.blocks_abandoned as usize,
        "{:?}",
        report.census
    );
    t
}

pub fn req(id: &str, prompt: Vec<u32>, max_new: u32) -> SubmitRequest {
    SubmitRequest {
        id: id.into(),
        prompt,
        max_new_tokens: max_new,
        priority: 0,
        load_deadline: None,
    }
}

pub fn fa() -> Vec<CacheGroup> {
    vec![CacheGroup::full_attention(4)]
}

pub fn with_deadline(ms: u64) -> Settings {
    Settings::default().with_load_deadline(Some(Duration::from_millis(ms)))
}

pub fn faulty(job: &LoadJob) -> Act {
    match (job.request.len() + job.attempt as usize * 3 + job.start_tokens as usize) % 6 {
        0 => Act::FailAll,
        1 => Act::FailHalf,
        2 => Act::FailForeign,
        3 => Act::Panic,
        _ => Act::Ok,
    }
}
