//! The settings of a [`TierConnector`](super::TierConnector) and the errors of building one.

use super::saver::SaveBackoff;
#[cfg(doc)]
use super::{Tier, TierConnector};
use crate::rules::geometry::CacheGroup;

/// The longest `drop_timeout` and save pause a connector accepts.
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Most threads of each kind a connector starts ([`TierConnectorConfig::save_threads`],
/// [`TierConnectorConfig::get_threads`]).
const MAX_THREADS: usize = 1024;

/// Settings of a [`TierConnector`]: [`TierConnectorConfig::default`] and the `with_*`
/// setters.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TierConnectorConfig {
    /// The runtime's cache groups (the same as the runtime's builder gets).
    pub groups: Vec<CacheGroup>,
    /// The runtime's scheduler block size `S`: lookups offer multiples of it. `None` derives
    /// it from `groups` as the runtime's builder does (the least common multiple of their
    /// block sizes); a value must be a positive multiple of every group's block size, and
    /// the same as the runtime's.
    pub scheduler_block_size: Option<u64>,
    /// The model's tag in every chunk key: engines sharing a tier give the same tag exactly
    /// when they run the same model (weights and KV dtype), so two models never share
    /// chunks. The layout — each group's kind, block size and bytes per block — is mixed in
    /// by the connector ([`ChunkKey::layout_tag`](super::ChunkKey::layout_tag)): engines of
    /// different layouts never share a chunk even under one tag, but only the tag tells two
    /// models of one layout apart.
    pub tag: u64,
    /// The key of the chunks' keyed MAC (every engine sharing the tier has it), or none.
    pub mac_key: Option<[u8; 32]>,
    /// Share of loads run asynchronously on a worker (0–1), decided per request from `seed`;
    /// the others run inside the engine's step (sync loads).
    pub async_ratio: f64,
    /// Seed of the async/sync choice.
    pub seed: u64,
    /// Most chunks waiting to be saved (at least 1); offers past it are dropped (counted).
    pub save_queue: usize,
    /// Most bytes of chunks waiting to be saved (at least 1; default 256 MiB): each queued
    /// save holds a copy of its block, so behind a stalled store the queue holds at most
    /// `max(1, save_queue_bytes / chunk size)` chunks when that is fewer than `save_queue`
    /// (the chunk size is the largest group's encoded block).
    pub save_queue_bytes: usize,
    /// Threads storing chunks and probing the tier (1–1,024).
    pub save_threads: usize,
    /// Most keys the local index remembers (at least 1; default 1,048,576, about 40 MiB; the
    /// index keeps at least two keys per internal shard whatever the figure). Past it the
    /// index forgets the keys used longest ago (looked up, saved or loaded), in halves: a
    /// chunk it forgot is a lookup miss, and a probe. Give it as many keys as the tier holds
    /// chunks, or a long prompt's prefix is cut at the first chunk forgotten.
    pub index_capacity: usize,
    /// On a lookup the index cannot answer, ask the tier in the background, on the
    /// connector's probe thread (a later request with the same prefix then hits: how an
    /// engine finds the chunks another engine sharing the tier saved).
    pub probe_on_miss: bool,
    /// How long a prefix the tier was asked about is not asked again (default 1 s): many
    /// requests sharing a prefix cost one probe, and a key found absent is asked again once
    /// it has passed.
    pub probe_miss_ttl: std::time::Duration,
    /// Most threads running the gets of a tier that may block ([`Tier::may_block`]), so that
    /// a load with a deadline waits for the tier only until then (see the guarantees of
    /// [`TierConnector`]); they start on demand, when gets queue behind busy ones (1–1,024,
    /// default 64). At most this many gets can hang at once.
    pub get_threads: usize,
    /// How long dropping the connector waits, in all, for its threads (default 10 s, as the
    /// runtime's shutdown): the save threads finishing the batch each holds (what is still
    /// queued is dropped), the probe thread and the get threads, all until one deadline.
    /// Threads still inside a tier call then (a hung tier) are left to finish on their own;
    /// the drop returns, at most this long after it began.
    pub drop_timeout: std::time::Duration,
    /// When saves that keep failing pause saving (see [`SaveBackoff`]).
    pub save_backoff: SaveBackoff,
    /// The share of its time each save thread may spend in the tier's `put` (0–1; default 1,
    /// never resting): below 1, after storing a batch a thread rests in proportion, so a
    /// store whose writes cost CPU (the disk tier's file creations are kernel work) takes at
    /// most that share of a core from the engine; saves past what fits are dropped and
    /// counted. The share is of wall time in `put`: for a store whose puts mostly wait (a
    /// network), a share below 1 only slows saving.
    pub save_cpu_share: f64,
    /// Most chunks one save thread's `put` carries (default 32). A store whose every put
    /// pays a fixed cost — the disk tier's pack file: a create and a rename whatever it
    /// holds — saves more per second in larger batches (the stress tool gives a disk store
    /// 1,024, the most one pack holds).
    pub save_batch: usize,
}

