//! A store that panics or says it held a chunk it never handed over costs what a store's
//! error costs: the chunks of that call fail (poisoned, reported), and the connector's
//! threads — the get threads of a tier that may block, the save thread, the probe thread —
//! live on, so later calls work and `flush` returns. Nothing the store did not hand over is
//! reported loaded. So it is when the panic's payload panics again as it is dropped (plant
//! `panic-payload-dropped-bare`): that second panic used to kill the save thread (`flush`
//! never returned) and unwind a load on the loading thread.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{CancelToken, KvConnector, LoadJob, LoadResult};
use kvsched::kv::{
    ChunkKey, HostKvMemory, KvLayout, KvMemory, MemoryTier, Tier, TierConnector,
    TierConnectorConfig, TierError, POISON_BYTE,
};
use kvsched::{BlockRef, CacheGroup};

/// What the hostile tier does wrong; each misbehaviour is for its first `times` calls.
#[derive(Clone, Copy)]
enum Fault {
    /// `get` panics (a tier that may block: its gets run on the connector's get threads).
    PanicGet,
    /// `get` panics on a tier that never blocks (read on the loading thread).
    PanicGetInline,
    /// `read_with` answers "held" without calling `f` (a tier that reads in place).
    HeldWithoutValue,
    /// `put` panics.
    PanicPut,
    /// `exists` panics.
    PanicExists,
    /// `read_with` hands the value over, then answers "not held".
    HandOverThenAbsent,
    /// `read_with` hands the value over, then answers an error.
    HandOverThenErr,
    /// `read_with` hands the value over, then panics.
    HandOverThenPanic,
    /// Every question about the tier (`may_block`, `reads_in_place`, `costs_per_call`,
    /// `expect_values_up_to`) panics, every time.
    PanicProperties,
}

/// A panic payload that panics when dropped (unless the thread is already unwinding).
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("a bomb, dropped");
        }
    }
}

/// A memory tier that misbehaves as `fault` says for its first `times` calls of that kind;
/// its panics' payloads are `Bomb`s when `bombs`.
struct Hostile {
    inner: MemoryTier,
    fault: Fault,
    times: u32,
    calls: AtomicU32,
    bombs: bool,
}

impl Hostile {
    fn new(fault: Fault, times: u32, bombs: bool) -> Self {
        Hostile {
            inner: MemoryTier::new(1 << 22, 1),
            fault,
            times,
            calls: AtomicU32::new(0),
            bombs,
        }
    }

    fn explode(&self, what: &str) -> ! {
        if self.bombs {
            std::panic::panic_any(Bomb);
        }
        panic!("{what} exploded");
    }

    /// Whether this call of the faulty kind misbehaves.
    fn strikes(&self, kind: Fault) -> bool {
        std::mem::discriminant(&kind) == std::mem::discriminant(&self.fault)
            && self.calls.fetch_add(1, Ordering::SeqCst) < self.times
    }
}

impl Tier for Hostile {
    fn name(&self) -> &str {
        "hostile"
    }
    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        if self.strikes(Fault::PanicExists) {
            self.explode("exists");
        }
        self.inner.exists(keys, cancel)
    }
    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        if self.strikes(Fault::PanicGet) || self.strikes(Fault::PanicGetInline) {
            self.explode("get");
        }
        self.inner.get(keys, cancel)
    }
    fn read_with(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, TierError> {
        if self.strikes(Fault::HeldWithoutValue) {
            return Ok(true);
        }
        for disown in [
            Fault::HandOverThenAbsent,
            Fault::HandOverThenErr,
            Fault::HandOverThenPanic,
        ] {
            if self.strikes(disown) {
                self.inner.read_with(key, cancel, f)?;
                return match disown {
                    Fault::HandOverThenAbsent => Ok(false),
                    Fault::HandOverThenErr => Err(TierError::Unavailable("disowned".into())),
                    _ => self.explode("read_with"),
                };
            }
        }
        self.inner.read_with(key, cancel, f)
    }
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        if self.strikes(Fault::PanicPut) {
            self.explode("put");
        }
        self.inner.put(chunks)
    }
    fn may_block(&self) -> bool {
        if matches!(self.fault, Fault::PanicProperties) {
            self.explode("may_block");
        }
        matches!(self.fault, Fault::PanicGet)
    }
    fn reads_in_place(&self) -> bool {
        if matches!(self.fault, Fault::PanicProperties) {
            self.explode("reads_in_place");
        }
        matches!(
            self.fault,
            Fault::HeldWithoutValue
                | Fault::HandOverThenAbsent
                | Fault::HandOverThenErr
                | Fault::HandOverThenPanic
        )
    }
    fn costs_per_call(&self) -> bool {
        if matches!(self.fault, Fault::PanicProperties) {
            self.explode("costs_per_call");
        }
        true
    }
    fn expect_values_up_to(&self, bytes: usize) {
        if matches!(self.fault, Fault::PanicProperties) {
            self.explode("expect_values_up_to");
        }
        self.inner.expect_values_up_to(bytes);
    }
}

