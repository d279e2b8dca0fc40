//! The disk tier against what others plant at a pack's path: a symbolic link to /dev/zero,
//! a FIFO, a sparse 8 GiB file — each read as absent at once, with bounded memory; an
//! oversized file found at open is neither indexed nor counted against the capacity, so it
//! evicts nothing; a rescan racing puts deletes none of their temporary files, and a
//! temporary the tier cannot remove does not stop it opening. A value longer than the
//! tier's callers store is refused unread (plant `disk-value-bound-ignored`). Tiers sharing
//! a directory never take another's pack for their own when it reuses a number whose file
//! one of them deleted: no read of it at their offsets, no delete of it (plant
//! `disk-pack-identity-unchecked`). Temporary names a co-tenant takes ahead make no put fail
//! (plant `disk-temp-names-foreseeable`).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::{ChunkKey, DiskConfig, DiskTier, Tier};

const CHUNK: usize = 304;

fn cfg() -> DiskConfig {
    DiskConfig::default()
        .with_capacity_bytes(1 << 30)
        .with_max_value_bytes(CHUNK as u64)
        .with_fsync(false)
}

fn keys(n: u128) -> Vec<ChunkKey> {
    (1..=n)
        .map(|i| ChunkKey(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)))
        .collect()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn mkfifo(path: &Path) -> bool {
    std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

/// Saves a chunk for every key, each in a pack of its own, then replaces the first pack
/// with `plant` and reads them all.
fn planted_reads_as_absent(plant: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let t = DiskTier::open(dir.path(), cfg()).unwrap();
    let ks = keys(4);
    for &k in &ks {
        t.put(&[(k, vec![5u8; CHUNK])]).unwrap();
    }
    let path = t.pack_path(ks[0]).unwrap();
    fs::remove_file(&path).unwrap();
    plant(&path);
    let rss0 = rss_kib();
    let t0 = Instant::now();
    let got = t.get(&ks, &CancelToken::new()).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(rss_kib().saturating_sub(rss0) < 64 << 10, "RSS grew");
    assert_eq!(got[0], None);
    assert!(got[1..]
        .iter()
        .all(|v| v.as_deref() == Some(&[5u8; CHUNK][..])));
    assert_eq!(t.counts().refused_reads, 1, "{:?}", t.counts());
}

#[test]
fn a_symlink_to_dev_zero_reads_as_absent() {
    planted_reads_as_absent(|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap());
}

#[test]
fn a_fifo_reads_as_absent_without_waiting_for_a_writer() {
    planted_reads_as_absent(|p| assert!(mkfifo(p), "mkfifo"));
}

#[test]
fn a_sparse_8_gib_file_reads_as_absent() {
    planted_reads_as_absent(|p| fs::File::create(p).unwrap().set_len(8 << 30).unwrap());
}

#[test]
fn an_oversized_file_planted_before_open_evicts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let small = cfg().with_capacity_bytes(64 * CHUNK as u64);
    let ks = keys(41);
    {
        let t = DiskTier::open(dir.path(), small).unwrap();
        let chunks: Vec<_> = ks[..40].iter().map(|&k| (k, vec![9u8; CHUNK])).collect();
        t.put(&chunks).unwrap();
    }
    // An 8 GiB sparse file named like a pack.
    let planted = dir.path().join("00000000000000ff.pack");
    fs::File::create(&planted)
        .unwrap()
        .set_len(8 << 30)
        .unwrap();
    let t = DiskTier::open(dir.path(), small).unwrap();
    let s = t.counts();
    assert_eq!(
        (s.entries, s.evictions, s.oversized_ignored),
        (40, 0, 1),
        "{s:?}"
    );
    // A capacity smaller than the largest pack table holds one chunk a pack.
    assert_eq!(s.bytes, 40 * DiskTier::pack_bytes(&[CHUNK as u64]));
    let got = t.get(&ks, &CancelToken::new()).unwrap();
    assert_eq!(got.iter().filter(|v| v.is_some()).count(), 40);
    // Left alone, not read.
    assert!(planted.exists());
}

