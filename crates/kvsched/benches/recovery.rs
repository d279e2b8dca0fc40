//! Throughput of the sequential recovery engine (`recovery::recover`) on the speed-target
//! scenario (see `common/mod.rs`) and variants, in scanned table entries per second; and the
//! many-group cases, whose cost must grow linearly with the groups: mode `safe` on one request
//! with many groups of several hits each (the resumable boundary), and building a
//! group-qualified report over many groups (one membership set each).
//!
//! Run: `cargo bench --bench recovery -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvsched::rules::geometry::{BlockId, CacheGroup, Geometry};
use kvsched::rules::recovery::{
    recover, recover_explained, InvalidSet, Mode, Policy, Request, RequestClass,
};

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

/// One async request over `groups` full-attention groups of 16, six entries each, its entries
/// 1..=5 reported in every group (a flat report): every group has five new hits.
fn many_groups(groups: usize) -> (Geometry, Vec<Request>, Vec<BlockId>) {
    let geo = Geometry::new(vec![CacheGroup::full_attention(16); groups], None, 0)
        .expect("valid geometry");
    let mut tables = Vec::with_capacity(groups);
    let mut ids = Vec::with_capacity(5 * groups);
    for g in 0..groups as u64 {
        let base = 6 * g + 1;
        tables.push((base..base + 6).collect::<Vec<_>>());
        ids.extend(base + 1..base + 6);
    }
    let request = Request {
        id: "a".to_owned(),
        class: RequestClass::Async,
        num_computed_tokens: 96,
        num_scheduled_tokens: 0,
        block_tables: tables,
    };
    (geo, vec![request], ids)
}

fn bench_many_groups(c: &mut Criterion) {
    let mut group = c.benchmark_group("many_groups");
    group.sample_size(20);
    for n in [1_000usize, 10_000, 60_000] {
        let (geo, requests, ids) = many_groups(n);
        let invalid = InvalidSet::flat(ids.iter().copied(), &geo);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("safe_5_hits_per_group", n), &n, |b, _| {
            b.iter(|| {
                recover(
                    &geo,
                    Mode::Safe,
                    Policy::Recompute,
                    black_box(&requests),
                    black_box(&invalid),
                )
            })
        });
        group.bench_with_input(
            BenchmarkId::new("safe_5_hits_per_group_explained", n),
            &n,
            |b, _| {
                b.iter(|| {
                    recover_explained(
                        &geo,
                        Mode::Safe,
                        Policy::Recompute,
                        black_box(&requests),
                        black_box(&invalid),
                    )
                })
            },
        );
        // A group-qualified report of two far-apart ids per group.
        let lists = vec![vec![1u64, 16_777_215]; n];
        group.bench_with_input(BenchmarkId::new("qualified_report_build", n), &n, |b, _| {
            b.iter(|| InvalidSet::with_groups([], black_box(&lists), &geo))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_recover, bench_many_groups);
criterion_main!(benches);
