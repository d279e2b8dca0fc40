//! Packs damaged at rest, fuzzed: seeded mutations of the pack files a disk tier wrote (cut
//! short, bits flipped in a value or in the table, a chunk's payload length field rewritten,
//! chunk header garbage, bytes appended, grown sparse past the largest pack, emptied), then
//! the directory reopened and every chunk read back and decoded. Nothing panics, every read
//! is bounded by the largest value and returns at once, and every damaged chunk is a miss or
//! a decode error of a known class — never a payload. CI runs a few hundred cases;
//! `KVSCHED_FUZZ_CASES` runs more.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;

use kvsched::kv::{
    ChunkCodec, ChunkErrorClass, ChunkKey, DiskConfig, DiskTier, Tier, HEADER_LEN, MAC_LEN,
};
use kvsched_testkit::SplitMix64;

const PAYLOAD: usize = 256;
/// Chunks per directory (each reopened once).
const BATCH: u64 = 50;
/// What became of the chunks read back.
#[derive(Debug, Default)]
struct Outcomes {
    intact: u64,
    missed: u64,
    format: u64,
    checksum: u64,
    mac: u64,
    key: u64,
}

/// Damages the pack file at `path`, whose chunk `value` lies at `off`, by mutation `kind`
/// (drawn from `rng`).
fn mutate(path: &Path, off: usize, value: &[u8], kind: u64, rng: &mut SplitMix64) {
    if fs::metadata(path).expect("stat pack").len() > 1 << 20 {
        return; // already grown sparse past the largest pack by another chunk's mutation
    }
    let mut v = fs::read(path).expect("read pack");
    let len = v.len() as u64;
    let chunk = off..off + value.len();
    if matches!(kind, 1..=3) && v.len() < chunk.end {
        return; // another chunk's mutation already cut the pack before this one's end
    }
    match kind {
        0 => v.truncate(rng.below(len) as usize),
        1 => {
            for _ in 0..=rng.below(8) {
                let at = chunk.start + rng.below(value.len() as u64) as usize;
                v[at] ^= 1 << rng.below(8);
            }
        }
        2 => {
            // The chunk's payload length field (offset 32, 8 bytes little-endian).
            let n = match rng.below(4) {
                0 => u64::MAX,
                1 => rng.next_u64(),
                2 => (PAYLOAD as u64).wrapping_add(rng.below(16)).wrapping_sub(8),
                _ => 0,
            };
            v[off + 32..off + 40].copy_from_slice(&n.to_le_bytes());
        }
        3 => {
            for _ in 0..=rng.below(16) {
                let at = off + rng.below(HEADER_LEN as u64) as usize;
                v[at] = rng.next_u64() as u8;
            }
        }
        4 => {
            for _ in 0..=rng.below(64) {
                v.push(rng.next_u64() as u8);
            }
        }
        5 => {
            let f = fs::OpenOptions::new().write(true).open(path).expect("open");
            f.set_len(1 << 30).expect("grow sparse");
            return;
        }
        6 => v.clear(),
        7 if !v.is_empty() => {
            // The pack's table: its head, entries or checksum.
            let table = DiskTier::pack_bytes(&[0]) as usize;
            let at = rng.below(table.min(v.len()) as u64) as usize;
            v[at] ^= 1 << rng.below(8);
        }
        _ => return, // left as written: the control
    }
    fs::write(path, &v).expect("write");
}

/// Whether the bytes at `off` of the file at `path` are still `value` (read without reading
/// a sparse file whole).
fn still_there(path: &Path, off: usize, value: &[u8]) -> bool {
    let Ok(mut f) = fs::File::open(path) else {
        return false;
    };
    let mut got = vec![0u8; value.len()];
    f.seek(SeekFrom::Start(off as u64)).is_ok() && f.read_exact(&mut got).is_ok() && got == value
}

