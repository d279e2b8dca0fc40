//! Throughput of the sequential recovery engine (`recovery::recover`) on the speed-target
//! scenario (see `common/mod.rs`) and variants, in scanned table entries per second.
//!
//! Run: `cargo bench --bench recovery -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvsched::rules::recovery::{recover, InvalidSet, Mode, Policy};

mod common;
use common::{generate, ScenarioParams};

fn bench_recover(c: &mut Criterion) {
    let variants = [
        ("fa16_1000x1000_1pct", ScenarioParams::reference()),
        ("hybrid_16_32_64_1pct", ScenarioParams::hybrid()),
        (
            "fa16_1000x1000_10pct",
            ScenarioParams::with_invalid_percent(10),
        ),
        (
            "fa16_1000x1000_50pct",
            ScenarioParams::with_invalid_percent(50),
        ),
    ];
    let mut group = c.benchmark_group("recover");
    for (name, params) in variants {
        let scenario = generate(&params);
        let invalid = InvalidSet::flat(scenario.invalid_blocks.iter().copied(), &scenario.geo);
        group.throughput(Throughput::Elements(scenario.scanned_entries()));
        for (mode_name, mode) in [("vllm", Mode::Vllm), ("safe", Mode::Safe)] {
            group.bench_with_input(
                BenchmarkId::new(name, mode_name),
                &scenario,
                |b, scenario| {
                    b.iter(|| {
                        recover(
                            &scenario.geo,
                            mode,
                            Policy::Recompute,
                            black_box(&scenario.requests),
                            black_box(&invalid),
                        )
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_recover);
criterion_main!(benches);
