//! The connector over the Redis tier, against a server the test starts: chunks saved by one
//! engine's connector are loaded by another's (the shared tier); a value forged without the
//! engines' MAC key is rejected and recovered as an invalid block; damage written straight
//! into Redis is caught by the checksum. Skipped (with a message) without `redis-server`,
//! unless `CI` is set.

mod redis_common;

use std::sync::Arc;

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery};
use kvsched::kv::redis::{RedisConfig, RedisTier};
use kvsched::kv::{
    ChunkCodec, ChunkKey, HostKvMemory, KvLayout, KvMemory, Tier, TierConnector,
    TierConnectorConfig, POISON_BYTE,
};
use kvsched::{BlockRef, CacheGroup};
use kvsched_testkit::redis::{LocalRedis, LocalRedisOptions};
use redis_common::missing;

const MAC: [u8; 32] = [7; 32];
const TAG: u64 = 42;

fn engine(url: &str, mac: Option<[u8; 32]>) -> (TierConnector, Arc<dyn KvMemory>) {
    let groups = vec![CacheGroup::full_attention(16)];
    let layout = KvLayout::for_groups(&groups, 8, 8).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 32).expect("memory"));
    let tier: Arc<dyn Tier> = Arc::new(
        RedisTier::new(RedisConfig::from_url(url).expect("url").tag("model-a")).expect("tier"),
    );
    let conn = TierConnector::new(
        tier,
        Arc::clone(&memory),
        TierConnectorConfig::default()
            .with_groups(groups)
            .with_scheduler_block_size(Some(16))
            .with_tag(TAG)
            .with_mac_key(mac),
    )
    .expect("connector");
    (conn, memory)
}

fn prompt() -> Vec<u32> {
    (1..=65).collect() // 4 full blocks and a token to sample from
}

fn job(blocks: u64) -> LoadJob {
    let table = (0..5)
        .map(|i| BlockRef {
            id: 1 + i,
            generation: 1,
        })
        .collect();
    LoadJob::new("r", &prompt(), 0, blocks * 16, vec![table], vec![16])
}

fn payload(i: u8) -> Vec<u8> {
    vec![i + 1; 128]
}

/// Engine A saves the prompt's 4 blocks (bytes `payload(i)`).
fn save_from_a(url: &str, mac: Option<[u8; 32]>) {
    let (a, mem) = engine(url, mac);
    for i in 0..4u8 {
        mem.write(0, 10 + u64::from(i), 0, &payload(i))
            .expect("write");
    }
    let blocks: Vec<(usize, usize, u64)> = (0..4).map(|i| (0, i, 10 + i as u64)).collect();
    assert_eq!(a.save_blocks(&prompt(), &blocks), 4);
    a.flush();
    assert_eq!(a.counts().chunks_saved, 4, "{:?}", a.counts());
}

fn server() -> Option<LocalRedis> {
    if missing("redis-server") {
        return None;
    }
    Some(LocalRedis::start(LocalRedisOptions::new()).expect("redis-server"))
}

#[test]
fn a_chunk_saved_by_one_engine_is_loaded_and_verified_by_another() {
    let Some(srv) = server() else { return };
    save_from_a(&srv.url(), Some(MAC));
    let (b, mem) = engine(&srv.url(), Some(MAC));
    let p = prompt();
    let q = LookupQuery {
        request: "r",
        prompt: &p,
        local_tokens: 0,
        prepared: None,
    };
    assert_eq!(b.lookup(q).external_tokens, 0, "B's index starts empty");
    b.flush(); // the background probe
    assert_eq!(b.lookup(q).external_tokens, 64);
    assert_eq!(b.load(&job(4)), LoadResult::Ok, "{:?}", b.counts());
    for i in 0..4u8 {
        let mut got = vec![0; 128];
        mem.read(0, 1 + u64::from(i), 0, &mut got).expect("read");
        assert_eq!(got, payload(i));
    }
    assert_eq!(b.counts().chunks_loaded, 4);
    assert_eq!(b.counts().chunks_loaded_from_others, 4, "all of them A's");
}

/// The chunk key of block `i` of the prompt, as `conn` stores it.
fn chunk_key(conn: &TierConnector, i: usize) -> ChunkKey {
    conn.chunk_key(0, &prompt(), i).expect("a full block's key")
}

#[test]
fn a_value_forged_without_the_mac_key_is_rejected_and_recovered() {
    let Some(srv) = server() else { return };
    save_from_a(&srv.url(), Some(MAC));
    // A writer without the key replaces block 2 with a well-formed chunk of other bytes:
    // right key, right length, valid checksum — only the MAC is missing.
    let (b, mem) = engine(&srv.url(), Some(MAC));
    let key = chunk_key(&b, 2);
    let forged = ChunkCodec::new(None).encode(key, 0, 16, &[0xEE; 128]);
    let raw = RedisTier::new(RedisConfig::from_url(&srv.url()).unwrap().tag("model-a")).unwrap();
    raw.put(&[(key, forged)]).expect("forged write");
    let LoadResult::Failed(bad) = b.load(&job(4)) else {
        panic!("the forged chunk was accepted: {:?}", b.counts());
    };
    assert_eq!(
        bad.into_flat(),
        vec![BlockRef {
            id: 3,
            generation: 1
        }]
    );
    assert_eq!(b.counts().mac_failures, 1);
    let mut got = vec![0; 128];
    mem.read(0, 3, 0, &mut got).expect("read");
    assert!(
        got.iter().all(|&x| x == POISON_BYTE),
        "the forged bytes were never written"
    );
    // The others loaded.
    assert_eq!(b.counts().chunks_loaded, 3);
}

#[test]
fn damage_written_into_redis_is_caught_by_the_checksum() {
    let Some(srv) = server() else { return };
    save_from_a(&srv.url(), None);
    let (b, _) = engine(&srv.url(), None);
    let key = chunk_key(&b, 1);
    let raw = RedisTier::new(RedisConfig::from_url(&srv.url()).unwrap().tag("model-a")).unwrap();
    let mut v = raw
        .get(&[key], &kvsched::connector::CancelToken::new())
        .expect("get")
        .pop()
        .flatten()
        .expect("saved");
    let last = v.len() - 1;
    v[last] ^= 1;
    raw.put(&[(key, v)]).expect("damage");
    assert!(matches!(b.load(&job(4)), LoadResult::Failed(_)));
    assert_eq!(b.counts().checksum_failures, 1, "{:?}", b.counts());
}
