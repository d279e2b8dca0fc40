//! A hand-written engine over the public API: every token's KV (and every Mamba state) is a
//! deterministic function of (group, position, token prefix), so a read of any block the
//! plan names can be checked against what a correct model would have written there.

mod damaging;
pub mod hostile;

pub use damaging::Damaging;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{KvConnector, LoadResult};
use kvsched::kv::{
    HostKvMemory, KvLayout, KvMemory, MemoryTier, Tier, TierConnector, TierConnectorConfig,
};
use kvsched::rules::geometry::BlockId;
use kvsched::{
    CacheGroup, GroupKind, MambaMode, Report, Runtime, ScheduledRequest, StepOutput, StepPlan,
    SubmitRequest,
};

/// Bytes of KV per token and per Mamba state.
pub const TOK_BYTES: usize = 16;

pub fn mix(h: u64, x: u64) -> u64 {
    let mut z = h ^ x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One sequence: its prompt and the tokens a greedy model would generate after it (each a
/// function of the prefix), with the prefix hash after every token.
pub struct Seq {
    pub prompt: Vec<u32>,
    toks: Vec<u32>,
    hash: Vec<u64>,
}

impl Seq {
    pub fn new(prompt: Vec<u32>) -> Self {
        let mut s = Seq {
            toks: prompt.clone(),
            prompt,
            hash: Vec::new(),
        };
        s.extend(s.toks.len());
        s
    }
    fn extend(&mut self, n: usize) {
        while self.hash.len() < n {
            let p = self.hash.len();
            if p >= self.toks.len() {
                let prev = self.hash[p - 1];
                self.toks.push((prev % 50_000) as u32);
            }
            let prev = if p == 0 { 0x1234 } else { self.hash[p - 1] };
            self.hash.push(mix(prev, u64::from(self.toks[p])));
        }
    }
    /// KV of the token at `pos` in group `g`.
    pub fn kv(&mut self, g: usize, pos: usize) -> [u8; TOK_BYTES] {
        self.extend(pos + 1);
        let mut b = [0u8; TOK_BYTES];
        b[..8].copy_from_slice(&(self.hash[pos] ^ mix(g as u64, 77)).to_le_bytes());
        b[8..12].copy_from_slice(&(pos as u32).to_le_bytes());
        b[12..16].copy_from_slice(&(0xC0DE_0000u32 | g as u32).to_le_bytes());
        b
    }
    /// Mamba state of group `g` after `n >= 1` tokens.
    pub fn state(&mut self, g: usize, n: usize) -> [u8; TOK_BYTES] {
        self.extend(n);
        let mut b = [0u8; TOK_BYTES];
        b[..8].copy_from_slice(&(self.hash[n - 1] ^ mix(g as u64, 99)).to_le_bytes());
        b[8..12].copy_from_slice(&(n as u32).to_le_bytes());
        b[12..16].copy_from_slice(&(0x57A7_E000u32 | g as u32).to_le_bytes());
        b
    }
}

/// What the engine saw go wrong in one scheduled request's step.
#[derive(Debug, Default, Clone)]
pub struct StepCheck {
    pub bad_reads: Vec<String>,
    pub bad_writes: Vec<String>,
}

#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub steps: u64,
    pub reads_checked: u64,
    /// Wrong bytes read by a request whose output the runtime let the engine keep.
    pub garbage_kept: Vec<String>,
    /// Wrong bytes read by a request whose output `update` told the engine to drop.
    pub garbage_discarded: u64,
    /// Writes the plan asked for into a missing or null entry.
    pub bad_writes: Vec<String>,
    pub sync_loads_run: u64,
    pub sync_loads_failed: u64,
    pub kept_samples: HashMap<String, u64>,
    /// What a test collected from `Runtime::check_invariants` between steps.
    pub invariant_violations: Vec<String>,
    /// Blocks a plan named at two generations (handed out twice in one step), in any mode.
    pub named_twice: Vec<String>,
}

pub struct Engine {
    pub groups: Vec<CacheGroup>,
    pub mem: Arc<dyn KvMemory>,
    pub seqs: HashMap<String, Seq>,
    pub tally: Tally,
    pub tier_conn: Option<Arc<TierConnector>>,
    /// The connector the engine runs sync loads through.
    pub sync_conn: Option<Arc<dyn KvConnector>>,
}

pub fn layout(groups: &[CacheGroup]) -> KvLayout {
    KvLayout::for_groups(groups, TOK_BYTES, TOK_BYTES).unwrap()
}

impl Engine {
    pub fn new(groups: Vec<CacheGroup>, pool_blocks: usize) -> Self {
        let mem: Arc<dyn KvMemory> =
            Arc::new(HostKvMemory::new(layout(&groups), pool_blocks).unwrap());
        Engine {
            groups,
            mem,
            seqs: HashMap::new(),
            tally: Tally::default(),
            tier_conn: None,
            sync_conn: None,
        }
    }

    /// A `TierConnector` over `tier` on this engine's memory, used for sync loads and saves.
    pub fn with_tier(mut self, tier: Arc<dyn Tier>, async_ratio: f64) -> Self {
        let cfg = TierConnectorConfig::default()
            .with_groups(self.groups.clone())
            .with_async_ratio(async_ratio)
            .with_probe_on_miss(false);
        let c = Arc::new(TierConnector::new(tier, Arc::clone(&self.mem), cfg).unwrap());
        self.sync_conn = Some(c.clone());
        self.tier_conn = Some(c);
        self
    }

    pub fn memory_tier(self, async_ratio: f64) -> Self {
        self.with_tier(Arc::new(MemoryTier::new(64 << 20, 4)), async_ratio)
    }

    pub fn submit(&mut self, rt: &Runtime, id: &str, prompt: Vec<u32>, max_new: u32) {
        self.submit_req(
            rt,
            SubmitRequest {
                id: id.into(),
                prompt,
                max_new_tokens: max_new,
                priority: 0,
                load_deadline: None,
            },
        );
    }

    pub fn submit_req(&mut self, rt: &Runtime, r: SubmitRequest) {
        self.seqs.insert(r.id.clone(), Seq::new(r.prompt.clone()));
        rt.submit(r).unwrap();
    }

    fn entry(
        &self,
        s: &ScheduledRequest,
        g: usize,
        idx: usize,
        what: &str,
    ) -> Result<BlockId, String> {
        let t = &s.block_tables[g];
        match t.get(idx) {
            None => Err(format!(
                "{}: {what} g{g} entry {idx} past table end {}",
                s.id,
                t.len()
            )),
            Some(b) if b.id == 0 => Err(format!(
                "{}: {what} g{g} entry {idx} is the null block",
                s.id
            )),
            Some(b) => Ok(b.id),
        }
    }

    /// Reads `(g, block, off)` and records a mismatch with `want` in `out`, named `what`
    /// (which starts with the request's id).
    fn check_bytes(
        &mut self,
        (g, block, off): (usize, BlockId, usize),
        want: &[u8; TOK_BYTES],
        what: String,
        out: &mut StepCheck,
    ) {
        let mut got = [0u8; TOK_BYTES];
        self.tally.reads_checked += 1;
        if let Err(e) = self.mem.read(g, block, off, &mut got) {
            out.bad_reads.push(format!("{what}: read error {e}"));
        } else if &got != want {
            out.bad_reads
                .push(format!("{what} in block {block}: got {:02x?}", &got[..]));
        }
    }

    /// Phase (b): reads everything `s` may read and checks it.
    pub fn check_reads(&mut self, s: &ScheduledRequest) -> StepCheck {
        self.check_reads_at(s, s.num_computed_tokens as usize)
    }

    /// What the step's last token attends to, read back after the step's writes: a paged
    /// attention kernel writes the chunk's KV into the cache and reads every token of the
    /// chunk's window (full attention all of `[0, n + k)`) from there.
    pub fn check_in_step_reads(&mut self, s: &ScheduledRequest) -> StepCheck {
        let mut c = self.check_reads_at(s, (s.num_computed_tokens + s.num_tokens) as usize);
        // For a window, every token of the chunk reads its own window: back to n - w + 1.
        let n = s.num_computed_tokens as usize;
        let id = s.id.to_string();
        let mut seq = self.seqs.remove(&id).unwrap();
        for (g, grp) in self.groups.clone().iter().enumerate() {
            if let GroupKind::SlidingWindow { window } = grp.kind {
                let b = grp.block_size as usize;
                let hi = (n + s.num_tokens as usize + 1).saturating_sub(window as usize);
                for pos in (n + 1).saturating_sub(window as usize)..hi.max(n) {
                    match self.entry(s, g, pos / b, "in-step read") {
                        Err(e) => c.bad_reads.push(format!("{e} (token {pos})")),
                        Ok(blk) => {
                            let want = seq.kv(g, pos);
                            self.check_bytes(
                                (g, blk, (pos % b) * TOK_BYTES),
                                &want,
                                format!("{}: g{g} in-step token {pos}", s.id),
                                &mut c,
                            );
                        }
                    }
                }
            }
        }
        self.seqs.insert(id, seq);
        c
    }

    fn check_reads_at(&mut self, s: &ScheduledRequest, n: usize) -> StepCheck {
        let mut out = StepCheck::default();
        let id = s.id.to_string();
        let mut seq = self
            .seqs
            .remove(&id)
            .expect("plan names a request the engine never submitted");
        for (g, grp) in self.groups.clone().iter().enumerate() {
            let b = grp.block_size as usize;
            match grp.kind {
                GroupKind::FullAttention | GroupKind::SlidingWindow { .. } => {
                    let lo = match grp.kind {
                        GroupKind::SlidingWindow { window } => {
                            (n + 1).saturating_sub(window as usize)
                        }
                        _ => 0,
                    };
                    for pos in lo..n {
                        match self.entry(s, g, pos / b, "read") {
                            Err(e) => out.bad_reads.push(format!("{e} (token {pos})")),
                            Ok(blk) => {
                                let want = seq.kv(g, pos);
                                self.check_bytes(
                                    (g, blk, (pos % b) * TOK_BYTES),
                                    &want,
                                    format!("{}: g{g} token {pos}", s.id),
                                    &mut out,
                                );
                            }
                        }
                    }
                }
                GroupKind::Mamba { .. } => {
                    if n > 0 {
                        match self.entry(s, g, (n - 1) / b, "state read") {
                            Err(e) => out.bad_reads.push(format!("{e} (state at {n})")),
                            Ok(blk) => {
                                let want = seq.state(g, n);
                                self.check_bytes(
                                    (g, blk, 0),
                                    &want,
                                    format!("{}: g{g} state at {n}", s.id),
                                    &mut out,
                                );
                            }
                        }
                    }
                }
            }
        }
        self.seqs.insert(id, seq);
        out
    }

    /// Phase (c): writes what computing `[n, n + k)` writes.
    pub fn write_step(&mut self, s: &ScheduledRequest) -> Vec<String> {
        let mut bad = Vec::new();
        let n = s.num_computed_tokens as usize;
        let k = s.num_tokens as usize;
        let id = s.id.to_string();
        let mut seq = self.seqs.remove(&id).unwrap();
        for (g, grp) in self.groups.clone().iter().enumerate() {
            let b = grp.block_size as usize;
            match grp.kind {
                GroupKind::FullAttention | GroupKind::SlidingWindow { .. } => {
                    for pos in n..n + k {
                        match self.entry(s, g, pos / b, "write") {
                            Err(e) => bad.push(e),
                            Ok(blk) => self
                                .mem
                                .write(g, blk, (pos % b) * TOK_BYTES, &seq.kv(g, pos))
                                .unwrap(),
                        }
                    }
                }
                GroupKind::Mamba { mode } => {
                    let mut ends: Vec<usize> = Vec::new();
                    if mode == MambaMode::All {
                        ends.extend((n + 1..n + k).filter(|m| m % b == 0));
                    }
                    if k > 0 {
                        ends.push(n + k);
                    }
                    for m in ends {
                        match self.entry(s, g, (m - 1) / b, "state write") {
                            Err(e) => bad.push(e),
                            Ok(blk) => self.mem.write(g, blk, 0, &seq.state(g, m)).unwrap(),
                        }
                    }
                }
            }
        }
        self.seqs.insert(id, seq);
        bad
    }

    /// Runs a plan: sync loads, reads (checked), writes. Returns the output to hand
    /// `update` and each request's check.
    pub fn run_plan(&mut self, plan: &StepPlan) -> (StepOutput, HashMap<String, StepCheck>) {
        let mut out = StepOutput::for_plan(plan);
        let mut checks = HashMap::new();
        let mut generations: HashMap<u64, (u32, &str)> = HashMap::new();
        for s in &plan.scheduled {
            for b in s.block_tables.iter().flat_map(|t| t.iter()) {
                if b.id == 0 {
                    continue;
                }
                let (id, generation) = (b.id, b.generation);
                match generations.get(&id) {
                    Some(&(g, who)) if g != generation => self.tally.named_twice.push(format!(
                        "step {}: block {id} at generation {g} ({who}) and {generation} ({})",
                        plan.step, s.id
                    )),
                    Some(_) => {}
                    None => {
                        generations.insert(id, (generation, &s.id));
                    }
                }
            }
        }
        for s in &plan.scheduled {
            if let Some(job) = &s.sync_load {
                self.tally.sync_loads_run += 1;
                let conn = self
                    .sync_conn
                    .clone()
                    .expect("a sync load without a connector");
                // A connector panic in a sync load is the engine's to catch: all failed.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| conn.load(job)))
                    .unwrap_or_else(|_| LoadResult::all_failed(job));
                if let LoadResult::Failed(bad) = r {
                    self.tally.sync_loads_failed += 1;
                    out.invalid_blocks.extend(bad.into_flat());
                }
            }
        }
        for s in &plan.scheduled {
            let c = self.check_reads(s);
            checks.insert(s.id.to_string(), c);
        }
        for s in &plan.scheduled {
            let bw = self.write_step(s);
            let after = self.check_in_step_reads(s);
            let c = checks.get_mut(&*s.id).unwrap();
            c.bad_writes = bw;
            c.bad_reads.extend(after.bad_reads);
            if s.samples {
                out.sampled.push(s.id.clone());
            }
        }
        (out, checks)
    }

    /// Answers a plan: `update`, then tallies garbage against what `update` says to drop,
    /// and offers kept steps for saving.
    pub fn answer(
        &mut self,
        rt: &mut Runtime,
        plan: &StepPlan,
        out: StepOutput,
        checks: HashMap<String, StepCheck>,
    ) {
        let discard: HashSet<String> = rt.update(out).iter().map(|s| s.to_string()).collect();
        self.tally.steps += 1;
        for s in &plan.scheduled {
            let c = &checks[&*s.id];
            self.tally.bad_writes.extend(c.bad_writes.iter().cloned());
            if discard.contains(&*s.id) {
                self.tally.garbage_discarded += c.bad_reads.len() as u64;
                continue;
            }
            self.tally.garbage_kept.extend(
                c.bad_reads
                    .iter()
                    .map(|e| format!("step {}: {e}", plan.step)),
            );
            if s.samples {
                *self.tally.kept_samples.entry(s.id.to_string()).or_default() += 1;
            }
            if let Some(tc) = &self.tier_conn {
                let p = self.seqs[&*s.id].prompt.clone();
                tc.save_step(&p, s);
            }
        }
    }

    /// One whole step the honest way.
    pub fn step(&mut self, rt: &mut Runtime) -> StepPlan {
        let plan = rt.schedule().expect("schedule");
        let (out, checks) = self.run_plan(&plan);
        self.answer(rt, &plan, out, checks);
        plan
    }

    /// Steps until nothing is live or `limit` passes; waits for work when a plan is empty.
    /// Returns whether everything ended.
    pub fn run_until_idle(&mut self, rt: &mut Runtime, limit: Duration) -> bool {
        let start = Instant::now();
        while rt.live() > 0 {
            if start.elapsed() > limit {
                return false;
            }
            let plan = self.step(rt);
            if plan.scheduled.is_empty() && rt.live() > 0 {
                rt.wait_for_work(Duration::from_millis(5));
            }
        }
        true
    }

    pub fn flush(&self) {
        if let Some(tc) = &self.tier_conn {
            assert!(tc.flush_for(Duration::from_secs(5)), "saves did not flush");
        }
    }

    pub fn assert_clean(&self) {
        assert!(
            self.tally.named_twice.is_empty(),
            "a plan handed a block out twice: {:#?}",
            &self.tally.named_twice[..self.tally.named_twice.len().min(10)]
        );
        assert!(
            self.tally.garbage_kept.is_empty(),
            "garbage read with output kept: {:#?}",
            &self.tally.garbage_kept[..self.tally.garbage_kept.len().min(10)]
        );
        assert!(
            self.tally.bad_writes.is_empty(),
            "plan asked for writes into no block: {:#?}",
            &self.tally.bad_writes[..self.tally.bad_writes.len().min(10)]
        );
    }
}

/// The report's accounting, violations and census after every request ended.
pub fn assert_report_clean(r: &Report, pool_blocks: usize) {
    let m = &r.metrics;
    assert_eq!(
        m.submitted,
        m.finished + m.failed + m.cancelled,
        "lost a request: {r}"
    );
    assert!(r.violations.is_empty(), "violations: {:?}", r.violations);
    let c = &r.census;
    assert_eq!(c.total, pool_blocks);
    assert_eq!(
        c.null + c.free + c.cached_unreferenced + c.referenced,
        c.total,
        "census: {c:?}"
    );
    assert_eq!(
        c.referenced as u64, r.blocks_abandoned,
        "blocks still held after shutdown: {c:?}, report {r}"
    );
}

/// A prompt of `len` tokens: the first `shared` from family `fam`, the rest unique to `uniq`.
pub fn prompt(fam: u32, shared: usize, uniq: u32, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| {
            if i < shared {
                (fam * 7919 + i as u32 * 31) % 40_000 + 1
            } else {
                (uniq * 104_729 + i as u32 * 17) % 40_000 + 1
            }
        })
        .collect()
}

pub fn builder(groups: &[CacheGroup], pool: usize) -> kvsched::Builder {
    Runtime::builder()
        .groups(groups.to_vec())
        .pool_blocks(pool)
        .shutdown_timeout(Duration::from_secs(2))
}

/// Wakes an engine asleep in `wait_for_work` after `limit` (by cancelling an id nobody
/// uses, which counts as work), so a wait that never returns ends the test instead of
/// hanging it; `fired` says whether it had to.
pub struct Watchdog {
    done: Arc<std::sync::atomic::AtomicBool>,
    fired: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub fn start(h: kvsched::Handle, limit: Duration) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let done = Arc::new(AtomicBool::new(false));
        let fired = Arc::new(AtomicBool::new(false));
        let (d2, f2) = (done.clone(), fired.clone());
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            while !d2.load(Ordering::SeqCst) {
                if start.elapsed() > limit {
                    f2.store(true, Ordering::SeqCst);
                    h.cancel("watchdog-wake-up");
                    std::thread::sleep(Duration::from_millis(50));
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        Watchdog {
            done,
            fired,
            thread: Some(thread),
        }
    }
    pub fn fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
