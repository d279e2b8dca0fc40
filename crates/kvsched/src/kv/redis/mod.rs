//! [`RedisTier`]: a [`Tier`] on a Redis server or a Redis Cluster (feature `redis`). Local
//! `redis-server` processes for tests and benchmarks are the test kit's
//! (`kvsched_testkit::redis`).
//!
//! * `config` — [`RedisConfig`]: URL parsing, settings, credential redaction;
//! * `pool` — a bounded connection pool per node, with the node's reconnect backoff;
//! * `node` — one server: its pool, one pipeline per request, within the call's deadline;
//! * `conn` — one connection (TCP or TLS), its handshake, its deadline-bound writes and reads;
//! * `reply` — the bounded RESP2 reply parser;
//! * `tls` — rustls settings and the bounded read of the CA file;
//! * `resolve` — host name lookups, off the caller's thread, within its deadline;
//! * `cluster` — hash slots, the `CLUSTER SLOTS` map, MOVED/ASK;
//! * `resp` — command packing.
//!
//! # The `redis` crate and what is kept by hand
//!
//! From `redis` (0.32) the tier takes the reply type ([`Value`]), the parse of a reply once
//! `reply` has framed it whole, and the reading of `MOVED`/`ASK` redirects. Kept by hand:
//! * URL parsing and redaction (`config`): the crate's `ConnectionInfo` holds one address
//!   (no seed list), knows none of our query keys, and its derived `Debug` prints the
//!   password;
//! * CRC16 slots (`cluster`): the crate computes them only inside its cluster client
//!   (`get_slot`, `Route::slot` are crate-private);
//! * command packing (`resp`): `redis::Cmd` copies every value once more; measured on 64
//!   commands packed into one pipeline it took 3.7–4.1× the time for `GET`s and 1.4–2.3×
//!   for `SET`s of 16–256 KiB values;
//! * connections, pool and reply framing (`conn`, `pool`, `reply`): the crate's sync
//!   connection has a timeout per socket operation, not a deadline per call across
//!   checkout, connect, redirects and reads, and reads a reply of any announced size.
//!
//! # Keys and values
//!
//! A chunk is stored as one Redis string under `kvsched:<tag>:<key as 32 hex digits>`, its
//! value written by one `SET` (so a key never holds part of a value). The tag (see
//! [`RedisConfig::tag`]) carries no braces, so in a cluster the keys of one load hash to slots
//! all over the cluster: a call groups its keys by node and sends **one pipeline per node it
//! touches** (`GET`s, `EXISTS`es or `SET`s, one per key, in one write and one read), never one
//! round trip per key. Nodes are visited one after the other; the [`CancelToken`] is checked
//! before each node's pipeline.
//!
//! # Failures
//!
//! * A node that fails (refused, reset, timed out, bad reply) is *down* for a backoff delay
//!   (from [`RedisConfig::backoff`]'s initial delay, doubling per consecutive failure, capped):
//!   a call that needs it in that time fails at once with [`TierError::Unavailable`], without
//!   connecting. The next call after the delay reconnects. A pooled connection found stale
//!   (the server restarted since it was used) is dropped with the node's other idle ones and
//!   the pipeline resent once on a fresh connection.
//! * Timeouts: a whole call ends by its deadline, [`RedisConfig::io_timeout`] after it
//!   starts: every checkout, connect, write and read of every pipeline it sends (redirects
//!   included) waits at most until then, and a server that answers never, slowly, or one
//!   byte at a time cannot extend it (over TLS too: `conn` reads and writes one socket step
//!   at a time, never a whole TLS record). Within it, a connect takes at most
//!   [`RedisConfig::connect_timeout`] and waiting for a pooled connection at most
//!   [`RedisConfig::checkout_timeout`]. A host name (a seed's, a slot map's, a redirect's) is
//!   looked up on a thread of its own (`resolve`), the call waiting for it no later than its
//!   deadline; its answer is kept for 30 s. The [`CancelToken`] is looked at before each
//!   pipeline and every 20 ms while a read or write waits. A timeout or a cancel drops the
//!   connection it was using (its reply is half read); a timeout also marks the node down.
//! * Replies are untrusted (`reply`): a bulk string longer than [`RedisConfig::max_value_bytes`]
//!   (64 KiB in a control reply; one past the lowered value bound below is read past), an
//!   array over a few values (2^18 for `CLUSTER SLOTS`), a line over 64 KiB without its
//!   CRLF, a number written other than as digits after an optional `-`, and any RESP3 frame
//!   (push, map, …) are protocol errors: the connection is dropped, the node marked down,
//!   the call fails with [`TierError::Unavailable`], and [`RedisCounts::protocol_errors`]
//!   counts it (during a connection's handshake too). Memory grows with the bytes that
//!   arrived, never with a length the server announced.
//! * The value bound: [`RedisConfig::max_value_bytes`], lowered to the largest value the
//!   tier's callers said they store ([`Tier::expect_values_up_to`]: a
//!   [`TierConnector`](crate::kv::TierConnector) says its largest chunk). A server answering
//!   a get with a value of hundreds of megabytes then costs a refused call, not that memory.
//!   A value past that bound but within `max_value_bytes` (another writer's: a chunk with a
//!   MAC read by a tier without one, another chunk format) is read past without being kept:
//!   the connection stays in step, the call's other keys are answered, and the value comes
//!   back empty, failing its chunk's checks ([`RedisCounts::oversized_values`]); its time
//!   counts against the call's deadline.
//! * Replies in step: RESP has no request ids, so a connection whose replies fell out of
//!   step with its commands would answer every later command with an earlier one's reply —
//!   another key's value, for ever. Every pipeline ends with an `ECHO` of a nonce of the
//!   call's own: a last reply other than that nonce means the replies were read out of step,
//!   whatever the timing. A connection is never used again once it shows a sign of it: that,
//!   a reply of a kind its command does not answer (`SET` answered by a bulk string), bytes
//!   after the last reply a pipeline asked for, or, taken idle from the pool, bytes waiting
//!   before anything was sent (looked at without blocking; on TLS only the bytes already
//!   read). Each is a counted protocol error: the first three fail the call and mark the
//!   node down; a stray reply found on an idle connection only drops it, and the pipeline
//!   goes on a new connection (after four such in one call the node is marked down). A
//!   server refusing `ECHO` gets pipelines without it from then on.
//! * Cluster: `MOVED` refreshes the slot map and resends to the named node; `ASK` resends
//!   once to the importing node after `ASKING`; at most [`RedisConfig::max_redirects`]
//!   rounds per call. A slot map refresh that finds no usable map (every node refusing, or
//!   answering a map with no slots, too many nodes, a malformed range or ranges that
//!   overlap) is not tried again for the node backoff's delay: meanwhile a call needing
//!   the map fails at once with the refresh's error, [`RedisCounts::slot_refreshes`] not
//!   counting it.
//! * `OOM` (maxmemory reached with a `noeviction` policy) is [`TierError::Refused`]. With an
//!   evicting policy (`allkeys-lru`) keys vanish instead, and `get` answers `None` for them.
//! * A key holding something other than a string (written by someone else) reads as `None`.
//!
//! Error texts name the node (`host:port`) and never contain the credentials: none is
//! ever formatted into one, and a refused `AUTH` is reported by its error code only. Text
//! the server chose (an error reply's) is repeated with its control characters escaped and
//! cut to 200 characters, so it can neither forge a log line nor fill one; a redirect or
//! slot map naming a host of more than 253 characters, or one holding white space or a
//! control character, is not followed.
//!
//! # Faults
//!
//! [`RedisTier::edit_stored`] and [`RedisTier::remove`] change one value at rest (a value
//! read, edited and written back; a `DEL`): the test kit's fault injection damages the
//! server every engine sharing it reads through them.
//!
//! # Limits
//!
//! A call's requests and replies are held in memory whole: a `get` of `n` keys holds the `n`
//! values it returns (Redis caps a value at 512 MiB; [`RedisConfig::max_value_bytes`] caps
//! what `put` sends, and what a reply may hold). TLS uses rustls with the ring provider (no
//! process-wide default is installed), trusting the system's roots or those of the CA file,
//! which is read only if it is a regular file of at most 4 MiB, opened without blocking.

