//! The disk tier: capacity and eviction, reopening, stale temporary files, damage at rest,
//! concurrent use, and a process killed with SIGKILL in the middle of saving. A put of one
//! chunk makes a pack of its own, so most tests here see one file per chunk, as they did
//! when every chunk had its own file.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use kvsched::connector::CancelToken;
use kvsched::kv::{ChunkCodec, ChunkError, ChunkKey, DiskConfig, DiskTier, Tier, TierError};

const TAG: u64 = 0x6b76;

fn key(i: u64) -> ChunkKey {
    ChunkKey::chain(ChunkKey::ROOT, TAG, 0, &[i as u32, (i >> 32) as u32])
}

/// A payload that names its index in its first 8 bytes, the rest derived from it.
fn payload(i: u64, len: usize) -> Vec<u8> {
    let mut p: Vec<u8> = (0..len).map(|j| (i as usize * 131 + j * 7) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

fn chunk(codec: &ChunkCodec, i: u64, len: usize) -> (ChunkKey, Vec<u8>) {
    (key(i), codec.encode(key(i), 0, 16, &payload(i, len)))
}

fn cfg(capacity_bytes: u64) -> DiskConfig {
    DiskConfig::default()
        .with_capacity_bytes(capacity_bytes)
        .with_max_value_bytes(capacity_bytes)
        .with_fsync(false)
}

fn get1(t: &DiskTier, k: ChunkKey) -> Option<Vec<u8>> {
    t.get(&[k], &CancelToken::new()).unwrap().pop().flatten()
}

/// Every regular file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    files(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "tmp"))
        .collect()
}

#[test]
fn capacity_is_kept_by_evicting_the_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let codec = ChunkCodec::new(None);
    let one = DiskTier::pack_bytes(&[codec.encoded_len(1000) as u64]);
    let t = DiskTier::open(dir.path(), cfg(10 * one)).unwrap();
    for i in 0..10 {
        t.put(&[chunk(&codec, i, 1000)]).unwrap();
    }
    assert!(get1(&t, key(0)).is_some()); // 0 becomes the most recently used
    for i in 10..15 {
        t.put(&[chunk(&codec, i, 1000)]).unwrap();
        assert!(t.counts().bytes <= 10 * one);
    }
    let held = t
        .exists(&(0..15).map(key).collect::<Vec<_>>(), &CancelToken::new())
        .unwrap();
    let want: Vec<bool> = (0..15).map(|i| i == 0 || i >= 6).collect();
    assert_eq!(held, want);
    let s = t.counts();
    assert_eq!((s.evictions, s.entries, s.bytes), (5, 10, 10 * one));
    let on_disk: u64 = files(dir.path())
        .iter()
        .map(|p| p.metadata().unwrap().len())
        .sum();
    assert_eq!(on_disk, s.bytes);
    assert_eq!(get1(&t, key(1)), None);
    assert_eq!(t.counts().misses, 1);
}

#[test]
fn an_oversized_value_is_refused_and_the_rest_stored() {
    let dir = tempfile::tempdir().unwrap();
    // Room for one pack of a 100-byte value.
    let t = DiskTier::open(dir.path(), cfg(DiskTier::pack_bytes(&[100]))).unwrap();
    let r = t.put(&[(key(1), vec![0; 101]), (key(2), vec![0; 100])]);
    assert!(matches!(r, Err(TierError::Refused(m)) if m.contains("101 bytes")));
    assert_eq!(get1(&t, key(2)), Some(vec![0; 100]));
    assert_eq!(get1(&t, key(1)), None);
}

