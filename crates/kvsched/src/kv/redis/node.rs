//! One Redis server: its connection settings, its connection [`Pool`], and
//! [`Node::request`], which sends one pipeline and reads every reply (one round trip) within
//! the call's [`Budget`].

use std::time::{Duration, Instant};

use ::redis::Value;

use super::config::{NodeAddr, RedisConfig, Secret};
use super::conn::{Budget, Conn, ConnError, Idle, Login, OpenError};
use super::pool::{CheckoutError, ConnectError, Pool};
use super::reply::Limits;
use super::resolve::{Lookups, Resolver};
use super::{resp, AtomicCounts};
use crate::kv::TierError;
use crate::sync::{Arc, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// The `ECHO` closing every pipeline: its reply, a nonce of the call's own, must come
/// last, so replies shifted by a stray — which the reader cannot tell from the right ones by
/// their kind — are found on the call they shift, whatever the timing. One command of some
/// 40 bytes each way per round trip.
#[derive(Debug)]
pub(crate) struct Sentinel {
    /// Random per tier: a nonce of another tier (or process) on the same server is no match.
    seed: u64,
    next: AtomicU64,
}

impl Sentinel {
    pub fn new() -> Sentinel {
        use std::hash::BuildHasher;
        let seed = std::collections::hash_map::RandomState::new()
            .hash_one((std::process::id(), std::time::SystemTime::now()));
        Sentinel {
            seed,
            next: AtomicU64::new(0),
        }
    }

    /// The next pipeline's closing command and the reply it must get.
    fn next(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        // Relaxed: a counter; any value is a valid nonce, none is reused.
        // Planted bug `redis-no-closing-echo` (scripts/plants.sh): pipelines go without it,
        // so a stray read where a value was due, with nothing left over, is taken for it.
        if planted!("redis-no-closing-echo") {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let nonce = format!("kvsched-in-step-{:016x}{n:016x}", self.seed).into_bytes();
        Some((resp::pack(&[&[b"ECHO", &nonce]]), nonce))
    }

    /// Whether an error reply is the server's answer to the `ECHO` itself: its text names
    /// the command (`NOPERM … 'echo' command`, `unknown command 'ECHO'`, `wrong number of
    /// arguments for 'echo'`). Another error where the `ECHO`'s reply is due — `LOADING`, or
    /// a data command's own `MOVED` or `WRONGTYPE` shifted there by a stray reply — proves
    /// nothing about the replies before it.
    fn answers_echo(v: &Value) -> bool {
        resp::error_text(v).is_some_and(|t| t.to_ascii_lowercase().contains("'echo'"))
            || planted!("redis-echo-off-on-any-error")
    }

    /// Whether the server's error answer to `ECHO` says it will never run it: `NOPERM` (an
    /// ACL) or an unknown command (renamed or disabled).
    fn refused_for_good(v: &Value) -> bool {
        // Planted bug `redis-echo-off-on-any-error` (scripts/plants.sh): any error turns the
        // check off, a passing one too.
        if planted!("redis-echo-off-on-any-error") {
            return true;
        }
        match resp::error_code(v) {
            Some("NOPERM") => true,
            Some("ERR") => resp::error_text(v)
                .is_some_and(|t| t.to_ascii_lowercase().contains("unknown command")),
            _ => false,
        }
    }
}

/// The least time a request must have had, when sent, for its timeout to count against the
/// node (marking it down): a request sent with less, after an earlier node of the call (a hung
/// one) spent the call's time, says nothing of this node.
const FAIR_TIME: Duration = Duration::from_millis(100);

/// Pipelines in a row whose closing `ECHO` got an error not naming it (not its own answer)
/// before the node is taken to refuse `ECHO`: a stray shifting a data command's error there
/// happens once; a proxy answering every `ECHO` with the same error, every time.
const ECHO_ERRORS_REFUSE: u32 = 3;

/// Idle connections holding a stray reply one call drops (each a counted protocol error)
/// before it takes the node for a server sending replies nobody asked for.
const MAX_STRAYS_DROPPED: u32 = 4;

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
    /// The largest value the config accepts ([`RedisConfig::max_value_bytes`]).
    pub max_value_bytes: usize,
    /// The largest value the tier's callers said they store ([`Tier::expect_values_up_to`]:
    /// the largest of their words), 0 before any said: replies to data commands hold no
    /// value larger than this (when set) nor than `max_value_bytes`.
    ///
    /// [`Tier::expect_values_up_to`]: crate::kv::Tier::expect_values_up_to
    pub expected_max: AtomicUsize,
    /// The `ECHO` closing every pipeline.
    pub sentinel: Sentinel,
    pub counters: AtomicCounts,
    /// The host name resolver and its lookups under way.
    pub lookups: Arc<Lookups>,
}

impl Shared {
    /// The largest value a data reply may hold.
    pub fn value_bound(&self) -> usize {
        // Relaxed: a bound, read once per call; a call racing the first word may use either.
        match self.expected_max.load(Ordering::Relaxed) {
            // Planted bug `redis-value-bound-ignored` (scripts/plants.sh): the callers' word
            // is not used, so a get may hold values of up to 512 MiB each.
            _ if planted!("redis-value-bound-ignored") => self.max_value_bytes,
            0 => self.max_value_bytes,
            expected => expected.min(self.max_value_bytes),
        }
    }
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
    /// The address's host, resolved within a call's deadline.
    resolver: Resolver,
    pool: Pool<Conn>,
    shared: Arc<Shared>,
    /// The server refuses `ECHO` for good: its pipelines go without it (the other checks
    /// remain).
    echo_refused: AtomicBool,
    /// Pipelines in a row whose closing `ECHO` got an error that does not name it.
    echo_errors: AtomicU32,
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
            resolver: Resolver::new(&addr.host, addr.port),
            addr,
            pool: Pool::new(
                cfg.pool_size,
                cfg.backoff_initial,
                cfg.backoff_max,
                cfg.checkout_timeout,
            ),
            shared,
            echo_refused: AtomicBool::new(false),
            echo_errors: AtomicU32::new(0),
        }
    }

    /// Pipelines to this node go without the closing `ECHO` from now on (logged once).
    fn refuse_echo(&self) {
        // Relaxed: a flag; a pipeline racing it sends one more `ECHO`, refused again.
        if !self.echo_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                node = %self.addr,
                "redis tier: the server refuses ECHO; pipelines go without the closing \
                 in-step check from now on (the chunks' own checks remain)"
            );
        }
    }

    /// `what` failed on this node: the error text with the address. No text here holds a
    /// credential: the handshake reports a refusal by its error code only.
    fn describe(&self, what: &str, e: &dyn std::fmt::Display) -> String {
        format!("{} {what}: {e}", self.addr)
    }

    fn connect(&self, budget: Budget<'_>) -> Result<Conn, ConnectError> {
        let s = &self.shared;
        s.counters.connects.fetch_add(1, Ordering::Relaxed);
        let own_deadline = Instant::now() + self.shared.connect_timeout;
        let connect_budget = Budget {
            deadline: budget.deadline.min(own_deadline),
            cancel: budget.cancel,
        };
        // The caller's token fired, or its deadline (before the node's connect timeout)
        // passed: whatever the connect met, the node is not blamed for it.
        let gave_up = || {
            let cancelled = budget.cancel.is_some_and(|c| c.is_cancelled());
            let timed_out = budget.deadline < own_deadline && Instant::now() >= budget.deadline;
            (cancelled || timed_out).then_some(ConnectError::GaveUp { cancelled })
        };
        if let Some(e) = gave_up() {
            return Err(e);
        }
        let login = Login {
            username: s.username.as_ref().map(|u| u.0.as_str()),
            password: s.password.as_ref().map(|p| p.0.as_str()),
            db: s.db,
        };
        self.resolver
            .addrs(&s.lookups, connect_budget)
            .map_err(|text| OpenError {
                text,
                protocol: false,
            })
            .and_then(|addrs| {
                Conn::open(&self.addr, &addrs, s.tls.as_ref(), &login, connect_budget)
            })
            .map_err(|e| {
                if let Some(e) = gave_up() {
                    return e;
                }
                s.counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                if e.protocol {
                    s.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                }
                ConnectError::Node(self.describe("connect", &e.text))
            })
    }

    /// Sends `packed` (`replies` commands) on one connection and reads the `replies` replies
    /// (each within `limits`): one round trip, within `budget`. A server error reply is a
    /// [`Value::ServerError`] in its place, not an `Err`; every other reply must be one
    /// `accept` takes, the kind its command answers.
    ///
    /// RESP has no request ids: a connection whose replies and commands fell out of step
    /// would answer every later command with an earlier one's reply. So a connection is
    /// never used again once it shows a sign of it — a reply of a kind its command does not
    /// answer, bytes left after the last reply asked for, or, taken idle from the pool, bytes
    /// waiting before anything was sent. Each is a counted protocol error. The first two
    /// fail the call and mark the node down, like a reply that breaks the limits; a stray
    /// found on an idle connection only drops it, and the request goes on a new one.
    ///
    /// A connection taken from the pool that turns out stale (reset by a server restart) is
    /// dropped with the other idle ones and the request sent once more on a new connection.
    /// A timeout drops the connection and marks the node down (see [`Pool`]); a cancel drops
    /// the connection only.
    pub fn request(
        &self,
        packed: &[u8],
        replies: usize,
        limits: Option<&Limits>,
        accept: &dyn Fn(&Value) -> bool,
        budget: Budget<'_>,
    ) -> Result<Vec<Value>, TierError> {
        let data = Limits::data(self.shared.value_bound(), self.shared.max_value_bytes);
        let limits = limits.unwrap_or(&data);
        let counters = &self.shared.counters;
        let mut retried = false;
        let mut strays_dropped = 0u32;
        loop {
            if budget.cancel.is_some_and(|c| c.is_cancelled()) {
                return Err(TierError::Cancelled);
            }
            // The call's time is spent before anything is sent: the node is not at fault.
            // (Planted bug `redis-refresh-on-spent-time`: the request is sent, and its
            // timeout marks the node down.)
            if Instant::now() >= budget.deadline && !planted!("redis-refresh-on-spent-time") {
                return Err(TierError::Timeout(self.shared.io_timeout));
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
                    // The call's own deadline, or the checkout timeout, whichever ended it.
                    CheckoutError::Busy(d) if Instant::now() < budget.deadline => {
                        TierError::Timeout(d)
                    }
                    CheckoutError::Busy(_) => TierError::Timeout(self.shared.io_timeout),
                    CheckoutError::Connect(msg) => TierError::Unavailable(msg),
                    CheckoutError::GaveUp { cancelled: true } => TierError::Cancelled,
                    CheckoutError::GaveUp { cancelled: false } => {
                        TierError::Timeout(self.shared.io_timeout)
                    }
                })?;
            let reused = lease.reused();
            let Some(con) = lease.conn() else {
                return Err(TierError::Unavailable(format!(
                    "{}: pool handed out no connection",
                    self.addr
                )));
            };
            // Planted bug `redis-stray-kept` (scripts/plants.sh): a connection is used again
            // whatever it shows, so a stray reply answers the next command in its place.
            let keep_strays = planted!("redis-stray-kept");
            if reused && !keep_strays {
                match con.idle_state() {
                    Idle::Clean => {}
                    Idle::Stray if strays_dropped < MAX_STRAYS_DROPPED => {
                        strays_dropped += 1;
                        counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        lease.discard();
                        continue;
                    }
                    Idle::Stray => {
                        counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        lease.discard();
                        let msg = self.describe("protocol", &"replies nobody asked for");
                        self.pool.mark_down(msg.clone());
                        return Err(TierError::Unavailable(msg));
                    }
                    Idle::Closed if !retried => {
                        retried = true;
                        lease.discard();
                        self.pool.drop_idle();
                        continue;
                    }
                    // Sent on, the request fails as the closed connection's I/O error.
                    Idle::Closed => {}
                }
            }
            counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let fair = budget.remaining() >= FAIR_TIME || planted!("redis-refresh-on-spent-time");
            let mut got = Vec::with_capacity(replies.min(1024));
            // Relaxed: see `refuse_echo`.
            let sentinel = if self.echo_refused.load(Ordering::Relaxed) {
                None
            } else {
                self.shared.sentinel.next()
            };
            let outcome = con.send(packed, budget).and_then(|()| {
                if let Some((command, _)) = &sentinel {
                    con.send(command, budget)?;
                }
                for i in 0..replies {
                    let v = con.read_reply(limits, budget)?;
                    if !matches!(v, Value::ServerError(_)) && !accept(&v) && !keep_strays {
                        return Err(ConnError::Protocol(format!(
                            "reply {} of {replies} is {}, which its command does not answer",
                            i + 1,
                            resp::kind(&v)
                        )));
                    }
                    got.push(v);
                }
                if let Some((_, nonce)) = &sentinel {
                    match con.read_reply(&Limits::control(), budget)? {
                        Value::BulkString(b) if b == *nonce => {
                            // Relaxed: see `refuse_echo`.
                            self.echo_errors.store(0, Ordering::Relaxed);
                        }
                        _ if keep_strays => {}
                        // The server's error answer to the `ECHO` itself: the replies are in
                        // step. One that will never run it (an ACL, a renamed command) has
                        // later pipelines go without it.
                        v @ Value::ServerError(_) if Sentinel::answers_echo(&v) => {
                            if Sentinel::refused_for_good(&v) {
                                self.refuse_echo();
                            }
                        }
                        // Another error there (`LOADING`, or a data command's own shifted
                        // by a stray) fails the call. One while the data commands were
                        // answered without error, every time — a proxy answering `ECHO`
                        // with an error that does not name it — is a refusal: after
                        // `ECHO_ERRORS_REFUSE` in a row, pipelines go without it. (A server
                        // answering everything with errors, `LOADING` for a while, says
                        // nothing of `ECHO`.)
                        v @ Value::ServerError(_) => {
                            // Planted bug `echo-refusal-counts-server-errors`
                            // (scripts/plants.sh): counted while everything errs too.
                            if got.iter().all(|d| !matches!(d, Value::ServerError(_)))
                                || planted!("echo-refusal-counts-server-errors")
                            {
                                // Relaxed: see `refuse_echo`.
                                let n = self.echo_errors.fetch_add(1, Ordering::Relaxed) + 1;
                                if n >= ECHO_ERRORS_REFUSE {
                                    self.refuse_echo();
                                }
                            }
                            return Err(ConnError::Protocol(format!(
                                "an error reply where the pipeline's closing ECHO's was due \
                                 ({}): the replies may be out of step with their commands",
                                resp::error_text(&v).unwrap_or_default()
                            )));
                        }
                        other => {
                            return Err(ConnError::Protocol(format!(
                                "replies out of step with their commands (a {} where the \
                                 pipeline's closing ECHO was due)",
                                resp::kind(&other)
                            )))
                        }
                    }
                }
                match con.buffered() {
                    _ if keep_strays => Ok(()),
                    0 => Ok(()),
                    n => Err(ConnError::Protocol(format!(
                        "{n} bytes after the {replies} replies asked for"
                    ))),
                }
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
                    if fair {
                        self.pool
                            .mark_down(self.describe("request", &"deadline passed"));
                    }
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

    /// Whether the node is down now (within the backoff of its last failure).
    pub fn is_down(&self) -> bool {
        self.pool.is_down()
    }

    /// Connections that exist (idle, in use, or being made).
    pub fn connections(&self) -> usize {
        self.pool.census().0
    }
}
