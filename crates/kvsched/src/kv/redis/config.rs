//! [`RedisConfig`]: where the servers are, how to authenticate, the key namespace, and the
//! pool, timeout and backoff settings; URL parsing and credential redaction.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::url::{parse_hosts, percent_decode};

/// Redis's default port.
pub(super) const DEFAULT_PORT: u16 = 6379;
/// The longest layout tag accepted, in bytes.
pub const MAX_TAG_LEN: usize = 128;
/// The most seed nodes a URL or [`RedisConfig::cluster`] may name.
pub const MAX_SEEDS: usize = 64;

/// The query keys a URL may carry.
const QUERY_KEYS: [&str; 9] = [
    "tag",
    "cluster",
    "pool",
    "timeout_ms",
    "connect_timeout_ms",
    "checkout_timeout_ms",
    "ttl_ms",
    "max_value_bytes",
    "ca",
];

/// Why a [`RedisConfig`] was refused. The text names the field and the problem and never
/// repeats a credential (nor, for URL parts, the value: a mistyped URL can put a password
/// where a host or port should be).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The URL does not start with `redis://` or `rediss://`.
    #[error("url: the scheme must be redis:// or rediss://")]
    Scheme,
    /// A part of the URL is malformed (the text names which and why).
    #[error("url: {0}")]
    Url(&'static str),
    /// A host entry (1-based) of the URL or of [`RedisConfig::cluster`] is malformed.
    #[error("url: seed {index}: {problem}")]
    Seed {
        /// 1-based position in the host list.
        index: usize,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A query key of the URL is unknown or its value malformed.
    #[error("url: query key {key}: {problem}")]
    Query {
        /// A known key's name, or `#n` (the key's 1-based position in the query) for an
        /// unknown one: what the parser does not recognise is never repeated.
        key: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A setting is out of range.
    #[error("{field}: {problem}")]
    Setting {
        /// The setting's name.
        field: &'static str,
        /// What is wrong.
        problem: &'static str,
    },
    /// The CA certificate file could not be read or holds no certificate.
    #[error("ca_cert {path}: {problem}")]
    CaCert {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
}

/// One server address.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct NodeAddr {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A string that prints as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How to reach a Redis deployment (one server or a cluster) and how the tier behaves.
///
/// # URL
///
/// ```text
/// redis://[user:password@]host[:port][,host[:port]...][/db][?key=value&...]
/// rediss://...                        TLS (rustls; `ca` names a PEM file of trusted roots)
/// ```
///
/// One host is a standalone server unless `cluster=yes`; several hosts are the seed nodes of
/// a Redis Cluster. `user:password` and `:password` (the `default` user) are
/// percent-decoded; the port defaults to 6379. Query keys: `tag`, `cluster`, `pool`,
/// `timeout_ms`, `connect_timeout_ms`, `checkout_timeout_ms`, `ttl_ms`, `max_value_bytes`,
/// `ca`.
///
/// # Credentials
///
/// The password and the user name never appear in `Debug` output
/// ([`redacted_url`](Self::redacted_url) shows them as `***`), in a [`ConfigError`], or in
/// the [`TierError`](crate::kv::TierError)s of a tier built from the config. This holds by
/// position, not by searching text: the URL parser never repeats a part of the URL it could
/// not read (a query key it does not know is named by its position), the tier formats no
/// credential into any text, and a refused `AUTH` is reported by its error code alone (the
/// reply to the command that carried the credentials is not repeated).
///
/// They are sent (`AUTH`) to every node the tier connects to: the seeds, and in a cluster
/// every node a slot map or a `MOVED`/`ASK` redirect names, as any cluster client does. So a
/// server able to forge a redirect learns them; over a network you do not trust, use
/// `rediss://` with a CA, which every node must then prove it holds.
///
/// Built from a URL ([`from_url`](Self::from_url)) or from seed addresses
/// ([`cluster`](Self::cluster), [`standalone`](Self::standalone)), then adjusted with the
/// builder methods; [`RedisTier::new`](super::RedisTier::new) validates it. Defaults: tag
/// `default`, 4 connections per node, connect timeout 1 s, call timeout 2 s, checkout
/// timeout 1 s, reconnect backoff from 50 ms doubling to 2 s, no TTL, values up to 512 MiB,
/// 5 redirects per key.
///
/// `Debug` shows everything but the credentials.
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) tls: bool,
    pub(crate) seeds: Vec<NodeAddr>,
    pub(crate) cluster: bool,
    pub(crate) username: Option<Secret>,
    pub(crate) password: Option<Secret>,
    pub(crate) db: i64,
    pub(crate) tag: String,
    pub(crate) pool_size: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) io_timeout: Duration,
    pub(crate) checkout_timeout: Duration,
    pub(crate) backoff_initial: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) ttl: Option<Duration>,
    pub(crate) ca_cert: Option<PathBuf>,
    pub(crate) max_value_bytes: usize,
    pub(crate) max_redirects: u32,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("cluster", &self.cluster)
            .field("tag", &self.tag)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("io_timeout", &self.io_timeout)
            .field("checkout_timeout", &self.checkout_timeout)
            .field("backoff_initial", &self.backoff_initial)
            .field("backoff_max", &self.backoff_max)
            .field("ttl", &self.ttl)
            .field("ca_cert", &self.ca_cert)
            .field("max_value_bytes", &self.max_value_bytes)
            .field("max_redirects", &self.max_redirects)
            .finish()
    }
}

