//! [`TierConnector`]: the one connector design — it joins a [`Tier`] to the engine's
//! [`KvMemory`]. It answers lookups from a local index (never waiting for the tier), loads by
//! batched gets, verifies every chunk (key, group, length, checksum, MAC), writes KV memory
//! only where the load may write, poisons and reports what it could not fill, and saves
//! computed blocks write-behind on its own threads.

use std::fmt;

use super::bounded::BoundedGets;
use super::buffers::Buffers;
use super::key_index::KeyIndex;
pub use super::prober::Prefetch;
use super::prober::Prober;
use super::saver::{Saver, SaverSettings, Work};
use super::tier_call::{asked, guarded};
pub use super::tier_config::{TierConnectorConfig, TierConnectorError};
pub use super::tier_counts::TierCounts;
use super::{ChunkCodec, ChunkKey, KvMemory, Tier};
use load::Wanted;

#[path = "held_prefix.rs"]
mod held_prefix;
#[path = "tier_load.rs"]
mod load;
use crate::connector::{
    InvalidBlocks, KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult, Prepared,
};
use crate::pool::BlockRef;
use crate::rng::{hash_str, unit_of};
use crate::rules::geometry::{BlockId, CacheGroup, Geometry};
use crate::sync::{Arc, AtomicU64, Ordering};

/// The counts of a connector, as atomics; [`TierCounts`] is their snapshot.
#[derive(Debug, Default)]
struct AtomicCounts {
    lookups: AtomicU64,
    lookup_hits: AtomicU64,
    loads: AtomicU64,
    chunks_loaded: AtomicU64,
    chunks_loaded_from_others: AtomicU64,
    kv_bytes_loaded: AtomicU64,
    load_ns: AtomicU64,
    missing_chunks: AtomicU64,
    checksum_failures: AtomicU64,
    key_mismatches: AtomicU64,
    mac_failures: AtomicU64,
    format_errors: AtomicU64,
    tier_errors: AtomicU64,
    writes_refused: AtomicU64,
    loads_cancelled: AtomicU64,
    loads_late: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A [`KvConnector`] over any [`Tier`] and [`KvMemory`].
///
/// # Guarantees
///
/// * **Nothing unverified is used.** A loaded chunk is written into KV memory only if its
///   header names the expected key, group and length and its checksum (and MAC, with a key)
///   match. Anything else — a missing chunk, damage, a chunk of another prefix, a tier error,
///   a cancelled load — makes the block invalid: it is filled with poison and reported, and
///   the runtime recovers it like any failed load.
/// * **Writes only where allowed.** Each destination is written only after
///   [`LoadJob::may_write`] allows it, i.e. while the runtime still marks the block as owned
///   by this load.
/// * **Lookups never wait for the tier.** They answer from a local index of keys saved,
///   loaded or found by background probes; a chunk gone by load time is a failed block.
/// * **A tier that never answers costs a load its deadline.** The gets of a tier that may
///   block run on the connector's own threads (`get_threads`); a load with a deadline
///   ([`LoadJob::deadline`]: the runtime gives async and sync loads one) waits until then and
///   fails whole, its late answer dropped unread. At most `get_threads` gets hang at once;
///   later ones wait and fail at their deadline ([`TierCounts::gets_busy`], `loads_late`).
/// * **Saves never block the caller** beyond copying the block's bytes: the write-behind
///   queue is bounded and drops (and counts) what does not fit.
/// * **A tier that panics fails the call, nothing more.** A panic in any of its data calls
///   (`get`, `read_with`, `put`, `exists`), on whichever thread makes it — the loading
///   thread, a get thread, the save or the probe thread — counts as a tier error: the
///   call's chunks fail (poisoned and reported, or not saved, or not indexed) and the thread
///   goes on, so later calls work and `flush` returns. Its properties (`may_block`,
///   `reads_in_place`, `costs_per_call`, `expect_values_up_to`) are asked once, by [`new`](Self::new),
///   behind the same guard; one that panics gets its safest answer (calls that may block, one
///   batch a load). A tier whose `read_with` says it held
///   a chunk without handing the value over fails that block too: only bytes the connector
///   verified are ever reported loaded.
///
/// Hybrid lookups offer the largest multiple of `S` at which every group has its chunks
/// (a longer prefix one group cannot resume from is not offered). The tier holds prompt
/// blocks only: decode tokens are not in the step's output, so their keys are unknown.
pub struct TierConnector {
    tier: Arc<dyn Tier>,
    memory: Arc<dyn KvMemory>,
    codec: ChunkCodec,
    cfg: TierConnectorConfig,
    index: Arc<KeyIndex>,
    /// Keys this connector saved or stored (bounded like the index): a load of any other is
    /// a chunk another writer made.
    own: Arc<KeyIndex>,
    saver: Saver,
    /// The background existence checks of keys the index does not know.
    prober: Prober,
    /// The gets of a tier that may block, bounded by each load's deadline.
    gets: Option<BoundedGets>,
    /// The tier's [`Tier::reads_in_place`] and [`Tier::costs_per_call`], asked once.
    reads_in_place: bool,
    costs_per_call: bool,
    /// The buffers loads read chunks into, reused.
    buffers: Buffers,
    /// The scheduler block size `S` lookups offer multiples of.
    s: u64,
    /// The tag every key is chained under: the config's with the layout mixed in
    /// ([`ChunkKey::layout_tag`]).
    key_tag: u64,
    counters: AtomicCounts,
}

impl fmt::Debug for TierConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierConnector")
            .field("tier", &self.tier.name())
            .field("groups", &self.cfg.groups)
            .finish_non_exhaustive()
    }
}

