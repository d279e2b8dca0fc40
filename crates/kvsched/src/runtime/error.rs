//! [`RuntimeError`]: every way the runtime refuses a setting, a request or a start.

use thiserror::Error;

use crate::pool::PoolError;
use crate::rules::geometry::GeometryError;

/// Why the runtime refused something.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// Invalid cache-group geometry.
    #[error("groups: {0}")]
    Geometry(#[from] GeometryError),
    /// Invalid pool size.
    #[error("pool_blocks: {0}")]
    Pool(#[from] PoolError),
    /// A builder setting is out of range.
    #[error("{field}: {problem}")]
    Config {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A live request already has this id.
    #[error("request {0:?}: duplicate id")]
    DuplicateId(String),
    /// The request does not fit in the pool at its full length (prompt and
    /// `max_new_tokens`, at least one), counting an entry of every group for every block of
    /// tokens: a step allocates a block for each entry of the range it computes (sliding
    /// window and Mamba groups' too) and frees those no longer needed after it.
    #[error("request {id:?}: needs {needed} blocks, the pool has {usable}")]
    TooLong {
        /// Request id.
        id: String,
        /// Blocks it needs at full length.
        needed: u64,
        /// Usable blocks in the pool.
        usable: u64,
    },
    /// An empty request id.
    #[error("request id: must not be empty")]
    EmptyId,
    /// An empty prompt.
    #[error("request {0:?}: empty prompt")]
    EmptyPrompt(String),
    /// A request's own `load_deadline` of zero (its loads would expire unrun; `None` takes
    /// [`Settings::load_deadline`](crate::Settings::load_deadline)).
    #[error("request {0:?}: load_deadline: must be > 0 (or None)")]
    ZeroLoadDeadline(String),
    /// The runtime is shutting down.
    #[error("the runtime is shut down")]
    ShutDown,
    /// A thread could not be started.
    #[error("spawning a thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// A shard panicked during a step (a bug in the runtime: connector panics are caught
    /// where they happen). The step was released on every shard; the runtime takes no more
    /// steps, and [`Runtime::shutdown`](crate::Runtime::shutdown) reports what it can.
    #[error("shard {shard} panicked during step {step}: {message}")]
    ShardPanicked {
        /// The shard.
        shard: usize,
        /// The step.
        step: u64,
        /// The panic message (when it was a string).
        message: String,
    },
}
