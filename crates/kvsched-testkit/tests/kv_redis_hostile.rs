//! A hostile "Redis server" on 127.0.0.1 (a thread in the test): replies that announce
//! terabytes, never end a line, push RESP3 frames, trickle one byte at a time or never come.
//! Each call ends by its deadline (or its cancel) as a counted tier error, with memory
//! bounded, and the connection is dropped. No redis-server needed.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::redis::{RedisConfig, RedisTier};
use kvsched::kv::{ChunkKey, Tier, TierError};

/// What the fake server sends after reading a request.
#[derive(Clone, Copy)]
enum Hostile {
    /// `$2^40` then endless bytes.
    HugeBulk,
    /// `*2^40` then endless `:1`.
    HugeArray,
    /// `+aaaa…` without CRLF, forever.
    EndlessLine,
    /// RESP3 push frames, forever.
    Push,
    /// A well-formed reply, one byte every 1.5 s.
    Trickle,
    /// Nothing, ever.
    Silent,
}

/// Starts the server; returns its address and the count of connections it saw closed.
fn serve(kind: Hostile) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let closed = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&closed);
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let seen = Arc::clone(&seen);
            thread::spawn(move || {
                let mut req = [0u8; 4096];
                let _ = conn.read(&mut req);
                let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
                let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
                let filler = vec![b'a'; 64 << 10];
                let ones = b":1\r\n".repeat(16 << 10);
                let push = b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nabc\r\n".repeat(1024);
                let sent = match kind {
                    Hostile::HugeBulk => conn.write_all(b"$1099511627776\r\n"),
                    Hostile::HugeArray => conn.write_all(b"*1099511627776\r\n"),
                    Hostile::EndlessLine => conn.write_all(b"+"),
                    _ => Ok(()),
                };
                let mut ok = sent.is_ok();
                let trickle = b"$5\r\nhello\r\n";
                let mut at = 0;
                let started = Instant::now();
                while ok && started.elapsed() < Duration::from_secs(30) {
                    ok = match kind {
                        Hostile::HugeBulk | Hostile::EndlessLine => conn.write_all(&filler).is_ok(),
                        Hostile::HugeArray => conn.write_all(&ones).is_ok(),
                        Hostile::Push => conn.write_all(&push).is_ok(),
                        Hostile::Trickle => {
                            let b = trickle[at % trickle.len()];
                            at += 1;
                            let ok = conn.write_all(&[b]).is_ok();
                            thread::sleep(Duration::from_millis(1500));
                            ok
                        }
                        Hostile::Silent => match conn.read(&mut req) {
                            Ok(0) => false,
                            Ok(_) => true,
                            Err(e) => matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ),
                        },
                    };
                }
                seen.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, closed)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn tier(addr: &str) -> RedisTier {
    RedisTier::new(
        RedisConfig::standalone(addr)
            .unwrap()
            .io_timeout(Duration::from_secs(2))
            .backoff(Duration::from_millis(1), Duration::from_millis(1)),
    )
    .unwrap()
}

fn keys(n: u128) -> Vec<ChunkKey> {
    (1..=n).map(ChunkKey).collect()
}

/// A `get` of 32 keys against `kind` ends within the deadline as a counted error, memory
/// bounded, and the server sees its connection closed.
fn ends_by_the_deadline(kind: Hostile, protocol: bool) {
    let (addr, closed) = serve(kind);
    let t = tier(&addr);
    let rss0 = rss_kib();
    let t0 = Instant::now();
    let r = t.get(&keys(32), &CancelToken::new());
    let took = t0.elapsed();
    assert!(r.is_err(), "a hostile reply was accepted");
    assert!(took < Duration::from_millis(2600), "took {took:?}");
    let s = t.counts();
    if protocol {
        assert!(matches!(r, Err(TierError::Unavailable(_))), "{r:?}");
        assert_eq!(s.protocol_errors, 1, "{s:?}");
    } else {
        assert!(matches!(r, Err(TierError::Timeout(_))), "{r:?}");
        assert_eq!(s.timeouts, 1, "{s:?}");
    }
    assert!(
        rss_kib().saturating_sub(rss0) < 256 << 10,
        "RSS grew past 256 MiB"
    );
    // The connection was dropped: the server sees it closed.
    let t1 = Instant::now();
    while closed.load(Ordering::SeqCst) == 0 {
        assert!(
            t1.elapsed() < Duration::from_secs(5),
            "connection not dropped"
        );
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.connections, 0, "{s:?}");
}

