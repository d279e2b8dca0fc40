//! Hostile stores under `TierConnector`: chunks of other keys, cut short, random, forged
//! without the MAC key, answers of the wrong length, errors, panics, hangs, a `read_with`
//! that lies. The engine of `support` checks every byte it reads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use kvsched::connector::CancelToken;
use kvsched::kv::{
    ChunkCodec, ChunkHeader, ChunkKey, MemoryTier, Tier, TierConnector, TierConnectorConfig,
    TierError,
};
use kvsched::{CacheGroup, MambaMode, Settings};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Bad {
    Foreign,
    Truncate,
    Garbage,
    FlipLast,
    ShortVec,
    LongVec,
    Error,
    Panic,
    Hang,
    ForgeWrongMac,
    ReadTwice,
    ReadNone,
    ExistsLie,
}

struct BadTier {
    inner: MemoryTier,
    bad: Bad,
    armed: AtomicBool,
    calls: AtomicU64,
    stored: Mutex<Vec<(ChunkKey, Vec<u8>)>>,
}

impl BadTier {
    fn new(bad: Bad) -> Arc<Self> {
        Arc::new(BadTier {
            inner: MemoryTier::new(64 << 20, 4),
            bad,
            armed: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            stored: Mutex::new(Vec::new()),
        })
    }
    /// Every other armed call misbehaves.
    fn hostile_now(&self) -> bool {
        self.armed.load(Ordering::SeqCst) && self.calls.fetch_add(1, Ordering::SeqCst) % 2 == 0
    }
    fn other_value(&self, key: ChunkKey) -> Vec<u8> {
        let s = self.stored.lock().unwrap();
        s.iter()
            .find(|(k, _)| *k != key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }
    fn damage(&self, key: ChunkKey, v: &mut Vec<u8>) {
        match self.bad {
            Bad::Foreign => *v = self.other_value(key),
            Bad::Truncate => v.truncate(v.len() / 2),
            Bad::Garbage => {
                let mut h = 7u64;
                for b in v.iter_mut() {
                    h = mix(h, 1);
                    *b = h as u8;
                }
            }
            Bad::FlipLast => {
                if let Some(b) = v.last_mut() {
                    *b ^= 0x40;
                }
            }
            Bad::ForgeWrongMac => {
                let hd = ChunkHeader::parse(v).unwrap();
                let forger = ChunkCodec::new(Some([9u8; 32]));
                *v = forger.encode(
                    hd.key,
                    hd.group,
                    hd.tokens,
                    &vec![0x33u8; hd.payload_len as usize],
                );
            }
            _ => {}
        }
    }
}

impl Tier for BadTier {
    fn name(&self) -> &str {
        "bad"
    }
    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        if self.bad == Bad::ExistsLie && self.armed.load(Ordering::SeqCst) {
            return Ok(vec![true; keys.len() + 3]);
        }
        self.inner.exists(keys, cancel)
    }
    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        let mut v = self.inner.get(keys, cancel)?;
        if !self.hostile_now() {
            return Ok(v);
        }
        match self.bad {
            Bad::ShortVec => {
                v.pop();
            }
            Bad::LongVec => {
                let extra = self.other_value(keys[0]);
                v.push(Some(extra.clone()));
                v.insert(0, Some(extra));
            }
            Bad::Error => return Err(TierError::Unavailable("hostile".into())),
            Bad::Panic => panic!("hostile tier panics in get"),
            Bad::Hang => std::thread::sleep(Duration::from_millis(400)),
            _ => {
                for (k, x) in keys.iter().zip(v.iter_mut()) {
                    if let Some(x) = x {
                        self.damage(*k, x);
                    }
                }
            }
        }
        Ok(v)
    }
    fn read_with(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, TierError> {
        let v = self.inner.get(&[key], cancel)?.pop().flatten();
        let Some(v) = v else { return Ok(false) };
        if self.hostile_now() {
            match self.bad {
                Bad::ReadNone => return Ok(true),
                Bad::ReadTwice => {
                    f(&v);
                    f(&self.other_value(key));
                    return Ok(true);
                }
                Bad::Panic => panic!("hostile tier panics in read_with"),
                _ => {}
            }
        }
        f(&v);
        Ok(true)
    }
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        self.stored.lock().unwrap().extend(chunks.iter().cloned());
        self.inner.put(chunks)
    }
    fn may_block(&self) -> bool {
        self.bad == Bad::Hang
    }
    fn reads_in_place(&self) -> bool {
        matches!(self.bad, Bad::ReadTwice | Bad::ReadNone)
    }
}

