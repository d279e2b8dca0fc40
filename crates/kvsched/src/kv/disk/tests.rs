//! Unit tests of the disk tier.
use super::*;

use crate::connector::CancelToken;
use crate::kv::Tier;

#[test]
fn packs_are_numbered_files_in_the_root() {
    let t = DiskTier::unscanned(PathBuf::from("/r"), DiskConfig::default(), Found::default());
    assert_eq!(t.path_of(0x12ab), PathBuf::from("/r/00000000000012ab.pack"));
}

fn tier(dir: &tempfile::TempDir) -> DiskTier {
    DiskTier::open(
        dir.path(),
        DiskConfig {
            capacity_bytes: 1 << 20,
            max_value_bytes: 1 << 10,
            fsync: false,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A file system that fills long before the tier's capacity: the tier takes what it holds
/// then as its capacity and evicts the oldest to make room, so saves go on succeeding (and
/// the newest chunks are the ones kept) instead of failing forever.
#[test]
fn a_full_file_system_lowers_the_capacity_and_evicts() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let t = tier(&dir);
    t.test_fs.store(1000, Ordering::Relaxed); // six packs of one 100-byte chunk
    for i in 0..30u128 {
        t.put(&[(ChunkKey(i + 1), vec![i as u8; 100])])
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    let s = t.counts();
    assert!(s.full_writes >= 1, "{s:?}");
    assert_eq!(s.write_errors, 0, "{s:?}");
    assert!(s.capacity_bytes <= 1000 && s.bytes <= 1000, "{s:?}");
    assert!(s.evictions >= 20, "{s:?}");
    let never = CancelToken::new();
    let got = t
        .get(&[ChunkKey(30), ChunkKey(1)], &never)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        got[0].as_deref(),
        Some(&[29u8; 100][..]),
        "the newest is kept"
    );
    assert_eq!(got[1], None, "the oldest was evicted");
    // Space comes back (another writer's files deleted): after `FULL_HOLDS` the configured
    // capacity is tried again, and holds while writes succeed.
    t.test_fs.store(u64::MAX, Ordering::Relaxed);
    std::thread::sleep(super::index::FULL_HOLDS + std::time::Duration::from_millis(50));
    for i in 30..60u128 {
        t.put(&[(ChunkKey(i + 1), vec![i as u8; 100])])
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    let s = t.counts();
    assert_eq!(s.capacity_bytes, 1 << 20, "{s:?}");
    assert!(s.bytes > 1000, "{s:?}");
}

/// A read-only file system: every put fails, counted, and the index holds nothing it could
/// not write.
#[test]
fn a_read_only_file_system_fails_each_put_and_indexes_nothing() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let t = tier(&dir);
    t.test_fs.store(u64::MAX - 1, Ordering::Relaxed);
    for i in 0..3u128 {
        assert!(t.put(&[(ChunkKey(i + 1), vec![1; 100])]).is_err());
    }
    let s = t.counts();
    assert_eq!((s.write_errors, s.entries, s.bytes), (3, 0, 0), "{s:?}");
    assert_eq!(s.capacity_bytes, 1 << 20, "not full: the capacity stands");
    let never = CancelToken::new();
    assert_eq!(t.exists(&[ChunkKey(1)], &never).ok(), Some(vec![false]));
}

/// A tier that evicts as it goes keeps the numbers a rescan skips to the packs still in the
/// directory, not one per pack ever written; a pack another tier writes later is still
/// indexed by a rescan.
#[test]
fn the_numbers_a_rescan_skips_are_the_packs_on_disk() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let t = tier(&dir);
    // 2,000 packs of one 1 KiB chunk through a 1 MiB tier: most are evicted.
    for i in 0..2000u128 {
        t.put(&[(ChunkKey(i + 1), vec![i as u8; 1024])])
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    let on_disk = fs::read_dir(dir.path())
        .unwrap_or_else(|e| panic!("{e}"))
        .count();
    let seen = t.index.lock().seen.len();
    assert!(
        on_disk < 2000 && seen <= on_disk,
        "{seen} numbers, {on_disk} files"
    );
    // Another tier on the directory writes a pack; this one finds it.
    let other = tier(&dir);
    other
        .put(&[(ChunkKey(5000), vec![7; 100])])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.rescan().ok(), Some(1));
    let never = CancelToken::new();
    let got = t
        .get(&[ChunkKey(5000)], &never)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got[0].as_deref(), Some(&[7u8; 100][..]));
}