impl TierConnector {
    /// A connector storing `memory`'s blocks in `tier`.
    ///
    /// # Errors
    ///
    /// [`TierConnectorError::Config`] when the memory's layout has another number of groups,
    /// the groups are not a valid geometry, `S` is not a positive multiple of every group's
    /// block size, `async_ratio` is outside `[0, 1]`, `save_cpu_share` outside `(0, 1]`,
    /// `save_batch` 0, or `drop_timeout`, `save_backoff.pause` or `save_backoff.max_pause`
    /// longer than a day;
    /// [`TierConnectorError::Spawn`].
    pub fn new(
        tier: Arc<dyn Tier>,
        memory: Arc<dyn KvMemory>,
        cfg: TierConnectorConfig,
    ) -> Result<TierConnector, TierConnectorError> {
        if memory.layout().num_groups() != cfg.groups.len() {
            return Err(TierConnectorError::Config(format!(
                "groups: {} configured, the KV memory's layout has {}",
                cfg.groups.len(),
                memory.layout().num_groups()
            )));
        }
        let s = Geometry::new(cfg.groups.clone(), cfg.scheduler_block_size, 0)
            .map_err(|e| TierConnectorError::Config(format!("groups: {e}")))?
            .scheduler_block_size();
        cfg.check_values()?;
        let codec = ChunkCodec::new(cfg.mac_key);
        let chunk_bytes = codec.encoded_len(memory.layout().max_block_bytes());
        // The tier's properties are asked here, once, each behind the panic guard its data
        // calls have: a tier panicking in one gets the safest answer (calls that may block,
        // on the connector's get threads, one batch a load). (Planted bug
        // `tier-properties-unguarded`, scripts/plants.sh: asked at every load, unguarded.)
        asked("expect_values_up_to", false, || {
            tier.expect_values_up_to(chunk_bytes);
            false
        });
        let may_block = asked("may_block", true, || tier.may_block());
        let reads_in_place = asked("reads_in_place", false, || tier.reads_in_place());
        let costs_per_call = asked("costs_per_call", true, || tier.costs_per_call());
        let layout = memory.layout();
        let bytes_per_block: Vec<usize> = (0..layout.num_groups())
            .map(|g| layout.bytes_per_block(g).unwrap_or(0))
            .collect();
        // Planted bug `layout-not-in-key` (scripts/plants.sh): keys carry the config's tag
        // alone, so engines of different layouts under the default tag share keys.
        let key_tag = if planted!("layout-not-in-key") {
            cfg.tag
        } else {
            ChunkKey::layout_tag(cfg.tag, &cfg.groups, &bytes_per_block)
        };
        let index = Arc::new(KeyIndex::new(cfg.index_capacity));
        let own = Arc::new(KeyIndex::new(cfg.index_capacity));
        let saver = Saver::start(
            Arc::clone(&tier),
            codec.clone(),
            Arc::clone(&index),
            Arc::clone(&own),
            SaverSettings {
                // (Planted bug `save-queue-bytes-ignored`, scripts/plants.sh: the queue is
                // bounded in chunks only, and behind a stalled store holds `save_queue` copies
                // of blocks, whatever their size.)
                capacity: if planted!("save-queue-bytes-ignored") {
                    cfg.save_queue
                } else {
                    cfg.save_queue
                        .min((cfg.save_queue_bytes / chunk_bytes.max(1)).max(1))
                },
                threads: cfg.save_threads,
                drop_timeout: cfg.drop_timeout,
                backoff: cfg.save_backoff,
                chunk_bytes,
                cpu_share: cfg.save_cpu_share,
                batch: cfg.save_batch,
            },
        )?;
        let prober = Prober::start(
            Arc::clone(&tier),
            Arc::clone(&index),
            cfg.probe_miss_ttl,
            cfg.drop_timeout,
        )?;
        let gets = if may_block {
            Some(BoundedGets::start(Arc::clone(&tier), cfg.get_threads)?)
        } else {
            None
        };
        Ok(TierConnector {
            tier,
            memory,
            codec,
            cfg,
            index,
            own,
            saver,
            prober,
            gets,
            reads_in_place,
            costs_per_call,
            buffers: Buffers::new(chunk_bytes),
            s,
            key_tag,
            counters: AtomicCounts::default(),
        })
    }

