//! A hostile connector over a `TierConnector`: panics, sleeps, hangs until released,
//! scribbles after its deadline without asking `may_write`, lies Ok, reports other
//! requests' blocks and nonsense generations, offers more than the prompt holds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvsched::connector::{
    InvalidBlocks, KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult, Prepared,
};
use kvsched::kv::{KvMemory, TierConnector};
use kvsched::BlockRef;

/// What the hostile connector does.
#[derive(Default, Clone, Copy)]
pub struct Hostility {
    /// Panic in every n-th prepare / lookup / load (0: never).
    pub panic_every: u64,
    /// Offer this many external tokens whatever the prompt (None: the inner answer).
    pub offer: Option<u64>,
    /// Sleep this long in a load, ignoring the cancel token.
    pub sleep: Duration,
    /// After sleeping, overwrite every destination with garbage without asking may_write.
    pub late_scribble: bool,
    /// Return Ok without writing anything.
    pub ok_without_writing: bool,
    /// Fail naming other requests' blocks, an out-of-range id and wrong generations.
    pub foreign_reports: bool,
    /// Fill nothing (poison every destination it may write) and fail naming its own
    /// destinations at their generation plus this (wrapping).
    pub poison_misnamed: Option<u32>,
    /// Fill nothing (poison) and fail naming no block at all (`Flat` or `ByGroup`, empty).
    pub poison_fail_empty: bool,
    /// Block in load until `release` is set.
    pub hang_until_released: bool,
}

pub struct Hostile {
    pub inner: Arc<TierConnector>,
    pub mem: Arc<dyn KvMemory>,
    pub h: Hostility,
    pub calls: AtomicU64,
    pub seen: Mutex<Vec<BlockRef>>,
    pub release: AtomicBool,
    pub loads_started: AtomicU64,
}

impl Hostile {
    pub fn new(inner: Arc<TierConnector>, h: Hostility) -> Arc<Self> {
        let mem = Arc::clone(inner.memory());
        Arc::new(Hostile {
            inner,
            mem,
            h,
            calls: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
            release: AtomicBool::new(false),
            loads_started: AtomicU64::new(0),
        })
    }
    fn maybe_panic(&self, what: &str) {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if self.h.panic_every > 0 && n % self.h.panic_every == 0 {
            panic!("hostile connector panics in {what}");
        }
    }
}

impl KvConnector for Hostile {
    fn prepare(&self, request: &str, prompt: &[u32]) -> Option<Prepared> {
        self.maybe_panic("prepare");
        self.inner.prepare(request, prompt)
    }
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        self.maybe_panic("lookup");
        let mut r = self.inner.lookup(q);
        if let Some(o) = self.h.offer {
            r.external_tokens = o;
        }
        r
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        self.loads_started.fetch_add(1, Ordering::SeqCst);
        self.maybe_panic("load");
        if self.h.hang_until_released {
            while !self.release.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        if !self.h.sleep.is_zero() {
            std::thread::sleep(self.h.sleep);
        }
        if self.h.late_scribble {
            for (g, t) in job.block_tables.iter().enumerate() {
                let bytes = self.mem.layout().bytes_per_block(g).unwrap();
                for i in job.loaded_range(g) {
                    if t[i].id != 0 {
                        let _ = self.mem.write(g, t[i].id, 0, &vec![0x5Au8; bytes]);
                    }
                }
            }
            return LoadResult::Ok;
        }
        if self.h.ok_without_writing {
            return LoadResult::Ok;
        }
        let r = self.inner.load(job);
        if self.h.poison_fail_empty {
            for g in 0..job.block_tables.len() {
                for i in job.loaded_range(g) {
                    if let Some(b) = job.may_write(g, i) {
                        let _ = self.mem.poison(g, b.id);
                    }
                }
            }
            let n = self.calls.load(Ordering::Relaxed);
            return LoadResult::Failed(if n % 2 == 0 {
                InvalidBlocks::Flat(vec![])
            } else {
                InvalidBlocks::ByGroup(vec![])
            });
        }
        if let Some(delta) = self.h.poison_misnamed {
            let mut bad = Vec::new();
            for (g, t) in job.block_tables.iter().enumerate() {
                for i in job.loaded_range(g) {
                    if let Some(b) = job.may_write(g, i) {
                        let _ = self.mem.poison(g, b.id);
                    }
                    if t[i].id != 0 {
                        bad.push(BlockRef {
                            id: t[i].id,
                            generation: t[i].generation.wrapping_add(delta),
                        });
                    }
                }
            }
            return LoadResult::Failed(InvalidBlocks::Flat(bad));
        }
        if self.h.foreign_reports {
            let mut seen = self.seen.lock().unwrap();
            let own = job.all_loaded_blocks();
            let mut bad: Vec<BlockRef> = seen
                .iter()
                .filter(|b| !own.contains(b))
                .take(8)
                .copied()
                .collect();
            bad.push(BlockRef {
                id: 1 << 30,
                generation: 1,
            });
            bad.push(BlockRef {
                id: 0,
                generation: 0,
            });
            for b in &own {
                bad.push(BlockRef {
                    id: b.id,
                    generation: b.generation.wrapping_sub(1),
                });
            }
            seen.extend(own);
            return LoadResult::Failed(InvalidBlocks::Flat(bad));
        }
        r
    }
}
