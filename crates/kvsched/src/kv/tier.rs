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
    /// Stores each value under its key, replacing what was there. A tier may refuse or drop
    /// values to stay within its capacity.
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError>;
    /// Whether a call may block for long (I/O, a network, a wrapper that waits). The
    /// [`TierConnector`](super::TierConnector) runs the gets of such a tier on its own threads
    /// and waits for them only until the load's deadline; a tier that never blocks (an
    /// in-process map) is called on the loading thread. `true` unless a tier says otherwise.
    fn may_block(&self) -> bool {
        true
    }
}
