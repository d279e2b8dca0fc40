//! A TLS server trickling its bytes, one every 5 ms, each arriving well within the 20 ms a
//! socket read waits before the call's deadline is looked at again: in the handshake (a fake
//! server, after the client's hello), and in a reply (a real `redis-server` behind a proxy
//! that slows its answers once the connection is made). The TLS library reads on until a
//! whole record has come (16 KiB at most: 80 s at this pace), so each call must look at its
//! deadline between the socket reads, not only between the library's reads. Each call ends
//! by its deadline, a timeout.

mod redis_common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use kvsched::connector::CancelToken;
use kvsched::kv::redis::{RedisConfig, RedisTier};
use kvsched::kv::{Tier, TierError};
use kvsched_testkit::redis::{LocalRedis, LocalRedisOptions};
use redis_common::{certificates, chunks, missing};

/// One byte every this long.
const PACE: Duration = Duration::from_millis(5);
/// How long a server trickles before it closes the connection (a call still reading then
/// took this long: past every bound below).
const TRICKLE_FOR: Duration = Duration::from_secs(5);
/// The calls' deadline.
const IO: Duration = Duration::from_millis(400);

/// Writes `bytes` one at a time at [`PACE`] until [`TRICKLE_FOR`] passes, then closes.
fn trickle(to: &mut TcpStream, bytes: impl Iterator<Item = u8>) {
    let t0 = Instant::now();
    for b in bytes {
        if t0.elapsed() > TRICKLE_FOR || to.write_all(&[b]).is_err() {
            break;
        }
        thread::sleep(PACE);
    }
    let _ = to.shutdown(Shutdown::Both);
}

fn ends_by_its_deadline<T: std::fmt::Debug>(
    what: &str,
    call: impl FnOnce() -> Result<T, TierError>,
) {
    let t0 = Instant::now();
    let r = call();
    let took = t0.elapsed();
    assert!(took < 3 * IO, "{what}: took {took:?} ({r:?})");
    assert!(matches!(r, Err(TierError::Timeout(_))), "{what}: {r:?}");
}

#[test]
fn a_handshake_trickled_a_byte_at_a_time_ends_by_the_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            thread::spawn(move || {
                let mut hello = [0u8; 4096];
                let _ = conn.read(&mut hello);
                // A handshake record announcing 16 KiB, its body trickled.
                let header = [0x16u8, 0x03, 0x03, 0x40, 0x00];
                trickle(&mut conn, header.into_iter().chain(std::iter::repeat(0)));
            });
        }
    });
    let t = RedisTier::new(
        RedisConfig::from_url(&format!("rediss://{addr}"))
            .unwrap()
            .io_timeout(IO)
            .connect_timeout(Duration::from_secs(5)),
    )
    .unwrap();
    ends_by_its_deadline("handshake", || t.get(&chunk_keys(1), &CancelToken::new()));
}

fn chunk_keys(n: usize) -> Vec<kvsched::kv::ChunkKey> {
    chunks(3, n, 1).into_iter().map(|c| c.0).collect()
}

/// A proxy to `to`: every byte from the client passed at once; the server's passed at once
/// for the first `fast` of a connection, then trickled.
fn slow_proxy(to: String, fast: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut client) = conn else { return };
            let Ok(mut server) = TcpStream::connect(&to) else {
                return;
            };
            let (Ok(mut c2), Ok(mut s2)) = (client.try_clone(), server.try_clone()) else {
                return;
            };
            thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut s2);
                let _ = s2.shutdown(Shutdown::Write);
            });
            thread::spawn(move || {
                let t0 = Instant::now();
                let mut buf = [0u8; 16 << 10];
                loop {
                    let n = match server.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if t0.elapsed() < fast {
                        if client.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        continue;
                    }
                    let rest = std::iter::from_fn(|| {
                        let mut b = [0u8; 1];
                        matches!(server.read(&mut b), Ok(1)).then_some(b[0])
                    });
                    trickle(&mut client, buf[..n].iter().copied().chain(rest));
                    break;
                }
                let _ = client.shutdown(Shutdown::Both);
            });
        }
    });
    addr
}

#[test]
fn a_reply_trickled_a_byte_at_a_time_ends_by_the_deadline() {
    if missing("redis-server") || missing("openssl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(dir.path());
    let srv = LocalRedis::start(LocalRedisOptions::new().tls(&cert, &key)).unwrap();
    let url = srv.tls_url().unwrap();
    let server_addr = url
        .trim_start_matches("rediss://")
        .trim_end_matches('/')
        .to_owned();
    let proxy = slow_proxy(server_addr, Duration::from_millis(500));
    let t = RedisTier::new(
        RedisConfig::from_url(&format!("rediss://{proxy}"))
            .unwrap()
            .ca_cert(&ca)
            .pool_size(1)
            .io_timeout(IO),
    )
    .unwrap();
    let data = chunks(3, 1, 20_000);
    t.put(&data).unwrap();
    thread::sleep(Duration::from_millis(600));
    ends_by_its_deadline("get", || t.get(&[data[0].0], &CancelToken::new()));
}

/// Reads and writes going one socket step at a time still carry values of megabytes whole,
/// many TLS records each, both ways.
#[test]
fn values_of_megabytes_round_trip_over_tls() {
    if missing("redis-server") || missing("openssl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(dir.path());
    let srv = LocalRedis::start(LocalRedisOptions::new().tls(&cert, &key)).unwrap();
    let t = RedisTier::new(
        RedisConfig::from_url(&srv.tls_url().unwrap())
            .unwrap()
            .ca_cert(&ca)
            .io_timeout(Duration::from_secs(8)),
    )
    .unwrap();
    let data = chunks(4, 3, 3 << 20);
    t.put(&data).unwrap();
    let keys: Vec<_> = data.iter().map(|c| c.0).collect();
    let got = t.get(&keys, &CancelToken::new()).unwrap();
    for (g, (_, v)) in got.iter().zip(&data) {
        assert!(g.as_ref() == Some(v), "a value came back changed");
    }
}