/// Pack-named files a rescan refuses (damaged, or another tier's too large for this one) and
/// that are then deleted — as engines sharing a directory write and evict them for as long as
/// they run — leave no number behind: `seen` holds what the directory holds.
#[test]
fn refused_packs_that_are_gone_are_forgotten() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let t = tier(&dir);
    for n in 0..200u64 {
        let path = dir.path().join(format!("{:016x}.pack", 1_000_000 + n));
        fs::write(&path, b"not a pack table").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.rescan().ok(), Some(0));
        fs::remove_file(&path).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(t.rescan().ok(), Some(0));
    assert_eq!(
        t.index.lock().seen.len(),
        0,
        "numbers of files long gone kept"
    );
}

/// A capacity too small for one value's table stores nothing, not even an empty value, so
/// the tier never holds more than its capacity.
#[test]
fn a_capacity_below_one_table_stores_nothing() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for capacity_bytes in [0, 1, pack::table_len(1) - 1] {
        let t = DiskTier::open(
            dir.path(),
            DiskConfig {
                capacity_bytes,
                max_value_bytes: 1 << 10,
                fsync: false,
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let got = t.put(&[(ChunkKey(1), Vec::new()), (ChunkKey(2), vec![7])]);
        assert!(
            matches!(got, Err(TierError::Refused(_))),
            "{capacity_bytes}: {got:?}"
        );
        let c = t.counts();
        assert!(c.bytes <= capacity_bytes, "{capacity_bytes}: {c:?}");
    }
}

/// The bytes of the pack files in `dir`.
fn pack_bytes_on_disk(dir: &tempfile::TempDir) -> u64 {
    fs::read_dir(dir.path())
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(|f| {
            let f = f.ok()?;
            write::pack_number(f.file_name().to_str()?)?;
            Some(f.metadata().ok()?.len())
        })
        .sum()
}

/// Sets `t`'s hook (see `Pause`).
fn on_pause(t: &DiskTier, hook: impl FnMut(&DiskTier, Pause) + Send + 'static) {
    *t.pause.lock() = Some(Box::new(hook));
}

fn put1(t: &DiskTier, key: ChunkKey, byte: u8, len: usize) {
    t.put(&[(key, vec![byte; len])])
        .unwrap_or_else(|e| panic!("put {key}: {e}"));
}

fn get1(t: &DiskTier, key: ChunkKey) -> Option<Vec<u8>> {
    let never = CancelToken::new();
    t.get(&[key], &never)
        .unwrap_or_else(|e| panic!("get {key}: {e}"))
        .pop()
        .flatten()
}

/// A rescan walks the directory without the lock. A put of a key during the walk writes a
/// pack the walk reads; the next put of the key, before the rescan takes the lock, deletes
/// it. The rescan must not index that pack — the key would move back onto a file that is
/// gone, and the live pack, then holding no key, be deleted: the key lost from disk too.
#[test]
fn a_rescan_never_indexes_a_pack_this_tier_saved_over_during_its_walk() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let t = tier(&dir);
    let key = ChunkKey(7);
    put1(&t, key, 1, 100);
    on_pause(&t, move |t, at| match at {
        // Written after `seen` was copied: the walk reads it.
        Pause::RescanCopiedSeen => put1(t, key, 2, 100),
        // Saved over, so deleted, before the rescan indexes what it found.
        Pause::RescanWalked => put1(t, key, 3, 100),
        Pause::ReadPlaced => {}
    });
    assert_eq!(t.rescan().ok(), Some(0));
    *t.pause.lock() = None;
    assert_eq!(get1(&t, key), Some(vec![3; 100]), "the last put's value");
    let c = t.counts();
    assert_eq!((c.entries, c.bytes), (1, pack_bytes_on_disk(&dir)), "{c:?}");
    drop(t);
    assert_eq!(get1(&tier(&dir), key), Some(vec![3; 100]), "on disk");
}

