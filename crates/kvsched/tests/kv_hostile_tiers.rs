//! A `TierConnector` over tiers that break the `Tier` contract in the ways the trait allows
//! (a `read_with` that calls its reader twice, or not at all, or says "not held" after
//! calling it; a `get_into` that says "held" over an empty buffer or hands every key the same
//! value; a `get` one value short or long; an `exists` of the wrong length; panics
//! everywhere) and over one that never answers: a load reports Ok only with the saved bytes in
//! every destination, or names the blocks it could not fill; nothing panics or hangs; saves,
//! stores and `save_step` take out-of-range arguments without a panic.

use std::sync::Arc;
use std::time::Duration;

use kvsched::connector::{CancelToken, KvConnector, LoadJob, LoadResult};
use kvsched::kv::{
    ChunkKey, HostKvMemory, KvLayout, KvMemory, MemoryTier, Tier, TierConnector,
    TierConnectorConfig, TierError, POISON_BYTE,
};
use kvsched::{BlockRef, CacheGroup};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Honest,
    /// read_with: the value, then the value with a payload byte flipped.
    ReadTwiceGoodBad,
    ReadTwiceBadGood,
    /// read_with: calls f with the value, says "not held".
    ReadThenDeny,
    /// read_with: never calls f, says "held".
    HeldNoCall,
    /// read_with: f with an empty slice.
    EmptyValue,
    /// get_into: held but the buffer left empty.
    HeldEmpty,
    /// get_into: every buffer holds the first key's value.
    SameValue,
    /// get: one value short / one too many.
    Short,
    Long,
    /// exists: wrong lengths, all true.
    ExistsLies,
    /// Every call panics.
    Panics,
}

struct Hostile {
    inner: MemoryTier,
    mode: Mode,
    in_place: bool,
}

impl Tier for Hostile {
    fn name(&self) -> &str {
        "hostile"
    }
    fn exists(&self, keys: &[ChunkKey], c: &CancelToken) -> Result<Vec<bool>, TierError> {
        match self.mode {
            Mode::ExistsLies => Ok(vec![true; keys.len() * 2 + 1]),
            Mode::Short => Ok(vec![true; keys.len().saturating_sub(1)]),
            Mode::Panics => panic!("exists"),
            _ => self.inner.exists(keys, c),
        }
    }
    fn get(&self, keys: &[ChunkKey], c: &CancelToken) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        let mut v = self.inner.get(keys, c)?;
        match self.mode {
            Mode::Short => {
                v.pop();
            }
            Mode::Long => v.push(v.first().cloned().flatten()),
            Mode::Panics => panic!("get"),
            _ => {}
        }
        Ok(v)
    }
    fn get_into(
        &self,
        keys: &[ChunkKey],
        c: &CancelToken,
        bufs: &mut [Vec<u8>],
        held: &mut [bool],
    ) -> Result<(), TierError> {
        match self.mode {
            Mode::HeldEmpty => {
                for (b, h) in bufs.iter_mut().zip(held.iter_mut()) {
                    b.clear();
                    *h = true;
                }
                Ok(())
            }
            Mode::SameValue => {
                let v = self.inner.get(&keys[..1], c)?;
                for (b, h) in bufs.iter_mut().zip(held.iter_mut()) {
                    *b = v[0].clone().unwrap_or_default();
                    *h = true;
                }
                Ok(())
            }
            Mode::Panics => panic!("get_into"),
            Mode::Short | Mode::Long => {
                // The trait's default path, through our lying get.
                let values = self.get(keys, c)?;
                for ((b, h), v) in bufs.iter_mut().zip(held.iter_mut()).zip(values) {
                    *h = v.is_some();
                    *b = v.unwrap_or_default();
                }
                Ok(())
            }
            _ => self.inner.get_into(keys, c, bufs, held),
        }
    }
    fn read_with(
        &self,
        key: ChunkKey,
        c: &CancelToken,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, TierError> {
        let v = self.inner.get(&[key], c)?.pop().flatten();
        let Some(v) = v else { return Ok(false) };
        let mut bad = v.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        match self.mode {
            Mode::ReadTwiceGoodBad => {
                f(&v);
                f(&bad);
                Ok(true)
            }
            Mode::ReadTwiceBadGood => {
                f(&bad);
                f(&v);
                Ok(true)
            }
            Mode::ReadThenDeny => {
                f(&v);
                Ok(false)
            }
            Mode::HeldNoCall => Ok(true),
            Mode::EmptyValue => {
                f(&[]);
                Ok(true)
            }
            Mode::Panics => panic!("read_with"),
            _ => {
                f(&v);
                Ok(true)
            }
        }
    }
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        self.inner.put(chunks)
    }
    fn may_block(&self) -> bool {
        !self.in_place
    }
    fn reads_in_place(&self) -> bool {
        self.in_place
    }
}

const BS: usize = 4;
const TOKEN_BYTES: usize = 8;

fn pattern(block: usize, i: usize) -> u8 {
    (block * 31 + i * 7 + 1) as u8
}

