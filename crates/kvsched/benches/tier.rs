//! Load bandwidth of the memory and disk tiers at 16 KiB, 256 KiB and 2 MiB payloads, against
//! the physical limit measured in the same run — memcpy of the same chunks into preallocated
//! destinations — and against the old load path (a `get` returning a fresh `Vec` per chunk,
//! then decode, then the copy into KV memory). A *load* is what `TierConnector::load` does
//! for a batch of chunks: read each from the tier, verify it (key, group, length, xxh3
//! checksum), copy its payload into its destination block of a `HostKvMemory`. The disk tier
//! is read from the page cache (its files were just written) and compared with `fs::read`
//! into one reused buffer, and into as many reused buffers as the batch (`fs×n`: the same
//! memory traffic as a whole batch's); `get pieces` is the disk tier's own read as a load
//! now does it, about 512 KiB of chunks at a time into the same few buffers. The memory load also runs with a keyed BLAKE3 MAC on every
//! chunk (`mem+MAC`). Also the checksum's (xxh3-64 streamed, as the codec computes it) and
//! the keyed BLAKE3 MAC's own speed, and the cost of one disk put with and without fsync.
//!
//! Batches hold 64 chunks (16 at 2 MiB, so a batch is at most 32 MiB for every contender).
//! "×2 threads" runs the contender on two threads at once, each on its own batch and
//! destinations (the connector's two default workers), and counts the bytes of both.
//!
//! Under `cargo bench` it prints a table of GB/s and ratios to stderr after the criterion
//! runs. Its own timing interleaves the contenders: 7 rounds, each timing every contender for
//! about 0.2 s one after the other; a ratio is taken inside each round and the table gives
//! medians, so a machine shared with other work shifts both sides of a ratio alike.
//!
//! Run: `cargo bench --bench tier -- --warm-up-time 1 --measurement-time 2`

use std::hash::Hasher as _;
use std::hint::black_box;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvsched::connector::{CancelToken, KvConnector, LoadJob, LoadResult};
use kvsched::kv::{
    ChunkCodec, ChunkKey, DiskConfig, DiskTier, HostKvMemory, KvLayout, KvMemory, MemoryTier, Tier,
    TierConnector, TierConnectorConfig,
};
use kvsched::{BlockRef, CacheGroup};

const SIZES: [(usize, &str); 3] = [
    (16 << 10, "16KiB"),
    (256 << 10, "256KiB"),
    (2 << 20, "2MiB"),
];
const BLOCK_TOKENS: u64 = 16;

fn batch(payload: usize) -> usize {
    (32usize << 20).div_ceil(payload).min(64)
}

/// One tier holding one batch of chunks, a connector over it, and the chunks as values.
struct Loader {
    tier: Arc<dyn Tier>,
    conn: TierConnector,
    memory: Arc<HostKvMemory>,
    prompt: Vec<u32>,
    keys: Vec<ChunkKey>,
    payload: usize,
    /// Destination blocks of thread `t`: `1 + t * n ..`.
    n: usize,
    mac: Option<[u8; 32]>,
}

impl Loader {
    fn new(tier: Arc<dyn Tier>, payload: usize) -> Option<Loader> {
        Loader::with_mac(tier, payload, None)
    }

    /// A loader whose connector writes and checks a keyed BLAKE3 MAC on every chunk.
    fn with_mac(tier: Arc<dyn Tier>, payload: usize, mac: Option<[u8; 32]>) -> Option<Loader> {
        let n = batch(payload);
        let groups = vec![CacheGroup::full_attention(BLOCK_TOKENS)];
        let layout = KvLayout::for_groups(&groups, payload / BLOCK_TOKENS as usize, 8).ok()?;
        let memory = Arc::new(HostKvMemory::new(layout, 2 * n + 1).ok()?);
        let kv: Arc<dyn KvMemory> = memory.clone();
        let cfg = TierConnectorConfig::default()
            .with_groups(groups)
            .with_mac_key(mac)
            .with_probe_on_miss(false);
        let conn = TierConnector::new(Arc::clone(&tier), kv, cfg).ok()?;
        let prompt: Vec<u32> = (0..n as u32 * BLOCK_TOKENS as u32 + 1).collect();
        for i in 0..n {
            let p: Vec<u8> = (0..payload).map(|j| (i * 7 + j) as u8).collect();
            conn.store_now(&prompt, 0, i, &p).ok()?;
        }
        let keys = ChunkKey::chain_blocks(0, 0, BLOCK_TOKENS, &prompt, n);
        let l = Loader {
            tier,
            conn,
            memory,
            prompt,
            keys,
            payload,
            n,
            mac,
        };
        // Every destination page touched once, as a running engine's KV memory is.
        l.load_old(0);
        l.load_old(1);
        Some(l).filter(|l| l.load(0) == l.bytes())
    }

