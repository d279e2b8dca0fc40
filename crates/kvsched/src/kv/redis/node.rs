//! One Redis server: its connection settings, its connection [`Pool`], and
//! [`Node::request`], which sends one pipeline and reads every reply (one round trip) within
//! the call's [`Budget`].

use std::time::{Duration, Instant};

use ::redis::Value;

use super::config::{NodeAddr, RedisConfig, Secret};
use super::conn::{Budget, Conn, ConnError, Login};
use super::pool::{CheckoutError, Pool};
use super::reply::Limits;
use super::AtomicCounts;
use crate::kv::TierError;
use crate::sync::{Arc, Ordering};

/// What every node of a tier shares: timeouts, TLS, credentials, the counters.
pub(crate) struct Shared {
    pub connect_timeout: Duration,
    /// A whole call's time (its deadline is this long after it starts).
    pub io_timeout: Duration,
    /// The TLS client settings (`None`: plain TCP).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub username: Option<Secret>,
    pub password: Option<Secret>,
    pub db: i64,
    /// What a reply to a data command may hold.
    pub data_limits: Limits,
    pub counters: AtomicCounts,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("connect_timeout", &self.connect_timeout)
            .field("io_timeout", &self.io_timeout)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// One server and its pool.
pub(crate) struct Node {
    pub addr: NodeAddr,
    pool: Pool<Conn>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({})", self.addr)
    }
}

impl Node {
    /// A node at `addr`; connects lazily.
    pub fn new(addr: NodeAddr, cfg: &RedisConfig, shared: Arc<Shared>) -> Node {
        Node {
            addr,
            pool: Pool::new(
                cfg.pool_size,
                cfg.backoff_initial,
                cfg.backoff_max,
                cfg.checkout_timeout,
            ),
            shared,
        }
    }

    /// `what` failed on this node: the error text with the address. No text here holds a
    /// credential: the handshake reports a refusal by its error code only.
    fn describe(&self, what: &str, e: &dyn std::fmt::Display) -> String {
        format!("{} {what}: {e}", self.addr)
    }

    fn connect(&self, budget: Budget<'_>) -> Result<Conn, String> {
        let s = &self.shared;
        s.counters.connects.fetch_add(1, Ordering::Relaxed);
        let connect_budget = Budget {
            deadline: budget
                .deadline
                .min(Instant::now() + self.shared.connect_timeout),
            cancel: budget.cancel,
        };
        let login = Login {
            username: s.username.as_ref().map(|u| u.0.as_str()),
            password: s.password.as_ref().map(|p| p.0.as_str()),
            db: s.db,
        };
        Conn::open(&self.addr, s.tls.as_ref(), &login, connect_budget).map_err(|e| {
            s.counters.connect_failures.fetch_add(1, Ordering::Relaxed);
            self.describe("connect", &e)
        })
    }

    /// Sends `packed` (`replies` commands) on one connection and reads the `replies` replies
    /// (each within `limits`): one round trip, within `budget`. A server error reply is a
    /// [`Value::ServerError`] in its place, not an `Err`. A connection taken from the pool
    /// that turns out stale (reset by a server restart) is dropped with the other idle ones
    /// and the request sent once more on a new connection. A timeout, or a reply that breaks
    /// the limits, drops the connection and marks the node down (see [`Pool`]); a cancel
    /// drops the connection only.
    pub fn request(
        &self,
        packed: &[u8],
        replies: usize,
        limits: Option<&Limits>,
        budget: Budget<'_>,
    ) -> Result<Vec<Value>, TierError> {
        let limits = limits.unwrap_or(&self.shared.data_limits);
        let counters = &self.shared.counters;
        let mut retried = false;
        loop {
            if budget.cancel.is_some_and(|c| c.is_cancelled()) {
                return Err(TierError::Cancelled);
            }
            let mut lease = self
                .pool
                .checkout_until(budget.deadline, || self.connect(budget))
                .map_err(|e| match e {
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
            counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let mut got = Vec::with_capacity(replies.min(1024));
            let outcome = con.send(packed, budget).and_then(|()| {
                for _ in 0..replies {
                    got.push(con.read_reply(limits, budget)?);
                }
                Ok(())
            });
            let e = match outcome {
                Ok(()) => return Ok(got),
                Err(e) => e,
            };
            // Whatever went wrong, the connection is mid-reply: never reuse it.
            lease.discard();
            match e {
                ConnError::Cancelled => return Err(TierError::Cancelled),
                ConnError::Timeout => {
                    counters.timeouts.fetch_add(1, Ordering::Relaxed);
                    self.pool
                        .mark_down(self.describe("request", &"deadline passed"));
                    return Err(TierError::Timeout(self.shared.io_timeout));
                }
                ConnError::Protocol(p) => {
                    counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    let msg = self.describe("protocol", &p);
                    self.pool.mark_down(msg.clone());
                    return Err(TierError::Unavailable(msg));
                }
                ConnError::Io(io) => {
                    // A stale pooled connection fails before any reply arrives.
                    if reused && !retried && got.is_empty() {
                        retried = true;
                        self.pool.drop_idle();
                        continue;
                    }
                    let msg = self.describe("request", &io);
                    self.pool.mark_down(msg.clone());
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
