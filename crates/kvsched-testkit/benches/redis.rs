//! The Redis tier's `put` and `get` throughput (chunks/s, MB/s) for 16 KiB and 64 KiB values
//! against a local `redis-server` this bench starts, next to `redis-benchmark -t set,get` on
//! the same server in the same run with the same pipeline depth and client count, and the
//! ratio tier / redis-benchmark.
//!
//! ```text
//! cargo bench --features redis --bench redis
//! ```
//!
//! Each tier call carries `DEPTH` chunks (one pipeline of `DEPTH` SETs or GETs, one round
//! trip); redis-benchmark runs with `-P DEPTH`. One client thread against one connection, as
//! `redis-benchmark -c 1`. The keys cycle over a key space of `KEYS` chunks so the server's
//! memory stays bounded; redis-benchmark (no `-r`) reads back the value it set, so its GETs
//! move full values too. Rounds alternate the two; each rate is the best of its rounds (load
//! from other processes drifts). The last columns are client CPU time (user + system) per
//! chunk: the tier's process for each op, redis-benchmark's over its SETs and GETs together.

use std::process::Command;
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::redis::{RedisConfig, RedisTier};
use kvsched::kv::{ChunkKey, Tier};
use kvsched_testkit::redis::{LocalRedis, LocalRedisOptions};

const DEPTH: usize = 16;
const KEYS: usize = 512;
const ROUNDS: usize = 3;

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

struct Rate {
    chunks_per_s: f64,
    /// CPU time (user + system) of the client per chunk, in microseconds.
    cpu_us: f64,
}

/// CPU time (user + system) used so far by this process (`RUSAGE_SELF`) or by its reaped
/// children (`RUSAGE_CHILDREN`: redis-benchmark), in seconds.
fn cpu_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage writes one `rusage` into the zeroed struct we own; no other memory.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn rate(chunks: usize, took: Duration, cpu: f64) -> Rate {
    Rate {
        chunks_per_s: chunks as f64 / took.as_secs_f64(),
        cpu_us: cpu * 1e6 / chunks as f64,
    }
}

/// (put, get) through the tier: `total` chunks each, `DEPTH` per call.
fn tier_run(t: &RedisTier, size: usize, total: usize) -> (Rate, Rate) {
    let data: Vec<(ChunkKey, Vec<u8>)> = (0..KEYS)
        .map(|i| (ChunkKey(i as u128 + 1), vec![(i % 251) as u8; size]))
        .collect();
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    let cancel = CancelToken::new();
    let calls = total / DEPTH;
    // Warm up (connect, fill the key space).
    for b in data.chunks(DEPTH) {
        t.put(b).expect("put");
    }
    let (start, cpu) = (Instant::now(), cpu_seconds(libc::RUSAGE_SELF));
    for i in 0..calls {
        let at = (i * DEPTH) % KEYS;
        t.put(&data[at..at + DEPTH]).expect("put");
    }
    let put = rate(
        calls * DEPTH,
        start.elapsed(),
        cpu_seconds(libc::RUSAGE_SELF) - cpu,
    );
    let (start, cpu) = (Instant::now(), cpu_seconds(libc::RUSAGE_SELF));
    let mut bytes = 0usize;
    for i in 0..calls {
        let at = (i * DEPTH) % KEYS;
        let got = t.get(&keys[at..at + DEPTH], &cancel).expect("get");
        bytes += got
            .iter()
            .map(|v| v.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
    }
    let get = rate(
        calls * DEPTH,
        start.elapsed(),
        cpu_seconds(libc::RUSAGE_SELF) - cpu,
    );
    assert_eq!(bytes, calls * DEPTH * size, "every get hit a whole value");
    (put, get)
}

/// redis-benchmark's requests/s for SET and GET (from `--csv`), and its CPU time per request
/// over both, in microseconds.
fn redis_benchmark(port: u16, size: usize, total: usize) -> (f64, f64, f64) {
    let cpu = cpu_seconds(libc::RUSAGE_CHILDREN);
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            "set,get",
            "-c",
            "1",
        ])
        .args([
            "-d",
            &size.to_string(),
            "-P",
            &DEPTH.to_string(),
            "-n",
            &total.to_string(),
        ])
        .arg("--csv")
        .output()
        .expect("run redis-benchmark");
    assert!(
        out.status.success(),
        "redis-benchmark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = |test: &str| -> f64 {
        text.lines()
            .find_map(|l| {
                let mut f = l.split(',').map(|s| s.trim_matches('"'));
                (f.next()? == test).then(|| f.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no {test} row in redis-benchmark's CSV:\n{text}"))
    };
    let cpu_us = (cpu_seconds(libc::RUSAGE_CHILDREN) - cpu) * 1e6 / (2 * total) as f64;
    (rps("SET"), rps("GET"), cpu_us)
}

fn main() {
    if !on_path("redis-server") || !on_path("redis-benchmark") {
        println!("redis bench: redis-server or redis-benchmark not on PATH; not run");
        return;
    }
    let srv = LocalRedis::start(LocalRedisOptions::new()).expect("start redis-server");
    let t =
        RedisTier::new(RedisConfig::from_url(&srv.url()).expect("url").pool_size(1)).expect("tier");
    println!(
        "redis bench: 1 client, pipeline depth {DEPTH}, key space {KEYS}, best of {ROUNDS} rounds, port {}",
        srv.port()
    );
    println!(
        "{:>6} {:>4} {:>12} {:>9} {:>16} {:>9} {:>6} {:>11} {:>9}",
        "size",
        "op",
        "tier chunk/s",
        "tier MB/s",
        "redis-bench rq/s",
        "rb MB/s",
        "ratio",
        "tier cpu µs",
        "rb cpu µs"
    );
    // Rounds alternate tier and redis-benchmark, and each column keeps its best round, so
    // load from other processes drifting during the run hits both sides alike.
    for (size, total) in [(16 << 10, 65_536), (64 << 10, 24_576)] {
        let mut best = [0f64; 4]; // tier put, tier get, rb set, rb get (per second)
        let mut cpu = [f64::MAX; 3]; // µs per chunk: tier put, tier get, rb (set and get)
        for _ in 0..ROUNDS {
            let (put, get) = tier_run(&t, size, total);
            let (set_rps, get_rps, rb_cpu) = redis_benchmark(srv.port(), size, total);
            let rates = [put.chunks_per_s, get.chunks_per_s, set_rps, get_rps];
            for (b, v) in best.iter_mut().zip(rates) {
                *b = b.max(v);
            }
            for (c, v) in cpu.iter_mut().zip([put.cpu_us, get.cpu_us, rb_cpu]) {
                *c = c.min(v);
            }
        }
        let rows = [
            ("put", best[0], best[2], cpu[0]),
            ("get", best[1], best[3], cpu[1]),
        ];
        for (op, tier, rb, tier_cpu) in rows {
            let mb = |per_s: f64| per_s * size as f64 / 1e6;
            println!(
                "{:>5}K {:>4} {:>12.0} {:>9.0} {:>16.0} {:>9.0} {:>6.2} {:>11.1} {:>9.1}",
                size >> 10,
                op,
                tier,
                mb(tier),
                rb,
                mb(rb),
                tier / rb,
                tier_cpu,
                cpu[2]
            );
        }
    }
}
