//! Cache-group geometry: group kinds and block sizes, the scheduler block size `S`, the null
//! block, and the token ↔ block arithmetic every other module relies on
//! (`docs/rules.md#data-model`).
//!
//! Everything here is pure and total: invalid geometry is a [`GeometryError`], never a panic,
//! and no arithmetic here can overflow.

use thiserror::Error;

/// A block id as it appears in a block table. In the runtime ids are unique across groups;
/// in replayed scenarios one id may appear in several groups' tables.
pub type BlockId = u64;

/// The default null-block id (`docs/rules.md#data-model`).
pub const DEFAULT_NULL_BLOCK: BlockId = 0;

/// How a Mamba group keeps its recurrent-state blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MambaMode {
    /// Only the newest state block is real; earlier entries are the null block.
    Align,
    /// Every entry is a real state block.
    All,
}

/// The attention (or state) kind of a cache group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// Every entry below the computed length is a real block.
    FullAttention,
    /// Entries entirely outside the window (in tokens) may be the null block.
    SlidingWindow {
        /// Window length in tokens, `> 0`.
        window: u64,
    },
    /// Recurrent state; entry `k` holds the state after token `(k + 1) · block_size`.
    Mamba {
        /// Which entries are real.
        mode: MambaMode,
    },
}

impl GroupKind {
    /// The kind's name as it is spelled in scenario files.
    pub fn name(&self) -> &'static str {
        match self {
            GroupKind::FullAttention => "full_attention",
            GroupKind::SlidingWindow { .. } => "sliding_window",
            GroupKind::Mamba { .. } => "mamba",
        }
    }
}

/// One KV-cache group: a kind and its block size in tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheGroup {
    /// What the group stores.
    pub kind: GroupKind,
    /// Tokens per block, `> 0`.
    pub block_size: u64,
}

impl CacheGroup {
    /// A full-attention group.
    pub fn full_attention(block_size: u64) -> Self {
        CacheGroup {
            kind: GroupKind::FullAttention,
            block_size,
        }
    }

    /// A sliding-window group with a window of `window` tokens.
    pub fn sliding_window(block_size: u64, window: u64) -> Self {
        CacheGroup {
            kind: GroupKind::SlidingWindow { window },
            block_size,
        }
    }

    /// A Mamba group.
    pub fn mamba(block_size: u64, mode: MambaMode) -> Self {
        CacheGroup {
            kind: GroupKind::Mamba { mode },
            block_size,
        }
    }

    /// Entries `0..n` that a request with `tokens` computed tokens may hold as the null block
    /// (returns `n`): for a sliding window, the entries wholly outside the window; for Mamba
    /// `align`, every state older than the newest complete one; none otherwise.
    pub fn nullable_below(&self, tokens: u64) -> u64 {
        let b = self.block_size;
        match self.kind {
            GroupKind::FullAttention
            | GroupKind::Mamba {
                mode: MambaMode::All,
            } => 0,
            GroupKind::SlidingWindow { window } => tokens.saturating_sub(window) / b,
            GroupKind::Mamba {
                mode: MambaMode::Align,
            } => (tokens / b).saturating_sub(1),
        }
    }

    /// Number of table entries that overlap the first `tokens` tokens: `ceil(tokens / b)`.
    #[inline]
    pub fn blocks_for_tokens(&self, tokens: u64) -> u64 {
        // block_size > 0 is guaranteed by `Geometry::new`.
        tokens / self.block_size + u64::from(tokens % self.block_size != 0)
    }
}

/// Why a geometry was rejected. The `group` fields are indices into the group list.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum GeometryError {
    /// No cache group was given.
    #[error("at least one cache group is required")]
    NoGroups,
    /// A group's block size is zero.
    #[error("group {group}: block_size must be > 0")]
    ZeroBlockSize {
        /// Index of the offending group.
        group: usize,
    },
    /// A sliding-window group's window is zero.
    #[error("group {group}: window must be > 0")]
    ZeroWindow {
        /// Index of the offending group.
        group: usize,
    },
    /// The explicit scheduler block size is zero.
    #[error("scheduler_block_size must be > 0")]
    ZeroSchedulerBlockSize,
    /// The explicit scheduler block size is not a multiple of a group's block size.
    #[error("scheduler_block_size {scheduler_block_size} is not a multiple of group {group}'s block_size {block_size}")]
    NotAMultiple {
        /// The given `S`.
        scheduler_block_size: u64,
        /// Index of the group.
        group: usize,
        /// That group's block size.
        block_size: u64,
    },
    /// The lcm of the block sizes does not fit in 64 bits.
    #[error("the lcm of the group block sizes overflows 64 bits")]
    LcmOverflow,
}

/// Validated geometry: the cache groups, the scheduler block size `S` and the null block id.
///
/// Invariants (established by [`Geometry::new`]): at least one group; every block size and
/// window is `> 0`; `S > 0` and `S` is a multiple of every block size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    groups: Vec<CacheGroup>,
    scheduler_block_size: u64,
    null_block: BlockId,
    /// Some group's table may hold the null block below its end.
    nullable: bool,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `lcm` of positive numbers, `None` on overflow.
fn lcm(a: u64, b: u64) -> Option<u64> {
    (a / gcd(a, b)).checked_mul(b)
}