mod cluster;
mod config;
mod conn;
mod node;
mod pool;
mod reply;
mod resolve;
mod resp;
mod rounds;
mod tls;
mod url;

use ::redis::Value;

use self::cluster::Cluster;
use self::config::NodeAddr;
use self::conn::Budget;
use self::node::{Node, Shared};
use self::rounds::Op;
use crate::connector::CancelToken;
use crate::kv::{ChunkKey, Tier, TierError};
use crate::sync::{Arc, AtomicU64, AtomicUsize, Ordering};

pub use self::config::{ConfigError, RedisConfig, MAX_SEEDS, MAX_TAG_LEN};

/// The counts a tier keeps, as atomics (all Relaxed: they are statistics, read without
/// ordering); [`RedisCounts`] is their snapshot.
#[derive(Debug, Default)]
pub(crate) struct AtomicCounts {
    pub round_trips: AtomicU64,
    pub connects: AtomicU64,
    pub connect_failures: AtomicU64,
    pub redirects: AtomicU64,
    pub slot_refreshes: AtomicU64,
    pub timeouts: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub oversized_values: AtomicU64,
}

/// What a [`RedisTier`] has done so far (totals since it was built).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisCounts {
    /// Pipelines sent and answered or failed (each is one round trip to one node), the
    /// cluster's `CLUSTER SLOTS` and [`RedisTier::check`]'s `PING`s included.
    pub round_trips: u64,
    /// Connection attempts.
    pub connects: u64,
    /// Connection attempts that failed (refused, timed out, TLS or AUTH refused).
    pub connect_failures: u64,
    /// Keys resent after a `MOVED` or `ASK` reply.
    pub redirects: u64,
    /// Slot map reloads (`CLUSTER SLOTS`), the first one included.
    pub slot_refreshes: u64,
    /// Connections open now, over all nodes (at most the pool size per node).
    pub connections: u64,
    /// Requests that ran past their call's deadline (each dropped its connection).
    pub timeouts: u64,
    /// Replies refused as malformed, over the limits or out of step with their commands (a
    /// bulk string past the value bound, a RESP3 push frame, a line without CRLF, a reply of
    /// the wrong kind, bytes nobody asked for, …), in a handshake too; each dropped its
    /// connection.
    pub protocol_errors: u64,
    /// Values a get met past the value bound but within `max_value_bytes`: read past without
    /// being kept, the connection kept, each handed back empty (its chunk fails its checks).
    pub oversized_values: u64,
}

