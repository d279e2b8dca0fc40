//! The load-fill flag: who may write a block's bytes, and when they may be read.
//!
//! An asynchronous load writes the bytes of its destination blocks on a worker thread while
//! the scheduler goes on. The `FILLING` bit of the state word makes that hand-off explicit:
//!
//! 1. the shard sets it ([`BlockPool::begin_fill`]) on every destination block before the job
//!    is queued for a worker (the queue's push/pop orders the bit before the worker's check);
//! 2. while it is set, the load's worker alone writes the bytes
//!    ([`BlockPool::is_filling`] is its permission check), nobody reads them, and the block
//!    can neither be registered in the prefix index nor freed: a last
//!    [`release`](BlockPool::release) is refused ([`PoolError::Filling`], counted as an
//!    invariant violation) and the block stays out of the free list;
//! 3. the shard clears it ([`BlockPool::end_fill`]) only when it applies the load's own
//!    completion, which the worker sends after its last write — also for a late completion
//!    of a load whose deadline passed (its blocks stay parked until then).
//!
//! So a late load can never write into a block that was handed to anyone else: the block
//! cannot be reallocated before the bit is cleared, and the bit is cleared only after the
//! load is done writing. `loom-tests/tests/fill_late_load_vs_reuse.rs` checks this on these
//! types.

use super::{transition, BlockPool, BlockRef, PoolError, State};
use crate::sync::Ordering;

impl BlockPool {
    /// Marks `r`'s bytes as owned by an asynchronous load.
    ///
    /// # Errors
    ///
    /// [`PoolError::NullBlock`], [`PoolError::OutOfRange`]; [`PoolError::FillState`] when the
    /// block is stale, unreferenced, cached or already filling.
    pub fn begin_fill(&self, r: BlockRef) -> Result<(), PoolError> {
        self.fill_transition(r, |s| s.begin_fill(r.generation))
    }

    /// Ends the load's ownership of `r`'s bytes (its completion was applied).
    ///
    /// # Errors
    ///
    /// As [`begin_fill`](Self::begin_fill); [`PoolError::FillState`] when the block is not
    /// filling at that generation.
    pub fn end_fill(&self, r: BlockRef) -> Result<(), PoolError> {
        self.fill_transition(r, |s| s.end_fill(r.generation))
    }

    /// Whether an asynchronous load owns `r`'s bytes at `r`'s generation: the check a load's
    /// worker makes before it writes a destination block.
    pub fn is_filling(&self, r: BlockRef) -> bool {
        self.load(r.id)
            .is_some_and(|s| s.generation() == r.generation && s.is_filling())
    }

    fn fill_transition(
        &self,
        r: BlockRef,
        step: impl Fn(State) -> Option<State>,
    ) -> Result<(), PoolError> {
        let slot = self.checked_slot(r.id)?;
        // Relaxed: the flag hands nothing over by itself. Setting it happens-before the
        // worker's check through the job queue (push Release / pop Acquire); the worker's
        // writes happen-before clearing it through the completion queue; the block's next
        // owner is ordered after both by `release`'s Release CAS and `allocate`'s Acquire.
        transition(&slot.state, self.is_exclusive(), Ordering::Relaxed, |cur| {
            step(State(cur))
                .map(|next| (next.0, ()))
                .ok_or(PoolError::FillState(r.id))
        })
        .map(|_| ())
    }
}
