//! The Redis tier against real single-node servers, each test starting its own
//! `redis-server` on a free loopback port (stopped on drop, pass or fail). Without
//! `redis-server` on PATH the tests say so and pass, unless `CI` is set.

mod redis_common;

use std::process::Command;
use std::time::Duration;

use kvsched::connector::CancelToken;
use kvsched::kv::redis::{RedisConfig, RedisTier};
use kvsched::kv::{ChunkKey, Tier, TierError};
use kvsched_testkit::redis::{LocalRedis, LocalRedisOptions};
use redis_common::{certificates, chunks, eventually, info_field, missing};

const LIMIT: Duration = Duration::from_secs(20);

fn server(options: LocalRedisOptions) -> Option<LocalRedis> {
    if missing("redis-server") {
        return None;
    }
    Some(LocalRedis::start(options).expect("start redis-server"))
}

fn tier(cfg: RedisConfig) -> RedisTier {
    RedisTier::new(cfg).expect("tier")
}

fn values(chunks: &[(ChunkKey, Vec<u8>)]) -> Vec<Option<Vec<u8>>> {
    chunks.iter().map(|(_, v)| Some(v.clone())).collect()
}

#[test]
fn round_trip_one_pipeline_per_call() {
    let Some(srv) = server(LocalRedisOptions::new()) else {
        return;
    };
    let t = tier(RedisConfig::from_url(&srv.url()).unwrap().tag("model-a"));
    let cancel = CancelToken::new();
    let mut data = chunks(1, 20, 3000);
    data.push((ChunkKey(7), Vec::new())); // an empty value is a value
    data.push((ChunkKey(8), vec![0xab; 64 << 10]));
    let absent = ChunkKey(99);

    let before = t.counts().round_trips;
    t.put(&data).unwrap();
    let mut keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    keys.insert(3, absent);
    let mut want_exists = vec![true; data.len()];
    want_exists.insert(3, false);
    assert_eq!(t.exists(&keys, &cancel).unwrap(), want_exists);
    let mut want = values(&data);
    want.insert(3, None);
    assert_eq!(t.get(&keys, &cancel).unwrap(), want);
    // One node: put, exists and get are one round trip each, whatever the number of keys.
    assert_eq!(t.counts().round_trips - before, 3);

    // Replacing a value.
    t.put(&[(data[0].0, b"new".to_vec())]).unwrap();
    assert_eq!(
        t.get(&[data[0].0], &cancel).unwrap(),
        vec![Some(b"new".to_vec())]
    );

    // Another tag is another namespace.
    let other = tier(RedisConfig::from_url(&srv.url()).unwrap().tag("model-b"));
    assert_eq!(other.get(&keys[..2], &cancel).unwrap(), vec![None, None]);
    // The key layout, as the server sees it.
    let name = String::from_utf8(t.redis_key(data[1].0)).unwrap();
    assert_eq!(name, format!("kvsched:model-a:{}", data[1].0));
    assert_eq!(srv.query(&["STRLEN", &name]).unwrap(), "3000");
}

#[test]
fn a_key_deleted_between_exists_and_get_is_none() {
    let Some(srv) = server(LocalRedisOptions::new()) else {
        return;
    };
    let t = tier(RedisConfig::from_url(&srv.url()).unwrap());
    let cancel = CancelToken::new();
    let data = chunks(2, 3, 100);
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    t.put(&data).unwrap();
    assert_eq!(t.exists(&keys, &cancel).unwrap(), vec![true; 3]);
    let name = String::from_utf8(t.redis_key(keys[1])).unwrap();
    assert_eq!(srv.query(&["DEL", &name]).unwrap(), "1");
    let got = t.get(&keys, &cancel).unwrap();
    assert_eq!(
        got,
        vec![Some(data[0].1.clone()), None, Some(data[2].1.clone())]
    );
    // A non-string under a chunk key (someone else's) is not a chunk.
    assert_eq!(srv.query(&["LPUSH", &name, "x"]).unwrap(), "1");
    assert_eq!(t.get(&keys[1..2], &cancel).unwrap(), vec![None]);
}