enum Topology {
    Single(Arc<Node>),
    Cluster(Cluster),
}

/// A [`Tier`] on Redis: one server, or a Redis Cluster. See the [module docs](self) for the
/// key layout, batching, failure handling and limits.
///
/// Cheap to share (`Arc`) between worker threads; every call is independent. Connections
/// are made lazily, so building a tier never waits for a server ([`check`](Self::check)
/// connects eagerly).
pub struct RedisTier {
    config: RedisConfig,
    shared: Arc<Shared>,
    topology: Topology,
    /// `kvsched:<tag>:`
    prefix: Vec<u8>,
    /// The `SET` options after the value (`PX <ms>`), if a TTL is set.
    ttl_ms: Option<Vec<u8>>,
}

impl std::fmt::Debug for RedisTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTier")
            .field("config", &self.config)
            .field("stats", &self.counts())
            .finish()
    }
}

impl RedisTier {
    /// A tier for `config` (checked here; the CA certificate file, if any, is read here). No
    /// connection is made until the first call.
    pub fn new(config: RedisConfig) -> Result<RedisTier, ConfigError> {
        Self::with_resolver(config, Box::new(resolve::system))
    }

    /// [`new`](Self::new), resolving host names with `resolve` (a test's).
    fn with_resolver(
        config: RedisConfig,
        resolve: Box<resolve::ResolveFn>,
    ) -> Result<RedisTier, ConfigError> {
        config.validate()?;
        let tls = if config.tls {
            Some(tls::client_config(config.ca_cert.as_deref())?)
        } else {
            None
        };
        let shared = Arc::new(Shared {
            connect_timeout: config.connect_timeout,
            io_timeout: config.io_timeout,
            tls,
            username: config.username.clone(),
            password: config.password.clone(),
            db: config.db,
            max_value_bytes: config.max_value_bytes,
            expected_max: AtomicUsize::new(0),
            sentinel: node::Sentinel::new(),
            counters: AtomicCounts::default(),
            lookups: Arc::new(resolve::Lookups::new(resolve)),
        });
        let make = {
            let cfg = config.clone();
            let shared = Arc::clone(&shared);
            move |addr: &NodeAddr| -> Result<Node, String> {
                Ok(Node::new(addr.clone(), &cfg, Arc::clone(&shared)))
            }
        };
        let first = config.seeds.first().ok_or(ConfigError::Url("no host"))?;
        let first = Node::new(first.clone(), &config, Arc::clone(&shared));
        let topology = if config.cluster {
            Topology::Cluster(Cluster::new(
                config.seeds.clone(),
                Box::new(make),
                (config.backoff_initial, config.backoff_max),
                Arc::clone(&shared),
            ))
        } else {
            Topology::Single(Arc::new(first))
        };
        let mut prefix = b"kvsched:".to_vec();
        prefix.extend_from_slice(config.tag.as_bytes());
        prefix.push(b':');
        let ttl_ms = config.ttl.map(|t| {
            let mut b = Vec::new();
            resp::push_decimal(&mut b, usize::try_from(t.as_millis()).unwrap_or(usize::MAX));
            b
        });
        Ok(RedisTier {
            config,
            shared,
            topology,
            prefix,
            ttl_ms,
        })
    }

