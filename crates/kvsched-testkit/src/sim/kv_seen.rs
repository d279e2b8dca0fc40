//! [`Seen`]: what one request has already checked of the KV entries its tables name, and at
//! which write epoch ([`KvMemory::write_epoch`](kvsched::kv::KvMemory::write_epoch)) of the
//! block that held them, so the [`KvChecker`](super::KvChecker) does not read again bytes
//! that no write has touched since they matched their reference.
//!
//! Sound because a reference depends only on the request's own tokens (which only grow) and
//! the position, never on memory: bytes of block `X` that matched the references of
//! positions `[lo, hi)` of entry `i` while `X` was at epoch `e` still match them as long as
//! `X` is at epoch `e`, whichever entry of whichever table names `X` in between. The epoch is
//! loaded before the bytes are read, so a write racing the read either shows in the bytes or
//! moves the epoch past the one recorded.

use kvsched::BlockId;

/// Positions `[lo, hi)` of one entry, checked while `block` was at `epoch`.
#[derive(Clone, Copy, Debug, Default)]
struct Mark {
    /// 0: nothing checked (the null block is never recorded).
    block: BlockId,
    epoch: u64,
    lo: u64,
    hi: u64,
}

/// Per cache group, per entry index: the last range checked and found right.
#[derive(Debug, Default)]
pub(super) struct Seen {
    groups: Vec<Vec<Mark>>,
}

/// Positions `[.0, .1)`; empty when `.0 >= .1`.
pub(super) type Span = (u64, u64);

impl Seen {
    fn mark(&self, g: usize, i: usize) -> Option<&Mark> {
        self.groups.get(g)?.get(i).filter(|m| m.block != 0)
    }

    /// The parts of positions `[lo, hi)` of entry `i` of group `g`, held by `block` now at
    /// `epoch`, that have not been checked at that epoch: at most two spans (before and after
    /// the range checked), empty spans for none. `epoch` `None` (memory that keeps no epochs)
    /// or `merge` false with a different range: the whole range.
    pub(super) fn unchecked(
        &self,
        g: usize,
        i: usize,
        block: BlockId,
        epoch: Option<u64>,
        (lo, hi): Span,
        merge: bool,
    ) -> [Span; 2] {
        let whole = [(lo, hi), (hi, hi)];
        let (Some(e), Some(m)) = (epoch, self.mark(g, i)) else {
            return whole;
        };
        if m.block != block || m.epoch != e || (!merge && (m.lo, m.hi) != (lo, hi)) {
            return whole;
        }
        if m.hi < lo || hi < m.lo {
            return whole;
        }
        [(lo, hi.min(m.lo)), (lo.max(m.hi), hi)]
    }

    /// Records that positions `[lo, hi)` of entry `i` of group `g` matched their references
    /// in `block` at `epoch` (with what was checked before at that epoch when `merge`).
    pub(super) fn checked(
        &mut self,
        g: usize,
        i: usize,
        block: BlockId,
        epoch: Option<u64>,
        (lo, hi): Span,
        merge: bool,
    ) {
        let Some(e) = epoch.filter(|_| block != 0 && lo < hi) else {
            return;
        };
        if self.groups.len() <= g {
            self.groups.resize_with(g + 1, Vec::new);
        }
        let entries = &mut self.groups[g];
        if entries.len() <= i {
            entries.resize(i + 1, Mark::default());
        }
        let m = &mut entries[i];
        let same = m.block == block && m.epoch == e && m.hi >= lo && hi >= m.lo;
        *m = if merge && same {
            Mark {
                block,
                epoch: e,
                lo: m.lo.min(lo),
                hi: m.hi.max(hi),
            }
        } else {
            Mark {
                block,
                epoch: e,
                lo,
                hi,
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ranges_checked_at_the_current_epoch_of_the_same_block_are_skipped() {
        let mut s = Seen::default();
        assert_eq!(
            s.unchecked(0, 3, 7, Some(1), (48, 60), true),
            [(48, 60), (60, 60)]
        );
        s.checked(0, 3, 7, Some(1), (48, 60), true);
        // Same block, same epoch: only what grew is left.
        assert_eq!(
            s.unchecked(0, 3, 7, Some(1), (48, 62), true),
            [(48, 48), (60, 62)]
        );
        assert_eq!(
            s.unchecked(0, 3, 7, Some(1), (50, 58), true),
            [(50, 48), (60, 58)]
        );
        // A write since, another block, no epochs, another entry or group: all of it.
        assert_eq!(
            s.unchecked(0, 3, 7, Some(2), (48, 60), true),
            [(48, 60), (60, 60)]
        );
        assert_eq!(
            s.unchecked(0, 3, 8, Some(1), (48, 60), true),
            [(48, 60), (60, 60)]
        );
        assert_eq!(
            s.unchecked(0, 3, 7, None, (48, 60), true),
            [(48, 60), (60, 60)]
        );
        assert_eq!(
            s.unchecked(0, 2, 7, Some(1), (48, 60), true),
            [(48, 60), (60, 60)]
        );
        assert_eq!(
            s.unchecked(1, 3, 7, Some(1), (48, 60), true),
            [(48, 60), (60, 60)]
        );
        // Merged ranges grow; a Mamba state (no merge) is skipped only at the same position.
        s.checked(0, 3, 7, Some(1), (60, 64), true);
        assert_eq!(
            s.unchecked(0, 3, 7, Some(1), (48, 64), true),
            [(48, 48), (64, 64)]
        );
        s.checked(1, 0, 9, Some(4), (5, 6), false);
        assert_eq!(
            s.unchecked(1, 0, 9, Some(4), (5, 6), false),
            [(5, 5), (6, 6)]
        );
        assert_eq!(
            s.unchecked(1, 0, 9, Some(4), (6, 7), false),
            [(6, 7), (7, 7)]
        );
        // Nothing is recorded without an epoch or for the null block.
        s.checked(2, 0, 0, Some(1), (0, 4), true);
        s.checked(2, 1, 5, None, (0, 4), true);
        assert_eq!(
            s.unchecked(2, 0, 0, Some(1), (0, 4), true),
            [(0, 4), (4, 4)]
        );
        assert_eq!(
            s.unchecked(2, 1, 5, Some(0), (0, 4), true),
            [(0, 4), (4, 4)]
        );
    }
}
