//! The data plane: the bytes behind the block ids.
//!
//! * `key` — [`ChunkKey`], the 128-bit chain hash naming one block's worth of KV of one
//!   cache group of one token prefix;
//! * `kv_memory` — the [`KvMemory`] trait (the engine-side bytes of each block) and the
//!   [`KvLayout`] the engine declares; `host_memory` — [`HostKvMemory`], KV memory in host RAM;
//! * `tier` — the [`Tier`] trait: a store of chunks by key (batched exists / get / put,
//!   nothing else), and [`TierError`];
//! * `chunk` — the chunk format every tier stores: [`ChunkCodec`] writes and checks a
//!   header (key, group, tokens, length), an xxh3-64 checksum and an optional keyed BLAKE3
//!   MAC around the payload (specified in the repository's `docs/kv-format.md`);
//! * `memory` — [`MemoryTier`], in-process, bounded, sharded, LRU per shard;
//! * `disk` — [`DiskTier`], one file per chunk, bounded, crash-safe for a killed process;
//! * `faults` — [`FaultyTier`], seeded damage to what a tier stores ([`FaultTarget`]).
//!
//! * `sim_tier` — [`SimTier`], a memory tier behind seeded latency, transfer damage, panics
//!   and hangs, for tests and the stress tool;
//! * `connector` — [`TierConnector`], the connector joining a tier to KV memory: lookups
//!   from a local index (`key_index`), verified batched loads, write-behind saves (`saver`).
//! * `redis` (feature `redis`) — a tier on a Redis server or Redis Cluster, and local
//!   `redis-server` processes for tests and benchmarks.
//!
//! A tier stores opaque values; what a value holds (the chunk format, its checksum) is the
//! business of the connector that joins a tier to KV memory, through [`ChunkCodec`].

#[cfg(not(kvsched_loom))]
mod bounded;
mod chunk;
#[cfg(not(kvsched_loom))]
mod completed;
#[cfg(not(kvsched_loom))]
mod connector;
mod disk;
mod faults;
mod host_memory;
mod key;
#[cfg(not(kvsched_loom))]
mod key_index;
mod kv_memory;
mod memory;
#[cfg(all(feature = "redis", not(kvsched_loom)))]
pub mod redis;
#[cfg(not(kvsched_loom))]
mod saver;
mod sim_tier;
mod tier;
mod tier_stats;

pub use chunk::{
    ChunkCodec, ChunkError, ChunkErrorClass, ChunkHeader, CHUNK_MAGIC, CHUNK_VERSION, FLAG_MAC,
    HEADER_LEN, MAC_LEN,
};
#[cfg(not(kvsched_loom))]
pub use completed::completed_prompt_blocks;
#[cfg(not(kvsched_loom))]
pub use connector::{TierConnector, TierConnectorConfig, TierConnectorError, TierStats};
pub use disk::{DiskConfig, DiskStats, DiskTier};
pub use faults::{FaultConfig, FaultConfigError, FaultCounts, FaultTarget, FaultyTier};
pub use host_memory::HostKvMemory;
pub use key::ChunkKey;
pub use kv_memory::{KvLayout, KvMemory, KvMemoryError, POISON_BYTE};
pub use memory::{MemoryStats, MemoryTier};
#[cfg(not(kvsched_loom))]
pub use saver::SaveBackoff;
pub use sim_tier::{SimTier, SimTierConfig, SimTierCounts};
pub use tier::{Tier, TierError};
