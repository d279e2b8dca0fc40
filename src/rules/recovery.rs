//! The recovery rules of SPEC §3 (mode [`Mode::Vllm`]) and §4 (mode [`Mode::Safe`]).
//!
//! Pure: plain data in, plain data out; no threads, clocks or I/O. The rules are exposed per
//! request so that both engines share them:
//!
//! 1. [`scan_request`] finds one request's *hits* against a report ([`InvalidSet`]);
//! 2. the caller decides, for each hit, whether the request owns it ([`HitOwner::Mine`]) or
//!    another request does — the sequential engine ([`recover`]) from a marked set walked in
//!    canonical order, the runtime from its claim table;
//! 3. [`decide`] turns the hits and their ownership into the request's [`Decision`].
//!
//! # Guarantees
//!
//! * Every boundary is a multiple of `S` and at most the pre-step length `P`.
//! * Null entries are never hits, never claimed, never evicted (in every group, as the hybrid
//!   rule says; vLLM 0.33 itself does not test for nulls).
//! * Mode `vllm` on one full-attention group is bit-exact with vLLM 0.33; on several groups it
//!   applies the hybrid rule.
//! * Mode `safe` additionally: one claim per block per report (one marked set spans both
//!   scans), `waits_for` for sharers, a boundary from which every group can resume, and
//!   eviction of everything at or past a claimant's boundary under either policy.
//!
//! # Cost
//!
//! [`scan_request`] is `O(entries scanned)` with a branch-free bitmap test per entry (see
//! [`BlockSet`]); [`decide`] is `O(hits)` plus, in mode `safe` and only for a request with a
//! new hit, `O(table length)`.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;
use thiserror::Error;

use crate::rules::blockset::BlockSet;
use crate::rules::geometry::{BlockId, Geometry, GroupKind};

/// Which rule set to apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// vLLM 0.33's behaviour extended by the hybrid rule (SPEC §3).
    Vllm,
    /// The safer rules of SPEC §4 (default).
    #[default]
    Safe,
}

/// What happens to affected requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Roll back and recompute (default).
    #[default]
    Recompute,
    /// Finish every affected request with an error.
    Fail,
}

/// Whether a request's load was asynchronous or synchronous in this report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestClass {
    /// Its external load is in flight (vLLM's `WAITING_FOR_REMOTE_KVS`).
    Async,
    /// Running; it loaded in the step whose output carries the report.
    Sync,
}

/// A borrowed view of one request, as the rules see it.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// Async or sync for this report.
    pub class: RequestClass,
    /// Computed tokens, including the ones scheduled in the step.
    pub num_computed_tokens: u64,
    /// Tokens scheduled in the step (0 for async requests).
    pub num_scheduled_tokens: u64,
    /// One block table per cache group, in group order.
    pub block_tables: &'a [Vec<BlockId>],
}

impl RequestView<'_> {
    /// The pre-step computed length `P = num_computed_tokens − num_scheduled_tokens`
    /// (saturating: [`validate_request`] rejects `num_scheduled_tokens > num_computed_tokens`).
    #[inline]
    pub fn pre_step_tokens(&self) -> u64 {
        self.num_computed_tokens
            .saturating_sub(self.num_scheduled_tokens)
    }
}

/// An owned request, for the sequential engine and the replay tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Unique id.
    pub id: String,
    /// Async or sync for this report.
    pub class: RequestClass,
    /// Computed tokens, including the ones scheduled in the step.
    pub num_computed_tokens: u64,
    /// Tokens scheduled in the step (0 for async requests).
    pub num_scheduled_tokens: u64,
    /// One block table per cache group, in group order.
    pub block_tables: Vec<Vec<BlockId>>,
}

impl Request {
    /// The rules' view of this request.
    #[inline]
    pub fn view(&self) -> RequestView<'_> {
        RequestView {
            class: self.class,
            num_computed_tokens: self.num_computed_tokens,
            num_scheduled_tokens: self.num_scheduled_tokens,
            block_tables: &self.block_tables,
        }
    }
}

