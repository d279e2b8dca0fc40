//! `NativeTier`: the native half of `kvsched.tier.KvschedTierManager` — a kvsched tier
//! (memory, disk, Redis) behind vLLM's secondary-tier calls on a host KV buffer. Every method
//! returns at once; the jobs run on the tier's threads ([`Jobs`]). Keys are vLLM's
//! `OffloadKey` bytes, hashed with the layout tag into a [`ChunkKey`]; every value the tier
//! stores is a chunk of the chunk format (`docs/kv-format.md`: header, checksum, and the keyed
//! MAC when a key is given), checked on every load, so a damaged, forged or evicted chunk is a
//! failed job, never wrong KV.
//!
//! The class is frozen: every method takes `&self`, so `shutdown` may run while other threads
//! call the tier (they then see it stopped: jobs fail at once), and no call ever meets a
//! borrow error. Dropping it stops and joins the threads with the GIL released.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use kvsched::kv::{ChunkCodec, ChunkKey, DiskTier};
use kvsched::sync::fork_safe::Lock;
use kvsched::sync::Ordering;

use crate::tier_index::Index;
use crate::tier_jobs::Jobs;
use crate::tier_region::Region;
use crate::tier_store::{Store, StoreArgs};

/// How often a wait for the tier's jobs ([`NativeTier::wait_idle`]) lets Python handle
/// signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

fn bad(field: &str, problem: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{field}: {problem}"))
}

/// A kvsched tier serving vLLM's secondary-tier calls on a host KV buffer.
#[pyclass(module = "kvsched._native", frozen)]
pub struct NativeTier {
    // Field order matters: `jobs` (the threads using the buffer) drops, and joins, first.
    jobs: Jobs,
    store: Store,
    tag: u64,
    num_blocks: u64,
    /// The export of the primary tier's buffer, released by `shutdown` once the threads are
    /// joined (the primary tier then closes its mmap), else when the tier drops.
    buffer: Lock<Option<PyUntypedBuffer>>,
}

impl NativeTier {
    fn key(&self, key: &[u8]) -> ChunkKey {
        ChunkKey(xxhash_rust::xxh3::xxh3_128_with_seed(key, self.tag))
    }

    fn job(&self, keys: &[Vec<u8>], block_ids: &[u64]) -> PyResult<(Vec<ChunkKey>, Vec<u64>)> {
        if keys.len() != block_ids.len() {
            return Err(bad(
                "block_ids",
                format!("{} block ids for {} keys", block_ids.len(), keys.len()),
            ));
        }
        if let Some((i, b)) = block_ids
            .iter()
            .enumerate()
            .find(|(_, &b)| b >= self.num_blocks)
        {
            return Err(bad(
                &format!("block_ids[{i}]"),
                format!("{b} is not below the buffer's {} blocks", self.num_blocks),
            ));
        }
        Ok((
            keys.iter().map(|k| self.key(k)).collect(),
            block_ids.to_vec(),
        ))
    }
}

