//! The load path of a [`TierConnector`]: each chunk of a load is verified (key, group,
//! length, checksum, MAC) and its payload copied, once, into its destination block, in one
//! pass over its bytes and with no allocation per chunk — from where the memory tier holds
//! it, or from one of the connector's reused buffers ([`Buffers`](super::buffers::Buffers),
//! filled by [`Tier::get_into`]: a memcpy out of a store, the kernel's copy out of the page
//! cache).
//!
//! **One pass.** The header is checked first (format, length, key, group, a MAC present when
//! the connector has a key): a chunk naming another block never reaches KV memory. Then the
//! payload goes 16 KiB at a time through the checksum (and the MAC) and straight on into the
//! destination while it is still in the core's cache, so a large chunk is read from memory
//! once instead of twice. The checksum is known only at the end: a chunk that fails it has
//! been copied, and its destination is poisoned before the load reports it invalid — the
//! block is the load's alone until its completion (`FILLING`, docs/kv.md), so nobody reads
//! the bytes in between. A destination the load may no longer write is never touched; its
//! chunk is still checked, so damage counts as damage.
//!
//! A tier that never blocks (the memory tier) is read one chunk at a time where it lies
//! ([`Tier::read_with`]: verified and copied into KV memory under the tier's shard lock, so
//! the memory tier's loads make one copy and one hash pass, no buffer at all). A tier that
//! may block is read in one batched call (one round trip per node for a remote tier) into
//! one buffer per chunk, on the connector's get threads when the load has a deadline
//! ([`BoundedGets`](super::bounded::BoundedGets)): what those threads fill is looked at only
//! if it came in time, so a late answer never writes KV memory. A tier whose calls cost
//! nothing fixed ([`Tier::costs_per_call`] `false`: the disk tier) is read in pieces of
//! about 512 KiB instead, each landed before the next is read, so the copy into KV memory
//! reads the buffers from cache, not from memory.
//!
//! [`Tier::get_into`]: super::Tier::get_into
//! [`Tier::read_with`]: super::Tier::read_with
//! [`Tier::costs_per_call`]: super::Tier::costs_per_call

use std::time::Instant;

use super::{bump, TierConnector};
use crate::connector::LoadJob;
use crate::kv::tier_call::guarded;
use crate::kv::{ChunkErrorClass, ChunkHeader, ChunkKey, TierError};
use crate::pool::BlockRef;

/// One chunk a load wants: its group, its index in the group's table, its key.
pub(super) type Wanted = (usize, usize, ChunkKey);

/// The most chunk bytes one read of a tier without a fixed cost per call carries (at least
/// one chunk): its buffers and the destinations they are copied into stay in a core's L2
/// (1 MiB and up on current server cores) between the read and the verified copy.
const LOAD_PIECE_BYTES: usize = 512 << 10;

impl TierConnector {
    /// Reads, verifies and writes every chunk in `wanted`; each one that cannot be loaded is
    /// poisoned (where the load may still write it) and named in `bad`.
    pub(super) fn fetch(&self, job: &LoadJob, wanted: &[Wanted], bad: &mut [Vec<BlockRef>]) {
        if job.cancel.is_cancelled() {
            self.fail_all(job, wanted, bad);
        } else if self.gets.is_none() && self.reads_in_place() {
            self.fetch_each(job, wanted, bad);
        } else {
            // A tier that may block (on the connector's get threads), or one whose calls
            // carry a fixed cost: one batched read a load, on this thread for the latter.
            self.fetch_batched(job, wanted, bad);
        }
    }

    /// The tier's [`Tier::reads_in_place`](super::Tier::reads_in_place) (asked at
    /// construction, behind the panic guard).
    fn reads_in_place(&self) -> bool {
        if planted!("tier-properties-unguarded") {
            return self.tier.reads_in_place();
        }
        self.reads_in_place
    }

