//! What each kind of job does on a worker thread: a store (slots → chunks → the store) and a
//! load (the store → checked chunks → slots), each in batches of bounded size, and an
//! existence probe, each recording its result in the [`Index`](crate::tier_index::Index) and the
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

/// A load job asks the store for its values in batches of at most this many bytes of chunks
/// (at least one key each: the store hands back no value longer than a chunk), and checks and
/// writes each batch before asking for the next, so the values a job holds at once — its
/// memory beyond the buffer — are bounded by this or one chunk, whichever is more, however
/// many blocks it has.
pub(crate) const LOAD_BATCH_BYTES: usize = 4 << 20;

/// Runs a load job; whether every block was loaded and passed its checks. The job is asked of
/// the store in batches ([`LOAD_BATCH_BYTES`]); it stops at the first batch that does not
/// deliver every block, and at the tier's shutdown (checked between batches). Each key it
/// could not deliver is failed in the index (not promised, nor probed, until this tier stores
/// it again); the keys of the batches it never asked for are left as they were.
pub(crate) fn run_load(s: &Shared, job: &Job) -> bool {
    let block_bytes = s.region.block_bytes();
    let chunk_bytes = s.codec.encoded_len(block_bytes).max(1);
    // The plant `tier-load-one-batch` (scripts/plants.sh): the whole job is one batch, every
    // value held at once.
    let per_batch = if cfg!(kvsched_plant = "tier-load-one-batch") {
        usize::MAX
    } else {
        (LOAD_BATCH_BYTES / chunk_bytes).max(1)
    };
    let mut misses: Vec<(ChunkKey, LoadMiss)> = Vec::new();
    let mut stopped = job.keys.len() != job.blocks.len();
    // Reused from batch to batch: each keeps the capacity of the largest value it took.
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut held: Vec<bool> = Vec::new();
    for (keys, blocks) in job.keys.chunks(per_batch).zip(job.blocks.chunks(per_batch)) {
        if stopped || !misses.is_empty() || s.cancel.is_cancelled() {
            stopped = true;
            break;
        }
        bufs.resize_with(keys.len(), Vec::new);
        held.resize(keys.len(), false);
        match s.tier.get_into(keys, &s.cancel, &mut bufs, &mut held) {
            Ok(()) => {
                for (((&key, &block), value), &got) in keys.iter().zip(blocks).zip(&bufs).zip(&held)
                {
                    if !got {
                        misses.push((key, LoadMiss::Absent));
                        continue;
                    }
                    match s.codec.decode(value, key, 0, block_bytes as u64) {
                        Ok(payload) if s.region.write(block, payload) => {}
                        Ok(_) => misses.push((key, LoadMiss::Absent)),
                        Err(_) => misses.push((key, LoadMiss::Bad)),
                    }
                }
            }
            // Stopped by the tier's shutdown: nothing learnt about the keys.
            Err(TierError::Cancelled) => stopped = true,
            // The store's call failed as a whole: none of its keys can be loaded now, and a
            // probe may well find them held (a Redis value past the chunk bound).
            Err(_) => misses.extend(keys.iter().map(|&k| (k, LoadMiss::Unreadable))),
        }
    }
    drop(bufs);
    let c = &s.counters;
    if !stopped && misses.is_empty() {
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
