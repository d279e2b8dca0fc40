//! **Internal, not part of the stable API.** Public only under feature `internals`, for the
//! project's own tools, tests and benchmarks (`kvsched-cli`, the Python package, the tests,
//! the mechanism benches); crate-private in a normal build. Anything here may change or
//! disappear in any release, outside any semver promise.
//!
//! Seeded, deterministic hashing: the same request id and seed make the same decisions on
//! every run. (Shard routing hashes ids with its own hash: `runtime::route`.)

/// FNV-1a of a string, to derive per-request seeds.
pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A uniform draw in `[0, 1)` that is a pure function of `seed`: the first output of a
/// splitmix64 generator seeded with `seed`.
pub fn unit_of(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}