/// Saves 4 blocks of a 16-token prompt through an honest connector, then loads them through
/// a connector over `mode` into other blocks and checks the verdict against the bytes.
fn check(mode: Mode, in_place: bool) {
    let groups = vec![CacheGroup::full_attention(BS as u64)];
    let layout = KvLayout::for_groups(&groups, TOKEN_BYTES, 0).unwrap();
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 64).unwrap());
    let tier = Arc::new(Hostile {
        inner: MemoryTier::new(1 << 20, 2),
        mode: Mode::Honest,
        in_place,
    });
    let cfg = TierConnectorConfig::default()
        .with_groups(groups.clone())
        .with_tag(7);
    let prompt: Vec<u32> = (100..117).collect();
    let bytes = BS * TOKEN_BYTES;
    {
        let saver = TierConnector::new(tier.clone(), Arc::clone(&memory), cfg.clone()).unwrap();
        for b in 0..4 {
            let data: Vec<u8> = (0..bytes).map(|i| pattern(b, i)).collect();
            memory.write(0, 1 + b as u64, 0, &data).unwrap();
        }
        let queued = saver.save_blocks(&prompt, &[(0, 0, 1), (0, 1, 2), (0, 2, 3), (0, 3, 4)]);
        assert_eq!(queued, 4);
        assert!(saver.flush_for(Duration::from_secs(5)));
    }
    // The same store behind the hostile tier: move its chunks over.
    let hostile = Arc::new(Hostile {
        inner: MemoryTier::new(1 << 20, 2),
        mode,
        in_place,
    });
    let keys: Vec<ChunkKey> = {
        let c = TierConnector::new(tier.clone(), Arc::clone(&memory), cfg.clone()).unwrap();
        (0..4)
            .map(|b| c.chunk_key(0, &prompt, b).unwrap())
            .collect()
    };
    let vals = tier.inner.get(&keys, &CancelToken::new()).unwrap();
    let chunks: Vec<(ChunkKey, Vec<u8>)> = keys
        .iter()
        .zip(vals)
        .map(|(k, v)| (*k, v.expect("saved")))
        .collect();
    hostile.inner.put(&chunks).unwrap();

    let conn = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        TierConnector::new(hostile.clone(), Arc::clone(&memory), cfg.clone())
    })) {
        Ok(c) => c.unwrap(),
        Err(_) => panic!("{mode:?}: TierConnector::new panicked"),
    };
    let table: Vec<BlockRef> = (0..4)
        .map(|b| BlockRef {
            id: 10 + b,
            generation: 1,
        })
        .collect();
    let job = LoadJob::new("r", &prompt, 0, 16, vec![table.clone()], vec![BS as u64]);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| conn.load(&job)))
        .unwrap_or_else(|_| panic!("{mode:?} in_place {in_place}: load panicked"));
    let failed: Vec<BlockRef> = match &result {
        LoadResult::Ok => vec![],
        LoadResult::Failed(b) => b.clone().into_flat(),
    };
    for (b, r) in table.iter().enumerate() {
        let mut got = vec![0u8; bytes];
        memory.read(0, r.id, 0, &mut got).unwrap();
        let want: Vec<u8> = (0..bytes).map(|i| pattern(b, i)).collect();
        if failed.contains(r) {
            assert!(
                got.iter().all(|&x| x == POISON_BYTE) || got == want,
                "{mode:?} in_place {in_place}: failed block {b} holds neither poison nor its bytes"
            );
        } else {
            assert_eq!(got, want, "{mode:?} in_place {in_place}: block {b} reported loaded holds wrong bytes ({result:?})");
        }
    }
    // Lookups and prefetches against a lying `exists` never panic and never hang.
    let _ = conn.prefetch(&prompt);
    std::thread::sleep(Duration::from_millis(20));
    let q = kvsched::connector::LookupQuery {
        request: "r",
        prompt: &prompt,
        local_tokens: 0,
        prepared: None,
    };
    let _ = conn.lookup(q);
    drop(conn);
}

#[test]
fn hostile_tiers_never_leave_garbage_reported_ok() {
    let modes = [
        Mode::Honest,
        Mode::ReadTwiceGoodBad,
        Mode::ReadTwiceBadGood,
        Mode::ReadThenDeny,
        Mode::HeldNoCall,
        Mode::EmptyValue,
        Mode::HeldEmpty,
        Mode::SameValue,
        Mode::Short,
        Mode::Long,
        Mode::ExistsLies,
        Mode::Panics,
    ];
    for mode in modes {
        for in_place in [true, false] {
            check(mode, in_place);
        }
    }
}

