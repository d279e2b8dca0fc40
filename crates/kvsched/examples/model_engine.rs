//! An engine's loop around kvsched, with a real (tiny) model: a hybrid model with full
//! attention (two layers), a sliding window and a Mamba-style layer, its KV in host memory, a tier that
//! damages some chunks at rest, and every sample judged against the request decoded alone.
//!
//! ```sh
//! cargo run --release --example model_engine            # mode safe: 0 wrong tokens
//! cargo run --release --example model_engine -- vllm    # vLLM's design: wrong logits
//! ```
//!
//! The step is what any engine does with a plan (see `ModelEngine::run_step` for the model
//! side): run the plan's sync loads, compute every scheduled request through the block tables
//! the plan names, call `update` before emitting anything, emit only what it did not return
//! for discard, and offer the blocks each kept step completed to the tier.

use std::sync::Arc;
use std::time::Duration;

use kvsched::connector::KvConnector;
use kvsched::kv::{HostKvMemory, KvMemory, MemoryTier, Tier, TierConnector, TierConnectorConfig};
use kvsched::{CacheGroup, MambaMode, Mode, Runtime, StepOutput, SubmitRequest};
use kvsched_testkit::{FaultConfig, FaultyTier};
use kvsched_testkit::{ModelEngine, ModelShape, TinyModel};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mode = match std::env::args().nth(1).as_deref() {
        Some("vllm") => Mode::Vllm,
        None | Some("safe") => Mode::Safe,
        Some(other) => {
            eprintln!("error: mode: '{other}' is not safe or vllm");
            std::process::exit(2);
        }
    };
    let groups = vec![
        CacheGroup::full_attention(16),
        CacheGroup::sliding_window(16, 24),
        CacheGroup::mamba(16, MambaMode::All),
    ];
    // One tier shared by two engines: the first computes the prefixes and saves them (15% of
    // chunks are damaged at rest), the second meets them there.
    let tier: Arc<dyn Tier> = Arc::new(FaultyTier::new(
        MemoryTier::new(64 << 20, 4),
        FaultConfig {
            seed: 1,
            corrupt: 0.15,
            ..FaultConfig::default()
        },
    )?);
    let prefixes: Vec<Vec<u32>> = (0..12u32)
        .map(|p| {
            (0..48 + 32 * (p % 2))
                .map(|t| (p * 7 + t * 3) % 61)
                .collect()
        })
        .collect();
    let warm: Vec<Vec<u32>> = prefixes.iter().map(|p| [&p[..], &[1]].concat()).collect();
    run(&groups, Arc::clone(&tier), Mode::Safe, &warm, 1, false)?;
    // The second engine: bursts of three requests sharing a prefix, loaded synchronously.
    let prompts: Vec<Vec<u32>> = (0..60u32)
        .map(|i| {
            let tail = (0..1 + i % 29).map(|t| (i * 13 + t) % 64);
            prefixes[(i / 3 % 12) as usize]
                .iter()
                .copied()
                .chain(tail)
                .collect()
        })
        .collect();
    run(&groups, tier, mode, &prompts, 8, true)
}

/// One engine on `tier`: submits `prompts` (three a step), runs them to the end.
fn run(
    groups: &[CacheGroup],
    tier: Arc<dyn Tier>,
    mode: Mode,
    prompts: &[Vec<u32>],
    max_new_tokens: u32,
    print: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let model = Arc::new(TinyModel::new(groups, ModelShape::default(), 42));
    let layout = model.kv_layout(groups)?;
    let memory: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout, 4096)?);
    let conn = Arc::new(TierConnector::new(
        tier,
        Arc::clone(&memory),
        TierConnectorConfig::default()
            .with_groups(groups.to_vec())
            .with_tag(1)
            .with_async_ratio(0.0),
    )?);
    let dyn_conn: Arc<dyn KvConnector> = conn.clone();
    let mut rt = Runtime::builder()
        .groups(groups.to_vec())
        .pool_blocks(2048)
        .token_budget(32)
        .mode(mode)
        .connector(dyn_conn)
        .build()?;
    let mut engine = ModelEngine::new(model, groups.to_vec(), memory);
    let mut next = 0;
    let mut emitted = 0;
    while next < prompts.len() || rt.live() > 0 {
        for prompt in prompts.iter().skip(next).take(3) {
            let id = format!("r{next}");
            engine.add_request(&id, prompt);
            rt.submit(SubmitRequest {
                id,
                prompt: prompt.clone(),
                max_new_tokens,
                priority: 0,
                load_deadline: None,
            })?;
            next += 1;
        }
        let plan = rt.schedule()?;
        for (id, _) in &plan.ended {
            engine.end_request(id);
        }
        // The model: sync loads, then layer by layer over the batch, then the samples.
        let step = engine.run_step(&plan, Some(conn.as_ref()));
        let mut out = StepOutput::all_sampled(&plan);
        out.invalid_blocks = step.invalid_blocks.clone();
        // Before emitting anything: which outputs were computed from a failed sync load.
        let discard = rt.update(out);
        emitted += engine.settle(&plan, step, &discard).len();
        for s in plan.scheduled.iter().filter(|s| !discard.contains(&s.id)) {
            if let Some(prompt) = engine.prompt(&s.id).map(<[u32]>::to_vec) {
                conn.save_step(&prompt, s);
            }
        }
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_millis(1));
        }
    }
    let report = rt.shutdown();
    conn.flush();
    if print {
        let c = engine.counts();
        let t = conn.counts();
        let name = if mode == Mode::Safe { "safe" } else { "vllm" };
        println!(
            "mode {name}: {} requests finished, {emitted} tokens emitted",
            report.metrics.finished
        );
        println!(
            "  sync loads {} ({} failed), chunks loaded {}, damaged chunks caught {}",
            c.sync_loads, c.sync_loads_failed, t.chunks_loaded, t.checksum_failures
        );
        println!(
            "  judged {} tokens against each request decoded alone: {} wrong tokens, {} wrong logits, {} wrong reads",
            c.tokens_checked, c.token_mismatches, c.logit_mismatches, c.read_mismatches
        );
        println!(
            "  tokens recomputed by recovery {}",
            report.metrics.tokens_recomputed
        );
    }
    Ok(())
}
