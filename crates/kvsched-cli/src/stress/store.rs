//! `--store`: where a stress run's KV chunks live, and the tier each run opens on it.
//!
//! * `sim` (the default): a [`SimTier`] — chunks in memory behind the simulated latency and
//!   transfer damage (`--load-latency-us`, `--failure-rate`), warmed before each request with
//!   the reference chunks of its `--hit-ratio` share;
//! * `memory`: a [`MemoryTier`] of `--store-capacity` bytes, empty at the start of each run;
//! * `disk=DIR`: a [`DiskTier`] in `DIR/kvsched` (and `DIR/mutex` for the baseline, so neither
//!   loads what the other saved), bounded by `--store-capacity`; it starts with what an
//!   earlier run on the same directory saved;
//! * `redis` (feature `redis`): a private `redis-server` (or with `--redis-cluster N` a
//!   cluster of N) started on free loopback ports for the whole invocation, owned and stopped
//!   at exit, emptied (`FLUSHALL`) before each run; `--redis-maxmemory` caps it (LRU);
//! * `redis://HOST:PORT[,…]` (feature `redis`): the user's server or cluster, keys under a
//!   tag per scheduler (`kvsched-stress-kvsched`, `kvsched-stress-mutex`), never flushed.
//!
//! With `--faults corrupt=R,truncate=R,evict=R,slow=R` a memory, disk or private Redis store
//! is wrapped in a [`FaultyTier`]: damage at rest, deletion between lookup and load, delays
//! past the load deadline. A user's server (`redis://…`) is refused: they would rewrite its
//! values.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Serialize, Serializer};

use super::config::{StressConfig, StressError};
use kvsched::kv::{DiskConfig, DiskTier, MemoryTier, Tier};
use kvsched_testkit::{FaultConfig, FaultCounts, FaultTarget, FaultyTier, SimTier, SimTierConfig};

/// `--store`.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// The simulated tier (the default).
    Sim,
    /// An in-process memory tier.
    Memory,
    /// A disk tier under this directory.
    Disk(PathBuf),
    /// A private `redis-server` this process starts and stops.
    Redis,
    /// The user's Redis server or cluster.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    RedisUrl {
        /// The URL as given (it may hold credentials: never printed).
        url: String,
        /// The URL with its credentials redacted, for reports.
        shown: String,
    },
}

impl StoreSpec {
    /// Whether the store is real (not the simulated one).
    pub(crate) fn is_real(&self) -> bool {
        *self != StoreSpec::Sim
    }

    /// Whether `--faults corrupt/truncate/evict/slow` can act on it (every real store; a
    /// user's Redis server is refused separately, see `StressConfig::check_store`).
    pub(super) fn takes_faults(&self) -> bool {
        self.is_real()
    }

    /// Whether it is Redis.
    pub(crate) fn is_redis(&self) -> bool {
        matches!(self, StoreSpec::Redis | StoreSpec::RedisUrl { .. })
    }

    /// The store as written on the command line (credentials redacted).
    pub(crate) fn shown(&self) -> String {
        match self {
            StoreSpec::Sim => "sim".to_owned(),
            StoreSpec::Memory => "memory".to_owned(),
            StoreSpec::Disk(d) => format!("disk={}", shown_path(d)),
            StoreSpec::Redis => "redis".to_owned(),
            StoreSpec::RedisUrl { shown, .. } => shown.clone(),
        }
    }
}

/// A path as the reports write it: line breaks and other control characters escaped
/// (`\n`, `\u{1b}`), so that a path cannot split a report's line or forge one.
pub(crate) fn shown_path(p: &Path) -> String {
    kvsched_replay::one_line(&p.display().to_string())
}

impl fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown())
    }
}

impl Serialize for StoreSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.shown())
    }
}

const EXPECTED: &str = "sim, memory, disk=DIR, redis or redis://HOST:PORT[,…]";

#[cfg(not(feature = "redis"))]
const NO_REDIS: &str = "this kvsched was built without the Redis tier (--no-default-features): build it with its default features, or with `--features redis`";

