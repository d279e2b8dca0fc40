//! `TierConnector` misuse: a group index past the configured groups is an error, a job with
//! more groups than the configuration fails their blocks, and dropping a connector over a
//! hung tier returns within its drop timeout (one for all its threads); a save CPU share
//! outside (0, 1] or a save batch of 0 is refused, naming the field; a runtime refuses a
//! connector built for another geometry.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{CancelToken, InvalidBlocks, KvConnector, LoadJob, LoadResult};
use kvsched::kv::{
    ChunkKey, HostKvMemory, KvLayout, KvMemory, MemoryTier, SaveBackoff, Tier, TierConnector,
    TierConnectorConfig, TierError,
};
use kvsched::{BlockRef, CacheGroup};

fn connector(tier: Arc<dyn Tier>, cfg: TierConnectorConfig) -> TierConnector {
    let layout = KvLayout::for_groups(&cfg.groups, 8, 8).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 32).expect("memory"));
    TierConnector::new(tier, memory, cfg).expect("connector")
}

fn one_group() -> TierConnectorConfig {
    TierConnectorConfig::default().with_groups(vec![CacheGroup::full_attention(16)])
}

#[test]
fn store_now_past_the_configured_groups_is_an_error() {
    let c = connector(Arc::new(MemoryTier::new(1 << 20, 1)), one_group());
    let tokens: Vec<u32> = (0..64).collect();
    assert!(matches!(
        c.store_now(&tokens, 1, 0, &[0; 128]),
        Err(TierError::Refused(_))
    ));
    assert!(matches!(
        c.store_now(&tokens, usize::MAX, usize::MAX, &[0; 128]),
        Err(TierError::Refused(_))
    ));
    assert!(matches!(
        c.store_now(&tokens, 0, usize::MAX, &[0; 128]),
        Ok(false)
    ));
    assert!(matches!(c.store_now(&tokens, 0, 0, &[0; 128]), Ok(true)));
}

#[test]
fn a_job_with_more_groups_than_configured_fails_their_blocks() {
    let c = connector(Arc::new(MemoryTier::new(1 << 20, 1)), one_group());
    let prompt: Vec<u32> = (1..=65).collect();
    for i in 0..4 {
        assert!(matches!(
            c.store_now(&prompt, 0, i, &[i as u8; 128]),
            Ok(true)
        ));
    }
    let table = |base: u64| -> Vec<BlockRef> {
        (0..4)
            .map(|i| BlockRef {
                id: base + i,
                generation: 1,
            })
            .collect()
    };
    let job = LoadJob::new("r", &prompt, 0, 64, vec![table(1), table(10)], vec![16, 16]);
    match c.load(&job) {
        LoadResult::Failed(InvalidBlocks::ByGroup(bad)) => {
            assert!(bad[0].is_empty(), "{bad:?}");
            let ids: Vec<u64> = bad[1].iter().map(|b| b.id).collect();
            assert_eq!(ids, vec![10, 11, 12, 13]);
        }
        other => panic!("{other:?}"),
    }
}

/// A tier whose `put` never returns until released.
struct Hung {
    release: AtomicBool,
}

impl Tier for Hung {
    fn name(&self) -> &str {
        "hung"
    }
    fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
        Ok(vec![false; keys.len()])
    }
    fn get(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        Ok(vec![None; keys.len()])
    }
    fn put(&self, _: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        while !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

#[test]
fn dropping_a_connector_over_a_hung_put_returns_within_its_drop_timeout() {
    let hung = Arc::new(Hung {
        release: AtomicBool::new(false),
    });
    let c = connector(
        hung.clone(),
        one_group().with_drop_timeout(Duration::from_millis(300)),
    );
    let memory = Arc::clone(c.memory());
    memory.write(0, 1, 0, &[3; 128]).expect("write");
    let prompt: Vec<u32> = (1..=65).collect();
    assert_eq!(c.save_blocks(&prompt, &[(0, 0, 1)]), 1);
    std::thread::sleep(Duration::from_millis(50)); // the save thread is inside `put`
    let t0 = Instant::now();
    drop(c);
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "drop took {took:?}");
    hung.release.store(true, Ordering::SeqCst);
}

