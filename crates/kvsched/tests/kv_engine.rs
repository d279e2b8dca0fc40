//! The plan's block tables drive a toy model end to end on real bytes: a runtime, a
//! `TierConnector` over a memory tier with chunks damaged at rest, host KV memory, and the
//! verifying `KvChecker`. Mode `safe` reads no garbage on a shared-prefix hybrid workload.
//! The checker's positive control is the runtime plant `mamba-align-cache-unwritten`
//! (scripts/plants.sh): caching Mamba entries that hold no state makes this test read garbage.

use std::sync::Arc;
use std::time::Duration;

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery};

use kvsched::kv::{
    DiskConfig, DiskTier, HostKvMemory, KvLayout, KvMemory, MemoryTier, Tier, TierConnector,
    TierConnectorConfig, TierCounts,
};
use kvsched::{BlockRef, CacheGroup, MambaMode, Mode, Runtime, StepOutput, SubmitRequest};
use kvsched_testkit::SplitMix64;
use kvsched_testkit::{FaultConfig, FaultyTier};
use kvsched_testkit::{KvCheckCounts, KvChecker};

const BLOCKS: usize = 2048;
const BPT: usize = 8;
const STATE: usize = 32;

struct Run {
    check: KvCheckCounts,
    tier: TierCounts,
    steps: u64,
}

fn run(groups: Vec<CacheGroup>, mode: Mode, async_ratio: f64, corrupt: f64, seed: u64) -> Run {
    let faults = FaultConfig {
        seed,
        corrupt,
        ..FaultConfig::default()
    };
    let tier = Arc::new(FaultyTier::new(MemoryTier::new(64 << 20, 4), faults).expect("faults"));
    run_on(groups, mode, async_ratio, seed, tier, true)
}

/// One run on `tier`; `warm`: the three prefixes are stored in it first.
fn run_on(
    groups: Vec<CacheGroup>,
    mode: Mode,
    async_ratio: f64,
    seed: u64,
    tier: Arc<dyn Tier>,
    warm: bool,
) -> Run {
    let layout = KvLayout::for_groups(&groups, BPT, STATE).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, BLOCKS).expect("memory"));
    let conn = Arc::new(
        TierConnector::new(
            Arc::clone(&tier),
            Arc::clone(&memory),
            TierConnectorConfig::default()
                .with_groups(groups.clone())
                .with_scheduler_block_size(Some(16))
                .with_tag(7)
                .with_async_ratio(async_ratio)
                .with_seed(seed),
        )
        .expect("connector"),
    );
    let dyn_conn: Arc<dyn KvConnector> = conn.clone();
    let mut rt = Runtime::builder()
        .groups(groups.clone())
        .scheduler_block_size(16)
        .pool_blocks(BLOCKS)
        .shards(2)
        .workers(2)
        .mode(mode)
        .connector(dyn_conn)
        .build()
        .expect("runtime");
    let mut checker = KvChecker::new(groups.clone(), 7, BPT, STATE, Arc::clone(&memory));
    // Three shared 96-token prefixes, already in the tier (a warm store).
    let prefixes: Vec<Vec<u32>> = (0..3u32)
        .map(|p| (0..96).map(|t| p * 1000 + t + 1).collect())
        .collect();
    for p in prefixes.iter().filter(|_| warm) {
        for (g, grp) in groups.iter().enumerate() {
            for i in 0..(96 / grp.block_size) as usize {
                let bytes = checker.reference_block(p, g, i).expect("full block");
                conn.store_now(p, g, i, &bytes).expect("store");
            }
        }
    }
    let mut rng = SplitMix64::new(seed);
    let mut next = 0u32;
    let mut steps = 0;
    // Three arrivals per step, so later requests meet the prefix cache earlier ones filled.
    while (next < 48 || rt.live() > 0) && steps < 3000 {
        for _ in 0..3 {
            if next == 48 {
                break;
            }
            let mut prompt = prefixes[rng.below(3) as usize].clone();
            prompt.extend((0..1 + rng.below(30) as u32).map(|t| 50_000 + next * 100 + t));
            let id = format!("r{next}");
            next += 1;
            checker.add_request(&id, &prompt);
            rt.submit(SubmitRequest {
                id,
                prompt,
                max_new_tokens: 4,
                priority: 0,
                load_deadline: None,
            })
            .expect("submit");
        }
        let plan = rt.schedule().expect("step");
        steps += 1;
        for (id, _) in &plan.ended {
            checker.end_request(id);
        }
        let check = checker.run_step(&plan, Some(conn.as_ref()));
        let mut out = StepOutput::all_sampled(&plan);
        out.invalid_blocks = check.invalid_blocks.clone();
        let discard = rt.update(out);
        checker.settle(&plan, check, &discard);
        for s in plan.scheduled.iter().filter(|s| !discard.contains(&s.id)) {
            if let Some(prompt) = checker.prompt(&s.id) {
                let prompt = prompt.to_vec();
                conn.save_blocks(&prompt, &checker.completed_prompt_blocks(s));
            }
        }
        rt.wait_for_work(Duration::from_millis(1));
    }
    assert_eq!(rt.live(), 0, "requests left after {steps} steps");
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(
        checker.counts().misplaced_samples,
        0,
        "{:?}",
        checker.counts()
    );
    conn.flush();
    Run {
        check: checker.counts().clone(),
        tier: conn.counts(),
        steps,
    }
}

