//! The invariants of docs/runtime.md ("Invariants") checkable between steps: pool
//! conservation, no double free, every reference count matching the requests holding the
//! block, the shard's holder index in step with its tables, a real block wherever a running
//! request needs one, request accounts.

use super::state::State;
use kvsched::rules::geometry::BlockId;
use kvsched::runtime::shard::strategy::Pool;
use kvsched::runtime::shard::UnbackedEntry;

impl State {
    /// The violations of the invariants, one line each.
    pub(super) fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let blocks = &self.cx.blocks;
        let census = blocks.census();
        let allocatable = census.free + census.cached_unreferenced;
        if !census.conserved()
            || census.free != blocks.free_len()
            || blocks.allocatable() != allocatable
        {
            v.push(format!(
                "pool conservation: {census:?}, free list {}, allocatable {}",
                blocks.free_len(),
                blocks.allocatable()
            ));
        }
        if blocks.double_frees() > 0 {
            v.push(format!("double frees: {}", blocks.double_frees()));
        }
        let null = self.cx.geo.null_block();
        if !self.shard.index_consistent(null) {
            v.push("holder index out of step with the block tables".into());
        }
        let mut held = vec![0u32; blocks.num_blocks()];
        for id in self.shard.held_blocks(null) {
            if let Some(h) = held.get_mut(id as usize) {
                *h += 1;
            }
        }
        for (i, &n) in held.iter().enumerate().skip(1) {
            let rc = blocks.ref_count(i as BlockId);
            if n != rc {
                v.push(format!("block {i}: held by {n} requests, ref count {rc}"));
            }
        }
        v.extend(UnbackedEntry::violations(
            &self.shard.unbacked_entries(&self.cx.geo),
        ));
        let m = &self.metrics;
        let live = self.live.len() as u64;
        if m.finished + m.failed + m.cancelled + live != m.submitted {
            v.push(format!(
                "accounting: submitted {} != finished {} + failed {} + cancelled {} + live {live}",
                m.submitted, m.finished, m.failed, m.cancelled
            ));
        }
        v
    }
}
