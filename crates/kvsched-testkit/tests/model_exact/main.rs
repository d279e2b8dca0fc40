//! The tiny hybrid model behind the plan: its outputs under kvsched (prefix cache, tier loads,
//! damaged and evicted chunks, preemption, engine finishes, cancels, lost outputs) equal, to
//! the last logit bit, the same requests decoded alone. Positive control: the runtime plant
//! `mamba-align-cache-unwritten` (scripts/plants.sh) makes it mismatch.

use std::sync::Arc;
use std::time::Duration;

use kvsched::kv::{MemoryTier, Tier, TierConnector};
use kvsched::{BlockRef, BlockTable, CacheGroup, MambaMode, Mode, Runtime, StepPlan};
use kvsched_testkit::SplitMix64;
use kvsched_testkit::{FaultConfig, FaultyTier};
use kvsched_testkit::{ModelCounts, ModelEngine, WrongTokenCauses};

mod context;
mod mamba_all_rewrite;
mod support;
use support::*;

fn run(groups: Vec<CacheGroup>, k: &Knobs, seed: u64) -> Run {
    let faults = FaultConfig {
        seed,
        corrupt: k.corrupt,
        evict: k.evict,
        ..FaultConfig::default()
    };
    let tier: Arc<dyn Tier> =
        Arc::new(FaultyTier::new(MemoryTier::new(64 << 20, 4), faults).expect("faults"));
    // Shared 48- and 80-token prefixes: later requests meet the prefix cache and the tier.
    let prefixes: Vec<Vec<u32>> = (0..k.prefixes)
        .map(|p| {
            (0..48 + 32 * (p % 2))
                .map(|t| (p * 7 + t * 3) % 61)
                .collect()
        })
        .collect();
    warm(&groups, Arc::clone(&tier), &prefixes);
    let (mut rt, conn, mut engine) = stack(&groups, tier, k, seed);
    let mut rng = SplitMix64::new(seed);
    let (mut next, mut live, mut finish_next) = (0u32, Vec::<String>::new(), Vec::new());
    for _ in 0..5000 {
        let pick = rng.below(prefixes.len() as u64) as usize;
        for _ in 0..if rng.unit() < 0.6 { k.burst } else { 0 } {
            if next == k.requests {
                break;
            }
            let mut prompt = prefixes[pick].clone();
            prompt.extend((0..1 + rng.below(30) as u32).map(|t| (next * 13 + t) % 64));
            let id = format!("r{next}");
            let max_new = 2 + rng.below(10) as u32;
            submit(&mut rt, &mut engine, id.clone(), prompt, max_new);
            live.push(id);
            next += 1;
        }
        if !live.is_empty() && rng.unit() < k.finish {
            finish_next.push(live[rng.below(live.len() as u64) as usize].as_str().into());
        }
        if !live.is_empty() && rng.unit() < k.cancel {
            rt.cancel(&live[rng.below(live.len() as u64) as usize]);
        }
        let plan = rt.schedule().expect("step");
        ended(&plan, &mut engine, &mut live);
        if rng.unit() < k.lose {
            // The engine ran the step (or not), but its output never arrives.
            if rng.unit() < 0.5 {
                let _ = engine.run_step(&plan, Some(conn.as_ref()));
            }
            continue;
        }
        answer(
            &mut rt,
            &mut engine,
            &conn,
            &plan,
            std::mem::take(&mut finish_next),
        );
        if next == k.requests && rt.live() == 0 {
            break;
        }
        rt.wait_for_work(Duration::from_millis(1));
    }
    assert_eq!(rt.live(), 0, "requests left");
    let report = rt.shutdown();
    conn.flush();
    Run {
        model: engine.counts().clone(),
        report,
    }
}

fn ended(plan: &StepPlan, engine: &mut ModelEngine, live: &mut Vec<String>) {
    for (id, _) in &plan.ended {
        engine.end_request(id);
        live.retain(|l| **l != **id);
    }
}

