//! The cancellation token a load carries: the runtime fires it when the load's deadline passes
//! or its request ends, and a cooperative connector or tier checks it between batches to stop
//! early.

use crate::sync::{Arc, AtomicBool, Ordering};

/// A shared, one-way flag: once [`cancel`](Self::cancel)led it stays cancelled. Cloning shares
/// the flag. Checking it is one atomic load; firing it never blocks.
#[derive(Clone, Debug, Default)]
pub struct CancelToken {
    fired: Arc<AtomicBool>,
}

impl CancelToken {
    /// A token not yet cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the token. Idempotent.
    pub fn cancel(&self) {
        // Release: pairs with the Acquire load in `is_cancelled`, so a tier that sees the
        // token fired also sees what the runtime did before firing it.
        self.fired.store(true, Ordering::Release);
    }

    /// Whether the token was fired. A load that sees `true` should stop and report its
    /// unfinished blocks as invalid; its result is discarded by the runtime anyway.
    pub fn is_cancelled(&self) -> bool {
        // Acquire: pairs with the Release store in `cancel`.
        self.fired.load(Ordering::Acquire)
    }
}