#[test]
fn ttl_is_set_on_put() {
    let Some(srv) = server(LocalRedisOptions::new()) else {
        return;
    };
    let ttl = Duration::from_secs(300);
    let t = tier(RedisConfig::from_url(&srv.url()).unwrap().ttl(Some(ttl)));
    t.put(&chunks(3, 2, 10)).unwrap();
    let name = String::from_utf8(t.redis_key(chunks(3, 1, 10)[0].0)).unwrap();
    let pttl: u64 = srv.query(&["PTTL", &name]).unwrap().parse().unwrap();
    assert!(pttl > 0 && pttl <= 300_000, "{pttl}");
    let t = tier(RedisConfig::from_url(&srv.url()).unwrap());
    t.put(&chunks(4, 1, 10)).unwrap();
    let name = String::from_utf8(t.redis_key(chunks(4, 1, 10)[0].0)).unwrap();
    assert_eq!(srv.query(&["PTTL", &name]).unwrap(), "-1");
}

#[test]
fn restart_fails_fast_while_down_then_reconnects() {
    let Some(mut srv) = server(LocalRedisOptions::new()) else {
        return;
    };
    let t = tier(
        RedisConfig::from_url(&srv.url())
            .unwrap()
            .backoff(Duration::from_millis(20), Duration::from_millis(200))
            .io_timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(5)),
    );
    let cancel = CancelToken::new();
    let data = chunks(5, 8, 1000);
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    t.put(&data).unwrap();
    assert_eq!(t.get(&keys, &cancel).unwrap(), values(&data));

    srv.stop();
    // While down: every call fails as unavailable (refused, or backing off), none times out.
    for _ in 0..20 {
        match t.get(&keys, &cancel) {
            Err(TierError::Unavailable(msg)) => assert!(msg.contains(&srv.addr()), "{msg}"),
            other => panic!("while down: {other:?}"),
        }
        assert!(matches!(t.put(&data), Err(TierError::Unavailable(_))));
    }

    srv.restart().unwrap();
    // After the backoff the tier reconnects; the restarted server is empty.
    let got = eventually("reconnect after restart", LIMIT, || {
        t.get(&keys, &cancel).ok()
    });
    assert_eq!(got, vec![None; keys.len()]);
    t.put(&data).unwrap();
    assert_eq!(t.get(&keys, &cancel).unwrap(), values(&data));
}

#[test]
fn a_pooled_connection_made_stale_by_a_restart_is_replaced_without_failing() {
    let Some(mut srv) = server(LocalRedisOptions::new()) else {
        return;
    };
    let t = tier(RedisConfig::from_url(&srv.url()).unwrap().pool_size(1));
    let cancel = CancelToken::new();
    t.put(&chunks(6, 1, 10)).unwrap();
    srv.restart().unwrap();
    // The pooled connection was reset by the restart; no call in between saw the server
    // down, so the request is resent on a new connection and succeeds.
    let before = t.counts();
    assert_eq!(
        t.get(&[chunks(6, 1, 10)[0].0], &cancel).unwrap(),
        vec![None]
    );
    let after = t.counts();
    assert_eq!(after.connects - before.connects, 1);
    assert_eq!(after.connections, 1);
}