impl Geometry {
    /// Validates `groups` and derives `S` (the lcm of all block sizes unless
    /// `scheduler_block_size` is given, in which case it must be a positive multiple of each).
    pub fn new(
        groups: Vec<CacheGroup>,
        scheduler_block_size: Option<u64>,
        null_block: BlockId,
    ) -> Result<Self, GeometryError> {
        if groups.is_empty() {
            return Err(GeometryError::NoGroups);
        }
        let mut l = 1u64;
        for (i, g) in groups.iter().enumerate() {
            if g.block_size == 0 {
                return Err(GeometryError::ZeroBlockSize { group: i });
            }
            if let GroupKind::SlidingWindow { window: 0 } = g.kind {
                return Err(GeometryError::ZeroWindow { group: i });
            }
            if scheduler_block_size.is_none() {
                l = lcm(l, g.block_size).ok_or(GeometryError::LcmOverflow)?;
            }
        }
        let s = match scheduler_block_size {
            None => l,
            Some(0) => return Err(GeometryError::ZeroSchedulerBlockSize),
            Some(s) => {
                for (i, g) in groups.iter().enumerate() {
                    if s % g.block_size != 0 {
                        return Err(GeometryError::NotAMultiple {
                            scheduler_block_size: s,
                            group: i,
                            block_size: g.block_size,
                        });
                    }
                }
                s
            }
        };
        let nullable = groups.iter().any(|g| g.nullable_below(u64::MAX) > 0);
        Ok(Geometry {
            groups,
            scheduler_block_size: s,
            null_block,
            nullable,
        })
    }

    /// One full-attention group of `block_size` tokens, `S = block_size`, null block 0.
    pub fn single_full_attention(block_size: u64) -> Result<Self, GeometryError> {
        Geometry::new(
            vec![CacheGroup::full_attention(block_size)],
            None,
            DEFAULT_NULL_BLOCK,
        )
    }

    /// The cache groups, in table order.
    #[inline]
    pub fn groups(&self) -> &[CacheGroup] {
        &self.groups
    }

    /// Number of cache groups (≥ 1).
    #[inline]
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// The scheduler block size `S`: every claim boundary is a multiple of it.
    #[inline]
    pub fn scheduler_block_size(&self) -> u64 {
        self.scheduler_block_size
    }

    /// The null block id: a placeholder never matched, claimed, evicted or freed.
    #[inline]
    pub fn null_block(&self) -> BlockId {
        self.null_block
    }

    /// Whether some group's table may hold the null block below its end: a sliding window
    /// or a Mamba `align` group (a full-attention or Mamba `all` table never does).
    #[inline]
    pub(crate) fn may_hold_nulls(&self) -> bool {
        self.nullable
    }

    /// `floor(pos / S) · S`.
    #[inline]
    pub fn round_down_to_s(&self, pos: u64) -> u64 {
        pos - pos % self.scheduler_block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lcm_and_explicit_s() {
        let g = vec![
            CacheGroup::full_attention(16),
            CacheGroup::full_attention(32),
            CacheGroup::mamba(64, MambaMode::All),
        ];
        assert_eq!(
            Geometry::new(g.clone(), None, 0)
                .unwrap()
                .scheduler_block_size(),
            64
        );
        assert_eq!(
            Geometry::new(g.clone(), Some(128), 0)
                .unwrap()
                .scheduler_block_size(),
            128
        );
        assert_eq!(
            Geometry::new(g.clone(), Some(96), 0),
            Err(GeometryError::NotAMultiple {
                scheduler_block_size: 96,
                group: 2,
                block_size: 64
            })
        );
        assert_eq!(
            Geometry::new(g, Some(0), 0),
            Err(GeometryError::ZeroSchedulerBlockSize)
        );
        let g = vec![
            CacheGroup::full_attention(12),
            CacheGroup::sliding_window(18, 5),
        ];
        assert_eq!(
            Geometry::new(g, None, 0).unwrap().scheduler_block_size(),
            36
        );
    }

    #[test]
    fn rejects_bad_groups() {
        assert_eq!(Geometry::new(vec![], None, 0), Err(GeometryError::NoGroups));
        assert_eq!(
            Geometry::new(vec![CacheGroup::full_attention(0)], None, 0),
            Err(GeometryError::ZeroBlockSize { group: 0 })
        );
        assert_eq!(
            Geometry::new(
                vec![
                    CacheGroup::full_attention(4),
                    CacheGroup::sliding_window(4, 0)
                ],
                None,
                0
            ),
            Err(GeometryError::ZeroWindow { group: 1 })
        );
        let big = (1u64 << 63) - 25; // odd, shares no factor with 2^62
        assert_eq!(
            Geometry::new(
                vec![
                    CacheGroup::full_attention(big),
                    CacheGroup::full_attention(1 << 62)
                ],
                None,
                0
            ),
            Err(GeometryError::LcmOverflow)
        );
    }

    #[test]
    fn kind_names_are_the_scenario_spellings() {
        assert_eq!(GroupKind::FullAttention.name(), "full_attention");
        assert_eq!(
            GroupKind::SlidingWindow { window: 4 }.name(),
            "sliding_window"
        );
        for mode in [MambaMode::Align, MambaMode::All] {
            assert_eq!(GroupKind::Mamba { mode }.name(), "mamba");
        }
    }

    #[test]
    fn token_block_arithmetic() {
        let g = CacheGroup::full_attention(16);
        assert_eq!(g.blocks_for_tokens(0), 0);
        assert_eq!(g.blocks_for_tokens(1), 1);
        assert_eq!(g.blocks_for_tokens(16), 1);
        assert_eq!(g.blocks_for_tokens(17), 2);
        assert_eq!(g.blocks_for_tokens(u64::MAX), u64::MAX / 16 + 1);
        let geo = Geometry::single_full_attention(16).unwrap();
        assert_eq!(geo.round_down_to_s(47), 32);
        assert_eq!(geo.round_down_to_s(u64::MAX), u64::MAX - 15);
    }
}
