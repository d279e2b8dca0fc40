//! Faults on the load path a clean run takes: `FaultyTier` forwards `get_into` and
//! `read_with` (and, without slow gets, the inner tier's `may_block`), so a faulted memory
//! tier is read where its values lie — verified while copied into KV memory in one pass —
//! and a faulted disk tier into the connector's reused buffers. Every chunk damaged at rest
//! is a failed block holding poison, byte for byte; every clean one loads exactly. Plant
//! `failed-copy-left-unpoisoned` (scripts/plants.sh).

use std::sync::Arc;

use kvsched::connector::{CancelToken, InvalidBlocks, KvConnector, LoadJob, LoadResult};
use kvsched::kv::{
    ChunkKey, DiskConfig, DiskTier, HostKvMemory, KvLayout, KvMemory, MemoryTier, Tier,
    TierConnector, TierConnectorConfig, POISON_BYTE,
};
use kvsched::{BlockRef, CacheGroup};
use kvsched_testkit::{FaultConfig, FaultyTier};

/// 40 KiB + 24 bytes a block: more than two of the one-pass copy's blocks, not a multiple of
/// 8 (the KV memory's words).
const BYTES_PER_TOKEN: usize = 2561;
const BLOCK: u64 = 16;
const BLOCKS: usize = 24;

fn pattern(block: u64) -> Vec<u8> {
    (0..BYTES_PER_TOKEN * BLOCK as usize)
        .map(|j| (j as u64 * 29 + block * 11 + (j as u64 >> 10)) as u8)
        .collect()
}

fn prompt() -> Vec<u32> {
    (1..=(BLOCKS as u32 * BLOCK as u32 + 1)).collect()
}

fn connector(tier: Arc<dyn Tier>, mac: Option<[u8; 32]>) -> (TierConnector, Arc<HostKvMemory>) {
    let groups = vec![CacheGroup::full_attention(BLOCK)];
    let layout = KvLayout::for_groups(&groups, BYTES_PER_TOKEN, 8).expect("layout");
    let memory = Arc::new(HostKvMemory::new(layout, 2 * BLOCKS + 2).expect("memory"));
    let cfg = TierConnectorConfig::default()
        .with_groups(groups)
        .with_mac_key(mac)
        .with_probe_on_miss(false);
    let kv: Arc<dyn KvMemory> = memory.clone();
    let c = TierConnector::new(tier, kv, cfg).expect("connector");
    (c, memory)
}

/// Loads every block into `1..=BLOCKS`; the ids reported invalid, sorted.
fn load(c: &TierConnector) -> Vec<u64> {
    let table: Vec<BlockRef> = (1..=BLOCKS as u64)
        .map(|id| BlockRef { id, generation: 1 })
        .collect();
    let p = prompt();
    let job = LoadJob::new("r", &p, 0, BLOCKS as u64 * BLOCK, vec![table], vec![BLOCK]);
    let mut bad = match c.load(&job) {
        LoadResult::Ok => vec![],
        LoadResult::Failed(InvalidBlocks::ByGroup(bad)) => bad[0].iter().map(|b| b.id).collect(),
        other => panic!("{other:?}"),
    };
    bad.sort_unstable();
    bad
}