#[test]
fn reopen_finds_and_verifies_what_was_saved() {
    let dir = tempfile::tempdir().unwrap();
    let codec = ChunkCodec::new(Some([9; 32]));
    {
        let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
        let batch: Vec<_> = (0..20).map(|i| chunk(&codec, i, 3000)).collect();
        t.put(&batch).unwrap();
    }
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    let mut keys = t.keys();
    keys.sort();
    let mut want: Vec<_> = (0..20).map(key).collect();
    want.sort();
    assert_eq!(keys, want);
    // One put, one pack.
    assert_eq!(
        t.counts().bytes,
        DiskTier::pack_bytes(&[codec.encoded_len(3000) as u64; 20])
    );
    assert_eq!(files(dir.path()).len(), 1);
    let got = t
        .get(&(0..20).map(key).collect::<Vec<_>>(), &CancelToken::new())
        .unwrap();
    for (i, v) in got.iter().enumerate() {
        let v = v.as_ref().unwrap();
        let p = codec.decode(v, key(i as u64), 0, 3000).unwrap();
        assert_eq!(p, &payload(i as u64, 3000)[..]);
    }
}

#[test]
fn reopen_over_capacity_evicts_the_oldest_files() {
    let dir = tempfile::tempdir().unwrap();
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    for i in 0..10 {
        t.put(&[(key(i), vec![i as u8; 100])]).unwrap();
        // Modification times from the index, oldest first: 0 is the oldest.
        let f = fs::File::options()
            .write(true)
            .open(t.pack_path(key(i)).unwrap())
            .unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + i))
            .unwrap();
    }
    drop(t);
    // Room for six of the ten packs.
    let t = DiskTier::open(dir.path(), cfg(6 * DiskTier::pack_bytes(&[100]) + 50)).unwrap();
    let held = t
        .exists(&(0..10).map(key).collect::<Vec<_>>(), &CancelToken::new())
        .unwrap();
    assert_eq!(held, (0..10).map(|i| i >= 4).collect::<Vec<_>>());
    assert_eq!(t.counts().evictions, 4);
    assert_eq!(files(dir.path()).len(), 6);
}

#[test]
fn stale_temp_files_are_removed_at_open_and_foreign_files_kept() {
    let dir = tempfile::tempdir().unwrap();
    {
        let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
        t.put(&[(key(1), vec![1; 10])]).unwrap();
    }
    let root = dir.path();
    fs::write(root.join("0000000000000007.tmp"), b"half a pac").unwrap();
    fs::write(root.join("x.tmp"), b"").unwrap();
    // A put in flight in a live process (this one: another tier on the directory) is left
    // alone; a dead process's is deleted.
    let live = root.join(format!("0000000000000008.{}.tmp", std::process::id()));
    fs::write(&live, b"a pack being written").unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = root.join(format!("0000000000000009.{}.tmp", child.id()));
    child.wait().unwrap();
    fs::write(&dead, b"a pack never finished").unwrap();
    fs::write(root.join("README"), b"keep me").unwrap();
    // A chunk file of the earlier one-file-per-chunk layout: left alone, not counted.
    let old = root.join(&format!("{}", key(2))[..2]);
    fs::create_dir_all(&old).unwrap();
    fs::write(old.join(format!("{}.chunk", key(2))), b"an old chunk").unwrap();
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    assert_eq!(t.counts().stale_temps_removed, 3);
    assert_eq!(temp_files(dir.path()), vec![live]);
    assert!(root.join("README").exists() && old.join(format!("{}.chunk", key(2))).exists());
    assert_eq!(
        (t.counts().entries, t.counts().bytes),
        (1, DiskTier::pack_bytes(&[10]))
    );
    assert_eq!(get1(&t, key(1)), Some(vec![1; 10]));
    assert_eq!(get1(&t, key(2)), None);
}

/// The offset of the first value in a pack of one.
fn first_value() -> usize {
    DiskTier::pack_bytes(&[0]) as usize
}

#[test]
fn a_pack_cut_or_damaged_at_rest_is_caught_by_the_codec() {
    let dir = tempfile::tempdir().unwrap();
    let codec = ChunkCodec::new(None);
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    t.put(&[chunk(&codec, 1, 500)]).unwrap();
    t.put(&[chunk(&codec, 2, 500)]).unwrap();
    let p1 = t.pack_path(key(1)).unwrap();
    let full = fs::read(&p1).unwrap();
    fs::write(&p1, &full[..first_value() + 300]).unwrap();
    let v = get1(&t, key(1)).unwrap();
    assert!(matches!(
        codec.decode(&v, key(1), 0, 500),
        Err(ChunkError::Truncated { have: 300, .. })
    ));
    let p2 = t.pack_path(key(2)).unwrap();
    let mut b = fs::read(&p2).unwrap();
    b[first_value() + 400] ^= 0x10;
    fs::write(&p2, &b).unwrap();
    let v = get1(&t, key(2)).unwrap();
    assert!(matches!(
        codec.decode(&v, key(2), 0, 500),
        Err(ChunkError::ChecksumMismatch { .. })
    ));
    // At reopen the cut pack's table points past its end: refused, not indexed.
    drop(t);
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    assert_eq!((t.counts().refused_packs, t.counts().entries), (1, 1));
}