#[test]
fn a_bulk_string_announcing_a_terabyte_is_refused() {
    ends_by_the_deadline(Hostile::HugeBulk, true);
}

#[test]
fn an_array_announcing_a_trillion_values_is_refused() {
    ends_by_the_deadline(Hostile::HugeArray, true);
}

#[test]
fn a_line_without_crlf_is_refused() {
    ends_by_the_deadline(Hostile::EndlessLine, true);
}

#[test]
fn resp3_push_frames_are_refused() {
    ends_by_the_deadline(Hostile::Push, true);
}

#[test]
fn a_reply_trickled_one_byte_every_1_5_s_ends_by_the_call_deadline() {
    ends_by_the_deadline(Hostile::Trickle, false);
}

#[test]
fn a_server_that_never_answers_ends_the_whole_call_by_its_deadline() {
    ends_by_the_deadline(Hostile::Silent, false);
}

#[test]
fn a_cancel_ends_a_call_waiting_on_a_silent_server() {
    let (addr, _) = serve(Hostile::Silent);
    let t = RedisTier::new(
        RedisConfig::standalone(&addr)
            .unwrap()
            .io_timeout(Duration::from_secs(30)),
    )
    .unwrap();
    let cancel = CancelToken::new();
    let c = cancel.clone();
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        c.cancel();
    });
    let t0 = Instant::now();
    let r = t.get(&keys(32), &cancel);
    let took = t0.elapsed();
    canceller.join().unwrap();
    assert!(matches!(r, Err(TierError::Cancelled)), "{r:?}");
    assert!(took < Duration::from_millis(500), "took {took:?}");
    // A cancel is no failure of the node: the next call is not refused as "down".
    let r = t.exists(&keys(1), &{
        let c = CancelToken::new();
        c.cancel();
        c
    });
    assert!(matches!(r, Err(TierError::Cancelled)), "{r:?}");
}