    /// The tier.
    pub fn tier(&self) -> &Arc<dyn Tier> {
        &self.tier
    }

    /// The KV memory.
    pub fn memory(&self) -> &Arc<dyn KvMemory> {
        &self.memory
    }

    fn keys(&self, g: usize, tokens: &[u32], blocks: usize) -> Vec<ChunkKey> {
        let b = self.cfg.groups[g].block_size;
        ChunkKey::chain_blocks(self.key_tag, g as u32, b, tokens, blocks)
    }

    /// The key block `block` of `tokens` is stored under in group `group`: its chain from
    /// block 0 under the config's tag with this connector's layout mixed in
    /// ([`ChunkKey::layout_tag`]). What a repair tool or a test needs to reach one stored
    /// chunk; `None` for a group past the configured ones or a block `tokens` does not fill.
    pub fn chunk_key(&self, group: usize, tokens: &[u32], block: usize) -> Option<ChunkKey> {
        self.cfg.groups.get(group)?;
        self.keys(group, tokens, block.checked_add(1)?)
            .get(block)
            .copied()
    }

    /// Offers blocks the engine computed (entry `index` of group `group`, in block `block`)
    /// for saving: their bytes are copied now, stored later. Blocks already known to the tier
    /// are skipped. Only full prompt blocks can be saved (their key needs their tokens).
    /// Returns how many were queued.
    pub fn save_blocks(&self, tokens: &[u32], blocks: &[(usize, usize, BlockId)]) -> usize {
        let mut queued = 0;
        for g in 0..self.cfg.groups.len() {
            let Some(max) = blocks.iter().filter(|b| b.0 == g).map(|b| b.1).max() else {
                continue;
            };
            // Saturating: an index past every key names no full block (skipped below).
            let keys = self.keys(g, tokens, max.saturating_add(1));
            let Some(bytes) = self.memory.layout().bytes_per_block(g) else {
                continue;
            };
            for &(_, i, block) in blocks.iter().filter(|b| b.0 == g) {
                let Some(&key) = keys.get(i) else { continue };
                if self.index.contains(key) {
                    continue;
                }
                if self.saver.full() {
                    // Dropped (and counted) before its bytes are copied: a step pays nothing
                    // for a save the queue has no room for.
                    self.saver.note_dropped();
                    continue;
                }
                // The block's bytes go straight to their place in a reused chunk buffer,
                // after room for the header that a saver thread seals in place.
                // (Planted bug `save-payload-offset`, scripts/plants.sh: with a MAC the
                // bytes land 32 bytes early, under the MAC's room.)
                let off = if planted!("save-payload-offset") {
                    super::HEADER_LEN
                } else {
                    self.codec.payload_offset()
                };
                let mut chunk = self.saver.buffers().take();
                chunk.resize(self.codec.payload_offset() + bytes, 0);
                if self
                    .memory
                    .read(g, block, 0, &mut chunk[off..off + bytes])
                    .is_err()
                {
                    self.saver.buffers().give([chunk]);
                    continue;
                }
                let tokens_in_block = self.cfg.groups[g].block_size.min(u64::from(u32::MAX)) as u32;
                if self.saver.offer(Work::Save {
                    key,
                    group: g as u32,
                    tokens: tokens_in_block,
                    chunk,
                }) {
                    queued += 1;
                }
            }
        }
        queued
    }