#[test]
fn damaged_packs_are_misses_or_counted_errors() {
    let cases: u64 = std::env::var("KVSCHED_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut rng = SplitMix64::new(0xC4A2_F11E);
    let mut seen = Outcomes::default();
    let never = CancelToken::new();
    let mut done = 0;
    while done < cases {
        let n = BATCH.min(cases - done);
        let mac = rng.below(2) == 0;
        let codec = ChunkCodec::new(mac.then_some([7u8; 32]));
        let largest = (HEADER_LEN + MAC_LEN + PAYLOAD) as u64;
        let cfg = DiskConfig::default()
            .with_capacity_bytes(64 << 20)
            .with_max_value_bytes(largest)
            .with_fsync(false);
        let dir = tempfile::tempdir().expect("tempdir");
        let tier = DiskTier::open(dir.path(), cfg).expect("open");
        // (key, payload, value, its offset in its pack); puts of one to three chunks, so a
        // pack's damage reaches the chunks it shares the file with.
        let mut written = Vec::new();
        let mut i = 0;
        while i < n {
            let k = (1 + rng.below(3)).min(n - i);
            let mut batch = Vec::new();
            for j in 0..k {
                let key = ChunkKey(u128::from(rng.next_u64()) << 64 | u128::from(i + j));
                let payload: Vec<u8> = (0..PAYLOAD).map(|_| rng.next_u64() as u8).collect();
                let value = codec.encode(key, 0, 16, &payload);
                batch.push((key, payload, value));
            }
            let chunks: Vec<_> = batch.iter().map(|(k, _, v)| (*k, v.clone())).collect();
            tier.put(&chunks).expect("put");
            let mut off = DiskTier::pack_bytes(&vec![0; batch.len()]) as usize;
            for (key, payload, value) in batch {
                let len = value.len();
                written.push((key, payload, value, off));
                off += len;
            }
            i += k;
        }
        // Damage the packs behind the tier's back, one mutation per chunk.
        for (key, _, value, off) in &written {
            let path = tier.pack_path(*key).expect("held");
            let kind = rng.below(9);
            mutate(&path, *off, value, kind, &mut rng);
        }
        let damaged: Vec<bool> = written
            .iter()
            .map(|(key, _, value, off)| {
                let path = tier.pack_path(*key).expect("held");
                !still_there(&path, *off, value)
            })
            .collect();
        drop(tier);
        let t = Instant::now();
        let tier = DiskTier::open(dir.path(), cfg).expect("reopen");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "reopen took {:?}",
            t.elapsed()
        );
        for ((key, payload, _, _), damaged) in written.iter().zip(damaged) {
            let t = Instant::now();
            let got = tier.get(&[*key], &never).expect("get");
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "read took {:?}",
                t.elapsed()
            );
            let Some(value) = got.into_iter().next().flatten() else {
                seen.missed += 1;
                continue;
            };
            assert!(value.len() as u64 <= largest, "read {} bytes", value.len());
            match codec.decode(&value, *key, 0, PAYLOAD as u64) {
                Ok(p) => {
                    assert!(!damaged, "a damaged chunk decoded: {key}");
                    assert_eq!(p, &payload[..]);
                    seen.intact += 1;
                }
                Err(e) => {
                    assert!(damaged, "an intact chunk refused: {e}");
                    match e.class() {
                        ChunkErrorClass::Format => seen.format += 1,
                        ChunkErrorClass::Checksum => seen.checksum += 1,
                        ChunkErrorClass::Mac => seen.mac += 1,
                        ChunkErrorClass::KeyMismatch => seen.key += 1,
                    }
                }
            }
        }
        done += n;
    }
    let s = &seen;
    eprintln!("{cases} chunks in damaged packs: {s:?}");
    assert_eq!(
        s.intact + s.missed + s.format + s.checksum + s.mac + s.key,
        cases,
        "{s:?}"
    );
    // Every mutation kind came up often enough to leave each outcome seen.
    if cases >= 200 {
        assert!(s.intact > 0 && s.missed > 0, "{s:?}");
        assert!(s.format > 0 && s.checksum > 0, "{s:?}");
    }
}