    /// The tier's [`Tier::costs_per_call`](super::Tier::costs_per_call) (asked at
    /// construction, behind the panic guard).
    fn costs_per_call(&self) -> bool {
        if planted!("tier-properties-unguarded") {
            return self.tier.costs_per_call();
        }
        self.costs_per_call
    }

    /// Counts a tier call that failed as a whole (`err`: its error, `None` for an answer of
    /// the wrong shape): a tier error, unless the call ended `Cancelled` because the load's
    /// own token fired — the caller stopped it, the tier did nothing wrong, and
    /// `loads_cancelled` counts the load. A tier that says `Cancelled` while the token has
    /// not fired is in error.
    fn call_failed(&self, job: &LoadJob, err: Option<&TierError>) {
        // (Planted bug `cancelled-call-a-tier-error`, scripts/plants.sh: it counts too, so a
        // run whose client cancels a loading request reports a healthy tier in error.)
        let cancelled = matches!(err, Some(TierError::Cancelled))
            && job.cancel.is_cancelled()
            && !planted!("cancelled-call-a-tier-error");
        if !cancelled {
            bump(&self.counters.tier_errors, 1);
        }
    }

    fn fail_all(&self, job: &LoadJob, wanted: &[Wanted], bad: &mut [Vec<BlockRef>]) {
        for &(g, i, _) in wanted {
            self.fail(job, g, i, bad);
        }
    }

    /// A tier that never blocks and reads in place: one chunk at a time, verified and copied where the tier
    /// holds it ([`Tier::read_with`](super::Tier::read_with): for the memory tier, under its
    /// shard's lock, with no copy out). The load's deadline is checked before each chunk;
    /// once it has passed the rest fail (`loads_late`).
    fn fetch_each(&self, job: &LoadJob, wanted: &[Wanted], bad: &mut [Vec<BlockRef>]) {
        for (n, &w) in wanted.iter().enumerate() {
            if job.deadline.is_some_and(|d| Instant::now() >= d) {
                bump(&self.counters.loads_late, 1);
                self.fail_all(job, &wanted[n..], bad);
                return;
            }
            // The value is landed once: a tier that answers "held" without handing it over
            // leaves the block unwritten, and a second value is not landed over the first.
            let mut landed = false;
            let mut loaded = None;
            let read = guarded("read", || {
                self.tier.read_with(w.2, &job.cancel, &mut |v| {
                    if !std::mem::replace(&mut landed, true) {
                        loaded = self.land(job, w, Some(v), bad);
                    }
                })
            });
            // A chunk counts as loaded only once the tier stands by the value it handed over:
            // one it then disowns (answering "not held", an error, a panic) fails, its block
            // poisoned and reported, and is not counted loaded as well. (Planted bug
            // `disowned-chunk-counted`, scripts/plants.sh: counted at the hand-over.)
            let early = planted!("disowned-chunk-counted");
            if let Some(bytes) = loaded.filter(|_| early) {
                self.count_loaded(w.2, bytes);
            }
            match read {
                // (Planted bug `held-without-value`, scripts/plants.sh: the tier's word that
                // it held the chunk is taken for a chunk landed.)
                Ok(true) if landed || planted!("held-without-value") => {
                    if let Some(bytes) = loaded.filter(|_| !early) {
                        self.count_loaded(w.2, bytes);
                    }
                }
                Ok(true) => {
                    bump(&self.counters.tier_errors, 1);
                    self.fail(job, w.0, w.1, bad);
                }
                Ok(false) if !landed => {
                    self.land(job, w, None, bad);
                }
                Ok(false) => {
                    // Handed over, then disowned: the block fails, if landing had not.
                    if loaded.is_some() {
                        bump(&self.counters.tier_errors, 1);
                        self.index.remove(w.2);
                        self.fail(job, w.0, w.1, bad);
                    }
                }
                Err(e) => {
                    self.call_failed(job, Some(&e));
                    // A value landing failed is failed already; one it wrote fails now.
                    let from = if landed && loaded.is_none() { n + 1 } else { n };
                    if landed {
                        self.index.remove(w.2);
                    }
                    self.fail_all(job, &wanted[from..], bad);
                    return;
                }
            }
        }
        if !wanted.is_empty() {
            self.saver.tier_answered();
        }
    }

