//! The Redis tier against a real Redis Cluster (`redis-cli --cluster create`: 3 primaries,
//! with replicas for the failover test) that each test starts for itself on free loopback
//! ports and stops on drop. Without `redis-server`/`redis-cli` on PATH the tests say so and
//! pass, unless `CI` is set.

mod redis_common;

use std::time::Duration;

use kvsched::connector::CancelToken;
use kvsched::kv::redis::{RedisConfig, RedisTier};
use kvsched::kv::{ChunkKey, Tier, TierError};
use kvsched_testkit::redis::{LocalCluster, LocalRedisOptions};
use redis_common::{chunks, eventually, info_field, missing};

fn cluster() -> Option<LocalCluster> {
    if missing("redis-server") || missing("redis-cli") {
        return None;
    }
    Some(LocalCluster::start(3).expect("start a 3-node cluster"))
}

fn name(t: &RedisTier, k: ChunkKey) -> String {
    String::from_utf8(t.redis_key(k)).unwrap()
}

#[test]
fn a_load_spans_all_nodes_with_one_pipeline_per_node() {
    let Some(c) = cluster() else { return };
    // One seed is enough: the tier learns the other nodes from CLUSTER SLOTS.
    let t = RedisTier::new(RedisConfig::cluster(&c.seeds()[..1]).unwrap().tag("m")).unwrap();
    assert!(t.config().is_cluster());
    let cancel = CancelToken::new();
    let data = chunks(20, 48, 16 << 10);
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    t.put(&data).unwrap();

    // The keys landed on every node, each exactly once.
    let per_node: Vec<u64> = c
        .nodes()
        .iter()
        .map(|n| n.query(&["DBSIZE"]).unwrap().parse().unwrap())
        .collect();
    assert!(per_node.iter().all(|&k| k > 0), "{per_node:?}");
    assert_eq!(per_node.iter().sum::<u64>(), keys.len() as u64);

    for n in c.nodes() {
        n.query(&["CONFIG", "RESETSTAT"]).unwrap();
    }
    let before = t.counts();
    let got = t.get(&keys, &cancel).unwrap();
    let after = t.counts();
    assert_eq!(
        got,
        data.iter()
            .map(|(_, v)| Some(v.clone()))
            .collect::<Vec<_>>()
    );
    // One round trip per node, no redirects, no refresh (the map was loaded by the put).
    assert_eq!(after.round_trips - before.round_trips, 3);
    assert_eq!(after.redirects, before.redirects);
    assert_eq!(after.slot_refreshes, before.slot_refreshes);
    // Each node served a GET for each of its keys and nothing else of ours.
    for (n, &k) in c.nodes().iter().zip(&per_node) {
        let stats = n.query(&["INFO", "commandstats"]).unwrap();
        let gets = stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_get:calls="))
            .and_then(|r| r.split(',').next())
            .and_then(|v| v.parse::<u64>().ok());
        assert_eq!(gets, Some(k), "{}: {stats}", n.addr());
        assert_eq!(info_field(&stats, "cmdstat_mget"), None);
    }

    let before = t.counts().round_trips;
    let mut probe = keys.clone();
    probe.push(ChunkKey(12345));
    let mut want = vec![true; keys.len()];
    want.push(false);
    assert_eq!(t.exists(&probe, &cancel).unwrap(), want);
    assert!(t.counts().round_trips - before <= 3);

    // A cancelled token stops the call before the first node's pipeline.
    let fired = CancelToken::new();
    fired.cancel();
    let before = t.counts().round_trips;
    assert!(matches!(t.get(&keys, &fired), Err(TierError::Cancelled)));
    assert_eq!(t.counts().round_trips, before);
}

/// The node (index) that owns `key`'s slot: the one that answers `EXISTS` without a redirect.
fn owner(c: &LocalCluster, key: &str) -> usize {
    let owners: Vec<usize> = (0..c.nodes().len())
        .filter(|&i| c.nodes()[i].query(&["EXISTS", key]).is_ok())
        .collect();
    assert_eq!(owners.len(), 1, "{key}: owners {owners:?}");
    owners[0]
}