const BLOCK: usize = 16;
const BYTES: usize = 8 * BLOCK;

fn connector(tier: Arc<dyn Tier>, cfg: TierConnectorConfig) -> TierConnector {
    let layout = KvLayout::for_groups(&cfg.groups, 8, 8).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 64).expect("memory"));
    TierConnector::new(tier, memory, cfg).expect("connector")
}

fn cfg() -> TierConnectorConfig {
    TierConnectorConfig::default()
        .with_groups(vec![CacheGroup::full_attention(BLOCK as u64)])
        .with_get_threads(2)
}

/// The prompt of case `n`: 4 full blocks and a token.
fn prompt(n: u32) -> Vec<u32> {
    (0..4 * BLOCK as u32 + 1).map(|t| n * 1000 + t).collect()
}

/// Stores the 4 blocks of `prompt(n)`, block `i` filled with byte `n * 4 + i`.
fn store(c: &TierConnector, n: u32) {
    for i in 0..4 {
        let fill = (n * 4 + i as u32) as u8;
        assert!(matches!(
            c.store_now(&prompt(n), 0, i, &[fill; BYTES]),
            Ok(true)
        ));
    }
}

/// Loads `prompt(n)`'s 4 blocks into blocks `dest..dest + 4` (generation 1, deadline 2 s);
/// returns the result and each block's first byte after it.
fn load(c: &TierConnector, n: u32, dest: u64) -> (LoadResult, Vec<u8>) {
    let table: Vec<BlockRef> = (0..4)
        .map(|i| BlockRef {
            id: dest + i,
            generation: 1,
        })
        .collect();
    let mut job = LoadJob::new("r", &prompt(n), 0, 4 * BLOCK as u64, vec![table], vec![16]);
    job.deadline = Some(Instant::now() + Duration::from_secs(2));
    let result = c.load(&job);
    let firsts = (0..4)
        .map(|i| {
            let mut b = [0u8; 1];
            c.memory().read(0, dest + i, 0, &mut b).expect("read");
            b[0]
        })
        .collect();
    (result, firsts)
}

/// Whether `firsts` are the bytes `prompt(n)`'s blocks were stored with.
fn stored_bytes(n: u32, firsts: &[u8]) -> bool {
    firsts
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (n * 4 + i as u32) as u8)
}

#[test]
fn panicking_gets_fail_their_loads_at_once_and_the_get_threads_live_on() {
    for (fault, bombs) in [Fault::PanicGet, Fault::PanicGetInline]
        .into_iter()
        .flat_map(|f| [(f, false), (f, true)])
    {
        // More panics than get threads: a thread a panic took would be gone for good.
        let c = connector(Arc::new(Hostile::new(fault, 5, bombs)), cfg());
        store(&c, 1);
        for attempt in 0..5 {
            let t0 = Instant::now();
            let (result, firsts) = load(&c, 1, 10);
            assert!(
                matches!(result, LoadResult::Failed(_)),
                "attempt {attempt}: {result:?}"
            );
            assert!(firsts.iter().all(|&b| b == POISON_BYTE), "{firsts:?}");
            // Failed at once, not at the 2 s deadline.
            assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        }
        let (result, firsts) = load(&c, 1, 20);
        assert!(
            matches!(result, LoadResult::Ok),
            "after the panics: {result:?}"
        );
        assert!(stored_bytes(1, &firsts), "{firsts:?}");
        assert!(c.counts().tier_errors >= 5, "{:?}", c.counts());
    }
}

#[test]
fn a_tier_that_says_held_without_handing_the_chunk_over_fails_the_block() {
    let c = connector(
        Arc::new(Hostile::new(Fault::HeldWithoutValue, 2, false)),
        cfg(),
    );
    store(&c, 2);
    // Blocks 30.. hold another prompt's bytes first: a block reported loaded would keep them.
    for i in 0..4 {
        c.memory()
            .write(0, 30 + i, 0, &[0xAB; BYTES])
            .expect("write");
    }
    let (result, firsts) = load(&c, 2, 30);
    match result {
        LoadResult::Failed(bad) => {
            let ids: Vec<u64> = bad.into_flat().iter().map(|b| b.id).collect();
            assert_eq!(ids, [30, 31], "the two chunks never handed over");
        }
        other => panic!("reported {other:?} with two blocks never written"),
    }
    assert_eq!(firsts[..2], [POISON_BYTE, POISON_BYTE], "{firsts:?}");
    assert_eq!(firsts[2], 2 * 4 + 2);
    assert_eq!(firsts[3], 2 * 4 + 3);
}