/// A rescan (what a tier probing for other writers' packs runs) deletes no temporary file:
/// one may be a put in flight, whose link into place would then fail. Puts racing a thread
/// that rescans without pause all land.
#[test]
fn a_rescan_racing_puts_deletes_none_of_their_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    let big = 64 << 10;
    let t = std::sync::Arc::new(
        DiskTier::open(
            dir.path(),
            cfg().with_capacity_bytes(1 << 30).with_max_value_bytes(big),
        )
        .unwrap(),
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rescans = {
        let (t, stop) = (t.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                t.rescan().unwrap();
                n += 1;
            }
            n
        })
    };
    let ks = keys(60 * 8);
    for put in ks.chunks(8) {
        let chunks: Vec<_> = put.iter().map(|&k| (k, vec![7u8; big as usize])).collect();
        t.put(&chunks).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(rescans.join().unwrap() > 0);
    assert_eq!(t.counts().write_errors, 0, "{:?}", t.counts());
    let got = t.get(&ks, &CancelToken::new()).unwrap();
    assert_eq!(got.iter().filter(|v| v.is_some()).count(), ks.len());
}

/// A `*.tmp` entry the tier cannot remove (here a directory of that name) does not stop it
/// opening: it is no pack and nothing reads it.
#[test]
fn a_temporary_it_cannot_remove_does_not_stop_an_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let t = DiskTier::open(dir.path(), cfg()).unwrap();
        t.put(&[(keys(1)[0], vec![1u8; CHUNK])]).unwrap();
    }
    let root = fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.path().is_dir())
        .map_or_else(|| dir.path().to_path_buf(), |e| e.path());
    fs::create_dir(root.join("0000000000000001.1234.tmp")).unwrap();
    let t = DiskTier::open(dir.path(), cfg()).unwrap();
    assert_eq!(t.counts().entries, 1);
}

#[test]
fn a_value_longer_than_its_callers_store_is_refused_unread() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = DiskTier::open(dir.path(), DiskConfig::default().with_fsync(false)).expect("open");
    let big = vec![7u8; 1 << 20];
    t.put(&[(ChunkKey(1), big.clone())]).expect("put");
    let c = CancelToken::new();
    assert_eq!(
        t.get(&[ChunkKey(1)], &c).expect("get"),
        vec![Some(big.clone())]
    );
    // A caller storing chunks of at most 4 KiB: a 1 MiB value is none of its, and is not read.
    t.expect_values_up_to(4096);
    assert_eq!(t.get(&[ChunkKey(1)], &c).expect("get"), vec![None]);
    assert_eq!(t.counts().refused_reads, 1);
    // Another caller, storing larger values: the largest word counts.
    t.expect_values_up_to(2 << 20);
    assert_eq!(t.get(&[ChunkKey(1)], &c).expect("get"), vec![Some(big)]);
}

/// Three tiers on one directory: `a` (`a_cap` bytes: at two values' worth, too little for
/// a table of many beside them, each value is a pack of its own), `b` (one value), `c`
/// (plenty). `b` evicts `a`'s first pack,
/// then `c`, which opened on the empty directory, puts a pack under the number that pack
/// had. Returns the tiers, the keys, `a`'s first pack's path and the value of a key.
fn number_reused(
    dir: &Path,
    a_cap: u64,
) -> (
    DiskTier,
    DiskTier,
    Vec<ChunkKey>,
    std::path::PathBuf,
    impl Fn(u128) -> Vec<u8>,
) {
    let with_cap = |cap| {
        DiskConfig::default()
            .with_capacity_bytes(cap)
            .with_max_value_bytes(CHUNK as u64)
            .with_fsync(false)
    };
    let one = DiskTier::pack_bytes(&[CHUNK as u64]);
    let value = |k: u128| vec![k as u8; CHUNK];
    let a = DiskTier::open(dir, with_cap(a_cap)).expect("a");
    let b = DiskTier::open(dir, with_cap(one + 100)).expect("b");
    let c = DiskTier::open(dir, with_cap(1 << 20)).expect("c");
    let ks = keys(9);
    a.put(&[(ks[0], value(1)), (ks[1], value(2))])
        .expect("a put");
    let a_pack = a.pack_path(ks[0]).expect("indexed");
    b.rescan().expect("b rescan");
    b.put(&[(ks[2], value(3))]).expect("b put");
    b.put(&[(ks[8], value(9))]).expect("b put");
    assert!(!a_pack.exists(), "b evicted a's pack");
    c.put(&[(ks[6], value(7))]).expect("c put");
    assert!(
        c.pack_path(ks[6]) == Some(a_pack.clone()),
        "the number is reused"
    );
    (a, c, ks, a_pack, value)
}

