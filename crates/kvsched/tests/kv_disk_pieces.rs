//! A load from the disk tier read in pieces (`Tier::costs_per_call` is `false` for it: the
//! connector reads about 512 KiB at a time and lands each piece before reading the next):
//! every chunk of every piece, the short last one included, comes back byte for byte, on the
//! loading thread and on the connector's get threads; a chunk damaged at rest in one piece
//! and one missing from the last are poisoned and reported, and nothing else is. Plant
//! `load-pieces-drop-tail` (scripts/plants.sh).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{InvalidBlocks, KvConnector, LoadJob, LoadResult};
use kvsched::kv::{
    DiskConfig, DiskTier, HostKvMemory, KvLayout, KvMemory, Tier, TierConnector,
    TierConnectorConfig, POISON_BYTE,
};
use kvsched::{BlockRef, CacheGroup};

/// 1,029 bytes per token: 16,464-byte blocks (31 chunks a 512 KiB piece).
const BYTES_PER_TOKEN: usize = 1029;
const BLOCK: u64 = 16;
/// Four pieces: three of 31 chunks and a short one of 7.
const BLOCKS: usize = 100;

fn block_bytes() -> usize {
    BYTES_PER_TOKEN * BLOCK as usize
}

fn pattern(block: u64) -> Vec<u8> {
    (0..block_bytes())
        .map(|j| (j as u64 * 131 + block * 7 + (j as u64 >> 8)) as u8)
        .collect()
}

fn prompt() -> Vec<u32> {
    (1..=(BLOCKS as u32 * BLOCK as u32 + 1)).collect()
}

fn connector(tier: Arc<dyn Tier>) -> (TierConnector, Arc<HostKvMemory>) {
    let groups = vec![CacheGroup::full_attention(BLOCK)];
    let layout = KvLayout::for_groups(&groups, BYTES_PER_TOKEN, 8).expect("layout");
    let memory = Arc::new(HostKvMemory::new(layout, 3 * BLOCKS + 1).expect("memory"));
    let cfg = TierConnectorConfig::default()
        .with_groups(groups)
        .with_probe_on_miss(false);
    let kv: Arc<dyn KvMemory> = memory.clone();
    (
        TierConnector::new(tier, kv, cfg).expect("connector"),
        memory,
    )
}

fn read(m: &HostKvMemory, block: u64) -> Vec<u8> {
    let mut out = vec![0u8; block_bytes()];
    m.read(0, block, 0, &mut out).expect("read");
    out
}

/// Loads every block into `base..base + BLOCKS`; the ids reported invalid.
fn load(c: &TierConnector, base: u64, deadline: bool) -> Vec<u64> {
    let p = prompt();
    let table: Vec<BlockRef> = (0..BLOCKS as u64)
        .map(|i| BlockRef {
            id: base + i,
            generation: 1,
        })
        .collect();
    let end = BLOCKS as u64 * BLOCK;
    let mut job = LoadJob::new("r", &p, 0, end, vec![table], vec![BLOCK]);
    if deadline {
        job.deadline = Some(Instant::now() + Duration::from_secs(60));
    }
    match c.load(&job) {
        LoadResult::Ok => vec![],
        LoadResult::Failed(InvalidBlocks::ByGroup(bad)) => {
            let mut ids: Vec<u64> = bad[0].iter().map(|b| b.id).collect();
            ids.sort_unstable();
            ids
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_piece_lands_byte_for_byte_and_only_bad_chunks_fail() {
    let dir = tempfile::tempdir().expect("tempdir");
    for deadline in [false, true] {
        let disk = Arc::new(
            DiskTier::open(
                dir.path().join(format!("d{deadline}")),
                DiskConfig::default(),
            )
            .expect("disk"),
        );
        assert!(!disk.costs_per_call(), "the disk tier is read in pieces");
        let (c, m) = connector(disk.clone());
        for i in 0..BLOCKS {
            assert!(c
                .store_now(&prompt(), 0, i, &pattern(i as u64 + 1))
                .expect("store"));
        }
        // Twice: the second load reads into the buffers the first gave back.
        for base in [1, 1 + BLOCKS as u64] {
            assert_eq!(
                load(&c, base, deadline),
                Vec::<u64>::new(),
                "deadline {deadline}"
            );
            for i in 0..BLOCKS as u64 {
                assert!(
                    read(&m, base + i) == pattern(i + 1),
                    "deadline {deadline}: block {i} differs"
                );
            }
        }
        assert_eq!(c.counts().chunks_loaded, 2 * BLOCKS as u64);

        // Chunk 40 (the second piece) damaged at rest, chunk 97 (the short last piece) gone.
        let key = |i| c.chunk_key(0, &prompt(), i).expect("a chunk's key");
        assert!(disk
            .edit_stored(key(40), |v| {
                let at = v.len() - 100;
                v[at] ^= 0x10;
                true
            })
            .expect("edit"));
        assert!(disk.remove(key(97)).expect("remove"));
        let base = 1 + 2 * BLOCKS as u64;
        assert_eq!(
            load(&c, base, deadline),
            vec![base + 40, base + 97],
            "deadline {deadline}"
        );
        for i in 0..BLOCKS as u64 {
            let got = read(&m, base + i);
            if i == 40 || i == 97 {
                assert!(
                    got.iter().all(|&b| b == POISON_BYTE),
                    "deadline {deadline}: block {i} not poisoned"
                );
            } else {
                assert!(
                    got == pattern(i + 1),
                    "deadline {deadline}: block {i} differs"
                );
            }
        }
        let s = c.counts();
        assert_eq!(
            (s.checksum_failures, s.missing_chunks, s.chunks_loaded),
            (1, 1, 3 * BLOCKS as u64 - 2),
            "deadline {deadline}"
        );
    }
}
