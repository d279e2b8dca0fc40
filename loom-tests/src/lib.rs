//! loom models of kvsched's concurrent protocols live in `tests/` (one file per race, named
//! after it); run them with `loom-tests/run.sh` and prove they can fail with
//! `loom-tests/plants.sh`.
//!
//! This crate holds only the helpers the models share. Everything here, like every model,
//! exists only under `--cfg kvsched_loom`: a plain `cargo test --workspace` builds nothing.

#![cfg(kvsched_loom)]

use loom::cell::UnsafeCell;

/// Preemption bound used when `LOOM_MAX_PREEMPTIONS` is not set (run.sh always sets it).
pub const DEFAULT_PREEMPTIONS: usize = 2;

/// Runs `f` under loom with the bound from `LOOM_MAX_PREEMPTIONS` (default
/// [`DEFAULT_PREEMPTIONS`]); the other `LOOM_*` variables are read by loom as usual.
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    let bound = builder.preemption_bound;
    let iterations = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = std::sync::Arc::clone(&iterations);
    let start = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    // The test harness names the thread after the test; run.sh shows these lines.
    eprintln!(
        "loom-model {}: {} executions, bound {}, {:.2}s",
        std::thread::current().name().unwrap_or("?"),
        iterations.load(std::sync::atomic::Ordering::Relaxed),
        bound.map_or("none".to_string(), |b| b.to_string()),
        start.elapsed().as_secs_f64()
    );
}

/// The contents of one KV block, as a loom cell: loom reports every pair of accesses that is
/// not ordered by happens-before (a write racing a read or another write) as a failure.
#[derive(Debug)]
pub struct BlockContents(UnsafeCell<u64>);

// SAFETY: every access goes through loom's cell, which fails the model on any access not
// ordered by happens-before, so sharing it is exactly what the models check.
unsafe impl Sync for BlockContents {}

impl BlockContents {
    /// A block holding `v`.
    pub fn new(v: u64) -> Self {
        BlockContents(UnsafeCell::new(v))
    }

    /// Reads the block (loom checks the read is ordered after every write).
    pub fn read(&self) -> u64 {
        // SAFETY: loom tracks the access; a read racing a write fails the model instead of
        // being undefined behaviour (the cell's value is a plain u64).
        self.0.with(|p| unsafe { *p })
    }

    /// Writes the block (loom checks the write is ordered after every other access).
    pub fn write(&self, v: u64) {
        // SAFETY: as in `read`.
        self.0.with_mut(|p| unsafe { *p = v })
    }
}