#[test]
fn a_damaged_pack_table_is_refused_at_open_and_the_other_packs_kept() {
    let dir = tempfile::tempdir().unwrap();
    let codec = ChunkCodec::new(None);
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    t.put(&[chunk(&codec, 1, 500), chunk(&codec, 2, 500)])
        .unwrap();
    t.put(&[chunk(&codec, 3, 500)]).unwrap();
    let p = t.pack_path(key(1)).unwrap();
    assert_eq!(t.pack_path(key(2)), Some(p.clone()), "one put, one pack");
    drop(t);
    let mut b = fs::read(&p).unwrap();
    b[20] ^= 1; // the first entry's key
    fs::write(&p, &b).unwrap();
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    let s = t.counts();
    assert_eq!((s.refused_packs, s.entries), (1, 1), "{s:?}");
    assert_eq!(get1(&t, key(1)), None);
    let v = get1(&t, key(3)).unwrap();
    assert_eq!(
        codec.decode(&v, key(3), 0, 500).unwrap(),
        &payload(3, 500)[..]
    );
    assert!(p.exists(), "left alone");
}

#[test]
fn edits_and_removals_at_rest_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    t.put(&[
        (key(1), vec![1; 100]),
        (key(2), vec![2; 100]),
        (key(3), vec![3; 100]),
    ])
    .unwrap();
    assert!(t
        .edit_stored(key(1), |v| {
            v.truncate(40);
            true
        })
        .unwrap());
    assert!(t
        .edit_stored(key(2), |v| {
            v.extend_from_slice(&[9; 20]);
            true
        })
        .unwrap());
    assert!(t.remove(key(3)).unwrap());
    assert!(!t.remove(key(3)).unwrap());
    let check = |t: &DiskTier| {
        assert_eq!(get1(t, key(1)), Some(vec![1; 40]));
        let mut two = vec![2; 100];
        two.extend_from_slice(&[9; 20]);
        assert_eq!(get1(t, key(2)), Some(two));
        assert_eq!(get1(t, key(3)), None);
    };
    check(&t);
    drop(t);
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    check(&t);
    assert_eq!(t.counts().entries, 2);
}

/// A pack whose every chunk was saved again later is deleted; one that still holds a chunk
/// is kept, and both puts' values read back.
#[test]
fn a_pack_superseded_by_later_puts_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    t.put(&[(key(1), vec![1; 10]), (key(2), vec![2; 10])])
        .unwrap();
    let first = t.pack_path(key(1)).unwrap();
    t.put(&[(key(1), vec![3; 10])]).unwrap();
    assert!(first.exists(), "still holds key 2");
    t.put(&[(key(2), vec![4; 10])]).unwrap();
    assert!(!first.exists(), "every key saved again");
    assert_eq!(files(dir.path()).len(), 2);
    assert_eq!(
        (get1(&t, key(1)), get1(&t, key(2))),
        (Some(vec![3; 10]), Some(vec![4; 10]))
    );
    let s = t.counts();
    assert_eq!(
        (s.entries, s.bytes, s.evictions),
        (2, 2 * DiskTier::pack_bytes(&[10]), 0)
    );
}

