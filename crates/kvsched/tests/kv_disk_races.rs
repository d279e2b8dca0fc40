//! The disk tier's own calls racing each other on real threads, without pauses: a rescan
//! racing puts that save one key again and again never loses the key (nor brings back a pack
//! the tier deleted), and a `get` racing such puts never answers "not held". The
//! interleavings these races reach now and then are pinned step by step by the unit tests
//! in `kv::disk::tests` (plants `rescan-indexes-deleted-packs`, `disk-get-misses-moved-key`);
//! these check that no other interleaving of the real calls loses the key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::{ChunkKey, DiskConfig, DiskTier, Tier};

/// How long each race runs.
const RACE: Duration = Duration::from_millis(1500);

/// A thread putting `key` again and again until `stop`, each put under `gate` (if any).
fn reputter(
    tier: &Arc<DiskTier>,
    key: ChunkKey,
    stop: &Arc<AtomicBool>,
    gate: Option<&Arc<Mutex<()>>>,
) -> std::thread::JoinHandle<u64> {
    let (t, stop, gate) = (Arc::clone(tier), Arc::clone(stop), gate.map(Arc::clone));
    std::thread::spawn(move || {
        let mut puts = 0;
        while !stop.load(Ordering::Relaxed) {
            let _g = gate.as_ref().map(|g| g.lock().expect("gate"));
            t.put(&[(key, vec![7u8; 256])]).expect("put");
            puts += 1;
        }
        puts
    })
}

#[test]
fn a_rescan_racing_reputs_of_a_key_never_loses_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Another tier's packs, so that a rescan's walk takes a while.
    {
        let other = DiskTier::open(dir.path(), DiskConfig::default()).expect("open");
        for i in 0..1000u128 {
            other
                .put(&[(ChunkKey(1_000_000 + i), vec![1u8; 64])])
                .expect("put");
        }
    }
    let tier = Arc::new(DiskTier::open(dir.path(), DiskConfig::default()).expect("open"));
    let key = ChunkKey(7);
    tier.put(&[(key, vec![7u8; 256])]).expect("put");
    // Each put holds `gate`, so the check below sees what a rescan left before another put
    // saves the key again.
    let gate = Arc::new(Mutex::new(()));
    let stop = Arc::new(AtomicBool::new(false));
    let putter = reputter(&tier, key, &stop, Some(&gate));
    let never = CancelToken::new();
    let until = Instant::now() + RACE;
    let (mut rounds, mut lost) = (0u64, 0u64);
    while Instant::now() < until {
        rounds += 1;
        tier.rescan().expect("rescan");
        let _g = gate.lock().expect("gate");
        if tier.get(&[key], &never).expect("get")[0].is_none() {
            lost += 1;
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let puts = putter.join().expect("putter");
    let fresh = DiskTier::open(dir.path(), DiskConfig::default()).expect("reopen");
    let on_disk = fresh.get(&[key], &never).expect("get")[0].is_some();
    assert_eq!(
        (lost, on_disk),
        (0, true),
        "key lost after {rounds} rescans racing {puts} puts"
    );
    // Every pack of the key but the last was deleted, and none brought back.
    let c = tier.counts();
    assert_eq!(c.entries, 1001, "{c:?}");
}

#[test]
fn a_get_racing_reputs_of_its_key_never_misses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tier = Arc::new(DiskTier::open(dir.path(), DiskConfig::default()).expect("open"));
    let key = ChunkKey(9);
    tier.put(&[(key, vec![7u8; 256])]).expect("put");
    let stop = Arc::new(AtomicBool::new(false));
    let putter = reputter(&tier, key, &stop, None);
    let never = CancelToken::new();
    let until = Instant::now() + RACE;
    let (mut gets, mut misses) = (0u64, 0u64);
    while Instant::now() < until {
        gets += 1;
        if tier.get(&[key], &never).expect("get")[0].is_none() {
            misses += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let puts = putter.join().expect("putter");
    assert_eq!(
        misses, 0,
        "{misses} of {gets} gets (racing {puts} puts) missed a key held throughout"
    );
}
