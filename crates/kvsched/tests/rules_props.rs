//! Property tests of the recovery rules (docs/rules.md, modes `vllm` and `safe`) on random geometries, requests and
//! reports.
//!
//! Everything the properties compare against — the scan, the marked sets, the resume check,
//! the plain mode-`vllm` implementation — is written here again from the text of docs/rules.md, sharing
//! no code with `src/` beyond the public input and output types.

use std::collections::{BTreeSet, HashMap, HashSet};

use kvsched::rules::geometry::{BlockId, CacheGroup, Geometry, GroupKind, MambaMode};
use kvsched::rules::recovery::trace::{BoundaryRule, Unusable};
use kvsched::rules::recovery::{
    recover, recover_explained, validate_requests, Disposition, HitOwner, InvalidSet, Mode,
    Outcome, Policy, Request, RequestClass,
};
use proptest::prelude::*;

const MODES: [Mode; 2] = [Mode::Vllm, Mode::Safe];
const POLICIES: [Policy; 2] = [Policy::Recompute, Policy::Fail];
/// An id no table holds.
const ABSENT_ID: BlockId = 10_000_000;

// ---------------------------------------------------------------------------------------------
// the generated case

/// The report as given: flat ids, plus (when qualified) one list per group.
#[derive(Clone, Debug)]
struct Report {
    flat: Vec<BlockId>,
    by_group: Option<Vec<Vec<BlockId>>>,
}

#[derive(Clone, Debug)]
struct Case {
    geo: Geometry,
    requests: Vec<Request>,
    report: Report,
    /// Whether a non-null id names one block across all groups (one pool).
    unique_ids: bool,
}

impl Case {
    fn invalid_set(&self) -> InvalidSet {
        match &self.report.by_group {
            None => InvalidSet::flat(self.report.flat.iter().copied(), &self.geo),
            Some(lists) => {
                InvalidSet::with_groups(self.report.flat.iter().copied(), lists, &self.geo)
                    .expect("one list per group")
            }
        }
    }

    fn run(&self, mode: Mode, policy: Policy) -> Outcome {
        recover(&self.geo, mode, policy, &self.requests, &self.invalid_set())
    }