    fn bytes(&self) -> usize {
        self.n * self.payload
    }

    fn dest(&self, thread: usize, i: usize) -> u64 {
        (1 + thread * self.n + i) as u64
    }

    /// The load path: `TierConnector::load` of the whole batch.
    fn load(&self, thread: usize) -> usize {
        let table: Vec<BlockRef> = (0..self.n)
            .map(|i| BlockRef {
                id: self.dest(thread, i),
                generation: 1,
            })
            .collect();
        let end = self.n as u64 * BLOCK_TOKENS;
        let job = LoadJob::new("b", &self.prompt, 0, end, vec![table], vec![BLOCK_TOKENS]);
        match self.conn.load(&job) {
            LoadResult::Ok => self.bytes(),
            _ => 0,
        }
    }

    /// The old path: a fresh `Vec` per chunk from `get`, decode, copy into KV memory.
    fn load_old(&self, thread: usize) -> usize {
        let codec = ChunkCodec::new(self.mac);
        let got = self
            .tier
            .get(&self.keys, &CancelToken::new())
            .unwrap_or_default();
        let mut n = 0;
        for (i, (k, v)) in self.keys.iter().zip(got).enumerate() {
            let Some(v) = v else { continue };
            if let Ok(p) = codec.decode(&v, *k, 0, self.payload as u64) {
                if self.memory.write(0, self.dest(thread, i), 0, p).is_ok() {
                    n += p.len();
                }
            }
        }
        n
    }
}

/// The chunks of one size as values, with preallocated destinations (memcpy, the limit).
struct Copier {
    values: Vec<Vec<u8>>,
    dst: Vec<Vec<u8>>,
}

impl Copier {
    fn new(payload: usize) -> Copier {
        let codec = ChunkCodec::new(None);
        let values: Vec<Vec<u8>> = (0..batch(payload))
            .map(|i| codec.encode(ChunkKey(i as u128), 0, 16, &vec![i as u8; payload]))
            .collect();
        let dst = values.clone();
        Copier { values, dst }
    }

    fn run(&mut self) -> usize {
        let mut n = 0;
        for (v, d) in self.values.iter().zip(self.dst.iter_mut()) {
            d.copy_from_slice(v);
            n += black_box(&d[..]).len() - 48;
        }
        n
    }
}

/// `fs::read`'s work on the disk tier's own files, into one reused buffer.
fn fs_read_reused(paths: &[PathBuf], buf: &mut Vec<u8>) -> usize {
    let mut n = 0;
    for p in paths {
        buf.clear();
        if let Ok(mut f) = std::fs::File::open(p) {
            if f.read_to_end(buf).is_ok() {
                n += black_box(&buf[..]).len() - 48;
            }
        }
    }
    n
}

/// `fs::read`'s work into one reused buffer per file, as many as the connector's batch uses
/// (the same memory traffic as `get_into`'s: the buffers do not all stay in cache).
fn fs_read_reused_n(paths: &[PathBuf], bufs: &mut [Vec<u8>]) -> usize {
    let mut n = 0;
    for (p, buf) in paths.iter().zip(bufs.iter_mut()) {
        buf.clear();
        if let Ok(mut f) = std::fs::File::open(p) {
            if f.read_to_end(buf).is_ok() {
                n += black_box(&buf[..]).len() - 48;
            }
        }
    }
    n
}

/// The disk tier's `get_into` alone (into reused buffers), no decode.
fn disk_get_into(disk: &DiskTier, keys: &[ChunkKey], bufs: &mut [Vec<u8>]) -> usize {
    let mut held = vec![false; keys.len()];
    if disk
        .get_into(keys, &CancelToken::new(), bufs, &mut held)
        .is_err()
    {
        return 0;
    }
    bufs.iter().map(|b| b.len().saturating_sub(48)).sum()
}

