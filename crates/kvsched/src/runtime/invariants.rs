//! The invariants that can be checked between steps (`Runtime::check_invariants`, feature
//! `internals`; shutdown checks them in every build).

use crate::rules::geometry::BlockId;
use crate::runtime::shard::UnbackedEntry;
use crate::runtime::step::Runtime;

impl Runtime {
    /// The invariants of docs/runtime.md ("Invariants") that can be checked between steps;
    /// returns the violations. A test hook, not API: only with feature `internals` (the test
    /// kit's `internals` feature turns it on for tests; the stress tool checks it every few
    /// steps). Shutdown checks the same in every build ([`Report::violations`](crate::Report)).
    #[cfg(feature = "internals")]
    pub fn check_invariants(&self) -> Vec<String> {
        self.invariant_violations()
    }

    /// The violations of those invariants now (empty when all hold).
    pub(crate) fn invariant_violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let census = self.inner.pool.census();
        if !census.conserved() {
            v.push(format!("pool conservation: {census:?}"));
        }
        let allocatable = self.inner.pool.allocatable();
        if allocatable != census.free + census.cached_unreferenced {
            v.push(format!(
                "pool count of allocatable blocks {allocatable}, census {census:?}"
            ));
        }
        let df = self.inner.pool.double_frees();
        if df > 0 {
            v.push(format!("double frees: {df}"));
        }
        let stale = self.inner.pool.stale_releases();
        if stale > 0 {
            v.push(format!("releases of a block's old generation: {stale}"));
        }
        for (i, s) in self.inner.shards.iter().enumerate() {
            if !s.state.lock().index_consistent(self.inner.geo.null_block()) {
                v.push(format!(
                    "shard {i}: holder index out of step with the block tables"
                ));
            }
        }
        // Between steps requests are the only holders: each block's count is its holders.
        let null = self.inner.geo.null_block();
        let mut held = vec![0u32; self.inner.pool.num_blocks()];
        for s in &self.inner.shards {
            for id in s.state.lock().held_blocks(null) {
                if let Some(h) = held.get_mut(id as usize) {
                    *h += 1;
                }
            }
        }
        let mut bad = 0;
        for (id, &n) in held.iter().enumerate().skip(1) {
            let rc = self.inner.pool.ref_count(id as BlockId);
            if rc != n {
                if bad < 5 {
                    v.push(format!(
                        "block {id}: held by {n} requests, reference count {rc}"
                    ));
                }
                bad += 1;
            }
        }
        if bad > 5 {
            v.push(format!(
                "… {} more blocks whose reference count is not their holder count",
                bad - 5
            ));
        }
        let unbacked: Vec<_> = self
            .inner
            .shards
            .iter()
            .flat_map(|s| s.state.lock().unbacked_entries(&self.inner.geo))
            .collect();
        v.extend(UnbackedEntry::violations(&unbacked));
        // Read with submits held off: a `Handle::submit` on another thread adds its id to
        // the live set, then counts it, both under the read lock of `open` — read between
        // the two, it would be live and not yet submitted. (Planted bug
        // `accounting-read-unheld`, scripts/plants.sh: read without the lock.)
        let held = (!planted!("accounting-read-unheld")).then(|| self.inner.open.write());
        let m = self.metrics();
        let live = self.live() as u64;
        drop(held);
        if m.finished + m.failed + m.cancelled + live != m.submitted {
            v.push(format!(
                "accounting: submitted {} != finished {} + failed {} + cancelled {} + live {live}",
                m.submitted, m.finished, m.failed, m.cancelled
            ));
        }
        v
    }
}