impl RedisConfig {
    fn with_seeds(seeds: Vec<NodeAddr>, tls: bool, cluster: bool) -> RedisConfig {
        RedisConfig {
            tls,
            seeds,
            cluster,
            username: None,
            password: None,
            db: 0,
            tag: "default".to_owned(),
            pool_size: 4,
            connect_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(2),
            checkout_timeout: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            ttl: None,
            ca_cert: None,
            max_value_bytes: 512 << 20,
            max_redirects: 5,
        }
    }

    /// Parses a `redis://` or `rediss://` URL (see [`RedisConfig`] for the grammar and query
    /// keys). Several hosts, or `cluster=yes`, make a cluster configuration. A query value
    /// out of range is a [`ConfigError::Query`] naming its key (`timeout_ms`, not the
    /// setting `io_timeout` that `validate` would name).
    pub fn from_url(url: &str) -> Result<RedisConfig, ConfigError> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("redis://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("rediss://") {
            (true, r)
        } else {
            return Err(ConfigError::Scheme);
        };
        // Userinfo ends at the last '@' before the first '/': a password holding an unencoded
        // '@', '?', '&' or '=' stays whole, and nothing after the split holds password bytes
        // (a '/' or '@' in a query value must be percent-encoded).
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let (userinfo, rest) = match rest[..authority_end].rfind('@') {
            Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
            None => (None, rest),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (hosts, db) = match rest.split_once('/') {
            Some((h, d)) => (h, Some(d)),
            None => (rest, None),
        };
        let seeds = parse_hosts(hosts.split(','))?;
        let cluster = seeds.len() > 1;
        let mut cfg = RedisConfig::with_seeds(seeds, tls, cluster);
        if let Some(ui) = userinfo {
            let (user, pass) = match ui.split_once(':') {
                Some((u, p)) => (u, p),
                None => {
                    return Err(ConfigError::Url(
                        "a user name needs a password (user:password@)",
                    ))
                }
            };
            let user =
                percent_decode(user).ok_or(ConfigError::Url("user name: bad percent-encoding"))?;
            let pass =
                percent_decode(pass).ok_or(ConfigError::Url("password: bad percent-encoding"))?;
            if pass.is_empty() {
                return Err(ConfigError::Url("empty password"));
            }
            cfg.username = (!user.is_empty()).then_some(Secret(user));
            cfg.password = Some(Secret(pass));
        }
        if let Some(d) = db.filter(|d| !d.is_empty()) {
            cfg.db = d
                .parse::<u8>()
                .map(i64::from)
                .map_err(|_| ConfigError::Url("database: not a number in 0..=255"))?;
        }
        if let Some(q) = query.filter(|q| !q.is_empty()) {
            for (n, pair) in q.split('&').enumerate() {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                cfg = cfg.apply_query(n + 1, k, v)?;
            }
        }
        Ok(cfg)
    }