    /// Whether `id` is reported for group `g` (docs/rules.md#block-ids-and-failure-reports: flat ids match in every group,
    /// qualified ones only in their group; the null block never).
    fn reported(&self, g: usize, id: BlockId) -> bool {
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

    fn p(&self, r: usize) -> u64 {
        let q = &self.requests[r];
        q.num_computed_tokens - q.num_scheduled_tokens
    }

    fn s(&self) -> u64 {
        self.geo.scheduler_block_size()
    }

    /// Canonical order: async requests in input order, then sync requests.
    fn canonical(&self) -> Vec<usize> {
        let n = self.requests.len();
        let a = (0..n).filter(|&r| self.requests[r].class == RequestClass::Async);
        let s = (0..n).filter(|&r| self.requests[r].class == RequestClass::Sync);
        a.chain(s).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hit {
    g: usize,
    idx: usize,
    id: BlockId,
    pos: u64,
}

/// Mode `vllm`'s scan (docs/rules.md#scanning-a-request), from the text: indices `0 .. min(ceil(P / b_g), len) - 1`, nulls skipped.
fn hits_of(case: &Case, r: usize) -> Vec<Hit> {
    let p = case.p(r);
    let null = case.geo.null_block();
    let mut out = Vec::new();
    for (g, group) in case.geo.groups().iter().enumerate() {
        let b = group.block_size;
        let table = &case.requests[r].block_tables[g];
        let mut i = 0usize;
        while i < table.len() && (i as u64) * b < p {
            let id = table[i];
            if id != null && case.reported(g, id) {
                out.push(Hit {
                    g,
                    idx: i,
                    id,
                    pos: i as u64 * b,
                });
            }
            i += 1;
        }
    }
    out
}

/// Per request: its hits and, for each, the request that owns it (itself for a new hit),
/// from marked sets walked in canonical order — one per scan in `vllm`, one in `safe`.
fn ownership(case: &Case, mode: Mode) -> Vec<Vec<(Hit, usize)>> {
    let mut out = vec![Vec::new(); case.requests.len()];
    let mut marked: HashMap<(usize, BlockId), usize> = HashMap::new();
    let mut last_class = None;
    for r in case.canonical() {
        let class = case.requests[r].class;
        if mode == Mode::Vllm
            && last_class == Some(RequestClass::Async)
            && class == RequestClass::Sync
        {
            marked.clear(); // the sync scan has its own marked set
        }
        last_class = Some(class);
        let hits = hits_of(case, r);
        let owned: Vec<(Hit, usize)> = hits
            .iter()
            .map(|h| (*h, *marked.get(&(h.g, h.id)).unwrap_or(&r)))
            .collect();
        for (h, o) in &owned {
            if *o == r {
                marked.insert((h.g, h.id), r);
            }
        }
        out[r] = owned;
    }
    out
}

fn min_new_pos(owned: &[(Hit, usize)], r: usize) -> Option<u64> {
    owned
        .iter()
        .filter(|(_, o)| *o == r)
        .map(|(h, _)| h.pos)
        .min()
}

/// The resumable boundary (docs/rules.md#the-resumable-boundary): can request `r` resume at `c` (a multiple of `S`)?
fn can_resume(case: &Case, r: usize, owned: &[(Hit, usize)], c: u64) -> bool {
    if c == 0 {
        return true;
    }
    let null = case.geo.null_block();
    let mine: HashSet<(usize, usize)> = owned
        .iter()
        .filter(|(_, o)| *o == r)
        .map(|(h, _)| (h.g, h.idx))
        .collect();
    case.geo.groups().iter().enumerate().all(|(g, group)| {
        let b = group.block_size;
        let table = &case.requests[r].block_tables[g];
        // real (present, non-null) and not an invalid entry owned by this request
        let usable = |i: u64| {
            let i = i as usize;
            i < table.len() && table[i] != null && !mine.contains(&(g, i))
        };
        match group.kind {
            GroupKind::FullAttention => (0..c / b).all(usable),
            GroupKind::SlidingWindow { window } => {
                // entries holding tokens [max(0, c - window + 1), c)
                let first_token = (c + 1).saturating_sub(window);
                (first_token / b..=(c - 1) / b).all(usable)
            }
            GroupKind::Mamba { .. } => usable(c / b - 1),
        }
    })
}

fn non_null_from(case: &Case, r: usize, boundary: u64) -> BTreeSet<BlockId> {
    let null = case.geo.null_block();
    let mut out = BTreeSet::new();
    for (g, group) in case.geo.groups().iter().enumerate() {
        let from = (boundary / group.block_size) as usize;
        for &id in case.requests[r].block_tables[g].iter().skip(from) {
            if id != null {
                out.insert(id);
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// a plain mode-`vllm` implementation of mode `vllm` (loops and a HashSet marked set per scan)

#[derive(Debug, PartialEq, Eq)]
struct PlainRequest {
    disposition: Disposition,
    num_computed_tokens: u64,
    affected_tokens: u64,
    claimed_blocks: Vec<BlockId>,
    evicted_blocks: Vec<BlockId>,
}

#[derive(Debug, PartialEq, Eq)]
struct PlainOutcome {
    requests: Vec<PlainRequest>,
    affected: Vec<usize>,
    skip: Vec<usize>,
    failed: Vec<usize>,
    failed_recving: Vec<usize>,
    total_affected_tokens: u128,
    evicted_blocks: Vec<BlockId>,
}

fn plain_vllm(case: &Case, policy: Policy) -> PlainOutcome {
    let n = case.requests.len();
    let s = case.s();
    let null = case.geo.null_block();
    let mut results: Vec<Option<PlainRequest>> = (0..n).map(|_| None).collect();
    let mut all_evicted: BTreeSet<BlockId> = BTreeSet::new();
    let mut out = PlainOutcome {
        requests: Vec::new(),
        affected: Vec::new(),
        skip: Vec::new(),
        failed: Vec::new(),
        failed_recving: Vec::new(),
        total_affected_tokens: 0,
        evicted_blocks: Vec::new(),
    };
    for class in [RequestClass::Async, RequestClass::Sync] {
        let mut marked: HashSet<(usize, BlockId)> = HashSet::new();
        for (r, req) in case.requests.iter().enumerate() {
            if req.class != class {
                continue;
            }
            let p = req.num_computed_tokens - req.num_scheduled_tokens;
            let mut any_hit = false;
            let mut min_new: Option<u64> = None;
            let mut claimed: BTreeSet<BlockId> = BTreeSet::new();
            let mut new_pairs = Vec::new();
            for g in 0..case.geo.num_groups() {
                let b = case.geo.groups()[g].block_size;
                let table = &req.block_tables[g];
                let limit = std::cmp::min(p.div_ceil(b), table.len() as u64) as usize;
                for (i, &id) in table.iter().enumerate().take(limit) {
                    if id == null || !case.reported(g, id) {
                        continue;
                    }
                    any_hit = true;
                    if !marked.contains(&(g, id)) {
                        let pos = i as u64 * b;
                        min_new = Some(min_new.map_or(pos, |m: u64| m.min(pos)));
                        claimed.insert(id);
                        new_pairs.push((g, id));
                    }
                }
            }
            marked.extend(new_pairs);
            let mut res = PlainRequest {
                disposition: Disposition::Unaffected,
                num_computed_tokens: req.num_computed_tokens,
                affected_tokens: 0,
                claimed_blocks: claimed.into_iter().collect(),
                evicted_blocks: Vec::new(),
            };
            if let Some(pos) = min_new {
                let boundary = pos / s * s;
                res.num_computed_tokens = boundary;
                res.affected_tokens = p - boundary;
                if class == RequestClass::Sync && policy == Policy::Fail {
                    let mut ev = BTreeSet::new();
                    for g in 0..case.geo.num_groups() {
                        let b = case.geo.groups()[g].block_size;
                        for (i, &id) in req.block_tables[g].iter().enumerate() {
                            if i as u64 >= boundary / b && id != null {
                                ev.insert(id);
                            }
                        }
                    }
                    all_evicted.extend(ev.iter().copied());
                    res.evicted_blocks = ev.into_iter().collect();
                }
            } else if any_hit {
                res.num_computed_tokens = p;
                res.affected_tokens = req.num_scheduled_tokens;
            }
            if any_hit {
                out.affected.push(r);
                res.disposition = match (policy, class) {
                    (Policy::Fail, _) => {
                        out.failed.push(r);
                        Disposition::Failed
                    }
                    (Policy::Recompute, RequestClass::Async) => {
                        out.failed_recving.push(r);
                        Disposition::FailedRecving
                    }
                    (Policy::Recompute, RequestClass::Sync) => {
                        out.skip.push(r);
                        Disposition::Skip
                    }
                };
            }
            out.total_affected_tokens += u128::from(res.affected_tokens);
            results[r] = Some(res);
        }
    }
    out.requests = results.into_iter().map(Option::unwrap).collect();
    out.evicted_blocks = all_evicted.into_iter().collect();
    out
}

fn as_plain(o: &Outcome) -> PlainOutcome {
    PlainOutcome {
        requests: o
            .requests
            .iter()
            .map(|d| {
                assert!(d.waits_for.is_empty(), "mode vllm never waits");
                PlainRequest {
                    disposition: d.disposition,
                    num_computed_tokens: d.num_computed_tokens,
                    affected_tokens: d.affected_tokens,
                    claimed_blocks: d.claimed_blocks.clone(),
                    evicted_blocks: d.evicted_blocks.clone(),
                }
            })
            .collect(),
        affected: o.affected.clone(),
        skip: o.skip.clone(),
        failed: o.failed.clone(),
        failed_recving: o.failed_recving.clone(),
        total_affected_tokens: o.total_affected_tokens,
        evicted_blocks: o.evicted_blocks.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// strategies

const BLOCK_SIZES: [u64; 6] = [1, 2, 4, 8, 16, 32];

fn group_strategy(kinds: u8) -> impl Strategy<Value = CacheGroup> {
    (0..kinds, 0..BLOCK_SIZES.len(), 1u64..=48).prop_map(|(k, b, w)| {
        let b = BLOCK_SIZES[b];
        match k {
            0 => CacheGroup::full_attention(b),
            1 => CacheGroup::sliding_window(b, w),
            2 => CacheGroup::mamba(b, MambaMode::Align),
            _ => CacheGroup::mamba(b, MambaMode::All),
        }
    })
}

#[derive(Clone, Debug)]
struct ReqSpec {
    is_async: bool,
    root: usize,
    prefix_units: u64,
    extra: u64,
    scheduled: u64,
    /// Per group: entries added to (> 0) or cut from (< 0) the table's natural length.
    len_adjust: [i8; 3],
    null_bits: u64,
    /// Nulls anywhere in non-full-attention groups, not only where the kind allows them.
    chaos: bool,
}

fn req_strategy(class: Option<bool>) -> impl Strategy<Value = ReqSpec> {
    let adj = prop_oneof![6 => Just(0i8), 1 => -3i8..=2];
    (
        class.map_or_else(|| any::<bool>().boxed(), |c| Just(c).boxed()),
        0usize..2,
        0u64..=3,
        0u64..1000,
        0u64..1000,
        [adj.clone(), adj.clone(), adj],
        any::<u64>(),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(is_async, root, prefix_units, extra, scheduled, len_adjust, null_bits, chaos)| {
                ReqSpec {
                    is_async,
                    root,
                    prefix_units,
                    extra,
                    scheduled,
                    len_adjust,
                    null_bits,
                    chaos,
                }
            },
        )
}

#[derive(Clone, Debug)]
struct ReportSpec {
    qualified: bool,
    flat_picks: Vec<usize>,
    /// (pick, group shift): the picked (group, id) goes to list `(group + shift) % n`.
    group_picks: Vec<(usize, usize)>,
    with_null: bool,
    with_absent: bool,
}

fn report_strategy() -> impl Strategy<Value = ReportSpec> {
    (
        any::<bool>(),
        prop::collection::vec(any::<usize>(), 0..5),
        prop::collection::vec(
            (
                any::<usize>(),
                prop_oneof![4 => Just(0usize), 1 => 1usize..3],
            ),
            0..5,
        ),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(qualified, flat_picks, group_picks, with_null, with_absent)| ReportSpec {
                qualified,
                flat_picks,
                group_picks,
                with_null,
                with_absent,
            },
        )
}

/// Hands out fresh ids, skipping the null block; one counter per group when ids are reused
/// across groups, one shared counter otherwise.
struct Ids {
    next: Vec<BlockId>,
    unique: bool,
    null: BlockId,
}

impl Ids {
    fn fresh(&mut self, g: usize) -> BlockId {
        let k = if self.unique { 0 } else { g };
        if self.next[k] == self.null {
            self.next[k] += 1;
        }
        let id = self.next[k];
        self.next[k] += 1;
        id
    }
}

#[allow(clippy::too_many_arguments)]
fn build(
    groups: Vec<CacheGroup>,
    s_mult: Option<u64>,
    null: BlockId,
    unique_ids: bool,
    specs: Vec<ReqSpec>,
    rep: ReportSpec,
) -> Case {
    let lcm = groups.iter().map(|g| g.block_size).max().unwrap(); // powers of two
    let geo = Geometry::new(groups, s_mult.map(|m| m * lcm), null).unwrap();
    let s = geo.scheduler_block_size();
    let ng = geo.num_groups();
    let mut ids = Ids {
        next: vec![1; ng],
        unique: unique_ids,
        null,
    };
    // roots[root][g]: shared prefix tables, grown on demand
    let mut roots: Vec<Vec<Vec<BlockId>>> = vec![vec![Vec::new(); ng]; 2];
    let mut requests = Vec::new();
    for (r, spec) in specs.iter().enumerate() {
        let prefix = spec.prefix_units * s;
        let p = prefix + spec.extra % (2 * s + 1);
        let scheduled = if spec.is_async {
            0
        } else {
            spec.scheduled % (s + 1)
        };
        let nct = p + scheduled;
        let mut bit = 0u32;
        let mut tables = Vec::new();
        for (g, group) in geo.groups().iter().enumerate() {
            let b = group.block_size;
            let natural = nct.div_ceil(b) as i64;
            let adjust = i64::from(spec.len_adjust[g]);
            let len = (natural + adjust).max(0) as usize;
            let shared = (prefix / b) as usize;
            let mut t = Vec::with_capacity(len);
            for i in 0..len {
                if i < shared {
                    while roots[spec.root][g].len() <= i {
                        let id = ids.fresh(g);
                        roots[spec.root][g].push(id);
                    }
                    t.push(roots[spec.root][g][i]);
                } else {
                    t.push(ids.fresh(g));
                }
            }
            // nulls where the kind allows them
            for (i, entry) in t.iter_mut().enumerate() {
                let coin = spec.null_bits.rotate_left(bit) & 1 == 1;
                bit += 1;
                let may_be_null = match group.kind {
                    GroupKind::FullAttention => false,
                    _ if spec.chaos => true,
                    // entirely outside the window: every token < P - window + 1
                    GroupKind::SlidingWindow { window } => (i as u64 + 1) * b + window <= p + 1,
                    GroupKind::Mamba {
                        mode: MambaMode::Align,
                    } => {
                        if i + 1 < len {
                            *entry = null;
                        }
                        false
                    }
                    GroupKind::Mamba {
                        mode: MambaMode::All,
                    } => false,
                };
                if may_be_null && coin {
                    *entry = null;
                }
            }
            tables.push(t);
        }
        requests.push(Request {
            id: format!("r{r}"),
            class: if spec.is_async {
                RequestClass::Async
            } else {
                RequestClass::Sync
            },
            num_computed_tokens: nct,
            num_scheduled_tokens: scheduled,
            block_tables: tables,
        });
    }
    // the report: picks from every (group, id) in any table, plus null / absent ids
    let mut universe: Vec<(usize, BlockId)> = requests
        .iter()
        .flat_map(|q| {
            q.block_tables
                .iter()
                .enumerate()
                .flat_map(|(g, t)| t.iter().map(move |&id| (g, id)))
        })
        .filter(|&(_, id)| id != null)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if universe.is_empty() {
        universe.push((0, ABSENT_ID));
    }
    let pick = |k: usize| universe[k % universe.len()];
    let mut flat: Vec<BlockId> = Vec::new();
    let mut by_group = None;
    if rep.qualified {
        let mut lists = vec![Vec::new(); ng];
        for &(k, shift) in &rep.group_picks {
            let (g, id) = pick(k);
            lists[(g + shift) % ng].push(id);
        }
        // a few flat ids beside the lists (the report is the union)
        flat.extend(rep.flat_picks.iter().take(1).map(|&k| pick(k).1));
        if rep.with_null {
            lists[0].push(null);
        }
        by_group = Some(lists);
    } else {
        flat.extend(rep.flat_picks.iter().map(|&k| pick(k).1));
        flat.extend(rep.group_picks.iter().map(|&(k, _)| pick(k).1));
        if rep.with_null {
            flat.push(null);
        }
    }
    if rep.with_absent {
        flat.push(ABSENT_ID);
    }
    let case = Case {
        geo,
        requests,
        report: Report { flat, by_group },
        unique_ids,
    };
    validate_requests(&case.geo, &case.requests).expect("generated requests are valid");
    case
}

/// A random case: `kinds` limits group kinds (1 = full attention only), `max_groups` the
/// group count, `class` forces every request's class (`Some(true)` = all async).
fn case_strategy(kinds: u8, max_groups: usize, class: Option<bool>) -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(group_strategy(kinds), 1..=max_groups),
        prop::option::weighted(0.3, 1u64..=3),
        prop_oneof![3 => Just(0u64), 1 => Just(3u64)],
        any::<bool>(),
        prop::collection::vec(req_strategy(class), 1..=6),
        report_strategy(),
    )
        .prop_map(|(groups, s_mult, null, unique, specs, rep)| {
            build(groups, s_mult, null, unique, specs, rep)
        })
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// properties

/// (a) Every boundary of a request with a new hit is a multiple of `S` and at most `P`; a
/// request with only old hits returns to `P`.
fn check_boundaries(case: &Case) -> Result<(), TestCaseError> {
    let s = case.s();
    for mode in MODES {
        let own = ownership(case, mode);
        for policy in POLICIES {
            let out = case.run(mode, policy);
            for (r, d) in out.requests.iter().enumerate() {
                let p = case.p(r);
                let ctx = format!("{mode:?}/{policy:?} request {r}");
                if min_new_pos(&own[r], r).is_some() {
                    prop_assert_eq!(d.num_computed_tokens % s, 0, "{}", ctx);
                    prop_assert!(d.num_computed_tokens <= p, "{}", ctx);
                    prop_assert_eq!(d.affected_tokens, p - d.num_computed_tokens, "{}", ctx);
                } else if !own[r].is_empty() {
                    prop_assert_eq!(d.num_computed_tokens, p, "{}", ctx);
                    let q = &case.requests[r];
                    prop_assert_eq!(d.affected_tokens, q.num_scheduled_tokens, "{}", ctx);
                }
            }
        }
    }
    Ok(())
}

/// (b) Per marked set, each reported (group, id) found in some scan range is claimed by
/// exactly one request: the first in canonical order whose range holds it.
fn check_one_claim(case: &Case) -> Result<(), TestCaseError> {
    for mode in MODES {
        let own = ownership(case, mode);
        for policy in POLICIES {
            let out = case.run(mode, policy);
            for (r, d) in out.requests.iter().enumerate() {
                let expect: BTreeSet<BlockId> = own[r]
                    .iter()
                    .filter(|(_, o)| *o == r)
                    .map(|(h, _)| h.id)
                    .collect();
                let expect: Vec<BlockId> = expect.into_iter().collect();
                prop_assert_eq!(&d.claimed_blocks, &expect, "{:?} request {}", mode, r);
            }
            // Directly: per marked set, the number of claimants of each (group, id).
            let sets: Vec<Vec<usize>> = match mode {
                Mode::Safe => vec![case.canonical()],
                Mode::Vllm => [RequestClass::Async, RequestClass::Sync]
                    .iter()
                    .map(|&c| {
                        case.canonical()
                            .into_iter()
                            .filter(|&r| case.requests[r].class == c)
                            .collect()
                    })
                    .collect(),
            };
            for set in sets {
                let mut in_range: HashMap<(usize, BlockId), Vec<usize>> = HashMap::new();
                for &r in &set {
                    for h in hits_of(case, r) {
                        let v = in_range.entry((h.g, h.id)).or_default();
                        if !v.contains(&r) {
                            v.push(r);
                        }
                    }
                }
                for ((g, id), holders) in in_range {
                    let claimants: Vec<usize> = holders
                        .iter()
                        .copied()
                        .filter(|&r| out.requests[r].claimed_blocks.contains(&id))
                        .collect();
                    prop_assert!(
                        claimants.contains(&holders[0]),
                        "{:?}: ({}, {}) not claimed by its first holder",
                        mode,
                        g,
                        id
                    );
                    if case.unique_ids {
                        prop_assert_eq!(claimants.len(), 1, "{:?}: ({}, {})", mode, g, id);
                    }
                }
            }
        }
    }
    Ok(())
}

/// (c) The null block is never claimed, evicted or waited for.
fn check_null(case: &Case) -> Result<(), TestCaseError> {
    let null = case.geo.null_block();
    for mode in MODES {
        for policy in POLICIES {
            let out = case.run(mode, policy);
            prop_assert!(!out.evicted_blocks.contains(&null));
            for d in &out.requests {
                prop_assert!(!d.claimed_blocks.contains(&null));
                prop_assert!(!d.evicted_blocks.contains(&null));
                prop_assert!(d.waits_for.iter().all(|&(b, _)| b != null));
            }
        }
    }
    Ok(())
}

/// (d) Mode `safe`: the boundary is the largest multiple of `S` at or below the earliest new
/// hit from which every group can resume (else 0); `waits_for` holds exactly the old hits
/// starting below the new computed length, one per id; evictions are every non-null entry at
/// or past the boundary of each request with a new hit.
fn check_safe(case: &Case) -> Result<(), TestCaseError> {
    let s = case.s();
    let own = ownership(case, Mode::Safe);
    for policy in POLICIES {
        let out = case.run(Mode::Safe, policy);
        let mut evicted_union = BTreeSet::new();
        for (r, d) in out.requests.iter().enumerate() {
            let nct = d.num_computed_tokens;
            let min_new = min_new_pos(&own[r], r);
            if let Some(earliest) = min_new {
                prop_assert_eq!(nct % s, 0);
                prop_assert!(nct <= earliest, "request {}: {} > {}", r, nct, earliest);
                prop_assert!(
                    can_resume(case, r, &own[r], nct),
                    "request {}: cannot resume at {}",
                    r,
                    nct
                );
                let mut c = nct + s;
                while c <= earliest {
                    prop_assert!(
                        !can_resume(case, r, &own[r], c),
                        "request {}: {} chosen but {} resumable",
                        r,
                        nct,
                        c
                    );
                    c += s;
                }
                let ev = non_null_from(case, r, nct);
                evicted_union.extend(ev.iter().copied());
                prop_assert_eq!(&d.evicted_blocks, &ev.into_iter().collect::<Vec<_>>());
            } else {
                prop_assert!(d.evicted_blocks.is_empty());
            }
            let mut waits: Vec<(BlockId, usize)> = Vec::new();
            if policy == Policy::Recompute {
                // One entry per id; with several owners, the earliest in canonical order.
                let rank: HashMap<usize, usize> = case
                    .canonical()
                    .into_iter()
                    .enumerate()
                    .map(|(pos, i)| (i, pos))
                    .collect();
                let mut by_id: HashMap<BlockId, usize> = HashMap::new();
                for &(h, o) in &own[r] {
                    if o != r && h.pos < nct {
                        let e = by_id.entry(h.id).or_insert(o);
                        if rank[&o] < rank[e] {
                            *e = o;
                        }
                    }
                }
                waits = by_id.into_iter().collect();
                waits.sort_unstable();
            }
            prop_assert_eq!(&d.waits_for, &waits, "request {}", r);
        }
        prop_assert_eq!(
            out.evicted_blocks,
            evicted_union.into_iter().collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// (e) Mode `vllm` equals the plain implementation above.
fn check_plain_vllm(case: &Case) -> Result<(), TestCaseError> {
    for policy in POLICIES {
        let got = as_plain(&case.run(Mode::Vllm, policy));
        let want = plain_vllm(case, policy);
        prop_assert_eq!(got, want, "{:?}", policy);
    }
    Ok(())
}

/// (f) Unaffected requests keep their computed length and have 0 affected tokens; affected
/// ones land in exactly the list their class and the policy say; the total is the sum.
fn check_unaffected(case: &Case) -> Result<(), TestCaseError> {
    for mode in MODES {
        for policy in POLICIES {
            let out = case.run(mode, policy);
            let mut affected = Vec::new();
            for r in case.canonical() {
                let d = &out.requests[r];
                let q = &case.requests[r];
                let has_hit = !hits_of(case, r).is_empty();
                if !has_hit {
                    prop_assert_eq!(d.disposition, Disposition::Unaffected);
                    prop_assert_eq!(d.num_computed_tokens, q.num_computed_tokens);
                    prop_assert_eq!(d.affected_tokens, 0);
                    prop_assert!(d.claimed_blocks.is_empty() && d.waits_for.is_empty());
                    prop_assert!(d.evicted_blocks.is_empty());
                    continue;
                }
                affected.push(r);
                let want = match (policy, q.class) {
                    (Policy::Fail, _) => Disposition::Failed,
                    (Policy::Recompute, RequestClass::Async) => Disposition::FailedRecving,
                    (Policy::Recompute, RequestClass::Sync) => Disposition::Skip,
                };
                prop_assert_eq!(d.disposition, want);
            }
            prop_assert_eq!(&out.affected, &affected);
            let of = |disp: Disposition| -> Vec<usize> {
                affected
                    .iter()
                    .copied()
                    .filter(|&r| out.requests[r].disposition == disp)
                    .collect()
            };
            prop_assert_eq!(&out.skip, &of(Disposition::Skip));
            prop_assert_eq!(&out.failed, &of(Disposition::Failed));
            prop_assert_eq!(&out.failed_recving, &of(Disposition::FailedRecving));
            let sum: u128 = out
                .requests
                .iter()
                .map(|d| u128::from(d.affected_tokens))
                .sum();
            prop_assert_eq!(out.total_affected_tokens, sum);
        }
    }
    Ok(())
}

/// (g) With one scan class (same ownership in both modes), mode `safe`'s boundary is at or
/// below mode `vllm`'s, and the claims are the same.
fn check_safe_below_vllm(case: &Case) -> Result<(), TestCaseError> {
    for policy in POLICIES {
        let v = case.run(Mode::Vllm, policy);
        let s = case.run(Mode::Safe, policy);
        for (r, (dv, ds)) in v.requests.iter().zip(&s.requests).enumerate() {
            prop_assert!(
                ds.num_computed_tokens <= dv.num_computed_tokens,
                "request {}: safe {} > vllm {}",
                r,
                ds.num_computed_tokens,
                dv.num_computed_tokens
            );
            prop_assert_eq!(&ds.claimed_blocks, &dv.claimed_blocks);
        }
    }
    Ok(())
}

/// (h) The explanation is the decision's own: `recover_explained` gives `recover`'s outcome,
/// and its traces agree with the model above — scan ranges, hits and their owners, the chosen
/// boundary and its rule, in mode `safe` every candidate between the boundary and the first
/// one rejected by a group that really lacks the entry it names, and the wait edges.
fn check_explained(case: &Case) -> Result<(), TestCaseError> {
    let s = case.s();
    let null = case.geo.null_block();
    for mode in MODES {
        let own = ownership(case, mode);
        for policy in POLICIES {
            let invalid = case.invalid_set();
            let plain = recover(&case.geo, mode, policy, &case.requests, &invalid);
            let (out, traces) =
                recover_explained(&case.geo, mode, policy, &case.requests, &invalid);
            prop_assert_eq!(&out, &plain);
            prop_assert_eq!(traces.len(), case.requests.len());
            for (r, (d, t)) in out.requests.iter().zip(&traces).enumerate() {
                let ctx = format!("{mode:?}/{policy:?} request {r}");
                let q = &case.requests[r];
                let p = case.p(r);
                let ranges: Vec<(usize, usize)> = case
                    .geo
                    .groups()
                    .iter()
                    .enumerate()
                    .map(|(g, grp)| {
                        let n = p
                            .div_ceil(grp.block_size)
                            .min(q.block_tables[g].len() as u64);
                        (g, n as usize)
                    })
                    .collect();
                let got: Vec<(usize, usize)> =
                    t.scan.iter().map(|x| (x.group, x.entries)).collect();
                prop_assert_eq!(got, ranges, "{}", ctx);
                let hits: Vec<(usize, usize, BlockId, u64, usize)> = t
                    .hits
                    .iter()
                    .map(|(h, o)| {
                        let owner = match o {
                            HitOwner::Mine => r,
                            HitOwner::Other(o) => *o,
                        };
                        (
                            h.group as usize,
                            h.index as usize,
                            h.block,
                            h.position,
                            owner,
                        )
                    })
                    .collect();
                let want: Vec<(usize, usize, BlockId, u64, usize)> = own[r]
                    .iter()
                    .map(|(h, o)| (h.g, h.idx, h.id, h.pos, *o))
                    .collect();
                prop_assert_eq!(hits, want, "{}", ctx);
                let (boundary, rule) = t.chosen.expect("every request has a chosen boundary");
                prop_assert_eq!(boundary, d.num_computed_tokens, "{}", ctx);
                let earliest = min_new_pos(&own[r], r);
                match (earliest, mode) {
                    (None, _) if own[r].is_empty() => prop_assert_eq!(rule, BoundaryRule::NoHit),
                    (None, _) => prop_assert_eq!(rule, BoundaryRule::OldHitsOnly),
                    (Some(e), Mode::Vllm) => {
                        prop_assert_eq!(rule, BoundaryRule::VllmRoundDown { earliest_new: e })
                    }
                    (Some(e), Mode::Safe) => {
                        prop_assert_eq!(rule, BoundaryRule::SafeResumable { earliest_new: e });
                        let c = t.candidates.expect("safe with a new hit has candidates");
                        prop_assert_eq!(c.earliest_new, e);
                        prop_assert!(c.start <= e && c.start % s == 0 && c.start >= boundary);
                        // Every candidate above the boundary is rejected, by groups that lack
                        // the entry they name; none at or below it.
                        let mut cand = c.start;
                        while cand > boundary {
                            prop_assert!(
                                t.rejected.iter().any(|x| x.candidate == cand),
                                "{}: candidate {} not rejected",
                                ctx,
                                cand
                            );
                            cand -= s;
                        }
                        for x in &t.rejected {
                            prop_assert!(x.candidate > boundary && x.candidate <= c.start);
                            let grp = case.geo.groups()[x.group];
                            let table = &q.block_tables[x.group];
                            let i = x.index as usize;
                            let hi = x.candidate / grp.block_size;
                            let lo = match grp.kind {
                                GroupKind::FullAttention => 0,
                                GroupKind::SlidingWindow { window } => {
                                    (x.candidate + 1).saturating_sub(window) / grp.block_size
                                }
                                GroupKind::Mamba { .. } => hi - 1,
                            };
                            prop_assert!(lo <= x.index && x.index < hi, "{}: {:?}", ctx, x);
                            let mine = own[r]
                                .iter()
                                .any(|(h, o)| *o == r && h.g == x.group && h.idx == i);
                            let ok = match x.why {
                                Unusable::Missing => i >= table.len(),
                                Unusable::Null => table.get(i) == Some(&null),
                                Unusable::OwnNewHit(b) => mine && table.get(i) == Some(&b),
                            };
                            prop_assert!(ok, "{}: {:?} does not hold", ctx, x);
                        }
                    }
                }
                let waits_apply = mode == Mode::Safe && policy == Policy::Recompute;
                let old: Vec<(BlockId, u64, usize, bool)> = t
                    .old_hits
                    .iter()
                    .map(|w| (w.block, w.position, w.owner, w.waits))
                    .collect();
                let want: Vec<(BlockId, u64, usize, bool)> = own[r]
                    .iter()
                    .filter(|(_, o)| *o != r)
                    .map(|(h, o)| (h.id, h.pos, *o, waits_apply && h.pos < boundary))
                    .collect();
                prop_assert_eq!(old, want, "{}", ctx);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn a_boundary_is_multiple_of_s_at_most_p(case in case_strategy(4, 3, None)) {
        check_boundaries(&case)?;
    }

    #[test]
    fn b_one_claim_per_block_per_marked_set(case in case_strategy(4, 3, None)) {
        check_one_claim(&case)?;
    }

    #[test]
    fn c_null_never_claimed_or_evicted(case in case_strategy(4, 3, None)) {
        check_null(&case)?;
    }

    #[test]
    fn d_safe_boundary_resumable_and_waits(case in case_strategy(4, 3, None)) {
        check_safe(&case)?;
    }

    #[test]
    fn e_vllm_single_full_attention_equals_plain(case in case_strategy(1, 1, None)) {
        check_plain_vllm(&case)?;
    }

    #[test]
    fn e_hybrid_vllm_equals_plain(case in case_strategy(4, 3, None)) {
        check_plain_vllm(&case)?;
    }

    #[test]
    fn f_unaffected_unchanged_and_total_is_sum(case in case_strategy(4, 3, None)) {
        check_unaffected(&case)?;
    }

    #[test]
    fn g_safe_at_or_below_vllm_all_async(case in case_strategy(4, 3, Some(true))) {
        check_safe_below_vllm(&case)?;
    }

    #[test]
    fn g_safe_at_or_below_vllm_all_sync(case in case_strategy(4, 3, Some(false))) {
        check_safe_below_vllm(&case)?;
    }

    #[test]
    fn h_explanation_is_the_decisions_own(case in case_strategy(4, 3, None)) {
        check_explained(&case)?;
    }
}

/// The generator really produces what the properties need: shared blocks between requests,
/// hits (new and old), nulls in reports and tables, both report forms, short tables.
#[test]
fn generator_covers_the_interesting_shapes() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strat = case_strategy(4, 3, None);
    let (mut old_hits, mut new_hits, mut qualified, mut null_reported, mut safe_differs) =
        (0, 0, 0, 0, 0);
    let (mut short_tables, mut waits) = (0, 0);
    for _ in 0..300 {
        let case = strat.new_tree(&mut runner).unwrap().current();
        let own = ownership(&case, Mode::Safe);
        for (r, hits) in own.iter().enumerate() {
            new_hits += hits.iter().filter(|(_, o)| *o == r).count();
            old_hits += hits.iter().filter(|(_, o)| *o != r).count();
            let q = &case.requests[r];
            for (g, group) in case.geo.groups().iter().enumerate() {
                if (q.block_tables[g].len() as u64) < case.p(r).div_ceil(group.block_size) {
                    short_tables += 1;
                }
            }
        }
        qualified += usize::from(case.report.by_group.is_some());
        null_reported += usize::from(
            case.report.flat.contains(&case.geo.null_block())
                || case
                    .report
                    .by_group
                    .as_ref()
                    .is_some_and(|l| l.iter().flatten().any(|&i| i == case.geo.null_block())),
        );
        let v = case.run(Mode::Vllm, Policy::Recompute);
        let s = case.run(Mode::Safe, Policy::Recompute);
        waits += s
            .requests
            .iter()
            .filter(|d| !d.waits_for.is_empty())
            .count();
        safe_differs += usize::from(
            v.requests
                .iter()
                .zip(&s.requests)
                .any(|(a, b)| a.num_computed_tokens != b.num_computed_tokens),
        );
    }
    assert!(new_hits > 100, "new hits {new_hits}");
    assert!(old_hits > 20, "old hits {old_hits}");
    assert!(qualified > 50, "qualified {qualified}");
    assert!(null_reported > 20, "null reported {null_reported}");
    assert!(safe_differs > 10, "safe differs {safe_differs}");
    assert!(waits > 10, "waits {waits}");
    assert!(short_tables > 10, "short tables {short_tables}");
}
