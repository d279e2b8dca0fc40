//! The data plane: the bytes behind the block ids.
//!
//! * `key` — [`ChunkKey`], the 128-bit chain hash naming one block's worth of KV of one
//!   cache group of one token prefix;
//! * `tier` — the [`Tier`] trait: a store of chunks by key (batched exists / get / put,
//!   nothing else), and [`TierError`];
//! * `redis` (feature `redis`) — a tier on a Redis server or Redis Cluster, and local
//!   `redis-server` processes for tests and benchmarks.
//!
//! A tier stores opaque values; what a value holds (the chunk format, its checksum) is the
//! business of the connector that joins a tier to KV memory.

mod key;
#[cfg(all(feature = "redis", not(kvsched_loom)))]
pub mod redis;
mod tier;

pub use key::ChunkKey;
pub use tier::{Tier, TierError};