#[test]
fn chunked_prefill_and_decode_equal_the_request_alone() {
    for mamba in [MambaMode::Align, MambaMode::All] {
        for budget in [7, 16, 512] {
            let k = Knobs {
                budget,
                async_ratio: 0.0,
                ..Knobs::default()
            };
            let r = run(hybrid(mamba), &k, 1);
            assert!(r.model.tokens_checked > 100, "{:?}", r.model);
            assert_eq!(
                (r.model.logit_mismatches, r.model.read_mismatches),
                (0, 0),
                "{mamba:?} budget {budget}: {:?}",
                r.model
            );
            assert_eq!(r.model.unreadable_reads, 0, "{:?}", r.model);
        }
    }
}

#[test]
fn mode_safe_is_token_exact_under_damaged_chunks_preemption_and_lost_outputs() {
    let mut checked = 0;
    for seed in 1..=4u64 {
        for mamba in [MambaMode::Align, MambaMode::All] {
            let k = Knobs {
                async_ratio: [0.0, 0.5, 1.0, 0.5][seed as usize - 1],
                pool: 90,
                corrupt: 0.1,
                evict: 0.1,
                finish: 0.03,
                cancel: 0.02,
                lose: 0.03,
                ..Knobs::default()
            };
            let r = run(hybrid(mamba), &k, seed);
            assert_eq!(
                (r.model.logit_mismatches, r.model.read_mismatches),
                (0, 0),
                "seed {seed} {mamba:?}: {:?} {:?}",
                r.model,
                r.report.metrics
            );
            assert!(r.report.violations.is_empty(), "{:?}", r.report.violations);
            checked += r.model.tokens_checked;
        }
    }
    assert!(checked > 500, "{checked} tokens checked");
}

/// The workload that first demonstrated mode `vllm`: bursts of three requests on shared
/// prefixes, sync loads of which 15 % of chunks are damaged, a budget of 32 (a recompute spans
/// several steps). Mode `safe` is exact on it. Whether mode `vllm` keeps a wrong token on it
/// depends on which requests meet in which shard's step, so on where each id lands: over
/// seeds 1-3, 2 on two shards with FNV-1a routing (from rolled-back blocks left cached; no
/// failed load had a sharer among them), none on one shard. So mode `vllm` is shown by
/// `mode_vllm_sharers_read_a_failed_sync_load_and_mode_safe_has_none` and
/// `mode_vllm_hits_rolled_back_blocks_left_cached_and_mode_safe_has_none` instead.
#[test]
fn mode_safe_is_exact_on_bursts_sharing_prefixes_whose_sync_loads_fail() {
    let mut safe = ModelCounts::default();
    for seed in 1..=3u64 {
        let k = Knobs {
            async_ratio: 0.0,
            corrupt: 0.15,
            budget: 32,
            burst: 3,
            prefixes: 12,
            requests: 60,
            ..Knobs::default()
        };
        let r = run(hybrid(MambaMode::All), &k, seed);
        assert!(r.report.violations.is_empty(), "{:?}", r.report.violations);
        safe += &r.model;
    }
    assert!(safe.tokens_checked > 1000, "{safe:?}");
    assert!(safe.sync_loads_failed > 0, "{safe:?}");
    assert_eq!(
        (safe.logit_mismatches, safe.read_mismatches),
        (0, 0),
        "{safe:?}"
    );
    assert_eq!(safe.failed_load_sharers, 0, "{safe:?}");
}

/// Stores `prefix`'s blocks in `store` with every chunk damaged at rest (one bit flipped: the
/// load's checks refuse it), so any load of it fails.
fn store_damaged(store: &MemoryTier, conn: &TierConnector, engine: &ModelEngine, prefix: &[u32]) {
    for (g, i, bytes) in engine.reference_blocks(prefix) {
        assert!(conn.store_now(prefix, g, i, &bytes).expect("store"));
        let key = conn.chunk_key(g, prefix, i).expect("a full block's key");
        let damaged = store.edit_stored(key, |v| {
            let at = v.len() / 2;
            v[at] ^= 1;
            true
        });
        assert!(damaged, "group {g} block {i} not stored");
    }
}

/// The requests of `damaged_prefix_burst`, and the tokens each generates.
const BURST: u32 = 3;
const BURST_NEW_TOKENS: u32 = 8;

