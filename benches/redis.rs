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
//! move full values too.

use std::process::Command;
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::redis::{LocalRedis, LocalRedisOptions, RedisConfig, RedisTier};
use kvsched::kv::{ChunkKey, Tier};

const DEPTH: usize = 16;
const KEYS: usize = 512;
const ROUNDS: usize = 3;

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

struct Rate {
    chunks_per_s: f64,
}

fn rate(chunks: usize, took: Duration) -> Rate {
    Rate {
        chunks_per_s: chunks as f64 / took.as_secs_f64(),
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
    let start = Instant::now();
    for i in 0..calls {
        let at = (i * DEPTH) % KEYS;
        t.put(&data[at..at + DEPTH]).expect("put");
    }
    let put = rate(calls * DEPTH, start.elapsed());
    let start = Instant::now();
    let mut bytes = 0usize;
    for i in 0..calls {
        let at = (i * DEPTH) % KEYS;
        let got = t.get(&keys[at..at + DEPTH], &cancel).expect("get");
        bytes += got
            .iter()
            .map(|v| v.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
    }
    let get = rate(calls * DEPTH, start.elapsed());
    assert_eq!(bytes, calls * DEPTH * size, "every get hit a whole value");
    (put, get)
}

/// redis-benchmark's requests/s for SET and GET (from `--csv`).
fn redis_benchmark(port: u16, size: usize, total: usize) -> (f64, f64) {
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
    (rps("SET"), rps("GET"))
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
        "{:>6} {:>4} {:>12} {:>9} {:>16} {:>9} {:>6}",
        "size", "op", "tier chunk/s", "tier MB/s", "redis-bench rq/s", "rb MB/s", "ratio"
    );
    // Rounds alternate tier and redis-benchmark, and each column keeps its best round, so
    // load from other processes drifting during the run hits both sides alike.
    for (size, total) in [(16 << 10, 65_536), (64 << 10, 24_576)] {
        let mut best = [0f64; 4]; // tier put, tier get, rb set, rb get (per second)
        for _ in 0..ROUNDS {
            let (put, get) = tier_run(&t, size, total);
            let (set_rps, get_rps) = redis_benchmark(srv.port(), size, total);
            for (b, v) in
                best.iter_mut()
                    .zip([put.chunks_per_s, get.chunks_per_s, set_rps, get_rps])
            {
                *b = b.max(v);
            }
        }
        for (op, tier, rb) in [("put", best[0], best[2]), ("get", best[1], best[3])] {
            let mb = |per_s: f64| per_s * size as f64 / 1e6;
            println!(
                "{:>5}K {:>4} {:>12.0} {:>9.0} {:>16.0} {:>9.0} {:>6.2}",
                size >> 10,
                op,
                tier,
                mb(tier),
                rb,
                mb(rb),
                tier / rb
            );
        }
    }
}