    /// Applies the `n`-th (1-based) query pair. An error names a known key by its name and
    /// an unknown one by its position only: text the parser does not recognise may be a
    /// mistyped credential, so it is never repeated.
    fn apply_query(mut self, n: usize, key: &str, value: &str) -> Result<RedisConfig, ConfigError> {
        let name = QUERY_KEYS
            .iter()
            .find(|&&k| k == key)
            .map_or_else(|| format!("#{n}"), |k| (*k).to_owned());
        let err = |problem| ConfigError::Query {
            key: name.clone(),
            problem,
        };
        let value = percent_decode(value).ok_or_else(|| err("bad percent-encoding"))?;
        let ms = |v: &str| {
            v.parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| err("not a number of milliseconds"))
        };
        match key {
            "tag" => self.tag = value,
            "cluster" => {
                self.cluster = match value.as_str() {
                    "yes" | "true" | "1" => true,
                    "no" | "false" | "0" => false,
                    _ => return Err(err("not one of yes, no, true, false, 1, 0")),
                }
            }
            "pool" => self.pool_size = value.parse().map_err(|_| err("not a number"))?,
            "timeout_ms" => self.io_timeout = ms(&value)?,
            "connect_timeout_ms" => self.connect_timeout = ms(&value)?,
            "checkout_timeout_ms" => self.checkout_timeout = ms(&value)?,
            "ttl_ms" => self.ttl = Some(ms(&value)?),
            "max_value_bytes" => {
                self.max_value_bytes = value.parse().map_err(|_| err("not a number of bytes"))?
            }
            "ca" => self.ca_cert = Some(PathBuf::from(value)),
            _ => {
                return Err(err(
                    "unknown key (known: tag, cluster, pool, timeout_ms, connect_timeout_ms, \
                     checkout_timeout_ms, ttl_ms, max_value_bytes, ca)",
                ))
            }
        }
        // A value out of range is named by the key the user typed, not by the setting
        // (`timeout_ms`, not `io_timeout`): the setting's own check, on this key's setting.
        let setting = match key {
            "pool" => "pool_size",
            "timeout_ms" => "io_timeout",
            "ca" => "ca_cert",
            other => other.strip_suffix("_ms").unwrap_or(other),
        };
        match self.validate() {
            Err(ConfigError::Setting { field, problem }) if field == setting => Err(err(problem)),
            _ => Ok(self),
        }
    }

    /// A standalone server at `host:port` (plain TCP; see [`tls`](Self::tls)).
    pub fn standalone(addr: &str) -> Result<RedisConfig, ConfigError> {
        Ok(RedisConfig::with_seeds(
            parse_hosts(std::iter::once(addr))?,
            false,
            false,
        ))
    }

    /// A Redis Cluster reached through these seed nodes (`host:port` each; plain TCP). Any one
    /// reachable seed is enough: the tier learns the rest from `CLUSTER SLOTS`.
    pub fn cluster<S: AsRef<str>>(seeds: &[S]) -> Result<RedisConfig, ConfigError> {
        Ok(RedisConfig::with_seeds(
            parse_hosts(seeds.iter().map(|s| s.as_ref()))?,
            false,
            true,
        ))
    }

    /// Sets the layout/model tag that namespaces every key (`kvsched:{tag}:{key hex}`, written
    /// without the braces). Two tags never share a key. 1 to [`MAX_TAG_LEN`] bytes of
    /// printable ASCII without spaces, `{` or `}` (braces would make Redis Cluster hash the
    /// tag alone and put every chunk of a model on one node).
    pub fn tag(mut self, tag: impl Into<String>) -> RedisConfig {
        self.tag = tag.into();
        self
    }

    /// Uses TLS (as `rediss://` does).
    pub fn tls(mut self, on: bool) -> RedisConfig {
        self.tls = on;
        self
    }

    /// Trusts the certificates in this PEM file (instead of the system's roots) for TLS; for
    /// self-signed or private-CA servers. Read when the tier is built.
    pub fn ca_cert(mut self, path: impl Into<PathBuf>) -> RedisConfig {
        self.ca_cert = Some(path.into());
        self
    }

    /// Authenticates as `user` (an ACL user; `None`: the `default` user) with `password`.
    pub fn credentials(mut self, user: Option<&str>, password: &str) -> RedisConfig {
        self.username = user.map(|u| Secret(u.to_owned()));
        self.password = Some(Secret(password.to_owned()));
        self
    }

    /// At most `n` connections per node (1..=1024). A call that finds all `n` busy waits up
    /// to the checkout timeout.
    pub fn pool_size(mut self, n: usize) -> RedisConfig {
        self.pool_size = n;
        self
    }

    /// How long a connection attempt (TCP, TLS handshake, AUTH) may take.
    pub fn connect_timeout(mut self, d: Duration) -> RedisConfig {
        self.connect_timeout = d;
        self
    }

    /// How long a whole call may take: its deadline, counted from its start, bounds every
    /// checkout, host name lookup, connect, write and read of every pipeline it sends (redirects and a resend
    /// on a stale connection included). A call past it fails with
    /// [`TierError::Timeout`](crate::kv::TierError::Timeout), drops the connection it was
    /// using and marks the node down. A server trickling a reply byte by byte does not
    /// extend it.
    pub fn io_timeout(mut self, d: Duration) -> RedisConfig {
        self.io_timeout = d;
        self
    }

    /// How long a call waits for a free connection when the pool is at its size.
    pub fn checkout_timeout(mut self, d: Duration) -> RedisConfig {
        self.checkout_timeout = d;
        self
    }

    /// Reconnect backoff after a node fails: `initial`, doubling per consecutive failure, at
    /// most `max`. While a node is backing off, calls that need it fail at once with
    /// [`TierError::Unavailable`](crate::kv::TierError::Unavailable).
    pub fn backoff(mut self, initial: Duration, max: Duration) -> RedisConfig {
        self.backoff_initial = initial;
        self.backoff_max = max;
        self
    }

    /// Expires every value `ttl` after its `put` (`None`: values live until evicted).
    pub fn ttl(mut self, ttl: Option<Duration>) -> RedisConfig {
        self.ttl = ttl;
        self
    }

    /// Refuses (with [`TierError::Refused`](crate::kv::TierError::Refused)) values longer
    /// than `n` bytes (1..=512 MiB, Redis's largest string). Replies are bounded by it too:
    /// a bulk string longer than `n` is a protocol error (the connection is dropped), so
    /// memory a hostile server can make a call hold is bounded by the values it asked for.
    pub fn max_value_bytes(mut self, n: usize) -> RedisConfig {
        self.max_value_bytes = n;
        self
    }

    /// Follows at most `n` cluster redirects (MOVED/ASK) per key per call (1..=16).
    pub fn max_redirects(mut self, n: u32) -> RedisConfig {
        self.max_redirects = n;
        self
    }

    /// Whether this is a cluster configuration.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The layout tag.
    pub fn layout_tag(&self) -> &str {
        &self.tag
    }

    /// The configuration as a URL with the user name and password shown as `***`.
    pub fn redacted_url(&self) -> String {
        let mut s = String::from(if self.tls { "rediss://" } else { "redis://" });
        match (&self.username, &self.password) {
            (Some(_), _) => s.push_str("***:***@"),
            (None, Some(_)) => s.push_str(":***@"),
            (None, None) => {}
        }
        let hosts: Vec<String> = self.seeds.iter().map(|a| a.to_string()).collect();
        s.push_str(&hosts.join(","));
        if self.db != 0 {
            s.push_str(&format!("/{}", self.db));
        }
        s
    }

    /// Checks every setting; the tier calls it.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let setting = |field, problem| Err(ConfigError::Setting { field, problem });
        if self.tag.is_empty() || self.tag.len() > MAX_TAG_LEN {
            return setting("tag", "must be 1 to 128 bytes");
        }
        if !self
            .tag
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return setting("tag", "only printable ASCII without spaces, '{' or '}'");
        }
        if self.pool_size == 0 || self.pool_size > 1024 {
            return setting("pool_size", "must be in 1..=1024");
        }
        for (field, d) in [
            ("connect_timeout", self.connect_timeout),
            ("io_timeout", self.io_timeout),
            ("checkout_timeout", self.checkout_timeout),
            ("backoff initial", self.backoff_initial),
        ] {
            if d.is_zero() || d > Duration::from_secs(3600) {
                return setting(field, "must be more than 0 and at most an hour");
            }
        }
        if self.backoff_max < self.backoff_initial || self.backoff_max > Duration::from_secs(3600) {
            return setting(
                "backoff max",
                "must be at least the initial backoff and at most an hour",
            );
        }
        if let Some(ttl) = self.ttl {
            if ttl < Duration::from_millis(1) || ttl.as_millis() > i64::MAX as u128 {
                return setting("ttl", "must be at least 1 ms");
            }
        }
        if self.max_value_bytes == 0 || self.max_value_bytes > 512 << 20 {
            return setting("max_value_bytes", "must be in 1..=512 MiB");
        }
        if self.max_redirects == 0 || self.max_redirects > 16 {
            return setting("max_redirects", "must be in 1..=16");
        }
        if self.cluster && self.db != 0 {
            return setting("db", "Redis Cluster has only database 0");
        }
        if !self.tls && self.ca_cert.is_some() {
            return setting("ca_cert", "set without TLS (use rediss:// or .tls(true))");
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
