//! The data plane: the bytes behind the block ids.
//!
//! * `key` — [`ChunkKey`], the 128-bit chain hash naming one block's worth of KV of one
//!   cache group of one token prefix;
//! * `kv_memory` — the [`KvMemory`] trait (the engine-side bytes of each block) and the
//!   [`KvLayout`] the engine declares; `host_memory` — [`HostKvMemory`], KV memory in host RAM;
//! * `tier` — the [`Tier`] trait: a store of chunks by key (batched exists / get / put,
//!   nothing else), and [`TierError`].
//!
//! A tier stores opaque values; what a value holds (the chunk format, its checksum) is the
//! business of the connector that joins a tier to KV memory.

mod host_memory;
mod key;
mod kv_memory;
mod tier;

pub use host_memory::HostKvMemory;
pub use key::ChunkKey;
pub use kv_memory::{KvLayout, KvMemory, KvMemoryError, POISON_BYTE};
pub use tier::{Tier, TierError};
