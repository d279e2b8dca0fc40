//! A whole runtime step — `update()` with the last step's sampled tokens, then `schedule()` —
//! at 1k / 4k / 16k live requests (2 shards, no connector: every request computes locally),
//! in live requests handled per second.
//!
//! Run: `cargo bench --bench step -- --warm-up-time 1 --measurement-time 3`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvsched::{Runtime, StepOutput, StepPlan, SubmitRequest};
use kvsched_testkit::SimEngine;
use kvsched_testkit::SplitMix64;

const PROMPT_TOKENS: usize = 64;

/// The engine's answer to `plan`: a sample for every request that samples.
fn output_of(plan: &StepPlan) -> StepOutput {
    SimEngine::default().step(plan)
}

/// A runtime with `live` requests admitted and running (they never finish on their own).
fn setup(live: usize) -> Option<(Runtime, StepOutput)> {
    let mut rt = Runtime::builder()
        .pool_blocks(live * 24 + 1024)
        .shards(2)
        .workers(1)
        .token_budget(8192)
        .max_seqs(256)
        .build()
        .ok()?;
    let mut rng = SplitMix64::new(7);
    for i in 0..live {
        let prompt = (0..PROMPT_TOKENS).map(|_| rng.next_u64() as u32).collect();
        rt.submit(SubmitRequest {
            id: format!("r{i}"),
            prompt,
            max_new_tokens: 0,
            priority: 0,
            load_deadline: None,
        })
        .ok()?;
    }
    let mut out = StepOutput::default();
    // Admit and prefill everything.
    for _ in 0..(live * PROMPT_TOKENS / 8192 + live / 256 + 8) {
        rt.update(out);
        let plan = rt.schedule().ok()?;
        out = output_of(&plan);
    }
    Some((rt, out))
}

fn bench_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("step");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for live in [1024usize, 4096, 16384] {
        let Some((mut rt, mut out)) = setup(live) else {
            continue;
        };
        group.throughput(Throughput::Elements(live as u64));
        group.bench_function(
            BenchmarkId::new("schedule_update", format!("{live}_live")),
            |b| {
                b.iter(|| {
                    rt.update(std::mem::take(&mut out));
                    let Ok(plan) = rt.schedule() else { return 0 };
                    out = output_of(&plan);
                    plan.scheduled.len()
                })
            },
        );
        drop(rt.shutdown());
    }
    group.finish();
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
