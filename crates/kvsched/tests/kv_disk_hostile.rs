//! The disk tier against what others plant at a pack's path: a symbolic link to /dev/zero,
//! a FIFO, a sparse 8 GiB file — each read as absent at once, with bounded memory; an
//! oversized file found at open is neither indexed nor counted against the capacity, so it
//! evicts nothing; a rescan racing puts deletes none of their temporary files, and a
//! temporary the tier cannot remove does not stop it opening.

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