#[test]
fn a_pack_number_reused_by_another_tier_is_not_read_as_this_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, _c, ks, _, value) = number_reused(dir.path(), 1 << 20);
    let cancel = CancelToken::new();
    // `a`'s key of the deleted pack is a miss, not `c`'s bytes read at `a`'s offset.
    assert_eq!(a.get(&[ks[0]], &cancel).expect("get"), vec![None]);
    // And a rescan indexes the file now under that number: `c`'s pack.
    a.rescan().expect("a rescan");
    assert_eq!(a.get(&[ks[6]], &cancel).expect("get"), vec![Some(value(7))]);
}

#[test]
fn a_pack_number_reused_by_another_tier_is_not_deleted_as_this_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let two = DiskTier::pack_bytes(&[CHUNK as u64]) * 2 + 100;
    let (a, c, ks, a_pack, value) = number_reused(dir.path(), two);
    // `a` makes room for a third value: its oldest pack, by its index, is the first — whose
    // number is `c`'s pack now. That file is left alone.
    a.put(&[(ks[3], value(4))]).expect("a put");
    assert!(a_pack.exists(), "a deleted c's pack");
    let cancel = CancelToken::new();
    assert_eq!(c.get(&[ks[6]], &cancel).expect("get"), vec![Some(value(7))]);
}

#[test]
fn a_pack_number_reused_by_another_tier_is_neither_edited_nor_removed_as_this_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, c, ks, a_pack, value) = number_reused(dir.path(), 1 << 20);
    let cancel = CancelToken::new();
    // What `a` indexed at that number is not there: no edit reads or writes `c`'s bytes.
    let mut seen = None;
    let edited = a
        .edit_stored(ks[0], |v| {
            seen = Some(v.clone());
            v[0] ^= 0xff;
            true
        })
        .expect("edit");
    assert!(!edited && seen.is_none(), "a edited c's pack: saw {seen:?}");
    assert_eq!(c.get(&[ks[6]], &cancel).expect("get"), vec![Some(value(7))]);
    // Nor does a removal delete `c`'s file.
    let (a2, c2, ks2, a_pack2, value2) = number_reused(&dir.path().join("again"), 1 << 20);
    assert!(!a2.remove(ks2[0]).expect("remove"), "removed c's pack");
    assert!(a_pack2.exists());
    assert_eq!(
        c2.get(&[ks2[6]], &cancel).expect("get"),
        vec![Some(value2(7))]
    );
    let _ = (a_pack, a);
}

/// A co-tenant of the directory who creates, ahead of the tier, every temporary name a
/// predictable scheme would give its next puts (`<n>.<pid>.tmp` for the next 256 numbers, as
/// earlier builds named them) makes no put fail: the names carry a part only the process
/// knows (plant `disk-temp-names-foreseeable`).
#[test]
fn temporary_names_taken_ahead_by_a_co_tenant_make_no_put_fail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = DiskTier::open(dir.path(), cfg()).expect("open");
    t.put(&[(keys(1)[0], vec![1u8; CHUNK])]).expect("first put");
    let root = fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(Result::ok)
        .find(|e| e.path().is_dir())
        .map_or_else(|| dir.path().to_path_buf(), |e| e.path());
    for n in 0..256u64 {
        let name = format!("{n:016x}.{}.tmp", std::process::id());
        fs::create_dir(root.join(name)).expect("squat");
    }
    for (i, k) in keys(8).into_iter().enumerate().skip(1) {
        t.put(&[(k, vec![i as u8; CHUNK])])
            .unwrap_or_else(|e| panic!("put {i} failed on a squatted name: {e}"));
    }
    let c = CancelToken::new();
    let got = t.get(&keys(8), &c).expect("get");
    assert!(got.iter().all(Option::is_some), "every put is read back");
}
