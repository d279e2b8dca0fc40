//! A request rolled back inside a Mamba `all` prefix recomputes it in steps that end inside
//! blocks, each writing the state where it ends into the entry holding its last token. The
//! entry's block-end state is what a prefix hit ending there reads, so the runtime must
//! never let such a step write into a block another request can read (docs/rules.md,
//! "Sharers wait for the owner").

use std::sync::Arc;

use kvsched::kv::{MemoryTier, Tier, TierConnector};
use kvsched::{CacheGroup, MambaMode, Mode, Runtime, StepOutput, SubmitRequest};
use kvsched_testkit::{ModelCounts, ModelEngine};

use crate::support::*;

/// The prefix the tier holds: six blocks of 16 tokens.
const PREFIX: usize = 96;
/// The tier's block of the prefix that is damaged at rest: `[48, 64)`.
const DAMAGED: usize = 3;

/// Full attention and Mamba `all` of 16 tokens over `tier`, one shard, sync loads, a token
/// budget of 12, in `mode`; and the prefix.
fn mamba_all_stack(
    mode: Mode,
    tier: Arc<dyn Tier>,
) -> (Runtime, Arc<TierConnector>, ModelEngine, Vec<u32>) {
    let groups = vec![
        CacheGroup::full_attention(16),
        CacheGroup::mamba(16, MambaMode::All),
    ];
    let k = Knobs {
        mode,
        async_ratio: 0.0,
        shards: 1,
        budget: 12,
        ..Knobs::default()
    };
    let (rt, conn, engine) = stack(&groups, tier, &k, 3);
    let prefix: Vec<u32> = (0..PREFIX as u32).map(|t| (t * 5 + 2) % 61).collect();
    (rt, conn, engine, prefix)
}

/// What [`rolled_back_mid_block`] saw besides the judge's counts.
#[derive(Debug)]
struct Seen {
    model: ModelCounts,
    /// `r0`'s steps after its failed load that ended inside a block of the prefix.
    mid_block_steps: u32,
    /// Probes submitted, one after each such step.
    probes: u32,
    /// The longest local prefix (prefix-cache hit) a probe was admitted with.
    longest_hit: u64,
    /// Probes whose hit reached the end of the block `r0` was inside when it was submitted.
    hits_into_rewritten: u32,
}

