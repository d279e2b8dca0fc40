//! Which shard owns a request: a seeded hash of its id, the same on every run.

use crate::rng::hash_str;

/// The shard of `shards` that owns request `id`: the id's hash modulo `shards`.
///
/// A power-of-two count takes the hash's low bits with a mask, the same value as the
/// modulo without a 64-bit division (tens of cycles, paid for every id the engine's output
/// names).
#[inline]
pub fn shard_of(id: &str, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let h = hash_str(id);
    if shards.is_power_of_two() {
        (h & (shards as u64 - 1)) as usize
    } else {
        (h % shards as u64) as usize
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_count_routes_by_the_hash_modulo_the_count() {
        for shards in 1..=17usize {
            for n in 0..500 {
                let id = format!("req-{n}");
                let want = (hash_str(&id) % shards as u64) as usize;
                assert_eq!(shard_of(&id, shards), want, "{id} over {shards} shards");
            }
        }
    }
}
