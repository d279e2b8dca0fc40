//! Two connectors on one tier, as two engines share a store: what one saved, the other's
//! lookup offers once its probe (a lookup's miss, or a prefetch when the request arrives) has
//! been answered, and its load counts the chunks as another writer's. A prefix asked about is
//! not asked again within `probe_miss_ttl`; after it, it is, and finds what was saved since.
//! A lookup's probe is asked whether the prober thread lingers after its last probe or
//! sleeps. (Plant `probe-hits-unindexed` drops what the probes find: no offer, no cross hit;
//! plant `probe-offer-never-wakes` leaves a sleeping prober asleep.) Engines of different
//! layouts, each with the default tag, never load each other's chunks, even where one
//! group's blocks would fit (plant `layout-not-in-key`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery};
use kvsched::kv::{
    HostKvMemory, KvLayout, KvMemory, MemoryTier, Prefetch, Tier, TierConnector,
    TierConnectorConfig,
};
use kvsched::{BlockRef, CacheGroup, MambaMode};

const BYTES_PER_TOKEN: usize = 8;

fn engine(tier: &Arc<MemoryTier>, ttl: Duration) -> TierConnector {
    let groups = TierConnectorConfig::default().groups;
    let layout = KvLayout::for_groups(&groups, BYTES_PER_TOKEN, 16).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 16).expect("memory"));
    let tier: Arc<dyn Tier> = tier.clone();
    TierConnector::new(
        tier,
        memory,
        TierConnectorConfig::default().with_probe_miss_ttl(ttl),
    )
    .expect("connector")
}

fn offer(c: &TierConnector, prompt: &[u32]) -> u64 {
    c.lookup(LookupQuery {
        request: "r",
        prompt,
        local_tokens: 0,
        prepared: None,
    })
    .external_tokens
}

/// Stores the first `blocks` blocks of `prompt` through `c`, as its engine's saves would.
fn save(c: &TierConnector, prompt: &[u32], blocks: usize) {
    for i in 0..blocks {
        let payload = vec![i as u8; 16 * BYTES_PER_TOKEN];
        assert!(c.store_now(prompt, 0, i, &payload).expect("store"));
    }
}