/// A batch larger than a pack takes several, and each value reads back.
#[test]
fn a_large_batch_is_split_into_packs() {
    let dir = tempfile::tempdir().unwrap();
    let t = DiskTier::open(dir.path(), cfg(64 << 20)).unwrap();
    let batch: Vec<_> = (0..2100).map(|i| (key(i), payload(i, 64))).collect();
    t.put(&batch).unwrap();
    assert_eq!(files(dir.path()).len(), 3, "at most 1,024 chunks a pack");
    let got = t
        .get(&(0..2100).map(key).collect::<Vec<_>>(), &CancelToken::new())
        .unwrap();
    for (i, v) in got.into_iter().enumerate() {
        assert_eq!(v, Some(payload(i as u64, 64)), "chunk {i}");
    }
}

#[test]
fn a_file_deleted_behind_the_tier_is_a_miss_and_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    t.put(&[(key(1), vec![1; 10])]).unwrap();
    fs::remove_file(t.pack_path(key(1)).unwrap()).unwrap();
    assert_eq!(get1(&t, key(1)), None);
    assert_eq!((t.counts().entries, t.counts().bytes), (0, 0));
}

#[test]
fn get_stops_when_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let t = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    t.put(&[(key(1), vec![1; 10])]).unwrap();
    let c = CancelToken::new();
    c.cancel();
    assert!(matches!(t.get(&[key(1)], &c), Err(TierError::Cancelled)));
    assert_eq!(t.counts().hits, 0);
}

#[test]
fn an_unusable_root_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    fs::write(&file, b"").unwrap();
    let e = DiskTier::open(&file, cfg(1 << 20)).unwrap_err();
    assert!(
        matches!(&e, TierError::Unavailable(m) if m.contains("plain-file")),
        "{e}"
    );
}