#[test]
fn ask_during_a_slot_migration_and_moved_after_it() {
    let Some(c) = cluster() else { return };
    let t = RedisTier::new(RedisConfig::from_url(&c.url()).unwrap()).unwrap();
    let cancel = CancelToken::new();
    let data = chunks(21, 1, 1000);
    let key = data[0].0;
    t.put(&data).unwrap();
    let k = name(&t, key);
    let slot = c.nodes()[0].query(&["CLUSTER", "KEYSLOT", &k]).unwrap();
    let src = owner(&c, &k);
    let dst = (src + 1) % 3;
    let id = |i: usize| c.nodes()[i].query(&["CLUSTER", "MYID"]).unwrap();
    let (src_id, dst_id) = (id(src), id(dst));
    let (s, d) = (&c.nodes()[src], &c.nodes()[dst]);
    d.query(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id])
        .unwrap();
    s.query(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id])
        .unwrap();
    let port = d.port().to_string();
    s.query(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &k])
        .unwrap();

    // Mid-migration: the source answers ASK, the tier asks the importing node.
    let before = t.counts();
    assert_eq!(
        t.get(&[key], &cancel).unwrap(),
        vec![Some(data[0].1.clone())]
    );
    let mid = t.counts();
    assert_eq!(mid.redirects - before.redirects, 1);
    assert_eq!(
        mid.slot_refreshes, before.slot_refreshes,
        "ASK does not reload the map"
    );

    // Migration done (every node told): the old owner answers MOVED; the map is reloaded.
    for n in c.nodes() {
        n.query(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id])
            .unwrap();
    }
    assert_eq!(
        t.get(&[key], &cancel).unwrap(),
        vec![Some(data[0].1.clone())]
    );
    let after = t.counts();
    assert_eq!(after.redirects - mid.redirects, 1);
    assert_eq!(after.slot_refreshes - mid.slot_refreshes, 1);
    // With the new map: straight to the new owner.
    assert_eq!(t.exists(&[key], &cancel).unwrap(), vec![true]);
    assert_eq!(t.counts().redirects, after.redirects);
    assert_eq!(owner(&c, &k), dst);
}

#[test]
fn a_cluster_node_restart_fails_calls_fast_and_they_recover() {
    let Some(mut c) = cluster() else { return };
    let t = RedisTier::new(
        RedisConfig::from_url(&c.url())
            .unwrap()
            .backoff(Duration::from_millis(20), Duration::from_millis(200)),
    )
    .unwrap();
    let cancel = CancelToken::new();
    let data = chunks(22, 30, 1000);
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    t.put(&data).unwrap();
    let node = c.node_mut(1).unwrap();
    node.stop();
    // A load that touches the stopped node fails as a whole, as unavailable.
    for _ in 0..5 {
        assert!(matches!(
            t.get(&keys, &cancel),
            Err(TierError::Unavailable(_))
        ));
    }
    node.restart().unwrap();
    // The node rejoins with its slots (nodes.conf) and no data: its keys read as None.
    let got = eventually("cluster recovers", Duration::from_secs(30), || {
        t.get(&keys, &cancel).ok()
    });
    let held = got.iter().filter(|v| v.is_some()).count();
    assert!(held > 0 && held < keys.len(), "{held}");
    for (g, (_, v)) in got.iter().zip(&data) {
        if let Some(g) = g {
            assert_eq!(g, v);
        }
    }
}

/// Keys and their values.
type Chunks = Vec<(ChunkKey, Vec<u8>)>;

/// 3 primaries with a replica each, failing over after 1 s (`cluster-node-timeout`), node 0
/// a primary; a tier on it (short node backoff) holding `chunks(seed, 30, 1000)`, every value
/// replicated. `None` without `redis-server`/`redis-cli`.
fn replicated(seed: u64) -> Option<(LocalCluster, RedisTier, Chunks)> {
    if missing("redis-server") || missing("redis-cli") {
        return None;
    }
    let c = LocalCluster::start_with_replicas(3, 1, LocalRedisOptions::new())
        .expect("start 3 primaries with a replica each");
    for n in c.nodes() {
        n.query(&["CONFIG", "SET", "cluster-node-timeout", "1000"])
            .unwrap();
    }
    let role = c.nodes()[0].query(&["ROLE"]).unwrap();
    assert!(role.starts_with("master"), "node 0 is a primary: {role}");
    let t = RedisTier::new(
        RedisConfig::from_url(&c.url())
            .unwrap()
            .backoff(Duration::from_millis(20), Duration::from_millis(200)),
    )
    .unwrap();
    let data = chunks(seed, 30, 1000);
    t.put(&data).unwrap();
    eventually("replicated", Duration::from_secs(10), || {
        let held: u64 = c.nodes()[3..]
            .iter()
            .map(|n| n.query(&["DBSIZE"]).unwrap().parse::<u64>().unwrap())
            .sum();
        (held == data.len() as u64).then_some(())
    });
    Some((c, t, data))
}

