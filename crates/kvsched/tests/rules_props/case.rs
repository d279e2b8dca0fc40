//! The generated case: geometry, requests and the failure report, with the readings of
//! docs/rules.md every property needs (P, S, canonical order, what is reported).

use kvsched::rules::geometry::{BlockId, Geometry};
use kvsched::rules::recovery::{recover, InvalidSet, Mode, Outcome, Policy, Request, RequestClass};

pub const MODES: [Mode; 2] = [Mode::Vllm, Mode::Safe];
pub const POLICIES: [Policy; 2] = [Policy::Recompute, Policy::Fail];
/// An id no table holds.
pub const ABSENT_ID: BlockId = 10_000_000;

/// The report as given: flat ids, plus (when qualified) one list per group.
#[derive(Clone, Debug)]
pub struct Report {
    pub flat: Vec<BlockId>,
    pub by_group: Option<Vec<Vec<BlockId>>>,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub geo: Geometry,
    pub requests: Vec<Request>,
    pub report: Report,
    /// Whether a non-null id names one block across all groups (one pool).
    pub unique_ids: bool,
}

impl Case {
    pub fn invalid_set(&self) -> InvalidSet {
        match &self.report.by_group {
            None => InvalidSet::flat(self.report.flat.iter().copied(), &self.geo),
            Some(lists) => {
                InvalidSet::with_groups(self.report.flat.iter().copied(), lists, &self.geo)
                    .expect("one list per group")
            }
        }
    }

    pub fn run(&self, mode: Mode, policy: Policy) -> Outcome {
        recover(&self.geo, mode, policy, &self.requests, &self.invalid_set())
    }

    /// Whether `id` is reported for group `g` (docs/rules.md#block-ids-and-failure-reports: flat ids match in every group,
    /// qualified ones only in their group; the null block never).
    pub fn reported(&self, g: usize, id: BlockId) -> bool {
        if id == self.geo.null_block() {
            return false;
        }
        self.report.flat.contains(&id)
            || self
                .report
                .by_group
                .as_ref()
                .is_some_and(|lists| lists[g].contains(&id))
    }

    pub fn p(&self, r: usize) -> u64 {
        let q = &self.requests[r];
        q.num_computed_tokens - q.num_scheduled_tokens
    }

    pub fn s(&self) -> u64 {
        self.geo.scheduler_block_size()
    }

    /// Canonical order: async requests in input order, then sync requests.
    pub fn canonical(&self) -> Vec<usize> {
        let n = self.requests.len();
        let a = (0..n).filter(|&r| self.requests[r].class == RequestClass::Async);
        let s = (0..n).filter(|&r| self.requests[r].class == RequestClass::Sync);
        a.chain(s).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub g: usize,
    pub idx: usize,
    pub id: BlockId,
    pub pos: u64,
}