    /// Offers for saving what the kept step `s` of a request with prompt `prompt` completed
    /// ([`completed_prompt_blocks`](super::completed_prompt_blocks)): what an engine calls for
    /// every scheduled request whose output `Runtime::update` did not return for discard.
    /// Returns how many chunks were queued.
    pub fn save_step(&self, prompt: &[u32], s: &crate::runtime::ScheduledRequest) -> usize {
        let blocks = super::completed_prompt_blocks(&self.cfg.groups, prompt.len(), s);
        self.save_blocks(prompt, &blocks)
    }

    /// Stores one block's bytes now, on the caller's thread (warming a tier before a run).
    ///
    /// # Errors
    ///
    /// [`TierError::Refused`](super::TierError::Refused) for a `group` past the configured
    /// groups; the tier's error.
    pub fn store_now(
        &self,
        tokens: &[u32],
        group: usize,
        index: usize,
        payload: &[u8],
    ) -> Result<bool, super::TierError> {
        let Some(grp) = self.cfg.groups.get(group) else {
            return Err(super::TierError::Refused(format!(
                "store_now: group {group} is past the {} configured groups",
                self.cfg.groups.len()
            )));
        };
        let tokens_in_block = grp.block_size.min(u64::from(u32::MAX)) as u32;
        let Some(&key) = self.keys(group, tokens, index.saturating_add(1)).get(index) else {
            return Ok(false);
        };
        let value = self
            .codec
            .encode(key, group as u32, tokens_in_block, payload);
        // Ours before the put (a probe may find it at once: see the saver's `store`).
        self.own.insert(key);
        if let Err(e) = guarded("put", || self.tier.put(&[(key, value)])) {
            self.own.remove(key);
            return Err(e);
        }
        self.index.insert(key);
        Ok(true)
    }

    /// Waits until every queued save and probe is done, for as long as that takes: against a
    /// tier whose calls never return (a store that stopped answering, without timeouts of
    /// its own) it never returns. Whoever must not wait for good — before exiting, at the
    /// end of a run with a deadline — calls [`flush_for`](Self::flush_for) instead.
    pub fn flush(&self) {
        self.saver.flush();
        self.prober.flush_until(None);
    }

    /// Waits until every queued save and probe is done, or `timeout` has passed: whether
    /// they were all done. What is still queued then stays queued (the save threads go on
    /// storing it; dropping the connector waits for them at most its `drop_timeout`).
    pub fn flush_for(&self, timeout: std::time::Duration) -> bool {
        let until = std::time::Instant::now().checked_add(timeout);
        self.saver.flush_until(until) && self.prober.flush_until(until)
    }

