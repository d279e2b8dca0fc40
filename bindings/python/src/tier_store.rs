//! [`Store`]: the kvsched tier under a `NativeTier` — memory, disk, or Redis / Redis Cluster —
//! opened from the Python arguments, with each tier's in-place edit and removal for the tests'
//! fault injection (damage at rest, eviction).

use std::path::Path;

use kvsched::sync::Arc;

use kvsched::connector::CancelToken;
use kvsched::kv::{ChunkKey, DiskConfig, DiskTier, MemoryTier, Tier, TierError};

/// Which tier, and how it was opened.
#[derive(Clone)]
pub(crate) enum Store {
    Memory(Arc<MemoryTier>),
    Disk(Arc<DiskTier>),
    #[cfg(feature = "redis")]
    Redis(Arc<kvsched::kv::redis::RedisTier>),
}

/// What the Python arguments ask for.
pub(crate) struct StoreArgs<'a> {
    pub kind: &'a str,
    pub capacity_bytes: u64,
    pub max_value_bytes: u64,
    pub path: Option<&'a Path>,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub url: Option<&'a str>,
}

/// A problem with the arguments: field and message.
pub(crate) type ArgError = (&'static str, String);

impl Store {
    /// Opens the tier `args` names.
    pub(crate) fn open(args: &StoreArgs<'_>) -> Result<Store, ArgError> {
        // An argument of another store is a mistake, not something to ignore.
        if args.path.is_some() && args.kind != "disk" {
            return Err((
                "path",
                format!("only for store=\"disk\", not {:?}", args.kind),
            ));
        }
        if args.url.is_some() && args.kind != "redis" {
            return Err((
                "url",
                format!("only for store=\"redis\", not {:?}", args.kind),
            ));
        }
        match args.kind {
            "memory" => Ok(Store::Memory(Arc::new(MemoryTier::new(
                args.capacity_bytes,
                1,
            )))),
            "disk" => {
                let path = args
                    .path
                    .ok_or(("path", "required for store=\"disk\"".to_owned()))?;
                let cfg = DiskConfig::default()
                    .with_capacity_bytes(args.capacity_bytes)
                    .with_max_value_bytes(args.max_value_bytes)
                    .with_fsync(false);
                DiskTier::open(path, cfg)
                    .map(|t| Store::Disk(Arc::new(t)))
                    .map_err(|e| ("path", e.to_string()))
            }
            "redis" => Self::open_redis(args),
            other => Err((
                "store",
                format!("unknown store {other:?}; expected \"memory\", \"disk\" or \"redis\""),
            )),
        }
    }

    #[cfg(feature = "redis")]
    fn open_redis(args: &StoreArgs<'_>) -> Result<Store, ArgError> {
        use kvsched::kv::redis::{RedisConfig, RedisTier};
        let url = args
            .url
            .ok_or(("url", "required for store=\"redis\"".to_owned()))?;
        // Values are chunks of `max_value_bytes`; one a little larger (another writer's: a
        // chunk with a MAC read without a key, another chunk format) is read past, never
        // kept, failing its checks, and leaves the connection and the node up; past four
        // chunks (at least 64 KiB) a value is refused unread, a protocol error.
        let chunk = usize::try_from(args.max_value_bytes).unwrap_or(usize::MAX);
        let ceiling = chunk.saturating_mul(4).clamp(64 << 10, 512 << 20);
        let cfg = RedisConfig::from_url(url)
            .map_err(url_error)?
            .max_value_bytes(ceiling);
        let tier = RedisTier::new(cfg).map_err(url_error)?;
        tier.expect_values_up_to(chunk);
        Ok(Store::Redis(Arc::new(tier)))
    }

    #[cfg(not(feature = "redis"))]
    fn open_redis(_: &StoreArgs<'_>) -> Result<Store, ArgError> {
        Err((
            "store",
            "this build of kvsched has no Redis tier (feature \"redis\")".to_owned(),
        ))
    }

    /// The tier as the jobs call it.
    pub(crate) fn tier(&self) -> Arc<dyn Tier> {
        match self {
            Store::Memory(t) => t.clone(),
            Store::Disk(t) => t.clone(),
            #[cfg(feature = "redis")]
            Store::Redis(t) => t.clone(),
        }
    }

    /// Whether other engines may write the same store (disk, Redis): then keys this tier did
    /// not store are worth probing for.
    pub(crate) fn shared(&self) -> bool {
        !matches!(self, Store::Memory(_))
    }

    /// Whether the store holds `key` now, where that is known at once without waiting: the
    /// memory tier (in this process, a lock held for a table lookup), which evicts behind
    /// the index's back (least recently read first) — so its answer, not the index's
    /// present set, says whether a lookup is a hit and whether a store must write the key
    /// again. `None` for a store whose answer may wait (disk, Redis).
    pub(crate) fn held_now(&self, key: ChunkKey) -> Option<bool> {
        self.held_now_all(&[key])
            .map(|held| held.first() == Some(&true))
    }

    /// [`held_now`](Self::held_now) for each of `keys`, asked in one call.
    pub(crate) fn held_now_all(&self, keys: &[ChunkKey]) -> Option<Vec<bool>> {
        match self {
            Store::Memory(t) => Some(
                t.exists(keys, &CancelToken::default())
                    .unwrap_or_else(|_| vec![false; keys.len()]),
            ),
            _ => None,
        }
    }

    /// Whether the store holds each key, as a probe for keys this tier did not write. A disk
    /// tier's own `exists` answers from its index, which does not see the packs other
    /// engines wrote since it last looked; the probe indexes those first (`rescan`).
    pub(crate) fn probe(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<bool>, TierError> {
        match self {
            Store::Disk(t) => {
                t.rescan()?;
                t.exists(keys, cancel)
            }
            other => other.tier().exists(keys, cancel),
        }
    }

    /// Rewrites the stored value of `key` in place with `edit` (false: not held).
    pub(crate) fn edit(
        &self,
        key: ChunkKey,
        edit: impl FnOnce(&mut Vec<u8>) -> bool,
    ) -> Result<bool, TierError> {
        match self {
            Store::Memory(t) => Ok(t.edit_stored(key, edit)),
            Store::Disk(t) => t.edit_stored(key, edit),
            #[cfg(feature = "redis")]
            Store::Redis(t) => t.edit_stored(key, edit),
        }
    }

    /// Removes the stored value of `key` (false: not held).
    pub(crate) fn remove(&self, key: ChunkKey) -> Result<bool, TierError> {
        match self {
            Store::Memory(t) => Ok(t.remove(key)),
            Store::Disk(t) => t.remove(key),
            #[cfg(feature = "redis")]
            Store::Redis(t) => t.remove(key),
        }
    }
}

/// A Redis configuration error as an error of the argument `url`: the library's own message
/// names the URL's part (`url: seed 1: …`, `url: query key timeout_ms: …`); the `url: ` it
/// starts with is not repeated. The CA file's errors name the URL's `ca` query key.
#[cfg(feature = "redis")]
fn url_error(e: kvsched::kv::redis::ConfigError) -> ArgError {
    use kvsched::kv::redis::ConfigError;
    if let ConfigError::CaCert { path, problem } = &e {
        // From the URL's `ca=` (the library's setting is `ca_cert`).
        let shown = path.display();
        return ("url", format!("query key ca: {shown}: {problem}"));
    }
    let text = e.to_string();
    let problem = text.strip_prefix("url: ").unwrap_or(&text);
    ("url", problem.to_owned())
}