#[test]
fn during_backoff_a_call_fails_at_once_without_connecting() {
    let Some(srv) = server(LocalRedisOptions::new()) else {
        return;
    };
    let addr = srv.addr();
    drop(srv); // nothing listens there now
    let t = tier(
        RedisConfig::standalone(&addr)
            .unwrap()
            .backoff(Duration::from_secs(60), Duration::from_secs(60)),
    );
    let cancel = CancelToken::new();
    assert!(matches!(
        t.get(&[ChunkKey(1)], &cancel),
        Err(TierError::Unavailable(_))
    ));
    assert_eq!((t.counts().connects, t.counts().connect_failures), (1, 1));
    for _ in 0..5 {
        match t.exists(&[ChunkKey(1)], &cancel) {
            Err(TierError::Unavailable(msg)) => assert!(msg.contains("down"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        t.counts().connects,
        1,
        "no connection attempt during the backoff"
    );
}

#[test]
fn a_stopped_server_times_out_then_fails_fast() {
    let Some(srv) = server(LocalRedisOptions::new()) else {
        return;
    };
    let io = Duration::from_millis(300);
    let t = tier(
        RedisConfig::from_url(&srv.url())
            .unwrap()
            .io_timeout(io)
            .backoff(Duration::from_secs(60), Duration::from_secs(60)),
    );
    let cancel = CancelToken::new();
    t.put(&chunks(7, 1, 10)).unwrap();
    let pid = srv.pid().unwrap().to_string();
    let signal = |s: &str| {
        assert!(Command::new("kill")
            .args([s, &pid])
            .status()
            .unwrap()
            .success())
    };
    signal("-STOP");
    let r = t.get(&[ChunkKey(1)], &cancel);
    let r2 = t.get(&[ChunkKey(1)], &cancel);
    signal("-CONT");
    // The hung server costs one read timeout, then the node is down: no second wait.
    assert!(matches!(r, Err(TierError::Timeout(d)) if d == io), "{r:?}");
    assert!(
        matches!(&r2, Err(TierError::Unavailable(m)) if m.contains("down")),
        "{r2:?}"
    );
}

#[test]
fn the_pool_stays_bounded_under_concurrent_calls() {
    let Some(srv) = server(LocalRedisOptions::new()) else {
        return;
    };
    let t = std::sync::Arc::new(tier(
        RedisConfig::from_url(&srv.url())
            .unwrap()
            .pool_size(2)
            .checkout_timeout(Duration::from_secs(10)),
    ));
    let data = chunks(8, 16, 4096);
    t.put(&data).unwrap();
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let t = std::sync::Arc::clone(&t);
            let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
            let want = values(&data);
            std::thread::spawn(move || {
                let cancel = CancelToken::new();
                for _ in 0..50 {
                    assert_eq!(t.get(&keys, &cancel).unwrap(), want);
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let s = t.counts();
    assert!(s.connects <= 2 && s.connections <= 2, "{s:?}");
    let clients = info_field(
        &srv.query(&["INFO", "clients"]).unwrap(),
        "connected_clients",
    );
    // The tier's 2 connections and the query's own.
    assert!(clients.is_some_and(|c| c <= 3), "{clients:?}");
}

#[test]
fn acl_user_auth_and_a_wrong_password_refused_without_echo() {
    let password = "Tier-Secret-4711";
    let Some(srv) = server(LocalRedisOptions::new().acl_user("kvtier", password)) else {
        return;
    };
    let cancel = CancelToken::new();
    let url = format!("redis://kvtier:{password}@{}", srv.addr());
    let t = tier(RedisConfig::from_url(&url).unwrap());
    let data = chunks(9, 4, 256);
    t.put(&data).unwrap();
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    assert_eq!(t.get(&keys, &cancel).unwrap(), values(&data));
    let dbg = format!("{t:?}");
    assert!(!dbg.contains(password) && !dbg.contains("kvtier"), "{dbg}");

    let wrong = "Wrong-Guess-0815";
    let bad =
        tier(RedisConfig::from_url(&format!("redis://kvtier:{wrong}@{}", srv.addr())).unwrap());
    match bad.get(&keys, &cancel) {
        Err(TierError::Unavailable(msg)) => {
            assert!(
                msg.contains("WRONGPASS") || msg.to_lowercase().contains("auth"),
                "{msg}"
            );
            assert!(!msg.contains(wrong) && !msg.contains(password), "{msg}");
        }
        other => panic!("wrong password: {other:?}"),
    }
    // The default user is off: no credentials, no access.
    let anon = tier(RedisConfig::from_url(&srv.url()).unwrap());
    assert!(matches!(
        anon.get(&keys, &cancel),
        Err(TierError::Unavailable(_))
    ));

    // requirepass: the default user's password.
    let Some(srv2) = server(LocalRedisOptions::new().requirepass(password)) else {
        return;
    };
    let t2 = tier(RedisConfig::from_url(&format!("redis://:{password}@{}", srv2.addr())).unwrap());
    t2.put(&data).unwrap();
    assert_eq!(t2.get(&keys, &cancel).unwrap(), values(&data));
}

#[test]
fn tls_with_a_test_ca() {
    if missing("redis-server") || missing("openssl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(dir.path());
    let srv = LocalRedis::start(LocalRedisOptions::new().tls(&cert, &key)).unwrap();
    let url = srv.tls_url().unwrap();
    let cancel = CancelToken::new();
    let t = tier(RedisConfig::from_url(&url).unwrap().ca_cert(&ca));
    assert!(t.config().is_tls());
    let data = chunks(10, 5, 20_000);
    t.put(&data).unwrap();
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    assert_eq!(t.get(&keys, &cancel).unwrap(), values(&data));
    // The server saw them over TLS (same server, plain port).
    let name = String::from_utf8(t.redis_key(keys[0])).unwrap();
    assert_eq!(srv.query(&["STRLEN", &name]).unwrap(), "20000");

    // Without the test CA the certificate is not trusted.
    let untrusted = tier(RedisConfig::from_url(&url).unwrap());
    assert!(matches!(
        untrusted.get(&keys, &cancel),
        Err(TierError::Unavailable(_))
    ));
    // A CA file that is not PEM is refused when the tier is built.
    std::fs::write(dir.path().join("junk.pem"), "not a certificate").unwrap();
    assert!(RedisTier::new(
        RedisConfig::from_url(&url)
            .unwrap()
            .ca_cert(dir.path().join("junk.pem"))
    )
    .is_err());
}

#[test]
fn maxmemory_eviction_makes_keys_vanish() {
    let Some(srv) = server(LocalRedisOptions::new().maxmemory(2 << 20)) else {
        return;
    };
    let t = tier(RedisConfig::from_url(&srv.url()).unwrap());
    let cancel = CancelToken::new();
    // 96 × 64 KiB = 6 MiB into a 2 MiB server, 8 values per put.
    let data = chunks(11, 96, 64 << 10);
    for batch in data.chunks(8) {
        t.put(batch).unwrap();
    }
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    let got = t.get(&keys, &cancel).unwrap();
    let held = got.iter().filter(|v| v.is_some()).count();
    assert!(
        held > 0 && held < keys.len(),
        "{held} of {} held",
        keys.len()
    );
    for (g, (_, v)) in got.iter().zip(&data) {
        if let Some(g) = g {
            assert_eq!(g, v, "a held value is whole");
        }
    }
    // An evicted key stays gone (reads can evict more: their replies take memory too).
    let ex = t.exists(&keys, &cancel).unwrap();
    for (e, g) in ex.iter().zip(&got) {
        assert!(!e || g.is_some(), "an evicted key came back");
    }
    let evicted = info_field(&srv.query(&["INFO", "stats"]).unwrap(), "evicted_keys");
    assert!(evicted.is_some_and(|e| e > 0), "{evicted:?}");
}

/// The fault hooks act on the server: a flipped bit, a shorter value, a deleted key; a key
/// that is not there takes none of them.
#[test]
fn fault_hooks_damage_and_delete_on_the_server() {
    use kvsched_testkit::FaultTarget;
    let Some(srv) = server(LocalRedisOptions::new()) else {
        return;
    };
    let t = tier(RedisConfig::from_url(&srv.url()).unwrap().tag("faults"));
    let cancel = CancelToken::new();
    let data = chunks(3, 3, 1000);
    t.put(&data).unwrap();
    let get = |k: ChunkKey| t.get(&[k], &cancel).unwrap().remove(0);

    assert!(t.corrupt_stored(data[0].0, 0x1234_5678_9abc_def1).unwrap());
    let damaged = get(data[0].0).expect("still there");
    let diff: Vec<(usize, u8)> = damaged
        .iter()
        .zip(&data[0].1)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| (i, a ^ b))
        .collect();
    assert_eq!(diff.len(), 1, "one byte differs: {diff:?}");
    assert_eq!(diff[0].1.count_ones(), 1, "by one bit");
    assert_eq!(damaged.len(), data[0].1.len());

    assert!(t.truncate_stored(data[1].0, u64::MAX / 2).unwrap());
    let cut = get(data[1].0).expect("still there");
    assert!(cut.len() < data[1].1.len() && data[1].1.starts_with(&cut));

    assert!(t.remove(data[2].0).unwrap());
    assert_eq!(get(data[2].0), None);
    assert!(!t.remove(data[2].0).unwrap());
    let absent = ChunkKey(12345);
    assert!(!t.corrupt_stored(absent, 1).unwrap());
    assert!(!t.truncate_stored(absent, 1).unwrap());
    assert_eq!(get(absent), None, "a hook never creates a key");
}
