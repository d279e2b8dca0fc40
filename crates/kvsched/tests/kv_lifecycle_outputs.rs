//! What an engine emits over a request's whole life, on real bytes: every sample the engine
//! keeps is asked for at the request's next token, and a request that ends finished emitted
//! exactly its `max_new_tokens` — whatever the engine does wrong (outputs lost after running
//! the step or before, samples left out, engine finishes, client cancels) and across live
//! switches between modes `vllm` and `safe`. Garbage is not judged here (a `vllm` step may
//! keep it, and what it computed stays: `kv_lifecycle.rs` judges mode `safe` alone).
//!
//! Each defect these tests found has a runtime plant in `scripts/plants.sh`:
//! `restart-keeps-lost-output` (a lost output before a switch to `safe` also lost the
//! restarted request's first step: its kept sample asked for again).

use std::collections::HashMap;

use kvsched::{CacheGroup, EndState, MambaMode, Mode};

mod lifecycle;
use lifecycle::Bench;

/// Seeded random lives on a hybrid model with a small pool (preemptions), damaged chunks and
/// failing sync and async loads, with the engine misbehaving and the mode switched live.
#[test]
fn random_lives_emit_each_token_once() {
    let (mut lost, mut left_out, mut switches, mut finished) = (0, 0, 0, 0);
    for seed in 1..=8u64 {
        let mamba = [MambaMode::Align, MambaMode::All][(seed % 2) as usize];
        let groups = if seed % 4 == 3 {
            vec![CacheGroup::full_attention(16)]
        } else {
            vec![
                CacheGroup::full_attention(16),
                CacheGroup::sliding_window(16, 32),
                CacheGroup::mamba(16, mamba),
            ]
        };
        let tier = lifecycle::faulty_memory_tier(seed, 0.1, 0.05);
        let async_ratio = [0.0, 0.5, 1.0][(seed % 3) as usize];
        let shards = 1 + (seed % 2) as usize;
        let mut e = Bench::new(groups, tier, async_ratio, |b| {
            b.shards(shards)
                .workers(2)
                .pool_blocks(64)
                .token_budget(256)
                .mode(Mode::Vllm)
        });
        let prefixes = lifecycle::warmed_prefixes(&mut e);
        let mut rng = kvsched_testkit::SplitMix64::new(seed * 977);
        let mut live: Vec<String> = Vec::new();
        let mut limits: HashMap<String, u32> = HashMap::new();
        let mut emitted: HashMap<String, u32> = HashMap::new();
        let mut engine_finished: Vec<String> = Vec::new();
        let mut next = 0u32;
        for _ in 0..4000 {
            if next < 50 && rng.unit() < 0.8 {
                let mut prompt = prefixes[rng.below(3) as usize].clone();
                prompt.extend((0..1 + rng.below(40) as u32).map(|t| 50_000 + next * 100 + t));
                let id = format!("r{next}");
                let limit = 1 + rng.below(12) as u32;
                e.submit(&id, &prompt, limit);
                limits.insert(id.clone(), limit);
                live.push(id);
                next += 1;
            }
            if !live.is_empty() && rng.unit() < 0.01 {
                let id = live[rng.below(live.len() as u64) as usize].clone();
                e.finish_next(&id);
                engine_finished.push(id);
            }
            if !live.is_empty() && rng.unit() < 0.01 {
                e.rt.cancel(&live[rng.below(live.len() as u64) as usize]);
            }
            let plan = e.plan();
            // Steps that recover are lost more often, and a loss is followed by a switch more
            // often: a lost output across a switch is where the two modes' rules meet.
            let recovers = !plan.recovery.recovered.is_empty();
            if rng.unit() < if recovers { 0.3 } else { 0.03 } {
                lost += 1;
                e.lose(&plan, rng.unit() < 0.5);
                if rng.unit() < 0.5 {
                    switches += 1;
                    let mode = match e.rt.settings().mode {
                        Mode::Vllm => Mode::Safe,
                        Mode::Safe => Mode::Vllm,
                    };
                    e.rt.update_settings(e.rt.settings().with_mode(mode))
                        .expect("settings");
                }
            } else {
                let leave_out = rng.unit() < 0.05;
                let victim = rng.next_u64();
                let samplers: Vec<&str> = plan
                    .scheduled
                    .iter()
                    .filter(|s| s.samples)
                    .map(|s| &*s.id)
                    .collect();
                let drop = (leave_out && !samplers.is_empty())
                    .then(|| samplers[(victim % samplers.len() as u64) as usize].to_string());
                left_out += usize::from(drop.is_some());
                for id in e.answer_leaving_out(&plan, |id| drop.as_deref() == Some(id)) {
                    *emitted.entry(id.to_string()).or_default() += 1;
                }
                if rng.unit() < 0.05 {
                    switches += 1;
                    let mode = [Mode::Vllm, Mode::Safe][rng.below(2) as usize];
                    e.rt.update_settings(e.rt.settings().with_mode(mode))
                        .expect("settings");
                }
            }
            for (id, how) in &plan.ended {
                live.retain(|l| **l != **id);
                let (id, got) = (id.to_string(), emitted.get(&**id).copied().unwrap_or(0));
                let limit = limits[&id];
                if *how == EndState::Finished && !engine_finished.contains(&id) {
                    assert_eq!(got, limit, "seed {seed}: {id} emitted {got} of {limit}");
                    finished += 1;
                } else {
                    assert!(got <= limit, "seed {seed}: {id} emitted {got} of {limit}");
                }
            }
            if next == 50 && e.rt.live() == 0 {
                break;
            }
        }
        e.finish_all_ended(50, &format!("seed {seed}"));
    }
    // The lives reached every point: the runs did what they are meant to.
    assert!(
        lost > 0 && left_out > 0 && switches > 0 && finished > 100,
        "lost {lost}, left out {left_out}, switches {switches}, finished {finished}"
    );
}
