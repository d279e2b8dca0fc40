//! A "Redis server" on 127.0.0.1 (threads in the test) that keeps values like a real one but
//! misbehaves in one way: a reply nobody asked for (with another's, or a moment later), a
//! reply of the wrong kind, a value far larger than any the caller stores, an error text
//! that forges log lines. RESP has no request ids, so a connection whose replies fell out of
//! step would answer each later command with an earlier one's reply — another key's value,
//! for ever. Each case checks that no call returns another key's value, that the tier
//! recovers on a new connection, and that the sign is counted. No redis-server needed.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::redis::{RedisConfig, RedisTier};
use kvsched::kv::{ChunkKey, Tier, TierError};
use kvsched_testkit::redis::resp::{bulk, read_command};

/// How the server misbehaves.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// The server's first `GET` is answered twice: its value, then `STRAY`.
    StrayWithFirstGet,
    /// The server's first `GET` is answered, then `STRAY` follows 30 ms later.
    StrayAfterFirstGet,
    /// The server's first `SET` is answered with a bulk string, not `+OK`.
    SetAnsweredBulk,
    /// Every `GET` answers a value of `BIG` bytes, whatever is stored.
    BigValues,
    /// Every `GET` answers an error whose text holds a newline, an escape and 60,000 more
    /// characters.
    ForgingErrors,
    /// `CLUSTER SLOTS` answers a map with no slot in it.
    NoSlots,
    /// The server's second `GET` is answered with `STRAY` first, then, 30 ms later (after
    /// the call could have returned with `STRAY` for its value), its own value: no bytes
    /// are left over when the call ends, and kinds match.
    StrayBeforeSecondGet,
    /// The server's first `ECHO` is answered `-LOADING` (a restarting server), then as
    /// `StrayBeforeSecondGet`.
    EchoLoadingOnce,
    /// The server's second `GET` is answered with `STRAY`, then its own reply is an error
    /// (`-TRYAGAIN`), then, 30 ms later, the `ECHO`'s: the error lands where the `ECHO`'s
    /// reply is due.
    StrayThenErrorForSecondGet,
    /// Every `ECHO` is answered `-ERR unsupported command` (a proxy), whose text does not
    /// name it.
    EchoUnsupported,
    /// A one-node cluster whose slot map is served at once the first time and after 10 s
    /// later; its second `GET` answers `+OK` after 1.5 s (a reply of the wrong kind), its
    /// third `MOVED` to itself.
    SlowRefreshes,
    /// Every command of the server's first five pipelines is answered `-LOADING` (a server
    /// loading its data), then as `StrayBeforeSecondGet`.
    LoadingAWhile,
}

const STRAY: &[u8] = b"a value nobody asked for";
const BIG: usize = 4 << 20;

