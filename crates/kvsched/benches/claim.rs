//! Claim table under contention: every thread offers keys for the same hot blocks with one
//! wait-free `fetch_min` each ([`ClaimTable::claim`]), 1–4 threads, in claims per second.
//!
//! Run: `cargo bench --bench claim -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvsched::runtime::claim::{ClaimTable, RequestKey, Scan};

/// Claims per thread per measured batch.
const CLAIMS_PER_THREAD: u64 = 64 * 1024;
/// Hot blocks the threads contend for.
const HOT_BLOCKS: u64 = 256;

fn run(table: &ClaimTable, threads: u64, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        for id in 0..HOT_BLOCKS {
            table.reset(id);
        }
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || {
                    let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    for i in 0..CLAIMS_PER_THREAD {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let key = RequestKey::new(false, 0, 1 + (x % 1_000_000));
                        table.claim(black_box(i % HOT_BLOCKS), Scan::Async, key);
                    }
                });
            }
        });
        total += start.elapsed();
    }
    total
}

fn bench_claims(c: &mut Criterion) {
    let table = ClaimTable::new(HOT_BLOCKS as usize);
    let mut group = c.benchmark_group("claim_table");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for threads in 1..=4u64 {
        group.throughput(Throughput::Elements(threads * CLAIMS_PER_THREAD));
        group.bench_with_input(
            BenchmarkId::new("fetch_min", format!("{threads}_threads")),
            &threads,
            |b, &n| b.iter_custom(|iters| run(&table, n, iters)),
        );
    }
    group.finish();
}

criterion_group!(benches, bench_claims);
criterion_main!(benches);
