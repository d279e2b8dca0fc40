//! The [`Tier`] trait: a store of chunks by key.

use super::ChunkKey;
use crate::connector::CancelToken;

/// Why a tier call failed as a whole (per-key absence is `false` / `None`, not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// The store could not be reached or answered with an error (connection refused, reset,
    /// server error, I/O error). The message never contains credentials.
    #[error("tier unavailable: {0}")]
    Unavailable(String),
    /// The call took longer than the tier's per-call timeout.
    #[error("tier call timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The caller's cancellation token fired before the call finished.
    #[error("tier call cancelled")]
    Cancelled,
    /// A value is larger than the tier accepts, or the tier is full and cannot evict.
    #[error("tier refused the value: {0}")]
    Refused(String),
}

/// A store of chunks by [`ChunkKey`]: batched existence checks, gets and puts, nothing else.
///
/// Values are opaque bytes; a tier neither parses nor checks them (the connector does). Every
/// call is batched so a remote tier can answer a whole load in one round trip per node.
/// Implementations are thread-safe: worker threads call them concurrently. A tier may drop
/// any value at any time (eviction): `exists` is a hint, `get` is the truth.
pub trait Tier: Send + Sync + 'static {
    /// A short name for reports (`memory`, `disk`, `redis`, …).
    fn name(&self) -> &str;
    /// Whether each key is held, in order.
    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError>;
    /// Each key's value (`None`: not held), in order. A cooperative tier checks `cancel`
    /// between batches and returns [`TierError::Cancelled`].
    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError>;
    /// Reads each key's value into the caller's buffer `bufs[i]` and sets `held[i]` (`false`:
    /// not held, the buffer left empty), in order: the load path's get, which reuses the
    /// connector's buffers instead of returning a fresh allocation per value. Each buffer is
    /// cleared first and keeps its capacity, so a buffer that held a value of this size
    /// before takes the next one without allocating or touching new pages.
    ///
    /// The default calls [`get`](Self::get) and moves each value into its buffer (an
    /// allocation per value, as `get` makes; the buffers' old capacity is dropped): an
    /// out-of-tree tier stays correct without it and may override it to read in place. The
    /// memory and disk tiers do.
    ///
    /// # Errors
    ///
    /// As `get`; [`TierError::Refused`] when `bufs` or `held` is not as long as `keys`.
    fn get_into(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
        bufs: &mut [Vec<u8>],
        held: &mut [bool],
    ) -> Result<(), TierError> {
        check_into_lens(keys.len(), bufs.len(), held.len())?;
        let values = self.get(keys, cancel)?;
        if values.len() != keys.len() {
            return Err(TierError::Unavailable(format!(
                "{}: get answered {} values for {} keys",
                self.name(),
                values.len(),
                keys.len()
            )));
        }
        for ((v, buf), h) in values.into_iter().zip(bufs.iter_mut()).zip(held.iter_mut()) {
            *h = v.is_some();
            match v {
                Some(v) => *buf = v,
                None => buf.clear(),
            }
        }
        Ok(())
    }
    /// Calls `f` with the value of `key`, if held, and says whether it was: the load path of
    /// a tier that never blocks, which can let the reader verify and copy a value where it
    /// lies instead of copying it out first. `f` may run while the tier holds a lock: it must
    /// not call into the tier.
    ///
    /// The default calls [`get`](Self::get) for the one key (an allocation per value); the
    /// memory tier overrides it to run `f` on its stored value under its shard's lock.
    ///
    /// # Errors
    ///
    /// As `get`.
    fn read_with(
        &self,
        key: ChunkKey,
        cancel: &CancelToken,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, TierError> {
        let mut values = self.get(&[key], cancel)?;
        if values.len() != 1 {
            return Err(TierError::Unavailable(format!(
                "{}: get answered {} values for 1 key",
                self.name(),
                values.len()
            )));
        }
        match values.pop().flatten() {
            Some(v) => {
                f(&v);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Stores each value under its key, replacing what was there. A tier may refuse or drop
    /// values to stay within its capacity. A put that returns an error may still have stored
    /// part of its batch (a cache: each value stored is whole, and the caller's checks on
    /// load decide what it is worth).
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError>;
    /// The caller's word that no value it stores or loads is larger than `bytes`: a
    /// [`TierConnector`](super::TierConnector) says so when it is made, with its largest
    /// chunk. A tier reading values it cannot trust (a server's) may then refuse a larger
    /// one before reading it, so a server answering a get with a value of hundreds of
    /// megabytes costs a refused call, not that memory. Callers sharing a tier each say
    /// theirs; the tier keeps the largest. A wrapper passes it on to the tier it wraps. The
    /// default does nothing.
    fn expect_values_up_to(&self, bytes: usize) {
        let _ = bytes;
    }
    /// Whether a call may block for long (I/O, a network, a wrapper that waits). The
    /// [`TierConnector`](super::TierConnector) runs the gets of such a tier on its own threads
    /// and waits for them only until the load's deadline; a tier that never blocks (an
    /// in-process map) is called on the loading thread. `true` unless a tier says otherwise.
    fn may_block(&self) -> bool {
        true
    }
    /// Whether [`read_with`](Self::read_with) reads a chunk where the tier holds it, at no
    /// cost per call beyond the copy (an in-process map). The
    /// [`TierConnector`](super::TierConnector) then loads a tier that never blocks one chunk
    /// at a time through it; otherwise (the default) it takes one batched
    /// [`get_into`](Self::get_into) a load, so a tier whose calls carry a fixed cost (a round
    /// trip, a simulated latency) pays it once a load, not once a chunk.
    fn reads_in_place(&self) -> bool {
        false
    }
    /// Whether a call costs something fixed beyond its chunks' (a round trip, a simulated
    /// latency), which one batched call per load pays once. `true` (the default): the
    /// [`TierConnector`](super::TierConnector) reads a load in one batched
    /// [`get_into`](Self::get_into). `false` (the disk tier: an open, a `statx` and a read per
    /// chunk, whatever the batch): it reads the load in pieces of about 512 KiB, each
    /// verified and copied into KV memory while its buffers are still in the core's cache.
    fn costs_per_call(&self) -> bool {
        true
    }
}

/// The length check of [`Tier::get_into`]: one buffer and one flag per key.
///
/// # Errors
///
/// [`TierError::Refused`] naming the argument that is not as long as `keys`.
pub(crate) fn check_into_lens(keys: usize, bufs: usize, held: usize) -> Result<(), TierError> {
    if bufs != keys {
        return Err(TierError::Refused(format!(
            "get_into: bufs has {bufs} buffers for {keys} keys"
        )));
    }
    if held != keys {
        return Err(TierError::Refused(format!(
            "get_into: held has {held} flags for {keys} keys"
        )));
    }
    Ok(())
}