fn hybrid() -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(16),
        CacheGroup::sliding_window(16, 32),
        CacheGroup::mamba(16, MambaMode::Align),
    ]
}

fn attention_only() -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(16),
        CacheGroup::sliding_window(16, 32),
    ]
}

#[test]
fn safe_mode_reads_no_garbage_and_moves_real_bytes() {
    for seed in 1..=3 {
        for async_ratio in [0.0, 0.5, 1.0] {
            // A fifth of the chunks damaged: a load reads one Mamba `align` state, not every
            // one below it, so at a tenth some seeds' loads met no damaged chunk.
            let r = run(hybrid(), Mode::Safe, async_ratio, 0.2, seed);
            assert_eq!(
                r.check.garbage_reads, 0,
                "seed {seed} async {async_ratio}: {:?}",
                r.check
            );
            assert!(r.tier.kv_bytes_loaded > 0, "{:?}", r.tier);
            assert!(r.tier.checksum_failures > 0, "{:?}", r.tier);
            assert!(r.check.kv_bytes_verified > 0);
            assert!(
                r.tier.chunks_saved > 0,
                "computed blocks are saved: {:?}",
                r.tier
            );
            assert!(r.steps > 0);
        }
    }
}

#[test]
fn a_clean_tier_gives_full_hits_and_no_failures() {
    let r = run(attention_only(), Mode::Safe, 0.5, 0.0, 9);
    assert_eq!(r.check.garbage_reads + r.check.garbage_reads_discarded, 0);
    assert_eq!(
        r.tier.checksum_failures + r.tier.missing_chunks,
        0,
        "{:?}",
        r.tier
    );
    assert!(r.tier.chunks_loaded > 0);
}

#[test]
fn chunks_gone_between_lookup_and_load_are_failed_blocks_recovered_like_any_other() {
    let faults = FaultConfig {
        seed: 5,
        evict: 0.2,
        ..FaultConfig::default()
    };
    let tier = Arc::new(FaultyTier::new(MemoryTier::new(64 << 20, 4), faults).expect("faults"));
    let r = run_on(hybrid(), Mode::Safe, 0.5, 5, tier.clone(), true);
    assert_eq!(r.check.garbage_reads, 0, "{:?}", r.check);
    assert!(r.tier.missing_chunks > 0, "{:?}", r.tier);
    assert!(tier.counts().evicted > 0);
}

#[test]
fn a_fresh_connector_on_the_same_disk_directory_loads_what_the_last_one_saved() {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = || -> Arc<dyn Tier> {
        Arc::new(DiskTier::open(dir.path(), DiskConfig::default()).expect("disk tier"))
    };
    // Mamba in mode `all`: a step writes the state at every block end it passes, so every
    // prompt block has a chunk to save (in mode `align` only a step's last state is real).
    let groups = vec![
        CacheGroup::full_attention(16),
        CacheGroup::sliding_window(16, 32),
        CacheGroup::mamba(16, MambaMode::All),
    ];
    // The first run starts cold and saves what it computes.
    let first = run_on(groups.clone(), Mode::Safe, 0.5, 3, open(), false);
    assert_eq!(first.check.garbage_reads, 0);
    assert!(first.tier.chunks_saved > 0, "{:?}", first.tier);
    // A new tier and connector on the directory (what a fresh process opens): the first
    // lookup misses and asks the tier in the background; once the probe is back, the prefix
    // is offered and loads, verified, into KV memory.
    let layout = KvLayout::for_groups(&groups, BPT, STATE).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 64).expect("memory"));
    let conn = TierConnector::new(
        open(),
        Arc::clone(&memory),
        TierConnectorConfig::default()
            .with_groups(groups.clone())
            .with_scheduler_block_size(Some(16))
            .with_tag(7),
    )
    .expect("connector");
    let checker = KvChecker::new(groups.clone(), 7, BPT, STATE, Arc::clone(&memory));
    let mut prompt: Vec<u32> = (0..96).map(|t| t + 1).collect(); // prefix 0 of `run_on`
    prompt.push(99_999);
    let query = LookupQuery {
        request: "fresh",
        prompt: &prompt,
        local_tokens: 0,
        prepared: None,
    };
    assert_eq!(conn.lookup(query).external_tokens, 0, "nothing known yet");
    conn.flush();
    let offered = conn.lookup(query).external_tokens;
    assert_eq!(offered, 96, "{:?}", conn.counts());
    let tables: Vec<Vec<BlockRef>> = (0..3u64)
        .map(|g| {
            (0..7)
                .map(|i| BlockRef {
                    id: 1 + g * 7 + i,
                    generation: 1,
                })
                .collect()
        })
        .collect();
    let sizes = groups.iter().map(|g| g.block_size).collect();
    let job = LoadJob::new("fresh", &prompt, 0, offered, tables.clone(), sizes);
    assert_eq!(conn.load(&job), LoadResult::Ok, "{:?}", conn.counts());
    for (g, t) in tables.iter().enumerate() {
        for (i, b) in t.iter().enumerate().take(6) {
            let want = checker.reference_block(&prompt, g, i).expect("reference");
            let mut got = vec![0; want.len()];
            memory.read(g, b.id, 0, &mut got).expect("read");
            assert_eq!(got, want, "group {g} block {i}");
        }
    }
    assert!(conn.counts().probe_hits > 0);
}
