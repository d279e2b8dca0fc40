//! Naming one use of a slot: the slot's [`Generation`] and the [`BlockRef`] that pairs it with
//! the slot's id.

use crate::rules::geometry::BlockId;

/// How many times a slot has been allocated (wrapping). Part of every [`BlockRef`].
pub type Generation = u32;

/// One use of a pool slot: its id and the generation it had when it was handed out.
///
/// # Guarantees
///
/// Two `BlockRef`s to the same slot taken from different allocations differ in
/// `generation` (modulo 2³² reuses of that one slot), so the pool recognises a reference that
/// outlived its allocation ([`PoolError::Stale`](super::PoolError::Stale)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockRef {
    /// The slot, `1..num_blocks`.
    pub id: BlockId,
    /// The slot's generation when this reference was handed out.
    pub generation: Generation,
}
