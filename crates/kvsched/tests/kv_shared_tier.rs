//! Two connectors on one tier, as two engines share a store: what one saved, the other's
//! lookup offers once its probe (a lookup's miss, or a prefetch when the request arrives) has
//! been answered, and its load counts the chunks as another writer's. A prefix asked about is
//! not asked again within `probe_miss_ttl`; after it, it is, and finds what was saved since.
//! A lookup's probe is asked whether the prober thread lingers after its last probe or
//! sleeps. (Plant `probe-hits-unindexed` drops what the probes find: no offer, no cross hit;
//! plant `probe-offer-never-wakes` leaves a sleeping prober asleep.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{KvConnector, LookupQuery};
use kvsched::kv::{
    HostKvMemory, KvLayout, KvMemory, MemoryTier, Prefetch, Tier, TierConnector,
    TierConnectorConfig,
};

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
