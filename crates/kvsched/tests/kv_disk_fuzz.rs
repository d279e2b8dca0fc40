//! Chunk files damaged at rest, fuzzed: seeded mutations of the files a disk tier wrote
//! (cut short, bits flipped, the payload length field rewritten, header garbage, bytes
//! appended, grown sparse past the largest value, emptied), then the directory reopened and
//! every chunk read back and decoded. Nothing panics, every read is bounded by the largest
//! value and returns at once, and every damaged chunk is a miss or a decode error of a
//! known class — never a payload. CI runs a few hundred cases; `KVSCHED_FUZZ_CASES` runs more.

use std::fs;
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

/// `value`, damaged by mutation `kind` (drawn from `rng`); `None` for "grow it sparse past
/// the largest value" (done on the file itself).
fn mutate(value: &[u8], kind: u64, rng: &mut SplitMix64) -> Option<Vec<u8>> {
    let mut v = value.to_vec();
    let len = v.len() as u64;
    match kind {
        0 => v.truncate(rng.below(len) as usize),
        1 => {
            for _ in 0..=rng.below(8) {
                let at = rng.below(len) as usize;
                v[at] ^= 1 << rng.below(8);
            }
        }
        2 => {
            // The payload length field (offset 32, 8 bytes little-endian).
            let n = match rng.below(4) {
                0 => u64::MAX,
                1 => rng.next_u64(),
                2 => (PAYLOAD as u64).wrapping_add(rng.below(16)).wrapping_sub(8),
                _ => 0,
            };
            v[32..40].copy_from_slice(&n.to_le_bytes());
        }
        3 => {
            for _ in 0..=rng.below(16) {
                let at = rng.below(HEADER_LEN as u64) as usize;
                v[at] = rng.next_u64() as u8;
            }
        }
        4 => {
            for _ in 0..=rng.below(64) {
                v.push(rng.next_u64() as u8);
            }
        }
        5 => return None,
        6 => v.clear(),
        _ => {} // left as written: the control
    }
    Some(v)
}

#[test]
fn damaged_chunk_files_are_misses_or_counted_errors() {
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
        let mut written = Vec::new();
        for i in 0..n {
            let key = ChunkKey(u128::from(rng.next_u64()) << 64 | u128::from(i));
            let payload: Vec<u8> = (0..PAYLOAD).map(|_| rng.next_u64() as u8).collect();
            let value = codec.encode(key, 0, 16, &payload);
            tier.put(&[(key, value.clone())]).expect("put");
            written.push((key, payload, value));
        }
        // Damage the files behind the tier's back.
        let mut damaged = Vec::new();
        for (key, _, value) in &written {
            let path = tier.chunk_path(*key);
            let kind = rng.below(8);
            let now = match mutate(value, kind, &mut rng) {
                Some(v) => {
                    fs::write(&path, &v).expect("write");
                    Some(v)
                }
                None => {
                    let f = fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .expect("open");
                    f.set_len(1 << 30).expect("grow sparse");
                    None
                }
            };
            damaged.push(now.as_deref() != Some(value.as_slice()));
        }
        drop(tier);
        let t = Instant::now();
        let tier = DiskTier::open(dir.path(), cfg).expect("reopen");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "reopen took {:?}",
            t.elapsed()
        );
        for ((key, payload, _), damaged) in written.iter().zip(damaged) {
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
    eprintln!("{cases} damaged chunk files: {s:?}");
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