/// The buffers of one piece of a disk load: as many chunks as fit in 512 KiB, at least one
/// (the connector reads a tier without a fixed cost per call, the disk tier, in such pieces).
fn piece_bufs(payload: usize) -> Vec<Vec<u8>> {
    vec![Vec::new(); ((512usize << 10) / (payload + 48)).max(1)]
}

/// The disk tier's `get_into` as a load reads it: a piece at a time into the same few reused
/// buffers, no decode.
fn disk_get_pieces(disk: &DiskTier, keys: &[ChunkKey], bufs: &mut [Vec<u8>]) -> usize {
    let mut held = vec![false; bufs.len()];
    let mut n = 0;
    for part in keys.chunks(bufs.len().max(1)) {
        let m = part.len();
        if disk
            .get_into(part, &CancelToken::new(), &mut bufs[..m], &mut held[..m])
            .is_err()
        {
            return 0;
        }
        n += bufs[..m]
            .iter()
            .map(|b| b.len().saturating_sub(48))
            .sum::<usize>();
    }
    n
}

fn memory_loader(payload: usize) -> Option<Loader> {
    Loader::new(Arc::new(MemoryTier::new(1 << 30, 16)), payload)
}

fn memory_loader_mac(payload: usize) -> Option<Loader> {
    Loader::with_mac(
        Arc::new(MemoryTier::new(1 << 30, 16)),
        payload,
        Some([0x28; 32]),
    )
}

fn disk_loader(payload: usize) -> Option<(Loader, Arc<DiskTier>, tempfile::TempDir)> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).ok()?;
    let disk = Arc::new(DiskTier::open(dir.path(), DiskConfig::default()).ok()?);
    let l = Loader::new(disk.clone(), payload)?;
    Some((l, disk, dir))
}

