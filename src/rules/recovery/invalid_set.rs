//! A failure report as the scan reads it: per cache group, the set of block ids that match
//! there (a flat report's ids match in every group, a group-qualified list only in its group).

use crate::rules::blockset::BlockSet;
use crate::rules::geometry::{BlockId, Geometry};
use crate::rules::recovery::RecoveryError;

/// One report: the invalid blocks, flat (an id matches in every group) and/or qualified by
/// group (an id matches only in its group). The null block is never a member.
#[derive(Clone, Debug)]
pub struct InvalidSet {
    /// Per group: the ids that match there. When the report is flat only, every group shares
    /// `sets[0]` and `shared` is true.
    sets: Vec<BlockSet>,
    shared: bool,
}

impl InvalidSet {
    /// A flat report: every id matches in every group.
    pub fn flat(ids: impl IntoIterator<Item = BlockId>, geo: &Geometry) -> Self {
        InvalidSet {
            sets: vec![BlockSet::new(ids, geo.null_block())],
            shared: true,
        }
    }

    /// The union of a flat report and a group-qualified one (`by_group[g]` matches only in
    /// group `g`). `by_group` must hold exactly one list per group.
    pub fn with_groups<I>(
        flat: impl IntoIterator<Item = BlockId>,
        by_group: &[I],
        geo: &Geometry,
    ) -> Result<Self, RecoveryError>
    where
        for<'a> &'a I: IntoIterator<Item = &'a BlockId>,
    {
        if by_group.len() != geo.num_groups() {
            return Err(RecoveryError::ReportGroupCount {
                given: by_group.len(),
                groups: geo.num_groups(),
            });
        }
        let flat: Vec<BlockId> = flat.into_iter().collect();
        let sets = by_group
            .iter()
            .map(|ids| {
                BlockSet::new(
                    flat.iter().copied().chain(ids.into_iter().copied()),
                    geo.null_block(),
                )
            })
            .collect();
        Ok(InvalidSet {
            sets,
            shared: false,
        })
    }

    /// The ids that match in group `g`.
    #[inline]
    pub fn group(&self, g: usize) -> &BlockSet {
        if self.shared {
            &self.sets[0]
        } else {
            &self.sets[g]
        }
    }

    /// Whether the report names no (non-null) block.
    pub fn is_empty(&self) -> bool {
        self.sets.iter().all(BlockSet::is_empty)
    }
}
