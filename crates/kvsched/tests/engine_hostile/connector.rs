//! The bytes and the connector of the `engine_hostile` tests. Every block holds one tag per
//! token (`Mem`): a load or a step writes the tag the request's own tokens give, a failed load
//! poison. The connector's loads fail, panic, hang, name blocks they were not given or
//! scribble late (`Act`), each through `LoadJob::may_write`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{
    InvalidBlocks, KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult,
};
use kvsched::{BlockRef, CacheGroup};

pub const POISON: u64 = 0xdead_beef;

pub fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

/// The tag of token `pos` of group `g` for a request with `prompt`; past the prompt, the
/// request's own generated tokens (`id`).
pub fn tag(g: usize, prompt: &[u32], id: &str, pos: usize) -> u64 {
    let mut h = mix(g as u64 + 1, 7);
    if pos < prompt.len() {
        for &t in &prompt[..=pos] {
            h = mix(h, t as u64);
        }
    } else {
        for b in id.bytes() {
            h = mix(h, b as u64);
        }
        h = mix(h, pos as u64 + 1_000_000);
    }
    h
}

pub struct Mem {
    bs: usize,
    tags: Vec<AtomicU64>,
}

impl Mem {
    pub fn new(blocks: usize, bs: usize) -> Self {
        Mem {
            bs,
            tags: (0..blocks * bs).map(|_| AtomicU64::new(0)).collect(),
        }
    }
    pub fn set(&self, b: BlockRef, off: usize, v: u64) {
        self.tags[b.id as usize * self.bs + off].store(v, Ordering::SeqCst);
    }
    pub fn get(&self, b: BlockRef, off: usize) -> u64 {
        self.tags[b.id as usize * self.bs + off].load(Ordering::SeqCst)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    Ok,
    FailAll,
    /// Fail the second half, write the first.
    FailHalf,
    /// Write poison everywhere, name only blocks that are not its own.
    FailForeign,
    Panic,
    /// Wait for the gate, then write poison where may_write allows and report Ok.
    HangThenScribble,
    /// Sleep this many ms, then write correctly.
    Slow(u64),
    /// Wait until cancelled, then 10 ms more, scribble poison where allowed, report Ok.
    HangUntilCancel,
    /// Wait until cancelled (or the deadline), then this many ms more (its blocks parked all
    /// that time), scribble poison where allowed, report Ok.
    HangPastCancel(u64),
}

pub struct Conn {
    pub mem: Arc<Mem>,
    pub groups: Vec<CacheGroup>,
    pub offer_async: bool,
    pub act: Box<dyn Fn(&LoadJob) -> Act + Send + Sync>,
    pub gate: AtomicBool,
    pub loads: AtomicU64,
    pub lookup_panic: AtomicBool,
}

impl KvConnector for Conn {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        if self.lookup_panic.load(Ordering::SeqCst) {
            panic!("lookup panics");
        }
        let bs = self.mem.bs as u64;
        // The store holds every prompt's full blocks but the last token's.
        let have = (q.prompt.len() as u64 - 1) / bs * bs;
        LookupResult {
            external_tokens: have.saturating_sub(q.local_tokens),
            load_async: self.offer_async,
        }
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        self.loads.fetch_add(1, Ordering::SeqCst);
        let act = (self.act)(job);
        let write = |correct: bool, filter: &dyn Fn(usize) -> bool| {
            let mut n = 0;
            for g in 0..job.block_tables.len() {
                let b = job.block_sizes[g] as usize;
                for i in job.loaded_range(g) {
                    if !filter(n) {
                        n += 1;
                        continue;
                    }
                    n += 1;
                    if let Some(blk) = job.may_write(g, i) {
                        for off in 0..b {
                            let pos = i * b + off;
                            if let kvsched::GroupKind::Mamba { mode } = self.groups[g].kind {
                                let end = pos as u64 + 1 == job.end_tokens;
                                let block_end = off + 1 == b && mode == kvsched::MambaMode::All;
                                if !(end || block_end) {
                                    continue;
                                }
                            }
                            let v = if correct && (pos as u64) < job.end_tokens {
                                tag(g, &job.tokens, "", pos)
                            } else {
                                POISON
                            };
                            self.mem.set(blk, off, v);
                        }
                    }
                }
            }
        };
        match act {
            Act::Ok => {
                write(true, &|_| true);
                LoadResult::Ok
            }
            Act::Slow(ms) => {
                std::thread::sleep(Duration::from_millis(ms));
                write(true, &|_| true);
                LoadResult::Ok
            }
            Act::FailAll => {
                write(false, &|_| true);
                LoadResult::all_failed(job)
            }
            Act::FailHalf => {
                let all = job.all_loaded_blocks();
                let half = all.len() / 2;
                write(true, &|n| n < half);
                write(false, &|n| n >= half);
                LoadResult::Failed(InvalidBlocks::Flat(all[half..].to_vec()))
            }
            Act::FailForeign => {
                write(false, &|_| true);
                LoadResult::Failed(InvalidBlocks::Flat(vec![
                    BlockRef {
                        id: u64::MAX,
                        generation: u32::MAX,
                    },
                    BlockRef {
                        id: 1,
                        generation: 0,
                    },
                ]))
            }
            Act::Panic => {
                write(false, &|_| true);
                panic!("load panics")
            }
            Act::HangUntilCancel => {
                while !job.cancel.is_cancelled() && job.deadline.is_none_or(|d| Instant::now() < d)
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(10));
                write(false, &|_| true);
                LoadResult::Ok
            }
            Act::HangPastCancel(ms) => {
                while !job.cancel.is_cancelled() && job.deadline.is_none_or(|d| Instant::now() < d)
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(ms));
                write(false, &|_| true);
                LoadResult::Ok
            }
            Act::HangThenScribble => {
                while !self.gate.load(Ordering::SeqCst) && !job.cancel.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                while !self.gate.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                write(false, &|_| true);
                LoadResult::Ok
            }
        }
    }
}