/// As above, the pack the walk read evicted by the tier before the rescan takes the lock:
/// indexing it would count bytes no file holds (and evict a live pack to make room for them).
#[test]
fn a_rescan_never_indexes_a_pack_this_tier_evicted_during_its_walk() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // Room for two packs of one 100-byte value.
    let cfg = DiskConfig {
        capacity_bytes: 2 * DiskTier::pack_bytes(&[100]) + 10,
        max_value_bytes: 100,
        fsync: false,
    };
    let t = DiskTier::open(dir.path(), cfg).unwrap_or_else(|e| panic!("{e}"));
    let (a, b, c) = (ChunkKey(1), ChunkKey(2), ChunkKey(3));
    put1(&t, a, 1, 100);
    on_pause(&t, move |t, at| match at {
        Pause::RescanCopiedSeen => put1(t, b, 2, 100),
        Pause::RescanWalked => {
            // `a` the most recently used: `c`'s put evicts `b`'s pack.
            assert!(get1(t, a).is_some());
            put1(t, c, 3, 100);
        }
        Pause::ReadPlaced => {}
    });
    assert_eq!(t.rescan().ok(), Some(0));
    *t.pause.lock() = None;
    let s = t.counts();
    assert_eq!((s.entries, s.bytes), (2, pack_bytes_on_disk(&dir)), "{s:?}");
    assert_eq!(get1(&t, a), Some(vec![1; 100]));
    assert_eq!(get1(&t, c), Some(vec![3; 100]));
    assert_eq!(get1(&t, b), None, "evicted");
}

/// Another tier on the directory wrote 100 packs since this one opened, so the next 100
/// numbers are taken: the put skips past them all (it lists the directory after a few)
/// instead of failing after 64.
#[test]
fn a_put_behind_another_writer_skips_past_its_numbers() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (tier(&dir), tier(&dir));
    for i in 0..100u128 {
        put1(&b, ChunkKey(1000 + i), 2, 64);
    }
    let key = ChunkKey(1);
    let got = a.put(&[(key, vec![1; 64])]);
    assert!(got.is_ok(), "{got:?}: {:?}", a.counts());
    assert_eq!(a.counts().write_errors, 0);
    assert_eq!(
        a.pack_path(key),
        Some(dir.path().join(format!("{:016x}.pack", 100))),
        "the first number past the other's packs"
    );
    assert_eq!(get1(&a, key), Some(vec![1; 64]));
    assert_eq!(b.rescan().ok(), Some(1));
    assert_eq!(get1(&b, key), Some(vec![1; 64]));
}

/// A get that took its key's place from the index, then lost the pack to a put of the same
/// key (which deleted it), reads the key from the new pack: it was held throughout.
#[test]
fn a_get_racing_a_reput_of_its_key_reads_the_new_pack() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let t = tier(&dir);
    let key = ChunkKey(9);
    put1(&t, key, 1, 100);
    let mut once = true;
    on_pause(&t, move |t, at| {
        if at == Pause::ReadPlaced && std::mem::take(&mut once) {
            put1(t, key, 2, 100);
        }
    });
    assert_eq!(get1(&t, key), Some(vec![2; 100]));
    let c = t.counts();
    assert_eq!((c.hits, c.misses, c.entries), (1, 0, 1), "{c:?}");
}

/// A key saved again every time a get looks for it: the get follows it a bounded number of
/// times, then answers "not held", and the index still holds the key.
#[test]
fn a_get_follows_a_moving_key_a_bounded_number_of_times() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let t = tier(&dir);
    let key = ChunkKey(9);
    put1(&t, key, 1, 100);
    let puts = crate::sync::Arc::new(crate::sync::AtomicU64::new(0));
    let counted = crate::sync::Arc::clone(&puts);
    on_pause(&t, move |t, at| {
        if at == Pause::ReadPlaced {
            counted.fetch_add(1, Ordering::Relaxed);
            put1(t, key, 2, 100);
        }
    });
    assert_eq!(get1(&t, key), None);
    assert_eq!(puts.load(Ordering::Relaxed), u64::from(read::MOVES) + 1);
    *t.pause.lock() = None;
    assert_eq!(get1(&t, key), Some(vec![2; 100]));
}
