//! The invariants of docs/runtime.md ("Invariants") checkable between steps: pool conservation, no double free, every
//! reference count matching the requests holding the block, request accounts.

use rustc_hash::FxHashMap;

use super::state::State;
use kvsched::rules::geometry::BlockId;

impl State {
    /// The violations of the invariants, one line each.
    pub(super) fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let census = self.blocks.census();
        if !census.conserved() || census.free != self.blocks.free.len() {
            v.push(format!(
                "pool conservation: {census:?}, free list {}",
                self.blocks.free.len()
            ));
        }
        if self.blocks.double_frees > 0 {
            v.push(format!("double frees: {}", self.blocks.double_frees));
        }
        let null = self.null();
        let mut held = FxHashMap::<BlockId, u32>::default();
        for r in self.reqs.values() {
            for &id in r.tables.iter().flatten().filter(|&&id| id != null) {
                *held.entry(id).or_default() += 1;
            }
        }
        for i in 1..self.blocks.ref_count.len() {
            let (n, rc) = (
                held.get(&(i as BlockId)).copied().unwrap_or(0),
                self.blocks.ref_count[i],
            );
            if n != rc {
                v.push(format!("block {i}: held by {n} requests, ref count {rc}"));
            }
        }
        let m = &self.metrics;
        if m.finished + m.failed + m.cancelled + self.reqs.len() as u64 != m.submitted {
            v.push(format!(
                "accounting: submitted {} != finished {} + failed {} + cancelled {} + live {}",
                m.submitted,
                m.finished,
                m.failed,
                m.cancelled,
                self.reqs.len()
            ));
        }
        v
    }
}