/// The stack of the two built cases: Mamba `align`, sync loads only, a token budget of 40
/// (split between the shards), over a memory store the case fills itself.
fn damaged_prefix_stack(
    mode: Mode,
    shards: usize,
) -> (
    Vec<CacheGroup>,
    Arc<MemoryTier>,
    Runtime,
    Arc<TierConnector>,
    ModelEngine,
) {
    let groups = hybrid(MambaMode::Align);
    let store = Arc::new(MemoryTier::new(64 << 20, 4));
    let k = Knobs {
        mode,
        async_ratio: 0.0,
        budget: 40,
        shards,
        ..Knobs::default()
    };
    let (rt, conn, engine) = stack(&groups, store.clone(), &k, 7);
    (groups, store, rt, conn, engine)
}

/// Three requests, all submitted before the first step, each a 256-token prefix and a
/// 5-token suffix of its own, on Mamba `align` with a token budget of 40 (split between the
/// shards). The tier holds each prefix with every chunk damaged at rest (one bit flipped: the
/// load's checks refuse it), so any load of it fails. `shared`: the three prompts share one
/// prefix; else each has its own. Returns the judge's counts.
fn damaged_prefix_burst(mode: Mode, shards: usize, shared: bool) -> ModelCounts {
    let (_, store, mut rt, conn, mut engine) = damaged_prefix_stack(mode, shards);
    let prefixes: Vec<Vec<u32>> = (0..if shared { 1 } else { BURST })
        .map(|p| (0..256).map(|t| (p * 7 + t * 3) % 61).collect())
        .collect();
    for prefix in &prefixes {
        store_damaged(&store, &conn, &engine, prefix);
    }
    for n in 0..BURST {
        let prefix = &prefixes[n as usize % prefixes.len()];
        let prompt = [&prefix[..], &[n + 1, 5, 9, 2, 4]].concat();
        let id = format!("r{n}");
        submit(&mut rt, &mut engine, id, prompt, BURST_NEW_TOKENS);
    }
    finish(rt, &mut engine, &conn)
}

/// vLLM #49250 end to end, by construction. In mode `vllm` the first of the three requests
/// admitted (few are live, so shards step one after another) is admitted into its step with
/// a sync load of the prefix, whose destinations enter the prefix cache at once (vLLM hashes
/// blocks at allocation); the two admitted after it in the same step take them as their local
/// prefix. The load fails. vLLM's rules give each failed block to the first request in
/// canonical order that holds it, which recomputes from 0, and send a request whose every hit
/// is claimed back to its pre-step length, 256, trusting the owner to rewrite the blocks. An
/// owner's prefill chunks end on a block end (Mamba `align`), so each step it gives back what
/// its shard's budget grants past the last block end it reaches (8 of 40 tokens on one shard,
/// 4 of 20 on two), and a sharer behind it, decoding a token a step, takes them; on a shard of
/// its own a sharer has a budget of its own. Until the owner has recomputed the prefix, the
/// sharer attends to blocks still holding what the failed load left and resumes from its
/// Mamba state: its outputs are wrong, and the judge traces each wrong token to the failed
/// load it held.
///
/// Where each id lands changes who loads, who recomputes and where the sharer runs, not that
/// one shares: this holds on one shard and on two, for every placement of the three ids.
/// Controls: mode `safe` caches a block only once it is written, so each request loads the
/// prefix itself and recomputes its own failure: no sharer, exact. Mode `vllm` with a prefix
/// per request (each its own loader, nobody sharing) is exact too: the wrong outputs are the
/// sharing's.
#[test]
fn mode_vllm_sharers_read_a_failed_sync_load_and_mode_safe_has_none() {
    let samples = u64::from(BURST * BURST_NEW_TOKENS);
    for shards in [1, 2] {
        let vllm = damaged_prefix_burst(Mode::Vllm, shards, true);
        let safe = damaged_prefix_burst(Mode::Safe, shards, true);
        let unshared = damaged_prefix_burst(Mode::Vllm, shards, false);
        eprintln!("{shards} shards\nvllm: {vllm:?}\nsafe: {safe:?}\nunshared: {unshared:?}");
        for c in [&vllm, &safe, &unshared] {
            assert_eq!(c.tokens_checked, samples, "{shards} shards: {c:?}");
            assert!(c.sync_loads_failed > 0, "{shards} shards: {c:?}");
        }
        assert_eq!(vllm.failed_load_sharers, 2, "{shards} shards: {vllm:?}");
        assert!(
            vllm.token_mismatches > 0,
            "{shards} shards: vllm kept no wrong token: {vllm:?}"
        );
        let causes = WrongTokenCauses {
            sharers_read_failed_load: vllm.token_mismatches,
            ..WrongTokenCauses::default()
        };
        assert_eq!(vllm.wrong_token_causes, causes, "{shards} shards: {vllm:?}");
        assert_eq!(safe.failed_load_sharers, 0, "{shards} shards: {safe:?}");
        assert_eq!(
            (safe.logit_mismatches, safe.read_mismatches),
            (0, 0),
            "{shards} shards: {safe:?}"
        );
        assert_eq!(
            unshared.failed_load_sharers, 0,
            "{shards} shards: {unshared:?}"
        );
        assert_eq!(
            (unshared.logit_mismatches, unshared.read_mismatches),
            (0, 0),
            "{shards} shards: {unshared:?}"
        );
    }
}