#[test]
fn saves_with_hostile_arguments_never_panic() {
    use kvsched::{Runtime, StepOutput, SubmitRequest};
    let groups = vec![
        CacheGroup::full_attention(BS as u64),
        CacheGroup::mamba(BS as u64, kvsched::MambaMode::Align),
    ];
    let layout = KvLayout::for_groups(&groups, TOKEN_BYTES, 16).unwrap();
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 64).unwrap());
    let cfg = TierConnectorConfig::default()
        .with_groups(groups.clone())
        .with_tag(7);
    let conn = Arc::new(
        TierConnector::new(
            Arc::new(MemoryTier::new(1 << 20, 2)),
            Arc::clone(&memory),
            cfg,
        )
        .unwrap(),
    );
    let prompt: Vec<u32> = (0..16).collect();
    let edges = [0usize, 1, 3, 4, 63, 64, usize::MAX];
    for g in [0usize, 1, 2, usize::MAX] {
        for &i in &edges {
            for b in [0u64, 1, 63, 64, u64::MAX] {
                let _ = conn.save_blocks(&prompt, &[(g, i, b)]);
                let _ = conn.save_blocks(&[], &[(g, i, b)]);
                let _ = conn.store_now(&prompt, g, i, &[1, 2, 3]);
                let _ = conn.store_now(&prompt, g, i, &vec![0; 1 << 16]);
            }
        }
        let _ = conn.chunk_key(g, &prompt, usize::MAX);
    }
    // save_step with a scheduled request whose fields are edited.
    let mut rt = Runtime::builder()
        .groups(groups.clone())
        .pool_blocks(64)
        .connector(conn.clone())
        .build()
        .unwrap();
    rt.submit(SubmitRequest {
        id: "a".into(),
        prompt: prompt.clone(),
        max_new_tokens: 2,
        priority: 0,
        load_deadline: None,
    })
    .unwrap();
    let plan = rt.schedule().unwrap();
    for s in &plan.scheduled {
        for (n, k) in [
            (0, u64::MAX),
            (u64::MAX, 1),
            (u64::MAX, u64::MAX),
            (3, 100),
            (17, 0),
        ] {
            let mut t = s.clone();
            t.num_computed_tokens = n;
            t.num_tokens = k;
            let _ = kvsched::kv::completed_prompt_blocks(&groups, prompt.len(), &t);
            let _ = kvsched::kv::completed_prompt_blocks(&groups, usize::MAX, &t);
            let _ = conn.save_step(&prompt, &t);
            let _ = conn.save_step(&[], &t);
        }
    }
    rt.update(StepOutput::all_sampled(&plan));
    rt.shutdown();
    assert!(conn.flush_for(Duration::from_secs(5)));
}

/// A tier whose every call blocks until the gate opens, ignoring cancel tokens.
struct Stuck {
    gate: std::sync::atomic::AtomicBool,
}

impl Stuck {
    fn wait(&self) {
        while !self.gate.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Tier for Stuck {
    fn name(&self) -> &str {
        "stuck"
    }
    fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
        self.wait();
        Ok(vec![true; keys.len()])
    }
    fn get(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        self.wait();
        Ok(vec![None; keys.len()])
    }
    fn put(&self, _: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        self.wait();
        Ok(())
    }
}

#[test]
fn a_tier_that_never_answers_costs_deadlines_not_hangs() {
    use std::time::Instant;
    let groups = vec![CacheGroup::full_attention(BS as u64)];
    let layout = KvLayout::for_groups(&groups, TOKEN_BYTES, 0).unwrap();
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 64).unwrap());
    let tier = Arc::new(Stuck { gate: false.into() });
    let cfg = TierConnectorConfig::default()
        .with_groups(groups.clone())
        .with_tag(7)
        .with_get_threads(2)
        .with_drop_timeout(Duration::from_millis(300));
    let conn = TierConnector::new(tier.clone(), Arc::clone(&memory), cfg).unwrap();
    let prompt: Vec<u32> = (0..17).collect();
    for b in 0..4 {
        memory.write(0, 1 + b, 0, &[3; BS * TOKEN_BYTES]).unwrap();
    }
    let _ = conn.save_blocks(&prompt, &[(0, 0, 1), (0, 1, 2), (0, 2, 3), (0, 3, 4)]);
    let _ = conn.prefetch(&prompt);
    let t0 = Instant::now();
    let q = kvsched::connector::LookupQuery {
        request: "r",
        prompt: &prompt,
        local_tokens: 0,
        prepared: None,
    };
    let _ = conn.lookup(q);
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "lookup waited {:?}",
        t0.elapsed()
    );
    let table: Vec<BlockRef> = (0..4)
        .map(|b| BlockRef {
            id: 10 + b,
            generation: 1,
        })
        .collect();
    for _ in 0..4 {
        let mut job = LoadJob::new("r", &prompt, 0, 16, vec![table.clone()], vec![BS as u64]);
        job.deadline = Some(Instant::now() + Duration::from_millis(50));
        let t0 = Instant::now();
        let r = conn.load(&job);
        assert!(
            t0.elapsed() < Duration::from_millis(2000),
            "load waited {:?}",
            t0.elapsed()
        );
        assert_ne!(r, LoadResult::Ok);
    }
    let t0 = Instant::now();
    assert!(!conn.flush_for(Duration::from_millis(100)));
    assert!(
        t0.elapsed() < Duration::from_millis(2000),
        "flush_for waited {:?}",
        t0.elapsed()
    );
    let t0 = Instant::now();
    drop(conn);
    assert!(
        t0.elapsed() < Duration::from_millis(3000),
        "drop waited {:?}",
        t0.elapsed()
    );
    tier.gate.store(true, std::sync::atomic::Ordering::SeqCst);
}
