//! Which shard owns a request: a seeded hash of its id, the same on every run.

use crate::rng::hash_str;

/// The shard of `shards` that owns request `id`.
#[inline]
pub fn shard_of(id: &str, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    (hash_str(id) % shards as u64) as usize
}