/// Runs `f` with node `i`'s process stopped (`SIGSTOP`: it accepts connections, answers
/// nothing), continued afterwards even when `f` panics.
fn while_hung<T>(c: &LocalCluster, i: usize, f: impl FnOnce() -> T) -> T {
    signal(c, i, "-STOP");
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    signal(c, i, "-CONT");
    out.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// A primary killed for good, its replica promoted (`cluster-node-timeout` 1 s): the tier
/// follows the failover — a call failing on the dead node refreshes the slot map, and its
/// keys go to the new owner — without the dead node coming back. (It used to re-read the map
/// only on a `MOVED`, which a dead node never sends: every call touching its slots failed
/// until it restarted. Plant `cluster-no-refresh-on-node-failure`.)
#[test]
fn a_failover_to_a_replica_is_followed_without_the_dead_node_coming_back() {
    let Some((mut c, t, data)) = replicated(23) else {
        return;
    };
    let cancel = CancelToken::new();
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    assert!(
        keys.iter().any(|&k| owner(&c, &name(&t, k)) == 0),
        "some keys live on node 0"
    );
    c.node_mut(0).unwrap().stop();
    let got = eventually(
        "the tier follows the failover",
        Duration::from_secs(30),
        || t.get(&keys, &cancel).ok(),
    );
    for (g, (_, v)) in got.iter().zip(&data) {
        assert_eq!(
            g.as_ref(),
            Some(v),
            "every value, from the promoted replica too"
        );
    }
    assert!(t.counts().slot_refreshes > 1, "{:?}", t.counts());
    assert!(
        !c.node_mut(0).unwrap().is_running(),
        "the dead node stayed dead"
    );
}

/// Sends `signal` (`-STOP`, `-CONT`) to node `i`'s process.
fn signal(c: &LocalCluster, i: usize, signal: &str) {
    let pid = c.nodes()[i].pid().expect("a running node");
    let ok = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {signal} {pid}");
}

/// The first seed hung (`SIGSTOP`: it accepts connections, answers nothing): a tier learns
/// the slot map from the other seeds within its calls' time, and serves the keys the hung
/// node does not own. (A refresh used to give its whole time to the first node it asked,
/// the hung one, every time. Plant `cluster-refresh-asks-in-order`.)
#[test]
fn a_hung_first_seed_does_not_keep_the_slot_map_from_the_others() {
    let Some(c) = cluster() else { return };
    let t = RedisTier::new(RedisConfig::from_url(&c.url()).unwrap()).unwrap();
    let data = chunks(24, 30, 1000);
    t.put(&data).unwrap();
    let elsewhere: Vec<(ChunkKey, Vec<u8>)> = data
        .iter()
        .filter(|(k, _)| owner(&c, &name(&t, *k)) != 0)
        .cloned()
        .collect();
    assert!(!elsewhere.is_empty());
    let keys: Vec<ChunkKey> = elsewhere.iter().map(|c| c.0).collect();
    let cancel = CancelToken::new();
    let got = while_hung(&c, 0, || {
        // A new tier, its map unknown: every refresh asks the hung seed first.
        let fresh = RedisTier::new(RedisConfig::from_url(&c.url()).unwrap()).unwrap();
        eventually("served past the hung seed", Duration::from_secs(20), || {
            fresh.get(&keys, &cancel).ok()
        })
    });
    for (g, (_, v)) in got.iter().zip(&elsewhere) {
        assert_eq!(g.as_ref(), Some(v));
    }
}

/// A primary hung (`SIGSTOP`: it accepts connections, answers nothing), its replica
/// promoted: the tier follows the failover. A call timing out on the hung node has no time
/// left to ask for the map; a later one, failing at once on the node now down, has, and
/// asks. (The refresh used to run on the timed-out call's spent time: it failed, marked the
/// healthy nodes it asked down, and held off every later refresh.)
#[test]
fn a_failover_away_from_a_hung_primary_is_followed() {
    let Some((c, t, data)) = replicated(25) else {
        return;
    };
    let cancel = CancelToken::new();
    let keys: Vec<ChunkKey> = data.iter().map(|c| c.0).collect();
    let got = while_hung(&c, 0, || {
        eventually(
            "the tier follows the failover",
            Duration::from_secs(40),
            || t.get(&keys, &cancel).ok(),
        )
    });
    for (g, (_, v)) in got.iter().zip(&data) {
        assert_eq!(g.as_ref(), Some(v));
    }
}

/// A node hung, no failover: a call timing out on it leaves the healthy nodes alone, so
/// every later call of keys they own succeeds. (The refresh that followed the timeout ran
/// on the call's spent time and marked each healthy node it asked down.)
#[test]
fn a_call_timing_out_on_a_hung_node_marks_no_healthy_node_down() {
    let Some(c) = cluster() else { return };
    let t = RedisTier::new(
        RedisConfig::from_url(&c.url())
            .unwrap()
            .io_timeout(Duration::from_millis(500)),
    )
    .unwrap();
    let data = chunks(26, 30, 1000);
    t.put(&data).unwrap();
    let (on_hung, elsewhere): (Vec<_>, Vec<_>) = data
        .iter()
        .cloned()
        .partition(|(k, _)| owner(&c, &name(&t, *k)) == 0);
    assert!(!on_hung.is_empty() && !elsewhere.is_empty());
    let cancel = CancelToken::new();
    let failed = while_hung(&c, 0, || {
        let hung: Vec<ChunkKey> = on_hung.iter().map(|c| c.0).collect();
        assert!(t.get(&hung, &cancel).is_err(), "the hung node answered");
        let mut failed = Vec::new();
        for (k, v) in &elsewhere {
            match t.get(&[*k], &cancel) {
                Ok(got) => assert_eq!(got, vec![Some(v.clone())]),
                Err(e) => failed.push(e.to_string()),
            }
        }
        failed
    });
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        elsewhere.len()
    );
}