    /// Drops the saves still queued (counted in [`TierCounts::saves_dropped`]) and returns how
    /// many that was: what an engine calls when [`flush_for`](Self::flush_for) ran out of time
    /// and it is about to read its final counts, so that they account for every save offered
    /// (stored, failed, skipped or dropped) rather than leave the queue's to the drop, when no
    /// one reads the counts any more. A batch a save thread holds is finished; saves offered
    /// later are queued as before.
    pub fn drop_queued_saves(&self) -> u64 {
        self.saver.drop_queued()
    }

    /// Asks the tier in the background about the keys of `prompt` the index does not know
    /// (what a lookup of it would miss), so that a lookup once the returned [`Prefetch`] is
    /// ready offers what the tier held: what an engine sharing a tier with other engines
    /// calls when a request arrives, submitting it once ready (or after a bound of its own).
    /// Never waits for the tier; without `probe_on_miss` it asks nothing.
    pub fn prefetch(&self, prompt: &[u32]) -> Prefetch {
        let limit = self.lookup_limit(prompt.len());
        let (_, runs) = self.held_prefix(prompt, None, 0, limit);
        if !self.cfg.probe_on_miss || runs.is_empty() {
            return Prefetch::default();
        }
        self.prober.offer(runs, true)
    }

    /// Saves waiting in the write-behind queue.
    pub fn saves_queued(&self) -> usize {
        self.saver.queued()
    }

    /// Counts so far.
    pub fn counts(&self) -> TierCounts {
        let c = &self.counters;
        let s = self.saver.counts();
        let p = self.prober.counts();
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TierCounts {
            lookups: r(&c.lookups),
            lookup_hits: r(&c.lookup_hits),
            loads: r(&c.loads),
            chunks_loaded: r(&c.chunks_loaded),
            chunks_loaded_from_others: r(&c.chunks_loaded_from_others),
            kv_bytes_loaded: r(&c.kv_bytes_loaded),
            load_ns: r(&c.load_ns),
            missing_chunks: r(&c.missing_chunks),
            checksum_failures: r(&c.checksum_failures),
            key_mismatches: r(&c.key_mismatches),
            mac_failures: r(&c.mac_failures),
            format_errors: r(&c.format_errors),
            tier_errors: r(&c.tier_errors),
            writes_refused: r(&c.writes_refused),
            loads_cancelled: r(&c.loads_cancelled),
            loads_late: r(&c.loads_late),
            gets_busy: self.gets.as_ref().map_or(0, |g| g.busy() as u64),
            chunks_saved: r(&s.saved_chunks),
            kv_bytes_saved: r(&s.saved_bytes),
            saves_dropped: r(&s.dropped),
            save_errors: r(&s.errors),
            saves_failed: r(&s.failed_chunks),
            saves_skipped: r(&s.skipped),
            save_pauses: r(&s.pauses),
            last_save_error: s.last_error.lock().clone(),
            probes: r(&p.probes),
            probe_hits: r(&p.hits),
            probe_keys: r(&p.keys),
            probes_skipped: r(&p.skipped),
            probes_dropped: r(&p.dropped),
        }
    }

    /// Poisons destination `(g, i)` if the load may still write it, and names it invalid.
    fn fail(&self, job: &LoadJob, g: usize, i: usize, bad: &mut [Vec<BlockRef>]) {
        if let Some(dest) = job.may_write(g, i) {
            let _ = self.memory.poison(g, dest.id);
            bad[g].push(dest);
        } else if let Some(r) = job.block_tables.get(g).and_then(|t| t.get(i)) {
            bad[g].push(*r);
        }
    }
}

