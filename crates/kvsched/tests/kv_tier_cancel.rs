//! A tier call that a load's own cancellation ends is a cancelled load, not a tier error: its
//! blocks fail, the load counts in `loads_cancelled`, and `tier_errors` — what an operator
//! reads as "the store is in trouble" — stays as it was. A tier that answers `Cancelled`
//! when nobody cancelled is in error. So it is on each of the connector's read paths: a tier
//! that may block (its gets on the connector's get threads), one read on the loading thread,
//! and one read in place.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{CancelToken, KvConnector, LoadJob, LoadResult};
use kvsched::kv::{
    ChunkKey, HostKvMemory, KvLayout, KvMemory, MemoryTier, Tier, TierConnector,
    TierConnectorConfig, TierError,
};
use kvsched::{BlockRef, CacheGroup};

/// How the tier's read ends.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ending {
    /// A tier that may block: its get waits until its token fires (the connector fires it
    /// when the load's does), then answers `Cancelled`.
    WaitsForCancel,
    /// Read on the loading thread: the load's token fires during the get (the tier fires
    /// it, standing in for the runtime), which answers `Cancelled`.
    CancelledDuringGet,
    /// The same, read in place (`read_with`).
    CancelledDuringRead,
    /// Answers `Cancelled` with the token unfired: the tier's own failure.
    SaysCancelledUncancelled,
}

struct Cancelling {
    inner: MemoryTier,
    ending: Ending,
}

impl Tier for Cancelling {
    fn name(&self) -> &str {
        "cancelling"
    }
    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        self.inner.exists(keys, cancel)
    }
    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        match self.ending {
            Ending::WaitsForCancel => {
                let give_up = Instant::now() + Duration::from_secs(10);
                while !cancel.is_cancelled() && Instant::now() < give_up {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TierError::Cancelled)
            }
            Ending::CancelledDuringGet => {
                cancel.cancel();
                Err(TierError::Cancelled)
            }
            Ending::SaysCancelledUncancelled => Err(TierError::Cancelled),
            Ending::CancelledDuringRead => self.inner.get(keys, cancel),
        }
    }
    fn read_with(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, TierError> {
        if self.ending == Ending::CancelledDuringRead {
            cancel.cancel();
            return Err(TierError::Cancelled);
        }
        self.inner.read_with(key, cancel, f)
    }
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        self.inner.put(chunks)
    }
    fn may_block(&self) -> bool {
        self.ending == Ending::WaitsForCancel
    }
    fn reads_in_place(&self) -> bool {
        self.ending == Ending::CancelledDuringRead
    }
}

const BLOCK: usize = 16;
const BYTES: usize = 8 * BLOCK;

/// A prompt of 4 full blocks and a token.
fn prompt() -> Vec<u32> {
    (0..4 * BLOCK as u32 + 1).collect()
}

/// A connector on a tier ending its reads as `ending`, holding the prompt's 4 blocks.
fn connector(ending: Ending) -> TierConnector {
    let cfg = TierConnectorConfig::default()
        .with_groups(vec![CacheGroup::full_attention(BLOCK as u64)])
        .with_get_threads(2);
    let layout = KvLayout::for_groups(&cfg.groups, 8, 8).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 64).expect("memory"));
    let tier = Arc::new(Cancelling {
        inner: MemoryTier::new(1 << 22, 1),
        ending,
    });
    let c = TierConnector::new(tier, memory, cfg).expect("connector");
    for i in 0..4 {
        assert!(matches!(
            c.store_now(&prompt(), 0, i, &[i as u8 + 1; BYTES]),
            Ok(true)
        ));
    }
    c
}

/// A load of the prompt's 4 blocks into blocks 10–13, deadline 5 s.
fn job() -> LoadJob {
    let table: Vec<BlockRef> = (0..4)
        .map(|i| BlockRef {
            id: 10 + i,
            generation: 1,
        })
        .collect();
    let mut job = LoadJob::new("r", &prompt(), 0, 4 * BLOCK as u64, vec![table], vec![16]);
    job.deadline = Some(Instant::now() + Duration::from_secs(5));
    job
}

#[test]
fn a_call_the_loads_cancellation_ended_is_a_cancelled_load_not_a_tier_error() {
    for ending in [
        Ending::WaitsForCancel,
        Ending::CancelledDuringGet,
        Ending::CancelledDuringRead,
    ] {
        let c = connector(ending);
        let job = job();
        let token = job.cancel.clone();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            token.cancel();
        });
        let result = c.load(&job);
        canceller.join().unwrap();
        let failed = match result {
            LoadResult::Failed(bad) => bad.into_flat().len(),
            other => panic!("{ending:?}: a cancelled load reported {other:?}"),
        };
        assert_eq!(failed, 4, "{ending:?}");
        let counts = c.counts();
        assert_eq!(counts.loads_cancelled, 1, "{ending:?}: {counts:?}");
        assert_eq!(counts.tier_errors, 0, "{ending:?}: {counts:?}");
        assert_eq!(counts.chunks_loaded, 0, "{ending:?}: {counts:?}");
    }
}

#[test]
fn a_tier_that_says_cancelled_when_nobody_cancelled_is_in_error() {
    let c = connector(Ending::SaysCancelledUncancelled);
    let result = c.load(&job());
    assert!(matches!(result, LoadResult::Failed(_)), "{result:?}");
    let counts = c.counts();
    assert_eq!(counts.tier_errors, 1, "{counts:?}");
    assert_eq!(counts.loads_cancelled, 0, "{counts:?}");
}