    /// A tier that may block: batched reads into one buffer per chunk, each bounded by the
    /// load's deadline when it has one; an answer after the deadline fails the rest of the
    /// load. A tier with a fixed cost per call ([`Tier::costs_per_call`]) is read in one
    /// batch; one without (the disk tier) in pieces of about [`LOAD_PIECE_BYTES`], so each
    /// piece is verified and copied out of buffers still in the core's cache instead of out
    /// of a whole batch's worth of buffers (up to 32 MiB) that no cache holds.
    ///
    /// [`Tier::costs_per_call`]: super::Tier::costs_per_call
    fn fetch_batched(&self, job: &LoadJob, wanted: &[Wanted], bad: &mut [Vec<BlockRef>]) {
        let piece = if self.costs_per_call() {
            wanted.len()
        } else {
            let chunk = self
                .codec
                .encoded_len(self.memory.layout().max_block_bytes());
            LOAD_PIECE_BYTES / chunk.max(1)
        };
        let mut rest = wanted;
        while !rest.is_empty() {
            let (part, tail) = rest.split_at(piece.clamp(1, rest.len()));
            // (Planted bug `load-pieces-drop-tail`, scripts/plants.sh: a last piece shorter
            // than the others is neither read nor failed, so its blocks are reported loaded
            // holding whatever they held.)
            if planted!("load-pieces-drop-tail") && part.len() < piece {
                return;
            }
            if !self.fetch_piece(job, part, bad) {
                self.fail_all(job, tail, bad);
                return;
            }
            rest = tail;
        }
    }

    /// One batched read of `wanted` and the landing of each chunk; `false` (every chunk of
    /// `wanted` failed) when the tier failed or answered past the load's deadline.
    fn fetch_piece(&self, job: &LoadJob, wanted: &[Wanted], bad: &mut [Vec<BlockRef>]) -> bool {
        let keys: Vec<ChunkKey> = wanted.iter().map(|w| w.2).collect();
        let n = keys.len();
        let bufs = self.buffers.take_n(n);
        let got = match (&self.gets, job.deadline) {
            (Some(gets), Some(deadline)) => gets.get_into(&keys, bufs, &job.cancel, deadline),
            _ => {
                let (mut bufs, mut held) = (bufs, vec![false; n]);
                guarded("get", || {
                    self.tier.get_into(&keys, &job.cancel, &mut bufs, &mut held)
                })
                .map(|()| (bufs, held))
            }
        };
        let got = match got {
            Ok((bufs, held)) if bufs.len() == n && held.len() == n => Some((bufs, held)),
            Ok(_) => {
                self.call_failed(job, None);
                None
            }
            Err(e) => {
                self.call_failed(job, Some(&e));
                None
            }
        };
        // An answer past the load's deadline is a failed load: the runtime has stopped
        // waiting (an async load's blocks are parked; a sync load's step must not read it).
        let got = match got {
            Some((bufs, _)) if job.deadline.is_some_and(|d| Instant::now() >= d) => {
                bump(&self.counters.loads_late, 1);
                self.buffers.give(bufs);
                None
            }
            v => v,
        };
        match got {
            None => {
                self.fail_all(job, wanted, bad);
                false
            }
            Some((bufs, held)) => {
                self.saver.tier_answered();
                for ((&w, buf), h) in wanted.iter().zip(&bufs).zip(held) {
                    if let Some(bytes) = self.land(job, w, h.then_some(&buf[..]), bad) {
                        self.count_loaded(w.2, bytes);
                    }
                }
                self.buffers.give(bufs);
                true
            }
        }
    }

