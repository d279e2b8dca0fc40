//! A cached block's bytes depend on the whole context before it: a tier (or prefix cache)
//! that serves a block of another prompt with the same tokens at the same positions — a key
//! that ignored the parent hash — or of tokens equal modulo the sampler's vocabulary — a key
//! that truncated token ids — hands the model wrong K/V or state, and the judge sees it, in
//! every group of every geometry. So does one bit flipped in one value, the lowest included,
//! which rounding may hide from every logit but not from the comparison of every value read.

use std::sync::Arc;

use kvsched::kv::{MemoryTier, Tier};
use kvsched::{CacheGroup, MambaMode, Mode};
use kvsched_testkit::ModelCounts;

use crate::support::*;

/// The geometries: a dense model (one full-attention group) and the hybrid ones.
fn geometries() -> Vec<(&'static str, Vec<CacheGroup>)> {
    vec![
        ("dense", vec![CacheGroup::full_attention(16)]),
        ("hybrid-align", hybrid(MambaMode::Align)),
        ("hybrid-all", hybrid(MambaMode::All)),
    ]
}

/// Warms a tier with `prompt`'s first 64 tokens as the model computes them, except that the
/// blocks `swap` picks hold what the model computes for `other` instead; runs `prompt` alone
/// (`async_ratio`: the share of loads the scheduler runs asynchronously) and returns the
/// judge's counts.
fn run_swapped(
    groups: &[CacheGroup],
    async_ratio: f64,
    prompt: &[u32],
    other: &[u32],
    swap: impl Fn(usize, usize) -> bool,
) -> ModelCounts {
    run_edited(
        groups,
        async_ratio,
        prompt,
        other,
        |g, i, _| swap(g, i),
        |_, _, _| {},
    )
}

/// [`run_swapped`], and then `edit` changes the bytes of each block before they are stored.
fn run_edited(
    groups: &[CacheGroup],
    async_ratio: f64,
    prompt: &[u32],
    other: &[u32],
    swap: impl Fn(usize, usize, &[u8]) -> bool,
    edit: impl Fn(usize, usize, &mut Vec<u8>),
) -> ModelCounts {
    let tier: Arc<dyn Tier> = Arc::new(MemoryTier::new(64 << 20, 4));
    let k = Knobs {
        mode: Mode::Safe,
        async_ratio,
        shards: 1,
        ..Knobs::default()
    };
    let (mut rt, conn, mut engine) = stack(groups, tier, &k, 3);
    let theirs = engine.reference_blocks(&other[..64]);
    for (g, i, bytes) in engine.reference_blocks(&prompt[..64]) {
        let mut bytes = if swap(g, i, &bytes) {
            let (_, _, b) = theirs
                .iter()
                .find(|(h, j, _)| (*h, *j) == (g, i))
                .expect("block");
            assert_eq!(b.len(), bytes.len());
            b.clone()
        } else {
            bytes
        };
        edit(g, i, &mut bytes);
        conn.store_now(prompt, g, i, &bytes).expect("store");
    }
    submit(&mut rt, &mut engine, "r".into(), prompt.to_vec(), 6);
    let c = finish(rt, &mut engine, &conn);
    assert!(conn.counts().chunks_loaded >= 4, "{:?}", conn.counts());
    assert_eq!(c.tokens_checked, 6, "{c:?}");
    c
}

fn prompt() -> Vec<u32> {
    (0..80u32).map(|t| (t * 7 + 3) % 64).collect()
}

/// Block 3 of each group, taken from a prompt that differs only in its first token (block 0):
/// same tokens at the same positions, another context. Every group's swap shows, whether the
/// engine loads it (sync) or the scheduler's workers do (async).
#[test]
fn a_block_computed_under_another_context_is_judged_wrong_in_every_group() {
    let p = prompt();
    let mut q = p.clone();
    q[0] = (q[0] + 1) % 64;
    for (name, groups) in geometries() {
        for async_ratio in [0.0, 1.0] {
            let exact = run_swapped(&groups, async_ratio, &p, &q, |_, _| false);
            assert_eq!(
                (exact.logit_mismatches, exact.read_mismatches),
                (0, 0),
                "{name}: {exact:?}"
            );
            for g in 0..groups.len() {
                let c = run_swapped(&groups, async_ratio, &p, &q, |h, i| h == g && i == 3);
                assert!(
                    c.logit_mismatches > 0,
                    "{name}, async {async_ratio}, group {g}: {c:?}"
                );
            }
        }
    }
}

/// Every block from a prompt whose token ids are the same plus 64 (the sampler's vocabulary):
/// a key that truncated token ids would serve it, and the judge sees it.
#[test]
fn blocks_of_token_ids_equal_modulo_the_vocabulary_are_judged_wrong() {
    let p = prompt();
    let q: Vec<u32> = p.iter().map(|t| t + 64).collect();
    for (name, groups) in geometries() {
        for g in 0..groups.len() {
            let c = run_swapped(&groups, 0.0, &p, &q, |h, _| h == g);
            assert!(c.logit_mismatches > 0, "{name}, group {g}: {c:?}");
        }
    }
}

/// One bit of the first value of block 3 (of 4 loaded) flipped in one group: its first
/// layer's K at position 48, or its state after position 63. Every flip is a wrong read the
/// judge counts, in every group of every geometry, loaded by the engine or by the scheduler's
/// workers, whether or not a logit changed (a flip of bit 0 changes none in most groups).
#[test]
fn one_bit_flipped_in_a_loaded_value_is_a_wrong_read_in_every_group() {
    let p = prompt();
    for (name, groups) in geometries() {
        for async_ratio in [0.0, 1.0] {
            for g in 0..groups.len() {
                for bit in [0u8, 10, 22, 30] {
                    let c = run_edited(
                        &groups,
                        async_ratio,
                        &p,
                        &p,
                        |_, _, _| false,
                        |h, i, bytes| {
                            if (h, i) == (g, 3) {
                                bytes[usize::from(bit / 8)] ^= 1 << (bit % 8);
                            }
                        },
                    );
                    assert!(
                        c.read_mismatches > 0,
                        "{name}, async {async_ratio}, group {g}, bit {bit}: {c:?}"
                    );
                    eprintln!(
                        "{name}, async {async_ratio}, group {g}, bit {bit}: {} wrong reads, {} wrong logits",
                        c.read_mismatches, c.logit_mismatches
                    );
                }
            }
        }
    }
}