/// Starts the server (every connection on its own thread, one store for all); returns its
/// address.
fn serve(fault: Fault) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let port = listener.local_addr().expect("addr").port();
    let slots_asked = Arc::new(AtomicUsize::new(0));
    let loading = Arc::new(AtomicUsize::new(if fault == Fault::LoadingAWhile {
        5
    } else {
        0
    }));
    let store: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>> = Arc::default();
    // The one-time faults happen once in the server's life, on whichever connection.
    let once = Arc::new(AtomicBool::new(true));
    let gets = Arc::new(AtomicUsize::new(0));
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let store = Arc::clone(&store);
            let once = Arc::clone(&once);
            let gets = Arc::clone(&gets);
            let slots_asked = Arc::clone(&slots_asked);
            let loading = Arc::clone(&loading);
            thread::spawn(move || {
                let Ok(mut w) = conn.try_clone() else { return };
                let mut r = BufReader::new(conn);
                let first = || once.swap(false, Ordering::SeqCst);
                while let Some(cmd) = read_command(&mut r) {
                    let name = cmd[0].to_ascii_uppercase();
                    if loading.load(Ordering::SeqCst) > 0 {
                        if name == b"ECHO" {
                            loading.fetch_sub(1, Ordering::SeqCst);
                        }
                        if w.write_all(b"-LOADING Redis is loading the dataset in memory\r\n")
                            .is_err()
                        {
                            return;
                        }
                        continue;
                    }
                    let reply: Vec<u8> = match (name.as_slice(), fault) {
                        (b"GET", Fault::SlowRefreshes) => match gets.fetch_add(1, Ordering::SeqCst)
                        {
                            1 => {
                                thread::sleep(Duration::from_millis(1500));
                                b"+OK\r\n".to_vec()
                            }
                            2 => format!("-MOVED 1 127.0.0.1:{port}\r\n").into_bytes(),
                            _ => b"$-1\r\n".to_vec(),
                        },
                        (b"GET", Fault::BigValues) => bulk(&vec![7; BIG]),
                        (b"GET", Fault::ForgingErrors) => format!(
                            "-ERR x\n[ERROR] forged line \x1b[31mred{}\r\n",
                            "y".repeat(60_000)
                        )
                        .into_bytes(),
                        (b"GET", Fault::StrayThenErrorForSecondGet)
                            if gets.fetch_add(1, Ordering::SeqCst) == 1 =>
                        {
                            let mut out = bulk(STRAY);
                            out.extend_from_slice(
                                b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
                            );
                            if w.write_all(&out).is_err() {
                                return;
                            }
                            thread::sleep(Duration::from_millis(30));
                            continue;
                        }
                        (
                            b"GET",
                            Fault::StrayBeforeSecondGet
                            | Fault::EchoLoadingOnce
                            | Fault::LoadingAWhile,
                        ) => {
                            let v = store.lock().unwrap().get(&cmd[1]).cloned();
                            let out = v.map_or(b"$-1\r\n".to_vec(), |v| bulk(&v));
                            if gets.fetch_add(1, Ordering::SeqCst) == 1 {
                                if w.write_all(&bulk(STRAY)).is_err() {
                                    return;
                                }
                                thread::sleep(Duration::from_millis(30));
                            }
                            out
                        }
                        (b"GET", _) => {
                            let v = store.lock().unwrap().get(&cmd[1]).cloned();
                            let mut out = v.map_or(b"$-1\r\n".to_vec(), |v| bulk(&v));
                            if matches!(fault, Fault::StrayWithFirstGet | Fault::StrayAfterFirstGet)
                                && first()
                            {
                                match fault {
                                    Fault::StrayWithFirstGet => out.extend(bulk(STRAY)),
                                    Fault::StrayAfterFirstGet => {
                                        let mut late = w.try_clone().expect("clone");
                                        thread::spawn(move || {
                                            thread::sleep(Duration::from_millis(30));
                                            let _ = late.write_all(&bulk(STRAY));
                                        });
                                    }
                                    _ => {}
                                }
                            }
                            out
                        }
                        (b"SET", _) => {
                            store.lock().unwrap().insert(cmd[1].clone(), cmd[2].clone());
                            if fault == Fault::SetAnsweredBulk && first() {
                                bulk(b"OK")
                            } else {
                                b"+OK\r\n".to_vec()
                            }
                        }
                        (b"EXISTS", _) => {
                            let n = i32::from(store.lock().unwrap().contains_key(&cmd[1]));
                            format!(":{n}\r\n").into_bytes()
                        }
                        (b"PING", _) => b"+PONG\r\n".to_vec(),
                        (b"ECHO", Fault::EchoLoadingOnce) if first() => {
                            b"-LOADING Redis is loading the dataset in memory\r\n".to_vec()
                        }
                        (b"ECHO", Fault::EchoUnsupported) => {
                            b"-ERR unsupported command\r\n".to_vec()
                        }
                        (b"ECHO", _) => bulk(&cmd[1]),
                        (b"CLUSTER", Fault::NoSlots) => b"*0\r\n".to_vec(),
                        (b"CLUSTER", Fault::SlowRefreshes) => {
                            if slots_asked.fetch_add(1, Ordering::SeqCst) > 0 {
                                thread::sleep(Duration::from_secs(10));
                            }
                            format!(
                                "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$2\r\nid\r\n"
                            )
                            .into_bytes()
                        }
                        _ => b"-ERR unknown command\r\n".to_vec(),
                    };
                    if w.write_all(&reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A tier on the server with one connection, so every call reuses the one before's.
fn tier(addr: &str) -> RedisTier {
    RedisTier::new(
        RedisConfig::standalone(addr)
            .expect("address")
            .pool_size(1)
            .io_timeout(Duration::from_secs(2))
            .backoff(Duration::from_millis(1), Duration::from_millis(1)),
    )
    .expect("tier")
}

fn value_of(k: u128) -> Vec<u8> {
    format!("the value of key {k}").into_bytes()
}

/// Stores keys 1..=n (through a server that behaves for `SET`).
fn store_keys(t: &RedisTier, n: u128) {
    let chunks: Vec<(ChunkKey, Vec<u8>)> = (1..=n).map(|k| (ChunkKey(k), value_of(k))).collect();
    t.put(&chunks).expect("put");
}

/// Gets keys 1..=n one call each, `pause` apart: no call returns another key's value (each
/// is its own or an error), and at most `failures` calls fail.
fn gets_are_never_anothers(t: &RedisTier, n: u128, pause: Duration, failures: usize) {
    let mut failed = 0;
    for k in 1..=n {
        thread::sleep(pause);
        match t.get(&[ChunkKey(k)], &CancelToken::new()) {
            Ok(v) => assert_eq!(
                v,
                vec![Some(value_of(k))],
                "key {k} answered with another's value: {:?}",
                v[0].as_deref().map(String::from_utf8_lossy)
            ),
            Err(_) => failed += 1,
        }
    }
    assert!(failed <= failures, "{failed} of {n} gets failed");
}

#[test]
fn a_reply_sent_with_another_is_never_taken_for_the_next_commands() {
    let t = tier(&serve(Fault::StrayWithFirstGet));
    store_keys(&t, 20);
    // The first get brings a stray with its reply: that call fails (which of the two is its
    // reply cannot be told) and its connection is dropped; every later call is answered on
    // a new one once the node's backoff (1 ms) is over.
    gets_are_never_anothers(&t, 20, Duration::from_millis(5), 1);
    let c = t.counts();
    assert_eq!(c.protocol_errors, 1, "{c:?}");
    assert_eq!(c.connects, 2, "{c:?}");
}

#[test]
fn a_reply_arriving_after_its_call_is_never_taken_for_the_next_commands() {
    let t = tier(&serve(Fault::StrayAfterFirstGet));
    store_keys(&t, 12);
    // The stray lands while the connection is idle in the pool: the next call finds it
    // before sending, drops that connection and goes on a new one. No call fails.
    gets_are_never_anothers(&t, 12, Duration::from_millis(60), 0);
    let c = t.counts();
    assert_eq!(c.protocol_errors, 1, "{c:?}");
    assert_eq!(c.connects, 2, "{c:?}");
}

#[test]
fn a_reply_of_the_wrong_kind_fails_the_call_names_the_node_and_drops_the_connection() {
    let addr = serve(Fault::SetAnsweredBulk);
    let t = tier(&addr);
    let e = t
        .put(&[(ChunkKey(1), value_of(1))])
        .expect_err("SET answered a bulk string")
        .to_string();
    assert!(e.contains(&addr), "{e}");
    assert!(e.contains("bulk string"), "{e}");
    let c = t.counts();
    assert_eq!(c.protocol_errors, 1, "{c:?}");
    assert_eq!(c.connections, 0, "{c:?}");
    // After the node's backoff, the next put goes on a new connection, answered right.
    let until = Instant::now() + Duration::from_secs(2);
    while t.put(&[(ChunkKey(2), value_of(2))]).is_err() {
        assert!(Instant::now() < until, "the node never came back");
        thread::sleep(Duration::from_millis(5));
    }
    gets_are_never_anothers(&t, 2, Duration::ZERO, 0);
}

#[test]
fn a_value_past_what_every_caller_stores_is_read_past_unkept_and_past_the_config_refused_unread() {
    let t = tier(&serve(Fault::BigValues));
    // No caller said: the config's bound (512 MiB) lets it through.
    let v = t.get(&[ChunkKey(1)], &CancelToken::new()).expect("get");
    assert_eq!(v[0].as_ref().map(Vec::len), Some(BIG));
    // A caller storing values up to 64 KiB: the 4 MiB value is read past without being kept,
    // and handed back empty (no chunk: it fails its checks); the connection stays, in step,
    // and the node up — the next call goes on the same connection at once.
    t.expect_values_up_to(64 << 10);
    for round in 1..=2 {
        let v = t.get(&[ChunkKey(1), ChunkKey(2)], &CancelToken::new());
        let v = v.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(v, vec![Some(Vec::new()), Some(Vec::new())], "round {round}");
        let c = t.counts();
        assert_eq!(
            (c.oversized_values, c.protocol_errors),
            (2 * round, 0),
            "{c:?}"
        );
        assert_eq!((c.connects, c.connections), (1, 1), "{c:?}");
    }
    // A second caller storing larger values raises the bound for both (the largest word).
    t.expect_values_up_to(BIG);
    t.expect_values_up_to(1024);
    let v = t.get(&[ChunkKey(1)], &CancelToken::new()).expect("get");
    assert_eq!(v[0].as_ref().map(Vec::len), Some(BIG));
    // Past the config's own bound a value is refused from its header, unread: the call
    // fails and the connection is dropped.
    let small = RedisTier::new(
        RedisConfig::standalone(&serve(Fault::BigValues))
            .expect("address")
            .pool_size(1)
            .max_value_bytes(1 << 20),
    )
    .expect("tier");
    let e = small.get(&[ChunkKey(1)], &CancelToken::new());
    assert!(matches!(e, Err(TierError::Unavailable(_))), "{e:?}");
    let c = small.counts();
    assert_eq!(
        (c.protocol_errors, c.oversized_values, c.connections),
        (1, 0, 0),
        "{c:?}"
    );
}

#[test]
fn a_servers_error_text_cannot_forge_lines_nor_fill_the_message() {
    let t = tier(&serve(Fault::ForgingErrors));
    let e = t
        .get(&[ChunkKey(1)], &CancelToken::new())
        .expect_err("an error reply")
        .to_string();
    assert!(!e.chars().any(char::is_control), "{e:?}");
    assert!(e.contains("ERR x\\n[ERROR] forged line"), "{e}");
    assert!(e.chars().count() < 400, "{} characters", e.chars().count());
}

#[test]
fn a_cluster_without_a_usable_slot_map_is_asked_again_only_after_a_backoff() {
    let addr = serve(Fault::NoSlots);
    let t = RedisTier::new(
        RedisConfig::from_url(&format!("redis://{addr}?cluster=yes"))
            .expect("url")
            .backoff(Duration::from_millis(200), Duration::from_secs(1)),
    )
    .expect("tier");
    let t0 = Instant::now();
    for _ in 0..20 {
        let e = t
            .get(&[ChunkKey(1)], &CancelToken::new())
            .expect_err("no map");
        assert!(e.to_string().contains("no slots assigned"), "{e}");
    }
    // Within the first backoff (200 ms) the map was asked for once, not once per call.
    if t0.elapsed() < Duration::from_millis(200) {
        assert_eq!(t.counts().slot_refreshes, 1, "{:?}", t.counts());
    }
    // After it, the next call asks again.
    thread::sleep(Duration::from_millis(250));
    assert!(t.get(&[ChunkKey(1)], &CancelToken::new()).is_err());
    assert_eq!(t.counts().slot_refreshes, 2, "{:?}", t.counts());
}

#[test]
fn a_stray_read_as_a_later_calls_reply_fails_that_call_and_never_returns_its_bytes() {
    let t = tier(&serve(Fault::StrayBeforeSecondGet));
    store_keys(&t, 12);
    // The second get reads the stray where its value was due, and nothing is left over
    // when it could return: only the pipeline's closing ECHO, whose reply comes after the
    // real value, shows the shift. That call fails; no call returns another's bytes.
    gets_are_never_anothers(&t, 12, Duration::from_millis(5), 1);
    let c = t.counts();
    assert_eq!(c.protocol_errors, 1, "{c:?}");
}

/// One `-LOADING` answer to the closing `ECHO` (a server still loading its data) fails that
/// call and does not turn the in-step check off: a stray read later as a value still fails
/// its call. (Any error reply to `ECHO` used to switch the check off for the tier's life,
/// silently. Plant `redis-echo-off-on-any-error`.)
#[test]
fn a_passing_error_in_the_echos_place_keeps_the_in_step_check() {
    let t = tier(&serve(Fault::EchoLoadingOnce));
    let chunks: Vec<(ChunkKey, Vec<u8>)> = (1..=12).map(|k| (ChunkKey(k), value_of(k))).collect();
    assert!(
        t.put(&chunks).is_err(),
        "LOADING where the ECHO's reply was due"
    );
    thread::sleep(Duration::from_millis(20)); // the node's backoff
    store_keys(&t, 12);
    gets_are_never_anothers(&t, 12, Duration::from_millis(5), 1);
    let c = t.counts();
    assert_eq!(c.protocol_errors, 2, "{c:?}");
}

/// A stray shifts the replies so that a data command's own error (`-TRYAGAIN`) lands where
/// the closing `ECHO`'s reply is due, the `ECHO`'s reply coming later: the error is no answer
/// to the `ECHO`, so the call fails and never returns the stray as a value. (An error in
/// that place was taken for the server's answer to `ECHO`, the replies for in step. Plant
/// `redis-echo-off-on-any-error`.)
#[test]
fn a_data_commands_error_shifted_into_the_echos_place_fails_the_call() {
    let t = tier(&serve(Fault::StrayThenErrorForSecondGet));
    store_keys(&t, 12);
    gets_are_never_anothers(&t, 12, Duration::from_millis(5), 1);
    let c = t.counts();
    assert_eq!(c.protocol_errors, 1, "{c:?}");
}

/// A proxy answering every `ECHO` with the same error, which does not name it: the first
/// calls fail (such an error may be a data command's shifted by a stray), then the node is
/// taken to refuse `ECHO` and served without it.
#[test]
fn a_proxy_answering_every_echo_with_an_error_is_served_without_it() {
    let t = tier(&serve(Fault::EchoUnsupported));
    let chunks: Vec<(ChunkKey, Vec<u8>)> = (1..=4).map(|k| (ChunkKey(k), value_of(k))).collect();
    let mut failed = 0;
    while t.put(&chunks).is_err() {
        failed += 1;
        assert!(failed <= 3, "still failing after {failed} calls");
        thread::sleep(Duration::from_millis(20)); // the node's backoff
    }
    assert_eq!(failed, 3);
    let got = t.get(&[ChunkKey(1)], &CancelToken::new()).expect("get");
    assert_eq!(got, vec![Some(value_of(1))]);
}

/// A call failing near its deadline (a reply of the wrong kind after 1.5 s of its 2 s)
/// while another call's slot-map refresh hangs (a node answering `CLUSTER SLOTS` after
/// 10 s) returns by its own deadline: it does not wait for the other's refresh, which runs
/// to that call's later deadline. (It waited on the refresh lock, returning after 3 s.)
#[test]
fn a_failing_call_does_not_wait_past_its_deadline_for_anothers_refresh() {
    let addr = serve(Fault::SlowRefreshes);
    let t = Arc::new(
        RedisTier::new(
            RedisConfig::from_url(&format!("redis://{addr}?cluster=yes"))
                .expect("url")
                .io_timeout(Duration::from_secs(2)),
        )
        .expect("tier"),
    );
    assert!(
        t.get(&[ChunkKey(3)], &CancelToken::new()).is_ok(),
        "the map learned"
    );
    let a = {
        let t = Arc::clone(&t);
        thread::spawn(move || {
            let t0 = Instant::now();
            let r = t.get(&[ChunkKey(1)], &CancelToken::new());
            (t0.elapsed(), r.is_err())
        })
    };
    thread::sleep(Duration::from_millis(1000));
    // Redirected to a node the map already names: its refresh asks, and hangs to its
    // deadline (3 s from the start of `a`).
    assert!(t.get(&[ChunkKey(2)], &CancelToken::new()).is_err());
    let (took, failed) = a.join().expect("call a");
    assert!(failed, "the wrong-kind reply fails call a");
    assert!(
        took < Duration::from_millis(2500),
        "call a (deadline 2 s) returned after {took:?}"
    );
}

/// A server answering everything `-LOADING` for five calls, `ECHO` included, then serving:
/// those calls fail, and the in-step check stays on after them (an error where the `ECHO`'s
/// reply is due counts toward taking the node to refuse `ECHO` only when the data commands
/// were answered), so a stray read later as a value still fails its call.
#[test]
fn a_server_loading_a_while_keeps_the_in_step_check() {
    let t = tier(&serve(Fault::LoadingAWhile));
    let chunks: Vec<(ChunkKey, Vec<u8>)> = (1..=12).map(|k| (ChunkKey(k), value_of(k))).collect();
    let mut failed = 0;
    while t.put(&chunks).is_err() {
        failed += 1;
        assert!(failed <= 5, "still failing after {failed} calls");
        thread::sleep(Duration::from_millis(20)); // the node's backoff
    }
    assert_eq!(failed, 5);
    gets_are_never_anothers(&t, 12, Duration::from_millis(5), 1);
}