    /// Verifies one chunk's value (`None`: the tier did not hold it) and writes its payload
    /// into the destination block if the load may still write it: in one pass, each block of
    /// the payload copied right after the checksum has read it
    /// ([`ChunkCodec::decode_to`](crate::kv::ChunkCodec)), so the copy reads it from cache.
    /// A chunk whose header names another block or length reaches no destination; one that
    /// fails its checksum or MAC has been copied by then, and its destination is poisoned
    /// before the load reports it (the block is the load's alone until its completion).
    /// Returns the payload's bytes when the block now holds the verified chunk, for the
    /// caller to count ([`count_loaded`](Self::count_loaded)) once the tier stands by it;
    /// `None` when the block failed (poisoned, named in `bad`).
    fn land(
        &self,
        job: &LoadJob,
        (g, i, key): Wanted,
        value: Option<&[u8]>,
        bad: &mut [Vec<BlockRef>],
    ) -> Option<u64> {
        let c = &self.counters;
        let Some(value) = value else {
            bump(&c.missing_chunks, 1);
            self.index.remove(key);
            self.fail(job, g, i, bad);
            return None;
        };
        let bytes = self.memory.layout().bytes_per_block(g).unwrap_or(0) as u64;
        let dest = job.may_write(g, i);
        let mut wrote = None;
        // (Planted bug `load-unverified`, scripts/plants.sh: the payload is taken from after
        // the header without checking checksum, MAC, key or length.)
        let payload = match dest {
            _ if planted!("load-unverified") => ChunkHeader::parse(value)
                .map(|h| value.get(h.payload_offset()..).unwrap_or_default())
                .map_err(|e| e.class()),
            Some(d) => {
                let ok = wrote.insert(true);
                let mut write = |at: usize, b: &[u8]| {
                    *ok &= self.memory.write(g, d.id, at, b).is_ok();
                };
                self.codec
                    .decode_to(value, key, g as u32, bytes, &mut write)
                    .map_err(|e| e.class())
            }
            // Not to be written: checked all the same, so damage is counted as such.
            None => self
                .codec
                .decode(value, key, g as u32, bytes)
                .map_err(|e| e.class()),
        };
        let p = match payload {
            Ok(p) => p,
            Err(class) => {
                bump(
                    match class {
                        ChunkErrorClass::Checksum => &c.checksum_failures,
                        ChunkErrorClass::KeyMismatch => &c.key_mismatches,
                        ChunkErrorClass::Mac => &c.mac_failures,
                        ChunkErrorClass::Format => &c.format_errors,
                    },
                    1,
                );
                self.index.remove(key);
                // (Planted bug `failed-copy-left-unpoisoned`, scripts/plants.sh: a chunk that
                // fails its checksum or MAC after its payload was copied is reported invalid,
                // but its destination keeps the copied bytes instead of poison.)
                if let (true, Some(_), Some(d)) =
                    (planted!("failed-copy-left-unpoisoned"), wrote, dest)
                {
                    bad[g].push(d);
                    return None;
                }
                self.fail(job, g, i, bad);
                return None;
            }
        };
        let Some(dest) = dest else {
            bump(&c.writes_refused, 1);
            self.fail(job, g, i, bad);
            return None;
        };
        let wrote = match wrote {
            Some(w) => w,
            None => self.memory.write(g, dest.id, 0, p).is_ok(),
        };
        if wrote {
            Some(p.len() as u64)
        } else {
            self.fail(job, g, i, bad);
            None
        }
    }

    /// Counts chunk `key` loaded, `bytes` of payload, and indexes it.
    fn count_loaded(&self, key: ChunkKey, bytes: u64) {
        let c = &self.counters;
        bump(&c.chunks_loaded, 1);
        if !self.own.contains(key) {
            bump(&c.chunks_loaded_from_others, 1);
        }
        bump(&c.kv_bytes_loaded, bytes);
        self.index.insert(key);
    }
}
