//! Everything hostile at once, seeded: a store damaging chunks, a connector that panics,
//! sleeps past deadlines and reports nonsense, an engine that drops outputs, answers
//! twice, cancels and finishes at random, on a small pool of a hybrid geometry with shards
//! forced parallel. Mode `safe`: no kept output may have read a wrong byte.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use kvsched::connector::{
    InvalidBlocks, KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult, Prepared,
};
use kvsched::kv::{MemoryTier, TierConnector, TierConnectorConfig};
use kvsched::{BlockRef, CacheGroup, MambaMode, Mode, Policy, Settings, StepOutput, SubmitRequest};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0, 3)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A memory tier whose gets flip a byte in a share of the chunks.
/// Panics now and then, sleeps past the deadline now and then, and adds nonsense to its
/// failures (another group layout, out-of-range ids).
struct Chaotic {
    inner: Arc<TierConnector>,
    n: AtomicU64,
}

impl KvConnector for Chaotic {
    fn prepare(&self, r: &str, p: &[u32]) -> Option<Prepared> {
        self.inner.prepare(r, p)
    }
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        if self.n.fetch_add(1, Ordering::Relaxed) % 17 == 5 {
            panic!("chaotic lookup");
        }
        self.inner.lookup(q)
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        let k = self.n.fetch_add(1, Ordering::Relaxed);
        match k % 11 {
            3 => panic!("chaotic load"),
            7 => std::thread::sleep(Duration::from_millis(30)),
            _ => {}
        }
        match self.inner.load(job) {
            LoadResult::Ok => LoadResult::Ok,
            LoadResult::Failed(b) => {
                let mut groups: Vec<Vec<BlockRef>> = vec![Vec::new(); job.block_tables.len() + 2];
                groups[0].extend(b.into_flat());
                groups[job.block_tables.len() + 1].push(BlockRef {
                    id: 1 << 29,
                    generation: 3,
                });
                LoadResult::Failed(InvalidBlocks::ByGroup(groups))
            }
        }
    }
}

fn chaos(seed: u64, groups: Vec<CacheGroup>, pool: usize, shards: usize) {
    chaos_with(seed, groups, pool, shards, false)
}