/// A tier warmed with the model's own bytes of a prompt (what another engine would have
/// saved) serves it: the loaded K/V and states give exactly the tokens of the request alone.
#[test]
fn a_tier_warmed_with_the_models_bytes_serves_exact_prefixes() {
    for mamba in [MambaMode::Align, MambaMode::All] {
        let groups = hybrid(mamba);
        let tier: Arc<dyn Tier> = Arc::new(MemoryTier::new(64 << 20, 4));
        let k = Knobs::default();
        let (mut rt, conn, mut engine) = stack(&groups, tier, &k, 5);
        let prompts: Vec<Vec<u32>> = (0..4u32)
            .map(|p| (0..80 + p).map(|t| (p * 11 + t * 5) % 64).collect())
            .collect();
        for (n, p) in prompts.iter().enumerate() {
            for (g, i, bytes) in engine.reference_blocks(&p[..64]) {
                conn.store_now(p, g, i, &bytes).expect("store");
            }
            submit(&mut rt, &mut engine, format!("w{n}"), p.clone(), 6);
        }
        let c = finish(rt, &mut engine, &conn);
        assert_eq!(c.tokens_checked, 24, "{c:?}");
        assert_eq!(
            (c.logit_mismatches, c.read_mismatches),
            (0, 0),
            "{mamba:?}: {c:?}"
        );
        assert!(conn.counts().chunks_loaded >= 4 * 4, "{:?}", conn.counts());
    }
}

/// Two requests on Mamba `align`, a token budget of 40 (split between the shards): `r0`, a
/// 256-token prefix the tier holds with every chunk damaged and a 5-token suffix, runs alone
/// for one step, in which its sync load of the prefix fails; then `r1` is submitted, on the
/// same prefix (`shared`) or on one of its own the tier does not hold. Returns the judge's
/// counts.
fn rolled_back_prefix(mode: Mode, shards: usize, shared: bool) -> ModelCounts {
    let (_, store, mut rt, conn, mut engine) = damaged_prefix_stack(mode, shards);
    let prefix = |p: u32| (0..256).map(|t| (p * 7 + t * 3) % 61).collect::<Vec<u32>>();
    store_damaged(&store, &conn, &engine, &prefix(0));
    let prompt = [&prefix(0)[..], &[1, 5, 9, 2, 4]].concat();
    submit(&mut rt, &mut engine, "r0".into(), prompt, BURST_NEW_TOKENS);
    let plan = rt.schedule().expect("step");
    answer(&mut rt, &mut engine, &conn, &plan, Vec::new());
    let first = engine.counts();
    assert_eq!(first.sync_loads_failed, 1, "{first:?}");
    let prompt = [&prefix(u32::from(!shared))[..], &[2, 5, 9, 2, 4]].concat();
    submit(&mut rt, &mut engine, "r1".into(), prompt, BURST_NEW_TOKENS);
    finish(rt, &mut engine, &conn)
}