/// Why a request or report was rejected.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RecoveryError {
    /// A request has a table count different from the group count.
    #[error("{given} tables given, {groups} groups configured")]
    TableCount {
        /// Tables in the request.
        given: usize,
        /// Groups in the geometry.
        groups: usize,
    },
    /// `num_scheduled_tokens > num_computed_tokens`.
    #[error("num_scheduled_tokens {scheduled} exceeds num_computed_tokens {computed}")]
    ScheduledExceedsComputed {
        /// Scheduled tokens.
        scheduled: u64,
        /// Computed tokens.
        computed: u64,
    },
    /// An async request with scheduled tokens.
    #[error("an async request has num_scheduled_tokens {scheduled}, must be 0")]
    AsyncWithScheduled {
        /// Scheduled tokens.
        scheduled: u64,
    },
    /// A null id inside a full-attention table below `P`.
    #[error("group {group} is full_attention but entry {index} (below P = {pre_step_tokens}) is the null block")]
    NullInFullAttention {
        /// Group index.
        group: usize,
        /// Entry index.
        index: usize,
        /// The request's pre-step length.
        pre_step_tokens: u64,
    },
    /// Two requests share an id.
    #[error("duplicate request id {id:?}")]
    DuplicateRequestId {
        /// The repeated id.
        id: String,
    },
    /// A group-qualified report whose list count is not the group count.
    #[error("{given} lists given, {groups} groups configured")]
    ReportGroupCount {
        /// Lists in the report.
        given: usize,
        /// Groups in the geometry.
        groups: usize,
    },
}

/// Checks one request against the geometry (SPEC §5's request-level bad input).
pub fn validate_request(geo: &Geometry, req: RequestView<'_>) -> Result<(), RecoveryError> {
    if req.block_tables.len() != geo.num_groups() {
        return Err(RecoveryError::TableCount {
            given: req.block_tables.len(),
            groups: geo.num_groups(),
        });
    }
    if req.num_scheduled_tokens > req.num_computed_tokens {
        return Err(RecoveryError::ScheduledExceedsComputed {
            scheduled: req.num_scheduled_tokens,
            computed: req.num_computed_tokens,
        });
    }
    if req.class == RequestClass::Async && req.num_scheduled_tokens != 0 {
        return Err(RecoveryError::AsyncWithScheduled {
            scheduled: req.num_scheduled_tokens,
        });
    }
    let p = req.pre_step_tokens();
    for (g, (group, table)) in geo.groups().iter().zip(req.block_tables).enumerate() {
        if group.kind == GroupKind::FullAttention {
            let below_p = scan_len(group.blocks_for_tokens(p), table.len());
            if let Some(index) = table[..below_p]
                .iter()
                .position(|&id| id == geo.null_block())
            {
                return Err(RecoveryError::NullInFullAttention {
                    group: g,
                    index,
                    pre_step_tokens: p,
                });
            }
        }
    }
    Ok(())
}

#[inline]
fn scan_len(blocks: u64, table_len: usize) -> usize {
    usize::try_from(blocks).map_or(table_len, |b| b.min(table_len))
}

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

/// One table entry of a request that is in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hit {
    /// Cache group.
    pub group: u32,
    /// Index in that group's table.
    pub index: u32,
    /// The block id.
    pub block: BlockId,
    /// Start token position `index · b_g`.
    pub position: u64,
}

/// Appends to `hits` every hit of `req` against `invalid`, in (group, index) order: for each
/// group `g`, the non-null entries at indices `< min(ceil(P / b_g), len)` that are in the
/// report's set for `g` (SPEC §3 step 1).
pub fn scan_request(
    geo: &Geometry,
    req: RequestView<'_>,
    invalid: &InvalidSet,
    hits: &mut Vec<Hit>,
) {
    let p = req.pre_step_tokens();
    for (g, (group, table)) in geo.groups().iter().zip(req.block_tables).enumerate() {
        let set = invalid.group(g);
        if set.is_empty() {
            continue;
        }
        let n = scan_len(group.blocks_for_tokens(p), table.len());
        let b = group.block_size;
        set.scan(&table[..n], |i, block| {
            hits.push(Hit {
                group: g as u32,
                index: i as u32,
                block,
                position: i as u64 * b,
            })
        });
    }
}

/// Who recomputes a hit's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HitOwner<O> {
    /// This request: a *new* hit.
    Mine,
    /// Another request, earlier in canonical order: an *old* hit.
    Other(O),
}

/// Where an affected request goes (SPEC §3 "Then").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// No hit.
    Unaffected,
    /// `recompute`, async: its load result is cached only up to the new computed length.
    FailedRecving,
    /// `recompute`, sync: its sampled tokens from the step are discarded.
    Skip,
    /// `fail`: finished with an error.
    Failed,
}