    /// The configuration (credentials hidden from its `Debug`).
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Totals since the tier was built.
    pub fn counts(&self) -> RedisCounts {
        let c = &self.shared.counters;
        RedisCounts {
            round_trips: c.round_trips.load(Ordering::Relaxed),
            connects: c.connects.load(Ordering::Relaxed),
            connect_failures: c.connect_failures.load(Ordering::Relaxed),
            redirects: c.redirects.load(Ordering::Relaxed),
            slot_refreshes: c.slot_refreshes.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
            protocol_errors: c.protocol_errors.load(Ordering::Relaxed),
            oversized_values: c.oversized_values.load(Ordering::Relaxed),
            connections: match &self.topology {
                Topology::Single(n) => n.connections() as u64,
                Topology::Cluster(c) => c.registered().iter().map(|n| n.connections() as u64).sum(),
            },
        }
    }

    /// The Redis key a chunk is stored under: `kvsched:<tag>:<32 hex digits>`.
    pub fn redis_key(&self, key: ChunkKey) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + 32);
        k.extend_from_slice(&self.prefix);
        const HEX: &[u8; 16] = b"0123456789abcdef";
        // The key's `Display`: 32 lowercase hex digits, most significant first.
        k.extend(
            (0..32)
                .rev()
                .map(|i| HEX[((key.0 >> (4 * i)) & 0xf) as usize]),
        );
        k
    }

    /// Connects to every node (for a cluster: loads the slot map first) and `PING`s it; the
    /// first failure is returned. Subject to the same backoff as other calls.
    pub fn check(&self) -> Result<(), TierError> {
        let budget = self.budget(None);
        let ping = resp::pack(&[&[b"PING"]]);
        let nodes: Vec<Arc<Node>> = match &self.topology {
            Topology::Single(n) => vec![Arc::clone(n)],
            Topology::Cluster(c) => {
                let map = c.map();
                if map.nodes().is_empty() {
                    c.refresh(map.generation(), budget)?;
                }
                c.map().nodes().to_vec()
            }
        };
        for n in nodes {
            let pong = |v: &Value| matches!(v, Value::SimpleString(s) if s == "PONG");
            let r = n.request(&ping, 1, Some(&reply::Limits::control()), &pong, budget)?;
            if let Some(e) = r.first().and_then(resp::error_text) {
                return Err(TierError::Unavailable(format!("{}: {e}", n.addr)));
            }
        }
        Ok(())
    }

    /// A call's budget: its deadline ([`RedisConfig::io_timeout`] from now) and its token.
    fn budget<'a>(&self, cancel: Option<&'a CancelToken>) -> Budget<'a> {
        Budget {
            deadline: std::time::Instant::now() + self.config.io_timeout,
            cancel,
        }
    }
}

