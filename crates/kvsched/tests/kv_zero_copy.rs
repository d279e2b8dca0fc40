//! The load and save paths through reused buffers, byte for byte: blocks saved through a
//! `TierConnector` (copied into a reused buffer after the header's room, sealed in place) and
//! loaded back (read into a reused buffer, verified there, copied into KV memory) come back
//! exactly, on the memory and disk tiers, with and without a MAC, on the loading thread and
//! on the connector's get threads; a chunk damaged at rest is a failed, poisoned block
//! whatever path it takes, and its neighbours still load. Plants `load-unverified` and
//! `save-payload-offset` (scripts/plants.sh).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{InvalidBlocks, KvConnector, LoadJob, LoadResult};
use kvsched::kv::{
    ChunkKey, DiskConfig, DiskTier, HostKvMemory, KvLayout, KvMemory, MemoryTier, Tier,
    TierConnector, TierConnectorConfig, POISON_BYTE,
};
use kvsched::{BlockRef, CacheGroup};

/// 1,029 bytes per token: 16,464-byte blocks, not a multiple of 8 (the KV memory's words).
const BYTES_PER_TOKEN: usize = 1029;
const BLOCK: u64 = 16;
const BLOCKS: usize = 6;

fn block_bytes() -> usize {
    BYTES_PER_TOKEN * BLOCK as usize
}

fn pattern(block: u64) -> Vec<u8> {
    (0..block_bytes())
        .map(|j| (j as u64 * 131 + block * 7 + (j as u64 >> 8)) as u8)
        .collect()
}

fn connector(tier: Arc<dyn Tier>, mac: Option<[u8; 32]>) -> (TierConnector, Arc<HostKvMemory>) {
    let groups = vec![CacheGroup::full_attention(BLOCK)];
    let layout = KvLayout::for_groups(&groups, BYTES_PER_TOKEN, 8).expect("layout");
    let memory = Arc::new(HostKvMemory::new(layout, 64).expect("memory"));
    let cfg = TierConnectorConfig::default()
        .with_groups(groups)
        .with_mac_key(mac)
        .with_probe_on_miss(false);
    let kv: Arc<dyn KvMemory> = memory.clone();
    (
        TierConnector::new(tier, kv, cfg).expect("connector"),
        memory,
    )
}

fn table(base: u64) -> Vec<BlockRef> {
    (0..BLOCKS as u64)
        .map(|i| BlockRef {
            id: base + i,
            generation: 1,
        })
        .collect()
}

fn prompt() -> Vec<u32> {
    (1..=(BLOCKS as u32 * BLOCK as u32 + 1)).collect()
}

fn read(m: &HostKvMemory, block: u64) -> Vec<u8> {
    let mut out = vec![0u8; block_bytes()];
    m.read(0, block, 0, &mut out).expect("read");
    out
}

/// Loads the prompt's blocks into `base..base + BLOCKS`, with a deadline (the get threads of
/// a tier that may block) or without; the ids reported invalid.
fn load(c: &TierConnector, base: u64, deadline: bool) -> Vec<u64> {
    let p = prompt();
    let end = BLOCKS as u64 * BLOCK;
    let mut job = LoadJob::new("r", &p, 0, end, vec![table(base)], vec![BLOCK]);
    if deadline {
        job.deadline = Some(Instant::now() + Duration::from_secs(30));
    }
    match c.load(&job) {
        LoadResult::Ok => vec![],
        LoadResult::Failed(InvalidBlocks::ByGroup(bad)) => bad[0].iter().map(|b| b.id).collect(),
        other => panic!("{other:?}"),
    }
}

/// Flips one payload byte of the value stored under a key, its length unchanged.
type Damage = Box<dyn Fn(ChunkKey) -> bool>;

fn flip(v: &mut [u8]) -> bool {
    let at = v.len() - 100;
    v[at] ^= 0x10;
    true
}

struct Case {
    name: String,
    tier: Arc<dyn Tier>,
    damage: Damage,
    mac: Option<[u8; 32]>,
    deadline: bool,
}

/// Every tier × MAC × get path.
fn cases(dir: &std::path::Path) -> Vec<Case> {
    let mut out = Vec::new();
    for mac in [None, Some([0x5a; 32])] {
        for deadline in [false, true] {
            let m = Arc::new(MemoryTier::new(64 << 20, 4));
            let mm = Arc::clone(&m);
            out.push(Case {
                name: format!("memory mac={} deadline={deadline}", mac.is_some()),
                tier: m,
                damage: Box::new(move |k| mm.edit_stored(k, |v| flip(v))),
                mac,
                deadline,
            });
            let sub = dir.join(format!("d{}{}", mac.is_some(), deadline));
            let d = Arc::new(DiskTier::open(sub, DiskConfig::default()).expect("disk"));
            let dd = Arc::clone(&d);
            out.push(Case {
                name: format!("disk mac={} deadline={deadline}", mac.is_some()),
                tier: d,
                damage: Box::new(move |k| dd.edit_stored(k, |v| flip(v)).unwrap_or(false)),
                mac,
                deadline,
            });
        }
    }
    out
}

#[test]
fn saved_blocks_load_back_byte_for_byte_through_every_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    for Case {
        name,
        tier,
        mac,
        deadline,
        ..
    } in cases(dir.path())
    {
        let (c, m) = connector(tier, mac);
        for b in 1..=BLOCKS as u64 {
            m.write(0, b, 0, &pattern(b)).expect("write");
        }
        let blocks: Vec<(usize, usize, u64)> = (0..BLOCKS).map(|i| (0, i, i as u64 + 1)).collect();
        assert_eq!(c.save_blocks(&prompt(), &blocks), BLOCKS, "{name}");
        c.flush();
        assert_eq!(c.counts().chunks_saved, BLOCKS as u64, "{name}");
        // Twice: the second load reads into the buffers the first one gave back.
        for base in [20, 40] {
            assert_eq!(load(&c, base, deadline), Vec::<u64>::new(), "{name}");
            for i in 0..BLOCKS as u64 {
                assert!(
                    read(&m, base + i) == pattern(i + 1),
                    "{name}: block {i} differs"
                );
            }
        }
        assert_eq!(c.counts().chunks_loaded, 2 * BLOCKS as u64, "{name}");
    }
}

#[test]
fn a_chunk_damaged_at_rest_is_a_poisoned_block_and_its_neighbours_still_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    for Case {
        name,
        tier,
        damage,
        mac,
        deadline,
    } in cases(dir.path())
    {
        let (c, _m) = connector(Arc::clone(&tier), mac);
        let (c2, m2) = connector(Arc::clone(&tier), mac);
        for i in 0..BLOCKS {
            assert!(c
                .store_now(&prompt(), 0, i, &pattern(i as u64 + 1))
                .expect("store"));
        }
        // One payload byte of chunk 2 flipped at rest, the value's length unchanged.
        let key = c.chunk_key(0, &prompt(), 2).expect("chunk 2's key");
        let edited = damage(key);
        assert!(edited, "{name}");
        assert_eq!(load(&c2, 30, deadline), vec![32], "{name}");
        assert!(
            read(&m2, 32).iter().all(|&b| b == POISON_BYTE),
            "{name}: not poisoned"
        );
        for i in [0u64, 1, 3, 4, 5] {
            assert!(
                read(&m2, 30 + i) == pattern(i + 1),
                "{name}: block {i} differs"
            );
        }
        let s = c2.counts();
        assert_eq!((s.checksum_failures, s.chunks_loaded), (1, 5), "{name}");
    }
}
