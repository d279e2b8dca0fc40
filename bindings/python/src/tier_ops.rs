//! What each kind of job does on a worker thread: a store (slots → chunks → the store, in
//! batches of bounded size), a load (the store → checked chunks → slots) and an existence
//! probe, each recording its result in the [`Index`](crate::tier_index::Index) and the
//! counters.

use kvsched::kv::{ChunkKey, TierError};
use kvsched::sync::Ordering;

use crate::tier_index::LoadMiss;
use crate::tier_jobs::{Job, Shared};

/// A store job hands the store its chunks in batches of about this many bytes (a batch
/// closes at the first chunk that reaches it), so the chunks a job holds encoded at once — its
/// memory beyond the buffer — are bounded by this plus one chunk, however many blocks it has.
pub(crate) const STORE_BATCH_BYTES: usize = 4 << 20;

/// Runs a store job; whether every block was stored. A job the tier's shutdown cancelled
/// stops at its next batch. A store that fails part way may leave its first batches stored;
/// the index counts none of its keys as present (a later lookup may find them by a probe).
pub(crate) fn run_store(s: &Shared, job: &Job) -> bool {
    let mut ok = true;
    let mut batch: Vec<(ChunkKey, Vec<u8>)> = Vec::new();
    let mut batch_bytes = 0usize;
    for (&key, &block) in job.keys.iter().zip(&job.blocks) {
        if s.cancel.is_cancelled() {
            ok = false;
            break;
        }
        let Some(payload) = s.region.read(block) else {
            ok = false;
            break;
        };
        let chunk = s.codec.encode(key, 0, 0, &payload);
        drop(payload);
        batch_bytes += chunk.len();
        batch.push((key, chunk));
        // The plant `tier-store-one-batch` (scripts/plants.sh): the whole job is one batch,
        // its encoded size held at once.
        if batch_bytes >= STORE_BATCH_BYTES && !cfg!(kvsched_plant = "tier-store-one-batch") {
            ok = s.tier.put(&batch).is_ok();
            batch.clear();
            batch_bytes = 0;
            if !ok {
                break;
            }
        }
    }
    if ok && !batch.is_empty() {
        ok = !s.cancel.is_cancelled() && s.tier.put(&batch).is_ok();
    }
    drop(batch);
    let mut ix = s.index.lock();
    for &key in &job.keys {
        ix.end_store(key, ok);
    }
    drop(ix);
    let c = &s.counters;
    if ok {
        c.stored_blocks
            .fetch_add(job.keys.len() as u64, Ordering::Relaxed);
    } else {
        c.failed_stores.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

/// Runs a load job; whether every block was loaded and passed its checks. Each key it could not
/// deliver is failed in the index (not promised, nor probed, until this tier stores it again).
pub(crate) fn run_load(s: &Shared, job: &Job) -> bool {
    let block_bytes = s.region.block_bytes() as u64;
    let got = s.tier.get(&job.keys, &s.cancel);
    let mut misses: Vec<(ChunkKey, LoadMiss)> = Vec::new();
    match got {
        Ok(values) => {
            for ((&key, &block), value) in job.keys.iter().zip(&job.blocks).zip(values) {
                let Some(value) = value else {
                    misses.push((key, LoadMiss::Absent));
                    continue;
                };
                match s.codec.decode(&value, key, 0, block_bytes) {
                    Ok(payload) if s.region.write(block, payload) => {}
                    Ok(_) => misses.push((key, LoadMiss::Absent)),
                    Err(_) => misses.push((key, LoadMiss::Bad)),
                }
            }
        }
        // Stopped by the tier's shutdown: nothing learnt about the keys.
        Err(TierError::Cancelled) => {}
        // The store's call failed as a whole: none of its keys can be loaded now, and a probe
        // may well find them held (a Redis value of the wrong type or past the chunk bound).
        Err(_) => misses.extend(job.keys.iter().map(|&k| (k, LoadMiss::Unreadable))),
    }
    let c = &s.counters;
    let ok = misses.is_empty() && job.keys.len() == job.blocks.len();
    if ok {
        c.loaded_blocks
            .fetch_add(job.keys.len() as u64, Ordering::Relaxed);
        return true;
    }
    c.failed_loads.fetch_add(1, Ordering::Relaxed);
    let mut ix = s.index.lock();
    for &(key, why) in &misses {
        let counter = match why {
            LoadMiss::Absent => &c.missing_chunks,
            LoadMiss::Bad => &c.bad_chunks,
            LoadMiss::Unreadable => &c.unreadable_chunks,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        ix.load_missed(key, why);
    }
    false
}

/// Runs a probe job: asks the store whether it holds each key.
pub(crate) fn run_probe(s: &Shared, job: &Job) {
    s.counters.probes.fetch_add(1, Ordering::Relaxed);
    let found = s
        .store
        .probe(&job.keys, &s.cancel)
        .unwrap_or_else(|_| vec![false; job.keys.len()]);
    let mut ix = s.index.lock();
    for (&key, exists) in job.keys.iter().zip(found) {
        ix.end_probe(key, exists);
    }
}
