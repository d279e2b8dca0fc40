//! The disk tier's own calls racing each other on real threads, without pauses: a `get`
//! racing puts that save its key again and again never answers "not held" (plant
//! `disk-get-misses-moved-key`, which this race catches within its run). The interleavings
//! are pinned step by step by the unit tests in `kv::disk::tests`, with the rescan's race
//! against such puts (plant `rescan-indexes-deleted-packs`), which a run this short on real
//! threads does not reach reliably.

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
