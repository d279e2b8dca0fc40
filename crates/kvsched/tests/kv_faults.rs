//! Fault injection: every fault acts on the stored bytes, is caught by the codec (or is a miss,
//! for evict), and is counted; decisions follow the seed.

use std::time::Duration;

use kvsched::connector::CancelToken;
use kvsched::kv::{
    ChunkCodec, ChunkError, ChunkKey, DiskConfig, DiskTier, MemoryTier, Tier, TierError,
};
use kvsched_testkit::{FaultConfig, FaultCounts, FaultTarget, FaultyTier};

const LEN: usize = 4096;

fn key(i: u64) -> ChunkKey {
    ChunkKey::chain(ChunkKey::ROOT, 9, 1, &[i as u32])
}

fn chunks(codec: &ChunkCodec, n: u64) -> Vec<(ChunkKey, Vec<u8>)> {
    (0..n)
        .map(|i| (key(i), codec.encode(key(i), 1, 16, &vec![i as u8; LEN])))
        .collect()
}

/// What each key's load came to: `None` a miss, `Some(Ok(()))` a valid chunk, `Some(Err)`.
type Outcome = Option<Result<(), ChunkError>>;

fn load_all<T: Tier>(t: &T, codec: &ChunkCodec, n: u64) -> Vec<Outcome> {
    let keys: Vec<_> = (0..n).map(key).collect();
    let got = t.get(&keys, &CancelToken::new()).unwrap();
    keys.iter()
        .zip(got)
        .map(|(k, v)| {
            v.map(|v| {
                codec.decode(&v, *k, 1, LEN as u64).map(|p| {
                    assert_eq!(p, &vec![k_index(*k) as u8; LEN][..], "wrong payload");
                })
            })
        })
        .collect()
}

fn k_index(k: ChunkKey) -> u64 {
    (0..1000).find(|&i| key(i) == k).unwrap()
}

fn run<T: FaultTarget>(inner: T, cfg: FaultConfig, n: u64) -> (Vec<Outcome>, FaultCounts) {
    let codec = ChunkCodec::new(Some([4; 32]));
    let t = FaultyTier::new(inner, cfg).unwrap();
    assert!(t.name().ends_with("+faults"));
    t.put(&chunks(&codec, n)).unwrap();
    (load_all(&t, &codec, n), t.counts())
}

fn memory() -> MemoryTier {
    MemoryTier::new(1 << 24, 4)
}

fn each_tier(f: impl Fn(&dyn Fn(FaultConfig, u64) -> (Vec<Outcome>, FaultCounts))) {
    f(&|cfg, n| run(memory(), cfg, n));
    f(&|cfg, n| {
        let dir = tempfile::tempdir().unwrap();
        let disk = DiskTier::open(dir.path(), DiskConfig::default()).unwrap();
        run(disk, cfg, n)
    });
}

#[test]
fn without_faults_every_chunk_loads() {
    each_tier(|run| {
        let (out, counts) = run(FaultConfig::default(), 20);
        assert!(out.iter().all(|o| matches!(o, Some(Ok(())))));
        assert_eq!(counts, FaultCounts::default());
    });
}

#[test]
fn corruption_is_caught_and_counted() {
    each_tier(|run| {
        let cfg = FaultConfig {
            corrupt: 1.0,
            ..FaultConfig::default()
        };
        let (out, counts) = run(cfg, 40);
        assert!(out.iter().all(|o| matches!(o, Some(Err(_)))), "{out:?}");
        assert_eq!(counts.corrupted, 40);
        // Bits flipped in the payload (the bulk of a chunk) fail the checksum.
        let sums = out
            .iter()
            .filter(|o| matches!(o, Some(Err(ChunkError::ChecksumMismatch { .. }))))
            .count();
        assert!(sums > 0);
    });
}

#[test]
fn truncation_is_caught_and_counted() {
    each_tier(|run| {
        let cfg = FaultConfig {
            truncate: 1.0,
            ..FaultConfig::default()
        };
        let (out, counts) = run(cfg, 40);
        assert!(
            out.iter()
                .all(|o| matches!(o, Some(Err(ChunkError::Truncated { .. })))),
            "{out:?}"
        );
        assert_eq!(counts.truncated, 40);
    });
}

#[test]
fn eviction_between_lookup_and_load_is_a_miss_and_counted() {
    each_tier(|run| {
        let cfg = FaultConfig {
            evict: 1.0,
            ..FaultConfig::default()
        };
        let (out, counts) = run(cfg, 40);
        assert!(out.iter().all(Option::is_none));
        assert_eq!(counts.evicted, 40);
    });
}

#[test]
fn decisions_follow_the_seed() {
    let cfg = |seed| FaultConfig {
        seed,
        corrupt: 0.3,
        truncate: 0.3,
        evict: 0.3,
        ..FaultConfig::default()
    };
    let (a, ca) = run(memory(), cfg(1), 200);
    let (b, cb) = run(memory(), cfg(1), 200);
    let dir = tempfile::tempdir().unwrap();
    let disk = DiskTier::open(dir.path(), DiskConfig::default()).unwrap();
    let (d, cd) = run(disk, cfg(1), 200);
    let (c, _) = run(memory(), cfg(2), 200);
    let fates = |v: &[Outcome]| -> Vec<u8> {
        v.iter()
            .map(|o| match o {
                None => 0,
                Some(Ok(())) => 1,
                Some(Err(_)) => 2,
            })
            .collect()
    };
    assert_eq!((fates(&a), ca), (fates(&b), cb));
    assert_eq!(
        (fates(&a), ca),
        (fates(&d), cd),
        "the same decisions on any tier"
    );
    assert_ne!(fates(&a), fates(&c));
    // Each fault class happened, and some keys came through whole.
    for f in 0..3 {
        assert!(fates(&a).contains(&f), "fate {f} never happened");
    }
    // About 30 % of keys each (binomial, 200 draws: far inside 10..=50 %).
    for n in [ca.corrupted, ca.truncated, ca.evicted] {
        assert!((20..=100).contains(&n), "{ca:?}");
    }
}

#[test]
fn a_slow_get_is_delayed_counted_and_cancellable() {
    let codec = ChunkCodec::new(None);
    let cfg = FaultConfig {
        slow: 1.0,
        slow_for: Duration::from_millis(2),
        ..FaultConfig::default()
    };
    let t = FaultyTier::new(memory(), cfg).unwrap();
    t.put(&chunks(&codec, 3)).unwrap();
    let got = t.get(&[key(0), key(1)], &CancelToken::new()).unwrap();
    assert!(got.iter().all(Option::is_some));
    assert_eq!(t.counts().slowed, 1, "one delay per call");

    // An hour-long delay ends as soon as the token fires (the test would hang otherwise).
    let cfg = FaultConfig {
        slow_for: Duration::from_secs(3600),
        ..cfg
    };
    let t = std::sync::Arc::new(FaultyTier::new(memory(), cfg).unwrap());
    t.put(&chunks(&codec, 1)).unwrap();
    let cancel = CancelToken::new();
    let (t2, c2) = (t.clone(), cancel.clone());
    let getter = std::thread::spawn(move || t2.get(&[key(0)], &c2));
    while t.counts().slowed == 0 {
        std::thread::yield_now();
    }
    cancel.cancel();
    assert!(matches!(getter.join().unwrap(), Err(TierError::Cancelled)));
}
