//! Which shard each of the engine's samples goes to, found without hashing its id.
//!
//! A sample names a request the latest plan scheduled to sample, and an engine answers
//! with the plan's own id (`s.id.clone()`, an `Arc<str>`), in plan order. The plan is the
//! shards' lists merged, each list in canonical order, so the samples of one shard's
//! requests come in that shard's order: a sample whose id is the very allocation of the
//! next sampling entry of some shard's list belongs to that shard. [`SampleRoutes`] keeps,
//! per shard, the addresses of those ids and a cursor, and matches each sample against
//! the cursors' entries, a comparison per shard instead of a hash of the id. A sample that
//! matches none (another `Arc` holding the same text, another order, a sample for a
//! request not scheduled to sample) is routed by [`shard_of`](super::route::shard_of), as
//! before; the shard then finds the request by its text either way.
//!
//! # Why an address names one request
//!
//! Addresses are recorded when a plan is made and forgotten when the next step begins
//! ([`SampleRoutes::forget`]). In between, every request of the plan is live — nothing
//! ends a request outside a step — and holds its id, so each recorded allocation is alive
//! and no other `Arc<str>` can sit at its address. A match is therefore that request's own
//! id. Debug builds check every match against the hash.

use std::sync::Arc as StdArc;

use crate::runtime::shard::ScheduledRequest;

/// Up to this many shards, a sample is matched against every shard's next entry; with more,
/// the comparisons would cost what the hash does, and samples are hashed.
const MAX_MATCHED_SHARDS: usize = 8;

/// Per shard, the addresses of the latest plan's sampling ids in the shard's order, and the
/// next one to match. See the module docs.
#[derive(Debug, Default)]
pub(super) struct SampleRoutes {
    ids: Vec<Vec<usize>>,
    next: Vec<usize>,
}

/// The address of an id's text: what identifies its allocation.
#[inline]
fn address(id: &StdArc<str>) -> usize {
    StdArc::as_ptr(id).cast::<u8>() as usize
}

impl SampleRoutes {
    /// Forgets every recorded address: a step is about to begin, and may end the requests
    /// they belong to.
    pub(super) fn forget(&mut self) {
        for ids in &mut self.ids {
            ids.clear();
        }
    }

    /// Records shard `shard`'s own entries of the plan being made (of `shards` in all).
    pub(super) fn record(&mut self, shard: usize, shards: usize, list: &[ScheduledRequest]) {
        self.record_ids(
            shard,
            shards,
            list.iter().filter(|s| s.samples).map(|s| &s.id),
        );
    }

    /// Records the ids of shard `shard`'s sampling entries, in its order.
    fn record_ids<'a>(
        &mut self,
        shard: usize,
        shards: usize,
        ids: impl Iterator<Item = &'a StdArc<str>>,
    ) {
        if shards <= 1 || shards > MAX_MATCHED_SHARDS {
            return;
        }
        if self.ids.len() < shards {
            self.ids.resize_with(shards, Vec::new);
            self.next.resize(shards, 0);
        }
        if let Some(list) = self.ids.get_mut(shard) {
            list.clear();
            list.extend(ids.map(address));
        }
    }

    /// Starts matching an output's samples from the plan's first entries.
    pub(super) fn rewind(&mut self) {
        self.next.iter_mut().for_each(|n| *n = 0);
    }

    /// The shard whose next sampling entry is `id` itself (and moves past it), if one is.
    #[inline]
    pub(super) fn route(&mut self, id: &StdArc<str>) -> Option<usize> {
        let a = address(id);
        for (shard, (ids, next)) in self.ids.iter().zip(&mut self.next).enumerate() {
            if ids.get(*next) == Some(&a) {
                *next += 1;
                return Some(shard);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<StdArc<str>> {
        names.iter().map(|&n| StdArc::from(n)).collect()
    }

    #[test]
    fn a_sample_routes_to_the_shard_whose_next_entry_is_its_own_id() {
        let (a, b) = (ids(&["a0", "a1"]), ids(&["b0", "b1", "b2"]));
        let mut r = SampleRoutes::default();
        r.record_ids(0, 2, a.iter());
        r.record_ids(1, 2, b.iter());
        r.rewind();
        // Plan order interleaves the shards; each shard's entries keep their order.
        let order = [&b[0], &a[0], &b[1], &b[2], &a[1]];
        let got: Vec<_> = order.iter().map(|id| r.route(id)).collect();
        assert_eq!(got, [Some(1), Some(0), Some(1), Some(1), Some(0)]);
        // A repeated sample matches no entry: it is hashed.
        assert_eq!(r.route(&a[1]), None);
        // Another output for the same plan starts again from the first entries.
        r.rewind();
        assert_eq!(r.route(&a[0]), Some(0));
    }

    #[test]
    fn only_the_plans_own_allocation_matches() {
        let a = ids(&["a0"]);
        let mut r = SampleRoutes::default();
        r.record_ids(0, 2, a.iter());
        r.rewind();
        // The same text in another allocation is not the plan's id: it is hashed.
        assert_eq!(r.route(&StdArc::from("a0")), None);
        assert_eq!(r.route(&StdArc::clone(&a[0])), Some(0));
    }

    #[test]
    fn out_of_order_samples_and_forgotten_plans_fall_back_to_the_hash() {
        let a = ids(&["a0", "a1"]);
        let mut r = SampleRoutes::default();
        r.record_ids(0, 2, a.iter());
        r.rewind();
        assert_eq!(r.route(&a[1]), None, "a1 is not shard 0's next entry");
        assert_eq!(r.route(&a[0]), Some(0));
        assert_eq!(r.route(&a[1]), Some(0));
        r.forget();
        r.rewind();
        assert_eq!(
            r.route(&a[0]),
            None,
            "a step began: the addresses are forgotten"
        );
    }

    #[test]
    fn one_shard_or_more_than_eight_record_nothing() {
        let a = ids(&["a0"]);
        for shards in [1, MAX_MATCHED_SHARDS + 1] {
            let mut r = SampleRoutes::default();
            r.record_ids(0, shards, a.iter());
            r.rewind();
            assert_eq!(r.route(&a[0]), None);
        }
    }
}