/// Stores every block through a faulted tier, loads them through a clean connector, and
/// checks each destination byte for byte: the pattern, or poison where the load said it
/// failed — and it failed exactly where the fault damaged the chunk.
fn check<T: kvsched_testkit::FaultTarget>(name: &str, inner: T, mac: Option<[u8; 32]>) {
    let clean_blocks = inner.may_block();
    let cfg = FaultConfig {
        seed: 28,
        corrupt: 0.5,
        ..FaultConfig::default()
    };
    let faulty = Arc::new(FaultyTier::new(inner, cfg).expect("faults"));
    assert_eq!(
        faulty.may_block(),
        clean_blocks,
        "{name}: without slow gets the faulted tier is read as the clean one is"
    );
    let tier: Arc<dyn Tier> = faulty.clone();
    let (writer, _) = connector(Arc::clone(&tier), mac);
    for i in 0..BLOCKS {
        assert!(writer
            .store_now(&prompt(), 0, i, &pattern(i as u64 + 1))
            .expect("store"));
    }
    let corrupted = faulty.counts().corrupted;
    assert!(
        (4..BLOCKS as u64 - 4).contains(&corrupted),
        "{name}: {corrupted} corrupted, want some of each"
    );
    let (reader, m) = connector(tier, mac);
    // Twice: the second load reads into the buffers the first one gave back, and the
    // memory tier's values where they lie again.
    for round in 0..2 {
        let bad = load(&reader);
        assert_eq!(bad.len() as u64, corrupted, "{name} round {round}: {bad:?}");
        let mut got = vec![0u8; BYTES_PER_TOKEN * BLOCK as usize];
        for id in 1..=BLOCKS as u64 {
            m.read(0, id, 0, &mut got).expect("read");
            if bad.contains(&id) {
                assert!(
                    got.iter().all(|&b| b == POISON_BYTE),
                    "{name} round {round}: failed block {id} is not poison"
                );
            } else {
                assert!(
                    got == pattern(id),
                    "{name} round {round}: block {id} differs"
                );
            }
        }
        let s = reader.counts();
        let refused = s.checksum_failures + s.key_mismatches + s.mac_failures + s.format_errors;
        assert_eq!(refused, corrupted * (round + 1), "{name}: {s:?}");
        assert_eq!(s.chunks_loaded, (BLOCKS as u64 - corrupted) * (round + 1));
        // Other bytes over every destination, so the next round must write each block
        // again: the pattern where the chunk is intact, poison where it is not.
        for id in 1..=BLOCKS as u64 {
            m.write(0, id, 0, &vec![0x11; got.len()]).expect("write");
        }
    }
}

#[test]
fn faulted_memory_tier_loads_verify_in_place_and_poison_every_damaged_chunk() {
    for mac in [None, Some([0x28; 32])] {
        check(
            &format!("memory mac={}", mac.is_some()),
            MemoryTier::new(64 << 20, 4),
            mac,
        );
    }
}

#[test]
fn faulted_disk_tier_loads_through_reused_buffers_and_poison_every_damaged_chunk() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    for mac in [None, Some([0x28; 32])] {
        let sub = dir.path().join(format!("mac{}", mac.is_some()));
        let disk = DiskTier::open(sub, DiskConfig::default()).expect("disk");
        check(&format!("disk mac={}", mac.is_some()), disk, mac);
    }
}

#[test]
fn forwarded_reads_give_the_inner_tiers_bytes() {
    let faulty =
        FaultyTier::new(MemoryTier::new(1 << 20, 2), FaultConfig::default()).expect("faults");
    let keys = [ChunkKey(1 << 64), ChunkKey(2 << 64), ChunkKey(3 << 64)];
    faulty
        .put(&[(keys[0], vec![1; 300]), (keys[1], vec![2; 70_000])])
        .expect("put");
    let c = CancelToken::new();
    let mut bufs = vec![vec![9u8; 5]; 3];
    let mut held = [false; 3];
    faulty
        .get_into(&keys, &c, &mut bufs, &mut held)
        .expect("get_into");
    assert_eq!(held, [true, true, false]);
    assert_eq!((bufs[0].clone(), bufs[1].len()), (vec![1; 300], 70_000));
    assert!(bufs[2].is_empty());
    let mut seen = Vec::new();
    assert!(faulty
        .read_with(keys[1], &c, &mut |v| seen.extend_from_slice(v))
        .expect("read_with"));
    assert_eq!(seen, vec![2; 70_000]);
    assert!(!faulty.read_with(keys[2], &c, &mut |_| {}).expect("miss"));
    let slow = FaultyTier::new(
        MemoryTier::new(1 << 20, 2),
        FaultConfig {
            slow: 0.1,
            ..FaultConfig::default()
        },
    )
    .expect("faults");
    assert!(
        slow.may_block(),
        "slow gets are bounded by the load's deadline"
    );
}