fn bench_load(c: &mut Criterion) {
    let mut group = c.benchmark_group("tier_load");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1));
    for (payload, name) in SIZES {
        let Some(m) = memory_loader(payload) else {
            continue;
        };
        group.throughput(Throughput::Bytes(m.bytes() as u64));
        let mut cp = Copier::new(payload);
        group.bench_function(BenchmarkId::new("memcpy", name), |b| b.iter(|| cp.run()));
        group.bench_function(BenchmarkId::new("memory_load", name), |b| {
            b.iter(|| m.load(0))
        });
        group.bench_function(BenchmarkId::new("memory_load_old", name), |b| {
            b.iter(|| m.load_old(0))
        });
        let Some((d, _, _dir)) = disk_loader(payload) else {
            continue;
        };
        group.bench_function(BenchmarkId::new("disk_load", name), |b| {
            b.iter(|| d.load(0))
        });
        group.bench_function(BenchmarkId::new("disk_load_old", name), |b| {
            b.iter(|| d.load_old(0))
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
    let value = codec.encode(ChunkKey(0), 0, 16, &vec![7u8; payload]);
    let mut i = 0u128;
    Some(move || {
        let _keep = &dir;
        i = (i + 1) % 64;
        let chunk = [(ChunkKey(i << 64), value.clone())];
        disk.put(&chunk).map(|()| chunk[0].1.len()).unwrap_or(0)
    })
}

fn bench_put(c: &mut Criterion) {
    let mut group = c.benchmark_group("tier_put");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1));
    for (payload, name) in SIZES.into_iter().take(2) {
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

/// A contender: runs one batch, returns the payload bytes it moved.
type Run<'a> = Box<dyn FnMut() -> usize + 'a>;

/// Bytes per second of each contender, per round: `rounds` rounds, each timing every
/// contender in turn for about `slice`.
fn rounds(contenders: &mut [Run<'_>], rounds: usize, slice: Duration) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::new(); contenders.len()];
    for _ in 0..rounds {
        for (c, o) in contenders.iter_mut().zip(out.iter_mut()) {
            let start = Instant::now();
            let mut bytes = 0usize;
            while start.elapsed() < slice {
                bytes += black_box(c());
            }
            o.push(bytes as f64 / start.elapsed().as_secs_f64());
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median over rounds of `a / b`.
fn ratio(a: &[f64], b: &[f64]) -> f64 {
    median(a.iter().zip(b).map(|(x, y)| x / y).collect())
}

/// Runs `f(0)` and `f(1)` on two threads at once; the bytes of both.
fn two<F: Fn(usize) -> usize + Sync>(f: &F) -> usize {
    std::thread::scope(|s| {
        let h = s.spawn(|| f(1));
        let a = f(0);
        a + h.join().unwrap_or(0)
    })
}

fn table_loads() {
    eprintln!("\nload bandwidth, GB/s (median of 7 interleaved rounds); ratios are medians of per-round ratios");
    eprintln!(
        "{:>7} {:>7} {:>8} {:>15} {:>8} {:>15} {:>7} {:>7} {:>20} {:>15} {:>8} {:>16}",
        "payload",
        "memcpy",
        "mem load",
        "(of memcpy/old)",
        "old load",
        "mem+MAC (of cp)",
        "fs_read",
        "fs×n",
        "get_into (of fs/×n)",
        "disk load (fs)",
        "old disk",
        "get pieces (fs)"
    );
    for (payload, name) in SIZES {
        let (Some(mem), Some(mac), Some((dl, disk, _dir))) = (
            memory_loader(payload),
            memory_loader_mac(payload),
            disk_loader(payload),
        ) else {
            continue;
        };
        let mut cp = Copier::new(payload);
        // The packs that hold the chunks, each read whole once: the same bytes (and the
        // packs' tables) from the page cache, in as many files as the disk tier wrote.
        let mut paths: Vec<PathBuf> = dl.keys.iter().filter_map(|&k| disk.pack_path(k)).collect();
        paths.sort();
        paths.dedup();
        let mut rbuf = Vec::new();
        let mut rbufs = vec![Vec::new(); dl.keys.len()];
        let mut gbufs = vec![Vec::new(); dl.keys.len()];
        let mut pbufs = piece_bufs(payload);
        let keys = dl.keys.clone();
        let r = {
            let mut cs: Vec<Run<'_>> = vec![
                Box::new(|| cp.run()),
                Box::new(|| mem.load(0)),
                Box::new(|| mem.load_old(0)),
                Box::new(|| mac.load(0)),
                Box::new(|| fs_read_reused(&paths, &mut rbuf)),
                Box::new(|| fs_read_reused_n(&paths, &mut rbufs)),
                Box::new(|| disk_get_into(&disk, &keys, &mut gbufs)),
                Box::new(|| dl.load(0)),
                Box::new(|| dl.load_old(0)),
                Box::new(|| disk_get_pieces(&disk, &keys, &mut pbufs)),
            ];
            rounds(&mut cs, 7, Duration::from_millis(200))
        };
        let g = |i: usize| median(r[i].clone()) / 1e9;
        eprintln!(
            "{name:>7} {:>7.2} {:>8.2} {:>7.2} / {:>5.2} {:>8.2} {:>7.2} ({:>5.2}) {:>7.2} {:>7.2} {:>7.2} ({:.2}/{:.2}) {:>6.2} ({:.2}) {:>8.2} {:>9.2} ({:.2})",
            g(0),
            g(1),
            ratio(&r[1], &r[0]),
            ratio(&r[1], &r[2]),
            g(2),
            g(3),
            ratio(&r[3], &r[0]),
            g(4),
            g(5),
            g(6),
            ratio(&r[6], &r[4]),
            ratio(&r[6], &r[5]),
            g(7),
            ratio(&r[7], &r[4]),
            g(8),
            g(9),
            ratio(&r[9], &r[4]),
        );
    }
    eprintln!("\n× 2 threads (each its own batch and destinations), GB/s of both");
    eprintln!(
        "{:>7} {:>7} {:>8} {:>15} {:>9}",
        "payload", "memcpy", "mem load", "(of memcpy/old)", "disk load"
    );
    for (payload, name) in SIZES {
        let (Some(mem), Some((dl, _, _dir))) = (memory_loader(payload), disk_loader(payload))
        else {
            continue;
        };
        let cps = [
            std::sync::Mutex::new(Copier::new(payload)),
            std::sync::Mutex::new(Copier::new(payload)),
        ];
        let copy = |t: usize| cps[t].lock().map(|mut c| c.run()).unwrap_or(0);
        let memn = |t: usize| mem.load(t);
        let memo = |t: usize| mem.load_old(t);
        let disk = |t: usize| dl.load(t);
        let r = {
            let mut cs: Vec<Run<'_>> = vec![
                Box::new(|| two(&copy)),
                Box::new(|| two(&memn)),
                Box::new(|| two(&memo)),
                Box::new(|| two(&disk)),
            ];
            rounds(&mut cs, 5, Duration::from_millis(200))
        };
        let g = |i: usize| median(r[i].clone()) / 1e9;
        eprintln!(
            "{name:>7} {:>7.2} {:>8.2} {:>7.2} / {:>5.2} {:>9.2}",
            g(0),
            g(1),
            ratio(&r[1], &r[0]),
            ratio(&r[1], &r[2]),
            g(3),
        );
    }
}

fn table_hashes() {
    eprintln!("\nchunk checks, GB/s (median of 7 interleaved rounds): xxh3-64 streamed as the codec does (always on), keyed BLAKE3 (with a MAC key)");
    eprintln!(
        "{:>7} {:>7} {:>8} {:>8} {:>12}",
        "payload", "memcpy", "xxh3", "blake3", "blake3 s/GB"
    );
    for (payload, name) in SIZES {
        let data = vec![0x5au8; payload];
        let mut dst = vec![0u8; payload];
        let key = [7u8; 32];
        let r = {
            let mut cs: Vec<Run<'_>> = vec![
                Box::new(|| {
                    dst.copy_from_slice(&data);
                    black_box(&dst).len()
                }),
                Box::new(|| {
                    // As the codec checksums: the header's 40 bytes, then the payload.
                    let mut h = twox_hash::xxhash3_64::RawHasher::new(
                        twox_hash::xxhash3_64::SecretBuffer::default(),
                    );
                    h.write(black_box(&data[..40]));
                    h.write(black_box(&data));
                    black_box(h.finish());
                    payload
                }),
                Box::new(|| {
                    black_box(blake3::keyed_hash(&key, black_box(&data)));
                    payload
                }),
            ];
            rounds(&mut cs, 7, Duration::from_millis(150))
        };
        let g = |i: usize| median(r[i].clone()) / 1e9;
        eprintln!(
            "{name:>7} {:>7.2} {:>8.2} {:>8.2} {:>12.3}",
            g(0),
            g(1),
            g(2),
            1.0 / g(2)
        );
    }
}

/// The tables, only under `cargo bench` (not `cargo test --benches`).
fn print_ratios(_: &mut Criterion) {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    table_loads();
    table_hashes();
    eprintln!("\ndisk put, µs per chunk (replacing one of 64 files)");
    for (payload, name) in SIZES.into_iter().take(2) {
        let (Some(plain), Some(synced)) = (disk_putter(payload, false), disk_putter(payload, true))
        else {
            continue;
        };
        let r = {
            let mut cs: Vec<Run<'_>> = vec![Box::new(plain), Box::new(synced)];
            rounds(&mut cs, 3, Duration::from_millis(300))
        };
        let us = |i: usize| (payload + 48) as f64 / median(r[i].clone()) * 1e6;
        eprintln!(
            "{name:>7}  no fsync {:>9.1}   fsync {:>9.1}   ({:.0}× the cost)",
            us(0),
            us(1),
            us(1) / us(0)
        );
    }
}

/// The chunk keys of a 2,048-token prompt in 16-token blocks (what a lookup derives for a
/// prompt it has not seen), and in 64-token blocks (a Mamba group's).
fn bench_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("chunk_keys");
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1));
    let prompt: Vec<u32> = (0..2048u32)
        .map(|t| t.wrapping_mul(2_654_435_761))
        .collect();
    for block in [16u64, 64] {
        group.bench_function(BenchmarkId::new("chain_blocks", block), |b| {
            b.iter(|| ChunkKey::chain_blocks(7, 0, block, black_box(&prompt), usize::MAX))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_load, bench_put, bench_keys, print_ratios);
criterion_main!(benches);
