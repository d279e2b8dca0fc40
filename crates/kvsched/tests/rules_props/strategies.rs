//! The proptest strategies: random geometries, requests sharing prefixes, and reports (flat or
//! group-qualified, with nulls and ids no table holds).

use std::collections::BTreeSet;

use kvsched::rules::geometry::{BlockId, CacheGroup, Geometry, GroupKind, MambaMode};
use kvsched::rules::recovery::{validate_requests, Request, RequestClass};
use proptest::prelude::*;

use super::case::{Case, Report, ABSENT_ID};

pub const BLOCK_SIZES: [u64; 6] = [1, 2, 4, 8, 16, 32];

pub fn group_strategy(kinds: u8) -> impl Strategy<Value = CacheGroup> {
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
pub struct ReqSpec {
    pub is_async: bool,
    pub root: usize,
    pub prefix_units: u64,
    pub extra: u64,
    pub scheduled: u64,
    /// Per group: entries added to (> 0) or cut from (< 0) the table's natural length.
    pub len_adjust: [i8; 3],
    pub null_bits: u64,
    /// Nulls anywhere in non-full-attention groups, not only where the kind allows them.
    pub chaos: bool,
}

pub fn req_strategy(class: Option<bool>) -> impl Strategy<Value = ReqSpec> {
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
pub struct ReportSpec {
    pub qualified: bool,
    pub flat_picks: Vec<usize>,
    /// (pick, group shift): the picked (group, id) goes to list `(group + shift) % n`.
    pub group_picks: Vec<(usize, usize)>,
    pub with_null: bool,
    pub with_absent: bool,
}

pub fn report_strategy() -> impl Strategy<Value = ReportSpec> {
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
pub struct Ids {
    pub next: Vec<BlockId>,
    pub unique: bool,
    pub null: BlockId,
}

impl Ids {
    pub fn fresh(&mut self, g: usize) -> BlockId {
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
pub fn build(
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
pub fn case_strategy(
    kinds: u8,
    max_groups: usize,
    class: Option<bool>,
) -> impl Strategy<Value = Case> {
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

pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