/// Full attention and Mamba `all`, blocks of 16 tokens, one shard, sync loads, a token
/// budget of 12. The tier holds a 96-token prefix whose block 3 of group `damaged_group` is
/// damaged at rest; `r0` (the prefix and 5 tokens) loads it, the load fails at 48 and `r0`
/// recomputes from its resumable boundary in steps of 12 tokens, most ending inside a
/// block. The tier then drops the prefix (and nothing is saved to it: a probe's load of what
/// its prefix hit lacks fails, and it recomputes that). After each such step a probe is
/// submitted (priority -1: admitted and scheduled before `r0`'s next step) whose prompt is
/// the prefix up to the end of that block and 2 tokens: its prefix hit reaches as far as the
/// prefix cache holds the prefix, that block's state included if it is cached.
fn rolled_back_mid_block(damaged_group: usize) -> Seen {
    let store = Arc::new(MemoryTier::new(64 << 20, 4));
    let (mut rt, conn, mut engine, prefix) = mamba_all_stack(Mode::Safe, store.clone());
    for (g, i, bytes) in engine.reference_blocks(&prefix) {
        assert!(conn.store_now(&prefix, g, i, &bytes).expect("store"));
        if (g, i) == (damaged_group, DAMAGED) {
            let key = conn.chunk_key(g, &prefix, i).expect("a full block's key");
            assert!(store.edit_stored(key, |v| {
                let at = v.len() / 2;
                v[at] ^= 1;
                true
            }));
        }
    }
    let prompt = [&prefix[..], &[7, 1, 7, 1, 7]].concat();
    submit(&mut rt, &mut engine, "r0".into(), prompt, 4);
    let mut seen = Seen {
        model: ModelCounts::default(),
        mid_block_steps: 0,
        probes: 0,
        longest_hit: 0,
        hits_into_rewritten: 0,
    };
    let mut lens = std::collections::HashMap::new();
    while rt.live() > 0 {
        let plan = rt.schedule().expect("step");
        let mut probe_at = None;
        for s in &plan.scheduled {
            if s.first && s.id.starts_with('p') {
                // The local prefix: where its load (of nothing the tier still holds) starts.
                let local = s
                    .sync_load
                    .as_ref()
                    .map_or(s.num_computed_tokens, |j| j.start_tokens);
                seen.longest_hit = seen.longest_hit.max(local);
                let len = lens.get(&*s.id).copied().unwrap_or(0);
                seen.hits_into_rewritten += u32::from(local >= len as u64);
            }
            let end = s.num_computed_tokens + s.num_tokens;
            let failed = engine.counts().sync_loads_failed > 0 && s.sync_load.is_none();
            if &*s.id == "r0" && failed && end % 16 != 0 && end < PREFIX as u64 {
                seen.mid_block_steps += 1;
                probe_at = Some(end.next_multiple_of(16) as usize);
            }
        }
        let failed_before = engine.counts().sync_loads_failed > 0;
        // Answered without saving to the tier: the probes find the prefix only where the
        // prefix cache holds it.
        let step = engine.run_step(&plan, Some(&*conn));
        let mut out = StepOutput::all_sampled(&plan);
        out.invalid_blocks = step.invalid_blocks.clone();
        let discard = rt.update(out);
        engine.settle(&plan, step, &discard);
        if !failed_before && engine.counts().sync_loads_failed > 0 {
            // Nor does the tier hold it any longer.
            for i in 0..PREFIX / 16 {
                for g in 0..2 {
                    let key = conn.chunk_key(g, &prefix, i).expect("a full block's key");
                    assert!(store.remove(key));
                }
            }
        }
        if let Some(len) = probe_at {
            let id = format!("p{}", seen.probes);
            lens.insert(id.clone(), len);
            submit_first(
                &mut rt,
                &mut engine,
                &id,
                [&prefix[..len], &[4, 9]].concat(),
            );
            seen.probes += 1;
        }
        for (id, _) in &plan.ended {
            engine.end_request(id);
        }
    }
    seen.model = finish(rt, &mut engine, &conn);
    seen
}

/// The regression guard. In mode `safe` a request's entries at and above the boundary a
/// failed load rolls it back to hold the load's own destinations and fresh blocks, which no
/// other request holds and the prefix cache does not list until a confirmed step of the
/// request has computed past them again; so the probes' hits stop at the boundary or at a
/// block `r0` has recomputed whole, and every output equals the request decoded alone.
#[test]
fn a_mamba_all_request_rolled_back_mid_prefix_writes_no_state_a_prefix_hit_reads() {
    for damaged_group in [0, 1] {
        let seen = rolled_back_mid_block(damaged_group);
        eprintln!("damaged group {damaged_group}: {seen:?}");
        let m = &seen.model;
        assert!(m.sync_loads_failed >= 1, "{seen:?}");
        assert!(seen.mid_block_steps >= 3, "{seen:?}");
        assert_eq!(seen.probes, seen.mid_block_steps, "{seen:?}");
        assert!(seen.longest_hit >= 48, "no probe hit the prefix: {seen:?}");
        assert_eq!(seen.hits_into_rewritten, 0, "{seen:?}");
        assert_eq!(
            (
                m.logit_mismatches,
                m.token_mismatches,
                m.unreadable_reads,
                m.read_mismatches
            ),
            (0, 0, 0, 0),
            "damaged group {damaged_group}: {seen:?}"
        );
        assert_eq!(m.tokens_checked, 4 + 2 * u64::from(seen.probes), "{seen:?}");
    }
}