#[pymethods]
impl NativeTier {
    /// `NativeTier(buffer, num_blocks, store="memory", *, capacity_bytes=1 GiB, path=None,
    /// url=None, mac_key=None, threads=4, tag=0, probe=None)`: `buffer` a writable,
    /// C-contiguous buffer of `num_blocks` equal slots; `path` a `str` or path-like, taken as
    /// an OS path (a `str` with `os.fsdecode`'s surrogates names the bytes they stand for).
    #[new]
    #[pyo3(signature = (buffer, num_blocks, store = "memory", *, capacity_bytes = 1 << 30,
        path = None, url = None, mac_key = None, threads = 4, tag = 0, probe = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        buffer: &Bound<'_, PyAny>,
        num_blocks: u64,
        store: &str,
        capacity_bytes: u64,
        path: Option<PathBuf>,
        url: Option<&str>,
        mac_key: Option<Vec<u8>>,
        threads: usize,
        tag: u64,
        probe: Option<bool>,
    ) -> PyResult<NativeTier> {
        let export = PyUntypedBuffer::get(buffer).map_err(|e| bad("primary_kv_view", e))?;
        if export.readonly() {
            return Err(bad("primary_kv_view", "is read-only; loads write into it"));
        }
        if !export.is_c_contiguous() {
            return Err(bad("primary_kv_view", "must be C-contiguous"));
        }
        let len = export.len_bytes();
        let n = usize::try_from(num_blocks).unwrap_or(usize::MAX);
        if n == 0 || len % n != 0 || len == 0 {
            return Err(bad(
                "num_blocks",
                format!("{num_blocks} does not divide the buffer's {len} bytes into equal blocks"),
            ));
        }
        let block_bytes = len / n;
        let mac_key = match mac_key {
            None => None,
            Some(k) => Some(
                <[u8; 32]>::try_from(k.as_slice())
                    .map_err(|_| bad("mac_key", format!("must be 32 bytes, got {}", k.len())))?,
            ),
        };
        if !(1..=256).contains(&threads) {
            return Err(bad("threads", format!("must be 1 to 256, got {threads}")));
        }
        let chunk_bytes = ChunkCodec::new(mac_key).encoded_len(block_bytes) as u64;
        // A memory or disk tier smaller than one block's chunk (a disk tier's in its pack
        // file) would refuse every store: nothing would ever be cached, and nothing said why.
        let min_capacity = match store {
            "memory" => chunk_bytes,
            "disk" => DiskTier::pack_bytes(&[chunk_bytes]),
            _ => 0,
        };
        if capacity_bytes < min_capacity {
            return Err(bad(
                "capacity_bytes",
                format!(
                    "{capacity_bytes} holds no block; store={store:?} needs at least \
                     {min_capacity} (one block of {block_bytes} bytes as a chunk)"
                ),
            ));
        }
        let opened = Store::open(&StoreArgs {
            kind: store,
            capacity_bytes,
            max_value_bytes: chunk_bytes,
            path: path.as_deref(),
            url,
        })
        .map_err(|(field, problem)| bad(field, problem))?;
        // Safety: the export stays owned by this `NativeTier` until after `jobs` (every thread
        // holding the region) has been stopped and joined: `jobs` is dropped first (field
        // order), and `shutdown` releases it only after joining them (a stopped pool runs no
        // job again: every job submitted later fails unrun, touching no slot). It was checked
        // writable and contiguous.
        let region = unsafe { Region::new(export.buf_ptr().cast::<u8>(), len, block_bytes) };
        let jobs = Jobs::start(
            opened.clone(),
            region,
            ChunkCodec::new(mac_key),
            probe.unwrap_or_else(|| opened.shared()),
            Index::cap_for(capacity_bytes, chunk_bytes),
            threads,
        )
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the tier's threads: {e}")))?;
        Ok(NativeTier {
            jobs,
            store: opened,
            tag,
            num_blocks,
            buffer: Lock::new(Some(export)),
        })
    }

    /// Bytes per block of the buffer.
    #[getter]
    fn block_bytes(&self) -> u64 {
        self.jobs_block_bytes()
    }

    /// `True` present, `False` not here, `None` being transferred or probed (ask again).
    fn lookup(&self, key: Vec<u8>) -> Option<bool> {
        self.jobs.lookup(self.key(&key))
    }

    /// Enqueues a store of the slots `block_ids` under `keys`.
    fn submit_store(&self, job_id: u64, keys: Vec<Vec<u8>>, block_ids: Vec<u64>) -> PyResult<()> {
        let (keys, blocks) = self.job(&keys, &block_ids)?;
        self.jobs.submit_store(job_id, keys, blocks);
        Ok(())
    }

    /// Enqueues a load of `keys` into the slots `block_ids`.
    fn submit_load(&self, job_id: u64, keys: Vec<Vec<u8>>, block_ids: Vec<u64>) -> PyResult<()> {
        let (keys, blocks) = self.job(&keys, &block_ids)?;
        self.jobs.submit_load(job_id, keys, blocks);
        Ok(())
    }

    /// `[(job_id, success)]` of the jobs finished since the last call.
    fn get_finished(&self) -> Vec<(u64, bool)> {
        self.jobs.take_finished()
    }

    /// Waits (without the GIL) until no job is queued or running, at most `timeout` seconds;
    /// whether that happened.
    /// Signals are checked every [`SIGNAL_CHECK`] meanwhile, so a `KeyboardInterrupt` ends
    /// the wait (the jobs go on).
    #[pyo3(signature = (timeout = 10.0))]
    fn wait_idle(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let t = Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX);
        let start = Instant::now();
        loop {
            let slice = t.saturating_sub(start.elapsed()).min(SIGNAL_CHECK);
            if py.detach(|| self.jobs.wait_idle(slice)) {
                return Ok(true);
            }
            if start.elapsed() >= t {
                return Ok(false);
            }
            // The plant `wait-ignores-signals` (scripts/plants.sh): no signal is handled until
            // the jobs end, so Ctrl-C waits out a hung store.
            if !cfg!(kvsched_plant = "wait-ignores-signals") {
                py.check_signals()?;
            }
        }
    }

    /// Fault injection for tests: flips the bits of byte `offset` of the stored chunk of `key`
    /// (the header is 48 bytes, then the MAC if any, then the payload). Whether it was held.
    fn damage(&self, py: Python<'_>, key: Vec<u8>, offset: usize) -> PyResult<bool> {
        let k = self.key(&key);
        py.detach(|| {
            self.store.edit(k, |v| match v.get_mut(offset) {
                Some(b) => {
                    *b ^= 0xFF;
                    true
                }
                None => false,
            })
        })
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Fault injection for tests: removes the stored chunk of `key` behind the tier's back
    /// (what an eviction by another engine, or a lost node, does). Whether it was held.
    fn remove(&self, py: Python<'_>, key: Vec<u8>) -> PyResult<bool> {
        let k = self.key(&key);
        py.detach(|| self.store.remove(k))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Counters: blocks stored and loaded, failed jobs, missing, bad and unreadable chunks
    /// (not held; held but failing a check; asked in a store call that failed), probes; and
    /// the keys the index holds answered present, failed and absent (each set bounded).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.jobs.counters();
        let d = PyDict::new(py);
        for (name, v) in [
            ("stored_blocks", &c.stored_blocks),
            ("loaded_blocks", &c.loaded_blocks),
            ("failed_stores", &c.failed_stores),
            ("failed_loads", &c.failed_loads),
            ("missing_chunks", &c.missing_chunks),
            ("bad_chunks", &c.bad_chunks),
            ("unreadable_chunks", &c.unreadable_chunks),
            ("probes", &c.probes),
        ] {
            d.set_item(name, v.load(Ordering::Relaxed))?;
        }
        let lens = self.jobs.index_lens();
        d.set_item("present_keys", lens.present)?;
        d.set_item("failed_keys", lens.failed)?;
        d.set_item("absent_keys", lens.absent)?;
        Ok(d)
    }

    /// Stops and joins the threads without the GIL (queued jobs are dropped, running ones
    /// cancelled). Idempotent; other threads may call the tier meanwhile.
    /// The buffer's export is then released (with the GIL held, as the buffer protocol
    /// requires), so the primary tier may close the memory behind it.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.jobs.stop());
        // In a forked child `stop` joins nothing, but the child has none of the threads:
        // nothing there uses the region either.
        let export = self.buffer.lock().take();
        drop(export);
    }

    /// Whether this is a process forked from the one that created the tier (where it runs
    /// nothing: every job fails at once).
    fn forked(&self) -> bool {
        self.jobs.forked()
    }
}

impl Drop for NativeTier {
    fn drop(&mut self) {
        // Joining waits for the running jobs (a store's `put` up to the store's call timeout):
        // without the GIL, so the other Python threads run meanwhile. During interpreter
        // shutdown there is no detaching; the join then holds the GIL, as it must.
        let jobs = &self.jobs;
        // The plant `tier-drop-holds-gil` (scripts/plants.sh): the join holds the GIL, and
        // every other Python thread stops while a store waits on a silent server.
        if cfg!(kvsched_plant = "tier-drop-holds-gil") {
            jobs.stop();
            return;
        }
        if Python::try_attach(|py| py.detach(|| jobs.stop())).is_none() {
            jobs.stop();
        }
    }
}

impl NativeTier {
    fn jobs_block_bytes(&self) -> u64 {
        self.jobs.block_bytes() as u64
    }
}