#[test]
fn a_put_to_a_silent_server_ends_by_its_deadline() {
    let (addr, _) = serve(Hostile::Silent);
    let t = tier(&addr);
    let chunks: Vec<(ChunkKey, Vec<u8>)> =
        keys(32).into_iter().map(|k| (k, vec![7; 1000])).collect();
    let t0 = Instant::now();
    assert!(matches!(t.put(&chunks), Err(TierError::Timeout(_))));
    assert!(
        t0.elapsed() < Duration::from_millis(2600),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn a_user_name_is_not_redacted_out_of_other_words() {
    // Port 1 on loopback refuses: the error is the system's text, untouched.
    let t = RedisTier::new(RedisConfig::from_url("redis://u:e@127.0.0.1:1").unwrap()).unwrap();
    let e = t
        .get(&keys(1), &CancelToken::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("refused"), "{e}");
    assert!(!e.contains("***"), "{e}");
}

/// A healthy server whose handshake takes `auth_delay` (an `AUTH` over a slow link): `AUTH`
/// answered after it, `GET` nil, `EXISTS` 0, `SET` OK, `ECHO` echoed. Returns its address.
fn slow_auth_server(auth_delay: Duration) -> String {
    use std::io::{BufRead, BufReader};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            thread::spawn(move || {
                let Ok(mut out) = conn.try_clone() else {
                    return;
                };
                let mut r = BufReader::new(conn);
                let mut line = String::new();
                let mut read_line = |r: &mut BufReader<_>| {
                    line.clear();
                    match r.read_line(&mut line) {
                        Ok(n) if n > 0 => Some(line.trim()[1..].parse::<usize>().unwrap_or(0)),
                        _ => None,
                    }
                };
                while let Some(n) = read_line(&mut r) {
                    let mut args: Vec<Vec<u8>> = Vec::new();
                    for _ in 0..n {
                        let Some(len) = read_line(&mut r) else { return };
                        let mut b = vec![0u8; len + 2];
                        if r.read_exact(&mut b).is_err() {
                            return;
                        }
                        b.truncate(len);
                        args.push(b);
                    }
                    let cmd = args
                        .first()
                        .map(|a| a.to_ascii_uppercase())
                        .unwrap_or_default();
                    let reply: Vec<u8> = match cmd.as_slice() {
                        b"AUTH" => {
                            thread::sleep(auth_delay);
                            b"+OK\r\n".to_vec()
                        }
                        b"GET" => b"$-1\r\n".to_vec(),
                        b"EXISTS" => b":0\r\n".to_vec(),
                        b"SET" | b"SELECT" => b"+OK\r\n".to_vec(),
                        b"ECHO" if args.len() == 2 => {
                            let mut v = format!("${}\r\n", args[1].len()).into_bytes();
                            v.extend_from_slice(&args[1]);
                            v.extend_from_slice(b"\r\n");
                            v
                        }
                        _ => b"-ERR unknown\r\n".to_vec(),
                    };
                    if out.write_all(&reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A caller that gives up while its call is still connecting (its token fires during a slow
/// handshake, as a load's deadline fires its get's) does not mark the node down: the next
/// call, with time to spare, connects and succeeds.
#[test]
fn a_call_cancelled_while_connecting_leaves_a_healthy_node_up() {
    let addr = slow_auth_server(Duration::from_millis(150));
    let t = RedisTier::new(
        RedisConfig::standalone(&addr)
            .unwrap()
            .credentials(None, "pw")
            .io_timeout(Duration::from_secs(5)),
    )
    .unwrap();
    let cancel = CancelToken::new();
    let c = cancel.clone();
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(30));
        c.cancel();
    });
    let r = t.get(&keys(1), &cancel);
    canceller.join().unwrap();
    assert!(matches!(r, Err(TierError::Cancelled)), "{r:?}");
    let put = t.put(&[(ChunkKey(2), vec![2u8; 64])]);
    assert!(put.is_ok(), "after a cancelled connect: {put:?}");
}

/// A cluster node answering `CLUSTER SLOTS` with 10,000 ranges each of every slot (a
/// reply of 0.45 MB, within the control reply's limits): the map is refused at once as
/// overlapping, the call failing by its deadline, not after a write per slot per range.
#[test]
fn a_slot_map_of_overlapping_ranges_is_refused_by_the_deadline() {
    use kvsched_testkit::redis::resp::{bulk, read_command};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            thread::spawn(move || {
                let Ok(mut w) = conn.try_clone() else { return };
                let mut r = std::io::BufReader::new(conn);
                while let Some(cmd) = read_command(&mut r) {
                    let reply = match cmd[0].to_ascii_uppercase().as_slice() {
                        b"ECHO" => bulk(&cmd[1]),
                        b"CLUSTER" => {
                            let range = format!(
                                "*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:{port}\r\n"
                            );
                            let mut s = b"*10000\r\n".to_vec();
                            s.extend_from_slice(range.repeat(10_000).as_bytes());
                            s
                        }
                        _ => b"$-1\r\n".to_vec(),
                    };
                    if w.write_all(&reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let io = Duration::from_millis(300);
    let t = RedisTier::new(
        RedisConfig::from_url(&format!("redis://127.0.0.1:{port}?cluster=yes"))
            .unwrap()
            .io_timeout(io),
    )
    .unwrap();
    let t0 = Instant::now();
    let r = t.get(&keys(1), &CancelToken::new());
    let took = t0.elapsed();
    assert!(took < 3 * io, "took {took:?} ({r:?})");
    assert!(
        matches!(&r, Err(TierError::Unavailable(e)) if e.contains("overlap")),
        "{r:?}"
    );
}