/// Behind a stalled store the save queue holds at most `save_queue_bytes` of chunk copies,
/// whatever `save_queue` allows: saves past it are dropped and counted.
#[test]
fn the_save_queue_is_bounded_in_bytes_behind_a_stalled_store() {
    let hung = Arc::new(Hung {
        release: AtomicBool::new(false),
    });
    // 128-byte blocks: a chunk is more than 128 bytes, so 1,000 bytes hold at most 7.
    let c = connector(
        hung.clone(),
        one_group()
            .with_save_queue_bytes(1000)
            .with_drop_timeout(Duration::from_millis(300)),
    );
    c.memory().write(0, 1, 0, &[3; 128]).expect("write");
    let mut queued = 0;
    for p in 0..40u32 {
        let prompt: Vec<u32> = (0..17).map(|t| p * 100 + t).collect();
        queued += c.save_blocks(&prompt, &[(0, 0, 1)]);
    }
    // The thread holds what it took (at most the queue's 7), the queue at most 7 more.
    assert!(queued <= 14, "{queued} saves queued behind a stalled store");
    assert_eq!(c.counts().saves_dropped, 40 - queued as u64);
    drop(c);
    hung.release.store(true, Ordering::SeqCst);
}

/// A tier whose `put` and `exists` never return until released, counting the calls inside.
#[derive(Default)]
struct HungAll {
    release: AtomicBool,
    inside: AtomicUsize,
}

impl HungAll {
    fn hang(&self) {
        self.inside.fetch_add(1, Ordering::SeqCst);
        while !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Tier for HungAll {
    fn name(&self) -> &str {
        "hung-all"
    }
    fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
        self.hang();
        Ok(vec![false; keys.len()])
    }
    fn get(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        Ok(vec![None; keys.len()])
    }
    fn put(&self, _: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        self.hang();
        Ok(())
    }
}

/// The drop's `drop_timeout` bounds the whole drop: with the save thread stuck in `put` and
/// the probe thread in `exists`, it returns about `drop_timeout` after it began, not once per
/// thread (before, the saver and then the prober each waited the full 3 s: 6 s).
#[test]
fn one_drop_timeout_bounds_a_drop_with_save_and_probe_threads_hung() {
    let hung = Arc::new(HungAll::default());
    let c = connector(
        hung.clone(),
        one_group().with_drop_timeout(Duration::from_secs(3)),
    );
    let memory = Arc::clone(c.memory());
    memory.write(0, 1, 0, &[3; 128]).expect("write");
    let prompt: Vec<u32> = (1..=65).collect();
    assert_eq!(c.save_blocks(&prompt, &[(0, 0, 1)]), 1);
    let probe = c.prefetch(&prompt);
    let t0 = Instant::now();
    while hung.inside.load(Ordering::SeqCst) < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "threads never called"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!probe.is_ready());
    let t0 = Instant::now();
    drop(c);
    let took = t0.elapsed();
    hung.release.store(true, Ordering::SeqCst);
    assert!(took < Duration::from_millis(5500), "drop took {took:?}");
}

#[test]
fn a_save_cpu_share_outside_its_range_is_a_config_error_naming_it() {
    for share in [0.0, -1.0, 1.5, f64::NAN] {
        let layout = KvLayout::for_groups(&one_group().groups, 8, 8).expect("layout");
        let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 4).expect("memory"));
        let cfg = one_group().with_save_cpu_share(share);
        match TierConnector::new(Arc::new(MemoryTier::new(1 << 20, 1)), memory, cfg) {
            Err(e) => assert!(e.to_string().contains("save_cpu_share"), "{share}: {e}"),
            Ok(_) => panic!("{share}: accepted"),
        }
    }
}

#[test]
fn a_save_batch_of_zero_is_a_config_error_naming_it() {
    let layout = KvLayout::for_groups(&one_group().groups, 8, 8).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 4).expect("memory"));
    let cfg = one_group().with_save_batch(0);
    match TierConnector::new(Arc::new(MemoryTier::new(1 << 20, 1)), memory.clone(), cfg) {
        Err(e) => assert!(e.to_string().contains("save_batch"), "{e}"),
        Ok(_) => panic!("a batch of 0 accepted"),
    }
    let cfg = one_group().with_save_batch(1);
    assert!(TierConnector::new(Arc::new(MemoryTier::new(1 << 20, 1)), memory, cfg).is_ok());
}

