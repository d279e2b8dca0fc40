//! Which shard owns a request: a hash of its id, the same on every run and every machine.

/// The hash a request's shard is taken from: xxh3-64 of the id's bytes, seed 0.
///
/// xxh3 reads a short id a word at a time (two multiplies for up to 16 bytes), where a
/// byte-at-a-time hash such as FNV-1a takes one dependent multiply per byte; `update` pays
/// it for every id the engine's output names.
#[inline]
pub fn route_hash(id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(id.as_bytes())
}

/// The shard of `shards` that owns request `id`: the id's [`route_hash`] modulo `shards`.
///
/// A power-of-two count takes the hash's low bits with a mask, the same value as the
/// modulo without a 64-bit division (tens of cycles, paid for every id the engine's output
/// names).
#[inline]
pub fn shard_of(id: &str, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let h = route_hash(id);
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
                let want = (route_hash(&id) % shards as u64) as usize;
                assert_eq!(shard_of(&id, shards), want, "{id} over {shards} shards");
            }
        }
    }

    #[test]
    fn the_route_hash_is_xxh3_64_of_the_id() {
        // Pinned values: routing must not change between builds or machines (an engine may
        // log which shard held a request, and the tests' shard choices rely on it).
        assert_eq!(route_hash(""), 0x2d06_8005_38d3_94c2);
        assert_eq!(route_hash("r0"), route_hash("r0"));
        assert_ne!(route_hash("r0"), route_hash("r1"));
    }

    #[test]
    fn short_ids_spread_evenly_over_two_shards() {
        let on_first = (0..10_000)
            .filter(|n| shard_of(&format!("r{n}"), 2) == 0)
            .count();
        assert!(
            (4_700..=5_300).contains(&on_first),
            "{on_first} of 10,000 ids on shard 0"
        );
    }
}
