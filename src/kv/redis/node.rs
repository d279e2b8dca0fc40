//! One Redis server: its client settings, its connection [`Pool`], and [`Node::request`],
//! which sends one pipeline and reads every reply (one round trip).

use std::time::Duration;

use ::redis::{Client, ConnectionAddr, ConnectionInfo, ConnectionLike, RedisConnectionInfo, Value};

use super::config::{NodeAddr, Redactor, RedisConfig};
use super::pool::{CheckoutError, Pool};
use super::Counters;
use crate::kv::TierError;
use crate::sync::{Arc, Ordering};

/// What every node of a tier shares: timeouts, the redactor, the counters.
#[derive(Debug)]
pub(crate) struct Shared {
    pub connect_timeout: Duration,
    pub io_timeout: Duration,
    pub redactor: Redactor,
    pub counters: Counters,
}

/// One server and its pool.
pub(crate) struct Node {
    pub addr: NodeAddr,
    /// Holds the credentials: never printed (`Node`'s `Debug` shows the address only).
    client: Client,
    pool: Pool<::redis::Connection>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({})", self.addr)
    }
}

/// The client for `addr` under `cfg`'s TLS and credentials. `root_pem`: the CA file's
/// contents, if one is configured.
pub(crate) fn client_for(
    addr: &NodeAddr,
    cfg: &RedisConfig,
    root_pem: Option<&[u8]>,
) -> Result<Client, String> {
    let redis = RedisConnectionInfo {
        db: cfg.db,
        username: cfg.username.as_ref().map(|s| s.0.clone()),
        password: cfg.password.as_ref().map(|s| s.0.clone()),
        ..RedisConnectionInfo::default()
    };
    let tcp_addr = if cfg.tls {
        ConnectionAddr::TcpTls {
            host: addr.host.clone(),
            port: addr.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(addr.host.clone(), addr.port)
    };
    let info = ConnectionInfo {
        addr: tcp_addr,
        redis,
    };
    let client = match root_pem {
        Some(pem) if cfg.tls => Client::build_with_tls(
            info,
            ::redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        _ => Client::open(info),
    };
    client.map_err(|e| e.to_string())
}

impl Node {
    /// A node at `addr`; connects lazily.
    pub fn new(addr: NodeAddr, client: Client, cfg: &RedisConfig, shared: Arc<Shared>) -> Node {
        Node {
            addr,
            client,
            pool: Pool::new(
                cfg.pool_size,
                cfg.backoff_initial,
                cfg.backoff_max,
                cfg.checkout_timeout,
            ),
            shared,
        }
    }

    /// `what` failed on this node: the error text with the address, credentials redacted.
    fn describe(&self, what: &str, e: &dyn std::fmt::Display) -> String {
        self.shared
            .redactor
            .clean(&format!("{} {what}: {e}", self.addr))
    }

    fn connect(&self) -> Result<::redis::Connection, String> {
        let c = &self.shared.counters;
        c.connects.fetch_add(1, Ordering::Relaxed);
        let made = self
            .client
            .get_connection_with_timeout(self.shared.connect_timeout)
            .and_then(|con| {
                con.set_read_timeout(Some(self.shared.io_timeout))?;
                con.set_write_timeout(Some(self.shared.io_timeout))?;
                Ok(con)
            });
        made.map_err(|e| {
            c.connect_failures.fetch_add(1, Ordering::Relaxed);
            self.describe("connect", &e)
        })
    }

    /// Sends `packed` (`replies` commands) on one connection and reads the `replies` replies:
    /// one round trip. A server error reply is a [`Value::ServerError`] in its place, not an
    /// `Err`. A connection taken from the pool that turns out stale (reset by a server
    /// restart) is dropped with the other idle ones and the request sent once more on a new
    /// connection; any other failure marks the node down (see [`Pool`]).
    pub fn request(&self, packed: &[u8], replies: usize) -> Result<Vec<Value>, TierError> {
        let mut retried = false;
        loop {
            let mut lease = self.pool.checkout(|| self.connect()).map_err(|e| match e {
                CheckoutError::Down { retry_in, last } => TierError::Unavailable(format!(
                    "{} down, next try in {} ms (last error: {last})",
                    self.addr,
                    retry_in.as_millis()
                )),
                CheckoutError::Busy(d) => TierError::Timeout(d),
                CheckoutError::Connect(msg) => TierError::Unavailable(msg),
            })?;
            let reused = lease.reused();
            let Some(con) = lease.conn() else {
                return Err(TierError::Unavailable(format!(
                    "{}: pool handed out no connection",
                    self.addr
                )));
            };
            self.shared
                .counters
                .round_trips
                .fetch_add(1, Ordering::Relaxed);
            match con.req_packed_commands(packed, 0, replies) {
                Ok(v) if v.len() == replies => return Ok(v),
                Ok(v) => {
                    lease.discard();
                    let msg = self.describe(
                        "protocol",
                        &format_args!("{} replies to {replies} commands", v.len()),
                    );
                    self.pool.mark_down(msg.clone());
                    return Err(TierError::Unavailable(msg));
                }
                Err(e) => {
                    lease.discard();
                    if e.is_timeout() {
                        self.pool.mark_down(self.describe("read/write", &e));
                        return Err(TierError::Timeout(self.shared.io_timeout));
                    }
                    let msg = self.describe("request", &e);
                    if reused && !retried && (e.is_connection_dropped() || e.is_io_error()) {
                        retried = true;
                        self.pool.drop_idle();
                        continue;
                    }
                    if e.is_io_error() || e.is_connection_dropped() {
                        self.pool.mark_down(msg.clone());
                    }
                    return Err(TierError::Unavailable(msg));
                }
            }
        }
    }

    /// Connections that exist (idle, in use, or being made).
    pub fn connections(&self) -> usize {
        self.pool.census().0
    }
}