/// One request's outcome under the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision<O> {
    /// Where the request goes.
    pub disposition: Disposition,
    /// The resulting computed length (unchanged when unaffected).
    pub num_computed_tokens: u64,
    /// Tokens to recompute (or discarded for old-hit-only sync requests).
    pub affected_tokens: u64,
    /// Ids of the new hits, ascending, deduplicated.
    pub claimed_blocks: Vec<BlockId>,
    /// Old-hit blocks starting below the new computed length, one per id, ascending, with the
    /// owner. When an id has several owners (one id in two groups' tables, with per-group
    /// pools), the least `O` — the earliest in canonical order. Mode `safe` + `recompute` only.
    pub waits_for: Vec<(BlockId, O)>,
    /// Blocks whose prefix-cache entry this request's rollback clears *as applied* under the
    /// mode and policy: non-null entries at indices `≥ boundary / b_g` in every group.
    /// Ascending, deduplicated.
    pub evicted_blocks: Vec<BlockId>,
}

impl<O> Decision<O> {
    /// Whether the request had any hit.
    #[inline]
    pub fn affected(&self) -> bool {
        self.disposition != Disposition::Unaffected
    }

    fn unaffected(num_computed_tokens: u64) -> Self {
        Decision {
            disposition: Disposition::Unaffected,
            num_computed_tokens,
            affected_tokens: 0,
            claimed_blocks: Vec::new(),
            waits_for: Vec::new(),
            evicted_blocks: Vec::new(),
        }
    }
}

/// Decides one request (SPEC §3 steps 3–5 and §4): `hits` from [`scan_request`], `owners[k]`
/// the owner of `hits[k]`.
///
/// The request must have passed [`validate_request`]; otherwise the result is still defined
/// (no panic) but meaningless.
pub fn decide<O: Ord + Clone>(
    geo: &Geometry,
    mode: Mode,
    policy: Policy,
    req: RequestView<'_>,
    hits: &[Hit],
    owners: &[HitOwner<O>],
) -> Decision<O> {
    debug_assert_eq!(hits.len(), owners.len());
    if hits.is_empty() {
        return Decision::unaffected(req.num_computed_tokens);
    }
    let p = req.pre_step_tokens();
    let min_new = hits
        .iter()
        .zip(owners)
        .filter(|(_, o)| matches!(o, HitOwner::Mine))
        .map(|(h, _)| h.position)
        .min();
    let (nct, affected_tokens) = match min_new {
        Some(pos) => {
            let boundary = match mode {
                Mode::Vllm => geo.round_down_to_s(pos),
                Mode::Safe => resumable_boundary(geo, req, hits, owners, pos),
            };
            (boundary, p - boundary)
        }
        None => (p, req.num_scheduled_tokens),
    };
    let disposition = match (policy, req.class) {
        (Policy::Fail, _) => Disposition::Failed,
        (Policy::Recompute, RequestClass::Async) => Disposition::FailedRecving,
        (Policy::Recompute, RequestClass::Sync) => Disposition::Skip,
    };
    let mut claimed_blocks: Vec<BlockId> = hits
        .iter()
        .zip(owners)
        .filter(|(_, o)| matches!(o, HitOwner::Mine))
        .map(|(h, _)| h.block)
        .collect();
    claimed_blocks.sort_unstable();
    claimed_blocks.dedup();

    let mut waits_for = Vec::new();
    if mode == Mode::Safe && policy == Policy::Recompute {
        for (h, o) in hits.iter().zip(owners) {
            if let HitOwner::Other(owner) = o {
                if h.position < nct {
                    waits_for.push((h.block, owner.clone()));
                }
            }
        }
        // One entry per id: the least owner.
        waits_for.sort_unstable();
        waits_for.dedup_by(|later, first| later.0 == first.0);
    }

    let applies_eviction = min_new.is_some()
        && match mode {
            Mode::Safe => true,
            Mode::Vllm => req.class == RequestClass::Sync && policy == Policy::Fail,
        };
    let evicted_blocks = if applies_eviction {
        entries_from(geo, req, nct)
    } else {
        Vec::new()
    };

    Decision {
        disposition,
        num_computed_tokens: nct,
        affected_tokens,
        claimed_blocks,
        waits_for,
        evicted_blocks,
    }
}