#[test]
fn concurrent_puts_and_gets_keep_the_index_and_files_in_agreement() {
    let dir = tempfile::tempdir().unwrap();
    let t = std::sync::Arc::new(DiskTier::open(dir.path(), cfg(40 * 1000)).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|th| {
            let t = t.clone();
            std::thread::spawn(move || {
                for i in 0..150u64 {
                    let k = key((i * 7 + th) % 60);
                    t.put(&[(k, vec![th as u8; 1000])]).unwrap();
                    let _ = t.get(&[key(i % 60)], &CancelToken::new()).unwrap();
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let s = t.counts();
    assert!(s.bytes <= 40 * 1000);
    let on_disk = files(dir.path());
    assert_eq!(on_disk.len() as u64, s.entries);
    let bytes: u64 = on_disk.iter().map(|p| p.metadata().unwrap().len()).sum();
    assert_eq!(bytes, s.bytes);
    assert!(temp_files(dir.path()).is_empty());
}

const CHILD_ENV: &str = "KVSCHED_DISK_CRASH_CHILD";
const CRASH_TEST: &str = "sigkill_mid_save_leaves_only_whole_chunks";
const CRASH_PAYLOAD: usize = 200 << 10;

/// The child role: saves chunks into `dir` until killed (or a bound it never reaches in
/// practice), printing `saved <n>` after each put returns. The chunks are encoded up front,
/// so a put is all I/O and a kill most likely lands inside one; the same keys are saved
/// over and over, so a kill can also land inside the replacement of a file. With `fsync`
/// the window between creating a temporary file and renaming it is wider still.
fn crash_child(dir: &Path, start: u64, fsync: bool) {
    let codec = ChunkCodec::new(None);
    let cfg = cfg(64 * CRASH_PAYLOAD as u64).with_fsync(fsync);
    let t = DiskTier::open(dir, cfg).unwrap();
    let chunks: Vec<_> = (start..start + 80)
        .map(|i| chunk(&codec, i, CRASH_PAYLOAD))
        .collect();
    for n in 0..1_000_000usize {
        // Batches of two, so a kill can land between the puts of one call too.
        let j = (n * 2) % chunks.len();
        t.put(&chunks[j..j + 2]).unwrap();
        println!("saved {n}");
    }
}

#[test]
fn sigkill_mid_save_leaves_only_whole_chunks() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let mut parts = spec.splitn(3, ':');
        let (start, fsync, dir) = (parts.next(), parts.next(), parts.next());
        crash_child(
            Path::new(dir.unwrap()),
            start.unwrap().parse().unwrap(),
            fsync == Some("1"),
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let codec = ChunkCodec::new(None);
    let exe = std::env::current_exe().unwrap();
    let mut temps_seen = 0;
    for round in 0..4u64 {
        let start = round * 1000;
        let mut child = Command::new(&exe)
            .args(["--exact", CRASH_TEST, "--nocapture", "--test-threads=1"])
            .env(
                CHILD_ENV,
                format!("{start}:{}:{}", round % 2, dir.path().display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The pipe stays open until the child is dead: closing it first would end the child
        // at its next print (a broken pipe), between two puts instead of inside one.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Let it save a varying number of batches, then kill it wherever it is.
        let want = 20 + round * 13;
        let mut saved = 0;
        while saved < want {
            match lines.next() {
                Some(Ok(line)) if line.contains("saved ") => saved += 1,
                Some(_) => {}
                None => panic!("the child stopped early: {:?}", child.wait()),
            }
        }
        // Reading the line woke this thread as the child went on; give the child a moment
        // (a different one each round) to be inside a later put, then kill it there.
        std::thread::sleep(Duration::from_micros(200 + 900 * round));
        child.kill().unwrap(); // SIGKILL on Unix
        let status = child.wait().unwrap();
        drop(lines);
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.signal(),
                Some(9),
                "the child was not killed: {status:?}"
            );
        }
        temps_seen += temp_files(dir.path()).len();

        let t = DiskTier::open(dir.path(), cfg(64 * CRASH_PAYLOAD as u64)).unwrap();
        assert!(
            temp_files(dir.path()).is_empty(),
            "round {round}: temp files remain"
        );
        let keys = t.keys();
        assert!(!keys.is_empty(), "round {round}: nothing survived");
        let got = t.get(&keys, &CancelToken::new()).unwrap();
        let (mut whole, mut caught) = (0, 0);
        for (k, v) in keys.iter().zip(got) {
            let v = v.expect("an indexed chunk is readable");
            match codec.decode(&v, *k, 0, CRASH_PAYLOAD as u64) {
                Ok(p) => {
                    let i = u64::from_le_bytes(p[..8].try_into().unwrap());
                    assert_eq!(key(i), *k, "a valid chunk under the wrong key");
                    assert_eq!(
                        p,
                        &payload(i, CRASH_PAYLOAD)[..],
                        "a valid-looking wrong payload"
                    );
                    whole += 1;
                }
                Err(e) => {
                    eprintln!("round {round}: chunk {k} caught: {e}");
                    caught += 1;
                }
            }
        }
        // Rename is atomic and a killed process's writes stay in the page cache: no torn
        // pack can exist, so every chunk must be whole (a caught one is a defect of the
        // write protocol, though the codec kept it from being used).
        assert_eq!(caught, 0, "round {round}: torn chunk files after SIGKILL");
        assert!(whole > 0);
        eprintln!(
            "round {round}: {whole} whole chunks, {} bytes",
            t.counts().bytes
        );
    }
    eprintln!("temporary files left by the killed children: {temps_seen}");
}

/// Two tiers on one directory (two engines sharing it): each publishes its packs under
/// numbers the other has not taken, so neither replaces the other's, and a rescan indexes
/// what the other wrote since open.
#[test]
fn two_tiers_on_one_directory_keep_and_find_each_others_packs() {
    let dir = tempfile::tempdir().unwrap();
    let a = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    let b = DiskTier::open(dir.path(), cfg(1 << 20)).unwrap();
    for i in 0..5 {
        a.put(&[(key(i), vec![1; 10])]).unwrap();
        b.put(&[(key(100 + i), vec![2; 10])]).unwrap();
    }
    assert_eq!(files(dir.path()).len(), 10, "no pack replaced another");
    assert_eq!(get1(&a, key(100)), None, "not seen before a rescan");
    assert_eq!(a.rescan().unwrap(), 5);
    assert_eq!(b.rescan().unwrap(), 5);
    assert_eq!(a.rescan().unwrap(), 0, "each pack indexed once");
    for i in 0..5 {
        assert_eq!(get1(&a, key(100 + i)), Some(vec![2; 10]));
        assert_eq!(get1(&b, key(i)), Some(vec![1; 10]));
    }
}
