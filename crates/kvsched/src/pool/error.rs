//! [`PoolError`]: why a pool operation was refused.

use thiserror::Error;

use super::{BlockRef, Generation, MAX_REF_COUNT};
use crate::rules::geometry::BlockId;

/// Why a pool operation was refused. No pool operation panics on its input.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
#[non_exhaustive]
pub enum PoolError {
    /// The pool needs the null block and at least one
    /// usable block.
    #[error(
        "a block pool needs at least 2 blocks (the null block and one usable), got {num_blocks}"
    )]
    TooSmall {
        /// The requested size.
        num_blocks: usize,
    },
    /// The pool addresses slots with 32-bit indices.
    #[error("a block pool holds at most {max} blocks, got {num_blocks}", max = u32::MAX)]
    TooLarge {
        /// The requested size.
        num_blocks: usize,
    },
    /// The id is not a slot of this pool.
    #[error("block {0} is out of range for this pool")]
    OutOfRange(BlockId),
    /// The null block is never allocated, retained or released.
    #[error("block {0} is the null block")]
    NullBlock(BlockId),
    /// The reference's generation is not the slot's current one: the block was freed and
    /// reused since the reference was handed out.
    #[error("stale reference {block:?}: block {} is now at generation {current}", block.id)]
    Stale {
        /// The stale reference.
        block: BlockRef,
        /// The slot's current generation.
        current: Generation,
    },
    /// A release of a block whose reference count is already 0.
    #[error("block {0} released with a reference count of 0 (double free)")]
    DoubleFree(BlockId),
    /// A retain of a block nobody references (it is free or only cached).
    #[error("block {0} is not referenced; retain needs a live reference")]
    NotReferenced(BlockId),
    /// The reference count would exceed its 28-bit maximum.
    #[error("block {0} reference count would exceed {max}", max = MAX_REF_COUNT)]
    RefCountOverflow(BlockId),
    /// The last reference of a block whose asynchronous load still owns its bytes: the block
    /// is not freed (it could be handed to a new owner while the load writes it).
    #[error("block {0} released while its load still owns its bytes")]
    Filling(BlockId),
    /// A fill was begun on a block that is cached, unreferenced or already filling, or ended
    /// on a block that is not filling.
    #[error("block {0} is not in a state that allows this fill transition")]
    FillState(BlockId),
}