/// `switch`: flip mode (vllm / safe) and policy (recompute / fail) live every few steps; mode
/// vllm keeps what its sharers read, so only the runtime's invariants (which exempt requests
/// mode vllm rolled back), accounting and liveness are asserted.
fn chaos_with(seed: u64, groups: Vec<CacheGroup>, pool: usize, shards: usize, switch: bool) {
    let mut rng = Rng(seed);
    let tier = Arc::new(Damaging::every(MemoryTier::new(64 << 20, 4), 9));
    let mut eng = Engine::new(groups.clone(), pool);
    let cfg = TierConnectorConfig::default()
        .with_groups(groups.clone())
        .with_async_ratio(0.5)
        .with_probe_on_miss(false)
        .with_seed(seed);
    let tc = Arc::new(TierConnector::new(tier, Arc::clone(&eng.mem), cfg).unwrap());
    let conn = Arc::new(Chaotic {
        inner: tc.clone(),
        n: AtomicU64::new(seed),
    });
    eng.tier_conn = Some(tc.clone());
    eng.sync_conn = Some(tc.clone());
    let s = Settings::default()
        .with_mode(Mode::Safe)
        .with_policy(Policy::Recompute)
        .with_load_deadline(Some(Duration::from_millis(15)));
    let mut rt = builder(&groups, pool)
        .shards(shards)
        .workers(2)
        .token_budget(96)
        .inline_steps_up_to(0)
        .parallel_step_work(0)
        .settings(s.clone())
        .connector(conn)
        .build()
        .unwrap();
    let handle = rt.handle();
    let total = 150u32;
    let mut submitted = 0u32;
    let mut n = 0u64;
    let start = Instant::now();
    while (submitted < total || rt.live() > 0) && start.elapsed() < Duration::from_secs(25) {
        n += 1;
        while submitted < total && rng.below(3) == 0 {
            let len = 30 + rng.below(90) as usize;
            let pr = [i16::MIN, -1, 0, 0, 5, i16::MAX][rng.below(6) as usize];
            let id = format!("c{submitted}");
            eng.seqs.insert(
                id.clone(),
                Seq::new(prompt(rng.below(8) as u32, 72, submitted, len)),
            );
            let p = eng.seqs[&id].prompt.clone();
            handle
                .submit(SubmitRequest {
                    id,
                    prompt: p,
                    max_new_tokens: 1 + rng.below(12) as u32,
                    priority: pr,
                    load_deadline: None,
                })
                .unwrap();
            submitted += 1;
        }
        if switch && rng.below(4) == 0 {
            let m = if rng.below(2) == 0 {
                Mode::Vllm
            } else {
                Mode::Safe
            };
            let p = if rng.below(5) == 0 {
                Policy::Fail
            } else {
                Policy::Recompute
            };
            rt.update_settings(s.clone().with_mode(m).with_policy(p))
                .unwrap();
        }
        let plan = rt.schedule().unwrap();
        if !plan.scheduled.is_empty() && rng.below(13) == 0 {
            if rng.below(2) == 0 {
                let _ = eng.run_plan(&plan);
            }
            continue;
        }
        let (mut out, checks) = eng.run_plan(&plan);
        if rng.below(7) == 0 {
            let victim = format!("c{}", rng.below(u64::from(submitted.max(1))));
            if rng.below(2) == 0 {
                handle.cancel(&victim);
            } else {
                out.finished.push(victim.into());
            }
        }
        let dup = (rng.below(9) == 0).then(|| out.clone());
        eng.answer(&mut rt, &plan, out, checks);
        if let Some(d) = dup {
            let _ = rt.update(d);
        }
        if rng.below(11) == 0 {
            let _ = rt.update(StepOutput {
                step: plan.step.wrapping_sub(1),
                sampled: plan.scheduled.iter().map(|s| s.id.clone()).collect(),
                ..Default::default()
            });
        }
        // The runtime's own between-step invariants (a test hook of docs/runtime.md).
        let v = rt.check_invariants();
        assert!(v.is_empty(), "seed {seed} after step {}: {v:?}", plan.step);
        if plan.scheduled.is_empty() && rt.live() > 0 {
            rt.wait_for_work(Duration::from_millis(5));
        }
    }
    let live = rt.live();
    let m = rt.metrics();
    let r = rt.shutdown();
    assert_eq!(
        live, 0,
        "seed {seed}: requests never ended after {n} steps: {m:?}"
    );
    assert_eq!(r.metrics.submitted, u64::from(total));
    if switch {
        // Mode vllm rolls back to `S` multiples a window cannot resume from (documented),
        // and keeps what its sharers read: its steps' bytes are not this test's to judge.
        eng.tally.garbage_kept.clear();
        eng.tally.bad_writes.clear();
    }
    if std::env::var("COLD_VERBOSE").is_ok() {
        eprintln!("seed {seed}: {n} steps, {:?}\n{:?}", r.metrics, tc.counts());
    }
    eng.assert_clean();
    assert_report_clean(&r, pool);
}

#[test]
fn chaos_live_mode_and_policy_switches() {
    for seed in 31..=36 {
        let g = vec![
            CacheGroup::full_attention(12),
            CacheGroup::sliding_window(8, 20),
            CacheGroup::mamba(24, MambaMode::Align),
        ];
        chaos_with(seed, g, 64, 2, true);
    }
}

#[test]
fn chaos_dense() {
    for seed in 1..=8 {
        chaos(seed, vec![CacheGroup::full_attention(16)], 24, 2);
    }
}

#[test]
fn chaos_hybrid_align() {
    for seed in 11..=18 {
        chaos(
            seed,
            vec![
                CacheGroup::full_attention(12),
                CacheGroup::sliding_window(8, 20),
                CacheGroup::mamba(24, MambaMode::Align),
            ],
            48,
            3,
        );
    }
}

#[test]
fn chaos_hybrid_all() {
    for seed in 21..=28 {
        chaos(
            seed,
            vec![
                CacheGroup::full_attention(12),
                CacheGroup::sliding_window(8, 20),
                CacheGroup::mamba(24, MambaMode::All),
            ],
            56,
            2,
        );
    }
}