impl FromStr for StoreSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sim" => return Ok(StoreSpec::Sim),
            "memory" => return Ok(StoreSpec::Memory),
            _ => {}
        }
        if let Some(dir) = s.strip_prefix("disk=") {
            if dir.is_empty() {
                return Err("disk=DIR: the path is empty (no directory given)".to_owned());
            }
            return Ok(StoreSpec::Disk(PathBuf::from(dir)));
        }
        if s == "disk" {
            return Err("disk needs a directory: disk=DIR".to_owned());
        }
        let redis = s == "redis" || s.starts_with("redis://") || s.starts_with("rediss://");
        if !redis {
            // A value that is not a plain word may be a mistyped URL holding a password:
            // it is not repeated.
            let word = s.len() <= 32
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            let lower = s.trim_start().to_ascii_lowercase();
            let hint = if lower.starts_with("redis:") || lower.starts_with("rediss:") {
                " (a Redis URL starts with redis:// or rediss://, in lower case, without \
                 leading spaces)"
            } else {
                ""
            };
            return Err(if word {
                format!("unknown store `{s}` (expected {EXPECTED})")
            } else {
                format!("unknown store (expected {EXPECTED}){hint}")
            });
        }
        parse_redis(s)
    }
}

/// The `--store` value parser. clap's own error for a value parser repeats the raw value
/// (`invalid value '…'`), which for a mistyped Redis URL would print its password: this
/// one names the flag and says what is wrong, and never repeats the value.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoreParser;

impl clap::builder::TypedValueParser for StoreParser {
    type Value = StoreSpec;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<StoreSpec, clap::Error> {
        let flag = arg.map_or_else(|| "--store".to_owned(), |a| a.to_string());
        let fail = |problem: &str| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '{flag}': {problem}\n"),
            )
            .with_cmd(cmd)
        };
        let s = value.to_str().ok_or_else(|| fail("not UTF-8"))?;
        StoreSpec::from_str(s).map_err(|e| fail(&e))
    }
}

#[cfg(not(feature = "redis"))]
fn parse_redis(_: &str) -> Result<StoreSpec, String> {
    Err(NO_REDIS.to_owned())
}

#[cfg(feature = "redis")]
fn parse_redis(s: &str) -> Result<StoreSpec, String> {
    use kvsched::kv::redis::RedisConfig;
    if s == "redis" {
        return Ok(StoreSpec::Redis);
    }
    redis_url_shape(s)?;
    let cfg = RedisConfig::from_url(s).map_err(|e| format!("bad Redis URL: {e}"))?;
    Ok(StoreSpec::RedisUrl {
        url: s.to_owned(),
        shown: cfg.redacted_url(),
    })
}

/// What `RedisConfig::from_url` would take wrongly or name badly in `s`
/// (`redis://HOST:PORT[,…]`): a `tag` in the query, which the run would drop (it keys each
/// scheduler's values under its own tag), and an empty host, named by its place in the list.
/// Never repeats the URL, which may hold a password.
#[cfg(feature = "redis")]
fn redis_url_shape(s: &str) -> Result<(), String> {
    let rest = s.split_once("://").map_or(s, |(_, r)| r);
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    if query
        .split('&')
        .any(|pair| pair.split('=').next() == Some("tag"))
    {
        return Err(
            "a Redis URL's tag (`?tag=…`) is not used: kvsched stress keeps each scheduler's values under its own tag (kvsched-stress-kvsched, kvsched-stress-mutex)"
                .to_owned(),
        );
    }
    for (i, host) in rest.split(',').enumerate() {
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        let host = host.split(['/', ':']).next().unwrap_or("");
        if host.is_empty() {
            return Err(format!("bad Redis URL: host {}: empty host", i + 1));
        }
    }
    Ok(())
}

/// The stores of one invocation: what lives across its runs (a private Redis server).
pub(super) struct Stores {
    spec: StoreSpec,
    #[cfg(feature = "redis")]
    server: Option<redis_store::Server>,
}

/// The tier one run opened, and the handles its report reads.
pub(super) struct Opened {
    /// The tier the connector uses.
    pub(super) tier: Arc<dyn Tier>,
    /// The simulated tier, for `sim`.
    pub(super) sim: Option<Arc<SimTier>>,
    /// The faults the [`FaultyTier`] injected, with store faults.
    faults: Option<Box<dyn Fn() -> FaultCounts + Send + Sync>>,
    /// What the store says of itself so far (its connections, a full file system).
    probe: Option<Box<dyn Fn() -> StoreProbe + Send + Sync>>,
}