fn groups() -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(12),
        CacheGroup::sliding_window(8, 20),
        CacheGroup::mamba(24, MambaMode::Align),
    ]
}

/// Fills the tier honestly, arms it, and runs requests on the same prefixes through a fresh
/// runtime: half the loads asynchronous, half inside the step.
fn run_against(bad: Bad, mac: bool) -> (Engine, Arc<TierConnector>, kvsched::Report) {
    let g = groups();
    let pool = 1024;
    let tier = BadTier::new(bad);
    let mut eng = Engine::new(g.clone(), pool);
    let mut cfg = TierConnectorConfig::default()
        .with_groups(g.clone())
        .with_async_ratio(0.5)
        .with_probe_on_miss(false);
    if mac {
        cfg = cfg.with_mac_key(Some([1u8; 32]));
    }
    let tc = Arc::new(TierConnector::new(tier.clone(), Arc::clone(&eng.mem), cfg).unwrap());
    eng.tier_conn = Some(tc.clone());
    eng.sync_conn = Some(tc.clone());
    let mut rt = builder(&g, pool).connector(tc.clone()).build().unwrap();
    for i in 0..4u32 {
        eng.submit(&rt, &format!("w{i}"), prompt(i, 96, 900 + i, 110), 2);
    }
    assert!(eng.run_until_idle(&mut rt, Duration::from_secs(10)));
    eng.flush();
    assert_report_clean(&rt.shutdown(), pool);
    tier.armed.store(true, Ordering::SeqCst);
    let s = Settings::default().with_load_deadline(Some(Duration::from_millis(100)));
    let mut rt = builder(&g, pool)
        .settings(s)
        .connector(tc.clone())
        .build()
        .unwrap();
    for i in 0..16u32 {
        eng.submit(
            &rt,
            &format!("h{i}"),
            prompt(i % 4, 96, i, 100 + (i as usize % 3) * 7),
            3,
        );
    }
    assert!(
        eng.run_until_idle(&mut rt, Duration::from_secs(20)),
        "requests never ended against {bad:?}: {:?}",
        rt.metrics()
    );
    let r = rt.shutdown();
    (eng, tc, r)
}

fn check(bad: Bad, mac: bool) {
    let (eng, tc, r) = run_against(bad, mac);
    eng.assert_clean();
    assert_report_clean(&r, 1024);
    assert_eq!(r.metrics.finished, 16, "{bad:?}: {r}");
    let c = tc.counts();
    let caught = c.missing_chunks
        + c.checksum_failures
        + c.key_mismatches
        + c.mac_failures
        + c.format_errors
        + c.tier_errors
        + c.loads_late;
    // A second callback and a wrong-length exists may be ignored outright: the bytes are
    // what the test asserts, above.
    if !matches!(bad, Bad::ExistsLie | Bad::ReadTwice) {
        assert!(
            caught > 0,
            "{bad:?}: the store's hostility never showed: {c:?}"
        );
        assert!(
            r.metrics.loads_failed + r.metrics.sync_loads_failed > 0,
            "{bad:?}: no load failed: {:?}",
            r.metrics
        );
    }
}

#[test]
fn tier_returning_other_keys_chunks_is_caught() {
    check(Bad::Foreign, false);
}

#[test]
fn tier_returning_truncated_chunks_is_caught() {
    check(Bad::Truncate, false);
}

#[test]
fn tier_returning_random_bytes_is_caught() {
    check(Bad::Garbage, false);
}

#[test]
fn tier_flipping_a_payload_bit_is_caught() {
    check(Bad::FlipLast, false);
}

#[test]
fn tier_answering_too_few_values_is_caught() {
    check(Bad::ShortVec, false);
}

#[test]
fn tier_answering_too_many_values_is_caught() {
    check(Bad::LongVec, false);
}

#[test]
fn tier_errors_fail_the_load() {
    check(Bad::Error, false);
}

#[test]
fn tier_panics_fail_the_load() {
    check(Bad::Panic, false);
}

#[test]
fn hung_tier_costs_a_load_its_deadline() {
    check(Bad::Hang, false);
}

#[test]
fn forged_chunk_without_the_mac_key_is_caught() {
    check(Bad::ForgeWrongMac, true);
}

#[test]
fn read_with_calling_back_twice_is_caught() {
    check(Bad::ReadTwice, false);
}

#[test]
fn read_with_claiming_a_chunk_it_never_handed_over_is_caught() {
    check(Bad::ReadNone, false);
}

#[test]
fn exists_answering_the_wrong_length_is_harmless() {
    check(Bad::ExistsLie, false);
}