/// Non-null entries at indices `≥ boundary / b_g` of every group, ascending, deduplicated.
fn entries_from(geo: &Geometry, req: RequestView<'_>, boundary: u64) -> Vec<BlockId> {
    let null = geo.null_block();
    let mut out = Vec::new();
    for (group, table) in geo.groups().iter().zip(req.block_tables) {
        let from = scan_len(boundary / group.block_size, table.len());
        out.extend(table[from..].iter().copied().filter(|&id| id != null));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// SPEC §4 item 3: the largest multiple `c` of `S` with `c ≤ earliest_new` from which every
/// group can resume, else 0.
///
/// Per group, resuming at `c > 0` needs a range of entries `[lo, hi)` to be real (present and
/// non-null) and not a new hit of this request (another request's block counts as valid: the
/// request waits for it):
/// `full_attention` `[0, c/b)`; `sliding_window` the entries holding tokens
/// `[max(0, c − window + 1), c)`; `mamba` `[c/b − 1, c/b)`. Every kind needs `hi = c/b ≤ len`,
/// so candidates start at `min(earliest_new, min_g len_g · b_g)` and there are at most
/// `min_g len_g + 1` of them; each is checked in `O(groups)` with per-group prefix counts of
/// unusable entries.
fn resumable_boundary<O>(
    geo: &Geometry,
    req: RequestView<'_>,
    hits: &[Hit],
    owners: &[HitOwner<O>],
    earliest_new: u64,
) -> u64 {
    let groups = geo.groups();
    // Every kind needs entry `c/b − 1` at `c > 0`, except a sliding window of one token,
    // whose range `[c, c)` is empty.
    let cap = groups
        .iter()
        .zip(req.block_tables)
        .filter(|(g, _)| g.kind != GroupKind::SlidingWindow { window: 1 })
        .map(|(g, t)| (t.len() as u64).saturating_mul(g.block_size))
        .fold(earliest_new, u64::min);
    let start = geo.round_down_to_s(cap);
    if start == 0 {
        return 0;
    }
    // bad[g][i] = number of unusable entries among table[g][..i], for i ≤ start / b_g
    // (≤ len, see above).
    let null = geo.null_block();
    let mut bad: Vec<Vec<u32>> = Vec::with_capacity(groups.len());
    for (g, (group, table)) in groups.iter().zip(req.block_tables).enumerate() {
        let n = scan_len(start / group.block_size, table.len());
        let mut unusable = vec![false; n];
        for (i, &id) in table[..n].iter().enumerate() {
            unusable[i] = id == null;
        }
        for (h, o) in hits.iter().zip(owners) {
            if h.group as usize == g && matches!(o, HitOwner::Mine) && (h.index as usize) < n {
                unusable[h.index as usize] = true;
            }
        }
        let mut prefix = Vec::with_capacity(n + 1);
        let mut acc = 0u32;
        prefix.push(0);
        for u in unusable {
            acc += u32::from(u);
            prefix.push(acc);
        }
        bad.push(prefix);
    }
    let s = geo.scheduler_block_size();
    let mut c = start;
    while c > 0 {
        let ok = groups.iter().zip(&bad).all(|(group, prefix)| {
            let b = group.block_size;
            let hi = c / b; // ≤ prefix.len() - 1 by construction of `start`
            let lo = match group.kind {
                GroupKind::FullAttention => 0,
                GroupKind::SlidingWindow { window } => c.saturating_sub(window - 1) / b,
                GroupKind::Mamba { .. } => hi - 1,
            };
            let (lo, hi) = (lo as usize, hi as usize);
            lo >= hi || (hi < prefix.len() && prefix[hi] == prefix[lo])
        });
        if ok {
            return c;
        }
        c -= s;
    }
    0
}

/// A request's result in the sequential engine; owners are request indices (into the input).
pub type RequestOutcome = Decision<usize>;

/// The result of one report (SPEC §5's outcome, with request indices instead of ids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Per request, in input order.
    pub requests: Vec<RequestOutcome>,
    /// Affected request indices, canonical order.
    pub affected: Vec<usize>,
    /// `recompute` sync affected, canonical order.
    pub skip: Vec<usize>,
    /// `fail` affected, canonical order.
    pub failed: Vec<usize>,
    /// `recompute` async affected, canonical order.
    pub failed_recving: Vec<usize>,
    /// Sum of `affected_tokens`.
    pub total_affected_tokens: u128,
    /// Blocks whose prefix-cache entries were cleared, ascending.
    pub evicted_blocks: Vec<BlockId>,
}

/// Canonical order (SPEC §2): async requests in input order, then sync requests.
pub fn canonical_order(requests: &[Request]) -> Vec<usize> {
    let asyncs = (0..requests.len()).filter(|&i| requests[i].class == RequestClass::Async);
    let syncs = (0..requests.len()).filter(|&i| requests[i].class == RequestClass::Sync);
    asyncs.chain(syncs).collect()
}

/// Validates every request (and id uniqueness); errors carry the request index.
pub fn validate_requests(
    geo: &Geometry,
    requests: &[Request],
) -> Result<(), (usize, RecoveryError)> {
    let mut seen = rustc_hash::FxHashSet::default();
    for (i, r) in requests.iter().enumerate() {
        validate_request(geo, r.view()).map_err(|e| (i, e))?;
        if !seen.insert(r.id.as_str()) {
            return Err((i, RecoveryError::DuplicateRequestId { id: r.id.clone() }));
        }
    }
    Ok(())
}

/// The sequential engine: applies the rules to `requests` in canonical order, ownership from
/// marked sets (one per scan in mode `vllm`, one for both scans in mode `safe`).
///
/// Requests should have passed [`validate_requests`]; invalid ones give a defined but
/// meaningless result, never a panic.
pub fn recover(
    geo: &Geometry,
    mode: Mode,
    policy: Policy,
    requests: &[Request],
    invalid: &InvalidSet,
) -> Outcome {
    let mut decisions: Vec<Option<RequestOutcome>> = vec![None; requests.len()];
    let order = canonical_order(requests);
    // Owners are canonical positions while deciding (so "the least owner" of an id is the
    // earliest in canonical order), mapped back to input indices afterwards.
    let mut marked: FxHashMap<(u32, BlockId), usize> = FxHashMap::default();
    let mut hits = Vec::new();
    let mut owners = Vec::new();
    let mut prev_class = None;
    for (pos, &i) in order.iter().enumerate() {
        let req = requests[i].view();
        if mode == Mode::Vllm
            && prev_class == Some(RequestClass::Async)
            && req.class == RequestClass::Sync
        {
            marked.clear(); // the sync scan starts with its own empty marked set
        }
        prev_class = Some(req.class);
        hits.clear();
        owners.clear();
        if !invalid.is_empty() {
            scan_request(geo, req, invalid, &mut hits);
        }
        owners.extend(hits.iter().map(|h| match marked.get(&(h.group, h.block)) {
            Some(&o) => HitOwner::Other(o),
            None => HitOwner::Mine,
        }));
        for (h, o) in hits.iter().zip(&owners) {
            if let (HitOwner::Mine, Entry::Vacant(e)) = (o, marked.entry((h.group, h.block))) {
                e.insert(pos);
            }
        }
        let mut d = decide(geo, mode, policy, req, &hits, &owners);
        for w in &mut d.waits_for {
            w.1 = order[w.1];
        }
        decisions[i] = Some(d);
    }
    let requests_out: Vec<RequestOutcome> = decisions.into_iter().flatten().collect();
    outcome_from_decisions(requests, requests_out)
}

/// Assembles an [`Outcome`] from per-request decisions (in input order): the canonical-order
/// lists, the total of affected tokens and the union of applied evictions.
pub fn outcome_from_decisions(requests: &[Request], decisions: Vec<RequestOutcome>) -> Outcome {
    let mut out = Outcome {
        affected: Vec::new(),
        skip: Vec::new(),
        failed: Vec::new(),
        failed_recving: Vec::new(),
        total_affected_tokens: 0,
        evicted_blocks: Vec::new(),
        requests: Vec::new(),
    };
    for i in canonical_order(requests) {
        let Some(d) = decisions.get(i) else { continue };
        out.total_affected_tokens += u128::from(d.affected_tokens);
        match d.disposition {
            Disposition::Unaffected => continue,
            Disposition::FailedRecving => out.failed_recving.push(i),
            Disposition::Skip => out.skip.push(i),
            Disposition::Failed => out.failed.push(i),
        }
        out.affected.push(i);
        out.evicted_blocks.extend_from_slice(&d.evicted_blocks);
    }
    out.evicted_blocks.sort_unstable();
    out.evicted_blocks.dedup();
    out.requests = decisions;
    out
}