/// What a store says of itself, for the report.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StoreProbe {
    /// Redis: `(reconnects, connect_failures)`, see [`Opened::connections`].
    connections: Option<(u64, u64)>,
    /// Redis: the tier's traffic.
    redis: Option<super::redis_traffic::RedisTraffic>,
    /// Disk: the capacity in force once the file system was found full (the bytes held
    /// then), see [`kvsched::kv::DiskCounts::full_writes`].
    full_at: Option<u64>,
}

impl Opened {
    /// What the store faults injected so far (all 0 without them).
    pub(super) fn fault_counts(&self) -> FaultCounts {
        self.faults.as_ref().map(|f| f()).unwrap_or_default()
    }

    /// A Redis store's `(reconnects, connect_failures)` so far: successful connections
    /// beyond those open now (each one lost and made again), and failed attempts. `None`
    /// for other stores.
    pub(super) fn connections(&self) -> Option<(u64, u64)> {
        self.probe.as_ref().and_then(|f| f().connections)
    }

    /// A Redis store's traffic so far; `None` for other stores.
    pub(super) fn redis_traffic(&self) -> Option<super::redis_traffic::RedisTraffic> {
        self.probe.as_ref().and_then(|f| f().redis)
    }

    /// A disk store's capacity in force once its file system was found full (the bytes it
    /// held then); `None` if it never was, or for other stores.
    pub(super) fn full_at(&self) -> Option<u64> {
        self.probe.as_ref().and_then(|f| f().full_at)
    }
}

/// Checks that a user's Redis store (`--store redis://…`) answers: what `--engines` does
/// before starting engines on it, so that a wrong password or a server that is not there is
/// one line naming `--store`, not N engines without a report. `Ok` for every other store.
pub(super) fn check_user_store(cfg: &StressConfig) -> Result<(), StressError> {
    #[cfg(feature = "redis")]
    if let StoreSpec::RedisUrl { url, shown } = &cfg.store {
        use kvsched::kv::redis::{RedisConfig, RedisTier};
        let config =
            RedisConfig::from_url(url).map_err(|e| store_error(format!("{shown}: {e}")))?;
        let tier = RedisTier::new(config).map_err(|e| store_error(format!("{shown}: {e}")))?;
        tier.check()
            .map_err(|e| store_error(format!("cannot reach {shown}: {e}")))?;
    }
    let _ = cfg;
    Ok(())
}

fn store_error(problem: String) -> StressError {
    StressError::Config {
        flag: "--store",
        problem,
    }
}

impl Stores {
    /// Starts what the invocation's store needs before the first run (a private Redis).
    pub(super) fn start(cfg: &StressConfig) -> Result<Stores, StressError> {
        Ok(Stores {
            spec: cfg.store.clone(),
            #[cfg(feature = "redis")]
            server: redis_store::start(cfg)?,
        })
    }

    /// Opens the store for one run of scheduler `who` (`kvsched` or `mutex`).
    /// `max_chunk`: the largest chunk the run's layout can produce, the largest value the disk
    /// store accepts and reads back. (A Redis store keeps the bound its URL sets, 512 MiB by
    /// default, on what it stores, and bounds replies by the largest chunk as well, which the
    /// connector tells it: `Tier::expect_values_up_to`.)
    pub(super) fn open(
        &self,
        cfg: &StressConfig,
        who: &str,
        max_chunk: usize,
    ) -> Result<Opened, StressError> {
        match &self.spec {
            StoreSpec::Sim => {
                let sim = Arc::new(SimTier::new(sim_tier_config(cfg)));
                Ok(Opened {
                    tier: sim.clone(),
                    sim: Some(sim),
                    faults: None,
                    probe: None,
                })
            }
            StoreSpec::Memory => Ok(with_faults(
                cfg,
                MemoryTier::new(cfg.store_capacity, 16),
                None,
            )?),
            StoreSpec::Disk(dir) => {
                let dir = dir.join(who);
                std::fs::create_dir_all(&dir)
                    .map_err(|e| store_error(format!("cannot create {}: {e}", dir.display())))?;
                let disk = DiskTier::open(
                    &dir,
                    DiskConfig::default()
                        .with_capacity_bytes(cfg.store_capacity)
                        .with_max_value_bytes(max_chunk as u64)
                        .with_fsync(false),
                )
                .map_err(|e| store_error(format!("cannot open {}: {e}", dir.display())))?;
                Ok(with_faults(cfg, disk, Some(disk_probe))?)
            }
            #[cfg(feature = "redis")]
            StoreSpec::Redis | StoreSpec::RedisUrl { .. } => {
                redis_store::open(cfg, &self.spec, self.server.as_ref(), who)
            }
            #[cfg(not(feature = "redis"))]
            StoreSpec::Redis | StoreSpec::RedisUrl { .. } => Err(store_error(NO_REDIS.to_owned())),
        }
    }
}

