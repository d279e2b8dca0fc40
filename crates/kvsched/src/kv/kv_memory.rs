//! [`KvMemory`]: the engine-side bytes of each block, and the layout the engine declares.

use crate::rules::geometry::{BlockId, CacheGroup, GroupKind};

/// The bytes of one block in each cache group, as the engine declares them.
///
/// A full-attention or sliding-window block holds `block_size` tokens' KV; a Mamba block holds
/// one state, whatever its block size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    bytes_per_block: Vec<usize>,
}

impl KvLayout {
    /// A layout with these block sizes in bytes, one per group.
    ///
    /// # Errors
    ///
    /// [`KvMemoryError::Layout`] for no groups or a group of 0 bytes.
    pub fn new(bytes_per_block: Vec<usize>) -> Result<KvLayout, KvMemoryError> {
        if bytes_per_block.is_empty() {
            return Err(KvMemoryError::Layout("no groups".into()));
        }
        if let Some(g) = bytes_per_block.iter().position(|&b| b == 0) {
            return Err(KvMemoryError::Layout(format!(
                "group {g}: bytes_per_block is 0"
            )));
        }
        Ok(KvLayout { bytes_per_block })
    }

    /// The layout of `groups` with `bytes_per_token` bytes of KV per token in attention
    /// groups and `state_bytes` per Mamba state.
    ///
    /// # Errors
    ///
    /// [`KvMemoryError::Layout`] when a product overflows or a size is 0.
    pub fn for_groups(
        groups: &[CacheGroup],
        bytes_per_token: usize,
        state_bytes: usize,
    ) -> Result<KvLayout, KvMemoryError> {
        let sizes = groups
            .iter()
            .enumerate()
            .map(|(g, grp)| match grp.kind {
                GroupKind::Mamba { .. } => Ok(state_bytes),
                _ => usize::try_from(grp.block_size)
                    .ok()
                    .and_then(|b| b.checked_mul(bytes_per_token))
                    .ok_or_else(|| {
                        KvMemoryError::Layout(format!("group {g}: block bytes overflow"))
                    }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        KvLayout::new(sizes)
    }

    /// Bytes of one block of group `g` (`None` past the last group).
    pub fn bytes_per_block(&self, g: usize) -> Option<usize> {
        self.bytes_per_block.get(g).copied()
    }

    /// Number of groups.
    pub fn num_groups(&self) -> usize {
        self.bytes_per_block.len()
    }

    /// The largest block, in bytes.
    pub fn max_block_bytes(&self) -> usize {
        self.bytes_per_block.iter().copied().max().unwrap_or(0)
    }
}

/// Why a KV memory access was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KvMemoryError {
    /// The layout is unusable.
    #[error("kv layout: {0}")]
    Layout(String),
    /// The memory would not fit in the address space.
    #[error("kv memory of {blocks} blocks × {block_bytes} bytes overflows")]
    TooLarge {
        /// Blocks asked for.
        blocks: usize,
        /// Bytes per block asked for.
        block_bytes: usize,
    },
    /// The system could not allocate the memory.
    #[error("kv memory: cannot allocate {bytes} bytes")]
    Alloc {
        /// Bytes asked for.
        bytes: usize,
    },
    /// No such group.
    #[error("group {0} is not in the kv layout")]
    Group(usize),
    /// No such block (or the null block, which is never written).
    #[error("block {0} is out of range or the null block")]
    Block(BlockId),
    /// The range leaves the block.
    #[error("bytes {offset}..{end} are outside a block of {block_bytes} bytes")]
    Range {
        /// Start of the access.
        offset: usize,
        /// End of the access.
        end: usize,
        /// The block's size in its group.
        block_bytes: usize,
    },
}

/// The bytes a poisoned block holds: what the null block holds, and what a load writes into
/// every block it reports invalid, so a read through either is recognisable.
pub const POISON_BYTE: u8 = 0xA5;

/// The engine-side KV bytes of each block: host memory for CPU engines, tests and the stress
/// tool ([`HostKvMemory`](super::HostKvMemory)); a GPU engine implements it over device
/// memory.
///
/// # Contract
///
/// Block ids are the runtime's (one pool across groups); `group` says which layout applies.
/// Accesses to different blocks may run concurrently from any threads. Who may touch a
/// block's bytes when is the runtime's rule, not the memory's: the load that owns a block
/// ([`LoadJob::may_write`](crate::connector::LoadJob::may_write)) writes it on a worker; the
/// engine writes what its step computes and reads what its plan's tables name. An
/// implementation must not make a racing access undefined behaviour (torn bytes are allowed:
/// checks downstream catch them).
pub trait KvMemory: Send + Sync + 'static {
    /// The layout.
    fn layout(&self) -> &KvLayout;
    /// Writes `data` at `offset` in block `block` of group `group`.
    ///
    /// # Errors
    ///
    /// A [`KvMemoryError`] naming the group, block or range; nothing is written.
    fn write(
        &self,
        group: usize,
        block: BlockId,
        offset: usize,
        data: &[u8],
    ) -> Result<(), KvMemoryError>;
    /// Reads `out.len()` bytes at `offset` of block `block` of group `group`. The null block
    /// reads as [`POISON_BYTE`]s.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write); `out` is unchanged.
    fn read(
        &self,
        group: usize,
        block: BlockId,
        offset: usize,
        out: &mut [u8],
    ) -> Result<(), KvMemoryError>;
    /// The block's write epoch: a counter that every [`write`](Self::write) (and so every
    /// [`poison`](Self::poison) and every load) into `block`, in any group, changes after
    /// its bytes are stored. A reader that saw epoch `e` before reading the block's bytes,
    /// and sees `e` again later, knows no write landed in between, so bytes it checked then
    /// need no second check. `None` (the default, and for the null block or a block out of
    /// range): not tracked, a reader must check the bytes every time.
    fn write_epoch(&self, block: BlockId) -> Option<u64> {
        let _ = block;
        None
    }
    /// Fills the whole block with [`POISON_BYTE`]s (a load marks a block it could not fill).
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    fn poison(&self, group: usize, block: BlockId) -> Result<(), KvMemoryError> {
        let n = self
            .layout()
            .bytes_per_block(group)
            .ok_or(KvMemoryError::Group(group))?;
        self.write(group, block, 0, &vec![POISON_BYTE; n])
    }
}