impl Tier for RedisTier {
    fn name(&self) -> &str {
        "redis"
    }

    /// Lowers the largest value a get accepts to the largest `bytes` said (never above
    /// [`RedisConfig::max_value_bytes`]): a larger bulk string is refused from its header,
    /// a counted protocol error, before any of it is read.
    fn expect_values_up_to(&self, bytes: usize) {
        // Relaxed: a bound, as `Shared::value_bound` reads it.
        self.shared
            .expected_max
            .fetch_max(bytes.max(1), Ordering::Relaxed);
    }

    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        let replies = self.run(keys, Op::Exists, Some(cancel))?;
        replies
            .into_iter()
            .map(|v| match v {
                Value::Int(n) => Ok(n > 0),
                other => Err(TierError::Unavailable(format!(
                    "EXISTS answered {}",
                    resp::kind(&other)
                ))),
            })
            .collect()
    }

    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        let replies = self.run(keys, Op::Get, Some(cancel))?;
        replies
            .into_iter()
            .map(|v| match v {
                Value::BulkString(b) => Ok(Some(b)),
                Value::Nil => Ok(None),
                other => Err(TierError::Unavailable(format!(
                    "GET answered {}",
                    resp::kind(&other)
                ))),
            })
            .collect()
    }

    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        if let Some((k, v)) = chunks
            .iter()
            .find(|(_, v)| v.len() > self.config.max_value_bytes)
        {
            return Err(TierError::Refused(format!(
                "value of {k} is {} bytes, over max_value_bytes {}",
                v.len(),
                self.config.max_value_bytes
            )));
        }
        let keys: Vec<ChunkKey> = chunks.iter().map(|(k, _)| *k).collect();
        let replies = self.run(&keys, Op::Put(chunks), None)?;
        for v in replies {
            match v {
                Value::Okay => {}
                Value::SimpleString(s) if s == "OK" => {}
                other => {
                    return Err(TierError::Unavailable(format!(
                        "SET answered {}",
                        resp::kind(&other)
                    )))
                }
            }
        }
        Ok(())
    }
}

/// Editing a stored value in place: what a repair tool or the test kit's fault injection
/// (`kvsched_testkit::FaultyTier`) uses to change a value at rest exactly as real damage would.
impl RedisTier {
    /// Reads `key`'s value, lets `edit` change it, and writes it back if it did (`GET`, then
    /// `SET`): not atomic, so a writer storing the same key in between has its value edited
    /// instead, and one storing it just after undoes the edit. Returns what `edit` returned,
    /// or `false` when no value is held.
    pub fn edit_stored(
        &self,
        key: ChunkKey,
        edit: impl FnOnce(&mut Vec<u8>) -> bool,
    ) -> Result<bool, TierError> {
        let Some(Some(mut v)) = self.get(&[key], &CancelToken::new())?.into_iter().next() else {
            return Ok(false);
        };
        if !edit(&mut v) {
            return Ok(false);
        }
        self.put(&[(key, v)])?;
        Ok(true)
    }

    /// Deletes `key`'s value (`DEL`); `false` if none was held.
    pub fn remove(&self, key: ChunkKey) -> Result<bool, TierError> {
        let replies = self.run(&[key], Op::Del, None)?;
        match replies.first() {
            Some(Value::Int(n)) => Ok(*n > 0),
            other => Err(TierError::Unavailable(format!(
                "DEL answered {}",
                other.map_or("nothing", resp::kind)
            ))),
        }
    }
}

#[cfg(test)]
#[path = "tier_tests.rs"]
mod tests;