/// The same hazard at a live switch from mode `vllm`, where mode `safe`'s first report names
/// blocks another request holds. `l` loads the prefix's first 32 tokens from the tier (mode
/// `vllm` caches the destinations as it admits it), computes the rest of the 96-token prefix,
/// caching its blocks, and finishes; `r` is admitted on the cached prefix. The runtime then
/// switches to mode `safe`, whose first step reports `l`'s destinations (their loader ended:
/// nothing says they were written): `r` claims them and rolls back to 0, below every cached
/// block it holds, and recomputes in steps of 12 tokens. After its step ending at 36 (inside
/// the cached block of `[32, 48)`, whose Mamba entry held the state at 48) a probe on the
/// first 48 tokens is submitted. The decision evicted `r`'s entries from 0 on, so the probe's
/// hit stops at 32, what `r` has registered again; every output is exact. (Planted bug
/// `safe-evicts-nothing`: the probe hits 48, resumes from the state at 36 that `r` wrote into
/// the block, and the judge counts both its outputs wrong.)
#[test]
fn a_live_switch_rolling_a_request_back_below_cached_mamba_all_blocks_evicts_them() {
    let tier: Arc<dyn Tier> = Arc::new(MemoryTier::new(64 << 20, 4));
    let (mut rt, conn, mut engine, prefix) = mamba_all_stack(Mode::Vllm, tier);
    for (g, i, bytes) in engine.reference_blocks(&prefix[..32]) {
        assert!(conn.store_now(&prefix, g, i, &bytes).expect("store"));
    }
    submit(
        &mut rt,
        &mut engine,
        "l".into(),
        [&prefix[..], &[7]].concat(),
        1,
    );
    let (mut rolled_back, mut probe_hit, mut probed) = (None, None, false);
    for n in 0..200 {
        if rt.live() == 0 {
            break;
        }
        if n == 3 {
            let prompt = [&prefix[..], &[8, 8]].concat();
            submit(&mut rt, &mut engine, "r".into(), prompt, 20);
        }
        if n == 15 {
            rt.update_settings(rt.settings().with_mode(Mode::Safe))
                .expect("switch");
        }
        let plan = rt.schedule().expect("step");
        for d in plan.recovery.recovered.iter().filter(|d| &*d.id == "r") {
            rolled_back = Some(d.decision.num_computed_tokens);
        }
        let mut probe_now = false;
        for s in &plan.scheduled {
            let end = s.num_computed_tokens + s.num_tokens;
            if &*s.id == "r" && rolled_back == Some(0) && end > 32 && end < 48 && !probed {
                probe_now = true;
            }
            if &*s.id == "p" && s.first {
                probe_hit = Some(s.num_computed_tokens);
            }
        }
        let step = engine.run_step(&plan, Some(&*conn));
        let mut out = StepOutput::all_sampled(&plan);
        out.invalid_blocks = step.invalid_blocks.clone();
        let discard = rt.update(out);
        engine.settle(&plan, step, &discard);
        for (id, _) in &plan.ended {
            engine.end_request(id);
        }
        if probe_now {
            submit_first(&mut rt, &mut engine, "p", [&prefix[..48], &[4, 9]].concat());
            probed = true;
        }
    }
    let m = finish(rt, &mut engine, &conn);
    eprintln!("rolled back to {rolled_back:?}, probe hit {probe_hit:?}: {m:?}");
    assert_eq!(rolled_back, Some(0), "{m:?}");
    assert!(probed, "r never ended a step inside [32, 48)");
    assert_eq!(
        (m.logit_mismatches, m.unreadable_reads, m.read_mismatches),
        (0, 0, 0),
        "{m:?}"
    );
    assert_eq!(probe_hit, Some(32), "{m:?}");
    assert_eq!(m.tokens_checked, 1 + 20 + 2, "{m:?}");
}

/// Submits `prompt` as request `id` with priority -1: scheduled before the others.
fn submit_first(rt: &mut Runtime, engine: &mut ModelEngine, id: &str, prompt: Vec<u32>) {
    engine.add_request(id, &prompt);
    rt.submit(SubmitRequest {
        id: id.into(),
        prompt,
        max_new_tokens: 2,
        priority: -1,
        load_deadline: None,
    })
    .expect("submit");
}
