//! Load bandwidth of the memory and disk tiers for chunk-sized values (16 KiB and 256 KiB
//! payloads), next to the machine's limits measured in the same run: memcpy of the same
//! sizes (into preallocated buffers, and into a fresh allocation per value as a `get` must),
//! and `std::fs::read` of the disk tier's own files (from the page cache: they were just
//! written). Each load is a batch `get` of 64 chunks, so the working set is 1 MiB or
//! 16 MiB for every contender. Also the cost of one disk put with and without fsync, in
//! the target directory's file system (not tmpfs).
//!
//! Under `cargo bench` it prints a table of MB/s and ratios to stderr after the criterion
//! runs (its own timing: the median of 5 rounds of about 0.3 s each).
//!
//! Run: `cargo bench --bench tier -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvsched::connector::CancelToken;
use kvsched::kv::{ChunkCodec, ChunkKey, DiskConfig, DiskTier, MemoryTier, Tier};

const BATCH: usize = 64;
const SIZES: [(usize, &str); 2] = [(16 << 10, "16KiB"), (256 << 10, "256KiB")];

/// The chunks of one size, a memory tier and a disk tier holding them, and the disk files.
struct Fixture {
    keys: Vec<ChunkKey>,
    values: Vec<Vec<u8>>,
    memory: MemoryTier,
    disk: DiskTier,
    paths: Vec<PathBuf>,
    _dir: tempfile::TempDir,
}

fn key(i: usize) -> ChunkKey {
    ChunkKey::chain(ChunkKey::ROOT, 1, 0, &[i as u32])
}

fn fixture(payload: usize) -> Option<Fixture> {
    let codec = ChunkCodec::new(None);
    let keys: Vec<_> = (0..BATCH).map(key).collect();
    let values: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            let p: Vec<u8> = (0..payload).map(|j| (i * 7 + j) as u8).collect();
            codec.encode(k, 0, 16, &p)
        })
        .collect();
    let chunks: Vec<_> = keys.iter().copied().zip(values.iter().cloned()).collect();
    let memory = MemoryTier::new(1 << 30, 16);
    memory.put(&chunks).ok()?;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).ok()?;
    let disk = DiskTier::open(dir.path(), DiskConfig::default()).ok()?;
    disk.put(&chunks).ok()?;
    let paths = keys.iter().map(|&k| disk.chunk_path(k)).collect();
    Some(Fixture {
        keys,
        values,
        memory,
        disk,
        paths,
        _dir: dir,
    })
}

/// One batch of each contender; every one returns the bytes it moved. memcpy copies each
/// value into its own destination buffer, as a batch `get` fills one buffer per value.
fn memcpy(f: &Fixture, dst: &mut [Vec<u8>]) -> usize {
    let mut n = 0;
    for (v, d) in f.values.iter().zip(dst.iter_mut()) {
        d.copy_from_slice(v);
        n += black_box(&d[..]).len();
    }
    n
}

/// What any `get` returning owned buffers pays at least: a fresh allocation per value, plus
/// the copy (at 256 KiB glibc's malloc may hand out fresh pages, each a page fault).
fn alloc_copy(f: &Fixture) -> usize {
    let got: Vec<Vec<u8>> = f.values.iter().map(|v| v.to_vec()).collect();
    black_box(&got).iter().map(Vec::len).sum()
}

fn memory_get(f: &Fixture) -> usize {
    let got = f
        .memory
        .get(&f.keys, &CancelToken::new())
        .unwrap_or_default();
    got.iter().flatten().map(Vec::len).sum()
}

fn disk_get(f: &Fixture) -> usize {
    let got = f.disk.get(&f.keys, &CancelToken::new()).unwrap_or_default();
    got.iter().flatten().map(Vec::len).sum()
}

/// Holds the whole batch, as a `get` does (dropping each buffer at once would let the
/// allocator reuse one hot buffer, a saving no batch load gets).
fn fs_read(f: &Fixture) -> usize {
    let got: Vec<Vec<u8>> = f
        .paths
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_default())
        .collect();
    black_box(&got).iter().map(Vec::len).sum()
}

fn decode_all(f: &Fixture, got: Vec<Option<Vec<u8>>>, payload: usize) -> usize {
    let codec = ChunkCodec::new(None);
    f.keys
        .iter()
        .zip(got.iter())
        .filter_map(|(k, v)| codec.decode(v.as_ref()?, *k, 0, payload as u64).ok())
        .map(<[u8]>::len)
        .sum()
}