#[test]
fn counts_of_zero_and_thread_counts_past_the_limit_are_config_errors_naming_them() {
    let layout = KvLayout::for_groups(&one_group().groups, 8, 8).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 4).expect("memory"));
    let cases = [
        ("save_queue: 0", one_group().with_save_queue(0)),
        ("save_queue_bytes: 0", one_group().with_save_queue_bytes(0)),
        ("index_capacity: 0", one_group().with_index_capacity(0)),
        ("save_threads: 0", one_group().with_save_threads(0)),
        ("save_threads: 1025", one_group().with_save_threads(1025)),
        ("get_threads: 0", one_group().with_get_threads(0)),
        (
            "get_threads: 18446744073709551615",
            one_group().with_get_threads(usize::MAX),
        ),
    ];
    for (want, cfg) in cases {
        match TierConnector::new(Arc::new(MemoryTier::new(1 << 20, 1)), memory.clone(), cfg) {
            Err(e) => assert!(
                e.to_string()
                    .starts_with(&format!("tier connector: {want}")),
                "{want}: {e}"
            ),
            Ok(_) => panic!("{want}: accepted"),
        }
    }
    // The bounds themselves are accepted.
    let cfg = one_group()
        .with_save_queue(1)
        .with_index_capacity(1)
        .with_save_threads(2)
        .with_get_threads(1024);
    assert!(TierConnector::new(Arc::new(MemoryTier::new(1 << 20, 1)), memory, cfg).is_ok());
}

#[test]
fn a_wait_too_long_to_add_to_an_instant_is_a_config_error_naming_it() {
    let layout = KvLayout::for_groups(&one_group().groups, 8, 8).expect("layout");
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 4).expect("memory"));
    let day = Duration::from_secs(86_400);
    let backoff = |pause, max_pause| SaveBackoff {
        after_failed_batches: 3,
        pause,
        max_pause,
    };
    let cases = [
        ("drop_timeout", one_group().with_drop_timeout(Duration::MAX)),
        (
            "save_backoff.pause",
            one_group().with_save_backoff(backoff(Duration::MAX, Duration::MAX)),
        ),
        (
            "save_backoff.max_pause",
            one_group().with_save_backoff(backoff(Duration::from_secs(1), day * 2)),
        ),
    ];
    for (field, cfg) in cases {
        match TierConnector::new(Arc::new(MemoryTier::new(1 << 20, 1)), memory.clone(), cfg) {
            Err(e) => assert!(e.to_string().contains(field), "{field}: {e}"),
            Ok(_) => panic!("{field}: accepted"),
        }
    }
    // A day is accepted.
    let cfg = one_group()
        .with_drop_timeout(day)
        .with_save_backoff(backoff(day, day));
    assert!(TierConnector::new(Arc::new(MemoryTier::new(1 << 20, 1)), memory, cfg).is_ok());
}

/// A connector built for other cache groups (another block size, another group list, another
/// scheduler block size) would write each group's blocks at another size than the engine reads
/// them: the runtime refuses to start with it, naming the connector; the same geometry starts.
#[test]
fn a_runtime_refuses_a_connector_built_for_another_geometry() {
    use kvsched::{MambaMode, Runtime, RuntimeError};
    let hybrid = vec![
        CacheGroup::full_attention(16),
        CacheGroup::mamba(32, MambaMode::Align),
    ];
    let runtime = |groups: Vec<CacheGroup>, s: Option<u64>, cfg: TierConnectorConfig| {
        let c = Arc::new(connector(Arc::new(MemoryTier::new(1 << 20, 1)), cfg));
        let mut b = Runtime::builder()
            .groups(groups)
            .pool_blocks(64)
            .connector(c);
        if let Some(s) = s {
            b = b.scheduler_block_size(s);
        }
        b.build()
    };
    let cfg = || TierConnectorConfig::default().with_groups(hybrid.clone());
    let mismatches = [
        (vec![CacheGroup::full_attention(16)], None, cfg()),
        (
            vec![
                CacheGroup::full_attention(32),
                CacheGroup::mamba(32, MambaMode::Align),
            ],
            None,
            cfg(),
        ),
        (hybrid.clone(), Some(64), cfg()),
        (
            hybrid.clone(),
            None,
            cfg().with_scheduler_block_size(Some(64)),
        ),
    ];
    for (groups, s, cfg) in mismatches {
        match runtime(groups.clone(), s, cfg) {
            Err(RuntimeError::Config { field, problem }) => {
                assert_eq!(field, "connector", "{problem}");
            }
            other => panic!("{groups:?}, S {s:?}: started: {:?}", other.map(|_| ())),
        }
    }
    let rt = runtime(hybrid.clone(), None, cfg()).expect("the same geometry starts");
    drop(rt.shutdown());
    let rt = runtime(
        hybrid.clone(),
        Some(64),
        cfg().with_scheduler_block_size(Some(64)),
    )
    .expect("the same S starts");
    drop(rt.shutdown());
}