#[test]
fn a_panicking_put_or_exists_leaves_saving_and_probing_working() {
    for (fault, bombs) in [Fault::PanicPut, Fault::PanicExists]
        .into_iter()
        .flat_map(|f| [(f, false), (f, true)])
    {
        let c = connector(Arc::new(Hostile::new(fault, 1, bombs)), cfg());
        let memory = Arc::clone(c.memory());
        for (n, dest) in [(3u32, 40u64), (4, 44)] {
            for i in 0..4u64 {
                let fill = (n * 4 + i as u32) as u8;
                memory.write(0, dest + i, 0, &[fill; BYTES]).expect("write");
            }
            let blocks: Vec<(usize, usize, u64)> =
                (0..4).map(|i| (0, i as usize, dest + i)).collect();
            c.save_blocks(&prompt(n), &blocks);
            assert!(
                c.flush_for(Duration::from_secs(5)),
                "{}: flush never finished after a panic",
                if matches!(fault, Fault::PanicPut) {
                    "put"
                } else {
                    "exists"
                }
            );
        }
        // The probe thread answers prefetches after a panic in `exists`.
        for n in [7u32, 8] {
            let p = c.prefetch(&prompt(n));
            let t0 = Instant::now();
            while !p.is_ready() && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(p.is_ready(), "a prefetch never answered");
        }
        // The second prompt's save went through: its blocks load back.
        let (result, firsts) = load(&c, 4, 50);
        assert!(matches!(result, LoadResult::Ok), "{result:?}");
        assert!(stored_bytes(4, &firsts), "{firsts:?}");
    }
}

/// A tier that panics when asked about itself (whether it may block, reads in place, costs
/// something per call, the largest value to expect) is asked once, when the connector is
/// made, behind the panic guard, and taken for the safest answer: the connector is made, and
/// its loads neither panic nor fail — a sync load the engine makes on its own thread included.
#[test]
fn a_tier_that_panics_when_asked_about_itself_still_loads() {
    for bombs in [false, true] {
        let c = connector(
            Arc::new(Hostile::new(Fault::PanicProperties, 0, bombs)),
            cfg(),
        );
        store(&c, 5);
        for dest in [10, 20] {
            let (result, firsts) = load(&c, 5, dest);
            assert!(matches!(result, LoadResult::Ok), "{result:?}");
            assert!(stored_bytes(5, &firsts), "{firsts:?}");
        }
    }
}

/// A tier that hands a chunk over and then disowns it (answers "not held", an error, a
/// panic) fails that block — poisoned, reported — and the chunk is not counted loaded: the
/// counts say what the load delivered.
#[test]
fn a_chunk_handed_over_then_disowned_fails_and_is_not_counted_loaded() {
    for fault in [
        Fault::HandOverThenAbsent,
        Fault::HandOverThenErr,
        Fault::HandOverThenPanic,
    ] {
        let c = connector(Arc::new(Hostile::new(fault, 1, false)), cfg());
        store(&c, 6);
        let before = c.counts();
        let (result, firsts) = load(&c, 6, 30);
        let failed: Vec<u64> = match result {
            LoadResult::Failed(bad) => bad.into_flat().iter().map(|b| b.id).collect(),
            other => panic!("a disowned chunk reported {other:?}"),
        };
        let after = c.counts();
        let loaded = after.chunks_loaded - before.chunks_loaded;
        // Absent: the first chunk fails alone; an error or a panic fails the rest of the load.
        let want: &[u64] = match fault {
            Fault::HandOverThenAbsent => &[30],
            _ => &[30, 31, 32, 33],
        };
        assert_eq!(failed, want);
        assert_eq!(firsts[0], POISON_BYTE, "{firsts:?}");
        assert_eq!(loaded, 4 - want.len() as u64, "{after:?}");
        assert_eq!(
            after.kv_bytes_loaded - before.kv_bytes_loaded,
            loaded * BYTES as u64
        );
        assert_eq!(after.tier_errors - before.tier_errors, 1, "{after:?}");
    }
}