fn bench_load(c: &mut Criterion) {
    let mut group = c.benchmark_group("tier_load");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1));
    for (payload, name) in SIZES {
        let Some(f) = fixture(payload) else { continue };
        let bytes: usize = f.values.iter().map(Vec::len).sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        let mut dst = f.values.clone();
        group.bench_function(BenchmarkId::new("memcpy", name), |b| {
            b.iter(|| memcpy(&f, &mut dst))
        });
        group.bench_function(BenchmarkId::new("alloc_copy", name), |b| {
            b.iter(|| alloc_copy(&f))
        });
        group.bench_function(BenchmarkId::new("memory_get", name), |b| {
            b.iter(|| memory_get(&f))
        });
        group.bench_function(BenchmarkId::new("memory_get_decode", name), |b| {
            b.iter(|| {
                let got = f
                    .memory
                    .get(&f.keys, &CancelToken::new())
                    .unwrap_or_default();
                decode_all(&f, got, payload)
            })
        });
        group.bench_function(BenchmarkId::new("fs_read", name), |b| {
            b.iter(|| fs_read(&f))
        });
        group.bench_function(BenchmarkId::new("disk_get", name), |b| {
            b.iter(|| disk_get(&f))
        });
    }
    group.finish();
}

/// One put of one chunk, cycling over 64 keys (each put replaces a file).
fn disk_putter(payload: usize, fsync: bool) -> Option<impl FnMut() -> usize> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).ok()?;
    let disk = DiskTier::open(
        dir.path(),
        DiskConfig::default()
            .with_capacity_bytes(1 << 30)
            .with_fsync(fsync),
    )
    .ok()?;
    let codec = ChunkCodec::new(None);
    let value = codec.encode(key(0), 0, 16, &vec![7u8; payload]);
    let mut i = 0usize;
    Some(move || {
        let _keep = &dir;
        i = (i + 1) % BATCH;
        let chunk = [(key(i), value.clone())];
        disk.put(&chunk).map(|()| chunk[0].1.len()).unwrap_or(0)
    })
}

fn bench_put(c: &mut Criterion) {
    let mut group = c.benchmark_group("tier_put");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1));
    for (payload, name) in SIZES {
        for fsync in [false, true] {
            let Some(mut put) = disk_putter(payload, fsync) else {
                continue;
            };
            let id = if fsync { "disk_fsync" } else { "disk" };
            group.throughput(Throughput::Bytes(payload as u64));
            group.bench_function(BenchmarkId::new(id, name), |b| b.iter(&mut put));
        }
    }
    group.finish();
}

/// Seconds per call of `f`: the median of 5 rounds of about 0.3 s.
fn time(mut f: impl FnMut() -> usize) -> f64 {
    let mut calls = 1u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(300) {
        black_box(f());
        calls += 1;
    }
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..calls {
                black_box(f());
            }
            t.elapsed().as_secs_f64() / calls as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}

/// The table of bandwidths and ratios, only under `cargo bench` (not `cargo test --benches`).
fn print_ratios(_: &mut Criterion) {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    eprintln!("\nload bandwidth, MB/s (batches of {BATCH} chunks; in parentheses the ratio to the");
    eprintln!(
        "limit: memory to alloc+copy (the least a get returning owned buffers costs), disk to"
    );
    eprintln!("fs::read of the same files)");
    eprintln!(
        "{:>7} {:>8} {:>10} {:>15} {:>15} {:>8} {:>15}",
        "payload", "memcpy", "alloc+copy", "memory_get", "mem_get+decode", "fs_read", "disk_get"
    );
    for (payload, name) in SIZES {
        let Some(f) = fixture(payload) else { continue };
        let bytes = f.values.iter().map(Vec::len).sum::<usize>() as f64;
        let mbps = |s: f64| bytes / s / 1e6;
        let mut dst = f.values.clone();
        let cpy = mbps(time(|| memcpy(&f, &mut dst)));
        let alc = mbps(time(|| alloc_copy(&f)));
        let mem = mbps(time(|| memory_get(&f)));
        let memd = mbps(time(|| {
            let got = f
                .memory
                .get(&f.keys, &CancelToken::new())
                .unwrap_or_default();
            decode_all(&f, got, payload)
        }));
        let rd = mbps(time(|| fs_read(&f)));
        let dsk = mbps(time(|| disk_get(&f)));
        eprintln!(
            "{name:>7} {cpy:>8.0} {alc:>10.0} {mem:>8.0} ({:.2}) {memd:>8.0} ({:.2}) {rd:>8.0} {dsk:>8.0} ({:.2})",
            mem / alc,
            memd / alc,
            dsk / rd,
        );
    }
    eprintln!("\ndisk put, µs per chunk (replacing one of {BATCH} files)");
    for (payload, name) in SIZES {
        let (Some(plain), Some(synced)) = (disk_putter(payload, false), disk_putter(payload, true))
        else {
            continue;
        };
        let a = time(plain) * 1e6;
        let b = time(synced) * 1e6;
        eprintln!(
            "{name:>7}  no fsync {a:>9.1}   fsync {b:>9.1}   ({:.0}× the cost)",
            b / a
        );
    }
}

criterion_group!(benches, bench_load, bench_put, print_ratios);
criterion_main!(benches);
