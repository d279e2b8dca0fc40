//! A whole runtime step — `update()` with the last step's output, then `schedule()` — in the
//! cases of the `kvsched stress` table: open loop at the default rate (about 32 live, new
//! arrivals every step), closed loop at 256, 1k, 4k, 16k and 64k live, each on 1 and 2
//! shards. Closed loop as in `stress --rate max`: each request generates 16 tokens and a
//! request that ends is replaced by a new one, so every step admits, schedules, applies
//! outputs and ends requests. Half the prompts share a 32-token prefix (`--prefix-share`).
//! No connector: every request computes locally, so this is the scheduler alone, without the
//! simulated engine's byte work or its threads (the mutex baseline lives in the command
//! line, out of a library bench's reach: compare with `kvsched stress --baseline mutex`).
//! Only `update()` + `schedule()` are timed; submitting the replacements is not.
//!
//! Run: `cargo bench --bench step -- --warm-up-time 1 --measurement-time 3`

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvsched::{Runtime, StepOutput, StepPlan, SubmitRequest};
use kvsched_testkit::SimEngine;
use kvsched_testkit::SplitMix64;

const PROMPT_TOKENS: usize = 64;
const SHARED_PREFIX: usize = 32;
const OUTPUT_TOKENS: u32 = 16;

/// The cases, named as the rows of the stress table.
const CASES: [(&str, usize); 6] = [
    ("open_loop_default_rate", 32),
    ("closed_256_live", 256),
    ("closed_1k_live", 1024),
    ("closed_4k_live", 4096),
    ("closed_16k_live", 16384),
    ("closed_64k_live", 65536),
];

/// The closed loop: the runtime, the next request number, the prompt generator and the
/// last output.
struct Loop {
    rt: Runtime,
    next: u64,
    rng: SplitMix64,
    out: StepOutput,
}

impl Loop {
    fn submit(&mut self) -> Option<()> {
        let shared = self.next % 2 == 0;
        let prompt = (0..PROMPT_TOKENS)
            .map(|i| {
                if shared && i < SHARED_PREFIX {
                    i as u32
                } else {
                    self.rng.next_u64() as u32
                }
            })
            .collect();
        self.rt
            .submit(SubmitRequest {
                // Shaped as an OpenAI-compatible server's ids (39 bytes): routing hashes them.
                id: format!(
                    "cmpl-{:016x}{:016x}-0",
                    self.next.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    self.next
                ),
                prompt,
                max_new_tokens: OUTPUT_TOKENS,
                priority: 0,
                load_deadline: None,
            })
            .ok()?;
        self.next += 1;
        Some(())
    }

    /// One timed step; the ended requests are replaced afterwards, untimed.
    fn step(&mut self) -> Option<Duration> {
        let t = Instant::now();
        self.rt.update(std::mem::take(&mut self.out));
        let plan = self.rt.schedule().ok()?;
        let took = t.elapsed();
        self.out = output_of(&plan);
        for _ in 0..plan.ended.len() {
            self.submit()?;
        }
        Some(took)
    }
}

/// The engine's answer to `plan`: a sample for every request that samples.
fn output_of(plan: &StepPlan) -> StepOutput {
    SimEngine::default().step(plan)
}

/// A runtime of `shards` shards with `live` requests in flight, past the first prefills.
fn setup(live: usize, shards: usize) -> Option<Loop> {
    let rt = Runtime::builder()
        .pool_blocks(live * 8 + 4096)
        .shards(shards)
        .workers(1)
        .token_budget(8192)
        .max_seqs(256)
        .build()
        .ok()?;
    let mut l = Loop {
        rt,
        next: 0,
        rng: SplitMix64::new(7),
        out: StepOutput::default(),
    };
    for _ in 0..live {
        l.submit()?;
    }
    for _ in 0..(live * PROMPT_TOKENS / 8192 + live / 256 + 8) {
        l.step()?;
    }
    Some(l)
}

fn bench_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("step");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1));
    for (name, live) in CASES {
        for shards in [1usize, 2] {
            // Set up only when the case runs (criterion calls this closure only for a case
            // its filter selects): a 64k-live runtime takes seconds to fill.
            let mut l = None;
            group.bench_function(BenchmarkId::new(name, format!("{shards}_shards")), |b| {
                if l.is_none() {
                    l = setup(live, shards);
                }
                let Some(l) = l.as_mut() else {
                    return;
                };
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| l.step().unwrap_or_default())
                        .sum::<Duration>()
                })
            });
            if let Some(l) = l {
                drop(l.rt.shutdown());
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