fn wait_ready(p: &Prefetch) {
    let until = Instant::now() + Duration::from_secs(10);
    while !p.is_ready() {
        assert!(Instant::now() < until, "the probe was never answered");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn one_engines_saves_are_offered_to_another_once_probed() {
    let tier = Arc::new(MemoryTier::new(1 << 20, 1));
    // No TTL: every miss is asked about (the TTL's own test is below).
    let (a, b) = (engine(&tier, Duration::ZERO), engine(&tier, Duration::ZERO));
    let prompt: Vec<u32> = (0..161).collect();
    save(&a, &prompt, 8);
    assert_eq!(offer(&a, &prompt), 128, "the saver's own index knows");
    // B's index does not: its lookup misses and asks in the background; the next lookup of
    // the prefix offers what A saved.
    assert_eq!(offer(&b, &prompt), 0);
    b.flush();
    assert_eq!(offer(&b, &prompt), 128);
    assert_eq!(b.counts().probe_hits, 8, "{:?}", b.counts());

    // A request arriving at B with a longer prompt over the same prefix: prefetched, then
    // looked up once the probe is answered.
    let longer: Vec<u32> = (0..321).collect();
    save(&a, &longer, 16);
    let p = b.prefetch(&longer);
    wait_ready(&p);
    assert_eq!(offer(&b, &longer), 256);
}

#[test]
fn a_prefix_found_absent_is_asked_again_only_after_the_ttl() {
    let tier = Arc::new(MemoryTier::new(1 << 20, 1));
    let ttl = Duration::from_millis(300);
    let (a, b) = (engine(&tier, ttl), engine(&tier, ttl));
    let prompt: Vec<u32> = (1000..1161).collect();
    let p = b.prefetch(&prompt);
    wait_ready(&p);
    assert_eq!(offer(&b, &prompt), 0, "nothing saved yet");
    b.flush();
    let asked = b.counts().probes;
    // A saves it now; B's lookups within the TTL do not ask again, so they miss.
    save(&a, &prompt, 8);
    let started = Instant::now();
    assert_eq!(offer(&b, &prompt), 0);
    assert!(
        b.prefetch(&prompt).is_ready(),
        "skipped: nothing to wait for"
    );
    b.flush();
    if started.elapsed() < ttl {
        assert_eq!(b.counts().probes, asked, "{:?}", b.counts());
        assert!(b.counts().probes_skipped >= 2, "{:?}", b.counts());
    }
    // After the TTL the prefix is asked again and found.
    std::thread::sleep(ttl.saturating_sub(started.elapsed()) + Duration::from_millis(20));
    let p = b.prefetch(&prompt);
    wait_ready(&p);
    assert_eq!(offer(&b, &prompt), 128, "{:?}", b.counts());
}

/// Waits at most 5 s for `c`'s probes: whether they were all asked.
fn probes_answered(c: &TierConnector) -> bool {
    c.flush_for(Duration::from_secs(5))
}

#[test]
fn a_lookups_probe_is_asked_whether_the_prober_lingers_or_sleeps() {
    let tier = Arc::new(MemoryTier::new(1 << 20, 1));
    let (a, b) = (engine(&tier, Duration::ZERO), engine(&tier, Duration::ZERO));
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|p| (0..161).map(|t| p * 1000 + t).collect())
        .collect();
    for p in &prompts {
        save(&a, p, 8);
    }
    // Long past its linger: the thread sleeps untimed, and the lookup's offer must wake it.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(offer(&b, &prompts[0]), 0);
    assert!(probes_answered(&b), "a sleeping prober was not woken");
    assert_eq!(offer(&b, &prompts[0]), 128);
    // Right after a probe: the thread lingers, and takes the offer without being woken.
    assert_eq!(offer(&b, &prompts[1]), 0);
    assert_eq!(offer(&b, &prompts[2]), 0);
    assert!(probes_answered(&b), "a lingering prober missed an offer");
    assert_eq!(offer(&b, &prompts[1]), 128);
    assert_eq!(offer(&b, &prompts[2]), 128);
}

/// A connector for `groups` (8 bytes per token, 32-byte Mamba states) on `tier`, with the
/// default tag, and its KV memory.
fn engine_of(
    tier: &Arc<MemoryTier>,
    groups: Vec<CacheGroup>,
) -> (TierConnector, Arc<dyn KvMemory>) {
    let layout = KvLayout::for_groups(&groups, BYTES_PER_TOKEN, 32).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 16).expect("memory"));
    let tier: Arc<dyn Tier> = tier.clone();
    let cfg = TierConnectorConfig::default()
        .with_groups(groups)
        .with_probe_on_miss(false);
    let conn = TierConnector::new(tier, Arc::clone(&memory), cfg).expect("connector");
    (conn, memory)
}

#[test]
fn engines_of_different_layouts_never_load_each_others_chunks() {
    let tier = Arc::new(MemoryTier::new(64 << 20, 4));
    // A hybrid model and a dense one whose full-attention blocks have the same size: a
    // chunk of one fits the other's blocks, and its checks (key, group, length) pass.
    let hybrid = vec![
        CacheGroup::full_attention(16),
        CacheGroup::mamba(16, MambaMode::All),
    ];
    let (h, h_mem) = engine_of(&tier, hybrid);
    let (d, _) = engine_of(&tier, vec![CacheGroup::full_attention(16)]);
    let prompt: Vec<u32> = (1..=65).collect();
    let block = 16 * BYTES_PER_TOKEN;
    for i in 0..4 {
        assert!(h
            .store_now(&prompt, 0, i, &vec![0xAA; block])
            .expect("store"));
        // The dense engine computed other bytes for the same tokens, and stores them after.
        assert!(d
            .store_now(&prompt, 0, i, &vec![0xDD; block])
            .expect("store"));
        assert_ne!(h.chunk_key(0, &prompt, i), d.chunk_key(0, &prompt, i));
    }
    // The hybrid engine loads its full-attention blocks back (its Mamba entries null).
    let fa: Vec<BlockRef> = (1..=4).map(|id| BlockRef { id, generation: 1 }).collect();
    let nulls = vec![
        BlockRef {
            id: 0,
            generation: 0
        };
        4
    ];
    let job = LoadJob::new("r", &prompt, 0, 64, vec![fa, nulls], vec![16, 16]);
    assert_eq!(h.load(&job), LoadResult::Ok, "{:?}", h.counts());
    for id in 1..=4 {
        let mut got = vec![0; block];
        h_mem.read(0, id, 0, &mut got).expect("read");
        assert!(
            got.iter().all(|&b| b == 0xAA),
            "block {id} holds the dense engine's bytes"
        );
    }
    assert_eq!(h.counts().chunks_loaded_from_others, 0);
}