/// How a store says what it says of itself, see [`StoreProbe`].
type Probe<T> = fn(&T) -> StoreProbe;

/// `inner`, wrapped in a [`FaultyTier`] when `--faults` names a store fault; `probe` reads
/// what the store says of itself, for a store that says something.
fn with_faults<T: FaultTarget>(
    cfg: &StressConfig,
    inner: T,
    probe: Option<Probe<T>>,
) -> Result<Opened, StressError> {
    let f = cfg.fault_rates();
    if !f.has_store_faults() {
        let inner = Arc::new(inner);
        let count = Arc::clone(&inner);
        return Ok(Opened {
            tier: inner,
            sim: None,
            faults: None,
            probe: probe
                .map(|c| Box::new(move || c(&count)) as Box<dyn Fn() -> StoreProbe + Send + Sync>),
        });
    }
    let faulty = Arc::new(
        FaultyTier::new(
            inner,
            FaultConfig {
                seed: cfg.seed ^ 0x57_0BE5_FA17,
                corrupt: f.corrupt,
                truncate: f.truncate,
                evict: f.evict,
                slow: f.slow,
                slow_for: cfg.slow_for(),
            },
        )
        .map_err(|e| StressError::Config {
            flag: "--faults",
            problem: e.to_string(),
        })?,
    );
    let counts = faulty.clone();
    let count = faulty.clone();
    Ok(Opened {
        tier: faulty,
        sim: None,
        faults: Some(Box::new(move || counts.counts())),
        probe: probe.map(|c| {
            Box::new(move || c(count.inner())) as Box<dyn Fn() -> StoreProbe + Send + Sync>
        }),
    })
}

/// A disk store's capacity once its file system was found full.
fn disk_probe(disk: &DiskTier) -> StoreProbe {
    let s = disk.counts();
    StoreProbe {
        connections: None,
        redis: None,
        full_at: (s.full_writes > 0).then_some(s.capacity_bytes),
    }
}

/// The simulated tier of `cfg`: its latency, transfer damage and capacity.
fn sim_tier_config(cfg: &StressConfig) -> SimTierConfig {
    SimTierConfig {
        seed: cfg.seed ^ 0x5eed_c0de,
        capacity_bytes: cfg.store_capacity,
        failure_rate: cfg.failure_rate,
        // Each chunk on its own (`--failure-rate`), however many a load reads.
        max_invalid_per_failure: u32::MAX,
        latency_min: Duration::from_micros(cfg.load_latency_us.min_us),
        latency_max: Duration::from_micros(cfg.load_latency_us.max_us),
        panic_rate: 0.0,
        hang_rate: 0.0,
        ..SimTierConfig::default()
    }
}

#[cfg(feature = "redis")]
mod redis_store {
    //! The Redis stores: a private server (or cluster) for `--store redis`, the user's for
    //! `--store redis://…`.

    use super::{store_error, Opened, StoreProbe, StoreSpec};
    use crate::stress::config::{StressConfig, StressError};
    use crate::stress::redis_traffic::RedisTraffic;
    use kvsched::kv::redis::{RedisConfig, RedisTier};
    use kvsched_testkit::redis::{LocalCluster, LocalRedis, LocalRedisOptions};

    /// A private server, stopped when dropped (and killed with this process).
    pub(super) enum Server {
        One(Box<LocalRedis>),
        Cluster(LocalCluster),
    }

    impl Server {
        fn url(&self) -> String {
            match self {
                Server::One(s) => s.url(),
                Server::Cluster(c) => c.url(),
            }
        }

        /// Empties every node, so each run starts as a memory store does.
        fn flush(&self) -> Result<(), StressError> {
            let nodes: Vec<&LocalRedis> = match self {
                Server::One(s) => vec![&**s],
                Server::Cluster(c) => c.nodes().iter().collect(),
            };
            for n in nodes {
                n.query(&["FLUSHALL"])
                    .map_err(|e| store_error(format!("redis FLUSHALL on {}: {e}", n.addr())))?;
            }
            Ok(())
        }
    }

