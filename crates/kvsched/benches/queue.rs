//! Completion hand-off worker → shard through the bounded lock-free completion queue
//! (`kvsched::sync::ArrayQueue<Completion>`): 1–2 producer threads push, the consumer (the
//! shard) drains, in completions per second.
//!
//! Run: `cargo bench --bench queue -- --warm-up-time 1 --measurement-time 3`

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvsched::connector::LoadResult;
use kvsched::runtime::claim::RequestKey;
use kvsched::runtime::worker::Completion;
use kvsched::sync::ArrayQueue;

/// Completions handed off per measured batch.
const BATCH: u64 = 32 * 1024;

fn run(queue: &ArrayQueue<Completion>, producers: u64, iters: u64) -> Duration {
    let per = BATCH / producers;
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        std::thread::scope(|s| {
            for p in 0..producers {
                s.spawn(move || {
                    for i in 0..per {
                        let mut c = Completion {
                            key: RequestKey::new(false, 0, 1 + p * per + i),
                            attempt: 1,
                            result: LoadResult::Ok,
                            panicked: false,
                            started_at: Instant::now(),
                            finished_at: Instant::now(),
                        };
                        // Back off like a worker does when the shard has not drained yet.
                        while let Err(back) = queue.push(c) {
                            c = back;
                            std::hint::spin_loop();
                        }
                    }
                });
            }
            let mut got = 0;
            while got < per * producers {
                match queue.pop() {
                    Some(c) => {
                        std::hint::black_box(&c);
                        got += 1;
                    }
                    None => std::hint::spin_loop(),
                }
            }
        });
        total += start.elapsed();
    }
    total
}

fn bench_queue(c: &mut Criterion) {
    let queue = ArrayQueue::new(kvsched::sync::DEFAULT_COMPLETION_QUEUE_CAPACITY);
    let mut group = c.benchmark_group("completion_queue");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for producers in [1u64, 2] {
        group.throughput(Throughput::Elements(BATCH));
        group.bench_with_input(
            BenchmarkId::new("handoff", format!("{producers}_workers")),
            &producers,
            |b, &n| b.iter_custom(|iters| run(&queue, n, iters)),
        );
    }
    group.finish();
}

criterion_group!(benches, bench_queue);
criterion_main!(benches);