/// Dropping stops every background thread of the connector (the saves and probes still
/// queued are dropped, counted in `saves_dropped`) and waits for them until one deadline,
/// `drop_timeout` after the drop began: a batch a save thread holds is finished by then or
/// never waited for. A thread still inside a tier call at the deadline (a hung tier) is left
/// to end on its own when the call returns; so a drop takes at most `drop_timeout`, however
/// many of its threads hang.
impl Drop for TierConnector {
    fn drop(&mut self) {
        let started = std::time::Instant::now();
        // Every thread is told first, so that they all wind down within the one deadline.
        self.saver.stop();
        self.prober.stop();
        if let Some(g) = &self.gets {
            g.stop();
        }
        let deadline = started.checked_add(self.cfg.drop_timeout);
        self.saver.join_until(deadline);
        // Planted bug for the misuse tests: the probe thread gets a deadline of its own, so a
        // drop with both threads hung waits twice `drop_timeout`.
        let prober_deadline = if planted!("drop-deadline-per-thread") {
            std::time::Instant::now().checked_add(self.cfg.drop_timeout)
        } else {
            deadline
        };
        self.prober.join_until(prober_deadline);
        if let Some(g) = &mut self.gets {
            let short = started + super::bounded::JOIN_WAIT;
            g.join_until(deadline.map_or(short, |d| d.min(short)));
        }
    }
}

impl KvConnector for TierConnector {
    fn geometry(&self) -> Option<(&[CacheGroup], u64)> {
        Some((&self.cfg.groups, self.s))
    }

    /// The prompt's chunk keys: the lookups of the request then derive none.
    fn prepare(&self, _request: &str, prompt: &[u32]) -> Option<Prepared> {
        Some(std::sync::Arc::new(self.prompt_keys(prompt)))
    }

    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        bump(&self.counters.lookups, 1);
        let limit = self.lookup_limit(q.prompt.len());
        if limit <= q.local_tokens {
            return LookupResult::default();
        }
        let prepared = q
            .prepared
            .and_then(|p| p.downcast_ref::<held_prefix::PromptKeys>());
        let (offer, runs) = self.held_prefix(q.prompt, prepared, q.local_tokens, limit);
        if offer <= q.local_tokens {
            if self.cfg.probe_on_miss && !runs.is_empty() {
                let _ = self.prober.offer(runs, false);
            }
            return LookupResult::default();
        }
        bump(&self.counters.lookup_hits, 1);
        LookupResult {
            external_tokens: offer - q.local_tokens,
            load_async: unit_of(self.cfg.seed ^ hash_str(q.request)) < self.cfg.async_ratio,
        }
    }

    fn load(&self, job: &LoadJob) -> LoadResult {
        bump(&self.counters.loads, 1);
        let groups = self.cfg.groups.len().min(job.block_tables.len());
        let mut wanted: Vec<Wanted> = Vec::new();
        let mut bad: Vec<Vec<BlockRef>> = vec![Vec::new(); job.block_tables.len()];
        for g in 0..groups {
            let range = job.loaded_range(g);
            let keys = self.keys(g, &job.tokens, range.end);
            for i in range {
                if job.block_tables[g][i].id == 0 {
                    continue;
                }
                match keys.get(i) {
                    Some(&k) => wanted.push((g, i, k)),
                    None => self.fail(job, g, i, &mut bad), // not a full prompt block
                }
            }
        }
        // Groups the job has past the configured ones: no chunk of theirs can be loaded.
        for g in groups..job.block_tables.len() {
            for i in job.loaded_range(g) {
                if job.block_tables[g][i].id != 0 {
                    self.fail(job, g, i, &mut bad);
                }
            }
        }
        let started = std::time::Instant::now();
        self.fetch(job, &wanted, &mut bad);
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        bump(&self.counters.load_ns, took);
        if job.cancel.is_cancelled() {
            bump(&self.counters.loads_cancelled, 1);
        }
        if bad.iter().all(Vec::is_empty) {
            LoadResult::Ok
        } else {
            LoadResult::Failed(InvalidBlocks::ByGroup(bad))
        }
    }
}