with_setters!(TierConnectorConfig {
    with_groups: groups: Vec<CacheGroup>,
    with_scheduler_block_size: scheduler_block_size: Option<u64>,
    with_tag: tag: u64,
    with_mac_key: mac_key: Option<[u8; 32]>,
    with_async_ratio: async_ratio: f64,
    with_seed: seed: u64,
    with_save_queue: save_queue: usize,
    with_save_queue_bytes: save_queue_bytes: usize,
    with_save_threads: save_threads: usize,
    with_index_capacity: index_capacity: usize,
    with_probe_on_miss: probe_on_miss: bool,
    with_probe_miss_ttl: probe_miss_ttl: std::time::Duration,
    with_get_threads: get_threads: usize,
    with_drop_timeout: drop_timeout: std::time::Duration,
    with_save_backoff: save_backoff: SaveBackoff,
    with_save_cpu_share: save_cpu_share: f64,
    with_save_batch: save_batch: usize,
});

impl Default for TierConnectorConfig {
    fn default() -> Self {
        TierConnectorConfig {
            groups: vec![CacheGroup::full_attention(16)],
            scheduler_block_size: None,
            tag: 0,
            mac_key: None,
            async_ratio: 1.0,
            seed: 0x5eed,
            save_queue: 4096,
            save_queue_bytes: 256 << 20,
            save_threads: 1,
            index_capacity: 1 << 20,
            probe_on_miss: true,
            probe_miss_ttl: std::time::Duration::from_secs(1),
            get_threads: 64,
            drop_timeout: std::time::Duration::from_secs(10),
            save_backoff: SaveBackoff::default(),
            save_cpu_share: 1.0,
            save_batch: 32,
        }
    }
}

/// Why a [`TierConnector`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierConnectorError {
    /// The settings contradict each other or the memory's layout.
    #[error("tier connector: {0}")]
    Config(String),
    /// Its threads could not be started.
    #[error("tier connector: cannot start a saver thread: {0}")]
    Spawn(#[from] std::io::Error),
}

impl TierConnectorConfig {
    /// Checks the settings that do not depend on the KV memory: each an error naming the
    /// field.
    pub(super) fn check_values(&self) -> Result<(), TierConnectorError> {
        if !(self.save_cpu_share > 0.0 && self.save_cpu_share <= 1.0) {
            return Err(TierConnectorError::Config(format!(
                "save_cpu_share: {} is outside (0, 1]",
                self.save_cpu_share
            )));
        }
        if self.save_queue == 0 {
            return Err(TierConnectorError::Config(
                "save_queue: 0 chunks; at least 1 is needed".to_owned(),
            ));
        }
        if self.save_queue_bytes == 0 {
            return Err(TierConnectorError::Config(
                "save_queue_bytes: 0 bytes; at least 1 is needed".to_owned(),
            ));
        }
        if self.index_capacity == 0 {
            return Err(TierConnectorError::Config(
                "index_capacity: 0 keys; at least 1 is needed".to_owned(),
            ));
        }
        for (field, n) in [
            ("save_threads", self.save_threads),
            ("get_threads", self.get_threads),
        ] {
            if !(1..=MAX_THREADS).contains(&n) {
                return Err(TierConnectorError::Config(format!(
                    "{field}: {n} is outside 1-{MAX_THREADS}"
                )));
            }
        }
        if self.save_batch == 0 {
            return Err(TierConnectorError::Config(
                "save_batch: 0 chunks a put; at least 1 is needed".to_owned(),
            ));
        }
        if !(0.0..=1.0).contains(&self.async_ratio) {
            return Err(TierConnectorError::Config(format!(
                "async_ratio: {} is outside [0, 1]",
                self.async_ratio
            )));
        }
        // Each is added to an instant (a drop's deadline, a pause's end): longer overflows.
        for (field, d) in [
            ("drop_timeout", self.drop_timeout),
            ("save_backoff.pause", self.save_backoff.pause),
            ("save_backoff.max_pause", self.save_backoff.max_pause),
        ] {
            if d > MAX_WAIT {
                let problem = format!("{field}: {d:?} is longer than a day");
                return Err(TierConnectorError::Config(problem));
            }
        }
        Ok(())
    }
}