    /// Starts the private server of `--store redis`, if that is the store.
    pub(super) fn start(cfg: &StressConfig) -> Result<Option<Server>, StressError> {
        if cfg.store != StoreSpec::Redis {
            return Ok(None);
        }
        let mut options = LocalRedisOptions::new();
        if let Some(m) = cfg.redis_maxmemory {
            options = options.maxmemory(m);
        }
        let server = match cfg.redis_cluster {
            Some(n) => LocalCluster::start_with(n, options).map(Server::Cluster),
            None => LocalRedis::start(options).map(|s| Server::One(Box::new(s))),
        };
        server
            .map(Some)
            .map_err(|e| store_error(format!("redis: cannot start a private server: {e}")))
    }

    /// Opens the Redis tier for one run of `who` (with the store faults of `cfg`).
    pub(super) fn open(
        cfg: &StressConfig,
        spec: &StoreSpec,
        server: Option<&Server>,
        who: &str,
    ) -> Result<Opened, StressError> {
        let (url, shown, tag) = match (spec, server) {
            (StoreSpec::RedisUrl { url, shown }, _) => {
                (url.clone(), shown.clone(), format!("kvsched-stress-{who}"))
            }
            (_, Some(s)) => {
                s.flush()?;
                (s.url(), s.url(), format!("kvsched-stress-{who}"))
            }
            _ => return Err(store_error("redis: no server".to_owned())),
        };
        // The URL's `max_value_bytes` (512 MiB when it sets none) bounds what is stored and,
        // with the largest chunk the connector says it stores, what a reply may hold.
        let config = RedisConfig::from_url(&url)
            .map_err(|e| store_error(format!("{shown}: {e}")))?
            .tag(tag);
        let tier = RedisTier::new(config).map_err(|e| store_error(format!("{shown}: {e}")))?;
        tier.check()
            .map_err(|e| store_error(format!("cannot reach {shown}: {e}")))?;
        super::with_faults(cfg, tier, Some(connections))
    }

    /// Connections lost and made again (successful connections beyond those open now), and
    /// failed attempts.
    fn connections(tier: &RedisTier) -> StoreProbe {
        let s = tier.counts();
        let made = s.connects.saturating_sub(s.connect_failures);
        StoreProbe {
            connections: Some((made.saturating_sub(s.connections), s.connect_failures)),
            redis: Some(RedisTraffic {
                round_trips: s.round_trips,
                redirects: s.redirects,
                slot_refreshes: s.slot_refreshes,
                timeouts: s.timeouts,
                protocol_errors: s.protocol_errors,
            }),
            full_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_values_parse_or_name_the_problem() {
        assert_eq!("sim".parse::<StoreSpec>(), Ok(StoreSpec::Sim));
        assert_eq!("memory".parse::<StoreSpec>(), Ok(StoreSpec::Memory));
        assert_eq!(
            "disk=/tmp/x".parse::<StoreSpec>(),
            Ok(StoreSpec::Disk(PathBuf::from("/tmp/x")))
        );
        for (bad, needle) in [
            ("disk=", "empty"),
            ("disk", "disk=DIR"),
            ("ssd", "unknown store `ssd`"),
            ("", "unknown store"),
        ] {
            let e = bad.parse::<StoreSpec>().expect_err(bad);
            assert!(e.contains(needle), "{bad}: {e}");
        }
        #[cfg(feature = "redis")]
        {
            let s: StoreSpec = "redis://u:secret@127.0.0.1:1".parse().expect("url");
            assert!(!s.shown().contains("secret"), "{}", s.shown());
            assert!(!format!("{s:?}").contains("secret"));
            assert!("redis://".parse::<StoreSpec>().is_err());
            for (bad, needle) in [
                ("redis://", "host 1: empty host"),
                ("redis://h:1,:2", "host 2: empty host"),
                ("redis://h:1?tag=mine", "tag (`?tag=…`) is not used"),
                ("redis://h:1?pool=2&tag=x", "tag (`?tag=…`) is not used"),
            ] {
                let e = bad.parse::<StoreSpec>().expect_err(bad);
                assert!(e.contains(needle), "{bad}: {e}");
            }
        }
        #[cfg(not(feature = "redis"))]
        {
            let e = "redis".parse::<StoreSpec>().expect_err("no redis");
            assert!(e.contains("--features redis"), "{e}");
        }
    }
}
