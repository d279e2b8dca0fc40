//! A failure report as the scan reads it: the flat ids (which match in every cache group) in
//! one membership set shared by all groups, and each group's qualified ids (which match only
//! there) in a set of their own. Memory is proportional to the ids reported: a flat id is
//! stored once however many groups there are, and a group's set holds only its own list.

use crate::rules::blockset::BlockSet;
use crate::rules::geometry::{BlockId, Geometry};
use crate::rules::recovery::RecoveryError;

/// One report: the invalid blocks, flat (an id matches in every group) and/or qualified by
/// group (an id matches only in its group). The null block is never a member.
#[derive(Clone, Debug)]
pub struct InvalidSet {
    /// Matches in every group.
    flat: BlockSet,
    /// Per group, the ids that match only there; empty when the report has no non-empty
    /// group-qualified list.
    by_group: Vec<BlockSet>,
    /// No (non-null) id at all.
    empty: bool,
}

impl InvalidSet {
    /// A flat report: every id matches in every group.
    pub fn flat(ids: impl IntoIterator<Item = BlockId>, geo: &Geometry) -> Self {
        let flat = BlockSet::new_shared(ids, geo.null_block());
        InvalidSet {
            empty: flat.is_empty(),
            flat,
            by_group: Vec::new(),
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
        let flat = BlockSet::new_shared(flat, geo.null_block());
        let mut sets: Vec<BlockSet> = by_group
            .iter()
            .map(|ids| BlockSet::new(ids.into_iter().copied(), geo.null_block()))
            .collect();
        if sets.iter().all(BlockSet::is_empty) {
            sets = Vec::new();
        }
        Ok(InvalidSet {
            empty: flat.is_empty() && sets.is_empty(),
            flat,
            by_group: sets,
        })
    }

    /// Whether `id` matches in group `g`: it is in the flat report or in group `g`'s list,
    /// and it is not the null block.
    pub fn contains(&self, g: usize, id: BlockId) -> bool {
        self.flat.contains(id) || self.by_group.get(g).is_some_and(|s| s.contains(id))
    }

    /// Calls `on_hit(index, id)` for every entry of `table` (group `g`'s) that matches, in
    /// ascending index order.
    #[inline]
    pub(crate) fn scan_group(
        &self,
        g: usize,
        table: &[BlockId],
        mut on_hit: impl FnMut(usize, BlockId),
    ) {
        match self.by_group.get(g).filter(|s| !s.is_empty()) {
            None => self.flat.scan(table, on_hit),
            Some(own) if self.flat.is_empty() => own.scan(table, on_hit),
            Some(own) => {
                for (i, &id) in table.iter().enumerate() {
                    if self.flat.contains(id) || own.contains(id) {
                        on_hit(i, id);
                    }
                }
            }
        }
    }

    /// Whether group `g` can have a hit at all.
    #[inline]
    pub(crate) fn group_is_empty(&self, g: usize) -> bool {
        self.flat.is_empty() && self.by_group.get(g).is_none_or(BlockSet::is_empty)
    }

    /// Whether the report names no (non-null) block.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::geometry::CacheGroup;

    fn geo(n: usize) -> Geometry {
        Geometry::new(vec![CacheGroup::full_attention(16); n], None, 0).unwrap()
    }

    fn hits(set: &InvalidSet, g: usize, table: &[BlockId]) -> Vec<(usize, BlockId)> {
        let mut v = Vec::new();
        set.scan_group(g, table, |i, id| v.push((i, id)));
        v
    }

    #[test]
    fn flat_qualified_and_union() {
        let g = geo(3);
        let s = InvalidSet::with_groups([5u64], &[vec![], vec![7u64], vec![0]], &g).unwrap();
        let table = [5u64, 7, 0, 9];
        assert_eq!(hits(&s, 0, &table), vec![(0, 5)]);
        assert_eq!(hits(&s, 1, &table), vec![(0, 5), (1, 7)]);
        assert_eq!(hits(&s, 2, &table), vec![(0, 5)]);
        assert!(s.contains(1, 7) && !s.contains(0, 7) && !s.contains(2, 0));
        assert!(!s.is_empty() && !s.group_is_empty(0));

        let q = InvalidSet::with_groups([], &[vec![], vec![7u64], vec![]], &g).unwrap();
        assert_eq!(hits(&q, 0, &table), vec![]);
        assert_eq!(hits(&q, 1, &table), vec![(1, 7)]);
        assert!(q.group_is_empty(0) && !q.group_is_empty(1) && !q.is_empty());

        let e = InvalidSet::with_groups([0u64], &[vec![0u64], vec![], vec![]], &g).unwrap();
        assert!(e.is_empty() && e.group_is_empty(1));
        assert!(InvalidSet::flat([], &g).is_empty());
    }

    #[test]
    fn wrong_list_count() {
        assert_eq!(
            InvalidSet::with_groups([], &[vec![1u64]], &geo(2)).unwrap_err(),
            RecoveryError::ReportGroupCount {
                given: 1,
                groups: 2
            }
        );
    }
}
