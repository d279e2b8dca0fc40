//! The data plane: the bytes behind the block ids.
//!
//! * `key` — [`ChunkKey`], the 128-bit chain hash naming one block's worth of KV of one
//!   cache group of one token prefix;
//! * `kv_memory` — the [`KvMemory`] trait (the engine-side bytes of each block) and the
//!   [`KvLayout`] the engine declares; `host_kv_memory` — [`HostKvMemory`], KV memory in host
//!   RAM;
//! * `tier` — the [`Tier`] trait: a store of chunks by key (batched exists / get / put,
//!   nothing else), and [`TierError`];
//! * `chunk` — the chunk format every tier stores: [`ChunkCodec`] writes and checks a
//!   header (key, group, tokens, length), an xxh3-64 checksum and an optional keyed BLAKE3
//!   MAC around the payload (specified in the repository's `docs/kv-format.md`);
//! * `memory_tier` — [`MemoryTier`], in-process, bounded, sharded, LRU per shard;
//! * `disk` — [`DiskTier`], the chunks of each put packed into one file, bounded, crash-safe
//!   for a killed process;
//! * `tier_connector` — [`TierConnector`], the connector joining a tier to KV memory:
//!   lookups from a local index (`key_index`), verified loads (`tier_load`) through reused
//!   chunk buffers (`buffers`), write-behind saves (`saver`), background existence checks
//!   of keys the index does not know (`prober`); its settings in `tier_config`;
//! * `redis` (feature `redis`) — a tier on a Redis server or Redis Cluster.
//!
//! Each tier can rewrite or remove one stored value in place (`edit_stored`, `remove`): what
//! a repair tool or the test kit's fault injection (`kvsched_testkit::FaultyTier`) uses to
//! damage a value at rest exactly as a real fault would.
//!
//! A tier stores opaque values; what a value holds (the chunk format, its checksum) is the
//! business of the connector that joins a tier to KV memory, through [`ChunkCodec`].

#[cfg(not(kvsched_loom))]
mod bounded;
#[cfg(not(kvsched_loom))]
mod buffers;
mod chunk;
#[cfg(not(kvsched_loom))]
mod completed;
mod disk;
// Public to the loom models, which drive it.
#[cfg(kvsched_loom)]
pub mod drain;
#[cfg(not(kvsched_loom))]
mod drain;
mod host_kv_memory;
mod key;
#[cfg(not(kvsched_loom))]
mod key_index;
mod kv_memory;
mod memory_tier;
#[cfg(not(kvsched_loom))]
mod prober;
#[cfg(all(feature = "redis", not(kvsched_loom)))]
pub mod redis;
#[cfg(not(kvsched_loom))]
mod save_duty;
#[cfg(not(kvsched_loom))]
mod saver;
mod tier;
#[cfg(not(kvsched_loom))]
mod tier_call;
#[cfg(not(kvsched_loom))]
mod tier_config;
#[cfg(not(kvsched_loom))]
mod tier_connector;
#[cfg(not(kvsched_loom))]
mod tier_counts;

pub use chunk::{
    ChunkCodec, ChunkError, ChunkErrorClass, ChunkHeader, CHUNK_MAGIC, CHUNK_VERSION, FLAG_MAC,
    HEADER_LEN, MAC_LEN,
};
#[cfg(not(kvsched_loom))]
pub use completed::completed_prompt_blocks;
pub use disk::{DiskConfig, DiskCounts, DiskTier};
pub use host_kv_memory::HostKvMemory;
pub use key::ChunkKey;
pub use kv_memory::{KvLayout, KvMemory, KvMemoryError, POISON_BYTE};
pub use memory_tier::{MemoryCounts, MemoryTier};
#[cfg(not(kvsched_loom))]
pub use saver::SaveBackoff;
pub use tier::{Tier, TierError};
#[cfg(not(kvsched_loom))]
pub use tier_connector::{
    Prefetch, TierConnector, TierConnectorConfig, TierConnectorError, TierCounts,
};
