//! Which blocks a failure report may roll back. A report is believed only about blocks its
//! reporter wrote: an asynchronous load's failure about the load's own blocks, an engine's
//! failed blocks about the destinations of the step's synchronous loads. Anything else it
//! names is counted and ignored, never applied to another request.

use crate::pool::{BlockRef, Generation};
use crate::rules::geometry::{BlockId, Geometry};

/// What a failure report named that was not applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ignored {
    /// Blocks that were not the reporter's own.
    pub foreign: u64,
    /// Own blocks at a generation that is no longer current (freed and reused since).
    pub stale: u64,
}

/// The non-null blocks a load of tokens `start..end` writes into `tables` (one per group, with
/// the generations `gens` they are held at), in group then table order.
pub fn load_blocks(
    geo: &Geometry,
    tables: &[Vec<BlockId>],
    gens: &[Vec<Generation>],
    start: u64,
    end: u64,
) -> Vec<BlockRef> {
    let mut out = Vec::new();
    for_each_load_block(geo, tables, gens, start, end, |b| out.push(b));
    out
}

/// Calls `f` on each block [`load_blocks`] returns, in its order, without collecting them.
pub fn for_each_load_block(
    geo: &Geometry,
    tables: &[Vec<BlockId>],
    gens: &[Vec<Generation>],
    start: u64,
    end: u64,
    mut f: impl FnMut(BlockRef),
) {
    let null = geo.null_block();
    for ((grp, t), g) in geo.groups().iter().zip(tables).zip(gens) {
        // Planted bug for the trust tests: a load's blocks counted from the table's start, so
        // a failure takes the prefix below the load (another request's) for the load's own.
        let lo = if planted!("load-blocks-from-zero") {
            0
        } else {
            (start / grp.block_size) as usize
        };
        let hi = (grp.blocks_for_tokens(end) as usize).min(t.len());
        for (i, &id) in t.iter().enumerate().take(hi).skip(lo) {
            if id != null {
                f(BlockRef {
                    id,
                    generation: g.get(i).copied().unwrap_or(0),
                });
            }
        }
    }
}

/// The blocks an asynchronous load's failure rolls back, appended to `out`: the load's `own`
/// blocks (the non-null blocks it writes) that the report `named`, where `is_current` says
/// the named generation is still current; or, when it named none of its own blocks, every
/// current own block — a connector that names only other blocks is not trusted to know
/// which of its own are fine.
pub fn failed_load_blocks(
    own: &[BlockRef],
    named: impl IntoIterator<Item = BlockRef>,
    is_current: impl Fn(BlockRef) -> bool,
    out: &mut Vec<BlockId>,
) -> Ignored {
    let mut ignored = Ignored::default();
    let mut named_own = false;
    for b in named {
        if !own.iter().any(|o| o.id == b.id) {
            ignored.foreign += 1;
        } else if is_current(b) {
            named_own = true;
            out.push(b.id);
        } else {
            ignored.stale += 1;
        }
    }
    if !named_own {
        out.extend(own.iter().filter(|&&b| is_current(b)).map(|b| b.id));
    }
    ignored
}

/// What an engine's failed block names among the step's synchronous loads' destinations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncReport {
    /// A destination, at the generation the plan handed it out: the block to roll back.
    Destination(BlockRef),
    /// A destination's id at an older generation: another, earlier use of the slot.
    Stale,
    /// No destination of the step's sync loads.
    Foreign,
}

/// What an engine's failed block `b` names among the destinations `dests` of the step's
/// synchronous loads (one list per load, each block at the generation the plan handed out).
///
/// A destination named at its generation is that destination. Named at an older one, it is
/// an earlier use of the slot (generations only grow): stale. Named at a *newer* one, it
/// can be no earlier use, and the output's step says the report is about this step's loads:
/// the engine has the generation wrong, not the failure, so the destination as handed out
/// is rolled back — leaving it would keep what the failed load left in the block.
pub fn sync_report(dests: &[Vec<BlockRef>], b: BlockRef) -> SyncReport {
    // Planted bug `trust-stale` (scripts/plants.sh), with the one in `Runtime::engine_share`:
    // a report is trusted whatever its generation.
    if planted!("trust-stale") {
        if let Some(d) = dests.iter().flatten().find(|d| d.id == b.id) {
            return SyncReport::Destination(*d);
        }
    }
    let mut stale = false;
    for d in dests.iter().flatten().filter(|d| d.id == b.id) {
        // Planted bug `sync-newer-generation-ignored` (scripts/plants.sh): a destination
        // named at a newer generation is taken for stale, and its failed load's bytes kept.
        if *d == b || (b.generation > d.generation && !planted!("sync-newer-generation-ignored")) {
            return SyncReport::Destination(*d);
        }
        stale = true;
    }
    if stale {
        SyncReport::Stale
    } else {
        SyncReport::Foreign
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(id: BlockId, generation: u32) -> BlockRef {
        BlockRef { id, generation }
    }

    #[test]
    fn only_own_current_blocks_are_rolled_back() {
        let own = [b(1, 1), b(2, 1), b(3, 1)];
        let current = |r: BlockRef| r.generation == 1;
        let mut out = Vec::new();
        let ig = failed_load_blocks(&own, [b(2, 1), b(9, 1), b(3, 0)], current, &mut out);
        assert_eq!(out, [2]);
        assert_eq!(
            ig,
            Ignored {
                foreign: 1,
                stale: 1
            }
        );
        // Naming only blocks of others fails the whole load.
        out.clear();
        let ig = failed_load_blocks(&own, [b(9, 1)], current, &mut out);
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(ig.foreign, 1);
    }

    #[test]
    fn sync_destinations_are_the_steps_sync_load_blocks() {
        let dests = vec![vec![b(4, 1)], vec![b(5, 2), b(6, 2)]];
        assert_eq!(
            sync_report(&dests, b(6, 2)),
            SyncReport::Destination(b(6, 2))
        );
        assert_eq!(
            sync_report(&dests, b(6, 1)),
            SyncReport::Stale,
            "an earlier use of the slot"
        );
        assert_eq!(
            sync_report(&dests, b(6, 9)),
            SyncReport::Destination(b(6, 2)),
            "a newer generation is no earlier use: the destination as handed out"
        );
        assert_eq!(sync_report(&dests, b(7, 2)), SyncReport::Foreign);
    }
}
