//! The shared block pool: allocate/release pairs (free-list path), batched `allocate_n`, and
//! prefix-cache lookup hits (lookup + release of registered blocks), in blocks per second.
//!
//! Run: `cargo bench --bench pool -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvsched::pool::BlockPool;

const POOL_BLOCKS: usize = 64 * 1024;
const BATCH: usize = 1024;

fn bench_pool(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));

    let pool = BlockPool::new(POOL_BLOCKS).ok();
    let Some(pool) = pool else { return };
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function(BenchmarkId::new("allocate_release", BATCH), |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                if let Some(r) = pool.allocate() {
                    let _ = pool.release(black_box(r));
                }
            }
        })
    });

    let mut out = Vec::with_capacity(BATCH);
    group.bench_function(BenchmarkId::new("allocate_n_release", BATCH), |b| {
        b.iter(|| {
            out.clear();
            if pool.allocate_n(BATCH, &mut out) {
                for &r in &out {
                    let _ = pool.release(r);
                }
            }
        })
    });

    // Registered, unreferenced blocks: every lookup is a hit that revives one.
    let cached = BlockPool::new(POOL_BLOCKS).ok();
    let Some(cached) = cached else { return };
    let mut hashes = Vec::with_capacity(BATCH);
    for i in 0..BATCH as u64 {
        let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        if let Some(r) = cached.allocate() {
            if cached.register(h, r) {
                hashes.push(h);
            }
            let _ = cached.release(r);
        }
    }
    group.throughput(Throughput::Elements(hashes.len() as u64));
    group.bench_function(BenchmarkId::new("lookup_hit_release", hashes.len()), |b| {
        b.iter(|| {
            for &h in &hashes {
                if let Some(r) = cached.lookup(black_box(h)) {
                    let _ = cached.release(r);
                }
            }
        })
    });

    // A full prefix cache turning over, as a busy engine's: every block cached and
    // unreferenced, so each allocation reclaims one (dropping its index entry); then the
    // request's blocks are registered under fresh hashes and released. Per block one at a
    // time, and batched (`allocate_n`, `register_all`: each index shard locked once a batch).
    const CHURN: usize = 32;
    for batched in [false, true] {
        let Ok(full) = BlockPool::new(POOL_BLOCKS) else {
            return;
        };
        let mut next_hash = 1u64;
        let mut fresh = || {
            next_hash += 1;
            next_hash.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        };
        let mut all = Vec::with_capacity(POOL_BLOCKS);
        while let Some(r) = full.allocate() {
            all.push(r);
        }
        for &r in &all {
            full.register(fresh(), r);
            let _ = full.release(r);
        }
        let mut blocks = Vec::with_capacity(CHURN);
        let mut entries = Vec::with_capacity(CHURN);
        group.throughput(Throughput::Elements(CHURN as u64));
        let name = if batched {
            "churn_batched"
        } else {
            "churn_one_by_one"
        };
        group.bench_function(BenchmarkId::new(name, CHURN), |b| {
            b.iter(|| {
                blocks.clear();
                if batched {
                    full.allocate_n(CHURN, &mut blocks);
                    entries.clear();
                    entries.extend(blocks.iter().map(|&r| (fresh(), r)));
                    full.register_all(&entries);
                } else {
                    for _ in 0..CHURN {
                        if let Some(r) = full.allocate() {
                            blocks.push(r);
                            full.register(fresh(), r);
                        }
                    }
                }
                for &r in &blocks {
                    let _ = full.release(black_box(r));
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_pool);
criterion_main!(benches);