/// Rolled-back blocks left cached, by construction. In mode `vllm` `r0`'s sync load puts the
/// prefix's destinations in the prefix cache (vLLM hashes blocks at allocation); the load
/// fails and `r0` is rolled back to recompute the prefix, a block-aligned chunk a step, but
/// its blocks stay cached (vLLM evicts them only under policy `fail`). `r1`, admitted after
/// the failure, hits the whole prefix, computes its suffix over blocks `r0` has not rewritten
/// yet and resumes from the Mamba state the load left: its outputs are wrong, and the judge
/// traces each to blocks it reached through the prefix cache after the failure. `r1` shares no
/// step with the failed load (no sharer), and this holds on one shard and on two, for every
/// placement of the two ids. Controls: mode `safe` caches a block only once it is written (and
/// evicts a rolled-back request's entries), so `r1` has no hit and computes the prefix itself;
/// mode `vllm` with `r1` on a prefix of its own has none either.
/// Both are exact: the wrong outputs are the hit on the rolled-back blocks.
#[test]
fn mode_vllm_hits_rolled_back_blocks_left_cached_and_mode_safe_has_none() {
    for shards in [1, 2] {
        let vllm = rolled_back_prefix(Mode::Vllm, shards, true);
        let safe = rolled_back_prefix(Mode::Safe, shards, true);
        let unshared = rolled_back_prefix(Mode::Vllm, shards, false);
        eprintln!("{shards} shards\nvllm: {vllm:?}\nsafe: {safe:?}\nunshared: {unshared:?}");
        for c in [&vllm, &safe, &unshared] {
            assert_eq!(c.tokens_checked, 2 * u64::from(BURST_NEW_TOKENS), "{c:?}");
            assert_eq!(c.failed_load_sharers, 0, "{shards} shards: {c:?}");
        }
        assert!(
            vllm.token_mismatches > 0,
            "{shards} shards: vllm kept no wrong token: {vllm:?}"
        );
        let causes = WrongTokenCauses {
            rolled_back_blocks_cached: vllm.token_mismatches,
            ..WrongTokenCauses::default()
        };
        assert_eq!(vllm.wrong_token_causes, causes, "{shards} shards: {vllm:?}");
        assert_eq!(
            (safe.logit_mismatches, safe.read_mismatches),
            (0, 0),
            "{shards} shards: {safe:?}"
        );
        assert_eq!(
            (unshared.logit_mismatches, unshared.read_mismatches),
            (0, 0),
            "{shards} shards: {unshared:?}"
        );
    }
}

/// The engine's count of reads it could not make counts: a plan whose table names the null
/// block where a request's first tokens live makes the engine read zeros there, count each
/// such read and judge the token wrong — the counter the other tests hold at 0 is live.
#[test]
fn a_read_through_a_null_entry_is_counted_and_judged_wrong() {
    let groups = vec![CacheGroup::full_attention(16)];
    let tier: Arc<dyn Tier> = Arc::new(MemoryTier::new(8 << 20, 2));
    let (async_ratio, shards) = (0.0, 1);
    let k = Knobs {
        async_ratio,
        shards,
        ..Knobs::default()
    };
    let (mut rt, conn, mut engine) = stack(&groups, tier, &k, 7);
    submit(
        &mut rt,
        &mut engine,
        "r".into(),
        (0..40).map(|t| (t * 5) % 61).collect(),
        4,
    );
    let plan = rt.schedule().expect("prefill");
    answer(&mut rt, &mut engine, &conn, &plan, Vec::new());
    let before = engine.counts();
    assert_eq!(
        (before.unreadable_reads, before.token_mismatches),
        (0, 0),
        "{before:?}"
    );
    // The decode step, as the engine is handed it with block 0 of the table nulled.
    let mut plan = rt.schedule().expect("decode");
    let s = plan
        .scheduled
        .first_mut()
        .expect("the request is scheduled");
    assert_eq!(s.num_computed_tokens, 40, "a decode after the whole prompt");
    let mut tables: Vec<BlockTable> = s.block_tables.to_vec();
    let mut first: Vec<BlockRef> = tables[0].to_vec();
    first[0] = BlockRef {
        id: 0,
        generation: 0,
    };
    tables[0] = first.into();
    s.block_tables = tables.into();
    answer(&mut rt, &mut engine, &conn, &plan, Vec::new());
    let after = engine.counts();
    // Positions 0..16 of the attention layers read through the null entry.
    assert!(after.unreadable_reads >= 16, "{after:?}");
    assert!(
        after.token_mismatches + after.logit_mismatches > 0,
        "{after:?}"
    );
    finish(rt, &mut engine, &conn);
}
