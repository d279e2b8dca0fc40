//! Hybrid lookups through the tier connector: the offer is the largest multiple of `S` at
//! which every group has its chunks; a longer prefix one group cannot resume from is not
//! offered. On a Mamba and on a sliding-window geometry.

use std::sync::Arc;

use kvsched::connector::{KvConnector, LookupQuery};
use kvsched::kv::{
    HostKvMemory, KvLayout, KvMemory, MemoryTier, TierConnector, TierConnectorConfig,
};
use kvsched::{CacheGroup, MambaMode};

fn connector(groups: Vec<CacheGroup>, s: u64) -> TierConnector {
    let layout = KvLayout::for_groups(&groups, 8, 16).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 8).expect("memory"));
    TierConnector::new(
        Arc::new(MemoryTier::new(1 << 20, 1)),
        memory,
        TierConnectorConfig::default()
            .with_groups(groups)
            .with_scheduler_block_size(Some(s))
            .with_probe_on_miss(false),
    )
    .expect("connector")
}

fn store(c: &TierConnector, prompt: &[u32], group: usize, blocks: usize, bytes: usize) {
    for i in 0..blocks {
        assert!(c
            .store_now(prompt, group, i, &vec![i as u8; bytes])
            .expect("store"));
    }
}

/// The offer for `prompt` past `local`, the same whether the lookup derives the prompt's
/// chunk keys itself or takes those the connector prepared at submit.
fn offer(c: &TierConnector, prompt: &[u32], local: u64) -> u64 {
    let query = |prepared| LookupQuery {
        request: "r",
        prompt,
        local_tokens: local,
        prepared,
    };
    let fresh = c.lookup(query(None));
    let keys = c
        .prepare("r", prompt)
        .expect("the tier connector prepares chunk keys");
    assert_eq!(
        c.lookup(query(Some(&*keys))),
        fresh,
        "a prepared lookup differs from a fresh one"
    );
    fresh.external_tokens
}

#[test]
fn mamba_limits_the_offer_to_the_longest_prefix_with_its_state() {
    // S = 32; full attention in blocks of 16, Mamba states every 32 tokens.
    let c = connector(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(32, MambaMode::All),
        ],
        32,
    );
    let prompt: Vec<u32> = (0..161).collect();
    store(&c, &prompt, 0, 10, 128); // attention chunks for 160 tokens
    assert_eq!(
        offer(&c, &prompt, 0),
        0,
        "no Mamba state: nothing can resume"
    );
    store(&c, &prompt, 1, 2, 16); // states at 32 and 64
    assert_eq!(
        offer(&c, &prompt, 0),
        64,
        "attention reaches 160, Mamba only 64"
    );
    assert_eq!(offer(&c, &prompt, 32), 32, "past a local prefix of 32");
    store(&c, &prompt, 1, 5, 16); // states up to 160
    assert_eq!(offer(&c, &prompt, 0), 160);
}

#[test]
fn a_sliding_window_gap_stops_the_offer_at_a_multiple_of_s() {
    // S = 32: an offer is a multiple of 32 even where every group reaches 80.
    let c = connector(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::sliding_window(16, 32),
        ],
        32,
    );
    let prompt: Vec<u32> = (1000..1129).collect(); // 128 tokens and one to sample
    store(&c, &prompt, 0, 8, 128);
    store(&c, &prompt, 1, 5, 128); // the window's group reaches 80
    assert_eq!(offer(&c, &prompt, 0), 64, "80 rounded down to S");
    // The last token is always computed: a prompt of exactly 128 offers at most 96.
    let short = &prompt[..128];
    store(&c, short, 1, 8, 128);
    assert_eq!(offer(&c, short, 0), 96);
    // Another prompt shares no chunk (keys chain over the tokens).
    let other: Vec<u32> = (0..129).collect();
    assert_eq!(offer(&c, &other, 0), 0);
}
