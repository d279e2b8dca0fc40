//! KV memory that refuses or panics on some of a load's writes (an engine's device memory
//! failing a copy): the `TierConnector` must not report such a block loaded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use kvsched::kv::{
    HostKvMemory, KvLayout, KvMemory, KvMemoryError, MemoryTier, TierConnector, TierConnectorConfig,
};
use kvsched::rules::geometry::BlockId;
use kvsched::{CacheGroup, MambaMode};

/// Refuses (or panics on) block-sized writes (a load's copies; the engine writes one token
/// or one state at a time) into every third block once armed.
struct Flaky {
    inner: HostKvMemory,
    armed: AtomicBool,
    panic: bool,
}

impl KvMemory for Flaky {
    fn layout(&self) -> &KvLayout {
        self.inner.layout()
    }
    fn write(
        &self,
        group: usize,
        block: BlockId,
        offset: usize,
        data: &[u8],
    ) -> Result<(), KvMemoryError> {
        if self.armed.load(Ordering::SeqCst) && data.len() > TOK_BYTES && block % 3 == 0 {
            if self.panic {
                panic!("device copy failed");
            }
            return Err(KvMemoryError::Block(block));
        }
        self.inner.write(group, block, offset, data)
    }
    fn read(
        &self,
        group: usize,
        block: BlockId,
        offset: usize,
        out: &mut [u8],
    ) -> Result<(), KvMemoryError> {
        self.inner.read(group, block, offset, out)
    }
}

fn run(panic: bool) {
    let g = vec![
        CacheGroup::full_attention(12),
        CacheGroup::sliding_window(8, 20),
        CacheGroup::mamba(24, MambaMode::All),
    ];
    let pool = 1024;
    let flaky = Arc::new(Flaky {
        inner: HostKvMemory::new(layout(&g), pool).unwrap(),
        armed: AtomicBool::new(false),
        panic,
    });
    let mem: Arc<dyn KvMemory> = flaky.clone();
    let mut eng = Engine::new(g.clone(), pool);
    eng.mem = Arc::clone(&mem);
    let cfg = TierConnectorConfig::default()
        .with_groups(g.clone())
        .with_async_ratio(0.5)
        .with_probe_on_miss(false);
    let tc =
        Arc::new(TierConnector::new(Arc::new(MemoryTier::new(64 << 20, 4)), mem, cfg).unwrap());
    eng.tier_conn = Some(tc.clone());
    eng.sync_conn = Some(tc.clone());
    for round in 0..2u32 {
        if round == 1 {
            flaky.armed.store(true, Ordering::SeqCst);
        }
        let mut rt = builder(&g, pool).connector(tc.clone()).build().unwrap();
        for i in 0..12u32 {
            eng.submit(
                &rt,
                &format!("r{round}-{i}"),
                prompt(i % 4, 96, round * 100 + i, 100 + i as usize % 5),
                2,
            );
        }
        assert!(
            eng.run_until_idle(&mut rt, Duration::from_secs(10)),
            "never ended: {:?}",
            rt.metrics()
        );
        eng.flush();
        let r = rt.shutdown();
        assert_report_clean(&r, pool);
        assert_eq!(r.metrics.finished, 12, "{r}");
        if round == 1 {
            assert!(
                r.metrics.loads_failed + r.metrics.sync_loads_failed > 0,
                "no load met a refused write: {:?}",
                r.metrics
            );
        }
    }
    eng.assert_clean();
}

#[test]
fn refused_memory_writes_fail_the_block() {
    run(false);
}

#[test]
fn panicking_memory_writes_fail_the_load() {
    run(true);
}
